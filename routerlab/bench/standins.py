"""`bench standins`: router sets with and without skip stand-ins, compared at equal skip rates.

For each router set and each held-out file, the threshold that skips a given share of *all* the
target's cells (every layer, response tokens) is taken from the routers' own scores on those
examples (a quantile, as `evaluate.thresholds_for_skips`), evaluated with real skipping (`kv`), and
moved once more when the measured share is off by more than 15% of the target (a set with
stand-ins changes the hidden states its later routers score). Each point reports the measured share,
KL to the full model, perplexity rise and agreement, the decode step time the skipped cells save
per token (measured cost model, the stand-ins' own cost taken off) and the set's training time
from its report.json.

Knows nothing about the UI or training.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from routerlab.core.base.config import RoutingConfig
from routerlab.core.base.errors import RouterLabError
from routerlab.core.decode.costs import cost_breakdown, ideal_speedup, saved_per_cell, standin_seconds
from routerlab.core.decode.engine import Engine
from routerlab.tuning.evaluate import evaluate_examples, full_depth, response_scores, score_quantile

RATES = (0.05, 0.1, 0.2, 0.3)  # shares of all the target's cells (every layer)
TOLERANCE = 0.15  # relative miss of the target share that triggers one corrected threshold


def _training(folder: Path) -> dict:
    report = folder / "report.json"
    if not report.is_file():
        return {}
    r = json.loads(report.read_text())
    return {"train_seconds": r.get("seconds"), "steps": r.get("steps"), "standin_rank": r.get("standin_rank", 0),
            "train_target": (r.get("config") or {}).get("target")}


def _at_share(anatomy, examples, routers, scores, full, share: float, log) -> dict:
    """Evaluate `routers` at the threshold that skips about `share` of all the target's cells
    (`scores`: the routers' sorted full-depth scores of the examples' routed response cells)."""
    n, routed = anatomy.n_layers, len(routers.config.layers)
    frac = min(0.999, share * n / routed)  # the same share of the routed cells
    r = evaluate_examples(anatomy, examples, routers, score_quantile(scores, frac), "kv", full)
    got = r["skip_rate_all_layers"]
    if got > 0 and abs(got - share) > TOLERANCE * share:  # one secant step on the quantile
        second = evaluate_examples(anatomy, examples, routers, score_quantile(scores, min(0.999, frac * share / got)), "kv", full)
        if abs(second["skip_rate_all_layers"] - share) < abs(got - share):
            r = second
    log(f"  share {share:.0%}: threshold {r['threshold']:.4f} skipped {r['skip_rate_all_layers']:.2%} of all cells, "
        f"KL {r['kl_full']:.4f}, perplexity {r['perplexity_increase']:+.2%}")
    return r


def _saving(costs: dict, standin_cost: dict, row: dict, n_layers: int) -> dict:
    """A row's decode-step figures under `costs`: ms saved per token, the full step, the ideal speedup."""
    target = RoutingConfig.from_granularity(row["granularity"]).target  # the routed sub-layer
    cells = row["skip_rate_all_layers"] * n_layers  # skipped cells per decode token
    per_cell_standin = standin_cost.get(row["standin_rank"], 0.0)
    saved = cells * saved_per_cell(costs, "kv", target, per_cell_standin)
    return {"target": target, "step_ms_saved": 1e3 * saved, "step_ms": 1e3 * costs["step"],
            "ideal_speedup": ideal_speedup(costs, cells, "kv", target, per_cell_standin)}


def recost(result: dict, costs: dict, n_layers: int, hidden_size: int, source: str) -> dict:
    """`result` with every row's decode-step figures taken from `costs` (e.g. a quiet `bench speed` run's
    `cost_seconds`) and the stand-ins' cost timed again here; the quality figures are untouched."""
    ranks = sorted({r["standin_rank"] for r in result["rows"] if r["standin_rank"]})
    standin_cost = {r: standin_seconds(hidden_size, r) for r in ranks}
    rows = [{**r, **_saving(costs, standin_cost, r, n_layers)} for r in result["rows"]]
    return {**result, "costs": costs, "costs_source": source, "rows": rows, "n_layers": n_layers, "hidden_size": hidden_size,
            "standin_seconds": {str(k): v for k, v in standin_cost.items()}}


def standins_benchmark(loaded, sets: list[tuple[str, Path, object]], datasets: dict[str, list], *, rates=RATES,
                       costs: dict | None = None, log=print) -> dict:
    """sets: (name, folder, RouterSet); datasets: name -> encoded held-out examples. One JSON-able dict.

    `costs`: the cost model to use (`cost_breakdown` figures, e.g. from a quiet `bench speed` run);
    None measures it here first."""
    engine = Engine.from_loaded(loaded)
    an = engine.anatomy
    t0 = time.perf_counter()
    source = "given"
    if costs is None:
        ids = loaded.tokenizer("The quick brown fox jumps over the lazy dog. " * 8)["input_ids"]
        costs, source = cost_breakdown(engine, ids, context=256, repeat=20), "measured in this run"
    log(f"costs per decode token: step {1e3 * costs['step']:.1f} ms, attention {1e3 * costs['attention_full']:.2f} ms "
        f"(kv only {1e3 * costs['attention_kv_only']:.2f}), MLP {1e3 * costs['mlp']:.2f} ms per layer")
    ranks = sorted({rs.standin_rank for _, _, rs in sets if rs.standin_rank})
    standin_cost = {r: standin_seconds(an.hidden_size, r) for r in ranks}
    rows = []
    for data_name, examples in datasets.items():
        log(f"{data_name}: {len(examples)} examples, full depth")
        full = full_depth(an, examples)
        for name, folder, routers in sets:
            target = routers.config.target
            rank = routers.standin_rank
            log(f"{name} ({routers.granularity}, stand-in rank {rank or '-'})")
            scores = response_scores(an, routers, examples)
            for share in rates:
                r = _at_share(an, examples, routers, scores, full, share, log)
                row = {
                    "data": data_name, "set": name, "folder": str(folder), "granularity": routers.granularity,
                    "target": target, "standin_rank": rank, "share_target": share,
                    "skip_rate_all_layers": r["skip_rate_all_layers"], "threshold": r["threshold"],
                    "kl_full": r["kl_full"], "perplexity_increase": r["perplexity_increase"], "agreement": r["agreement"],
                    "tokens": r["tokens"], **_training(Path(folder)),
                }
                rows.append({**row, **_saving(costs, standin_cost, row, an.n_layers)})
    return {"model": loaded.name, "dtype": str(next(loaded.model.parameters()).dtype).replace("torch.", ""),
            "hidden_size": an.hidden_size, "n_layers": an.n_layers, "costs": costs, "costs_source": source,
            "standin_seconds": {str(k): v for k, v in standin_cost.items()}, "rates": list(rates),
            "seconds": round(time.perf_counter() - t0, 1), "rows": rows}


def merge(old: dict | None, new: dict) -> dict:
    """`new` with the rows of `old` that it did not measure again (another set or data file) kept, sets in first-seen order."""
    if not old or not isinstance(old.get("rows"), list):
        return new
    fresh = {(r["data"], r["set"]) for r in new["rows"]}
    rows = [r for r in old["rows"] if (r.get("data"), r.get("set")) not in fresh] + new["rows"]
    order = list(dict.fromkeys(r["set"] for r in rows))
    data = list(dict.fromkeys(r["data"] for r in rows))
    rows.sort(key=lambda r: (data.index(r["data"]), order.index(r["set"]), r["share_target"]))
    return {**new, "standin_seconds": {**old.get("standin_seconds", {}), **new["standin_seconds"]}, "rows": rows,
            "runs": old.get("runs", 1) + 1}


def format_standins(result: dict) -> str:
    """The table: one line per (data, set, share)."""
    lines = [f"{result['model']} ({result['dtype']}); decode step {1e3 * result['costs']['step']:.1f} ms; "
             f"stand-in cost per cell: " + (", ".join(f"rank {k} {1e6 * v:.0f} us" for k, v in result["standin_seconds"].items()) or "-"),
             "", "| data | set | stand-in | target share | skipped | KL | perplexity | agreement | step saved | ideal | trained |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        trained = f"{r['train_seconds'] / 60:.1f} min" if r.get("train_seconds") else "-"
        lines.append(f"| {r['data']} | {r['set']} | {r['standin_rank'] or '-'} | {r['share_target']:.0%} | "
                     f"{r['skip_rate_all_layers']:.1%} | {r['kl_full']:.3f} | {r['perplexity_increase']:+.1%} | "
                     f"{r['agreement']:.1%} | {r['step_ms_saved']:.2f} ms | {r['ideal_speedup']:.3f}x | {trained} |")
    return "\n".join(lines)


def parse_sets(text: str) -> list[tuple[str, Path]]:
    """'name=folder,name=folder' or 'folder,folder' (the folder's name names it)."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, _, folder = part.rpartition("=")
        folder = Path(folder)
        if not folder.is_dir():
            raise RouterLabError(f"--sets: {folder} is not a folder.", "Give router checkpoint folders, e.g. assets/routers/mlp-token.")
        out.append((name or folder.name, folder))
    if not out:
        raise RouterLabError("--sets names no router folder.", "For example --sets assets/routers/mlp-token,runs/mlp-token-r64.")
    return out
