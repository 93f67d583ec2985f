"""Device-correctness on a machine without a GPU: the prepared GPU check runs here on the CPU (so it never rots), and
every decode path runs with torch's default device set to `meta`, so that a tensor made without naming its device (on
a GPU: a CPU tensor mixed into the model's work) fails the test instead of a visitor's run."""

from __future__ import annotations

import math

import pytest
import torch

from routerlab.bench.gpu import gpu_check
from routerlab.bench.speed import kernel_floor, measure_speed
from routerlab.core.base.config import RoutingConfig
from routerlab.core.base.device import SyncCounter, choose_device, now
from routerlab.core.base.errors import RouterLabError
from routerlab.core.decode.costs import cost_breakdown
from routerlab.core.decode.engine import Control
from routerlab.core.kernels import batch_paths
from routerlab.core.model.models import load_model, tiny_model
from routerlab.core.routing.router import RouterSet
from routerlab.core.serve.room import Room, measured_thread_choice


@pytest.fixture(scope="module")
def engine():
    return gpu_check.build_engine("tiny", "cpu", dtype="float32")


@pytest.fixture(scope="module")
def routers(engine):
    return gpu_check.random_routers(engine)


def test_the_gpu_check_runs_on_the_cpu_and_its_figures_are_sane():
    result = gpu_check.run_check("cpu", "tiny", prompt_tokens=24, new_tokens=10, rounds=1, train_steps=2, log=lambda _: None)
    assert gpu_check.sane(result) == []
    gen = result["generate"]
    assert any(gen[f"routed_{p}"]["skip_rate_prompt"] > 0 for p in gpu_check.POLICIES)  # routing really skipped
    assert gen["routed_kv"]["token_ids"] == gen["routed_mask"]["token_ids"]  # kv computes what mask does
    room = result["room"]
    assert room["all_rows_match_alone"] and len(room["rows"]) == 7
    assert any(r["skip_rate"] > 0 for r in room["rows"])
    assert [r["skip_rate"] for r in room["rows"]] == [r["skip_rate_alone"] for r in room["rows"]]
    assert result["train"]["base_unchanged"] and result["train"]["routers_moved"]
    assert result["speed"]["skip_rate"]["deep_off_kv"] == 0.5 and result["speed"]["skip_rate"]["never_skip"] == 0.0
    assert result["decode_syncs"]["routed_kv"]["per_token"] == 0.0  # a CPU has nothing to wait for
    assert result["peak_memory_bytes"] is None


def test_the_check_reports_a_part_that_fails_and_still_runs_the_rest(monkeypatch):
    def broken(*_a, **_k):
        raise RuntimeError("planted")

    monkeypatch.setattr(gpu_check, "check_room", broken)
    result = gpu_check.run_check("cpu", "tiny", prompt_tokens=16, new_tokens=6, rounds=1, train_steps=1, log=lambda _: None)
    assert result["room"]["error"] == "RuntimeError: planted"
    assert "train" in result and "error" not in result["train"]
    assert gpu_check.sane(result) == ["room failed: RuntimeError: planted"]


def _with_meta_default(fn):
    """Run fn with torch's default device set to `meta`: any tensor the code makes without naming a device is a meta
    tensor, and mixing it with the model's (CPU) tensors or reading it on the host raises."""
    torch.set_default_device("meta")
    try:
        return fn()
    finally:
        torch.set_default_device(None)


def _config(n, **kw):
    return gpu_check._config(n, **kw)


@pytest.mark.parametrize("policy", ["kv", "drop", "mask"])
def test_generation_names_the_device_of_every_tensor_it_makes(engine, routers, policy):
    ids = gpu_check.prompt_ids(engine, 20)
    config = _config(8, kv_policy=policy, quality=True, quality_chunk=4, temperature=0.7, seed=3)
    steps = _with_meta_default(lambda: list(engine.generate_ids(ids, routers, config, Control(0.5))))
    assert len([s for s in steps if not s.is_prompt]) == 8


def test_a_room_of_diverging_rows_names_the_device_of_every_tensor_it_makes(engine, routers):
    ids = gpu_check.prompt_ids(engine, 12)

    def run():
        room = engine.room = Room(engine, max_batch=4)
        room.prefill_budget_s = math.inf
        try:
            readers = [engine.generate_ids(ids[:k], routers, _config(6, threshold=t, kv_policy=p), Control(t))
                       for k, t, p in ((5, 0.5, "kv"), (9, 0.3, "drop"), (7, 0.6, "kv"), (4, 0.5, "mask"))]
            while any(room.busy.values()):
                room.step()
            return [list(r) for r in readers]
        finally:
            engine.room = None

    assert all(len([s for s in steps if not s.is_prompt]) == 6 for steps in _with_meta_default(run))


def test_the_measurements_name_the_device_of_every_tensor_they_make(engine, routers):
    ids = gpu_check.prompt_ids(engine, 16)
    _with_meta_default(lambda: measure_speed(engine, [ids], {"r": (routers, 0.5, "kv")}, 4, 1, log=lambda *_: None))
    assert _with_meta_default(lambda: cost_breakdown(engine, ids, 20, repeat=2))["step"] > 0
    assert _with_meta_default(lambda: kernel_floor(engine, 20, repeat=2))["total"] > 0
    assert "wide_from" in _with_meta_default(lambda: batch_paths.tune(engine.anatomy, sizes=(2,), rounds=1))
    assert _with_meta_default(lambda: measured_thread_choice(engine, rounds=1))["this_thread_s"] > 0


def test_fresh_routers_live_on_the_models_device():
    model = tiny_model("llama").to("meta")
    rs = RouterSet.zeros(model, RoutingConfig.from_granularity("attention-token", (1, 2)))
    assert {p.device.type for p in rs.parameters()} == {"meta"}
    assert {p.dtype for p in rs.parameters()} == {torch.float32}


def test_choosing_a_device(monkeypatch):
    monkeypatch.delenv("ROUTERLAB_DEVICE", raising=False)
    assert choose_device("cpu") == "cpu"
    assert choose_device(None) == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv("ROUTERLAB_DEVICE", "cpu")
    assert choose_device(None) == "cpu"
    with pytest.raises(RouterLabError, match="Unknown device 'tpu'"):
        choose_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(RouterLabError, match="torch sees no CUDA GPU") as err:
            choose_device("cuda")
        assert "--device cpu" in err.value.fix


def test_low_bit_weights_on_a_gpu_are_refused_with_the_way_out(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for fmt in ("int4", "int8"):
        with pytest.raises(RouterLabError, match=f"--quantize {fmt} runs on a CPU only"):
            load_model("/nonexistent-model", device="cuda", quantize=fmt)


def test_the_sync_counter_and_clock_on_a_cpu():
    with SyncCounter("cpu") as syncs:
        float(torch.ones(3).sum())
    assert syncs.count == 0 and not syncs.cuda
    assert now("cpu") > 0


def test_the_committed_h200_result_is_sane_and_the_docs_quote_it():
    """assets/bench/gpu-check-h200.json (make gpu-check on an H200): real skipping, every part ran, and the figures
    the README and docs/method.md quote are the file's."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    result = json.loads((root / "assets" / "bench" / "gpu-check-h200.json").read_text())
    assert result["device"].startswith("cuda") and "H200" in result["device_name"]
    assert result["problems"] == [] and gpu_check.sane(result) == []
    assert result["generate"]["routed_kv"]["skip_rate"] > 0 and result["room"]["all_rows_match_alone"]
    assert result["decode_syncs"]["routed_kv"]["per_token"] > result["decode_syncs"]["full"]["per_token"]
    speed = result["speed"]["speedup"]
    readme, method = (root / "README.md").read_text(), (root / "docs" / "method.md").read_text()
    for name in ("never_skip", "deep_off_kv", "deep_off_drop"):
        assert f"{speed[name]:.2f}x" in readme and f"{speed[name]:.2f}x" in method
    assert f"{result['decode_syncs']['routed_kv']['per_token']:.1f}" in method


def test_a_failing_start_up_measurement_leaves_the_room_serving(engine, monkeypatch):
    """The in-process room (the fallback when an engine process cannot start): a product or thread probe that raises
    (as both did on CUDA) is said in the log, and the loop still serves from the main thread."""
    import threading

    from routerlab.core.serve import room as room_module

    def broken(*_a, **_k):
        raise RuntimeError("planted probe failure")

    monkeypatch.setattr(room_module.batch_paths, "tune", broken)
    monkeypatch.setattr(room_module, "where_to_run", broken)
    room = Room(engine, max_batch=2)
    lines: list[str] = []
    engine.room = room
    try:
        reader = engine.generate_ids(gpu_check.prompt_ids(engine, 6), None, _config(3), Control(0.5))

        def read_then_close():  # the reader waits for the loop's steps; then it ends the loop
            if len([s for s in reader if not s.is_prompt]) == 3:
                lines.append("served")
            room.close()

        reading = threading.Thread(target=read_then_close)
        reading.start()
        room_module.run_where_fastest(room, engine, log=lines.append)  # returns once the room is closed
        reading.join(timeout=60)
    finally:
        engine.room = None
    assert any("could not measure the decode batch's products" in line for line in lines)
    assert any("could not measure where torch runs fastest" in line for line in lines)
    assert "served" in lines


def test_the_gpu_check_takes_kv_and_mask_apart_only_at_a_near_tie():
    """On a GPU kv and mask may round differently (their products have other shapes): decoding different tokens is
    sane where mask's own logits put the two tokens within a rounding (gpu_check.NEAR_TIE), not farther."""
    result = gpu_check.run_check("cpu", "tiny", prompt_tokens=16, new_tokens=6, rounds=1, train_steps=1, log=lambda _: None)
    gen = result["generate"]
    assert gen["kv_vs_mask"] is None  # on the CPU: the same tokens
    gen["routed_mask"]["token_ids"] = gen["routed_kv"]["token_ids"][:3] + [t + 1 for t in gen["routed_kv"]["token_ids"][3:]]
    gen["kv_vs_mask"] = {"at": 3, "gap": 0.125, "spread": 20.0}
    assert gpu_check.sane(result) == []
    gen["kv_vs_mask"]["gap"] = -2.0
    assert gpu_check.sane(result) == ["kv and mask decoded different tokens from token 3, where mask's logits put the two "
                                      f"-2.000 apart: more than a rounding ({gpu_check.NEAR_TIE})"]
    gen["kv_vs_mask"] = None
    assert gpu_check.sane(result) == ["kv and mask decoded different tokens (they compute the same numbers)"]


def test_the_gpu_checks_departure_is_measured_on_mask_logits():
    from routerlab.core.decode.engine import Engine
    from routerlab.core.model.models import tiny_model

    engine = Engine(tiny_model("llama"))
    routers = gpu_check.random_routers(engine)
    ids = gpu_check.prompt_ids(engine, 12)
    assert gpu_check.first_departure(engine, ids, routers, [5, 6, 7], [5, 6, 7]) is None
    dep = gpu_check.first_departure(engine, ids, routers, [5, 6, 7], [5, 9, 7])
    assert dep["at"] == 1 and dep["spread"] > 0 and isinstance(dep["gap"], float)
