"""The one step seam: every decode step, of a request alone (a room of one) or of a room's rows, goes through
`Runtime.step`, which is also the one place that chooses the runtime each row decodes through.

Two runtimes compute a step: the step graph (core/graph/step_graph.py: the whole step as one onnxruntime run, rows
through it together, core/graph/graph_rows.py) and torch's layer (core/ops/layer.py: rows together through
core/ops/batch.py, or one row through core/ops/forward.py). `decode` is the engine's choice, measured at start-up
(core/decode/decode_paths.py): "graph" sends every row whose plan a graph can take through its router set's graph
(built on first use, kept for a few sets); the other rows, and every row under "torch", take torch's layer. A row
looks its graph up once (its `runtime` attribute), so a set trained in place meanwhile takes effect at its next
request, and its trace says which path decoded it and, if not the graph, why. A row's numbers are those it gets
alone (core/graph/graph_rows.py says to which bits). Knows nothing about sampling, threads or the UI.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import torch

from routerlab.core.graph import graph_rows, step_graph
from routerlab.core.model.anatomy import Anatomy
from routerlab.core.ops import batch
from routerlab.core.ops.batch import Row
from routerlab.core.ops.forward import forward
from routerlab.core.routing.gates import Plan

log = logging.getLogger(__name__)

KEPT = 4  # router sets whose step graphs are kept (the newest)


class Runtime:
    """The runtimes a model's decode steps run on, and the choice between them (see the module's docstring)."""

    def __init__(self, an: Anatomy, max_context: int):
        self.anatomy, self.max_context = an, max_context
        self.decode = "torch"  # "graph": rows it can take decode through one onnxruntime graph a step
        self._graphs: list = []  # (router set, its state, its StepGraph)
        self._lock = threading.Lock()
        self._reason: str | None = None  # why the model cannot decode through a graph ("": it can), once known

    # -- the choice ----------------------------------------------------------------------------------------------
    def why_not(self, plan: Plan) -> str | None:
        """Why a row with this plan cannot decode through a step graph, or None."""
        if self._reason is None:
            self._reason = step_graph.why_not(self.anatomy) or ""
        if self._reason:
            return self._reason
        return "training's straight-through gates" if plan.ste else step_graph.routing_why_not(plan.routers, plan.policy)

    def graph_for(self, plan: Plan):
        """The step graph of the plan's router set (or of the full model) where `decode` is "graph" and a graph can
        take the plan; else None (onnxruntime failing to build one included: logged, and the row takes torch's)."""
        if self.decode != "graph" or self.why_not(plan) is not None:
            return None
        try:
            return self.graph(plan.routers, plan.policy if plan.routers is not None else "kv")
        except Exception as err:  # a graph onnxruntime cannot build: torch's layer decodes these rows
            log.warning("no step graph for %s (%s: %s); torch's ops decode it", plan.target or "the full model", type(err).__name__, err)
            return None

    def graph(self, routers, policy: str = "kv"):
        """The step graph of a router set (None: the full model) under a KV policy as it is now: built on first use,
        and again once the set's weights or calibration changed (a set trained or recalibrated in place)."""
        state = (routers.state(), policy) if routers is not None else None
        with self._lock:
            graph = next((g for r, st, g in self._graphs if r is routers and st == state), None)
            if graph is None:
                graph = step_graph.StepGraph(self.anatomy, self.max_context, routers=routers, policy=policy)
                self._graphs = [*self._graphs[1 - KEPT:], (routers, state, graph)]
            return graph

    @property
    def graphs(self) -> int:
        """Step graphs built and kept."""
        return len(self._graphs)

    def runtime_of(self, row: Row):
        """The row's step graph, or None for torch's layer: looked up at its first step (or `prepare`) and kept on the
        row while `decode` stays; its trace's meta["decode"] says which, and why not the graph."""
        kept = getattr(row, "runtime", None)
        if kept is not None and kept[0] == self.decode:
            return kept[1]
        graph = self.graph_for(row.plan)
        meta = getattr(getattr(row, "trace", None), "meta", None)
        if meta is not None and self.decode == "graph":
            if graph is not None:
                meta["decode"] = step_graph.DECODES
            else:
                reason = self.why_not(row.plan) or "onnxruntime could not build it; the log says why"
                meta["decode"] = f"torch ops (not the step graph: {reason})"
        try:
            row.runtime = (self.decode, graph)
        except AttributeError:  # a row that keeps nothing: asked again each step
            pass
        return graph

    prepare = runtime_of  # a request's first step builds its graph before its prompt is read, not in its decode

    # -- the step ------------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self, rows: list[Row]) -> tuple[torch.Tensor, list[list[float]]]:
        """Each row's next-token logits (B, V) and router scores (B lists of L floats, NaN where unrouted): the rows
        a graph takes through it together; the others that torch's batched layer covers in one forward of them all;
        the rest (and a lone torch row) through torch's forward of one sequence."""
        an = self.anatomy
        logits: list[torch.Tensor | None] = [None] * len(rows)
        scores: list[list[float] | None] = [None] * len(rows)
        by_graph: dict[int, tuple] = {}  # id(graph) -> (graph, its rows)
        for b, row in enumerate(rows):
            graph = self.runtime_of(row)
            if graph is not None and graph_rows.graph_ok(row):
                by_graph.setdefault(id(graph), (graph, []))[1].append(b)
            elif graph is not None and getattr(row, "trace", None) is not None:  # its caches miss positions before it
                row.trace.meta["decode"] = "torch ops (not the step graph: the prompt's reading was stopped)"
        on_graph = {b for _, bs in by_graph.values() for b in bs}
        if len(by_graph) == 1 and len(on_graph) == len(rows):  # every row through one graph: its logits as they come
            return graph_rows.step(next(iter(by_graph.values()))[0], rows)
        together = [b for b, r in enumerate(rows) if b not in on_graph and batch.batchable(an, r)]
        if len(together) == 1:  # a batch of one takes the one-sequence forward: nobody alone is slower than before
            together = []
        for graph, bs in by_graph.values():
            out, table = graph_rows.step(graph, [rows[b] for b in bs])
            for j, b in enumerate(bs):
                logits[b], scores[b] = out[j], table[j]
        device = an.embed.weight.device
        for b, row in enumerate(rows):
            if b not in together and b not in on_graph:
                token, position = row.feed
                out, table = forward(an, torch.tensor([[token]], device=device), torch.tensor([position], device=device),
                                     row.caches, row.plan, top=position, scores_on="cpu")
                logits[b], scores[b] = out[0, -1], table[0].tolist()
        if together:
            out, table = batch.step(an, [rows[b] for b in together])
            for j, b in enumerate(together):
                logits[b], scores[b] = out[j], table[j]
        if on_graph:  # the graph's logits are fp32; stacked by numpy on this thread (graph_rows.copied says why)
            return torch.from_numpy(np.stack([x.float().numpy() for x in logits])), scores
        return torch.stack(logits), scores
