"""The Trade-off tab: shipped benchmark results, a quick sweep when none ship, and row picking.

Owns `load_bench` (the benchmark CSVs under assets/bench/ as one table), `tradeoff_pick` (a
clicked row sets Explore's threshold) and `tradeoff_sweep` (tokens/s and agreement with the full
model per threshold, on the Explore prompt). Knows nothing about the layout, sessions or tensors.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import gradio as gr

from routerlab.core.errors import RouterLabError
from routerlab.core.paths import ASSETS
from routerlab.ui import plots
from routerlab.ui.resources import FULL, UNTRAINED, Resources
from routerlab.ui.session import _status, _warn

log = logging.getLogger(__name__)

BENCH_DIR = ASSETS / "bench"
BENCH_COLUMNS = ["method", "granularity", "kv_policy", "threshold", "speedup", "perplexity", "agreement", "skip_rate_all_layers"]


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


def tradeoff_pick(df, evt: gr.SelectData):
    """A row of the results table was clicked: set Explore's threshold to its threshold and go there."""
    try:
        row = evt.row_value if evt.row_value is not None else df.iloc[evt.index[0]].tolist()
        cols = list(df.columns)
        if "method" in cols and not str(row[cols.index("method")]).startswith(("tuned", "official")):
            return gr.skip(), gr.skip(), _status("warn", f"{row[cols.index('method')]} is a baseline: its threshold is not a router threshold. Pick a tuned row.")
        value = float(row[cols.index("threshold")])
        if not 0.0 <= value <= 1.0:  # NaN too: the full model's row has no threshold
            raise ValueError(value)
    except (ValueError, TypeError, IndexError, AttributeError, KeyError):
        return gr.skip(), gr.skip(), _status("warn", "That row has no threshold to use.")
    return gr.Slider(value=value), gr.Tabs(selected="explore"), _status("ok", f"Threshold set to {value:.2f} from the trade-off table.")


def tradeoff_sweep(res: Resources, prompt, router_label, kv_policy, model_name, progress=gr.Progress()):
    """A quick sweep when no benchmark results ship: tokens/s and agreement with the full model per threshold."""
    import pandas as pd

    from routerlab.core.engine import Control

    try:
        res.check_prompt(prompt)
        engine = res.engine_for(model_name)
        label = router_label if router_label not in (None, "", FULL) else UNTRAINED
        routers = res.routers_for(engine, label)
        config = res.generate_config(min(32, res.limits.max_new_tokens), 0.0, 0.5, kv_policy)
    except RouterLabError as err:
        return plots.tradeoff_curve(None), None, _warn(err)
    thresholds = [0.0, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    progress(0.0, desc="full model")
    full = engine.run(prompt, None, config)
    full_ids = [s.token_id for s in full.generated_steps]
    rows = [dict(method="full", threshold=None, speedup=1.0, agreement=1.0, skip_rate=0.0, kv_policy=kv_policy)]
    f_tps = full.decode_tokens_per_second() or 1.0
    for k, t in enumerate(thresholds):
        progress((k + 1) / (len(thresholds) + 1), desc=f"threshold {t:.2f}")
        trace = engine.run(prompt, routers, dataclasses.replace(config, threshold=t))
        ids = [s.token_id for s in trace.generated_steps]
        same = next((j for j, (a, b) in enumerate(zip(full_ids, ids)) if a != b), min(len(full_ids), len(ids)))
        rows.append(dict(method=label, threshold=t, speedup=trace.decode_tokens_per_second() / f_tps, agreement=same / max(1, len(full_ids)), skip_rate=trace.skip_rate(), kv_policy=kv_policy))
    df = pd.DataFrame(rows)
    return plots.tradeoff_curve(df, quality="agreement"), df.round(3), _status("ok", "Sweep done: agreement = share of the full model's greedy tokens reproduced before the first difference.")
