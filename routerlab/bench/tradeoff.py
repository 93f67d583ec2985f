"""`bench tradeoff`: the speed/quality curve of tuned routers against baselines, measured on real runs.

Quality (perplexity and greedy agreement with the full model, on held-out data) comes from
`evaluate`; speed comes from real generations through the engine, each configuration timed in
the same round as the full model so every speedup is a side-by-side ratio. Ideal speedups come
from the measured cost of exactly the work each configuration skips (`bench.cost_breakdown`).

Rows (one per method and operating point) go to a CSV; the curve goes to plotly HTML and, when
kaleido and a Chromium are available, a PNG for slides.

Knows nothing about the UI or training.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import statistics
import time
from pathlib import Path

import pandas as pd

from routerlab.bench.speed import cost_breakdown, measure_speed
from routerlab.core.base.paths import ASSETS
from routerlab.core.decode.costs import ideal_speedup
from routerlab.core.decode.engine import Engine
from routerlab.tuning.evaluate import (STATIC_THRESHOLD, RandomRouterSet, evaluate_examples, full_depth, layer_importance,
                       static_order, static_routers, thresholds_for_skips)

COLUMNS = ["method", "granularity", "kv_policy", "threshold", "skip_rate_all_layers", "perplexity", "perplexity_full",
           "perplexity_increase", "agreement", "tokens_per_second", "tokens_per_second_full", "speedup", "ideal_speedup",
           "kv_bytes_saved", "ttft_seconds", "context_tokens"]
# Default operating points, as the share of routed cells skipped (thresholds from score quantiles).
MAIN_SKIPS = (0.02, 0.04, 0.07, 0.1, 0.14, 0.2, 0.3)  # the main curve
TABLE_SKIPS = (0.03, 0.07, 0.12, 0.2)  # each other granularity in the table
CONTEXT_SKIPS = (0.05, 0.1)  # the main routers at longer prompts
OUT = ASSETS / "bench"


def ideal(costs: dict, skip_all: float, n_layers: int, policy: str, target: str) -> float:
    """Speedup if the skipped cells cost exactly their measured sub-layer time and nothing more."""
    return ideal_speedup(costs, skip_all * n_layers, policy, target)


# -- the sweep ---------------------------------------------------------------------------------
def run_tradeoff(loaded, router_sets: dict[str, tuple], examples, *, thresholds=None, prompts_ids=None,
                 new_tokens: int = 48, rounds: int = 2, contexts=(256, 1024, 2048), log=print) -> dict:
    """router_sets: granularity -> (RouterSet, default threshold). The first one is the main curve.

    `thresholds` (for the main curve) default to the quantiles of its scores at MAIN_SKIPS; the
    other granularities are swept at their own TABLE_SKIPS quantiles."""
    model, tok = loaded.model, loaded.tokenizer
    engine = Engine.from_loaded(loaded)
    an = engine.anatomy
    n = an.n_layers
    t0 = time.perf_counter()
    full = full_depth(an, examples)
    quality: dict[str, dict] = {}
    speed_configs: dict[str, tuple] = {}
    main = next(iter(router_sets))

    def add(name, method, granularity, policy, threshold, routers, target):
        q = evaluate_examples(an, examples, routers, threshold, policy, full)
        quality[name] = {"method": method, "granularity": granularity, "kv_policy": policy, "threshold": threshold,
                         "target": target, **q}
        speed_configs[name] = (routers, threshold, policy)
        log(f"quality {name}: skip_all {q['skip_rate_all_layers']:.3f} ppl {q['perplexity_routed']:.3f} "
            f"({q['perplexity_increase']:+.2%}) agreement {q['agreement']:.3f}")
        return q

    routers, _ = router_sets[main]
    target = routers.config.target
    thresholds = tuple(dict.fromkeys(thresholds or thresholds_for_skips(an, routers, examples, MAIN_SKIPS)))
    tuned_rates = []
    for t in thresholds:
        tuned_rates.append(add(f"tuned-kv@{t}", "tuned", main, "kv", t, routers, target)["skip_rate_all_layers"])
        add(f"tuned-drop@{t}", "tuned-drop", main, "drop", t, routers, target)
    mid = thresholds[len(thresholds) // 2]
    add(f"mask@{mid}", "official-mask", main, "mask", mid, routers, target)
    importance = layer_importance(an, examples, target)
    order = static_order(importance)
    for rate in sorted({round(r, 3) for r in tuned_rates if 0 < r < 0.9}):
        p = min(1.0, rate * n / len(routers.config.layers))
        add(f"random@{p:.3f}", "random", main, "kv", p, RandomRouterSet(routers.config, n, an.hidden_size, seed=0), target)
        k = max(1, int(round(rate * n)))
        if f"static@{k}" not in quality:
            add(f"static@{k}", "static", main, "drop", STATIC_THRESHOLD, static_routers(order, k, target, n, an.hidden_size), target)
    for g, (rs, _) in list(router_sets.items())[1:]:
        for t in dict.fromkeys(thresholds_for_skips(an, rs, examples, TABLE_SKIPS)):
            add(f"{g}@{t}", "tuned", g, "kv", t, rs, rs.config.target)

    prompts_ids = prompts_ids or [list(ex.ids[: ex.start]) for ex in examples[:2]]
    log(f"timing {len(speed_configs) + 1} configurations x {len(prompts_ids)} prompts x {rounds} rounds ...")
    speed = measure_speed(engine, prompts_ids, speed_configs, new_tokens, rounds, log)
    context = int(statistics.mean(len(p) for p in prompts_ids)) + new_tokens // 2
    costs = cost_breakdown(engine, prompts_ids[0], context)
    rows = [_row(q, speed[name], costs, n, context) for name, q in quality.items()]
    full_q = quality[next(iter(quality))]
    rows.append(_full_row(full_q, speed["full"], context))
    result = {"model": loaded.name, "rows": rows, "costs": costs, "importance": importance,
              "per_layer_skip": {name: quality[name]["skip_rate_per_layer"] for name in quality if name.startswith("tuned-kv@")},
              "examples": len(examples), "tokens": full_q["tokens"], "new_tokens": new_tokens, "rounds": rounds,
              "precision": engine.precision, "weights": engine.weights}
    result["context_scaling"] = context_scaling(engine, main, routers, examples, contexts, new_tokens, rounds, log=log)
    result["seconds"] = time.perf_counter() - t0
    return result


def _row(q: dict, s: dict, costs: dict, n_layers: int, context: int) -> dict:
    """One CSV row: quality `q` (with method, granularity, kv_policy, target) and speed `s` of a configuration."""
    return {
        "method": q["method"], "granularity": q["granularity"], "kv_policy": q["kv_policy"], "threshold": q["threshold"],
        "skip_rate_all_layers": q["skip_rate_all_layers"], "perplexity": q["perplexity_routed"],
        "perplexity_full": q["perplexity_full"], "perplexity_increase": q["perplexity_increase"],
        "agreement": q["agreement"], "tokens_per_second": s["tokens_per_second"],
        "tokens_per_second_full": s["tokens_per_second_full"], "speedup": s["speedup"],
        "ideal_speedup": ideal(costs, s["skip_rate_all_layers_measured"], n_layers, q["kv_policy"], q["target"]),
        "kv_bytes_saved": s["kv_bytes_saved"], "ttft_seconds": s["ttft_seconds"], "context_tokens": context,
    }


def _full_row(q: dict, s: dict, context: int) -> dict:
    return {"method": "full", "granularity": "full", "kv_policy": "-", "threshold": math.nan, "skip_rate_all_layers": 0.0,
            "perplexity": q["perplexity_full"], "perplexity_full": q["perplexity_full"], "perplexity_increase": 0.0,
            "agreement": 1.0, "tokens_per_second": s["tokens_per_second"], "tokens_per_second_full": s["tokens_per_second"],
            "speedup": 1.0, "ideal_speedup": 1.0, "kv_bytes_saved": 0.0, "ttft_seconds": s["ttft_seconds"],
            "context_tokens": context}


def long_examples(examples, tokens: int, n: int) -> list:
    """`n` examples whose prompt holds about `tokens` tokens: each held-out example, preceded by
    other held-out examples whole (prompt and answer, one chat after another). Quality and speed
    at long context, from held-out data only."""
    from routerlab.tuning.data import Example

    out = []
    for k in range(min(n, len(examples))):
        prefix: list[int] = []
        j = k + 1
        while j < k + len(examples) and len(prefix) + len(examples[j % len(examples)].ids) <= tokens - examples[k].start:
            prefix += examples[j % len(examples)].ids
            j += 1
        ex = examples[k]
        out.append(Example(tuple(prefix) + ex.ids, len(prefix) + ex.start))
    return out


def context_scaling(engine: Engine, granularity: str, routers, examples, contexts, new_tokens: int, rounds: int,
                    skips=CONTEXT_SKIPS, n_examples: int = 4, log=print) -> list[dict]:
    """Rows (the CSV's columns) of the tuned routers at longer prompts, where attention costs more:
    quality on held-out chats of about each length, speed measured in lockstep at that length."""
    an = engine.anatomy
    target = routers.config.target
    rows = []
    for c in contexts:
        exs = long_examples(examples, c, n_examples)
        full = full_depth(an, exs)
        quality, configs = {}, {}
        for t in dict.fromkeys(thresholds_for_skips(an, routers, exs, skips)):
            for method, policy in (("tuned", "kv"), ("tuned-drop", "drop")):
                q = evaluate_examples(an, exs, routers, t, policy, full)
                quality[f"{policy}@{t}"] = {"method": method, "granularity": granularity, "kv_policy": policy,
                                            "threshold": t, "target": target, **q}
                configs[f"{policy}@{t}"] = (routers, t, policy)
        prompt = list(exs[0].ids[: exs[0].start])
        speed = measure_speed(engine, [prompt], configs, new_tokens, rounds, log=lambda *_: None)
        context = len(prompt) + new_tokens // 2
        costs = cost_breakdown(engine, prompt, context)
        rows += [_row(q, speed[name], costs, an.n_layers, context) for name, q in quality.items()]
        rows.append(_full_row(next(iter(quality.values())), speed["full"], context))
        for r in rows[-len(quality) - 1: -1]:
            log(f"context {context}: {r['method']} @{r['threshold']}: skip {r['skip_rate_all_layers']:.3f} "
                f"ppl {r['perplexity_increase']:+.2%} speedup {r['speedup']:.3f} (ideal {r['ideal_speedup']:.3f})")
    return rows


# -- outputs -----------------------------------------------------------------------------------
def granularity_table(rows: list[dict], limits=(0.02, 0.05, 0.10)) -> list[dict]:
    """Per granularity (tuned, kv): the best measured speedup and skip rate within each perplexity budget."""
    table = []
    for g in dict.fromkeys(r["granularity"] for r in rows if r["method"] == "tuned"):
        pts = [r for r in rows if r["method"] == "tuned" and r["granularity"] == g]
        entry = {"granularity": g}
        for lim in limits:
            ok = [r for r in pts if r["perplexity_increase"] <= lim]
            best = max(ok, key=lambda r: r["speedup"]) if ok else None
            key = f"{round(lim * 100)}%"
            entry[f"speedup@{key}"] = best["speedup"] if best else None
            entry[f"ideal@{key}"] = best["ideal_speedup"] if best else None
            entry[f"perplexity_increase@{key}"] = best["perplexity_increase"] if best else None
            entry[f"skip@{key}"] = best["skip_rate_all_layers"] if best else None
            entry[f"threshold@{key}"] = best["threshold"] if best else None
        table.append(entry)
    return table


def write_outputs(result: dict, out: Path = OUT, log=print) -> dict[str, Path]:
    from routerlab.ui.figures import tradeoff_plots

    out.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out / "tradeoff.csv", "json": out / "tradeoff.json", "html": out / "tradeoff.html",
             "layers_html": out / "layer_skip.html"}
    with open(paths["csv"], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(result["rows"] + result["context_scaling"])  # context rows: same columns, longer prompts
    result = {**result, "granularity_table": granularity_table(result["rows"])}
    paths["json"].write_text(json.dumps(result, indent=1, default=str))
    from routerlab.bench.results.report import markdown

    paths["md"] = out / "tradeoff.md"
    paths["md"].write_text(markdown(result))
    main = result["rows"][0]["granularity"]
    frame = pd.DataFrame([{**r, "method": r["method"] if r["granularity"] in (main, "full") else f"tuned {r['granularity']}"}
                          for r in result["rows"]])
    curve = tradeoff_plots.tradeoff_curve(frame)
    curve.update_layout(width=1000, height=600)
    curve.write_html(str(paths["html"]), include_plotlyjs="cdn")
    layers = layer_skip_figure(result["per_layer_skip"], result["model"])
    layers.write_html(str(paths["layers_html"]), include_plotlyjs="cdn")
    for name, fig in (("png", curve), ("layers_png", layers)):
        path = out / ("tradeoff.png" if name == "png" else "layer_skip.png")
        if write_png(fig, path, log):
            paths[name] = path
    return paths


def layer_skip_figure(per_layer: dict[str, dict[str, float]], model: str):
    """Skip rate of each routed layer over the held-out data, one line per threshold."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for name, rates in per_layer.items():
        layers = sorted(rates, key=int)
        fig.add_trace(go.Scatter(x=[int(i) for i in layers], y=[100 * rates[i] for i in layers], mode="lines+markers",
                                 name=name.replace("tuned-kv@", "threshold ")))
    fig.update_layout(title=f"{model}: skip rate per layer on held-out data (tuned routers, kv)", template="plotly_white",
                      xaxis_title="layer", yaxis_title="tokens skipping this layer (%)", width=1000, height=500)
    return fig


def write_png(fig, path: Path, log=print) -> bool:
    """PNG via kaleido when it and a Chromium are installed (`make dev`); otherwise say so and skip."""
    try:
        import kaleido  # noqa: F401
    except ImportError:
        log(f"skipping {path.name}: kaleido is not installed (pip install kaleido)")
        return False
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser:
        os.environ.setdefault("BROWSER_PATH", browser)
    try:
        fig.write_image(str(path), width=1000, height=600, scale=2)
        return True
    except Exception as err:  # kaleido raises many types when no browser can start
        log(f"skipping {path.name}: {err}")
        return False
