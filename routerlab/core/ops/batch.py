"""One decode step for many requests at once: every row's next token in one forward, each row routed as if alone.

A row is one generation (core/decode/generation.py): the token it feeds, its position, its own KV caches and its own
`Plan` (router set or none, threshold, KV policy). At each routed sub-layer every row decides for itself from its
own scores; the sub-layer's products run once for the rows that run it (gathered), a `kv` row that skips attention
writes only its keys and values, and a sub-layer that every row skips is not computed at all. The rows' caches sit in
the slots of one `Slots` (core/model/slots.py) while they step together: at each layer the keys and values of every row
that writes are stored in one indexed write, each at its own length, and the attention of every row that attends is
one call over the slots, masked by each row's length there (`drop` keeps each layer's own positions: its holes).

`step` covers what `one_token.run_layer_one` covers (plain layers, hard gates, no stand-ins: `batchable`); which rows
take it, the step graph or the forward alone is decided by core/decode/rows.py. Knows nothing about sampling, traces,
threads or the UI.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
from torch.nn import functional as F

from routerlab.core.kernels.rotary import rope
from routerlab.core.model.cache import LayerCache
from routerlab.core.model.routed import Anatomy, AttentionParts, LayerParts
from routerlab.core.model.slots import Slots
from routerlab.core.ops.one_token import one_token_ok
from routerlab.core.routing.gates import ALL, Plan, decide


class Row(Protocol):
    """What a step reads of a generation."""

    feed: tuple[int, int]  # (token, position) this step computes
    caches: list[LayerCache]
    plan: Plan


def batchable(an: Anatomy, row: Row) -> bool:
    """Whether torch's batched layer covers the row's plan (what the one-token layer covers)."""
    return one_token_ok(an, row.plan)


@torch.inference_mode()
def step(an: Anatomy, rows: list[Row]) -> tuple[torch.Tensor, list[list[float]]]:
    slots = Slots.of([r.caches for r in rows])  # the rows' caches in slots 0..B-1
    where = [r.caches[0].slot for r in rows]
    rows = sorted(rows, key=lambda r: r.caches[0].slot)  # computed in slot order: row b is slot b
    device = an.embed.weight.device
    ids = torch.tensor([[r.feed[0] for r in rows]], device=device)  # (1, B): the rows stand where a prefill's tokens would
    positions = torch.tensor([r.feed[1] for r in rows], device=device)  # (B,), in any order
    h = an.embed(ids)  # (1, B, D)
    tables = {kind: _Rotary(cos, sin) for kind, (cos, sin) in an.rope(h, positions, max(r.feed[1] for r in rows)).items()}
    scores: list[dict[int, float]] = [{} for _ in rows]
    routes = _Routes(rows)
    for i, parts in enumerate(an.layers):
        h = _layer(i, parts, h, tables[parts.attn.rope_key], positions, routes, scores, slots)
    x = an.final_norm(h)[0]  # (B, D)
    logits = an.head.batch(x, an.upcast)  # (B, V)
    if an.final_softcap:
        logits = torch.tanh(logits / an.final_softcap) * an.final_softcap
    n = an.n_layers
    table = torch.tensor([[float(s[i]) if i in s else math.nan for i in range(n)] for s in scores], dtype=torch.float32, device="cpu").tolist()
    if where != sorted(where):  # back to the callers' order
        logits, table = logits[torch.tensor(where, device=device)], [table[s] for s in where]
    return logits, table  # scores in float32, as a forward's score table holds them


class _Routes:
    """The rows' routing, looked up once per step rather than per row at every layer: the rows each router set scores
    (token level), the rows decided at prefill (sequence level), and each row's threshold and policy."""

    def __init__(self, rows: list[Row]):
        self.thresholds = [r.plan.threshold for r in rows]
        self.everyone = list(range(len(rows)))
        self.keeps_kv = [r.plan.policy == "kv" and r.plan.level != "sequence" for r in rows]  # a skipped attention still writes
        self.blocks = [r.plan.target == "block" for r in rows]  # a skipped block skips its MLP too
        self.sets: dict[int, tuple[Plan, list[int]]] = {}  # id(RouterSet) -> (a plan with it, its rows)
        self.sequence: list[tuple[int, Plan]] = []
        for b, row in enumerate(rows):
            plan = row.plan
            if plan.routers is None:
                continue
            if plan.level == "sequence":
                self.sequence.append((b, plan))
            else:
                self.sets.setdefault(id(plan.routers), (plan, []))[1].append(b)


def _decisions(i: int, x: torch.Tensor, routes: _Routes, scores: list[dict], targets: tuple[str, ...]) -> list[bool]:
    """Whether each row runs this sub-layer, by its own router at layer i on its own input x[:, b] against its own
    threshold. Rows that share a router are scored in one product (`Router.score_rows`)."""
    run = [True] * x.shape[1]
    groups: dict[int, tuple] = {}
    for plan, members in routes.sets.values():
        router = plan.router(i) if plan.target in targets else None
        if router is not None:
            groups.setdefault(id(router), (router, []))[1].extend(members)
    for b, plan in routes.sequence:  # decided at prefill, once for the request
        router = plan.router(i) if plan.target in targets else None
        if router is not None:
            run[b] = decide(router, x[:, b : b + 1], i, plan, scores[b]) is ALL
    thresholds = routes.thresholds
    for router, members in groups.values():
        for b, score in zip(members, router.score_rows(x[0] if members == routes.everyone else x[0, members])):
            scores[b][i] = score
            run[b] = score >= thresholds[b]
    return run


def _layer(i: int, parts: LayerParts, h: torch.Tensor, table, positions: torch.Tensor, routes: _Routes,
           scores: list[dict], slots: Slots) -> torch.Tensor:
    x = parts.attn_norm(h)  # (1, B, D)
    runs = _decisions(i, x, routes, scores, ("attention", "block"))
    attend = [b for b, r in enumerate(runs) if r]
    skip = [b for b, r in enumerate(runs) if not r]
    keys_only = [b for b in skip if routes.keeps_kv[b]]
    if attend:
        rows = _Rows(attend, x.shape[1], x.device)
        h = _add(h, rows, _attention(parts.attn, x, rows, table, positions, slots, i))
    if keys_only:
        _keys_values(parts.attn, x, _Rows(keys_only, x.shape[1], x.device), table, positions, slots, i)
    x = parts.mlp_norm(h)
    runs = _decisions(i, x, routes, scores, ("mlp",))
    for b in skip:
        if routes.blocks[b]:  # a skipped block skips its MLP too
            runs[b] = False
    mlp = [b for b, r in enumerate(runs) if r]
    if mlp:
        rows = _Rows(mlp, x.shape[1], x.device)
        gate, up = parts.gate_up.batch(_gather(x, rows), parts.upcast).chunk(2, dim=-1)  # (n, I) each
        h = _add(h, rows, parts.down.batch(parts.mlp.act_fn(gate) * up, parts.upcast))
    return h


class _Rows:
    """Some rows of the batch: their indices, and (unless they are all of them, in order) the same as one tensor, made
    once for every gather, write and add of a sub-layer."""

    def __init__(self, which: list[int], b: int, device=None):
        self.which, self.n = which, len(which)
        self.index = None if self.n == b else torch.tensor(which, device=device)

    def pick(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return t if self.index is None else t.index_select(dim, self.index)


def _gather(x: torch.Tensor, rows: _Rows) -> torch.Tensor:
    """Rows of x (1, B, D) as (n, D); all of them without a copy."""
    return rows.pick(x[0])


def _add(h: torch.Tensor, rows: _Rows, update: torch.Tensor) -> torch.Tensor:
    """h (1, B, D) plus update (n, D) on `rows`."""
    if rows.index is None:
        return h + update[None]
    return h.index_add(1, rows.index, update[None])


class _Rotary:
    """A step's rotary table as its rows' heads take it: cos and signed sin (B, 1, hd), stacked (2, B, 1, hd), so the
    rows of a sub-layer cut both in one gather."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor):  # (1, 1, B, hd) each, `kernels.rope_tables` form
        self.both = torch.cat([cos, sin]).transpose(1, 2)  # (2, B, 1, hd)

    def of(self, rows: _Rows) -> tuple[torch.Tensor, torch.Tensor]:
        both = rows.pick(self.both, 1)
        return both[0], both[1]


def _attention(a: AttentionParts, x: torch.Tensor, rows: _Rows, table, positions: torch.Tensor, slots: Slots,
               i: int) -> torch.Tensor:
    """The attention update (n, D) of `rows`: one q|k|v product for them all, their keys and values stored in one
    write, then one attention call over their slots, each row masked to its own length at this layer."""
    n, hd = rows.n, a.head_dim
    y = a.qkv.batch(_gather(x, rows), a.upcast)  # (n, q_size + 2 * kv_size)
    heads = a.n_heads + a.n_kv_heads
    qk = rope(y[:, : heads * hd].view(n, heads, hd), table.of(rows))  # (n, Hq + Hkv, hd): queries and keys, one pass
    values = y[:, heads * hd :].view(n, a.n_kv_heads, hd)  # (n, Hkv, hd)
    at, cols = slots.write(i, rows.which, rows.index, qk[:, a.n_heads :], values, rows.pick(positions))
    g = a.n_heads // a.n_kv_heads
    q = qk[:, : a.n_heads].view(n, a.n_kv_heads, g, hd)  # the query heads of each KV group, folded
    t = max(at) + 1  # each row's keys: its first at + 1 entries at this layer (its own just written)
    k, v = slots.keys_values(i, t)  # every row's (B, Hkv, t, hd): views
    # Only the rows that attend: a copy of their keys and values costs less than attending for every row.
    k, v = rows.pick(k), rows.pick(v)
    mask = None if cols is None or min(at) == t - 1 else slots.upto(t, cols).view(n, 1, 1, t)  # each row's own keys only
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=a.scaling)  # (n, Hkv, G, hd)
    return a.o.batch(out.reshape(n, a.q_size), a.upcast)  # (n, D)


def _keys_values(a: AttentionParts, x: torch.Tensor, rows: _Rows, table, positions: torch.Tensor, slots: Slots,
                 i: int) -> None:
    """What skipping rows still write under `kv`: their keys and values at this layer, in one write."""
    n, hd = rows.n, a.head_dim
    y = a.kv.batch(_gather(x, rows), a.upcast)  # (n, 2 * kv_size)
    keys = rope(y[:, : a.kv_size].view(n, a.n_kv_heads, hd), table.of(rows))
    values = y[:, a.kv_size :].view(n, a.n_kv_heads, hd)
    slots.write(i, rows.which, rows.index, keys, values, rows.pick(positions))
