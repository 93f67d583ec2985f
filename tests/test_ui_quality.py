"""The quality half of Explore and its honest speed figure, on a tiny random model with a character tokenizer.

The per-token KL to the full model shows as a strip under the heatmap's generated columns, as an
underline in the text with a hover title, and as mean KL / top-1 agreement in the stats; the
"Measure quality" switch turns all of it off. The speedup shown is an estimate from per-layer costs,
says so, and is never below 1.
"""

from __future__ import annotations

from html import unescape

import numpy as np
import pytest
from test_ui import RANDOM, tiny_resources, figure, heatmap_kind, live_figure, pull_until, run_all

from routerlab import ui
from routerlab.core.records.trace import Step, Trace
from routerlab.ui.figures import plots
from routerlab.ui.figures import quality_plots as qp

COSTS = {"attention_full": 0.002, "attention_kv_only": 0.0005, "mlp": 0.003, "head": 0.004, "step": 0.05, "context": 64.0}


@pytest.fixture(scope="module")
def res():
    return tiny_resources()


def explore(res, session, quality=True, threshold=0.6, max_new=24):
    return ui.explore_run(res, "Hello there", threshold, RANDOM, "kv", max_new, 0.0, res.default_model, session, quality)


def trace_named(fig: dict, name: str) -> dict | None:
    return next((t for t in fig["data"] if t.get("name") == name), None)


def values(z) -> np.ndarray:
    """A heatmap's z (a nested list, or plotly's base64 typed-array spec) as a float array."""
    if isinstance(z, dict):
        import base64

        flat = np.frombuffer(base64.b64decode(z["bdata"]), dtype={"f4": np.float32, "f8": np.float64}[z["dtype"]])
        return flat.reshape([int(n) for n in str(z["shape"]).split(",")]).astype(float)
    return np.array([[np.nan if v is None else v for v in row] for row in z], dtype=float)


def test_strip_has_one_cell_per_generated_token_equal_to_the_traces_kl(res):
    session = ui.Session()
    outs = run_all(explore(res, session))
    trace = session.trace
    fig = figure(outs[-1][1])
    strip, ran = trace_named(fig, "quality cost"), trace_named(fig, "ran")
    gen = [j for j, s in enumerate(trace.steps) if not s.is_prompt]
    assert strip is not None and strip["yaxis"] == "y2" and fig["layout"]["xaxis"]["anchor"] == "y2"
    assert list(strip["x"]) == [ran["x"][j] for j in gen], "one strip cell under each generated column, same categories"
    kl = [s.kl_full for s in trace.generated_steps]
    assert all(k is not None for k in kl) and max(kl) > 0, "skipping routers move the distribution"
    np.testing.assert_allclose(values(strip["z"])[0], kl, rtol=1e-6, atol=1e-7)  # float32 on the wire
    assert np.all(np.isnan(values(trace_named(fig, "not measured yet")["z"]))), "at the end every token is measured"


def test_live_strip_greys_tokens_not_measured_yet(res):
    session = ui.Session()
    with res.engine.hold(after=5, max_new_tokens=40):  # chunks of 16: the first 5 tokens wait for their score
        gen = explore(res, session, max_new=40)
        def strip_cells(out) -> int:
            return len(trace_named(live_figure(out), "quality cost")["x"]) if heatmap_kind(out) == "live" else 0

        live = pull_until(gen, lambda out: strip_cells(out) >= 1)[-1]  # a live heatmap with generated columns
        fig = live_figure(live)
        pending = values(trace_named(fig, "not measured yet")["z"])[0]
        assert len(pending) == strip_cells(live) and not np.isnan(pending).any(), "every unscored token is grey"
        assert "mean KL to full model" in live[2]
    outs = run_all(gen)
    assert np.isnan(values(trace_named(figure(outs[-1][1]), "not measured yet")["z"])).all()


def test_hover_carries_both_top_tokens_where_they_differ():
    steps = [Step(p, 65 + p, t, p < 2, [None, 0.7], [None, True], 0.5, 0.0 if p < 2 else 0.02) for p, t in enumerate(["a", "b", " x", " y"])]
    steps[2].kl_full, steps[2].full_top_token, steps[2].full_top_text = 0.8, 90, " z"
    steps[3].kl_full = 0.001
    trace = Trace(2, steps, {"quality": True, "granularity": "attention-token", "kv_policy_effective": "kv"})
    strip = trace_named(plots.heatmap(trace).to_dict(), "quality cost")
    assert strip["text"][0][0] == "routed: ·x · full model: ·z"
    assert strip["text"][0][1] == "full model's top token = routed model's"
    assert "%{x}" in strip["hovertemplate"] and "KL" in strip["hovertemplate"]
    html = plots.token_html(trace)
    assert "KL to the full model 0.800 nats · routed: ·x · full model: ·z" in html
    assert qp.kl_colour(0.8) in html and "underline: quality cost" in html


def test_switch_off_gives_no_strip_and_not_measured_stats(res):
    session = ui.Session()
    outs = run_all(explore(res, session, quality=False))
    trace = session.trace
    assert trace.meta["quality"] is False and all(s.kl_full is None for s in trace.steps)
    fig = figure(outs[-1][1])
    assert trace_named(fig, "quality cost") is None and "yaxis2" not in fig["layout"]
    text, stats = outs[-1][0], outs[-1][2]
    assert stats.count("not measured") >= 2 and "quality cost" not in text and "KL" not in text


def test_stats_and_status_show_mean_kl_and_agreement(res):
    session = ui.Session()
    out = run_all(explore(res, session))[-1]
    trace = session.trace
    assert f"{trace.mean_kl():.3f} nats" in out[2] and f"{trace.agreement():.0%}" in out[2]
    assert f"mean KL {trace.mean_kl():.3f} nats" in out[3] and "agreement" in out[3]


def test_speed_line_says_estimated_and_never_below_one(res):
    session = ui.Session()
    res.costs.clear()
    out = run_all(explore(res, session, quality=False))[-1]
    assert "tok/s (measured)" in out[3] and "×" not in out[3], "no speedup without measured costs"
    assert "vs full model" not in out[2] and "--no-warmup" in out[2]
    noisy = dict(COSTS, attention_kv_only=0.003)  # noise made kv's leftover cost exceed the whole attention
    for costs in (COSTS, noisy):
        res.costs[res.default_model] = costs
        out = run_all(explore(res, ui.Session(), quality=False))[-1]
        shown = float(out[3].split("speedup ")[1].split("×")[0])
        assert "estimated from measured per-layer costs" in out[3] and shown >= 1.0
        assert "est. speedup" in out[2] and f"{shown:.2f}×" in out[2]
    res.costs.clear()


def test_what_if_estimate_follows_the_what_if_decisions(res):
    session = ui.Session()
    res.costs[res.default_model] = COSTS
    try:
        run_all(explore(res, session, quality=False, threshold=0.5))
        recorded = plots.live_stats(session.trace, COSTS)["speedup_estimate"]
        more = plots.live_stats(session.trace, COSTS, threshold=0.95)["speedup_estimate"]
        assert more > recorded >= 1.0
        assert f"{more:.2f}×" in ui.threshold_moved(res, 0.95, session)[2]
    finally:
        res.costs.clear()


def _timed_trace(quality: bool) -> Trace:
    """Four generated tokens that decode in 0.25 s each; with quality on, the meter's pass adds 0.5 s to tokens 2 and 4
    (the engine records each step's share, `quality_seconds_by_step`): injected timings, no clock."""
    extra = [0.0, 0.5, 0.0, 0.5] if quality else [0.0] * 4
    steps = [Step(0, 1, "Q", True, [None], [None], 0.5, 0.1)]
    for k, e in enumerate(extra):
        steps.append(Step(k + 1, 2 + k, f"w{k}", False, [None], [None], 0.5, 0.25 + e, kl_full=0.01 if quality else None))
    meta = {"quality": quality, "granularity": "attention-token", "temperature": 0.0, "stop_reason": "max_new_tokens"}
    if quality:
        meta.update(quality_seconds_by_step=extra, quality_seconds_in_steps=sum(extra))
    return Trace(1, steps, meta)


def test_explores_decode_rate_leaves_out_the_quality_pass(res):
    """The same decoding with the quality meter on and off shows the same tok/s (4 tokens in 1 s), in the card and in the
    status line, as Compare's decode_speed counts it; a real run's figure is its trace's decode time only."""
    from routerlab.ui.tabs.explore import _done_status

    on, off = _timed_trace(True), _timed_trace(False)
    assert on.decode_tokens_per_second() < 4.0  # counting the passes, the routed run looked slower
    for trace in (on, off):
        stats = plots.live_stats(trace)
        assert stats["tokens_per_second"] == pytest.approx(4.0) == ui.decode_speed(trace)
        assert "<div class='rl-card-v'>4.0</div><div class='rl-card-l'>tokens/s (measured)</div>" in plots.stats_html(stats)
        assert "decode 4.0 tok/s (measured" in _done_status(trace, res, 1.0)
    assert "not counting the quality meter" in plots.stats_html(plots.live_stats(on)) and "not counting the quality pass" in _done_status(on, res, 1.0)
    session = ui.Session()
    out = run_all(explore(res, session))[-1]
    assert session.trace.meta["quality_seconds_by_step"], "the tiny run measured its quality inside its steps"
    assert f"decode {session.trace.decode_speed():.1f} tok/s" in out[3]


def test_cards_say_where_the_text_leaves_the_full_models_answer_and_flag_a_loop():
    steps = [Step(0, 1, "Q", True, [None], [None], 0.5, 0.1)]
    text = ["The", " text", " above"] + [" a", "."] * 8
    for k, piece in enumerate(text):
        steps.append(Step(k + 1, 100 + (k if k < 3 else 3 + (k - 3) % 2), piece, False, [0.6], [True], 0.5, 0.1, kl_full=0.1))
    steps[2].full_top_token, steps[2].full_top_text = 55, " sea"  # token 2: the full model would have written " sea"
    trace = Trace(1, steps, {"quality": True, "granularity": "attention-token", "temperature": 0.0})
    html = unescape(plots.stats_html(plots.live_stats(trace)))
    assert "leaves the full model's answer" in html
    assert "token 2: “·text” for “·sea”" in html
    assert "repeats itself" in html and "yes, from token 4: “·a.” ×8 to the end" in html
    assert "given the routed text's own prefix" in html
    assert "each token the same as the one a unit before it" in html  # the rule is stated
    status = qp.text_phrase(plots.live_stats(trace))
    assert status == "; it leaves the full model's answer at token 2 and it repeats itself from token 4"
    # prose that follows the full model: said so, and no flag
    for s in steps[1:]:
        s.full_top_token = s.full_top_text = None
    trace.steps[:] = steps[:4]
    stats = plots.live_stats(trace)
    assert qp.departure_value(stats) == "not in 3 tokens" and qp.repeat_value(stats) == "no"
    assert qp.text_phrase(stats) == "; it is the full model's answer for all 3 tokens"
    sampled = Trace(1, steps[:4], dict(trace.meta, temperature=0.7))
    assert qp.departure_value(plots.live_stats(sampled)) == "– (sampled text: no greedy answer)"
    off = Trace(1, [Step(s.position, s.token_id, s.text, s.is_prompt, s.scores, s.executed, 0.5, 0.1) for s in steps[:4]],
                {"quality": False, "granularity": "attention-token"})
    cards = dict((label, value) for label, value, _ in qp.quality_cards(plots.live_stats(off)))
    assert cards["leaves the full model's answer"] == "not measured" and cards["repeats itself"] == "no"


def test_a_real_runs_cards_carry_the_departure_and_the_repetition_flag(res):
    session = ui.Session()
    out = run_all(explore(res, session))[-1]
    stats = plots.live_stats(session.trace)
    shown = unescape(out[2])
    assert "leaves the full model's answer" in shown and "repeats itself" in shown
    assert f">{qp.departure_value(stats)}<" in shown and f">{qp.repeat_value(stats)}<" in shown
