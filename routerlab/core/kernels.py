"""The few tensor operations the engine builds a layer from: linear maps under the precision policy,
rotary embeddings, and fused projection weights.

Precision policy: weights may be stored in bf16 to halve the bytes a memory-bound decode step reads.
Where the CPU has no native bf16 matrix instructions, torch's bf16 products of many rows fall back
to a slow path (measured: a 512-token prefill 6.6x slower than fp32), while one-row products stay
fast. So `linear(..., upcast=True)` computes forwards of `UPCAST_MIN_TOKENS` or more tokens in fp32
(the weight converted on the fly) and rounds the result back to the storage dtype, keeping the
residual stream in one dtype. Decode steps (one token) always use the stored weights directly.

Knows nothing about transformers' module paths (routed.Anatomy resolves those), routers or KV policies.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

UPCAST_MIN_TOKENS = 8  # rows from which an fp32 product beats the emulated bf16 one (see bench speed)


def wants_upcast(n_tokens: int, upcast: bool) -> bool:
    return upcast and n_tokens >= UPCAST_MIN_TOKENS


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, upcast: bool = False) -> torch.Tensor:
    """x @ weight.T + bias, computed in fp32 for long inputs when `upcast` (see the module docstring)."""
    if wants_upcast(x.shape[-2], upcast):
        b = bias.float() if bias is not None else None
        return F.linear(x.float(), weight.float(), b).to(x.dtype)
    return F.linear(x, weight, bias)


def rope_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's (cos, sin) of shape (1, T, hd) as (cos, signed sin), each (1, 1, T, hd), built once per forward.

    HF's rotary embedding is x*cos + rotate_half(x)*sin with rotate_half(x) = cat(-x2, x1). Rolling
    x by hd/2 gives cat(x2, x1); folding the minus into sin makes the same product in fewer ops.
    """
    half = sin.shape[-1] // 2
    signed = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
    return cos.unsqueeze(1), signed.unsqueeze(1)


def rope(x: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotary embedding of x (1, H, T, hd) with a table from `rope_tables`."""
    cos, signed_sin = table
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def fuse_linears(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for several linear maps of the same input, stacked by output rows.

    The originals' parameters are re-pointed to views of the fused tensor, so no weight is held
    twice and the modules (and transformers' own forward) compute exactly as before. Biases are
    fused when every map has one (Qwen 2), else left to the modules (none of the supported
    families mixes them).
    """
    weight = torch.cat([lin.weight.detach() for lin in linears])  # (sum(out), in)
    for lin, part in zip(linears, weight.split([lin.out_features for lin in linears])):
        lin.weight.data = part
    bias = None
    if all(lin.bias is not None for lin in linears):
        bias = torch.cat([lin.bias.detach() for lin in linears])
        for lin, part in zip(linears, bias.split([lin.out_features for lin in linears])):
            lin.bias.data = part
    elif any(lin.bias is not None for lin in linears):
        raise ValueError("cannot fuse linear maps where only some have a bias")
    return weight, bias
