"""`python -m routerlab bench kernels`: which product each kind of linear map is fastest with on this machine.

A decode step's products are most of its time (on an AVX2-only CPU torch's int4 products alone took longer
than llama.cpp's whole step). This times the candidates torch's CPU wheel offers, over every map of a kind as a step
streams them (never one weight kept warm in a cache), at 1 row (a decode step) and at a room's row counts:

  int4        torch's weight-only int4 kernel on the file's own codes (the engine's decode path today)
  bf16, fp32  the dense weight in the model's dtype, and an fp32 copy (batch_paths' wide copy)
  int8-wo     torch's weight-only int8 kernel (`_weight_int8pack_mm`): weights requantised per output channel, the
              activations kept in bf16
  int8-dyn    FBGEMM's dynamic int8 linear (`quantized.linear_dynamic`): weights requantised per output channel,
              each row's activations quantised to 8 bits on the fly and multiplied with integer dot products, as
              llama.cpp does with its Q8 activations. torch marks its quantized-tensor API deprecated.

Each candidate's error is measured too: the relative error of its output against the fp32 product of the same dense
weight (what the file's codes dequantise to), on activations drawn from the model's own hidden states. Candidates
alternate within each round; figures are medians of `rounds`. Nothing here changes how the engine computes.
"""

from __future__ import annotations

import json
import statistics
import time
import warnings
from pathlib import Path

import torch
from torch.nn import functional as F

from routerlab.core.base.precision import cpu_vector_unit
from routerlab.core.kernels.batch_paths import kinds
from routerlab.core.kernels.weights import Int4, Int8, quantize_int8

KINDS = ("qkv", "o", "gate_up", "down", "head")
ROWS = (1, 8, 32)


def fbgemm_available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines


def _int8_dynamic(dense: torch.Tensor):
    """FBGEMM's packed weight: per-output-channel symmetric int8 codes of `dense` (N, K)."""
    w = dense.float()
    scale = (w.abs().amax(1) / 127.0).clamp_min(1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the quantized-tensor API's deprecation notice: this is a measurement
        q = torch.quantize_per_channel(w, scale.double(), torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(q, None)


def candidates(maps, dtype: torch.dtype) -> dict[str, list]:
    """name -> one callable per map (x (n, K) in the model's dtype -> (n, N))."""
    out = {}
    if all(w.low is not None for w in maps):  # the engine's low-bit copy: "int4" (the file's codes), or "int8"
        out["int4" if isinstance(maps[0].low, Int4) else "int8"] = [lambda x, w=w: w._low_rows(x) for w in maps]
    out["bf16" if dtype == torch.bfloat16 else str(dtype).removeprefix("torch.")] = [lambda x, w=w: F.linear(x, w.dense) for w in maps]
    if not all(isinstance(w.low, Int8) for w in maps):  # weight-only int8 per channel (bf16 activations), requantised
        int8 = [quantize_int8(w.dense) for w in maps]
        out["int8-wo"] = [lambda x, q=q: q.mm(x).to(x.dtype) for q in int8]
    wide = [w.dense.float().contiguous() for w in maps]
    out["fp32"] = [lambda x, d=d: F.linear(x.float(), d).to(x.dtype) for d in wide]
    if fbgemm_available():
        torch.backends.quantized.engine = "fbgemm"
        packed = [_int8_dynamic(w.dense) for w in maps]
        out["int8-dyn"] = [lambda x, p=p: torch.ops.quantized.linear_dynamic(x.float(), p, True).to(x.dtype) for p in packed]
    return out


def _inputs(an, kind: str, maps, n: int, hidden: torch.Tensor, seed: int) -> list[torch.Tensor]:
    """Rows the maps of `kind` multiply: hidden states of the model (for maps reading the residual stream's norm) or
    activations of the same scale (the MLP's inner and attention's output), n rows each."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for w in maps:
        k = w.dense.shape[1]
        if k == hidden.shape[1]:
            rows = hidden[torch.randint(0, hidden.shape[0], (n,), generator=g)]
        else:
            rows = torch.randn(n, k, generator=g) * float(hidden.float().std())
        out.append(rows.to(an.dtype).contiguous())
    return out


def _hidden(engine, tokens: int = 64) -> torch.Tensor:
    """Normed hidden states of a short passage at every layer (rows, D): realistic activations."""
    from routerlab.bench.speed import bench_prompt
    from routerlab.tuning.forward import layer_walk

    ids = torch.tensor([bench_prompt(engine.tokenizer, tokens, int(engine.model.config.vocab_size))])
    rows = []
    with torch.inference_mode():
        for _, _, x_attn, _, x_mlp, _ in layer_walk(engine.anatomy, ids):
            rows += [x_attn[0], x_mlp[0]]
    return torch.cat(rows).float()


@torch.inference_mode()
def measure(engine, rows=ROWS, rounds: int = 5, log=print) -> dict:
    an = engine.anatomy
    hidden = _hidden(engine)
    by_kind = kinds(an)
    result = {"rows": list(rows), "rounds": rounds, "kinds": {}}
    for kind in KINDS:
        maps = by_kind.get(kind)
        if not maps:
            continue
        funcs = candidates(maps, an.dtype)
        table = {}
        for n in rows:
            xs = _inputs(an, kind, maps, n, hidden, seed=n)
            ref = [F.linear(x.float(), w.dense.float()) for x, w in zip(xs, maps)]
            times: dict[str, list[float]] = {name: [] for name in funcs}
            for r in range(rounds + 1):
                order = list(funcs)[r % len(funcs):] + list(funcs)[: r % len(funcs)]
                for name in order:
                    t0 = time.perf_counter()
                    for f, x in zip(funcs[name], xs):
                        f(x)
                    if r:  # the first round warms up
                        times[name].append(time.perf_counter() - t0)
            errors = {}
            for name, fs in funcs.items():
                num = sum(float((f(x).float() - y).norm()) ** 2 for f, x, y in zip(fs, xs, ref))
                den = sum(float(y.norm()) ** 2 for y in ref)
                errors[name] = (num / den) ** 0.5
            table[n] = {name: {"us_per_map": 1e6 * statistics.median(t) / len(maps), "relative_error": errors[name]}
                        for name, t in times.items()}
            best = min(table[n], key=lambda k: table[n][k]["us_per_map"])
            log(f"{kind:8s} {n:3d} rows: " + ", ".join(f"{k} {v['us_per_map']:.0f} us (err {v['relative_error']:.4f})"
                                                  for k, v in table[n].items()) + f"  -> {best}")
        result["kinds"][kind] = {"maps": len(maps), "shape": list(maps[0].dense.shape), "by_rows": table}
    result["step_products_ms"] = {
        n: {name: 1e-3 * sum(result["kinds"][k]["maps"] * result["kinds"][k]["by_rows"][n][name]["us_per_map"]
                             for k in result["kinds"] if name in result["kinds"][k]["by_rows"][n])
            for name in next(iter(result["kinds"].values()))["by_rows"][n]}
        for n in rows}
    return result


def kernels_benchmark(threads: int | None = None, rounds: int = 5, log=print) -> dict:
    from routerlab.bench.speed import cpu_model
    from routerlab.core.decode.engine import Engine
    from routerlab.core.model.models import load_model

    if threads:
        torch.set_num_threads(threads)
    engine = Engine.from_loaded(load_model(device="cpu"), choose_kernels=False)  # the int4 kernel is a candidate here
    result = measure(engine, rounds=rounds, log=log)
    result.update(model=engine.name, weights=engine.weights, dtype=str(engine.dtype).removeprefix("torch."),
                  cpu=cpu_vector_unit(), cpu_model=cpu_model(), threads=torch.get_num_threads(),
                  fbgemm=fbgemm_available(), torch=torch.__version__)
    return result


def main(args) -> int:
    result = kernels_benchmark(args.threads, args.rounds)
    for n, d in result["step_products_ms"].items():
        print(f"a step's products at {n} row(s): " + ", ".join(f"{k} {v:.2f} ms" for k, v in d.items()))
    if args.save:
        Path(args.save).write_text(json.dumps(result, indent=1) + "\n")
    return 0
