"""The pieces of an attention sub-layer on a sequence's own cache: q|k|v products split into rotated heads, and attention
by positions (caches may have holes), before the output map. Used by torch's layer (core/ops/layer.py). Knows nothing
about routers, gates, caches or the decode loop.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from routerlab.core.kernels.rotary import rope
from routerlab.core.kernels.weights import wants_upcast
from routerlab.core.model.anatomy import AttentionParts


def _heads(y: torch.Tensor, norm: nn.Module | None, head_dim: int) -> torch.Tensor:
    """Heads (1, H, T, hd) of a product y (1, T, H * hd), or of one token's (1, H * hd)."""
    if y.shape[-2] == 1:  # one token: views, no transpose (a decode step is mostly the fixed cost of each op)
        if norm is None and y.is_contiguous():
            return y.view(1, -1, 1, head_dim)
        y = y.reshape(1, 1, -1, head_dim)
        if norm is not None:
            y = norm(y)
        return y.view(1, -1, 1, head_dim)
    y = y.unflatten(-1, (-1, head_dim))  # (1, T, H, hd)
    if norm is not None:
        y = norm(y)  # Qwen 3 / Gemma 3 normalise each head
    return y.transpose(1, 2)  # (1, H, T, hd)


def _kv(a: AttentionParts, y: torch.Tensor, table) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys (rotated) and values from the k|v columns of a projection (1, T, 2 * kv_size)."""
    k, v = y.split(a.kv_size, dim=-1)
    return rope(_heads(k, a.k_norm, a.head_dim), table), _heads(v, None, a.head_dim)


split_kv = _kv  # keys (rotated) and values from a k|v product


def split_q(a: AttentionParts, y: torch.Tensor, table) -> torch.Tensor:
    """Queries (1, Hq, T, hd), rotated, from a query product y (1, T, q_size)."""
    return rope(_heads(y, a.q_norm, a.head_dim), table)


def split_qkv(a: AttentionParts, y: torch.Tensor, table) -> tuple[torch.Tensor, ...]:
    """Queries, keys and values (1, H, T, hd), rotated, from the fused product y (1, T, q_size + 2 * kv_size), or one
    token's (1, q_size + 2 * kv_size)."""
    if a.q_norm is not None or a.k_norm is not None:
        q = rope(_heads(y[..., : a.q_size], a.q_norm, a.head_dim), table)
        return (q, *_kv(a, y[..., a.q_size :], table))
    heads = _heads(y, None, a.head_dim)  # (1, Hq + 2 * Hkv, T, hd)
    qk = rope(heads[:, : a.n_heads + a.n_kv_heads], table)
    return qk[:, : a.n_heads], qk[:, a.n_heads :], heads[:, a.n_heads + a.n_kv_heads :]


def attend_heads(a: AttentionParts, q: torch.Tensor, q_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 k_pos: torch.Tensor, later_keys: bool = False) -> torch.Tensor:
    """Causal (optionally sliding-window) attention by positions, so caches may have holes: the heads' outputs side by
    side (1, Tq, q_size), in q's dtype, before the output map. A single query needs no mask when it is the last
    position (a decode step); `later_keys` says the keys may hold later positions (some tokens of a longer forward
    skipped, their keys kept)."""
    _, hq, tq, hd = q.shape
    g = hq // a.n_kv_heads
    dtype = q.dtype
    if wants_upcast(tq, a.upcast):  # long inputs: fp32 attention (see weights.linear)
        q, k, v = q.float(), k.float(), v.float()
    if tq > 1 and k.shape[2] == tq and not (later_keys or a.sliding_window):
        # The keys are these very queries, in order (a prefill; or a drop layer's running tokens):
        # the causal kernel, no mask built.
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=a.scaling, enable_gqa=g > 1)
        return out.to(dtype).transpose(1, 2).reshape(1, tq, hq * hd)
    mask = None
    if tq > 1 or a.sliding_window or later_keys:
        mask = k_pos[None, :] <= q_pos[:, None]  # (Tq, Tk)
        if a.sliding_window:
            mask = mask & (q_pos[:, None] - k_pos[None, :] < a.sliding_window)
        mask = mask.repeat(g, 1)  # rows ordered (group, query) to match the folded heads below
    # Fold the query heads of each KV group into the query axis: no repeat_kv copy of the cache.
    qg = q.reshape(1, a.n_kv_heads, g * tq, hd)  # (1, Hkv, G*Tq, hd)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=a.scaling)
    # reshape, not view: CUDA's attention kernels may return another memory layout (a view on a CPU, a copy there)
    if tq == 1:  # one query: the folded (Hkv, G) heads are the query heads in order
        return (out if out.dtype == dtype else out.to(dtype)).reshape(1, 1, hq * hd)
    out = out.to(dtype).reshape(1, hq, tq, hd).transpose(1, 2)  # (1, Tq, Hq, hd)
    return out.reshape(1, tq, hq * hd)
