"""One token through one layer: `run_layer` for a decode step, in as few tensor ops as it takes.

A decode step computes one token at each of the model's layers, and at that size a layer's time
is mostly the fixed cost of each tensor op (a few microseconds of dispatch), not arithmetic.
`run_layer_one` computes the same numbers as `engine.run_layer` for one token with a KV cache: the
same products, the same rotary and attention kernels, but no head/token transposes, no masks, no
gate arithmetic (a decode gate is all or nothing), one view per tensor instead of several.

It covers the plain layers (`LayerParts.plain`: pre-norm, gated MLP, global attention without
per-head norms) under hard gates without stand-ins (`one_token_ok`); everything else (training's
straight-through gates, `mask`, stand-ins, Gemma 3's sandwich norms, Qwen 3's head norms, sliding
windows) takes `run_layer`. Knows nothing about sampling, traces or the UI.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from routerlab.core.kernels.rotary import rope
from routerlab.core.model.cache import LayerCache
from routerlab.core.model.routed import AttentionParts, LayerParts
from routerlab.core.routing.gates import ALL, Plan, Scores, decide


def one_token_ok(an, plan: Plan) -> bool:
    """Whether a one-token forward under `plan` may take `run_layer_one` (else `engine.run_layer`)."""
    routers = plan.routers
    return an.plain and not plan.ste and plan.policy != "mask" and (routers is None or not getattr(routers, "standin_rank", 0))


def _rotated(a: AttentionParts, y: torch.Tensor, table, heads: int) -> torch.Tensor:
    """The first `heads` heads of y (1, N) as (1, heads, 1, hd), rotated; y is a qkv (or kv) product."""
    return rope(y[:, : heads * a.head_dim].view(1, heads, 1, a.head_dim), table)


def _values(a: AttentionParts, y: torch.Tensor) -> torch.Tensor:
    return y[:, y.shape[1] - a.kv_size :].view(1, a.n_kv_heads, 1, a.head_dim)  # (1, Hkv, 1, hd): the last columns


def attention_one(a: AttentionParts, x: torch.Tensor, position: torch.Tensor, table, cache: LayerCache) -> torch.Tensor:
    """One token's attention update (1, D): its queries against every key its layer's cache holds (all earlier
    positions, so no mask), after appending its own key and value."""
    y = a.qkv.one(x)  # (1, q_size + 2 * kv_size)
    qk = _rotated(a, y, table, a.n_heads + a.n_kv_heads)  # (1, Hq + Hkv, 1, hd): queries and keys, one rotary pass
    k, v, _ = cache.append(qk[:, a.n_heads :], _values(a, y), position)  # (1, Hkv, n, hd) each
    g = a.n_heads // a.n_kv_heads
    q = qk[:, : a.n_heads].view(1, a.n_kv_heads, g, a.head_dim)  # the query heads of each KV group, folded
    out = F.scaled_dot_product_attention(q, k, v, scale=a.scaling)  # (1, Hkv, G, hd)
    return a.o.one(out.reshape(1, a.q_size))  # reshape: a GPU's attention output may not be contiguous


def keys_values_one(a: AttentionParts, x: torch.Tensor, position: torch.Tensor, table, cache: LayerCache) -> None:
    """What a skipped token still writes under `kv`: its key and value at this layer."""
    y = a.kv.one(x)  # (1, 2 * kv_size)
    cache.append(_rotated(a, y, table, a.n_kv_heads), _values(a, y), position)


def mlp_one(parts: LayerParts, x: torch.Tensor) -> torch.Tensor:
    gate, up = parts.gate_up.one(x).chunk(2, dim=-1)  # (1, I) each
    return parts.down.one(parts.mlp.act_fn(gate) * up)  # (1, D)


def run_layer_one(i: int, parts: LayerParts, h: torch.Tensor, position: torch.Tensor, table, cache: LayerCache,
                  plan: Plan, scores: Scores) -> torch.Tensor:
    """`engine.run_layer` for h (1, 1, D), one token at `position` (1,), with its layer's cache."""
    router = plan.router(i)
    target = plan.target
    x = parts.attn_norm(h)
    gate = decide(router, x, i, plan, scores) if router is not None and target in ("attention", "block") else ALL
    if gate is ALL:
        h = h + attention_one(parts.attn, x, position, table, cache)  # (1, 1, D)
    elif plan.policy == "kv" and plan.level != "sequence":  # sequence level: nobody ever queries a skipped layer
        keys_values_one(parts.attn, x, position, table, cache)
    if target == "block" and gate is not ALL:
        return h
    x = parts.mlp_norm(h)
    gate = decide(router, x, i, plan, scores) if router is not None and target == "mlp" else ALL
    return h + mlp_one(parts, x) if gate is ALL else h
