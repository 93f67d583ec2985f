"""One decode step for many requests at once: every row's next token in one forward, each row routed as if alone.

A row is one generation (core/generation.py): the token it feeds, its position, its own KV caches and its own
`Plan` (router set or none, threshold, KV policy). At each routed sub-layer every row decides for itself from its
own scores; the sub-layer's products run once for the rows that run it (gathered), a `kv` row that skips attention
writes only its keys and values, and a sub-layer that every row skips is not computed at all. The rows' caches sit in
the slots of one `Slots` (core/slots.py) while they step together: at each layer the keys and values of every row
that writes are stored in one indexed write, each at its own length, and the attention of every row that attends is
one call over the slots, masked by each row's length there (`drop` keeps each layer's own positions: its holes).

`step_rows` covers what `one_token.run_layer_one` covers (plain layers, hard gates, no stand-ins); a row that
needs more (`mask`, stand-ins, another family's layers) takes the engine's own forward alone, in the same step, and
so does a batch of one (the engine's one-token step, fewer tensor ops than a batch needs). Knows nothing about sampling, traces, threads or the UI.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
from torch.nn import functional as F

from routerlab.core.cache import LayerCache
from routerlab.core.gates import ALL, Plan, decide
from routerlab.core.kernels import rope
from routerlab.core.one_token import one_token_ok
from routerlab.core.routed import Anatomy, AttentionParts, LayerParts
from routerlab.core.slots import Slots


class Row(Protocol):
    """What a step reads of a generation."""

    feed: tuple[int, int]  # (token, position) this step computes
    caches: list[LayerCache]
    plan: Plan


def batchable(an: Anatomy, row: Row) -> bool:
    return one_token_ok(an, row.plan)


@torch.inference_mode()
def step_rows(an: Anatomy, rows: list[Row]) -> tuple[torch.Tensor, list[list[float]]]:
    """Each row's next-token logits (B, V) and router scores (B lists of L floats, NaN where unrouted)."""
    from routerlab.core.engine import forward

    logits: list[torch.Tensor | None] = [None] * len(rows)
    scores: list[list[float] | None] = [None] * len(rows)
    together = [b for b, r in enumerate(rows) if batchable(an, r)]
    if len(together) == 1:  # a batch of one takes the engine's one-token step: nobody alone is slower than before
        together = []
    for b, row in enumerate(rows):  # rows the batched layers do not cover: the engine's forward, one at a time
        if b not in together:
            token, position = row.feed
            out, table = forward(an, torch.tensor([[token]]), torch.tensor([position]), row.caches, row.plan)
            logits[b], scores[b] = out[0, -1], table[0].tolist()
    if together:
        out, table = _step(an, [rows[b] for b in together])
        for j, b in enumerate(together):
            logits[b], scores[b] = out[j], table[j]
    return torch.stack(logits), scores


def _step(an: Anatomy, rows: list[Row]) -> tuple[torch.Tensor, list[list[float]]]:
    slots = Slots.of([r.caches for r in rows])  # the rows' caches in slots 0..B-1
    where = [r.caches[0].slot for r in rows]
    rows = sorted(rows, key=lambda r: r.caches[0].slot)  # computed in slot order: row b is slot b
    device = an.embed.weight.device
    ids = torch.tensor([[r.feed[0] for r in rows]], device=device)  # (1, B): the rows stand where a prefill's tokens would
    positions = torch.tensor([r.feed[1] for r in rows], device=device)  # (B,), in any order
    h = an.embed(ids)  # (1, B, D)
    tables = an.rope(h, positions)
    scores: list[dict[int, float]] = [{} for _ in rows]
    for i, parts in enumerate(an.layers):
        h = _layer(i, parts, h, tables[parts.attn.rope_key], positions, rows, scores, slots)
    x = an.final_norm(h)[0]  # (B, D)
    logits = an.head.batch(x, an.upcast)  # (B, V)
    if an.final_softcap:
        logits = torch.tanh(logits / an.final_softcap) * an.final_softcap
    n = an.n_layers
    table = torch.tensor([[float(s[i]) if i in s else math.nan for i in range(n)] for s in scores], dtype=torch.float32).tolist()
    if where != sorted(where):  # back to the callers' order
        logits, table = logits[torch.tensor(where, device=device)], [table[s] for s in where]
    return logits, table  # scores in float32, as a forward's score table holds them


def _decisions(i: int, x: torch.Tensor, rows: list[Row], scores: list[dict], targets: tuple[str, ...]) -> list[bool]:
    """Whether each row runs this sub-layer, by its own router at layer i on its own input x[:, b] against its own
    threshold. Rows that share a router are scored in one product (`Router.score_rows`)."""
    run = [True] * len(rows)
    groups: dict[int, tuple] = {}
    for b, row in enumerate(rows):
        plan = row.plan
        router = plan.router(i) if plan.target in targets else None
        if router is None:
            continue
        if plan.level == "sequence":  # decided at prefill, once for the request
            run[b] = decide(router, x[:, b : b + 1], i, plan, scores[b]) is ALL
        else:
            groups.setdefault(id(router), (router, []))[1].append(b)
    for router, members in groups.values():
        for b, score in zip(members, router.score_rows(x[0, members])):
            scores[b][i] = score
            run[b] = score >= rows[b].plan.threshold
    return run


def _layer(i: int, parts: LayerParts, h: torch.Tensor, table, positions: torch.Tensor, rows: list[Row],
           scores: list[dict], slots: Slots) -> torch.Tensor:
    x = parts.attn_norm(h)  # (1, B, D)
    runs = _decisions(i, x, rows, scores, ("attention", "block"))
    attend = [b for b, r in enumerate(runs) if r]
    keys_only = [b for b, r in enumerate(runs) if not r and rows[b].plan.policy == "kv" and rows[b].plan.level != "sequence"]
    if attend:
        h = _add(h, attend, _attention(parts.attn, x, attend, table, positions, slots, i))
    if keys_only:
        _keys_values(parts.attn, x, keys_only, table, positions, slots, i)
    blocked = {b for b, r in enumerate(runs) if not r and rows[b].plan.target == "block"}  # a skipped block skips its MLP too
    x = parts.mlp_norm(h)
    runs = _decisions(i, x, rows, scores, ("mlp",))
    mlp = [b for b, r in enumerate(runs) if r and b not in blocked]
    if mlp:
        xs = _gather(x, mlp)  # (n, D)
        gate, up = parts.gate_up.batch(xs, parts.upcast).chunk(2, dim=-1)  # (n, I) each
        h = _add(h, mlp, parts.down.batch(parts.mlp.act_fn(gate) * up, parts.upcast))
    return h


def _gather(x: torch.Tensor, which: list[int]) -> torch.Tensor:
    """Rows `which` of x (1, B, D) as (n, D); all of them without a copy."""
    return x[0] if len(which) == x.shape[1] else x[0, which]


def _add(h: torch.Tensor, which: list[int], update: torch.Tensor) -> torch.Tensor:
    """h (1, B, D) plus update (n, D) on rows `which`."""
    if len(which) == h.shape[1]:
        return h + update[None]
    return h.index_add(1, torch.tensor(which, device=h.device), update[None])


def _table(table, which: list[int], b: int):
    """The rotary table (cos, sin), each (1, 1, B, hd), cut to rows `which` (n of them)."""
    if len(which) == b:
        return table
    idx = torch.tensor(which, device=table[0].device)
    return table[0].index_select(2, idx), table[1].index_select(2, idx)


def _attention(a: AttentionParts, x: torch.Tensor, which: list[int], table, positions: torch.Tensor, slots: Slots,
               i: int) -> torch.Tensor:
    """The attention update (n, D) of rows `which`: one q|k|v product for them all, their keys and values stored in
    one write, then one attention call over every row's slot, each row masked to its own length at this layer."""
    n, hd, b = len(which), a.head_dim, x.shape[1]
    y = a.qkv.batch(_gather(x, which), a.upcast)  # (n, q_size + 2 * kv_size)
    heads = a.n_heads + a.n_kv_heads
    qk = rope(y[:, : heads * hd].reshape(n, heads, hd).transpose(0, 1)[None], _table(table, which, b))[0]  # (H, n, hd)
    values = y[:, y.shape[1] - a.kv_size :].reshape(n, a.n_kv_heads, hd)  # (n, Hkv, hd)
    slots.write(i, which, qk[a.n_heads :].transpose(0, 1), values, positions if n == b else positions[which])
    g = a.n_heads // a.n_kv_heads
    q = qk[: a.n_heads].transpose(0, 1).reshape(n, a.n_kv_heads, g, hd)  # the query heads of each KV group, folded
    if n < b:  # the rows that skip stand in the call with a zero query; their outputs are dropped
        idx = torch.tensor(which, device=q.device)
        q = q.new_zeros(b, a.n_kv_heads, g, hd).index_copy_(0, idx, q)
    lengths = [max(t, 1) for t in slots.lengths(i)]  # a row that skips with nothing stored yet: one (finite) entry
    t = max(lengths)
    k, v = slots.keys_values(i, t)  # (B, Hkv, t, hd)
    mask = None
    if min(lengths) < t:
        mask = (torch.arange(t, device=q.device)[None] < torch.tensor(lengths, device=q.device)[:, None]).view(b, 1, 1, t)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=a.scaling)  # (B, Hkv, G, hd)
    if n < b:
        out = out.index_select(0, idx)
    return a.o.batch(out.reshape(n, a.q_size), a.upcast)  # (n, D)


def _keys_values(a: AttentionParts, x: torch.Tensor, which: list[int], table, positions: torch.Tensor, slots: Slots,
                 i: int) -> None:
    """What skipping rows still write under `kv`: their keys and values at this layer, in one write."""
    n, hd = len(which), a.head_dim
    y = a.kv.batch(_gather(x, which), a.upcast)  # (n, 2 * kv_size)
    keys = rope(y[:, : a.kv_size].reshape(n, a.n_kv_heads, hd).transpose(0, 1)[None], _table(table, which, x.shape[1]))
    values = y[:, a.kv_size :].reshape(n, a.n_kv_heads, hd)
    slots.write(i, which, keys[0].transpose(0, 1), values, positions if n == x.shape[1] else positions[which])
