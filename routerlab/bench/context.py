"""`bench context`: where skipping pays, speedup against context length, with the ideal and the quality cost beside it;
and the shipped router sets' quality on long held-out documents beside the short example prompts'.

At each context (a prompt of about N tokens: the shipped long documents, core/base/documents.py, joined and cut to length,
then a task), the full model and the default attention-token set at each threshold under each KV policy decode the
same NEW_TOKENS tokens (greedy, end of text ignored) side by side in lockstep (core/serve/lockstep.py: every run's k-th token
in the same round), quality off. A run's speedup is the median over rounds of the full model's step seconds over its
own in the same round (paired, so a noisy machine slows both alike). The ideal speedup is what removing exactly the
skipped cells' measured cost would give (core.decode.costs: `cost_line`, measured once, at the run's mean context). Quality
(mean KL to the full model, top-1 agreement) is the app's quality meter with a chunk longer than the run: it only keeps
each token's routed logits (a copy) while the run decodes, and scores them all after the last timed step (the final
flush), so no full-depth pass enters the timing and the runs are not decoded twice.

The sets' part: every shipped set (assets/routers) at its own threshold and KV policy, teacher-forced on the full
model's greedy answer (tuning.evaluate.evaluate_examples, one forward each) for the long documents and for the short
example prompts (assets/prompts.json). No set was trained or calibrated on the long documents.

Knows nothing about the UI.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from routerlab.core.base.config import GenerateConfig
from routerlab.core.base.documents import cut_to_tokens, load_documents
from routerlab.core.base.paths import ASSETS
from routerlab.core.decode.costs import cost_line, ideal_speedup
from routerlab.core.decode.engine import Control, Engine
from routerlab.core.model.models import load_model
from routerlab.core.serve.lockstep import lockstep

CONTEXTS = (128, 512, 1024, 2048, 4096)
QUICK_CONTEXTS = (128, 512)
THRESHOLDS = (0.5, 0.7)
POLICIES = ("kv", "drop")
NEW_TOKENS = 64
ANSWER_TOKENS = 32  # the full model's greedy answer the sets are teacher-forced on
TASK = "Summarise the text above in three sentences."
ROUTERS = ASSETS / "routers"
DEFAULT_SET = "attention-token"
OUT = ASSETS / "bench" / "context.json"
COMMAND = "python -m routerlab bench context --save assets/bench/context.json"


def _config(new_tokens: int, threshold: float = 0.5, policy: str = "kv", quality: bool = False) -> GenerateConfig:
    # quality: one chunk longer than the run and no refresh, so the meter scores only at the flush, after every timed step
    return GenerateConfig(max_new_tokens=new_tokens, threshold=threshold, kv_policy=policy, ignore_eos=True, quality=quality,
                          quality_chunk=new_tokens + 1, quality_refresh=None, max_new_tokens_cap=max(4096, new_tokens))


def _runs(engine: Engine, ids: list[int], routers, cases, new_tokens: int, quality: bool) -> list:
    """Each case (threshold, policy; None: the full model) decoded in lockstep; their traces."""
    controls, its = [], []
    for case in cases:
        t, p = case if case else (0.5, "kv")
        control = Control(t)
        its.append(engine.generate_ids(ids, routers if case else None, _config(new_tokens, t, p, quality), control))
        controls.append(control)
    lockstep(its)
    return [c.trace for c in controls]


def _step_seconds(trace) -> list[float]:
    return [s.seconds for s in trace.generated_steps if s.seconds > 0]


def context_point(engine: Engine, ids: list[int], routers, cases, costs: dict, new_tokens: int) -> dict:
    """One context: the full model's tokens/s, and each case's speedup, ideal speedup, skip rate and quality cost."""
    timed = _runs(engine, ids, routers, [None, *cases], new_tokens, quality=True)  # scored at each run's end (_config)
    full = _step_seconds(timed[0])
    context = len(ids) + new_tokens / 2
    rows = []
    for (t, p), trace in zip(cases, timed[1:]):
        mine = _step_seconds(trace)
        decoded = [s for s in trace.generated_steps if s.seconds > 0]
        cells = sum(s.skipped for s in decoded) / max(1, len(decoded))
        rows.append({
            "threshold": t, "kv_policy": p,
            "tokens_per_second": len(mine) / sum(mine),
            "speedup": statistics.median(f / m for f, m in zip(full, mine)),
            "ideal_speedup": ideal_speedup(costs, cells, p, context=context),
            "skip_rate": trace.skip_rate(), "skipped_cells_per_token": cells,
            "mean_kl": trace.mean_kl(), "agreement": trace.agreement(),
            "quality_seconds_while_timed": trace.meta.get("quality_seconds_in_steps", 0.0),  # 0: no scoring inside a step
        })
    return {"context": len(ids), "full_tokens_per_second": len(full) / sum(full),
            "prefill_seconds": timed[0].meta.get("prefill_seconds"), "runs": rows}


def _answered(engine: Engine, prompt: str, tokens: int) -> SimpleNamespace:
    """An example for evaluate_examples: the prompt (chat template) and the full model's greedy answer."""
    ids = engine.encode(prompt, GenerateConfig())
    control = Control()
    for _ in engine.generate_ids(ids, None, _config(tokens), control):
        pass
    return SimpleNamespace(ids=ids + [s.token_id for s in control.trace.generated_steps], start=len(ids))


def sets_quality(engine: Engine, long_prompts: list[str], short_prompts: list[str], log=print) -> list[dict]:
    """Every shipped set at its own threshold and KV policy: KL, agreement and skip rates on the long documents and on
    the short prompts, teacher-forced on the full model's greedy answers."""
    from routerlab.tuning.checkpoint import load_routers
    from routerlab.tuning.evaluate import evaluate_examples, full_depth

    groups = {}
    for name, prompts in (("long", long_prompts), ("short", short_prompts)):
        examples = [_answered(engine, p, ANSWER_TOKENS) for p in prompts]
        with torch.inference_mode():
            groups[name] = (examples, full_depth(engine.anatomy, examples))
        log(f"  {name}: {len(examples)} prompts, {sum(e.start for e in examples)} prompt tokens")
    rows = []
    for folder in sorted(p for p in ROUTERS.iterdir() if (p / "router.json").is_file()):
        routers, meta = load_routers(folder, engine.model)
        t, p = float(meta.get("threshold", 0.5)), meta.get("kv_policy", "kv")
        row = {"set": folder.name, "threshold": t, "kv_policy": p}
        for name, (examples, full) in groups.items():
            with torch.inference_mode():
                r = evaluate_examples(engine.anatomy, examples, routers, t, p, full)
            row[name] = {k: r[k] for k in ("kl_full", "agreement", "skip_rate", "skip_rate_prompt", "tokens", "examples")}
            row[name]["prompt_tokens"] = sum(e.start for e in examples)
        log(f"  {folder.name}: long KL {row['long']['kl_full']:.3f} skip {row['long']['skip_rate']:.1%}; "
            f"short KL {row['short']['kl_full']:.3f} skip {row['short']['skip_rate']:.1%}")
        rows.append(row)
    return rows


def context_benchmark(model_spec: str | None = None, contexts=CONTEXTS, thresholds=THRESHOLDS, policies=POLICIES,
                      new_tokens: int = NEW_TOKENS, sets: bool = True, quick: bool = False, threads: int | None = None,
                      log=print) -> dict:
    from routerlab.bench.speed import cpu_model
    from routerlab.tuning.checkpoint import load_routers
    from routerlab.ui.state.resources import load_prompts

    start, load = time.perf_counter(), os.getloadavg()[0]  # others sharing the cores show here
    if threads:
        torch.set_num_threads(threads)
    loaded = load_model(model_spec)
    engine = Engine.from_loaded(loaded)
    docs = load_documents()
    if not docs:
        raise FileNotFoundError("no long documents in assets/documents")
    routers, meta = load_routers(ROUTERS / DEFAULT_SET, engine.model)
    encode = lambda text: engine.encode(text, GenerateConfig())  # noqa: E731
    contexts = [c for c in contexts if c + new_tokens <= engine.max_context]
    log(f"costs at 128 and 2048 cached tokens ...")
    costs = cost_line(engine, encode(docs[0].prompt), (128, 2048), repeat=10)
    cases = [(t, p) for t in thresholds for p in policies]
    points = []
    for ctx in contexts:
        ids = encode(cut_to_tokens(docs, ctx, encode, TASK))
        point = context_point(engine, ids, routers, cases, costs, new_tokens)
        points.append(point)
        log(f"context {point['context']}: full {point['full_tokens_per_second']:.1f} tok/s; " + "; ".join(
            f"{r['threshold']} {r['kv_policy']} {r['speedup']:.2f}x (ideal {r['ideal_speedup']:.2f}x, skip {r['skip_rate']:.0%}, "
            f"KL {r['mean_kl']:.3f})" for r in point["runs"]))
    result = {
        "model": loaded.name, "device": cpu_model(), "machine": platform.machine(), "threads": torch.get_num_threads(),
        "precision": engine.precision, "weights": engine.weights, "routers": DEFAULT_SET, "task": TASK,
        "new_tokens": new_tokens, "thresholds": list(thresholds), "policies": list(policies), "quick": quick,
        "costs": costs, "points": points,
        "command": COMMAND + (" --quick" if quick else ""),
    }
    if sets:
        log("shipped sets on long documents and short prompts ...")
        long_prompts = [d.prompt for d in docs][: 1 if quick else None]
        short_prompts = load_prompts()[: 2 if quick else None]
        result["sets"] = sets_quality(engine, long_prompts, short_prompts, log)
        result["sets_answer_tokens"] = ANSWER_TOKENS
    result["seconds"] = time.perf_counter() - start
    result["loadavg_before"], result["loadavg_after"] = load, os.getloadavg()[0]
    return result


def format_context(r: dict) -> str:
    lines = [f"{r['model']} on {r['device']}, {r['threads']} threads; {r['routers']} routers; {r['new_tokens']} new tokens, lockstep"]
    for p in r["points"]:
        lines.append(f"context {p['context']:5d}: full {p['full_tokens_per_second']:6.1f} tok/s")
        for x in p["runs"]:
            lines.append(f"   {x['threshold']:.2f} {x['kv_policy']:4s} speedup {x['speedup']:.2f}x  ideal {x['ideal_speedup']:.2f}x  "
                         f"skip {x['skip_rate']:5.1%}  KL {x['mean_kl']:.3f}  agreement {x['agreement']:.0%}")
    for s in r.get("sets", []):
        lines.append(f"{s['set']:20s} t={s['threshold']:.2f} {s['kv_policy']}: long KL {s['long']['kl_full']:.3f} agree "
                     f"{s['long']['agreement']:.0%} skip {s['long']['skip_rate']:.1%} | short KL {s['short']['kl_full']:.3f} agree "
                     f"{s['short']['agreement']:.0%} skip {s['short']['skip_rate']:.1%}")
    lines.append(f"{r['seconds']:.0f} s")
    return "\n".join(lines)


def save(result: dict, path: Path = OUT) -> None:
    Path(path).write_text(json.dumps(result, indent=1) + "\n")
