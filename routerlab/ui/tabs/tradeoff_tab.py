"""The Trade-off tab: the committed benchmark results as three figures and a readable table, a quick
sweep when none ship, and row picking.

Owns `load_bench` (the benchmark CSVs under assets/bench/ as one numeric table), `load_results` (that
table's rows with speed.json and the held-out result), `tradeoff_figures` (the tab's three figures,
drawn by tradeoff_plots), `bench_table` (readable headers, formatted numbers) and its `column_widths`, `bench_summary` (the
headline sentence), `tradeoff_pick` (a clicked row sets Explore's threshold) and `tradeoff_sweep`
(tokens/s and agreement with the full model per threshold, on the Explore prompt). Knows nothing
about the layout, sessions or tensors.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path

import gradio as gr

from routerlab.core.base.errors import RouterLabError
from routerlab.core.base.paths import ASSETS
from routerlab.ui.figures import plots, safe, tradeoff_plots
from routerlab.ui.state.resources import FULL, UNTRAINED, Resources
from routerlab.ui.state.session import _status, _warn
from routerlab.ui.tabs.compare import lockstep_speeds, lockstep_traces, shared_tokens

log = logging.getLogger(__name__)

BENCH_DIR = ASSETS / "bench"
BENCH_COLUMNS = ["method", "granularity", "kv_policy", "threshold", "skip_rate_all_layers", "perplexity_increase", "agreement",
                 "speedup", "ideal_speedup", "perplexity"]
HEADERS = {  # the table's column names, as a reader says them
    "method": "method", "granularity": "granularity", "kv_policy": "KV policy", "threshold": "threshold",
    "skip_rate_all_layers": "skipped (all layers)", "skip_rate": "skipped (routed layers)", "perplexity_increase": "perplexity rise",
    "agreement": "agreement with full", "speedup": "speedup (measured)", "ideal_speedup": "speedup (ideal)",
}  # the absolute perplexity stays in the files (and docs/results.md): the rise says what it costs
WIDTHS = {"method": 9, "granularity": 13, "KV policy": 8, "threshold": 11, "skipped (all layers)": 10, "skipped (routed layers)": 10, "perplexity rise": 12,
          "agreement with full": 12, "speedup (measured)": 13, "speedup (ideal)": 11}  # % of the table's width, by header: no header word breaks
HELDOUT = (("heldout_sampled.json", "held-out prompts, sampled answers"), ("heldout_extra.json", "held-out prompts, greedy answers"))
BASELINES = ("full", "random", "static")


def load_bench(folder: Path = BENCH_DIR):
    """Benchmark CSVs in `folder` with method/speedup/perplexity columns, concatenated; None when absent.

    Keeps the columns the Trade-off tab shows, and the rows at a run's main context (its first
    row's `context_tokens`: the longer-prompt rows are another table); when several granularities are present, each tuned
    granularity gets its own curve ("tuned mlp-token", ...), as in `bench tradeoff`'s own figure.
    """
    import pandas as pd

    frames = []
    for csv in sorted(folder.glob("*.csv")) if folder.is_dir() else []:
        try:
            df = pd.read_csv(csv)
        except Exception as err:  # a broken results file must not take the app down
            log.warning("skipping %s: %s", csv, err)
            continue
        if {"method", "speedup", "perplexity"} <= set(df.columns):
            if "context_tokens" in df.columns and len(df):  # longer-prompt rows are a separate table
                df = df[df["context_tokens"] == df["context_tokens"].iloc[0]]
            frames.append(df)
    if not frames:
        return None
    df = pd.concat(frames, ignore_index=True)
    if "granularity" in df.columns:
        tuned = [g for g in df["granularity"].dropna().unique() if g != "full"]
        if len(tuned) > 1:
            main = tuned[0]
            df["method"] = [m if g in (main, "full") else f"tuned {g}" for m, g in zip(df["method"], df["granularity"])]
    return df[[c for c in BENCH_COLUMNS if c in df.columns]].round(4)


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except Exception as err:  # a broken results file must not take the app down
        log.warning("skipping %s: %s", path, err)
        return None
    return data if isinstance(data, dict) else None


def load_results(folder: Path = BENCH_DIR, calibrations: dict[str, dict] | None = None) -> dict:
    """What the Trade-off tab draws: the sweep's table (load_bench: `df`, None when absent, and its `rows` as dicts), speed.json
    and the first held-out result found (sampled answers before greedy ones), each None when absent or broken.

    `calibrations` (granularity -> a shipped set's router.json `calibration`, with `scale` and `shift`) puts
    the tuned rows' thresholds on the scale the slider uses: a result file that records no `calibration`
    of its own was measured on raw router scores (before the set was calibrated), and a raw threshold
    means another thing on a calibrated slider. `calibrated` lists the granularities so converted.
    """
    df = load_bench(folder)
    heldout, name = None, ""
    for file, label in HELDOUT:
        heldout = _read_json(folder / file)
        if heldout is not None:
            name = label
            break
    converted: set[str] = set()
    if calibrations:
        sweep = _read_json(folder / "tradeoff.json") or {}
        if df is not None and "calibration" not in sweep:
            df = df.copy()
            df["threshold"] = [_on_slider(t, m, g, calibrations, converted) for t, m, g in zip(df["threshold"], df["method"], df.get("granularity", [""] * len(df)))]
        if heldout is not None and "calibration" not in heldout and isinstance(heldout.get("curve"), dict):
            gran = heldout.get("granularity", "")
            curve = dict(heldout["curve"], tuned=[dict(r, threshold=_on_slider(r.get("threshold"), "tuned", gran, calibrations, converted))
                                                   for r in heldout["curve"].get("tuned", []) if isinstance(r, dict)])
            heldout = dict(heldout, curve=curve)
    return {"df": df, "rows": [] if df is None else df.to_dict("records"), "speed": _read_json(folder / "speed.json"), "heldout": heldout,
            "heldout_name": name, "calibrated": sorted(converted), "context": _read_json(folder / "context.json")}


def _on_slider(threshold, method, granularity, calibrations: dict[str, dict], converted: set[str]):
    """A raw router threshold of a tuned row as the calibrated slider reads it (monotone: the same decisions)."""
    from routerlab.core.routing.router import Calibration

    block, raw = calibrations.get(str(granularity)), tradeoff_plots.finite(threshold)
    if raw is None or not isinstance(block, dict) or str(method).split(" ")[0] in BASELINES:
        return threshold
    try:
        calibration = Calibration(block["scale"], block["shift"])
    except (KeyError, TypeError, RouterLabError):
        return threshold
    converted.add(str(granularity))
    return round(calibration.score(raw), 6)


def tradeoff_figures(results: dict) -> tuple:
    """The tab's three figures: quality cost against skipped fraction, measured against ideal speedup, where the time goes."""
    return (
        tradeoff_plots.quality_vs_skip(results.get("rows"), results.get("heldout"), results.get("heldout_name") or "held-out prompts"),
        tradeoff_plots.measured_vs_ideal(results.get("rows"), results.get("speed")),
        tradeoff_plots.time_split(results.get("speed")),
    )


def _cell(column: str, value, row: dict) -> str:
    v = tradeoff_plots.finite(value)
    if column in ("method", "granularity", "kv_policy"):
        return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)
    if v is None:
        return "–"
    if column == "threshold":
        kind = str(row.get("method", "")).split(" ")[0]
        return f"(p {v:.3f})" if kind == "random" else "–" if kind in BASELINES else f"{v:.3f}"
    if column == "perplexity_increase":
        return f"{100 * v:+.1f}%"
    if column in ("skip_rate_all_layers", "skip_rate", "agreement"):
        return f"{100 * v:.1f}%"
    if column in ("speedup", "ideal_speedup"):
        return f"{v:.3f}×"
    return f"{v:.3f}"


def bench_table(df):
    """A results table (load_bench's, or a sweep's) for reading: readable headers, formatted numbers
    (percentages, 3-decimal speedups; a random baseline's threshold is its skip probability, in brackets)."""
    import pandas as pd

    if df is None or len(df) == 0:
        return None
    columns = [c for c in df.columns if c in HEADERS]
    rows = df[columns].to_dict("records")
    return pd.DataFrame([[_cell(c, r[c], r) for c in columns] for r in rows], columns=[HEADERS[c] for c in columns])


def column_widths(table) -> list[str] | None:
    """The table's column widths (so no header breaks inside a word), or None for Gradio's own."""
    if table is None or not all(h in WIDTHS for h in table.columns):
        return None
    return [f"{WIDTHS[h]}%" for h in table.columns]


def bench_summary(results: dict) -> str:
    """The headline of the held-out result: the tuned routers' KL against random skipping's at the same share skipped."""
    curve = (results.get("heldout") or {}).get("curve") if isinstance(results.get("heldout"), dict) else None
    if not isinstance(curve, dict):
        return ""
    points = {k: [(tradeoff_plots.finite(r.get("skip_rate_all_layers")), tradeoff_plots.finite(r.get("kl_full"))) for r in curve.get(k, []) if isinstance(r, dict)] for k in ("tuned", "random")}
    tuned = [p for p in points["tuned"] if None not in p]
    random = [p for p in points["random"] if None not in p]
    if not tuned or not random:
        return ""
    skip, kl = min(tuned, key=lambda p: abs(p[0] - 0.05))
    r_skip, r_kl = min(random, key=lambda p: abs(p[0] - skip))
    if abs(r_skip - skip) > 0.25 * skip or r_kl <= 0:
        return ""
    return (f"On {results.get('heldout_name') or 'held-out prompts'}, skipping {skip:.1%} of all layers' sub-layer runs, the tuned routers' "
            f"outputs stay {r_kl / kl:.1f}× closer to the full model's than random skipping of the same share (mean KL {kl:.3f} vs {r_kl:.3f} nats).")


def tradeoff_pick(df, evt: gr.SelectData):
    """A row of the results table was clicked: set Explore's threshold to its threshold and go there.

    `df` is the table as shown (readable headers, `bench_table`) or a raw one; both have `method` and `threshold`.
    """
    try:
        row = evt.row_value if evt.row_value is not None else df.iloc[evt.index[0]].tolist()
        cols = list(df.columns)
        if "method" in cols and str(row[cols.index("method")]).split(" ")[0] in BASELINES:
            return gr.skip(), gr.skip(), _status("warn", f"{safe.text(row[cols.index('method')])} is a baseline: its threshold is not a router threshold. Pick a tuned row.")
        value = float(row[cols.index("threshold")])
        if not 0.0 <= value <= 1.0:  # NaN too: the full model's row has no threshold
            raise ValueError(value)
    except (ValueError, TypeError, IndexError, AttributeError, KeyError):
        return gr.skip(), gr.skip(), _status("warn", "That row has no threshold to use.")
    return gr.Slider(value=value), gr.Tabs(selected="explore"), _status("ok", f"Threshold set to {value:.2f} from the trade-off table.")


def tradeoff_sweep(res: Resources, prompt, router_label, kv_policy, model_name, progress=gr.Progress(), own: dict | None = None):
    """A quick sweep when no benchmark results ship: tokens/s and agreement with the full model per threshold."""
    import pandas as pd

    try:
        res.check_prompt(prompt)
        engine = res.engine_for(model_name)
        label = router_label if router_label not in (None, "", FULL) else UNTRAINED
        routers = res.routers_for(engine, label, own)
        config = res.generate_config(min(32, res.limits.max_new_tokens), 0.0, 0.5, kv_policy)
        config = dataclasses.replace(config, shared=False)  # with the room: each run alone, its speed compared with the others'
    except RouterLabError as err:
        return tradeoff_plots.tradeoff_curve(None), None, _warn(err)
    thresholds = [0.0, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    runs = [(None, config)] + [(routers, dataclasses.replace(config, threshold=t)) for t in thresholds]
    progress(0.0, desc=f"{len(runs)} runs side by side")
    traces = lockstep_traces(engine, prompt, runs, lambda done: progress(done, desc=f"{len(runs)} runs side by side"))
    full, swept = traces[0], traces[1:]
    full_ids = [s.token_id for s in full.generated_steps]
    n = max(shared_tokens([full, t]) for t in swept)  # each run timed against the full model over the rounds both decoded
    f_tps, *speeds = lockstep_speeds(traces)  # each a median ratio to the full model, round by round
    f_tps = f_tps or 1.0
    rows = [dict(method="full", threshold=None, speedup=1.0, agreement=1.0, skip_rate=0.0, kv_policy=kv_policy)]
    for t, trace, tps in zip(thresholds, swept, speeds):
        ids = [s.token_id for s in trace.generated_steps]
        same = next((j for j, (a, b) in enumerate(zip(full_ids, ids)) if a != b), min(len(full_ids), len(ids)))
        rows.append(dict(method=label, threshold=t, speedup=(tps or 0.0) / f_tps, agreement=same / max(1, len(full_ids)), skip_rate=trace.skip_rate(), kv_policy=kv_policy))
    df = pd.DataFrame(rows)
    return tradeoff_plots.tradeoff_curve(df, quality="agreement"), bench_table(df), _status("ok", (
        f"Sweep done: {len(runs)} runs decoded side by side (one token each in turn), each speed timed against the full model's over "
        f"the tokens both decoded (up to {n}); agreement = share of the full model's greedy tokens reproduced before the first difference."))
