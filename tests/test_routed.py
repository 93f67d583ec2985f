import pytest
import torch

from routerlab.core.base.config import RoutingConfig
from routerlab.core.base.errors import RouterLabError
from routerlab.core.model.models import TINY_FAMILIES, tiny_model
from routerlab.core.model.anatomy import RoutedAttention, RoutedBlock, RoutedMLP, attach_routers, detach_routers
from routerlab.core.routing.router import RouterSet


@pytest.mark.parametrize("granularity, wrapper", [("attention-token", RoutedAttention), ("mlp-token", RoutedMLP), ("block-token", RoutedBlock)])
def test_attach_is_visible_and_detach_restores_the_exact_modules(granularity, wrapper):
    model = tiny_model("llama")
    before = list(model.modules())
    routers = RouterSet.zeros(model, RoutingConfig.from_granularity(granularity, [1, 2]))
    attach_routers(model, routers)
    assert sum(isinstance(m, wrapper) for m in model.modules()) == 2
    assert "router" in repr(model)
    detach_routers(model)
    after = list(model.modules())
    assert len(after) == len(before) and all(a is b for a, b in zip(after, before))


@pytest.mark.parametrize("family", TINY_FAMILIES)
@pytest.mark.parametrize("granularity", ["attention-token", "mlp-token", "block-token"])
def test_fresh_routers_leave_the_plain_forward_unchanged(family, granularity):
    model = tiny_model(family)
    ids = torch.randint(0, 128, (1, 9))
    with torch.no_grad():
        ref = model(ids).logits
        attach_routers(model, RouterSet.zeros(model, RoutingConfig.from_granularity(granularity, [1, 2])))
        torch.testing.assert_close(model(ids).logits, ref)


def test_wrapped_forward_masks_when_the_router_says_skip():
    model = tiny_model("llama")
    ids = torch.randint(0, 128, (1, 9))
    with torch.no_grad():
        ref = model(ids).logits
        attach_routers(model, RouterSet.zeros(model, RoutingConfig.from_granularity("attention-token", [1, 2])), threshold=0.9)
        assert (model(ids).logits - ref).abs().max() > 1e-4


def test_routed_layers_must_exist():
    with pytest.raises(RouterLabError, match="do not exist"):
        RouterSet.zeros(tiny_model("llama"), RoutingConfig.from_granularity("attention-token", [7]))
