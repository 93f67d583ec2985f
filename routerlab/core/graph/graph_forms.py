"""Which form of a routed step graph runs a step under `kv`: the branching form (each routed layer's attention under
an `If` that any row runs it, so a layer every row skips costs nothing) or the plain form (mask's: every attention
computed, a skipping row's update zeroed by a `Where`). Both give the same numbers to the bit (a row's update is its
attention's where it runs and 0 where it skips either way; tested), so the choice changes a step's time, never a token.

Why: an `If` costs a good part of what skipping a short context's attention saves (onnxruntime runs its branch as a
subgraph of its own; `make bench-step-graph` prints both, measured), so where few cells skip the branching form is slower than computing everything, and where many skip it is
faster. Which wins where is measured, not assumed: `measure` times both forms side by side when a graph is built
(every token through each form in turn, lower quartiles), giving what the branches cost a step when nothing skips
and what one skipped cell saves at two contexts. `History` samples each row's routers' raw logits over its last
steps; the cells every row of a step would skip (at each row's threshold now, a moved slider included) are predicted
from them, and the branching form runs where they save more than the branches cost.

Knows nothing about models, sampling or the UI: a StepGraph's sessions and buffers only.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

W = 8  # samples of router logits a prediction reads
STRIDE = 2  # a sample every STRIDE steps (W of them span 16 steps)
EVERY = 4  # steps a choice holds unless a threshold moves
# Sampling and choosing cost a step little: right after a run, whose weights streamed through the core's caches, each
# numpy call runs cold (recording and choosing at every step cost about 1.5% of a step in a one-off comparison).
BRANCH, PLAIN = 0, 1  # a graph's sessions: the form with `If`s, the form without


# The share of routed cells skipped by every row above which the branching form runs is what the measurement says,
# but never below SHARE[0] nor above SHARE[1]: a measurement in a busy or uneven moment (the branches measured at
# 0.05-0.73 ms a step on one machine within minutes) must not send every step through the slower form.
SHARE = (0.1, 0.6)


@dataclass(frozen=True)
class Costs:
    """Milliseconds a step's branches cost when no cell skips (against the plain form), and what one routed cell
    every row skips saves the branching form, at `contexts` (tokens of context; linear between and beyond), for a
    graph of `cells` routed layers."""

    branches_ms: float
    saved_ms: tuple[float, ...]
    contexts: tuple[int, ...]
    cells: int = 1

    def saved_at(self, context: int) -> float:
        if len(self.contexts) == 1:
            return self.saved_ms[0]
        (a, b), (sa, sb) = self.contexts[:2], self.saved_ms[:2]
        return max(0.0, sa + (sb - sa) * (context - a) / (b - a))

    def share(self, context: int) -> float:
        """The share of routed cells skipped by every row above which the branches pay at `context` tokens, within
        SHARE."""
        saved = self.saved_at(context) * self.cells
        measured = self.branches_ms / saved if saved > 0 else math.inf
        return min(max(measured, SHARE[0]), SHARE[1])

    def branch(self, skipped: float, context: int) -> bool:
        """Whether the branching form pays for a step where `skipped` routed cells are expected to be skipped by
        every row, at `context` tokens."""
        return skipped > self.share(context) * self.cells

    def describe(self) -> str:
        saved = ", ".join(f"{s:.3f} ms at {c} tokens" for s, c in zip(self.saved_ms, self.contexts))
        shares = ", ".join(f"{self.share(c):.0%} at {c}" for c in self.contexts)
        return (f"the If branches cost {self.branches_ms:.3f} ms a step where nothing skips; a skipped cell saves {saved}; "
                f"the branches run above {shares} of {self.cells} routed cells skipped")


class History:
    """The raw router logits of a request's rows over their last W steps, (W, layers, rows) (NaN where a layer is not
    routed: it never counts as skipped), and the form chosen for the next steps."""

    def __init__(self, layers: int, rows: int = 1):
        self.logits = np.full((W, layers, rows), np.nan, np.float32)
        self.k = self.steps = 0  # samples taken, steps seen
        self.form, self.until, self.at = PLAIN, 0, None  # the choice, the step it holds to, the thresholds it read

    def add(self, raw: np.ndarray) -> None:
        """One sample of raw logits, (layers, rows)."""
        self.logits[self.k % W] = raw
        self.k += 1

    def choose(self, costs: Costs, thresholds: tuple[float, ...], context: int) -> int:
        """The form for the next step: BRANCH where the cells every row is expected to skip save more than the
        branches cost at `context` tokens, else PLAIN; chosen again every EVERY steps or when a threshold moves
        (`thresholds`: each row's, raw)."""
        if self.steps >= self.until or thresholds != self.at:
            self.form = BRANCH if costs.branch(self.skipped(np.array(thresholds, np.float32)), context) else PLAIN
            self.until, self.at = self.steps + EVERY, thresholds
        return self.form

    def after(self, raw: np.ndarray) -> None:
        """A step ran; its raw logits (layers, rows), a view of the graph's output, sampled every STRIDE steps."""
        if self.steps % STRIDE == 0:
            self.add(raw)
        self.steps += 1

    def skipped(self, thresholds: np.ndarray) -> float:
        """Routed cells the next step is expected to skip for every row: per layer, the product over rows of the share
        of their last W samples (fewer at a request's start) whose logit fell below the row's threshold now (a raw
        logit, (rows,)). 0 before the first sample (the plain form, never much slower, runs first)."""
        if self.k == 0:
            return 0.0
        share = (self.logits[: min(self.k, W)] < thresholds).mean(0)  # (layers, rows)
        return float(share.prod(-1).sum())


def measure(graph, steps: int = 16, rounds: int = 1, contexts: tuple[int, ...] = (64, 512)) -> Costs:
    """Time a routed graph's two forms side by side on buffers of its own (a twin, no request's): each step in turn
    through the branching form never skipping, the same always skipping and the plain form, at each context that
    fits the graph; lower quartiles of each."""
    fits = tuple(c for c in contexts if c + steps + 1 <= graph.max_positions) or (max(1, graph.max_positions - steps - 1),)
    twin = graph.twin()
    runs = {"never": (BRANCH, -math.inf), "every": (BRANCH, math.inf), "plain": (PLAIN, -math.inf)}
    quartile: dict[tuple[str, int], float] = {}
    for context in fits:
        twin.fill(context, steps)
        times: dict[str, list[float]] = {name: [] for name in runs}
        order = list(runs)
        for r in range(rounds + 1):  # the first round warms each form's session and buffers up: not counted
            twin.n = context
            for k in range(steps if r else 4):
                for name in order[k % 3:] + order[: k % 3]:
                    form, raw = runs[name]
                    twin.threshold.fill_(raw)
                    start = time.perf_counter()
                    twin.run(k + 1, form, advance=False)
                    if r:
                        times[name].append(time.perf_counter() - start)
                twin.n += 1
        for name, ts in times.items():
            quartile[name, context] = 1e3 * float(np.quantile(ts, 0.25))
    cells = len(graph.routed)
    branches = float(np.median([quartile["never", c] - quartile["plain", c] for c in fits]))
    saved = tuple(max(0.0, (quartile["never", c] - quartile["every", c]) / cells) for c in fits)
    return Costs(round(branches, 4), tuple(round(s, 4) for s in saved), fits, cells)
