"""Which product each linear map of a decode batch takes on this machine: its low-bit copy, or an fp32 copy of its
dense weight, from how many rows; measured at start-up, never assumed.

A decode batch (core/ops/batch.py: the room's step) multiplies n rows by every weight. torch's CPU int4 kernel reads the
fewest bytes but its cost grows nearly with the rows; a dense fp32 product reads 8x the bytes but gains per row.
Where they cross depends on the machine: on a 2-core AMD EPYC with AVX2 only (no native bf16) the embedded model's
products took 15 ms (int4) against 24 ms (fp32) at 1 row and 204 ms against 107 ms at 32 rows; on a Xeon with AMX
the dense 16-bit products won from about 8 rows. So `tune` times them over the whole model's maps of each kind
(every layer's, as a step streams them, never one weight kept warm in a cache), at 2 to 32 rows: the low-bit copy,
an fp32 copy of the dense weight, and (where the model is not fp32) the dense weight in its own dtype, which costs no
memory. Each kind takes the faster of its two dense products, and from its crossing point (`Weight.wide_from`) reads
it (`Weight.wide`: the fp32 copy, or the dense weight itself) where it wins by `MARGIN` at that many rows and every
larger size measured. Kinds where neither wins keep the low-bit copy alone (no memory spent). On a 2-core AMD EPYC
with AVX-512 and native bf16 the bf16 weights won (head from 16 rows, q|k|v and down at 32) and fp32 copies never
did: the room's loop at 32 rows went from 191 to 214 tokens/s (`python -m routerlab.bench.room_loop --paths`).

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

from routerlab.core.kernels.weights import Weight

SIZES = (2, 4, 8, 16, 32)
DENSE = "dense"  # the dense weight in the model's own dtype: a candidate where that is not fp32 (no copy, no memory)
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


def _seconds(maps: list[Weight], n: int, dtype: torch.dtype, upcast: bool, wide: dict[int, torch.Tensor] | str | None) -> float:
    """One pass of n rows through every map of a kind: their low-bit (or usual) product, their fp32 copies' (`wide`
    the copies), or their dense weights' in their own dtype (`wide` == DENSE)."""
    x = torch.randn(n, maps[0].dense.shape[1], generator=torch.Generator().manual_seed(n)).to(dtype)
    t0 = time.perf_counter()
    for w in maps:
        if wide is None:
            w.batch(x, upcast)
        elif wide == DENSE:
            F.linear(x, w.dense)
        else:
            F.linear(x.float(), wide[id(w)]).to(dtype)
    return time.perf_counter() - t0


@torch.inference_mode()
def measure(an, sizes=SIZES, rounds: int = ROUNDS) -> dict[str, dict[int, tuple[float, ...]]]:
    """kind -> rows -> (seconds of the usual product, of the fp32 copy's[, of the dense weight's in the model's dtype,
    where that is not fp32]), medians of `rounds` alternating, after a warm-up of each. Takes a few seconds for the
    embedded model on 2 cores, and holds the fp32 copies meanwhile."""
    own = an.dtype != torch.float32
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
                ways = [None, copies, DENSE] if own else [None, copies]
                times: list[list[float]] = [[] for _ in ways]
                for way in ways:  # warm-up
                    _seconds(maps, n, an.dtype, an.upcast, way)
                for _ in range(rounds):
                    for t, way in zip(times, ways):
                        t.append(_seconds(maps, n, an.dtype, an.upcast, way))
                out[kind][n] = tuple(statistics.median(t) for t in times)
    finally:
        for ws in kinds(an).values():
            for w in ws:
                w.wide, w.wide_from = saved[id(w)]
    return out


def crossing(times: dict[int, tuple[float, ...]], margin: float = MARGIN) -> int | None:
    """The fewest rows from which the dense product (times[n][1]) wins by `margin` at that size and at every larger
    one measured; None where it does not win at the largest."""
    best = None
    for n in sorted(times, reverse=True):
        low, wide = times[n][:2]
        if wide > margin * low:
            break
        best = n
    return best


def which_dense(times: dict[int, tuple[float, ...]]) -> str:
    """"fp32" (a copy) or DENSE (the weight in its own dtype): the faster over the sizes measured, summed."""
    if not all(len(t) > 2 for t in times.values()):
        return "fp32"
    return DENSE if sum(t[2] for t in times.values()) < sum(t[1] for t in times.values()) else "fp32"


def dense_times(times: dict[int, tuple[float, ...]], way: str) -> dict[int, tuple[float, float]]:
    """rows -> (low-bit seconds, seconds of the dense product `way`)."""
    return {n: (t[0], t[2] if way == DENSE else t[1]) for n, t in times.items()}


def choose(measured: dict, dense: bool = True) -> tuple[dict[str, int | None], set[str], dict]:
    """From `measure`'s times: each kind's crossing point, the kinds whose dense product is the weight in its own
    dtype, and the (low-bit, chosen dense) times. `dense=False`: fp32 copies only (the rule before the weight's own
    dtype was a candidate; `bench.room_loop --paths` compares the two)."""
    way = {kind: which_dense(t) if dense else "fp32" for kind, t in measured.items()}
    times = {kind: dense_times(t, way[kind]) for kind, t in measured.items()}
    choice = {kind: crossing(t) for kind, t in times.items()}
    return choice, {k for k in choice if choice[k] is not None and way[k] == DENSE}, times


def apply(an, choice: dict[str, int | None], own: set[str] | frozenset = frozenset()) -> None:
    """Give each kind's maps their crossing point (kind -> rows, None: none) and, where they have one, their dense
    product: the fp32 copy, or for the kinds in `own` the dense weight itself (no copy); drops the copies of kinds that
    have none."""
    copies = _fp32_copies(an) if any(v is not None and k not in own for k, v in choice.items()) else {}
    for kind, maps in kinds(an).items():
        n = choice.get(kind)
        for w in maps:
            if n is None:
                w.wide, w.wide_from = None, None
            else:
                w.wide, w.wide_from = (w.dense if kind in own else copies[id(w)]), int(n)


def tune(an, sizes=SIZES, rounds: int = ROUNDS) -> dict:
    """Measure, choose and apply (see the module docstring); what was measured and chosen, for the log and reports.
    Only on a CPU: on a GPU the maps keep their 16-bit weights (no low-bit copy there, load_model) and nothing is tuned."""
    device = an.head.dense.device
    if device.type != "cpu":
        return {"wide_from": {kind: None for kind in kinds(an)}, "step_products": {}, "fp32_copy_mb": 0, "device": str(device)}
    measured = measure(an, sizes, rounds)
    choice, own, times = choose(measured)
    apply(an, choice, own)
    step = {n: {"low_bit_ms": 1e3 * sum(times[k][n][0] for k in ("head", "qkv", "o", "gate_up", "down") if k in times),
                "chosen_ms": 1e3 * sum(times[k][n][1] if choice[k] is not None and n >= choice[k] else times[k][n][0]
                                       for k in ("head", "qkv", "o", "gate_up", "down") if k in times)} for n in sizes}
    wide_bytes = sum(4 * w.dense.numel() for k, ws in kinds(an).items()
                     if choice[k] is not None and k not in own and k not in ("q", "kv") for w in ws)
    return {"wide_from": choice, "wide_dtype": {k: (str(an.dtype).removeprefix("torch.") if k in own else "float32")
                                                for k in choice if choice[k] is not None},
            "step_products": {n: {k: round(v, 1) for k, v in d.items()} for n, d in step.items()},
            "fp32_copy_mb": round(wide_bytes / 2**20)}


def describe(summary: dict) -> str:
    """One line for the log: from how many rows each kind of map reads its fp32 copy, and what a step's products cost."""
    if summary.get("device", "cpu") != "cpu":
        return f"a decode batch's products read the 16-bit weights on {summary['device']} (products are tuned on a CPU only)"
    chosen = {k: v for k, v in summary["wide_from"].items() if v is not None}
    if not chosen:
        return "a decode batch's products keep the low-bit copies at every size measured (dense products were not faster here)"
    dtypes = summary.get("wide_dtype", {})
    where = ", ".join(f"{k} from {v} rows ({'fp32 copy' if dtypes.get(k, 'float32') == 'float32' else dtypes[k] + ' weight'})"
                      for k, v in chosen.items())
    big = max(summary["step_products"], key=int)
    s = summary["step_products"][big]
    return (f"a decode batch's products read dense weights where they measured faster here ({where}; fp32 copies "
            f"{summary['fp32_copy_mb']} MB): at {big} rows {s['chosen_ms']:.0f} ms a step against {s['low_bit_ms']:.0f} ms")
