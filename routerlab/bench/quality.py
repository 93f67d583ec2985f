"""`bench quality`: what the per-token quality cost costs, decode tokens/s with it on vs off, side by side.

The same prompt and routers decode with quality off and with quality on at several chunk sizes,
all in lockstep (one token each in turn, the order rotating every token), so a slow spell of a
noisy machine falls on all of them alike; each round gives a ratio per chunk size, and the report
gives medians. A run's decode time is the wall time spent inside the engine's iterator after the
routed prefill: every routed decode step, every full-depth chunk (the full model's pass over the
prompt included) and the final flush, so nothing the quality pass costs is left out.

Knows nothing about the UI or training; reads the shipped routers through tuning.checkpoint.
"""

from __future__ import annotations

import platform
import statistics
import time

import torch

from routerlab.core.config import GenerateConfig
from routerlab.core.engine import Control, Engine
from routerlab.core.models import load_model

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def _start(engine: Engine, ids: list[int], routers, defaults: dict, new_tokens: int, chunk: int | None):
    config = GenerateConfig(max_new_tokens=new_tokens, threshold=defaults["threshold"], kv_policy=defaults["kv_policy"],
                            ignore_eos=True, quality=chunk is not None, quality_chunk=chunk or 1,
                            max_new_tokens_cap=max(4096, new_tokens))
    control = Control(config.threshold)
    return engine.generate_ids(ids, routers, config, control), control


def _lockstep(engine: Engine, ids: list[int], routers, defaults: dict, new_tokens: int, chunks: dict,
              turn: int) -> dict[str, dict]:
    """Decode every configuration at once, one token each in turn; time each one's iterator calls."""
    running = {name: _start(engine, ids, routers, defaults, new_tokens, c) for name, c in chunks.items()}
    for it, _ in running.values():  # the routed prefill and the prompt's steps: not decode time
        for _ in ids:
            next(it)
    decode = {name: 0.0 for name in running}
    names, live, tick = list(running), set(running), turn
    while live:
        k = tick % len(names)
        for name in names[k:] + names[:k]:
            if name in live:
                t0 = time.perf_counter()
                step = next(running[name][0], None)  # the last call runs the final flush of quality on
                decode[name] += time.perf_counter() - t0
                if step is None:
                    live.discard(name)
        tick += 1
    out = {}
    for name, (_, control) in running.items():
        trace = control.trace
        n = len(trace.generated_steps)
        out[name] = {"tokens": n, "decode_seconds": decode[name], "tokens_per_second": n / decode[name],
                     "quality_seconds": trace.meta.get("quality_seconds", 0.0), "mean_kl": trace.mean_kl(),
                     "agreement": trace.agreement(), "skip_rate": trace.skip_rate(),
                     "text": trace.text}
    return out


def quality_benchmark(model: str | None = None, *, granularity: str = "attention-token", prompt: str | None = None,
                      new_tokens: int = 128, chunks: tuple[int, ...] = (4, 8, 16, 32), rounds: int = 3,
                      threads: int | None = None, log=print) -> dict:
    """Medians over `rounds` of decode tokens/s with quality off and on at each chunk size, and their ratios."""
    from routerlab.tuning.checkpoint import resolve_routers

    if threads:
        torch.set_num_threads(threads)
    loaded = load_model(model)
    routers, defaults = resolve_routers(None, granularity, loaded.model)
    engine = Engine(loaded.model, loaded.tokenizer, loaded.name)
    prompt = prompt or PROMPT
    ids = engine.encode(prompt, GenerateConfig())
    configs = {"off": None, **{f"chunk {c}": c for c in chunks}}
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for r in range(rounds):
        for name, summary in _lockstep(engine, ids, routers, defaults, new_tokens, configs, r).items():
            runs[name].append(summary)
        log(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {runs[n][-1]['tokens_per_second']:.1f} tok/s" for n in configs))
    rows = {}
    for name, chunk in configs.items():
        per = runs[name]
        ratios = [on["tokens_per_second"] / off["tokens_per_second"] for on, off in zip(per, runs["off"])]
        rows[name] = {
            "chunk": chunk,
            "tokens_per_second": statistics.median(p["tokens_per_second"] for p in per),
            "rate_vs_off": statistics.median(ratios),  # per-round ratio, median: 1 - this is the slowdown
            "slowdown": 1.0 - statistics.median(ratios),
            "quality_seconds_per_token": statistics.median(p["quality_seconds"] / p["tokens"] for p in per),
            "mean_kl": per[-1]["mean_kl"],
            "agreement": per[-1]["agreement"],
            "skip_rate": per[-1]["skip_rate"],
        }
    same_text = len({p["text"] for per in runs.values() for p in per}) == 1
    return {
        "conditions": {
            "model": loaded.name, "device": str(engine.device), "dtype": str(engine.dtype).replace("torch.", ""),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "machine": platform.machine(),
            "routers": defaults.get("source"), "granularity": granularity, "threshold": defaults["threshold"],
            "kv_policy": defaults["kv_policy"], "prompt": prompt, "prompt_tokens": len(ids), "new_tokens": new_tokens,
            "rounds": rounds, "method": "lockstep, order rotating every token; decode = iterator wall time after "
                                        "the routed prefill, final quality flush included; medians of per-round ratios",
        },
        "same_text_every_run": same_text,  # quality never changes what is generated
        "rows": rows,
    }


def format_quality(result: dict) -> str:
    c = result["conditions"]
    lines = [f"{c['model']} on {c['device']} ({c['dtype']}, {c['threads']} threads), {c['granularity']} at threshold "
             f"{c['threshold']:.4g}, {c['prompt_tokens']}-token prompt, {c['new_tokens']} new tokens, {c['rounds']} rounds "
             f"in lockstep (medians)",
             f"{'quality':<10} {'tok/s':>7} {'vs off':>7} {'slowdown':>9} {'ms/token in quality':>20} {'mean KL':>8} {'agree':>6}"]
    for name, r in result["rows"].items():
        kl = "" if r["mean_kl"] is None else f"{r['mean_kl']:.4f}"
        agree = "" if r["agreement"] is None else f"{r['agreement']:.1%}"
        lines.append(f"{name:<10} {r['tokens_per_second']:>7.1f} {r['rate_vs_off']:>6.2f}x {r['slowdown']:>8.1%} "
                     f"{1000 * r['quality_seconds_per_token']:>20.2f} {kl:>8} {agree:>6}")
    lines.append("same text in every run: " + ("yes" if result["same_text_every_run"] else "NO"))
    return "\n".join(lines)
