"""Threshold calibration: a monotone map of a router set's scores that moves thresholds, never decisions."""

import json
import math
from types import SimpleNamespace

import pytest
import torch

from routerlab.core.base.config import GenerateConfig, RoutingConfig
from routerlab.core.base.errors import RouterLabError
from routerlab.core.decode.engine import Control, Engine
from routerlab.core.model.models import tiny_model
from routerlab.core.routing.gates import Plan
from routerlab.core.routing.router import IDENTITY, Calibration, RouterSet, logit, sigmoid
from routerlab.tuning.calibrate import HIGH, fit_calibration, quantile, raw_default_of, skip_fraction
from routerlab.tuning.checkpoint import CONFIG, load_routers, read_config, resolve_routers, save_routers, write_calibration
from routerlab.tuning.forward import student_forward

ROUTED = [1, 2]
CAL = Calibration(scale=7.0, shift=-0.3)


def random_routers(model, granularity, calibration=IDENTITY, seed=3):
    rs = RouterSet.zeros(model, RoutingConfig.from_granularity(granularity, ROUTED))
    g = torch.Generator().manual_seed(seed)
    for r in rs.routers.values():
        r.proj.weight.data = torch.randn(r.proj.weight.shape, generator=g) * 0.3
    rs.calibration = calibration
    return rs


def generate(engine, routers, threshold, ids=tuple(range(3, 15)), new=10):
    control = Control(threshold)
    config = GenerateConfig(max_new_tokens=new, threshold=threshold, kv_policy="kv", ignore_eos=True)
    list(engine.generate_ids(list(ids), routers, config, control))
    return control.trace


def test_the_map_and_its_inverse_agree():
    for raw in (0.2, 0.3, 0.4857, 0.5, 0.52, 0.8):
        assert math.isclose(CAL.raw_threshold(CAL.score(raw)), raw, rel_tol=1e-9)
    assert CAL.raw_threshold(0.0) == 0.0 and CAL.raw_threshold(1.0) == 1.0  # 0 runs everything, 1 (almost) nothing
    assert IDENTITY.identity and IDENTITY.raw_threshold(0.37) == pytest.approx(0.37) and not CAL.identity
    assert math.isclose(sigmoid(logit(0.123)), 0.123)


@pytest.mark.parametrize("granularity", ["attention-token", "mlp-token", "block-token", "attention-sequence", "block-sequence"])
def test_decisions_at_a_calibrated_threshold_equal_raw_decisions_at_the_mapped_threshold(granularity):
    model = tiny_model("llama")
    engine = Engine(model)
    raw, calibrated = random_routers(model, granularity), random_routers(model, granularity, CAL)
    ids = list(range(3, 15)) if granularity.endswith("token") else list(range(3, 5))
    differs = 0
    for t in (0.2, 0.35, 0.5, 0.65, 0.8):
        a, b = generate(engine, calibrated, t, ids), generate(engine, raw, CAL.raw_threshold(t), ids)
        assert [s.token_id for s in a.steps] == [s.token_id for s in b.steps], t
        assert a.executed_matrix() == b.executed_matrix(), t  # prefill (tensor path) and decode (score_one)
        for sa, sb in zip(a.steps, b.steps):  # the recorded scores are the calibrated ones
            got = [x for x in sa.scores if x is not None]
            want = [CAL.score(x) for x in sb.scores if x is not None]
            assert got == pytest.approx(want, abs=1e-5)
        differs += a.executed_matrix() != generate(engine, raw, t, ids).executed_matrix()
    assert differs, "the calibration should move where a threshold falls"


def test_identity_calibration_changes_nothing():
    model = tiny_model("llama")
    engine = Engine(model)
    a = generate(engine, random_routers(model, "attention-token"), 0.5)
    b = generate(engine, random_routers(model, "attention-token", Calibration(1.0, 0.0)), 0.5)
    assert [s.token_id for s in a.steps] == [s.token_id for s in b.steps]
    assert [s.scores for s in a.steps] == [s.scores for s in b.steps]


def test_training_routers_start_uncalibrated_and_the_calibration_is_not_a_parameter():
    model = tiny_model("llama")
    rs = random_routers(model, "attention-token", CAL)
    assert RouterSet.zeros(model, rs.config).calibration is IDENTITY
    assert sorted(rs.state_dict()) == ["routers.1.proj.weight", "routers.2.proj.weight"]
    assert all(r.calibration is CAL for r in rs.routers.values())
    x = torch.randn(1, 5, model.config.hidden_size)
    r = rs.get(1)
    torch.testing.assert_close(r.logits(x), CAL.scale * r.raw_logits(x) + CAL.shift)
    with torch.no_grad():
        assert r.score_one(x[:, :1]) == pytest.approx(float(r(x[:, :1])[0, 0]), abs=1e-6)


def test_save_load_round_trip_keeps_the_calibration(tmp_path):
    model = tiny_model("llama")
    rs = random_routers(model, "attention-token", CAL)
    folder = save_routers(rs, tmp_path / "ckpt", model, threshold=0.5, calibration_info={"fitted_on": "x"})
    loaded, config = load_routers(folder, model)
    assert loaded.calibration == CAL and loaded.get(2).calibration == CAL
    assert config["calibration"] == {"fitted_on": "x", "scale": 7.0, "shift": -0.3}
    x = torch.randn(1, 4, model.config.hidden_size)
    torch.testing.assert_close(loaded.get(1)(x), rs.get(1)(x))
    plain = save_routers(random_routers(model, "attention-token"), tmp_path / "plain", model)
    assert "calibration" not in read_config(plain)  # the identity is not written


def test_a_checkpoint_without_calibration_loads_as_identity(tmp_path):
    model = tiny_model("llama")
    folder = save_routers(random_routers(model, "attention-token"), tmp_path / "old", model, threshold=0.48)
    config = json.loads((folder / CONFIG).read_text())
    assert "calibration" not in config
    routers, defaults = resolve_routers(str(folder), "attention-token", model)
    assert routers.calibration is IDENTITY and defaults["threshold"] == 0.48


@pytest.mark.parametrize("block, message", [
    ({"scale": 0.0, "shift": 0.0}, "scale must be > 0"),
    ({"scale": -2.0, "shift": 0.1}, "scale must be > 0"),
    ({"scale": float("nan"), "shift": 0.0}, "scale must be a finite number"),
    ({"scale": 1.0, "shift": float("inf")}, "shift must be a finite number"),
    ({"scale": "2", "shift": 0.0}, "scale must be a finite number"),
    ({"scale": True, "shift": 0.0}, "scale must be a finite number"),
    ({"shift": 0.0}, "not an object with a scale and a shift"),
    ([1, 2], "not an object with a scale and a shift"),
])
def test_a_bad_calibration_is_refused_with_a_clear_message(tmp_path, block, message):
    model = tiny_model("llama")
    folder = save_routers(random_routers(model, "attention-token"), tmp_path / "bad", model)
    config = json.loads((folder / CONFIG).read_text())
    config["calibration"] = block
    (folder / CONFIG).write_text(json.dumps(config))
    with pytest.raises(RouterLabError, match=message) as err:
        load_routers(folder, model)
    assert str(folder / CONFIG) in str(err.value) and "calibrate" in str(err.value)
    with pytest.raises(RouterLabError, match=message):
        write_calibration(folder, block, 0.5)


def test_write_calibration_sets_the_default_to_one_half_and_keeps_the_raw_default(tmp_path):
    model = tiny_model("llama")
    folder = save_routers(random_routers(model, "attention-token"), tmp_path / "c", model, threshold=0.4857)
    raw = raw_default_of(read_config(folder))
    assert raw == pytest.approx(0.4857)
    write_calibration(folder, {"scale": 6.5, "shift": 6.5 * -logit(raw), "raw_default": raw}, 0.5)
    config = read_config(folder)
    assert config["threshold"] == 0.5 and raw_default_of(config) == raw
    routers, defaults = resolve_routers(str(folder), "attention-token", model)
    assert defaults["threshold"] == 0.5 and routers.calibration.raw_threshold(0.5) == pytest.approx(0.4857)
    del config["calibration"]["raw_default"]  # without the record, the stored default maps back through the map
    assert raw_default_of(config) == pytest.approx(0.4857)


def scores_around(center=0.49, spread=0.01, n=20000, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.sigmoid(logit(center) + torch.randn(n, generator=g) * spread * 4).sort().values


def test_the_fit_puts_the_default_at_one_half_and_the_multiple_at_0_7():
    scores = scores_around()
    default = quantile(scores, 0.06)
    fit = fit_calibration(scores, default, multiple=4.0)
    c = fit.calibration
    assert c.scale > 0 and not fit.floor_applied
    assert c.score(default) == pytest.approx(0.5)
    assert c.score(fit.raw_high) == pytest.approx(HIGH)
    assert fit.high_rate == pytest.approx(4 * fit.default_rate, rel=0.02)
    calibrated = torch.tensor([c.score(float(s)) for s in scores[::50]])
    assert torch.all(calibrated[1:] >= calibrated[:-1])  # monotone: no ordering changes
    rates = [skip_fraction(scores, c.raw_threshold(t)) for t in (0.1, 0.3, 0.5, 0.7, 0.9)]
    assert rates == sorted(rates) and rates[1] < 0.02 and rates[3] >= 3 * rates[2]


def test_a_never_skipping_default_is_anchored_at_the_floor():
    scores = scores_around()
    fit = fit_calibration(scores, 0.0, multiple=4.0, floor=0.01)
    assert fit.floor_applied and fit.default_rate == 0.0
    assert fit.anchor_rate == pytest.approx(0.01, abs=1e-3) and fit.high_rate == pytest.approx(0.04, abs=1e-3)
    assert fit.calibration.score(fit.raw_anchor) == pytest.approx(0.5)


def test_scores_that_cannot_be_spread_are_refused():
    with pytest.raises(RouterLabError, match="too concentrated"):
        fit_calibration(torch.full((100,), 0.5), 0.5)
    with pytest.raises(RouterLabError, match="multiple"):
        fit_calibration(scores_around(), 0.49, multiple=1.0)


def test_evaluation_sees_calibrated_scores():
    model = tiny_model("llama")
    from routerlab.core.model.anatomy import Anatomy

    an = Anatomy(model)
    ids = torch.arange(3, 20)[None]
    raw, calibrated = random_routers(model, "attention-token"), random_routers(model, "attention-token", CAL)
    _, s_raw = student_forward(an, ids, 6, Plan(raw, CAL.raw_threshold(0.6)), logits=False)
    _, s_cal = student_forward(an, ids, 6, Plan(calibrated, 0.6), logits=False)
    routed = ~torch.isnan(s_raw)
    torch.testing.assert_close(s_cal[routed], torch.sigmoid(CAL.scale * torch.logit(s_raw[routed].double()) + CAL.shift).float(),
                               atol=1e-5, rtol=1e-5)
    assert torch.equal(s_cal[routed] >= 0.6, s_raw[routed] >= CAL.raw_threshold(0.6))


def test_calibrate_cli_refuses_bad_input_before_loading(tmp_path, capsys):
    from routerlab.__main__ import main

    assert main(["calibrate", "--routers", str(tmp_path / "nowhere")]) == 2
    assert "not a router checkpoint" in capsys.readouterr().err
    assert main(["calibrate", "--routers", str(tmp_path), "--limit", "0"]) == 2
    assert "--limit" in capsys.readouterr().err


def test_command_of_names_only_what_differs_from_the_defaults():
    from routerlab.tuning.calibrate import command_of

    args = SimpleNamespace(routers="assets/routers/attention-token", data=None, split="heldout", limit=32, check_data=None,
                           check_split="heldout", check_limit=32, multiple=4.0, floor=0.01)
    assert command_of(args) == "python -m routerlab calibrate --routers assets/routers/attention-token"
    args.multiple = 5.0
    assert command_of(args).endswith("--multiple 5.0")
    args.long = 1024  # a set trained on long inputs is fitted on them
    assert command_of(args).endswith("--multiple 5.0 --long 1024")


def test_the_slider_marks_read_a_calibrated_sets_measured_skip_rates():
    from routerlab.ui.state.resources import expected_skips

    points = [{"threshold": t, "skip_rate": r} for t, r in ((0.1, 0.0), (0.3, 0.012), (0.5, 0.075), (0.7, 0.31), (0.9, 0.7))]
    meta = {"granularity": "attention-token", "calibration": {"scale": 6.5, "shift": 0.4, "points": {"heldout": points}}}
    assert expected_skips(meta) == "attention-token: 0.30 ≈ 1.2% · 0.50 ≈ 7.5% · 0.70 ≈ 31% skipped (held-out prompts)"
    assert expected_skips({"granularity": "mlp-token"}) == ""  # uncalibrated: no marks
    for broken in ({"calibration": {"points": {"heldout": "x"}}}, {"calibration": {"points": [1]}}, {"calibration": 3},
                   {"calibration": {"points": {"heldout": [{"threshold": "0.3", "skip_rate": None}]}}}):
        assert expected_skips(broken) == ""



def test_choosing_a_calibrated_set_marks_its_skip_rates_on_the_slider(tmp_path):
    from routerlab.ui.layout import router_set_chosen
    from routerlab.ui.state.resources import RouterSetInfo

    points = [{"threshold": t, "skip_rate": r} for t, r in ((0.3, 0.016), (0.5, 0.073), (0.7, 0.282))]
    meta = {"granularity": "attention-token", "threshold": 0.5, "kv_policy": "kv",
            "calibration": {"scale": 6.5, "shift": 0.4, "points": {"heldout": points}}}
    info = RouterSetInfo("attention-token (trained)", "attention-token", tmp_path, meta)
    slider, _, status = router_set_chosen(SimpleNamespace(router_sets=[info]), info.label)
    assert slider.value == 0.5 and "0.30 ≈ 1.6% · 0.50 ≈ 7.3% · 0.70 ≈ 28% skipped" in slider.info and "0.50" in status

def test_the_shipped_default_set_is_calibrated_and_its_slider_spans_the_useful_range():
    from routerlab.tuning.checkpoint import SHIPPED

    config = read_config(SHIPPED / "attention-token")  # validates the calibration too
    block = config["calibration"]
    assert config["threshold"] == 0.5  # the default `generate` and the app start from
    c = Calibration(block["scale"], block["shift"])
    assert c.raw_threshold(0.5) == pytest.approx(block["raw_default"])  # 0.5 is the trained set's own default
    heldout = {p["threshold"]: p["skip_rate"] for p in block["points"]["heldout"]}
    assert heldout[0.3] < heldout[0.5] < heldout[0.7] and heldout[0.7] >= 3 * heldout[0.5]
    assert heldout[0.3] < 0.03  # 0.3: almost nothing skipped
    assert block["fitted_on"]["data"] != block["checked_on"]["data"]  # checked on prompts the fit never saw
