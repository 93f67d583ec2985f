"""What a batched decode step costs: the room's step (core/ops/batch.py) at 1 to 32 rows, and its products alone.

Owns `batch_steps`: on the engine at hand, in the calling thread, each batch size's median step time (every row of the
default router set at its threshold, a short prompt in its cache) and the same step's linear products alone, with the
low-bit copies (what the room uses up to `weights.BATCH_ROWS` rows) and with the dense 16-bit weights. Knows nothing
about servers or the UI.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch.nn import functional as F

from routerlab.core.base.config import GenerateConfig
from routerlab.core.decode.engine import Control
from routerlab.core.decode.generation import Generation
from routerlab.core.records.trace import Trace

SIZES = (1, 2, 4, 8, 16, 32)


def _products(engine, n: int, path: str) -> float:
    """A full step's products at n rows: `low` (each map's low-bit copy), `dense` (16-bit) or `chosen` (what the step
    takes: `Weight.batch`, with the fp32 copies core/kernels/batch_paths.py gave where they measured faster)."""
    an = engine.anatomy
    maps = [an.head] + [w for p in an.layers for w in (p.attn.qkv, p.attn.o, p.gate_up, p.down) if w is not None]
    t0 = time.perf_counter()
    for w in maps:
        x = torch.zeros(n, w.dense.shape[1], dtype=engine.dtype)
        if path == "chosen":
            w.batch(x, an.upcast)
        else:
            F.linear(x, w.dense) if path == "dense" or w.low is None else w.low.mm(x)
    return time.perf_counter() - t0


@torch.inference_mode()
def batch_steps(engine, routers, threshold: float = 0.5, sizes=SIZES, rounds: int = 7) -> dict:
    decode, engine.decode = engine.decode, "torch"  # torch's batched layer, whatever the engine decodes through
    try:
        return _batch_steps(engine, routers, threshold, sizes, rounds)
    finally:
        engine.decode = decode


def _batch_steps(engine, routers, threshold: float, sizes, rounds: int) -> dict:
    out = {}
    for n in sizes:
        gens = []
        for k in range(n):
            control = Control(threshold)
            config = GenerateConfig(max_new_tokens=64, ignore_eos=True)
            control.trace = Trace(engine.n_layers, meta=engine.trace_meta(routers, config))
            gen = Generation(engine, [1 + (7 * k + j) % 1000 for j in range(40)], routers, config, control, control.trace)
            gen.prefill()
            gen.begin()
            gens.append(gen)
        times, low, dense, chosen = [], [], [], []
        for _ in range(rounds):
            for g in gens:  # the same token again at the next position: a step's cost, not its text
                g.feed = (g.feed[0], g.feed[1] + 1)
            t0 = time.perf_counter()
            engine.runtime.step(gens)
            times.append(time.perf_counter() - t0)
            low.append(_products(engine, n, "low"))
            dense.append(_products(engine, n, "dense"))
            chosen.append(_products(engine, n, "chosen"))
        step = statistics.median(times[1:])
        out[str(n)] = {"step_ms": round(1e3 * step, 1), "tokens_per_s": round(n / step, 1),
                       "products_low_bit_ms": round(1e3 * statistics.median(low[1:]), 1),
                       "products_dense_ms": round(1e3 * statistics.median(dense[1:]), 1),
                       "products_chosen_ms": round(1e3 * statistics.median(chosen[1:]), 1)}
    return out
