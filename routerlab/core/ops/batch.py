"""One decode step for many requests at once through torch's layer: every row's next token in one forward, each row
routed as if alone.

A row is one generation (core/decode/generation.py): the token it feeds, its position, its own KV caches and its own
`Plan` (router set or none, threshold, KV policy). `step` runs the rows as sequences of one token each through
core/ops/layer.py's `run_layer` (each row decides for itself; products once for the rows that run them). The rows'
caches sit in the slots of one `Slots` (core/model/slots.py) while they step together, so each layer's keys and values
are stored in one indexed write, each row at its own length, and the attention of every row that attends is one call
over the slots, masked by each row's length there (`drop` keeps each layer's own positions: its holes).

Covers plain layers under hard gates without stand-ins (`batchable`); which rows take it, the step graph or the
forward alone is decided by core/decode/runtime.py. Knows nothing about sampling, traces, threads or the UI.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch

from routerlab.core.model.cache import LayerCache
from routerlab.core.model.anatomy import Anatomy
from routerlab.core.model.slots import Slots
from routerlab.core.ops.layer import Seq, SlotRotary, Tokens, hard, run_layer
from routerlab.core.routing.gates import Plan


class Row(Protocol):
    """What a step reads of a generation."""

    feed: tuple[int, int]  # (token, position) this step computes
    caches: list[LayerCache]
    plan: Plan


def batchable(an: Anatomy, row: Row) -> bool:
    """Whether the row can step among others: hard gates without stand-ins (`layer.hard`) on plain layers (pre-norm,
    gated MLP, global attention without per-head norms: what attention over the slots computes)."""
    return an.plain and hard(row.plan)


@torch.inference_mode()
def step(an: Anatomy, rows: list[Row]) -> tuple[torch.Tensor, list[list[float]]]:
    slots = Slots.of([r.caches for r in rows])  # the rows' caches in slots 0..B-1
    where = [r.caches[0].slot for r in rows]
    rows = sorted(rows, key=lambda r: r.caches[0].slot)  # computed in slot order: row b is slot b
    device = an.embed.weight.device
    ids = torch.tensor([[r.feed[0] for r in rows]], device=device)  # (1, B): the rows stand where a prefill's tokens would
    positions = torch.tensor([r.feed[1] for r in rows], device=device)  # (B,), in any order
    h = an.embed(ids)  # (1, B, D)
    rotary = {kind: SlotRotary(cos, sin) for kind, (cos, sin) in an.rope(h, positions, max(r.feed[1] for r in rows)).items()}
    seqs = [Seq(b, b + 1, r.plan, positions[b : b + 1], r.caches, None) for b, r in enumerate(rows)]
    tokens = Tokens(seqs, slots, positions, rotary)
    for i, parts in enumerate(an.layers):
        h = run_layer(i, parts, h, tokens)
    scores = [s.scores for s in seqs]
    x = an.final_norm(h)[0]  # (B, D)
    logits = an.head.batch(x, an.upcast)  # (B, V)
    if an.final_softcap:
        logits = torch.tanh(logits / an.final_softcap) * an.final_softcap
    n = an.n_layers
    table = torch.tensor([[float(s[i]) if i in s else math.nan for i in range(n)] for s in scores], dtype=torch.float32, device="cpu").tolist()
    if where != sorted(where):  # back to the callers' order
        logits, table = logits[torch.tensor(where, device=device)], [table[s] for s in where]
    return logits, table  # scores in float32, as a forward's score table holds them
