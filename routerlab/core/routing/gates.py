"""How a forward routes: a request's `Plan`, the `Gate` of each routed sub-layer, and the decision between them.

`decide` turns a router's scores into a Gate under the plan (hard 0/1 at inference, straight-through
in training, a fixed choice per request at sequence level); `score_table` collects a forward's scores.
Used by torch's layer (core/ops/layer.py) and the engine's plans. Knows nothing
about weights, caches or the model beyond a router's input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from routerlab.core.routing.router import RouterSet, sigmoid


@dataclass
class Plan:
    """How one request routes: which routers, the threshold in force, the KV policy.

    `ste=True` is the training mode: every sub-layer runs and the hard gate multiplies its update
    with a straight-through gradient to the router (the `mask`/`kv` semantics).
    """

    routers: RouterSet | None
    threshold: float = 0.5
    policy: str = "kv"
    ste: bool = False
    sequence: dict[int, tuple[torch.Tensor, bool]] = field(default_factory=dict)  # level=sequence: decided at prefill
    # Looked up once per request, since a decode step asks at every layer and a RouterSet's lookups (ModuleDict, module
    # attributes) cost microseconds each: layer -> router, and layer -> its weight as a flat fp32 view (decode scores).
    _by_layer: dict | None = field(default=None, init=False, repr=False, compare=False)
    _flat: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def router(self, layer: int):
        """The router at `layer`, or None where the layer is not routed (or the plan has no routers)."""
        if self._by_layer is None:
            rs = self.routers
            self._by_layer = {} if rs is None else {i: rs.get(i) for i in rs.config.layers}
        return self._by_layer.get(layer)

    def score_one(self, layer: int, x: torch.Tensor) -> float:
        """The score of one token x (1, 1, D) by the router at `layer`, as `Router.score_one` computes it (one dot
        product in fp32, one host read, the calibration in Python), without its per-call lookups."""
        router = self.router(layer)
        w = self._flat.get(layer)
        if w is None:  # a view of the weight, not a copy: training's in-place updates show (routers keep fp32 weights)
            proj = getattr(router, "proj", None)
            w = self._flat[layer] = proj.weight.detach().float().view(-1) if proj is not None else False
        if w is False:  # a stand-in for a router (a test's, a recorder) that scores in its own way
            return router.score_one(x)
        c = router.calibration
        return sigmoid(c.scale * torch.dot(x.view(-1).float(), w).item() + c.shift)

    @property
    def target(self) -> str | None:
        return self.routers.config.target if self.routers is not None else None

    @property
    def level(self) -> str | None:
        return self.routers.config.level if self.routers is not None else None


@dataclass(frozen=True)
class Gate:
    """Which tokens of this forward run a sub-layer: all, none, some (by index), or soft (multiply)."""

    kind: str  # "all" | "none" | "some" | "soft"
    index: torch.Tensor | None = None  # (n,) positions within the forward that run, kind == "some"
    mult: torch.Tensor | None = None  # (T,) 0/1 gate (with STE gradient when training), kind == "soft"
    rest: torch.Tensor | None = None  # (T - n,) positions that skip, kind == "some"


ALL, NONE = Gate("all"), Gate("none")


Scores = dict  # layer -> (T,) tensor, or a Python float for a one-token forward; see `score_table`


def decide(router, x: torch.Tensor, layer: int, plan: Plan, scores: Scores) -> Gate:
    """Score the tokens of `x` (1, T, D) and turn the scores into a Gate under `plan`."""
    t = x.shape[1]
    if plan.level == "sequence":
        if layer not in plan.sequence:  # prefill: decide once from the mean-pooled prompt
            s = torch.sigmoid(router.logits(x.mean(dim=1)))[0]  # ()
            plan.sequence[layer] = (s, bool(s >= plan.threshold))
        s, run = plan.sequence[layer]
        scores[layer] = s.detach().expand(t)
        if plan.ste:
            return Gate("soft", mult=(float(run) + s - s.detach()).expand(t))
        if plan.policy == "mask":
            return Gate("soft", mult=torch.full((t,), float(run), device=x.device))
        return ALL if run else NONE
    if t == 1 and not plan.ste and plan.policy != "mask":
        # Decode: real skipping needs the decision on the host anyway, so take the score there
        # (one dot product, one read) and compare it in Python: no tensor op per layer beyond that.
        score = plan.score_one(layer, x)
        scores[layer] = score
        return ALL if score >= plan.threshold else NONE
    s = router(x)[0]  # (T,)
    scores[layer] = s.detach()
    hard = s >= plan.threshold
    if plan.ste:
        return Gate("soft", mult=hard.to(s.dtype) + s - s.detach())
    if plan.policy == "mask":
        return Gate("soft", mult=hard.to(x.dtype))
    n = int(hard.sum())  # real skipping: which tokens run is decided on the host
    if n == t or n == 0:
        return ALL if n == t else NONE
    return Gate("some", index=hard.nonzero().squeeze(1), rest=(~hard).nonzero().squeeze(1))


def score_table(scores: Scores, t: int, n_layers: int, device) -> torch.Tensor:
    """The (T, L) table of a forward's router scores, NaN where a layer is not routed, on `device`."""
    if t == 1 and all(isinstance(v, float) for v in scores.values()):  # a decode step: one small tensor
        return torch.tensor([[scores.get(i, math.nan) for i in range(n_layers)]], device=device)
    # Tensor scores (a prefill, `mask`) are filled in where they were computed and moved once: filling a host table
    # from a GPU's scores would wait for the GPU at every layer.
    where = next((s.device for s in scores.values() if isinstance(s, torch.Tensor)), device)
    table = torch.full((t, n_layers), math.nan, device=where)
    for layer, s in scores.items():
        table[:, layer] = s
    return table.to(device)
