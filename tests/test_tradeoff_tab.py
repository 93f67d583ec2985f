"""The Trade-off tab (ui/tabs/tradeoff_tab.py, ui/figures/tradeoff_plots.py): figures from the committed results in
assets/bench/ and from folders that lack some of them, the readable table, and row picking."""

from __future__ import annotations

import json
import shutil

import gradio as gr
import pytest

from routerlab import ui
from routerlab.ui.figures import tradeoff_plots

BENCH = ui.BENCH_DIR


def names(fig) -> set[str]:
    return {t.name for t in fig.data if t.name}


def placeholder(fig) -> str:
    """The message of a placeholder figure ('' when the figure has data)."""
    return "" if fig.data else " ".join(a.text for a in fig.layout.annotations)


def test_figures_build_from_the_committed_results():
    results = ui.load_results()
    assert results["rows"] and results["speed"] and results["heldout"]
    quality, speed, time = ui.tradeoff_figures(results)
    assert {"tuned attention-token", "random (attention-token)", "static (attention-token)"} <= names(quality)
    assert {"tuned mlp-token", "tuned block-sequence"} <= names(quality), "one curve per granularity"
    assert quality.layout.yaxis2.type == "log" and len([t for t in quality.data if t.xaxis == "x"]) == 3, "KL panel: tuned, random, static"
    line = next(t for t in speed.data if t.name == "measured = ideal")
    assert list(line.x) == list(line.y)
    assert any("deep layers" in t.name for t in speed.data)
    costs = results["speed"]["cost_seconds"]
    step_bars = [t for t in time.data if t.orientation == "h" and list(t.y) == ["decode step"]]
    pieces = 1000 * (costs["step"] + max(0.0, -costs["overhead"]))  # a negative rest (noise) is drawn as 0 and said in the note
    assert sum(t.x[0] for t in step_bars) == pytest.approx(pieces), "the pieces add up to the measured step"
    assert not any(t.name.startswith("routing") for t in step_bars), "routing is not a piece of the full model's step"
    ceiling = next(t for t in time.data if "block, drop policy" in list(t.y))
    assert all(v > 1 for v in ceiling.x)
    assert "closer to the full model" in ui.bench_summary(results)


def test_a_folder_missing_files_gives_placeholders_not_errors(tmp_path):
    results = ui.load_results(tmp_path / "nowhere")
    figs = ui.tradeoff_figures(results)
    assert all(placeholder(f) for f in figs) and results["df"] is None and ui.bench_table(results["df"]) is None
    assert "make tradeoff" in placeholder(figs[0]) and "make bench" in placeholder(figs[2])
    shutil.copy(BENCH / "speed.json", tmp_path / "speed.json")
    (tmp_path / "heldout_sampled.json").write_text("{not json")
    quality, speed, time = ui.tradeoff_figures(ui.load_results(tmp_path))
    assert placeholder(quality) and not placeholder(speed) and not placeholder(time)
    shutil.copy(BENCH / "tradeoff.csv", tmp_path / "tradeoff.csv")
    quality, _, _ = ui.tradeoff_figures(ui.load_results(tmp_path))
    assert not placeholder(quality) and any("no held-out result" in a.text for a in quality.layout.annotations)
    (tmp_path / "speed.json").write_text(json.dumps({"cost_seconds": {"step": 0.1}}))  # incomplete costs
    assert placeholder(ui.tradeoff_figures(ui.load_results(tmp_path))[2])


def test_time_pieces_and_ceilings_are_the_measured_arithmetic():
    n, af, kv, mlp, head, rest = 4, 0.002, 0.0005, 0.003, 0.01, 0.005
    step = n * (af + mlp) + head + rest
    costs = dict(attention_full=af, attention_kv_only=kv, mlp=mlp, head=head, step=step, routing=0.001, overhead=rest)
    pieces = dict(tradeoff_plots.time_pieces(costs))
    assert pieces["keys & values"] == pytest.approx(n * kv) and pieces["MLP"] == pytest.approx(n * mlp)
    assert sum(v for k, v in pieces.items() if not k.startswith("routing")) == pytest.approx(step)
    tops = dict(tradeoff_plots.ceilings(costs))
    assert tops["attention, kv policy"] == pytest.approx(step / (step - n * (af - kv)))
    assert tops["attention, drop policy"] == pytest.approx(step / (step - n * af))
    assert tops["MLP"] == pytest.approx(step / (step - n * mlp))
    assert tops["block, drop policy"] == pytest.approx(step / (head + rest))


def test_table_has_readable_headers_and_formatted_numbers():
    table = ui.bench_table(ui.load_bench())
    headers = list(table.columns)
    assert {"skipped (all layers)", "perplexity rise", "speedup (measured)", "speedup (ideal)", "KV policy"} <= set(headers)
    assert not any("_" in h for h in headers)
    tuned = table[table["method"] == "tuned"].iloc[0]
    assert tuned["skipped (all layers)"].endswith("%") and tuned["speedup (measured)"].endswith("×")
    assert len(tuned["speedup (measured)"].split(".")[1]) == 4  # 3 decimals and ×
    assert tuned["perplexity rise"][0] in "+-" and len(tuned["threshold"].split(".")[1]) == 3
    random = table[table["method"] == "random"].iloc[0]
    assert random["threshold"].startswith("(p ")
    assert table[table["method"] == "full"].iloc[0]["threshold"] == "–"


def test_clicking_a_row_of_the_shown_table_sets_its_threshold():
    table = ui.bench_table(ui.load_bench())
    for method, expect in (("tuned", "Threshold set to"), ("random", "baseline"), ("full", "baseline")):
        k = int((table["method"] == method).values.argmax())
        row = table.iloc[k].tolist()
        evt = gr.SelectData(None, {"index": [k, 0], "value": row[0], "row_value": row})
        slider, tabs, status = ui.tradeoff_pick(table, evt)
        assert expect in status
        if method == "tuned":
            assert slider.value == float(row[list(table.columns).index("threshold")]) and tabs.selected == "explore"


def test_raw_sweep_thresholds_are_shown_on_the_calibrated_slider_scale(tmp_path):
    from routerlab.core.routing.router import Calibration

    shipped = {r.granularity: r.meta.get("calibration") for r in ui.available_router_sets() if r.path is not None}
    block = shipped.get("attention-token") or {"scale": 6.5, "shift": 0.4, "raw_default": 0.4857}
    raw, mapped = ui.load_results(), ui.load_results(calibrations={"attention-token": block})
    assert mapped["calibrated"] == ["attention-token"] and raw["calibrated"] == []
    calibration = Calibration(block["scale"], block["shift"])
    for before, after in zip(raw["rows"], mapped["rows"]):
        if before["method"] in ("tuned", "tuned-drop", "official-mask") and before["granularity"] == "attention-token":
            assert after["threshold"] == pytest.approx(calibration.score(before["threshold"]), abs=1e-6)
        elif before["method"] != "full":
            assert after["threshold"] == before["threshold"], "baselines and uncalibrated granularities keep theirs"
    table = ui.bench_table(mapped["df"])
    tuned = table[(table["method"] == "tuned") & (table["granularity"] == "attention-token")]["threshold"].astype(float).tolist()
    assert tuned == sorted(tuned) and 0 < tuned[0] < tuned[-1] < 1, "a monotone map: the order of the rows stays"
    # a sweep that records the calibration it ran with already has slider thresholds
    shutil.copy(BENCH / "tradeoff.csv", tmp_path / "tradeoff.csv")
    (tmp_path / "tradeoff.json").write_text(json.dumps({"calibration": block}))
    assert ui.load_results(tmp_path, calibrations={"attention-token": block})["calibrated"] == []
