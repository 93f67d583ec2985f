"""Random router sets for tests that need routers which really skip (tests/test_room.py, tests/test_packed.py)."""

from __future__ import annotations

import torch

from routerlab.core.base.config import RoutingConfig
from routerlab.core.routing.router import RouterSet


def random_routers(model, granularity: str, seed: int) -> RouterSet:
    """A set on layers 1 and 2 whose weights are random and large: about half the cells skip at 0.5."""
    rs = RouterSet.zeros(model, RoutingConfig.from_granularity(granularity, [1, 2]))
    g = torch.Generator().manual_seed(seed)
    for r in rs.routers.values():
        r.proj.weight.data = torch.randn(r.proj.weight.shape, generator=g) * 3.0
    return rs
