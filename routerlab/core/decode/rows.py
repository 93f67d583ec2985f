"""A step of many rows, each through the runtime that takes it: the rows whose plan has a step graph (`graphs`, the
engine's `graph_for`, core/graph/graph_rows.py) one onnxruntime run for each graph; the others that torch's batched
layer covers one batched forward (core/ops/batch.py); the rest, and a batch of one, torch's forward alone, a row at a
time (core/ops/forward.py). A row's numbers are those it gets alone (core/graph/graph_rows.py says to which bits).
The room's step (core/serve/room.py) calls it. Knows nothing about sampling, traces, threads or the UI.
"""

from __future__ import annotations

import torch

from routerlab.core.graph import graph_rows
from routerlab.core.model.routed import Anatomy
from routerlab.core.ops import batch
from routerlab.core.ops.batch import Row
from routerlab.core.ops.forward import forward


@torch.inference_mode()
def step_rows(an: Anatomy, rows: list[Row], graphs=None) -> tuple[torch.Tensor, list[list[float]]]:
    """Each row's next-token logits (B, V) and router scores (B lists of L floats, NaN where unrouted). `graphs`: a
    plan -> its step graph or None (core/decode/engine.Engine.graph_for): the rows it gives one decode through it together,
    alone or not (core/graph/graph_rows.py), as they would alone."""
    logits: list[torch.Tensor | None] = [None] * len(rows)
    scores: list[list[float] | None] = [None] * len(rows)
    by_graph: dict[int, tuple] = {}  # id(graph) -> (graph, its rows)
    for b, row in enumerate(rows if graphs is not None else []):
        graph = graphs(row.plan) if graph_rows.graph_ok(row) else None
        if graph is not None:
            by_graph.setdefault(id(graph), (graph, []))[1].append(b)
    on_graph = {b for _, bs in by_graph.values() for b in bs}
    together = [b for b, r in enumerate(rows) if b not in on_graph and batch.batchable(an, r)]
    if len(together) == 1:  # a batch of one takes the engine's one-token step: nobody alone is slower than before
        together = []
    for graph, bs in by_graph.values():
        out, table = graph_rows.step(graph, [rows[b] for b in bs])
        for j, b in enumerate(bs):
            logits[b], scores[b] = out[j], table[j]
    for b, row in enumerate(rows):  # rows the batched layers do not cover: the engine's forward, one at a time
        if b not in together and b not in on_graph:
            token, position = row.feed
            device = an.embed.weight.device
            out, table = forward(an, torch.tensor([[token]], device=device), torch.tensor([position], device=device),
                                 row.caches, row.plan, top=position, scores_on="cpu")
            logits[b], scores[b] = out[0, -1], table[0].tolist()
    if together:
        out, table = batch.step(an, [rows[b] for b in together])
        for j, b in enumerate(together):
            logits[b], scores[b] = out[j], table[j]
    if on_graph:  # the graph's logits are fp32
        return torch.stack([x.float() for x in logits]), scores
    return torch.stack(logits), scores
