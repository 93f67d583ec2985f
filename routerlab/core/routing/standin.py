"""Skip stand-ins: a tiny trained replacement for a skipped sub-layer (FlexiDepth's adapter idea).

A token that skips a routed sub-layer adds `up(silu(down(x)))` to its residual stream instead of
nothing, where `x` is the sub-layer's normed input (what its router reads: the attention norm's
output for attention and block, the MLP norm's for mlp). `up` starts at zero, so a fresh stand-in
is exactly plain skipping. Rank r: 2 x r x hidden weights, about 4 x r x hidden FLOPs per token.

Stand-ins belong to a RouterSet (trained, saved and loaded with its routers); the engine runs one
wherever a cell is skipped (core/ops/layer.py's `standin_add`). Like routers they are kept in float32 whatever
the base dtype: they are small, and their update is rounded to the residual stream's dtype once.

Knows nothing about transformers, decoding, training or checkpoints.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

ACTIVATION = "silu"  # the only one; a checkpoint says which, so another could be added later


class StandIn(nn.Module):
    """`up(silu(down(x)))`: a token's cheap replacement for one skipped sub-layer's update."""

    def __init__(self, hidden_size: int, rank: int):
        super().__init__()
        self.down = nn.Linear(hidden_size, rank, bias=False)
        self.up = nn.Linear(rank, hidden_size, bias=False)
        nn.init.zeros_(self.up.weight)  # a fresh stand-in adds exactly 0: plain skipping

    @property
    def rank(self) -> int:
        return self.down.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The update for `x` (..., D), in x's dtype; computed in float32."""
        y = F.linear(F.silu(F.linear(x.float(), self.down.weight)), self.up.weight)
        return y.to(x.dtype)

    def flops(self) -> float:
        """FLOPs per token (2 x multiply-adds of both products)."""
        return 4.0 * self.down.in_features * self.rank

    def extra_repr(self) -> str:
        return f"rank={self.rank}, activation={ACTIVATION}"
