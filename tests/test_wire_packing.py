"""wire.pack_routers packs a router set once per state: the same set sent again reuses its packing, and any change to
what the engine would load (weights changed in place, tensors replaced, a new calibration) packs it again."""

from __future__ import annotations

import torch

from routerlab.core.base.config import RoutingConfig
from routerlab.core.routing.router import Calibration, RouterSet
from routerlab.core.serve import wire


def _set(seed: int = 0, standin_rank: int = 0) -> RouterSet:
    torch.manual_seed(seed)
    rs = RouterSet(RoutingConfig("attention", "token", (1, 2, 3)), 4, 16, standin_rank=standin_rank)
    with torch.no_grad():
        for p in rs.parameters():
            p.normal_()
    return rs


def _loaded(packed) -> dict:
    return wire.unpack_routers(packed[1]).state_dict()


def test_the_same_set_sent_again_reuses_its_packing():
    rs = _set()
    first = wire.pack_routers(rs)
    assert wire.pack_routers(rs) is first
    assert wire.pack_routers(_set()) == first  # another object with the same content: the same key and bytes


def test_weights_changed_in_place_are_packed_again():
    rs = _set()
    first = wire.pack_routers(rs)
    with torch.no_grad():
        rs.get(2).proj.weight.add_(1.0)  # what an optimizer's step does
    second = wire.pack_routers(rs)
    assert second[0] != first[0]
    torch.testing.assert_close(_loaded(second)["routers.2.proj.weight"], rs.get(2).proj.weight.detach())


def test_replaced_tensors_and_a_new_calibration_are_packed_again():
    rs = _set(standin_rank=2)
    first = wire.pack_routers(rs)
    rs.load_state_dict(_set(seed=1, standin_rank=2).state_dict(), assign=True)  # new tensors, fresh version counters
    second = wire.pack_routers(rs)
    assert second[0] != first[0]
    for name, value in rs.state_dict().items():
        torch.testing.assert_close(_loaded(second)[name], value)
    rs.calibration = Calibration(scale=2.0, shift=-1.0)
    third = wire.pack_routers(rs)
    assert third[0] != second[0]
    assert wire.unpack_routers(third[1]).calibration == Calibration(scale=2.0, shift=-1.0)
