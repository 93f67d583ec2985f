"""Which path decodes on this machine: torch's ops (a step's ~20 ops a layer dispatched from Python) or the step graph
(core/graph/step_graph.py: one onnxruntime run a step), measured at start-up as core/kernels/low_paths.py measures kernels.

Side by side, the full model decodes a few tokens after a short prefill both ways, every token through both paths in
turn; the graph is chosen where its step (the lower quartile of its steps: a busy moment during the measurement
cannot lock the slower path in for the process's life) costs at most MARGIN of torch's. Then every request the graph
can take decodes through it, alone (a room of one) and as a room's rows, through the one step seam
(core/decode/runtime.py), so a request decodes the same either way; the others decode through torch's ops. `ROUTERLAB_DECODE`: auto (default), torch or graph (no
measurement); the command line's `--decode torch|graph` forces one too (`forced`). Any failure keeps torch's ops and
says why: never a failed start.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import torch

log = logging.getLogger(__name__)

ENV = "ROUTERLAB_DECODE"
MARGIN = 0.97  # the graph is chosen where its step costs at most this share of torch's
ROUNDS, STEPS, PROMPT = 4, 12, 64
QUANTILE = 0.25  # each path's step time: the lower quartile of its steps (a busy moment lengthens some steps, never shortens one)


def choose(engine) -> dict:
    """Measure, choose and set `engine.decode`. Returns what was measured and chosen, for logs and reports:
    {"decode": "torch" | "graph", "why": str, "step_ms": {"torch": ms, "graph": ms} or {}}."""
    from routerlab.core.routing.gates import Plan

    mode = os.environ.get(ENV, "auto").strip().lower()
    result = {"decode": "torch", "why": "", "step_ms": {}}
    if mode not in ("auto", "torch", "graph"):
        result["why"] = f"{ENV}={mode} is not auto, torch or graph"
    elif mode == "torch":
        result["why"] = f"{ENV}=torch"
    elif (reason := engine.runtime.why_not(Plan(None))) is not None:
        result["why"] = f"not the step graph: {reason}"
    elif mode == "graph":
        result.update(decode="graph", why=f"{ENV}=graph")
    else:
        try:
            result["step_ms"] = decide(measure(engine))
        except Exception as err:  # an onnxruntime that fails to build or run the graph: torch's ops, said so
            result["why"] = f"the step graph failed ({type(err).__name__}: {err})"
        else:
            t, g = result["step_ms"]["torch"], result["step_ms"]["graph"]
            result.update(decode="graph" if g <= MARGIN * t else "torch", why=f"a step {t:.2f} ms through torch's ops, {g:.2f} ms through the graph")
    engine.decode = result["decode"]
    log.info("%s", describe(result))
    return result


def forced(engine, decode: str) -> dict:
    """`decode` ("torch" or "graph") set on `engine` by the user (a command line's --decode), where the graph can take
    the full model; the result `choose` returns, saying so."""
    from routerlab.core.routing.gates import Plan

    reason = engine.runtime.why_not(Plan(None)) if decode == "graph" else None
    if reason is not None:
        result = {"decode": "torch", "why": f"--decode graph asked, but not the step graph: {reason}", "step_ms": {}}
    else:
        result = {"decode": decode, "why": f"--decode {decode}", "step_ms": {}}
    engine.decode = result["decode"]
    return result


@torch.inference_mode()
def measure(engine) -> dict[str, list[float]]:
    """Seconds each full-model decode step took through torch's ops and through the step graph: ROUNDS prefills of
    PROMPT tokens, then STEPS tokens each, every token through both paths in turn (which goes first alternating), so a
    busy moment falls on both alike."""
    from routerlab.core.routing.gates import Plan

    plan, graph = Plan(None), engine.runtime.graph(None)
    ids = [k % engine.anatomy.config.vocab_size for k in range(PROMPT)]
    times: dict[str, list[float]] = {"torch": [], "graph": []}
    for _ in range(ROUNDS):
        caches = engine.new_caches(PROMPT + STEPS + 1)
        engine.forward_tokens(ids, 0, caches, plan)  # the prefill, as a request's
        graph.load(caches, STEPS)  # the graph's own buffers: torch's steps go on writing `caches`
        for k in range(STEPS):
            for path in ("torch", "graph") if k % 2 == 0 else ("graph", "torch"):
                start = time.perf_counter()
                if path == "graph":
                    graph.step(k + 1)
                else:
                    engine.forward_tokens([k + 1], PROMPT + k, caches, plan)  # torch's decode step, as the step seam takes it
                times[path].append(time.perf_counter() - start)
    return times


def decide(times: dict[str, list[float]]) -> dict[str, float]:
    """Each path's step in milliseconds: the QUANTILE of its steps (a busy moment only lengthens steps, so the lower
    quartile keeps what the path costs while the machine is free, whichever path the moment fell on)."""
    return {path: round(1e3 * float(np.quantile(ts, QUANTILE)), 3) for path, ts in times.items()}


def describe(result: dict) -> str:
    which = "the step graph (one onnxruntime run a step)" if result["decode"] == "graph" else "torch's ops"
    return f"decode steps: {which} ({result['why']})"
