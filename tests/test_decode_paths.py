"""core/decode/decode_paths.py: which path decodes is measured at start-up, can be forced, and a model the step graph cannot
take keeps torch's ops with the reason; routerlab/spin.py keeps a user's OpenMP setting and gives a peer libgomp's own.
The step seam (core/decode/runtime.py): which plans a graph takes, looked up once a request (a row)."""

import os

import pytest

from routerlab import spin
from routerlab.core.decode import decode_paths
from routerlab.core.decode.engine import Engine
from routerlab.core.model.models import tiny_model
from routerlab.core.routing.gates import Plan

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def engine(embedded):
    return Engine.from_loaded(embedded, choose_kernels=False)


@pytest.mark.parametrize("mode, decode, why", [("torch", "torch", "ROUTERLAB_DECODE=torch"), ("graph", "graph", "ROUTERLAB_DECODE=graph"),
                                               ("fast", "torch", "ROUTERLAB_DECODE=fast is not auto, torch or graph")])
def test_a_forced_choice_is_taken_without_measuring_and_a_wrong_one_named(engine, monkeypatch, mode, decode, why):
    monkeypatch.setenv(decode_paths.ENV, mode)
    result = decode_paths.choose(engine)
    assert (result["decode"], result["why"], result["step_ms"]) == (decode, why, {}) and engine.decode == decode
    assert decode_paths.describe(result).startswith("decode steps: ")


def test_auto_measures_both_paths_and_takes_the_graph_only_where_it_is_faster(engine, monkeypatch):
    monkeypatch.setenv(decode_paths.ENV, "auto")
    result = decode_paths.choose(engine)
    t, g = result["step_ms"]["torch"], result["step_ms"]["graph"]
    assert t > 0 and g > 0
    assert result["decode"] == ("graph" if g <= decode_paths.MARGIN * t else "torch") == engine.decode
    assert f"{t:.2f} ms through torch's ops, {g:.2f} ms through the graph" in result["why"]


def test_a_busy_moment_during_the_measurement_does_not_lock_in_the_slower_path():
    """Steps of 25 ms through torch's ops and 10 ms through the graph, measured while another process took the cores
    for 30 of the 48 graph steps in a row (4x as long): the graph is still measured at 10 ms, and chosen."""
    steps = decode_paths.ROUNDS * decode_paths.STEPS
    busy = {"torch": [0.025] * steps, "graph": [0.040 if 10 <= k < 40 else 0.010 for k in range(steps)]}
    assert decode_paths.decide(busy) == {"torch": 25.0, "graph": 10.0}
    assert sorted(busy["graph"])[steps // 2] > 0.025  # the median would have taken torch's ops


def test_the_command_lines_decode_forced_and_a_graph_it_cannot_take_said_so(engine):
    assert decode_paths.forced(engine, "torch") == {"decode": "torch", "why": "--decode torch", "step_ms": {}} and engine.decode == "torch"
    assert decode_paths.forced(engine, "graph")["decode"] == "graph" == engine.decode
    tiny = Engine(tiny_model("llama"))
    result = decode_paths.forced(tiny, "graph")
    assert result["decode"] == "torch" == tiny.decode and "no file codes" in result["why"]


def test_a_model_without_file_codes_keeps_torchs_ops_and_says_why(monkeypatch):
    monkeypatch.setenv(decode_paths.ENV, "auto")
    engine = Engine(tiny_model("llama"))
    result = decode_paths.choose(engine)
    assert result["decode"] == "torch" and "no file codes" in result["why"]
    assert engine.runtime.graph_for(Plan(None)) is None


def test_the_seam_takes_the_plans_the_graph_covers_once_a_request(engine, routers):
    from types import SimpleNamespace

    runtime = engine.runtime
    engine.decode = "graph"
    try:
        full, kv = Plan(None), Plan(routers, 0.5, "kv")
        assert runtime.graph_for(full) is runtime.graph(None) and runtime.graph_for(kv) is runtime.graph(routers)
        drop = runtime.graph_for(Plan(routers, 0.5, "drop"))
        assert drop is runtime.graph(routers, "drop") and drop is not runtime.graph(routers) and drop.dropped == drop.routed
        assert runtime.graph_for(Plan(routers, 0.5, "kv", ste=True)) is None  # training's gates
        assert "training's straight-through gates" in runtime.why_not(Plan(routers, 0.5, "kv", ste=True))
        row = SimpleNamespace(plan=kv, trace=SimpleNamespace(meta={}))
        graph = runtime.runtime_of(row)
        assert graph is runtime.graph(routers) and row.runtime == ("graph", graph)
        assert row.trace.meta["decode"].startswith("the step graph")
        row.plan = Plan(None)  # kept for the request: not looked up again while the choice stands
        assert runtime.runtime_of(row) is graph
        engine.decode = "torch"
        assert runtime.runtime_of(row) is None  # the engine's choice changed: asked again
        engine.decode = "graph"
        assert runtime.runtime_of(row) is runtime.graph(None)
        stand = SimpleNamespace(plan=Plan(routers, 0.5, "kv", ste=True), trace=SimpleNamespace(meta={}))
        assert runtime.runtime_of(stand) is None and "straight-through" in stand.trace.meta["decode"]
    finally:
        engine.decode = "torch"


def test_a_router_set_changed_in_place_gets_a_graph_of_its_own(engine, routers):
    import torch

    before = engine.runtime.graph(routers)
    assert engine.runtime.graph(routers) is before
    weight = next(iter(routers.parameters()))
    with torch.no_grad():
        weight.add_(0.0)  # an in-place update: a new version, as an optimizer's step makes
    assert engine.runtime.graph(routers) is not before


@pytest.fixture(scope="module")
def routers(embedded):
    from routerlab.tuning.checkpoint import resolve_routers

    return resolve_routers(None, "attention-token", embedded.model)[0]


def test_spin_keeps_a_users_setting_and_gives_a_peer_libgomps_own(monkeypatch):
    monkeypatch.delenv(spin.ENV, raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(spin, "ours", False)
    spin.set_default()
    assert os.environ[spin.ENV] == spin.TURNS and spin.ours
    with spin.as_libgomp_default():
        assert os.environ[spin.ENV] == spin.DEFAULT
    assert os.environ[spin.ENV] == spin.TURNS
    monkeypatch.setenv(spin.ENV, "1234")
    monkeypatch.setattr(spin, "ours", False)
    spin.set_default()
    with spin.as_libgomp_default():
        assert os.environ[spin.ENV] == "1234"  # the user's, everywhere
    monkeypatch.delenv(spin.ENV)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    spin.set_default()
    assert spin.ENV not in os.environ
