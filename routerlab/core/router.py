"""The Router (one linear score per token) and RouterSet (the routers of one granularity).

Knows nothing about transformers: a RouterSet only needs the layer count and hidden size.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from routerlab.core.config import RoutingConfig


class Router(nn.Module):
    """Router-Tuning's router: `sigmoid(w . x)` on the normed input of the routed sub-layer.

    Zero-initialised, so every score starts at 0.5 and, at the default threshold 0.5, nothing is
    skipped: attaching fresh routers leaves the model exactly as it was.
    """

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1, bias=False)
        nn.init.zeros_(self.proj.weight)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        # Routers stay fp32 whatever the base dtype: they are tiny and their scores are compared
        # against a threshold, where bf16 rounding would flip decisions.
        return nn.functional.linear(x.float(), self.proj.weight.float()).squeeze(-1)  # (B, T)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.logits(x))  # (B, T) in (0, 1)

    def score_one(self, x: torch.Tensor) -> float:
        """The score of one token (x: (1, 1, D)) as a Python float: the decode hot path.

        One dot product and one host read, instead of a handful of tiny tensor ops per routed
        layer and token (each costs microseconds of dispatch; together they outweighed the
        attention that skipping saves on short contexts).
        """
        return sigmoid(torch.dot(x.reshape(-1).float(), self.proj.weight.reshape(-1).float()).item())


def sigmoid(z: float) -> float:
    """The logistic function on a Python float, without overflow for large |z|."""
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


class RouterSet(nn.Module):
    """One router per routed layer, plus the RoutingConfig that says where they sit."""

    def __init__(self, config: RoutingConfig, n_layers: int, hidden_size: int):
        super().__init__()
        bad = [i for i in config.layers if not 0 <= i < n_layers]
        if bad:
            from routerlab.core.errors import RouterLabError

            raise RouterLabError(f"Routed layers {bad} do not exist in a {n_layers}-layer model.")
        self.config = config
        self.n_layers = n_layers
        self.hidden_size = hidden_size
        self.routers = nn.ModuleDict({str(i): Router(hidden_size) for i in config.layers})

    @classmethod
    def zeros(cls, model: nn.Module, config: RoutingConfig) -> "RouterSet":
        """Fresh (untrained, never-skipping) routers sized for `model`."""
        text = model.config.get_text_config()
        return cls(config, text.num_hidden_layers, text.hidden_size)

    def get(self, layer: int) -> Router | None:
        return self.routers[str(layer)] if str(layer) in self.routers else None

    @property
    def granularity(self) -> str:
        return self.config.granularity

    def extra_repr(self) -> str:
        return f"granularity={self.granularity}, layers={list(self.config.layers)}"
