"""Which product each linear map of a decode batch takes on this machine: its low-bit copy, or an fp32 copy of its
dense weight, from how many rows; measured at start-up, never assumed.

A decode batch (core/batch.py: the room's step) multiplies n rows by every weight. torch's CPU int4 kernel reads the
fewest bytes but its cost grows nearly with the rows; a dense fp32 product reads 8x the bytes but gains per row.
Where they cross depends on the machine: on a 2-core AMD EPYC with AVX2 only (no native bf16) the embedded model's
products took 15 ms (int4) against 24 ms (fp32) at 1 row and 204 ms against 107 ms at 32 rows; on a Xeon with AMX
the dense 16-bit products won from about 8 rows. So `tune` times both over the whole model's maps of each kind
(every layer's, as a step streams them, never one weight kept warm in a cache), at 2 to 32 rows, and gives each kind
of map its crossing point (`Weight.wide_from`) and fp32 copy (`Weight.wide`) where the copy wins by `MARGIN` at that
many rows and every larger size measured. Kinds where it never wins keep no copy (no memory spent).

Not used for one row (the engine's one-token step keeps the low-bit copy: it won at one row on every machine
measured) and not by default: a room's host calls `tune` once, before serving (app.py, `make room`). Tests that
compare a batch with rows alone leave it off, or set the choice explicitly (`apply`).

Knows nothing about rows, routers, caches or the UI: only the Anatomy's `Weight`s.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch.nn import functional as F

from routerlab.core.weights import Weight

SIZES = (2, 4, 8, 16, 32)
MARGIN = 0.9  # the fp32 copy is taken where it costs at most this fraction of the low-bit product (noise, memory)
ROUNDS = 3


def kinds(an) -> dict[str, list[Weight]]:
    """The anatomy's linear maps by kind ("head", "qkv", "q", "kv", "o", "gate_up", "down"): each kind's maps share
    a shape, so one crossing point serves them all."""
    out: dict[str, list[Weight]] = {"head": [an.head]}
    for p in an.layers:
        for name, w in (("qkv", p.attn.qkv), ("q", p.attn.q), ("kv", p.attn.kv), ("o", p.attn.o), ("gate_up", p.gate_up), ("down", p.down)):
            if w is not None:
                out.setdefault(name, []).append(w)
    return out


def _fp32_copies(an) -> dict[int, torch.Tensor]:
    """An fp32 copy of every map's dense weight (by id of the Weight); `q` and `kv` are views of their `qkv` copy's
    rows, as their dense weights are of the fused one's, so they cost no memory of their own."""
    copies: dict[int, torch.Tensor] = {id(an.head): an.head.dense.float().contiguous()}
    for p in an.layers:
        a = p.attn
        wide = a.qkv.dense.float().contiguous()
        copies[id(a.qkv)], copies[id(a.q)], copies[id(a.kv)] = wide, wide[: a.q_size], wide[a.q_size :]
        for w in (a.o, p.gate_up, p.down):
            if w is not None:
                copies[id(w)] = w.dense.float().contiguous()
    return copies


def _seconds(maps: list[Weight], n: int, dtype: torch.dtype, upcast: bool, wide: dict[int, torch.Tensor] | None) -> float:
    """One pass of n rows through every map of a kind: their low-bit (or usual) product, or their fp32 copies'."""
    x = torch.randn(n, maps[0].dense.shape[1], generator=torch.Generator().manual_seed(n)).to(dtype)
    t0 = time.perf_counter()
    for w in maps:
        if wide is None:
            w.batch(x, upcast)
        else:
            F.linear(x.float(), wide[id(w)]).to(dtype)
    return time.perf_counter() - t0


@torch.inference_mode()
def measure(an, sizes=SIZES, rounds: int = ROUNDS) -> dict[str, dict[int, tuple[float, float]]]:
    """kind -> rows -> (seconds of the usual product, seconds of the fp32 copy's), medians of `rounds` alternating,
    after a warm-up of each. Takes a few seconds for the embedded model on 2 cores, and holds the fp32 copies meanwhile."""
    saved = {id(w): (w.wide, w.wide_from) for ws in kinds(an).values() for w in ws}
    for ws in kinds(an).values():  # measure the usual path as it is without any copy
        for w in ws:
            w.wide = w.wide_from = None
    copies = _fp32_copies(an)
    out: dict[str, dict[int, tuple[float, float]]] = {}
    try:
        for kind, maps in kinds(an).items():
            out[kind] = {}
            for n in sizes:
                low, wide = [], []
                _seconds(maps, n, an.dtype, an.upcast, None), _seconds(maps, n, an.dtype, an.upcast, copies)
                for _ in range(rounds):
                    low.append(_seconds(maps, n, an.dtype, an.upcast, None))
                    wide.append(_seconds(maps, n, an.dtype, an.upcast, copies))
                out[kind][n] = (statistics.median(low), statistics.median(wide))
    finally:
        for ws in kinds(an).values():
            for w in ws:
                w.wide, w.wide_from = saved[id(w)]
    return out


def crossing(times: dict[int, tuple[float, float]], margin: float = MARGIN) -> int | None:
    """The fewest rows from which the fp32 copy wins by `margin` at that size and at every larger one measured; None
    where it does not win at the largest."""
    best = None
    for n in sorted(times, reverse=True):
        low, wide = times[n]
        if wide > margin * low:
            break
        best = n
    return best


def apply(an, choice: dict[str, int | None]) -> None:
    """Give each kind's maps their crossing point (kind -> rows, None: none) and, where they have one, their fp32
    copies; drops the copies of kinds that have none."""
    copies = _fp32_copies(an) if any(v is not None for v in choice.values()) else {}
    for kind, maps in kinds(an).items():
        n = choice.get(kind)
        for w in maps:
            w.wide, w.wide_from = (copies[id(w)], int(n)) if n is not None else (None, None)


def tune(an, sizes=SIZES, rounds: int = ROUNDS) -> dict:
    """Measure, choose and apply (see the module docstring); what was measured and chosen, for the log and reports.
    Only on a CPU: on a GPU the maps keep their 16-bit weights (no low-bit copy there, load_model) and nothing is tuned."""
    device = an.head.dense.device
    if device.type != "cpu":
        return {"wide_from": {kind: None for kind in kinds(an)}, "step_products": {}, "fp32_copy_mb": 0, "device": str(device)}
    times = measure(an, sizes, rounds)
    choice = {kind: crossing(t) for kind, t in times.items()}
    apply(an, choice)
    step = {n: {"low_bit_ms": 1e3 * sum(times[k][n][0] for k in ("head", "qkv", "o", "gate_up", "down") if k in times),
                "chosen_ms": 1e3 * sum(times[k][n][1] if choice[k] is not None and n >= choice[k] else times[k][n][0]
                                       for k in ("head", "qkv", "o", "gate_up", "down") if k in times)} for n in sizes}
    wide_bytes = sum(4 * w.dense.numel() for k, ws in kinds(an).items() if choice[k] is not None and k not in ("q", "kv") for w in ws)
    return {"wide_from": choice, "step_products": {n: {k: round(v, 1) for k, v in d.items()} for n, d in step.items()},
            "fp32_copy_mb": round(wide_bytes / 2**20)}


def describe(summary: dict) -> str:
    """One line for the log: from how many rows each kind of map reads its fp32 copy, and what a step's products cost."""
    if summary.get("device", "cpu") != "cpu":
        return f"a decode batch's products read the 16-bit weights on {summary['device']} (products are tuned on a CPU only)"
    chosen = {k: v for k, v in summary["wide_from"].items() if v is not None}
    if not chosen:
        return "a decode batch's products keep the low-bit copies at every size measured (their fp32 copies were not faster here)"
    where = ", ".join(f"{k} from {v} rows" for k, v in chosen.items())
    big = max(summary["step_products"], key=int)
    s = summary["step_products"][big]
    return (f"a decode batch's products read fp32 copies where they measured faster here ({where}; "
            f"{summary['fp32_copy_mb']} MB): at {big} rows {s['chosen_ms']:.0f} ms a step against {s['low_bit_ms']:.0f} ms")
