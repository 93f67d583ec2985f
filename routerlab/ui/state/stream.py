"""The stream driver: decode in a worker thread, hand the UI consistent snapshots at its own pace.

Owns `Decoder` (runs engine step iterators to the end in a daemon thread), `Pacer` (when a frame is
due), `prefill_progress` (how far a long prompt's reading is) and `snapshot`, and the frame rates of text and heatmap updates. Knows nothing about Gradio,
sessions, plots or tensors: it only advances iterators, copies the step list of a `Trace` and reads
what a run's `Control` says about its quality pass.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Iterator, Protocol, Sequence

from routerlab.core.records.trace import Trace
from routerlab.core.serve.lockstep import in_turn

# Streaming frame rates. Every frame costs Python time in this process, and Python time here is
# GIL time the decoder thread waits for; in the browser each heatmap frame is a plotly redraw, CPU a
# laptop's decoder also needs (docs/results.md, "Streaming overhead, measured"): keep frames few and cheap.
HEATMAP_INTERVAL = 2.0  # seconds between heatmap (and quality strip) redraws while streaming (a redraw: ~0.15 s of browser main thread)
TEXT_INTERVAL = 0.5  # seconds between text updates while streaming
# A run that measures its quality redraws the heatmap (and its strip) right after each quality pass,
# when the strip has new scores; the clock only draws when passes are this many HEATMAP_INTERVALs
# apart (a slow machine, whose passes the meter spaces out to keep their cost in budget). Passes come
# about every 2 s, so a redraw timed by the clock would come shortly before or after one: before, the
# browser draws while the pass runs (a full-depth forward on every core, which slows down more than
# decode steps do when the browser takes a core); after, it is a second redraw for nothing new.
MEASURED_PLOT_SLACK = 2.0
POLL = 0.02  # seconds between looks while a frame is due but held: never spin, the decoder needs the GIL
# In a room (core/serve/room.py) every visitor's frames are drawn on the machine that decodes for all of them: with more
# than this many generations sharing a step, a visitor's frames come proportionally less often (8 sharing: every
# 1 s and 4 s; 32: every 4 s and 16 s), so drawing keeps its share of the machine as the room grows.
SHARED_ROWS_PER_PACE = 4


class RunState(Protocol):
    """What the pacer reads of a run (core.decode.engine.Control)."""

    measuring: bool
    scoring: bool
    quality_chunks: int
    sharing: int  # generations in its last shared step (0: none)


@dataclass
class Pacer:
    """When the next frame is due, from the clock, the traces' size and the runs' quality passes.

    Text at most every `text_every` s; the plot at most every `plot_every` s when the traces grew. While
    a run's quality pass is scoring (a full-depth forward on every core) nothing is due: a redraw in the
    browser would slow the pass down. Right after a pass the plot is due at once (its strip has new
    scores); with runs that measure quality, the clock draws the plot only after MEASURED_PLOT_SLACK x
    `plot_every` without a pass. In a room both intervals stretch with the generations sharing the step
    (SHARED_ROWS_PER_PACE), but the first generated token's text is due at once: in a busy room the pace is
    seconds, and the wait for the first token is what a visitor feels most.
    """

    text_every: float
    plot_every: float
    next_text: float = 0.0
    first_shown: bool = False  # a frame with a generated token was due
    next_plot: float = 0.0
    text_seen: int = 0
    plot_seen: int = 0
    chunks_seen: int = 0

    def due(self, now: float, size: int, runs: Sequence[RunState] = (), started: bool = False) -> bool | None:
        """None: no frame now. Otherwise a frame is due, and the value says whether it redraws the plot. `started`:
        the traces hold a generated token (not only the prompt)."""
        if any(r.scoring for r in runs):
            return None
        chunks = sum(r.quality_chunks for r in runs)
        draw = chunks > self.chunks_seen or (size != self.plot_seen and now >= self.next_plot)
        first = started and not self.first_shown
        self.first_shown = self.first_shown or started
        if not draw and not first and (size == self.text_seen or now < self.next_text):
            return None
        pace = max(1.0, max((getattr(r, "sharing", 0) for r in runs), default=0) / SHARED_ROWS_PER_PACE)
        self.text_seen, self.next_text = size, now + self.text_every * pace
        if draw:
            slack = MEASURED_PLOT_SLACK if any(r.measuring for r in runs) else 1.0
            self.plot_seen, self.chunks_seen, self.next_plot = size, chunks, now + slack * self.plot_every * pace
        return draw

    def wait(self, now: float) -> float:
        """Seconds to sleep before the next look: until the next frame may be due, or POLL once one is
        (nothing new yet, or held by a quality pass), and POLL until the first generated token was shown: that frame
        is due at once (`due`), so the prompt's frame must not put the next look a whole text interval away."""
        if not self.first_shown:
            return POLL
        return max(POLL, min(self.next_text, self.next_plot) - now)


class Decoder:
    """Runs engine step iterators to the end in a worker thread, so drawing never pauses decoding.

    The engine appends every Step to its Control's Trace itself; the UI only reads consistent
    snapshots of those traces at its own pace (`frames`). Several iterators are advanced in turn,
    one step each, the first one rotating every round, so runs that share the machine (Compare)
    are timed under the same load.
    """

    def __init__(self, iterators: list[Iterator]):
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._drain, args=(list(iterators),), name="routerlab-decode", daemon=True)
        self._thread.start()

    def _drain(self, live: list[Iterator]) -> None:
        try:
            turn = 0
            while live:
                for it in in_turn(live, turn):  # who goes first rotates, so no run always follows the same one
                    if next(it, None) is None:
                        live.remove(it)
                turn += 1
        except BaseException as err:  # reported by raise_error() in the UI thread
            self.error = err
        finally:
            self.done.set()

    def frames(self, traces: list[Trace], text_every: float | None = None, plot_every: float | None = None,
               runs: Sequence[RunState] = (), reading: Sequence = ()) -> Iterator[tuple[list[Trace], bool]]:
        """Yield (snapshots, draw_plot) when a trace grew, paced by `Pacer` (with `runs`, the Controls
        of the traces' runs, it keeps frames off their quality passes). A prompt read in chunks counts as growth
        (the Controls of `runs` and `reading` say how far it is: `prefill_progress`), so its progress is shown.

        The last frame, after decoding ended, always has draw_plot=True.
        """
        now = time.perf_counter()
        pacer = Pacer(TEXT_INTERVAL if text_every is None else text_every, HEATMAP_INTERVAL if plot_every is None else plot_every,
                      next_text=now, next_plot=now)
        while True:
            finished = self.done.wait(pacer.wait(time.perf_counter()))
            snaps = [snapshot(t) for t in traces]
            if finished:
                yield snaps, True
                return
            read = sum(getattr(c, "prompt_read", 0) for c in (*runs, *reading))
            started = any(len(t.steps) > t.meta.get("prompt_tokens", 1 << 30) for t in snaps)
            draw = pacer.due(time.perf_counter(), sum(len(t.steps) for t in snaps) + read, runs, started)
            if draw is not None:
                yield snaps, draw

    def raise_error(self) -> None:
        self._thread.join(timeout=5.0)
        if self.error is not None:
            raise self.error


def prefill_progress(controls: Sequence) -> str | None:
    """'reading the prompt: 512 of 1,800 tokens' while the runs of `controls` (one prompt each, the same for all: a
    run or a ladder) still read it (core/decode/generation.py reads a long prompt in chunks); None once all have read it.
    A run not started yet counts its prompt as unread."""
    total = max((getattr(c, "prompt_tokens", 0) for c in controls), default=0)
    read = sum(getattr(c, "prompt_read", 0) for c in controls)
    if not total or read >= total * len(controls):
        return None
    runs = f" ({len(controls)} runs, one after another)" if len(controls) > 1 else ""
    return f"reading the prompt: {read:,} of {total * len(controls):,} tokens{runs}"


def snapshot(trace: Trace) -> Trace:
    """A consistent view of a trace another thread is still appending to: the steps so far (a step's
    `kl_full` and full-model top token may still be filled in later by the quality pass; nothing else
    of a step changes once appended)."""
    return Trace(trace.n_layers, trace.steps[: len(trace.steps)], trace.meta)
