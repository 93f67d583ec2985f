"""The probe start: routers fitted, before training, to how little their sub-layer changes each token."""

from __future__ import annotations

import pytest
import torch

from routerlab.core.base.config import RoutingConfig
from routerlab.core.base.errors import RouterLabError
from routerlab.core.model.models import tiny_model
from routerlab.core.model.anatomy import Anatomy
from routerlab.core.routing.router import RouterSet
from routerlab.tuning.data import Example
from routerlab.tuning.head_start.router_init import probe_init
from routerlab.tuning.head_start.standin_fit import record_updates
from routerlab.tuning.train import TrainConfig, train_routers


def _examples(n=12, length=40, start=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [Example(tuple(torch.randint(0, 128, (length,), generator=g).tolist()), start) for _ in range(n)]


@pytest.mark.parametrize("granularity", ["attention-token", "mlp-token"])
def test_probe_init_scores_small_updates_low_and_skips_about_the_asked_share(granularity):
    model = tiny_model("llama")
    an = Anatomy(model)
    routers = RouterSet.zeros(model, RoutingConfig.from_granularity(granularity, (1, 2)))
    examples = _examples()
    report = probe_init(an, routers, examples, skip=0.2)
    data = record_updates(an, examples, routers.config.target, [1, 2])
    for i in (1, 2):
        x, y = data[i]
        size = (y.norm(dim=1) / x.norm(dim=1)).log()
        logits = routers.get(i).raw_logits(x[None])[0]  # (N,) the router's own logits on the fitted tokens
        corr = float(torch.corrcoef(torch.stack([logits, size]))[0, 1])
        assert corr > 0.3, "larger updates must score higher (a random direction would be near 0)"
        assert 0.05 < float((logits < 0).float().mean()) < 0.35, "roughly the asked share (a fit, not a quantile) sits below the gate (score 0.5)"
        assert abs(report["layers"][str(i)]["corr"] - corr) < 0.35  # the report's fit quality is of the standardised size
    assert report["tokens"] == sum(e.n_response for e in examples)


def test_training_starts_from_the_probe_when_asked_and_the_base_stays_frozen():
    model = tiny_model("llama")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = dict(granularity="attention-token", layers=(1, 2), steps=1, batch_size=2, lr=1e-12)  # one step that moves nothing
    zeros = train_routers(model, _examples(4), TrainConfig(**cfg), progress=False).routers
    probe = train_routers(model, _examples(4), TrainConfig(**cfg, init="probe"), progress=False).routers
    assert all(float(r.proj.weight.abs().max()) < 1e-9 for r in zeros.routers.values())
    assert all(float(r.proj.weight.abs().max()) > 1e-3 for r in probe.routers.values())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(RouterLabError, match="init"):
        TrainConfig(init="ones")
