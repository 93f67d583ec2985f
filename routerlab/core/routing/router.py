"""The Router (one linear score per token), RouterSet (the routers of one granularity, with
their skip stand-ins if it has any) and Calibration (one monotone map of a set's scores, so that a 0-1 threshold spans its useful range).

Knows nothing about transformers (a RouterSet only needs the layer count and hidden size), nor
about how a calibration is fitted (`routerlab/tuning/calibrate.py`) or stored (`checkpoint.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from routerlab.core.base.config import RoutingConfig
from routerlab.core.base.errors import RouterLabError
from routerlab.core.routing.standin import StandIn


@dataclass(frozen=True)
class Calibration:
    """calibrated score = sigmoid(scale * logit + shift), scale > 0; the same for every layer of a set.

    Monotone, so it changes no ordering and no decision, only where a threshold falls: a token
    runs at calibrated threshold t exactly when the raw score clears `raw_threshold(t)`. It is
    applied after training and never trained (training keeps the paper's bias-free router).
    """

    scale: float = 1.0
    shift: float = 0.0

    def __post_init__(self):
        for name in ("scale", "shift"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise RouterLabError(f"The router calibration's {name} must be a finite number, not {value!r}.",
                                     "Fit it again with `python -m routerlab calibrate`, or remove the calibration.")
        if self.scale <= 0:
            raise RouterLabError(f"The router calibration's scale must be > 0 (a monotone map), not {self.scale!r}.",
                                 "Fit it again with `python -m routerlab calibrate`, or remove the calibration.")
        object.__setattr__(self, "scale", float(self.scale))
        object.__setattr__(self, "shift", float(self.shift))

    @property
    def identity(self) -> bool:
        return self.scale == 1.0 and self.shift == 0.0

    def score(self, raw: float) -> float:
        """The calibrated score of a raw (uncalibrated) score in [0, 1]."""
        if raw <= 0.0 or raw >= 1.0:
            return float(raw >= 1.0)
        return sigmoid(self.scale * logit(raw) + self.shift)

    def raw_threshold(self, threshold: float) -> float:
        """The uncalibrated threshold that decides exactly as `threshold` does on calibrated scores."""
        if threshold <= 0.0 or threshold >= 1.0:
            return float(threshold >= 1.0)
        return sigmoid((logit(threshold) - self.shift) / self.scale)

    def to_dict(self) -> dict:
        return {"scale": self.scale, "shift": self.shift}


IDENTITY = Calibration()


class Router(nn.Module):
    """Router-Tuning's router: `sigmoid(w . x)` on the normed input of the routed sub-layer.

    Zero-initialised, so every score starts at 0.5 and, at the default threshold 0.5, nothing is
    skipped: attaching fresh routers leaves the model exactly as it was.
    """

    def __init__(self, hidden_size: int, device=None):
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1, bias=False, device=device)
        nn.init.zeros_(self.proj.weight)
        self.calibration = IDENTITY  # set by its RouterSet; a plain attribute, never a parameter

    def raw_logits(self, x: torch.Tensor) -> torch.Tensor:
        # Routers stay fp32 whatever the base dtype: they are tiny and their scores are compared
        # against a threshold, where bf16 rounding would flip decisions.
        return nn.functional.linear(x.float(), self.proj.weight.float()).squeeze(-1)  # (B, T)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The calibrated logits (B, T): `scale * (w . x) + shift`, just `w . x` uncalibrated."""
        z = self.raw_logits(x)
        c = self.calibration
        return z if c.identity else z * c.scale + c.shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.logits(x))  # (B, T) in (0, 1)

    def score_rows(self, x: torch.Tensor) -> list[float]:
        """The scores of n tokens (x: (n, D)) as Python floats: a decode batch's rows that share this router, in one
        product and one host read. One row: `score_one` (so a batch of one scores exactly as a request alone)."""
        if x.shape[0] == 1:
            return [self.score_one(x)]
        c = self.calibration
        w = self.proj.weight.view(-1)
        z = torch.mv(x.float(), w if w.dtype == torch.float32 else w.float()).tolist()  # (n,)
        return [sigmoid(c.scale * v + c.shift) for v in z]

    def score_one(self, x: torch.Tensor) -> float:
        """The score of one token (x: (1, 1, D)) as a Python float: the decode hot path.

        One dot product and one host read, instead of a handful of tiny tensor ops per routed
        layer and token (each costs microseconds of dispatch; together they outweighed the
        attention that skipping saves on short contexts). The calibration is two float operations.
        """
        c = self.calibration
        w = self.proj.weight.view(-1)  # (D,); routers keep fp32 weights
        z = torch.dot(x.view(-1).float(), w if w.dtype == torch.float32 else w.float()).item()  # x.view(-1): a view, even strided
        return sigmoid(c.scale * z + c.shift)


def sigmoid(z: float) -> float:
    """The logistic function on a Python float, without overflow for large |z|."""
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def logit(p: float) -> float:
    """The inverse of `sigmoid` on (0, 1)."""
    return math.log(p) - math.log1p(-p)


class RouterSet(nn.Module):
    """One router per routed layer, plus the RoutingConfig that says where they sit.

    With `standin_rank` > 0 each routed layer also has a StandIn of that rank, which a skipped
    cell runs instead of nothing (0: plain skipping, as Router-Tuning does).
    """

    def __init__(self, config: RoutingConfig, n_layers: int, hidden_size: int, standin_rank: int = 0, device=None):
        super().__init__()
        bad = [i for i in config.layers if not 0 <= i < n_layers]
        if bad:
            raise RouterLabError(f"Routed layers {bad} do not exist in a {n_layers}-layer model.")
        if isinstance(standin_rank, bool) or not isinstance(standin_rank, int) or not 0 <= standin_rank <= hidden_size:
            raise RouterLabError(f"Stand-in rank {standin_rank!r} is not allowed.",
                                 f"Use a whole number from 1 to {hidden_size} (0: no stand-ins), e.g. 32.")
        self.config = config
        self.n_layers = n_layers
        self.hidden_size = hidden_size
        self.standin_rank = standin_rank
        self.routers = nn.ModuleDict({str(i): Router(hidden_size, device) for i in config.layers})
        self.standins = nn.ModuleDict({str(i): StandIn(hidden_size, standin_rank) for i in config.layers} if standin_rank else {})
        if standin_rank and device is not None:
            self.standins.to(device)
        self.calibration = IDENTITY

    @property
    def calibration(self) -> Calibration:
        """The set's one score map; setting it hands it to every router (scores, decisions, traces follow)."""
        return self._calibration

    @calibration.setter
    def calibration(self, calibration: Calibration) -> None:
        if not isinstance(calibration, Calibration):
            raise TypeError(f"expected a Calibration, got {type(calibration).__name__}")
        self._calibration = calibration
        for router in self.routers.values():
            router.calibration = calibration

    @classmethod
    def zeros(cls, model: nn.Module, config: RoutingConfig) -> "RouterSet":
        """Fresh (untrained, never-skipping) routers sized for `model`."""
        text = model.config.get_text_config()
        param = next(model.parameters(), None)  # fp32 routers (they always are), on the model's device
        return cls(config, text.num_hidden_layers, text.hidden_size, device=param.device if param is not None else None)

    def state(self) -> tuple:
        """What its outputs depend on, cheaply compared: its calibration and the identity and version counter of each
        tensor (an optimizer's step or `load_state_dict`'s copy changes a version). Equal states: the same set."""
        tensors = (*self.parameters(), *self.buffers())
        return self.calibration, tuple(map(id, tensors)), tuple(t._version for t in tensors)

    def get(self, layer: int) -> Router | None:
        return self.routers[str(layer)] if str(layer) in self.routers else None

    def standin(self, layer: int) -> StandIn | None:
        """The stand-in a skipped cell of `layer` runs, or None (plain skipping)."""
        return self.standins[str(layer)] if str(layer) in self.standins else None

    @property
    def granularity(self) -> str:
        return self.config.granularity

    def extra_repr(self) -> str:
        rank = f", standin_rank={self.standin_rank}" if self.standin_rank else ""
        return f"granularity={self.granularity}, layers={list(self.config.layers)}{rank}"
