"""plots.py on synthetic traces: figures are finite, shaped layers x tokens, and what-if re-decides."""

from __future__ import annotations

import math
import random
import time

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from routerlab.core.records.trace import Step, Trace
from routerlab.ui.figures import plots, tradeoff_plots

COSTS = {"q": 10.0, "k": 5.0, "v": 5.0, "o": 10.0, "mlp": 60.0, "score_per_ctx": 1.0, "kv_bytes": 256.0}


def synthetic_trace(n_layers=6, n_prompt=5, n_gen=20, thresholds=None, seed=0, texts=None, routed=None) -> Trace:
    """Random scores on routed layers (all but first and last by default); decisions follow each step's threshold."""
    rng = random.Random(seed)
    routed = set(range(1, n_layers - 1)) if routed is None else set(routed)
    steps = []
    for p in range(n_prompt + n_gen):
        is_prompt = p < n_prompt
        thr = 0.5 if thresholds is None else thresholds(p)
        scores = [rng.random() if i in routed else None for i in range(n_layers)]
        executed = [None if s is None else s >= thr for s in scores]
        text = texts[p % len(texts)] if texts else f" t{p}"
        steps.append(Step(position=p, token_id=p % 97, text=text, is_prompt=is_prompt, scores=scores, executed=executed, threshold=thr, seconds=0.0 if is_prompt else 0.02))
    meta = {"model": "synthetic", "granularity": "attention-token", "kv_policy": "kv", "kv_policy_effective": "kv", "costs": COSTS, "stop_reason": "max_new_tokens", "prefill_seconds": 0.05}
    return Trace(n_layers=n_layers, steps=steps, meta=meta)


def _finite_or_nan(arr) -> bool:
    a = np.asarray(arr, dtype=float)
    return bool(np.all(np.isfinite(a) | np.isnan(a)))


def test_heatmap_is_layers_by_tokens_with_ran_and_skipped_split():
    trace = synthetic_trace(n_layers=6, n_prompt=5, n_gen=20)
    fig = plots.heatmap(trace)
    ran, skipped = fig.data[0], fig.data[1]
    assert np.asarray(ran.z).shape == (6, 25) and np.asarray(skipped.z).shape == (6, 25)
    assert list(ran.x) == [f"{p}: ·t{p}" for p in range(25)]  # one category per position: "position: token"
    z_ran, z_skip = np.asarray(ran.z, float), np.asarray(skipped.z, float)
    # every routed cell is in exactly one of the two layers; unrouted rows (0 and 5) are blank in both
    assert np.all(np.isnan(z_ran[[0, 5]])) and np.all(np.isnan(z_skip[[0, 5]]))
    assert np.all(np.isnan(z_ran[1:5]) ^ np.isnan(z_skip[1:5]))
    assert np.nanmin(z_ran) >= 0.5 and np.nanmax(z_skip) < 0.5
    assert _finite_or_nan(z_ran) and _finite_or_nan(z_skip)
    assert "Recorded run" in fig.layout.title.text


def test_heatmap_marks_prompt_boundary_and_threshold_changes():
    trace = synthetic_trace(n_prompt=5, n_gen=20, thresholds=lambda p: 0.5 if p < 12 else 0.3)
    fig = plots.heatmap(trace)
    xs = sorted(s.x0 for s in fig.layout.shapes if s.yref == "paper")  # vertical lines (the rest part the rows)
    assert xs == [4.5, 11.5]
    assert any("t→0.30" in a.text for a in fig.layout.annotations)
    # each stretch between moves says its own decode speed: steps of 20 ms, then of 10 ms after the move
    for step in trace.generated_steps[7:]:
        step.seconds = 0.01
    texts = [a.text for a in plots.heatmap(trace).layout.annotations if "tok/s" in a.text]
    assert texts == ["t=0.50 · 50 tok/s", "t→0.30 · 100 tok/s"]
    assert trace.decode_speed(7) == pytest.approx(50) and trace.decode_speed(start=7) == pytest.approx(100)
    # decisions really follow the moved threshold in the synthetic trace
    z_skip = np.asarray(fig.data[1].z, float)
    assert np.nanmax(z_skip[:, 12:]) < 0.3


def test_heatmap_ticks_are_sparse_for_long_runs():
    trace = synthetic_trace(n_layers=30, n_prompt=40, n_gen=260)
    fig = plots.heatmap(trace)
    assert len(fig.layout.xaxis.tickvals) <= plots.MAX_TICKS
    assert set(fig.layout.xaxis.tickvals) <= set(fig.data[0].x)
    assert fig.layout.xaxis.ticktext[1] == plots.token_label(trace.steps[int(fig.layout.xaxis.tickvals[1].split(":")[0])].text)


def test_a_live_frame_is_lighter_to_draw_than_the_final_figure():
    """While streaming, colour bars keep their titles without numbers and the x axis has half the token
    labels (the browser redraws a live frame every 2 s next to the decoder); the final figure has both."""
    trace = synthetic_trace(n_layers=30, n_prompt=40, n_gen=260)
    live, final = plots.heatmap(trace, live=True), plots.heatmap(trace)
    assert [t.colorbar.showticklabels for t in live.data[:2]] == [False, False]
    assert [t.colorbar.showticklabels for t in final.data[:2]] == [True, True]
    assert all(t.colorbar.title.text for t in live.data[:2])
    assert len(live.layout.xaxis.tickvals) <= plots.MAX_TICKS // 2 < len(final.layout.xaxis.tickvals)


def test_what_if_differs_from_recorded_when_threshold_moves():
    trace = synthetic_trace(n_gen=40)
    recorded = plots.heatmap(trace)
    same = plots.heatmap(trace, threshold=0.5, what_if=True)
    moved = plots.heatmap(trace, threshold=0.8, what_if=True)
    assert "WHAT-IF" in moved.layout.title.text and "not a new run" in moved.layout.title.text
    np.testing.assert_array_equal(np.isnan(np.asarray(recorded.data[0].z, float)), np.isnan(np.asarray(same.data[0].z, float)))
    assert not np.array_equal(np.isnan(np.asarray(recorded.data[0].z, float)), np.isnan(np.asarray(moved.data[0].z, float)))
    assert len(moved.data) == 3  # the tint over the cells that changed
    changed = np.asarray(moved.data[2].z, float)
    assert np.nansum(changed) == np.sum(np.asarray(trace.executed_matrix(0.8), dtype=object) != np.asarray(trace.executed_matrix(), dtype=object))
    assert trace.skip_rate(0.8) > trace.skip_rate()


def test_hover_and_ticks_escape_html():
    trace = synthetic_trace(n_prompt=1, n_gen=3, texts=["<script>", " a&b", "\n"])
    fig = plots.heatmap(trace)
    assert "<script>" not in str(fig.data[0].x) and "&#60;script&#62;" in str(fig.data[0].x)  # safe.text: plotly shows it
    assert "⏎" in "".join(fig.layout.xaxis.ticktext)


def test_token_html_escapes_and_tints_by_layers_used():
    trace = synthetic_trace(n_prompt=1, n_gen=3, texts=["x", "<b>bold</b>", " & ", "\n"])
    out = plots.token_html(trace)
    assert "<b>bold</b>" not in out and "&#60;b&#62;bold&#60;/b&#62;" in out
    assert out.count("class='rl-tok'") == 3 + 3  # 3 tokens + 3 legend swatches
    assert "layers used" in out
    marked = plots.token_html(trace, diverge_at=1)
    assert marked.count("rl-diverge") == 1


def test_empty_inputs_give_placeholders_not_errors():
    for fig in (plots.heatmap(None), plots.layer_skip_bar(None), plots.score_histogram(None), tradeoff_plots.tradeoff_curve(None), tradeoff_plots.tradeoff_curve(pd.DataFrame())):
        assert isinstance(fig, go.Figure)
    assert "No run" in plots.stats_html({})
    assert "appears here" in plots.token_html(None)
    empty = Trace(n_layers=4, steps=[], meta={})
    assert isinstance(plots.heatmap(empty), go.Figure)


def test_layer_views_have_one_entry_per_layer():
    trace = synthetic_trace(n_layers=8)
    bar = plots.layer_skip_bar(trace)
    assert len(bar.data[0].y) == 8 and bar.data[0].text[0] == "not routed"
    hist = plots.score_histogram(trace)
    z = np.asarray(hist.data[0].z, float)
    assert z.shape == (8, 20)
    np.testing.assert_allclose(np.nansum(z[1:7], axis=1), 1.0)
    # a small share reads light, a layer crowding one bin dark, on one scale for every run (0 to 100%)
    scale = hist.data[0].colorscale
    assert (hist.data[0].zmin, hist.data[0].zmax) == (0.0, 1.0) and scale[0][1] == "#f7fbff" and scale[-1][1] == "#08306b"
    what_if = plots.layer_skip_bar(trace, threshold=0.9)
    assert sum(what_if.data[0].y) > sum(bar.data[0].y)
    # an unrouted layer's bar has height 0 (nothing grey to see): the title names those layers
    title = bar.layout.title.text
    assert "layers 0 and 7 have no router" in title and "grey" not in title


def test_live_stats_numbers_are_finite_and_sane():
    trace = synthetic_trace(n_gen=30)
    costs = {"attention_full": 0.002, "attention_kv_only": 0.0005, "mlp": 0.003, "step": 0.05, "context": 64.0}
    stats = plots.live_stats(trace, costs)
    assert stats["tokens_per_second"] == pytest.approx(50.0)
    skipped = sum(s.skipped for s in trace.generated_steps)
    assert stats["speedup_estimate"] == pytest.approx(30 * 0.05 / (30 * 0.05 - skipped * 0.0015))  # kv: what a skip saves
    assert 0.0 < stats["skip_rate"] < 1.0 and 0.0 < stats["attention_flops_saved"] < 1.0
    assert all(math.isfinite(v) for v in stats.values() if isinstance(v, float))
    html = plots.stats_html(stats)
    assert f"{stats['speedup_estimate']:.2f}×" in html and "est. speedup" in html and "kv policy" in html
    assert plots.live_stats(trace, None)["speedup_estimate"] is None


def test_first_divergence():
    a, b = synthetic_trace(seed=1), synthetic_trace(seed=1)
    assert plots.first_divergence(a, b) is None
    b.generated_steps[3].token_id += 1
    assert plots.first_divergence(a, b) == 3


def test_tradeoff_curve_one_line_per_method():
    df = pd.DataFrame(
        {
            "method": ["routed"] * 3 + ["full"],
            "threshold": [0.3, 0.5, 0.7, 0.0],
            "speedup": [1.0, 1.2, 1.5, 1.0],
            "perplexity": [10.0, 10.5, 13.0, 10.0],
        }
    )
    fig = tradeoff_plots.tradeoff_curve(df, current_threshold=0.5)
    assert [t.name for t in fig.data][:2] == ["routed", "full"]
    assert fig.data[-1].x == (1.2,)


def test_heatmap_redraw_time_300_tokens_x_30_layers():
    """Prints the redraw time (the figure and its JSON); timing is reported, not asserted."""
    trace = synthetic_trace(n_layers=30, n_prompt=40, n_gen=260)
    plots.heatmap(trace)  # warm plotly's validators
    t0 = time.perf_counter()
    for _ in range(5):
        fig = plots.heatmap(trace, threshold=0.6, what_if=True)
        fig.to_json()
    ms = (time.perf_counter() - t0) / 5 * 1e3
    print(f"\nwhat-if heatmap 300 tokens x 30 layers: {ms:.1f} ms per redraw (figure + JSON), {len(fig.to_json()) // 1024} KiB")


def test_every_figure_passes_plotly_validation_and_strict_json():
    """The fast heatmap skips plotly's validation; rebuild each figure with it on to catch typos, and
    check the JSON the browser gets has no NaN (JSON.parse rejects it)."""
    import json

    trace = synthetic_trace(thresholds=lambda p: 0.5 if p < 12 else 0.3)
    df = pd.DataFrame({"method": ["a", "a"], "threshold": [0.4, 0.6], "speedup": [1.1, 1.3], "perplexity": [9.0, 9.5]})
    figures = [
        plots.heatmap(trace),
        plots.heatmap(trace, threshold=0.7, what_if=True),
        plots.heatmap(None),
        plots.layer_skip_bar(trace),
        plots.score_histogram(trace),
        tradeoff_plots.tradeoff_curve(df, 0.5),
    ]
    for fig in figures:
        go.Figure(fig.to_dict())  # raises ValueError on an invalid property
        text = fig.to_json()
        json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


def test_incremental_heatmap_equals_full_redraw():
    """A cached redraw of a growing run (only new steps converted) draws exactly what a fresh one does."""
    full = synthetic_trace(n_layers=6, n_prompt=5, n_gen=30, thresholds=lambda p: 0.5 if p < 20 else 0.3)
    cache: dict = {}
    for n in (5, 6, 12, 35):
        part = Trace(full.n_layers, full.steps[:n], full.meta)
        cached, fresh = plots.heatmap(part, cache=cache), plots.heatmap(part)
        assert len(cached.data) == len(fresh.data)
        for a, b in zip(cached.data, fresh.data):
            np.testing.assert_array_equal(np.asarray(a.z, float), np.asarray(b.z, float))
            assert list(a.x) == list(b.x)
        assert cached.layout.title.text == fresh.layout.title.text
    other = synthetic_trace(seed=3)  # a different run with the same cache starts over
    np.testing.assert_array_equal(np.asarray(plots.heatmap(other, cache=cache).data[0].z, float), np.asarray(plots.heatmap(other).data[0].z, float))


def test_heatmap_skip_rates_match_trace():
    trace = synthetic_trace(n_gen=40)
    assert f"skip rate {trace.skip_rate():.0%}" in plots.heatmap(trace).layout.title.text
    assert f"skip rate {trace.skip_rate(0.7):.0%}" in plots.heatmap(trace, threshold=0.7, what_if=True).layout.title.text


def _decoded(fig: dict):
    """A figure dict with every base64 typed array decoded to a list (NaN as None), for comparisons."""
    import base64

    if isinstance(fig, dict):
        if "bdata" in fig:
            flat = np.frombuffer(base64.b64decode(fig["bdata"]), dtype=fig["dtype"]).astype(float)
            return [str(fig["shape"]).replace(" ", ""), [None if math.isnan(v) else v for v in flat]]
        return {k: _decoded(v) for k, v in fig.items()}
    if isinstance(fig, list):
        return [_decoded(v) for v in fig]
    return fig


def test_streamed_heatmap_json_is_the_figures_json():
    import json

    trace = synthetic_trace(n_layers=6, n_gen=20, thresholds=lambda p: 0.5 if p < 12 else 0.3, texts=[" a", "<b>&", "\n"])
    trace.meta["quality"] = True
    for j, s in enumerate(trace.generated_steps[:-3]):
        s.kl_full, s.full_top_token, s.full_top_text = 0.05 * j, (7 if j % 4 == 0 else None), (" z" if j % 4 == 0 else None)
    for kwargs in ({}, {"live": True}, {"threshold": 0.8, "what_if": True}):
        assert _decoded(json.loads(plots.heatmap_json(trace, **kwargs))) == _decoded(json.loads(plots.heatmap(trace, **kwargs).to_json()))
    assert json.loads(plots.heatmap_json(None))["layout"]["annotations"]


def test_token_html_cache_gives_the_same_text_as_it_grows_and_scores():
    trace = synthetic_trace(n_gen=12)
    trace.meta["quality"] = True
    cache: dict = {}
    assert plots.token_html(trace, cache=cache) == plots.token_html(trace)
    trace.generated_steps[3].kl_full = 0.4  # a token's quality cost arrives: its span is rebuilt
    assert plots.token_html(trace, cache=cache) == plots.token_html(trace) and "0.400 nats" in plots.token_html(trace, cache=cache)


def test_bar_and_histogram_json_are_their_figures_json():
    import json

    trace = synthetic_trace(n_layers=6, n_gen=20, routed=[1, 2, 3, 4])
    for threshold in (None, 0.3):
        for fast, slow in ((plots.layer_skip_bar_json, plots.layer_skip_bar), (plots.score_histogram_json, plots.score_histogram)):
            assert _decoded(json.loads(fast(trace, threshold=threshold))) == _decoded(json.loads(slow(trace, threshold=threshold).to_json()))
    assert json.loads(plots.layer_skip_bar_json(None)) == json.loads(plots.layer_skip_bar(None).to_json())


def test_bar_and_histogram_read_a_runs_heatmap_columns_as_they_would_the_trace():
    trace = synthetic_trace(n_layers=6, n_gen=20, routed=[1, 2, 3, 4])
    columns: dict = {}
    plots.heatmap_json(trace, cache=columns)  # the final view draws the heatmap first: its columns are converted once
    assert columns["n"] == len(trace.steps)
    assert plots.layer_skip_bar_json(trace, cache=columns) == plots.layer_skip_bar_json(trace)
    assert plots.score_histogram_json(trace, cache=columns) == plots.score_histogram_json(trace)
    # a what-if threshold reads the scores again: the cache holds the recorded decisions only
    assert plots.layer_skip_bar_json(trace, threshold=0.3, cache=columns) == plots.layer_skip_bar_json(trace, threshold=0.3)


def test_layer_shares_bin_as_numpys_histogram_does():
    rng = np.random.default_rng(0)
    edges = np.linspace(0.0, 1.0, 21)
    scores = rng.random((5, 40))
    scores[0, :6] = edges[:6]  # on the bins' edges: each goes to the bin it opens
    scores[0, 6:9] = [1.0, -0.2, 1.3]  # the last edge belongs to the last bin; outside values are clipped in
    scores[1, ::3] = np.nan  # unrouted cells count nowhere
    scores[2] = np.nan  # a layer without scores has no shares
    shares = plots.layer_shares(scores, edges)
    for i, row in enumerate(scores):
        row = row[~np.isnan(row)]
        if row.size:
            assert np.array_equal(shares[i], np.histogram(np.clip(row, 0.0, 1.0), bins=edges)[0] / row.size)
        else:
            assert np.isnan(shares[i]).all()


def test_a_long_prompts_heatmap_opens_on_the_generated_tokens():
    long = plots.heatmap(synthetic_trace(n_prompt=400, n_gen=40))
    assert long.layout.xaxis.range[0] == 400 - 10 - 0.5 and long.layout.xaxis.range[1] == 439.5
    assert "double-click for the prompt" in long.layout.title.text
    assert all(int(str(v).split(":")[0]) >= 390 for v in long.layout.xaxis.tickvals)  # ticks where the view is
    short = plots.heatmap(synthetic_trace(n_prompt=20, n_gen=40))
    assert short.layout.xaxis.range[0] == -0.5 and "double-click" not in short.layout.title.text


def test_the_stats_say_why_flops_saved_is_below_the_skip_rate():
    stats = plots.live_stats(synthetic_trace())
    html_ = plots.stats_html(stats)
    assert stats["attention_flops_saved"] < stats["skip_rate"] and "Why attention FLOPs saved is below the skip rate" in html_
    assert "Why" not in plots.stats_html({**stats, "skip_rate": 0.0})
