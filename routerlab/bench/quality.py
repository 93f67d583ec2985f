"""`bench quality`: what the per-token quality cost costs, decode tokens/s with it on vs off, side by side.

The same prompt and routers decode with quality off and with quality on at several chunk sizes,
one whole run after another in the same process, the order rotating every round; each round
gives a ratio per chunk size against that round's run with quality off, and the report gives
medians. A run's decode time is the wall time spent inside the engine's iterator after the
routed prefill: every routed decode step, every full-depth chunk (the full model's pass over the
prompt included) and the final flush, so nothing the quality pass costs is left out.

Rows: quality off; quality on at each chunk size, scored in full chunks only (as `generate` does:
nobody watches live); and "streaming", the default chunk plus the 2 s refresh the app uses, where
a token waits 2 s for its score, or 4x the last chunk's scoring time where that is longer (the
meter's budget), so on a slow machine chunks are cut short but not below that floor.

Whole runs, not lockstep (one token of each run in turn, as `bench speed` does): under the 2 s
refresh, interleaving N runs would cut every run's chunks to a 1/N share and measure a cost a
single streaming run never pays.

Knows nothing about the UI or training; reads the shipped routers through tuning.checkpoint.
"""

from __future__ import annotations

import platform
import statistics
import sys
import time

import torch

from routerlab.core.base.config import GenerateConfig
from routerlab.core.base.precision import describe
from routerlab.core.decode.engine import Control, Engine
from routerlab.core.model.models import load_model
from routerlab.core.records.quality import CHUNK, REFRESH_SECONDS
from routerlab.core.serve.lockstep import in_turn

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def timed_run(engine: Engine, ids: list[int], routers, defaults: dict, new_tokens: int, chunk: int | None,
              refresh: float | None = None) -> dict:
    """One generation of `new_tokens` (quality off when `chunk` is None); its decode time and quality figures."""
    config = GenerateConfig(max_new_tokens=new_tokens, threshold=defaults["threshold"], kv_policy=defaults["kv_policy"],
                            ignore_eos=True, quality=chunk is not None, quality_chunk=chunk or 1, quality_refresh=refresh,
                            max_new_tokens_cap=max(4096, new_tokens))
    control = Control(config.threshold)
    it = engine.generate_ids(ids, routers, config, control)
    for _ in ids:  # the routed prefill and the prompt's steps: not decode time
        next(it)
    t0 = time.perf_counter()
    for _ in it:  # the last call also runs the final flush of quality on
        pass
    seconds = time.perf_counter() - t0
    trace = control.trace
    n = len(trace.generated_steps)
    chunks = trace.meta.get("quality_chunks", 0)
    return {"tokens": n, "decode_seconds": seconds, "tokens_per_second": n / seconds,
            "quality_seconds": trace.meta.get("quality_seconds", 0.0), "quality_chunks": chunks,
            "mean_kl": trace.mean_kl(), "agreement": trace.agreement(), "skip_rate": trace.skip_rate(),
            "text": trace.text}


def quality_benchmark(model: str | None = None, *, granularity: str = "attention-token", prompt: str | None = None,
                      new_tokens: int = 128, chunks: tuple[int, ...] = (16, 32, 64), rounds: int = 5,
                      threads: int | None = None, dtype: str = "auto", log=None) -> dict:
    """Medians over `rounds` of decode tokens/s with quality off and on at each chunk size, and their ratios."""
    from routerlab.tuning.checkpoint import resolve_routers

    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    if threads:
        torch.set_num_threads(threads)
    loaded = load_model(model, dtype=dtype)
    routers, defaults = resolve_routers(None, granularity, loaded.model)
    engine = Engine.from_loaded(loaded)
    prompt = prompt or PROMPT
    ids = engine.encode(prompt, GenerateConfig())
    # name -> (chunk, refresh seconds)
    configs = {"off": (None, None), **{f"chunk {c}": (c, None) for c in chunks}, "streaming": (CHUNK, REFRESH_SECONDS)}
    names = list(configs)
    timed_run(engine, ids, routers, defaults, 8, chunks[0])  # warm-up: first-call allocations, lazy inits
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for r in range(rounds):
        for name in in_turn(names, r):  # rotate, so no configuration always runs first or after another
            runs[name].append(timed_run(engine, ids, routers, defaults, new_tokens, *configs[name]))
        log(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {runs[n][-1]['tokens_per_second']:.2f} tok/s" for n in names))
    rows = {}
    for name, (chunk, refresh) in configs.items():
        per = runs[name]
        ratios = [on["tokens_per_second"] / off["tokens_per_second"] for on, off in zip(per, runs["off"])]
        rows[name] = {
            "chunk": chunk,
            "refresh_seconds": refresh,
            "tokens_per_second": statistics.median(p["tokens_per_second"] for p in per),
            "rate_vs_off": statistics.median(ratios),  # median of per-round ratios: 1 - this is the slowdown
            "slowdown": 1.0 - statistics.median(ratios),
            "quality_seconds_per_token": statistics.median(p["quality_seconds"] / p["tokens"] for p in per),
            # The same slowdown measured inside each run: the share of its decode time the meter took. It
            # needs no second run, so a shared machine's slow spells between runs do not enter it.
            "quality_share": statistics.median(p["quality_seconds"] / p["decode_seconds"] for p in per),
            "tokens_per_chunk": statistics.median(p["tokens"] / p["quality_chunks"] if p["quality_chunks"] else 0.0
                                                  for p in per),
            "mean_kl": per[-1]["mean_kl"],
            "agreement": per[-1]["agreement"],
            "skip_rate": per[-1]["skip_rate"],
        }
    return {
        "conditions": {
            "model": loaded.name, "device": str(engine.device), "dtype": describe(engine.dtype, str(engine.device)),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "machine": platform.machine(),
            "routers": defaults.get("source"), "granularity": granularity, "threshold": defaults["threshold"],
            "kv_policy": defaults["kv_policy"], "prompt": prompt, "prompt_tokens": len(ids), "new_tokens": new_tokens,
            "rounds": rounds, "method": "whole runs one after another, order rotating each round; decode = iterator "
                                        "wall time after the routed prefill, final quality flush included; medians "
                                        "of per-round ratios to the round's run with quality off",
        },
        "same_text_every_run": len({p["text"] for per in runs.values() for p in per}) == 1,  # quality never changes the text
        "rows": rows,
    }


def format_quality(result: dict) -> str:
    c = result["conditions"]
    lines = [f"{c['model']} on {c['device']} ({c['dtype']}, {c['threads']} threads), {c['granularity']} at threshold "
             f"{c['threshold']:.4g}, {c['prompt_tokens']}-token prompt, {c['new_tokens']} new tokens, {c['rounds']} "
             f"rounds of whole runs (medians)",
             f"{'quality':<10} {'tok/s':>7} {'vs off':>7} {'slowdown':>9} {'in-run share':>13} {'ms/token in quality':>20} "
             f"{'tokens/chunk':>13} {'mean KL':>8} {'agree':>6}"]
    for name, r in result["rows"].items():
        kl = "" if r["mean_kl"] is None else f"{r['mean_kl']:.4f}"
        agree = "" if r["agreement"] is None else f"{r['agreement']:.1%}"
        per_chunk = f"{r['tokens_per_chunk']:.1f}" if r["chunk"] else ""
        lines.append(f"{name:<10} {r['tokens_per_second']:>7.2f} {r['rate_vs_off']:>6.2f}x {r['slowdown']:>8.1%} "
                     f"{r['quality_share']:>12.1%} {1000 * r['quality_seconds_per_token']:>20.2f} {per_chunk:>13} "
                     f"{kl:>8} {agree:>6}")
    lines.append("slowdown: 1 - tok/s on / tok/s off, median of per-round ratios; in-run share: the share of each "
                 "run's decode time spent scoring (the same slowdown, measured within one run)")
    lines.append("same text in every run: " + ("yes" if result["same_text_every_run"] else "NO"))
    return "\n".join(lines)
