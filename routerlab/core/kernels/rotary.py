"""Rotary embeddings, as the engine applies them: tables built once per forward, one fused product.

Linear maps and weight formats live in weights.py. Knows nothing about transformers' module paths
(anatomy.Anatomy resolves those), routers or KV policies.
"""

from __future__ import annotations

import torch


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
