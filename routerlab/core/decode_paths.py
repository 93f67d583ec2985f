"""Which path decodes on this machine: torch's ops (a step's ~20 ops a layer dispatched from Python) or the step graph
(core/step_graph.py: one onnxruntime run a step), measured at start-up as core/low_paths.py measures kernels.

Side by side in alternating rounds, the full model decodes a few tokens after a short prefill both ways; the graph is
chosen where its step costs at most MARGIN of torch's. Then every request the graph can take decodes through it, alone
(`Engine._steps`) and as a room's rows (core/graph_rows.py), so a request decodes the same either way; the others
decode through torch's ops. `ROUTERLAB_DECODE`: auto (default), torch or graph (no measurement). Any failure keeps
torch's ops and says why: never a failed start.
"""

from __future__ import annotations

import logging
import os
import statistics
import time

import torch

log = logging.getLogger(__name__)

ENV = "ROUTERLAB_DECODE"
MARGIN = 0.97  # the graph is chosen where its step costs at most this share of torch's
ROUNDS, STEPS, PROMPT = 3, 12, 64


def choose(engine) -> dict:
    """Measure, choose and set `engine.decode`. Returns what was measured and chosen, for logs and reports:
    {"decode": "torch" | "graph", "why": str, "step_ms": {"torch": ms, "graph": ms} or {}}."""
    from routerlab.core.gates import Plan

    mode = os.environ.get(ENV, "auto").strip().lower()
    result = {"decode": "torch", "why": "", "step_ms": {}}
    if mode not in ("auto", "torch", "graph"):
        result["why"] = f"{ENV}={mode} is not auto, torch or graph"
    elif mode == "torch":
        result["why"] = f"{ENV}=torch"
    elif (reason := engine.graph_why_not(Plan(None))) is not None:
        result["why"] = f"not the step graph: {reason}"
    elif mode == "graph":
        result.update(decode="graph", why=f"{ENV}=graph")
    else:
        try:
            result["step_ms"] = measure(engine)
        except Exception as err:  # an onnxruntime that fails to build or run the graph: torch's ops, said so
            result["why"] = f"the step graph failed ({type(err).__name__}: {err})"
        else:
            t, g = result["step_ms"]["torch"], result["step_ms"]["graph"]
            result.update(decode="graph" if g <= MARGIN * t else "torch", why=f"a step {t:.2f} ms through torch's ops, {g:.2f} ms through the graph")
    engine.decode = result["decode"]
    log.info("%s", describe(result))
    return result


@torch.inference_mode()
def measure(engine) -> dict[str, float]:
    """Milliseconds a full-model decode step takes through torch's ops and through the step graph (medians of ROUNDS
    alternating rounds of STEPS tokens after a PROMPT-token prefill)."""
    from routerlab.core.gates import Plan

    plan, graph = Plan(None), engine.graph(None)
    ids = [k % engine.anatomy.config.vocab_size for k in range(PROMPT)]
    times: dict[str, list[float]] = {"torch": [], "graph": []}
    for r in range(ROUNDS):
        for path in ("torch", "graph") if r % 2 == 0 else ("graph", "torch"):
            caches = engine.new_caches(PROMPT + STEPS + 1)
            engine._forward(ids, 0, caches, plan)  # the prefill, as a request's
            if path == "graph":
                graph.load(caches, STEPS)
            start = time.perf_counter()
            for k in range(STEPS):
                if path == "graph":
                    graph.step(k + 1)
                else:
                    engine._forward([k + 1], PROMPT + k, caches, plan)  # torch's decode step, as Engine._steps takes it
            times[path].append((time.perf_counter() - start) / STEPS)
    return {path: round(1e3 * statistics.median(ts), 3) for path, ts in times.items()}


def describe(result: dict) -> str:
    which = "the step graph (one onnxruntime run a step)" if result["decode"] == "graph" else "torch's ops"
    return f"decode steps: {which} ({result['why']})"
