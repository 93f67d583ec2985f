import math

import pytest

from routerlab.core.base.config import GenerateConfig, RoutingConfig, check_threshold, default_layers
from routerlab.core.base.errors import RouterLabError


@pytest.mark.parametrize("bad", [-0.1, 1.5, math.nan, "abc", None])
def test_bad_thresholds_are_refused_with_the_fix(bad):
    with pytest.raises(RouterLabError, match="between 0 and 1"):
        check_threshold(bad)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(kv_policy="fast"), "Unknown KV policy 'fast'"),
        (dict(max_new_tokens=0), "max_new_tokens=0"),
        (dict(temperature=math.nan), "Temperature"),
        (dict(top_p=0), "top_p"),
    ],
)
def test_generate_config_validates(kwargs, message):
    with pytest.raises(RouterLabError, match=message):
        GenerateConfig(**kwargs)


def test_granularity_round_trip_and_unknown_names():
    cfg = RoutingConfig.from_granularity("mlp-sequence", [3, 1, 3])
    assert (cfg.target, cfg.level, cfg.layers, cfg.granularity) == ("mlp", "sequence", (1, 3), "mlp-sequence")
    with pytest.raises(RouterLabError, match="Unknown granularity 'attn'"):
        RoutingConfig.from_granularity("attn")


def test_default_layers_skip_first_and_last():
    assert default_layers(30) == tuple(range(1, 29))
