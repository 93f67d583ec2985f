"""`python -m routerlab.bench.products.nbits`: onnxruntime's 4- and 8-bit products on the file's own codes, against the engine's
int4 kernel: each map kind alone, then inside whole decode steps.

llama.cpp multiplies Q4_1 weights with activations quantised to 8 bits per block of 32 (integer dot products);
onnxruntime's `MatMulNBits` (accuracy level 4) does the same, and its wheel needs no compiler. Here it computes the
file's codes and scales (core/kernels/nbits.py `product_nodes`): Q4_1 (w = q * d + m) as (q - z) * d at the zero point z
nearest -m / d, plus the rest m + z d (8 bits) times each block's input sum; Q8_0 (w = d * q) exactly, as 8-bit codes
with zero point 128.

Alone, one map at a time, it can beat torch's int4 kernel; inside a step every product is a `run` of its own session
(121 a step for SmolLM2-135M) between torch's ops, and two thread pools share the cores. So the step is measured too,
under each way to share them, each in a process of its own (onnxruntime's global pool is set once per process):

  own-pools    torch on all threads; each session its own pool, spinning off (spinning on: every session's idle
               workers spin, 121 of them on 2 cores; measured 0.005x, so not rerun)
  shared-pool  torch on all threads; every session in one global onnxruntime pool
  ort-cores    torch on one thread (no pool of its own), the products in a global onnxruntime pool of all threads

`--maps head` (or any subset) sends only those maps through onnxruntime: the head is one `run` a step, where it is
2-4x faster than the int4 kernel alone.

Each mode decodes the same prompt greedily with the int4 kernel and with onnxruntime in alternating rounds and prints
the ratio. The products are core/kernels/nbits.py's, which the engine takes where core/kernels/low_paths.py measures them faster
(requirements.txt installs onnxruntime and onnx; `make bench-nbits` too, where they are missing). Knows nothing about
the UI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from routerlab.core.kernels.nbits import NBits

MODES = ("own-pools", "shared-pool", "ort-cores")


# -- the file's codes, map by map ---------------------------------------------------------------------------------
def map_codes(an, codes: dict) -> list[tuple[str, object, object]]:
    """(kind, Weight, its Codes) for every map a decode step multiplies, stacked as anatomy.Anatomy stacks them."""
    from routerlab.core.kernels.weights import Codes

    out = []
    for i, p in enumerate(an.layers):
        pre = f"model.layers.{i}"
        for kind, w, names in (("qkv", p.attn.qkv, [f"{pre}.self_attn.{x}_proj.weight" for x in "qkv"]),
                               ("o", p.attn.o, [f"{pre}.self_attn.o_proj.weight"]),
                               ("gate_up", p.gate_up, [f"{pre}.mlp.gate_proj.weight", f"{pre}.mlp.up_proj.weight"]),
                               ("down", p.down, [f"{pre}.mlp.down_proj.weight"])):
            out.append((kind, w, Codes.cat([codes[n] for n in names])))
    head = next(n for n in ("lm_head.weight", "model.embed_tokens.weight") if n in codes)
    out.append(("head", an.head, codes[head]))
    return out


@contextmanager
def products_through(maps: list, lows: list):
    """The engine's maps use `lows` as their low-bit copies inside the block, their own again after it."""
    before = [w.low for _, w, _ in maps]
    for (_, w, _), low in zip(maps, lows):
        w.low = low
    try:
        yield
    finally:
        for (_, w, _), low in zip(maps, before):
            w.low = low


# -- the measurements -----------------------------------------------------------------------------------------------
def _per_call(fn, x, repeat: int = 200) -> float:
    for _ in range(20):
        fn(x)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn(x)
        best = min(best, (time.perf_counter() - t0) / repeat)
    return best


@torch.inference_mode()
def alone(maps: list, lows: list, hidden: torch.Tensor) -> dict:
    """Per kind, the first layer's map at 1 row: microseconds a call (best of 3) and the relative error against the
    fp32 product of the codes' own weights, both kernels, on the model's hidden states (or activations of their scale)."""
    out = {}
    for (kind, w, codes), low in zip(maps, lows):
        if kind in out:
            continue
        k = codes.shape[1]
        x = (hidden[:16] if k == hidden.shape[1] else torch.randn(16, k, generator=torch.Generator().manual_seed(0)) * float(hidden.std()))
        x = x.to(torch.bfloat16)
        ref = x.float() @ codes.dequantize().T
        err = {name: float((f(x).float() - ref).norm() / ref.norm()) for name, f in (("int4", w.low.mm), ("nbits", low.mm))}
        out[kind] = {"int4_us": 1e6 * _per_call(w.low.mm, x[:1]), "nbits_us": 1e6 * _per_call(low.mm, x[:1]),
                     "int4_error": err["int4"], "nbits_error": err["nbits"]}
    return out


@torch.inference_mode()
def decode_rate(engine, ids: list[int], new_tokens: int) -> tuple[float, list[int]]:
    """Greedy decode tokens/s after a prefill of `ids` (the engine's one-token forward), and the tokens."""
    from routerlab.core.ops.forward import forward
    from routerlab.core.routing.gates import Plan

    an = engine.anatomy
    caches = engine.new_caches(len(ids) + new_tokens + 8)
    logits, _ = forward(an, torch.tensor([ids]), torch.arange(len(ids)), caches, Plan(None))
    token, position, out = int(logits[0, -1].argmax()), len(ids), []
    t0 = 0.0
    for k in range(new_tokens + 8):  # 8 warm-up tokens
        if k == 8:
            t0 = time.perf_counter()
        logits, _ = forward(an, torch.tensor([[token]]), torch.tensor([position]), caches, Plan(None), top=position, scores_on="cpu")
        token, position = int(logits[0, -1].argmax()), position + 1
        out.append(token)
    return new_tokens / (time.perf_counter() - t0), out


KINDS = ("qkv", "o", "gate_up", "down", "head")


def one_mode(mode: str, threads: int, rounds: int, prompt_tokens: int, new_tokens: int, kinds: tuple[str, ...] = KINDS) -> dict:
    """The measurements of one mode, in this process (see the module's docstring)."""
    import onnxruntime as ort

    from routerlab.bench.products.kernels import _hidden
    from routerlab.bench.speed import bench_prompt
    from routerlab.core.decode.engine import Engine
    from routerlab.core.model.models import embedded_codes, load_model

    if mode != "own-pools":
        from onnxruntime.capi.onnxruntime_pybind11_state import set_global_thread_pool_sizes

        set_global_thread_pool_sizes(threads, 1)
    torch.set_num_threads(1 if mode == "ort-cores" else threads)
    loaded = load_model(device="cpu")
    engine = Engine.from_loaded(loaded, choose_kernels=False)  # int4 throughout: the baseline
    if engine.anatomy.lowbit is None:
        raise SystemExit("bench nbits measures the embedded model's own codes on a CPU")
    maps = [m for m in map_codes(engine.anatomy, embedded_codes(loaded.model.config)) if m[0] in kinds]
    lows = [NBits(codes, threads, per_session=mode == "own-pools") for _, _, codes in maps]
    ids = bench_prompt(loaded.tokenizer, prompt_tokens)
    with products_through(maps, lows):
        _, theirs = decode_rate(engine, ids, 16)
    _, ours = decode_rate(engine, ids, 16)
    result = {"mode": mode, "maps": list(kinds), "onnxruntime": ort.__version__, "torch_threads": torch.get_num_threads(), "threads": threads,
              "same_first_tokens": sum(a == b for a, b in zip(ours, theirs)), "of": len(ours),
              "alone": alone(maps, lows, _hidden(engine)) if mode != "ort-cores" else None, "int4": [], "nbits": []}
    for r in range(rounds):
        for name in ("int4", "nbits") if r % 2 == 0 else ("nbits", "int4"):
            if name == "nbits":
                with products_through(maps, lows):
                    result[name].append(decode_rate(engine, ids, new_tokens)[0])
            else:
                result[name].append(decode_rate(engine, ids, new_tokens)[0])
    result["ratio"] = statistics.median(b / a for a, b in zip(result["int4"], result["nbits"]))
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m routerlab.bench.products.nbits", description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {', '.join(MODES)}")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--rounds", type=int, default=4, help="alternating rounds of the two kernels per mode")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--maps", default=",".join(KINDS), help=f"which maps onnxruntime multiplies (comma-separated, from "
                   f"{', '.join(KINDS)}; the others keep the int4 kernel), e.g. head")
    p.add_argument("--save", default=None, help="write the JSON result here")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: measure one mode in this process
    args = p.parse_args(argv)
    kinds = tuple(k for k in KINDS if k in args.maps.split(","))
    if not kinds:
        p.error(f"--maps takes some of {', '.join(KINDS)}, not {args.maps!r}")
    if args.one:
        print(json.dumps(one_mode(args.one, args.threads, args.rounds, args.prompt_tokens, args.new_tokens, kinds)))
        return 0
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as err:
        print(f"bench nbits needs onnxruntime and onnx ({err}): `make bench-nbits` installs them into .venv")
        return 2
    from routerlab.bench.speed import cpu_model
    from routerlab.core.base.precision import cpu_vector_unit

    from routerlab.core.base.precision import cpu_matrix_flags, machine_kind

    results = {"cpu": cpu_vector_unit(), "cpu_model": cpu_model(), "machine_kind": machine_kind(), "cpu_flags": cpu_matrix_flags(),
               "maps": list(kinds), "modes": {}}
    for mode in args.modes.split(","):
        cmd = [sys.executable, "-m", "routerlab.bench.products.nbits", "--one", mode, "--threads", str(args.threads), "--rounds",
               str(args.rounds), "--prompt-tokens", str(args.prompt_tokens), "--new-tokens", str(args.new_tokens),
               "--maps", ",".join(kinds)]
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        if done.returncode:
            print(f"{mode}: failed\n{done.stderr[-2000:]}")
            return 1
        r = results["modes"][mode] = json.loads(done.stdout.strip().splitlines()[-1])
        if r["alone"]:
            print(f"{mode}, one map at 1 row (us a call, relative error vs the codes' fp32 product): " + "; ".join(
                f"{k} int4 {v['int4_us']:.0f} (err {v['int4_error']:.4f}) vs nbits {v['nbits_us']:.0f} (err {v['nbits_error']:.4f})"
                for k, v in r["alone"].items()))
        print(f"{mode}: decode at {args.prompt_tokens} tokens, torch on {r['torch_threads']} thread(s): int4 "
              f"{statistics.median(r['int4']):.1f} tok/s, onnxruntime {statistics.median(r['nbits']):.1f} tok/s: "
              f"{r['ratio']:.2f}x (first {r['of']} greedy tokens: {r['same_first_tokens']} the same)")
    modes = results["modes"].values()
    default = [statistics.median(r["int4"]) for r in modes if r["torch_threads"] == args.threads]
    if default:  # what a visitor would see: the fastest way with onnxruntime against the engine as it runs today
        best = max(modes, key=lambda r: statistics.median(r["nbits"]))
        results["best_vs_engine"] = statistics.median(best["nbits"]) / statistics.median(default)
        print(f"fastest with onnxruntime ({best['mode']}) against the engine's int4 kernel on {args.threads} thread(s): "
              f"{results['best_vs_engine']:.2f}x")
    if args.save:
        Path(args.save).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
