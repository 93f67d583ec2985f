"""`python -m routerlab.bench.gpu.gpu_check`: the engine, a room, the speed bench and training, run once on one device.

A prepared check for a machine with a GPU (and, in the test suite, for the CPU, so it never rots). It needs none of
gradio, plotly or gguf and downloads nothing: the model is built from a config on the spot (random weights) with
random routers, which skip about half their cells at threshold 0.5, so every path below really skips.

    python -m routerlab.bench.gpu.gpu_check --device cuda --out gpu-check.json      # SmolLM2-135M's shape, ~1-2 min
    python -m routerlab.bench.gpu.gpu_check --device cpu --size tiny                # the test suite's form, seconds

It runs, and writes one JSON of:
  generate   the full model and routed runs under `kv`, `drop` and `mask`, quality on: skip rate, mean KL to the
             full model, decode tokens/s, and the host's waits for the device per decoded token (`syncs_per_token`,
             torch's sync debug mode; 0 on a CPU, where there is nothing to wait for) with where they happen;
  speed      `bench speed`'s lockstep in a short form: never-skip routers, the deeper half of the layers off under
             each policy, and the random routers at 0.5, each against the full model in the same rounds (clocks
             read after the device's queue drained), with the ideal speedup from the measured per-piece costs;
  room       rows with other routers, thresholds and policies in one room, stepped here, against each run alone;
  train      a few Router-Tuning steps (only routers learn; the base stays bit-identical);
  memory     the device's peak allocation.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from routerlab.bench.gpu.syncs import decode_syncs
from routerlab.core.base.config import GenerateConfig, RoutingConfig, default_layers
from routerlab.core.base.device import SyncCounter, choose_device, is_cuda, now, peak_memory_bytes
from routerlab.core.base.precision import dtype_name, resolve_dtype
from routerlab.core.decode.engine import Control, Engine
from routerlab.core.model.models import tiny_model
from routerlab.core.routing.router import RouterSet
from routerlab.core.serve.room import Room

# The embedded model's shape (SmolLM2-135M: 30 layers, hidden 576, 9 query / 3 KV heads), random weights: a step
# costs what the real model's does, with nothing to download.
SMOLLM_SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, max_position_embeddings=4096, tie_word_embeddings=True)
SIZES = {"tiny": {}, "smollm": SMOLLM_SHAPE}
POLICIES = ("kv", "drop", "mask")


def build_engine(size: str, device: str, dtype: str = "auto", seed: int = 0) -> Engine:
    model = tiny_model("llama", seed, **SIZES[size])
    model = model.to(device=device, dtype=resolve_dtype(dtype, device))
    model.requires_grad_(False)
    return Engine(model, name=f"random llama ({size})")


def random_routers(engine: Engine, granularity: str = "attention-token", seed: int = 1, layers=None) -> RouterSet:
    """Routers with random weights, large enough that about half the cells skip at threshold 0.5."""
    layers = tuple(layers) if layers is not None else default_layers(engine.n_layers)
    routers = RouterSet.zeros(engine.model, RoutingConfig.from_granularity(granularity, layers))
    g = torch.Generator().manual_seed(seed)
    for r in routers.routers.values():
        w = torch.randn(r.proj.weight.shape, generator=g) * (3.0 / math.sqrt(engine.anatomy.hidden_size / 64))
        r.proj.weight.data.copy_(w.to(r.proj.weight.device))
    return routers


def prompt_ids(engine: Engine, n: int, seed: int = 0) -> list[int]:
    vocab = int(engine.model.config.vocab_size)
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()


def _config(new_tokens: int, **kw) -> GenerateConfig:
    return GenerateConfig(**{"max_new_tokens": new_tokens, "ignore_eos": True, "max_new_tokens_cap": max(4096, new_tokens),
                             "quality_refresh": None, **kw})


# -- generate --------------------------------------------------------------------------------------
def check_generate(engine: Engine, ids: list[int], routers: RouterSet, new_tokens: int) -> dict:
    """The full model and the routed runs, quality on, each decoded token's host waits counted."""
    out = {}
    for name, rs, policy in [("full", None, "kv"), *((f"routed_{p}", routers, p) for p in POLICIES)]:
        control = Control(0.5)
        steps = engine.generate_ids(ids, rs, _config(new_tokens, kv_policy=policy, quality=True, quality_chunk=8), control)
        decoded = 0
        with SyncCounter(engine.device) as syncs:
            for step in steps:
                decoded += not step.is_prompt
        trace = control.trace
        out[name] = {
            "tokens": len(trace.generated_steps),
            "token_ids": [s.token_id for s in trace.generated_steps],
            "skip_rate": trace.skip_rate() if rs is not None else 0.0,  # decoded tokens
            "skip_rate_prompt": trace.skip_rate(generated_only=False) if rs is not None else 0.0,  # the prompt's too
            "mean_kl": trace.mean_kl(),
            "agreement": trace.agreement(),
            # from the median step: the first steps on a GPU pay its one-time set-up (kernels chosen per shape)
            "decode_tokens_per_second": 1.0 / statistics.median(timed) if (timed := [s.seconds for s in trace.generated_steps if s.seconds > 0]) else None,
            "syncs_per_token": syncs.count / max(1, decoded) if syncs.cuda else 0.0,
            "syncs_where": dict(sorted(syncs.where.items(), key=lambda kv: -kv[1])[:12]),
            "quality_seconds": trace.meta.get("quality_seconds"),
        }
    out["kv_vs_mask"] = first_departure(engine, ids, routers, out["routed_kv"]["token_ids"], out["routed_mask"]["token_ids"])
    return out


# kv computes the numbers mask computes, but not always with the same kernels: skipping writes a token's keys and values
# from the k|v product where mask takes them from the q|k|v product, and a GPU's matrix kernels round by shape. Where
# the two decode different tokens, mask's own logits there must put the two tokens this close (a near-tie: a rounding
# decided it). Seen on an H100 (assets/bench/gpu-check-h100.json): the same tokens up to token 14 in each of three runs,
# where mask's logits put the two 0.18 apart, of a spread of 4.1 over the vocabulary (a random-weight model's logits are
# flat); the H200 decoded the same 64 tokens under both.
NEAR_TIE = 0.5


def first_departure(engine: Engine, ids: list[int], routers: RouterSet, kv_ids: list[int], mask_ids: list[int]) -> dict | None:
    """Where kv's tokens first differ from mask's (None: nowhere): the index, and the gap between the two tokens in mask's
    logits there (one forward over the prompt and the tokens both decoded before it, under mask)."""
    from routerlab.core.ops.forward import forward
    from routerlab.core.routing.gates import Plan

    k = next((j for j, (a, b) in enumerate(zip(kv_ids, mask_ids)) if a != b), None)
    if k is None:
        return None
    seq = ids + mask_ids[:k]
    device = engine.device
    with torch.inference_mode():
        logits, _ = forward(engine.anatomy, torch.tensor([seq], device=device), torch.arange(len(seq), device=device),
                            engine.new_caches(len(seq) + 1), Plan(routers, 0.5, "mask"))
    row = logits[0, -1].float().cpu()
    return {"at": k, "gap": float(row[mask_ids[k]] - row[kv_ids[k]]), "spread": float(row.max() - row.min())}


# -- speed ---------------------------------------------------------------------------------------
def check_speed(engine: Engine, ids: list[int], routers: RouterSet, new_tokens: int, rounds: int) -> dict:
    from routerlab.bench.speed import measure_speed
    from routerlab.core.decode.costs import cost_breakdown, ideal_speedup

    n = engine.n_layers
    never = RouterSet.zeros(engine.model, RoutingConfig.from_granularity("attention-token", default_layers(n)))
    deep = tuple(range(n // 2, n))
    forced = RouterSet.zeros(engine.model, RoutingConfig.from_granularity("attention-token", deep))
    configs = {"never_skip": (never, 0.0, "kv"), "random_0.5_kv": (routers, 0.5, "kv"),
               **{f"deep_off_{p}": (forced, 1.0, p) for p in POLICIES}}
    measure_speed(engine, [ids[:16]], configs, 4, 1, log=lambda *_: None)  # warm-up: first calls pay one-time set-up
    runs = measure_speed(engine, [ids], configs, new_tokens, rounds, log=lambda *_: None)
    costs = cost_breakdown(engine, ids, len(ids) + new_tokens // 2, repeat=10)
    ideal = {p: ideal_speedup(costs, len(deep), p) for p in POLICIES}
    return {
        "rounds": rounds, "new_tokens": new_tokens, "prompt_tokens": len(ids), "layers_off": list(deep),
        "tokens_per_second_full": runs["full"]["tokens_per_second"],
        "speedup": {name: runs[name]["speedup"] for name in configs},
        "skip_rate": {name: runs[name]["skip_rate_all_layers_measured"] for name in configs},
        "ideal_speedup_layers_off": ideal,
        "measured_over_ideal_layers_off": {p: runs[f"deep_off_{p}"]["speedup"] / ideal[p] for p in POLICIES},
        "cost_seconds": costs,
    }


# -- room ----------------------------------------------------------------------------------------
def check_room(engine: Engine, routers: RouterSet, new_tokens: int) -> dict:
    """Rows with other routers, thresholds and policies in one room (stepped here), against each run alone."""
    mlp = random_routers(engine, "mlp-token", seed=2)
    requests = [
        (prompt_ids(engine, 9, 1), None, _config(new_tokens)),
        (prompt_ids(engine, 14, 2), routers, _config(new_tokens, threshold=0.5, kv_policy="kv")),
        (prompt_ids(engine, 6, 3), routers, _config(new_tokens, threshold=0.3, kv_policy="drop")),
        (prompt_ids(engine, 11, 4), routers, _config(new_tokens, threshold=0.7, kv_policy="kv")),
        (prompt_ids(engine, 5, 5), mlp, _config(new_tokens, threshold=0.5)),
        (prompt_ids(engine, 8, 6), routers, _config(new_tokens, threshold=0.6, kv_policy="mask")),
        (prompt_ids(engine, 7, 7), routers, _config(new_tokens, temperature=0.8, seed=3)),
    ]
    alone = []
    for ids, rs, config in requests:
        control = Control(config.threshold)
        list(engine.generate_ids(ids, rs, config, control))
        alone.append(control.trace)
    room = engine.room = Room(engine, max_batch=len(requests))
    room.prefill_budget_s = math.inf  # every row joins at the first step: the batches never depend on timing
    try:
        controls = [Control(config.threshold) for _, _, config in requests]
        readers = [engine.generate_ids(ids, rs, config, c) for (ids, rs, config), c in zip(requests, controls)]
        t0, steps = now(engine.device), 0
        while any(room.busy.values()):
            room.step()
            steps += 1
        seconds = now(engine.device) - t0
        for reader in readers:
            list(reader)
    finally:
        engine.room = None
    rows = []
    for a, c in zip(alone, controls):
        mine, theirs = [s.token_id for s in c.trace.generated_steps], [s.token_id for s in a.generated_steps]
        first = next((j for j, (x, y) in enumerate(zip(mine, theirs)) if x != y), None)
        rows.append({"tokens": len(mine), "same_tokens_as_alone": mine == theirs, "first_difference": first,
                     "skip_rate": c.trace.skip_rate() if c.trace.meta.get("routed_layers") else 0.0,
                     "skip_rate_alone": a.skip_rate() if a.meta.get("routed_layers") else 0.0})
    tokens = sum(r["tokens"] for r in rows)
    return {"rows": rows, "steps": steps, "tokens": tokens, "tokens_per_second": tokens / seconds if seconds > 0 else None,
            "all_rows_match_alone": all(r["same_tokens_as_alone"] for r in rows)}


# -- training ------------------------------------------------------------------------------------
def check_train(engine: Engine, steps: int = 3) -> dict:
    from accelerate import Accelerator

    from routerlab.tuning.data import Example
    from routerlab.tuning.train import TrainConfig, train_routers

    model = engine.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    vocab = int(model.config.vocab_size)
    g = torch.Generator().manual_seed(0)
    examples = [Example(tuple(torch.randint(3, vocab, (48,), generator=g).tolist()), 16) for _ in range(8)]
    accelerator = Accelerator(cpu=not is_cuda(engine.device))
    t0 = now(engine.device)
    result = train_routers(model, examples, TrainConfig(steps=steps, batch_size=4, lr=1e-2, lm_weight=1.0), accelerator=accelerator,
                           progress=False)
    seconds = now(engine.device) - t0
    moved = any(float(p.detach().abs().sum()) > 0 for p in result.routers.parameters())
    same = all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    devices = sorted({str(p.device) for p in result.routers.parameters()})
    return {"steps": result.report["steps"], "seconds": seconds, "routers_moved": moved, "base_unchanged": same,
            "router_devices": devices, "loss_first": result.report.get("loss_first"), "loss_last": result.report.get("loss_last")}


# -- the whole check -----------------------------------------------------------------------------
def run_check(device: str | None = None, size: str = "smollm", prompt_tokens: int = 256, new_tokens: int = 64,
              rounds: int = 3, train_steps: int = 3, log=print) -> dict:
    device = choose_device(device)
    if is_cuda(device):
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    engine = build_engine(size, device)
    routers = random_routers(engine)
    ids = prompt_ids(engine, prompt_tokens)
    out = {
        "what": "python -m routerlab.bench.gpu.gpu_check: a random-weight model of the named shape, random routers",
        "device": str(engine.device),
        "device_name": torch.cuda.get_device_name(device) if is_cuda(device) else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "size": size,
        "layers": engine.n_layers,
        "hidden_size": engine.anatomy.hidden_size,
        "dtype": dtype_name(engine.dtype),
        "weights": engine.weights,
        "routed_layers": list(routers.config.layers),
    }
    log(f"gpu_check on {out['device']} ({out['device_name']}), {size}, {out['dtype']}")
    parts = {  # each part on its own: one that fails is recorded with its error, and the others still run
        "generate": lambda: check_generate(engine, ids, routers, new_tokens),
        "decode_syncs": lambda: {"full": decode_syncs(engine, ids, None, new_tokens),
                                 **{f"routed_{p}": decode_syncs(engine, ids, routers, new_tokens, p) for p in POLICIES}},
        "speed": lambda: check_speed(engine, ids, routers, new_tokens, rounds),
        "room": lambda: check_room(engine, routers, min(new_tokens, 24)),
        "train": lambda: check_train(engine, train_steps),
    }
    for name, part in parts.items():
        try:
            out[name] = part()
        except Exception as err:  # noqa: BLE001 (a check reports every failure, then exits non-zero)
            out[name] = {"error": f"{type(err).__name__}: {err}", "where": _where(err)}
        log(f"{name}: {_summary(name, out[name])}")
    out["peak_memory_bytes"] = peak_memory_bytes(device)
    out["seconds"] = time.perf_counter() - started
    return out


def _where(err: BaseException) -> list[str]:
    import traceback

    return [f"{f.filename.split('routerlab/')[-1]}:{f.lineno} {f.name}" for f in traceback.extract_tb(err.__traceback__)
            if "routerlab" in f.filename][-4:]


def _summary(name: str, part: dict) -> str:
    if "error" in part:
        return f"FAILED {part['error']} at {part['where']}"
    if name == "generate":
        dep = part.get("kv_vs_mask")
        same = ("; kv and mask: the same tokens" if dep is None else
                f"; kv and mask: the same tokens up to token {dep['at']}, where mask's logits put the two {dep['gap']:.3f} apart "
                f"(of a spread of {dep['spread']:.1f})")
        return ", ".join(f"{k} skip {v['skip_rate']:.2f}, {v['syncs_per_token']:.1f} syncs/token" for k, v in part.items()
                         if k.startswith(("full", "routed_"))) + same
    if name == "decode_syncs":
        return ", ".join(f"{k} {v['per_token']:.1f}/token" for k, v in part.items())
    if name == "speed":
        return ", ".join(f"{k} {v:.2f}x" for k, v in part["speedup"].items())
    if name == "room":
        return f"{len(part['rows'])} rows, every row's tokens as alone: {part['all_rows_match_alone']}"
    return f"{part['steps']} steps in {part['seconds']:.1f} s, base unchanged: {part['base_unchanged']}"


def sane(result: dict) -> list[str]:
    """What is wrong with a check's result (empty: nothing): the figures the test suite and the GPU run both assert."""
    bad = [f"{name} failed: {result[name]['error']}" for name in ("generate", "decode_syncs", "speed", "room", "train")
           if "error" in result.get(name, {})]
    if bad:
        return bad
    gen = result["generate"]
    for p in POLICIES:
        if not max(gen[f"routed_{p}"]["skip_rate"], gen[f"routed_{p}"]["skip_rate_prompt"]) > 0:
            bad.append(f"routed {p} skipped nothing")
    if gen["routed_kv"]["token_ids"] != gen["routed_mask"]["token_ids"]:
        dep = gen.get("kv_vs_mask")
        if dep is None:
            bad.append("kv and mask decoded different tokens (they compute the same numbers)")
        elif abs(dep["gap"]) > NEAR_TIE:
            bad.append(f"kv and mask decoded different tokens from token {dep['at']}, where mask's logits put the two "
                       f"{dep['gap']:.3f} apart: more than a rounding ({NEAR_TIE})")
    if gen["full"]["mean_kl"] not in (None, 0.0):
        bad.append("the full model's KL to itself is not 0")
    for name, v in result["speed"]["speedup"].items():
        if not (isinstance(v, float) and math.isfinite(v) and v > 0):
            bad.append(f"speedup of {name} is {v!r}")
    if not result["speed"]["skip_rate"]["deep_off_kv"] > 0:
        bad.append("the layers-off rows skipped nothing")
    if not result["train"]["base_unchanged"] or not result["train"]["routers_moved"]:
        bad.append("training changed the base or did not move the routers")
    return bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m routerlab.bench.gpu.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: $ROUTERLAB_DEVICE, else cuda when available)")
    p.add_argument("--size", choices=tuple(SIZES), default="smollm", help="the model's shape (random weights)")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--train-steps", type=int, default=3)
    p.add_argument("--out", default=None, help="write the JSON here (default: print it)")
    args = p.parse_args(argv)
    result = run_check(args.device, args.size, args.prompt_tokens, args.new_tokens, args.rounds, args.train_steps,
                       log=lambda m: print(m, file=sys.stderr, flush=True))
    result["problems"] = sane(result)
    text = json.dumps(result, indent=1, default=str)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    for problem in result["problems"]:
        print(f"gpu_check: {problem}", file=sys.stderr)
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
