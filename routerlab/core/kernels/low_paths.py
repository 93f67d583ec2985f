"""Which kernel each kind of linear map multiplies one row with (a decode step): torch's int4 kernel on the file's
codes, or onnxruntime's `MatMulNBits` on the same codes (core/kernels/nbits.py); measured at start-up, never assumed.

The best one-row kernel differs between machines. On a 2-core Xeon with AMX (2026-12-06) the head alone took
1.44 ms a call with torch's int4 kernel and 0.62 ms with `MatMulNBits` on the file's Q8_0 codes, and decode ran faster
with the head through it (`python -m routerlab.bench.products.nbits --maps head`); the layers' maps were slower through
it there (docs/results.md, "The head alone through onnxruntime on the Xeon with AMX"). On an AVX2-only CPU, where torch's int4 kernel is slow, other maps may win: `tune` finds out.

`tune` times, for each kind of map (`batch_paths.kinds`: the head, q|k|v, q, k|v, the output map, gate|up, down), one
row through every map of the kind as a step streams them, with each kernel, in alternating rounds; a kind where
onnxruntime's copy costs at most `MARGIN` of the int4 kernel's is a candidate. A session's call has a fixed cost among
torch's ops, whose pool of threads spins a while after each op, that timing a kind's maps alone does not see (the
head's 0.76 ms saved alone were 0.53 ms in whole steps), so `confirm` then times a step's products in their order
(each layer's maps, then the head) without and with each candidate, largest saving first, and keeps those that save at
least 2% of it.

Where the kept copy serves:
- The head: one row only (`Weight.one_low`: a decode step, a room's batch of one). Batches of more rows keep torch's
  kernel (or batch_paths' dense product): through onnxruntime at every row count the head made the room's loop at 8
  rows 0.93x as fast (`python -m routerlab.bench.room_loop --kernels`), while a row alone gained 1.03-1.12x. A row's
  logits may so differ with the rows beside it by the rounding below, as they already did where batch_paths takes
  dense products from some batch size on; no routing decision reads the head.
- A layer's maps: every decode product (`Weight.low` itself; batch_paths then measures it against the dense weights
  for batches), so that a token's hidden states, and the routers' decisions on them, are the same whether its row
  decodes alone or in a batch (onnxruntime's products are the same for a row alone and among others, tested).
Both kernels compute the file's own codes; the products differ by the rounding of 8-bit activations (relative error
0.007 against int4's 0.003 on the head, from bf16 inputs).

Applies only where the anatomy holds a file's own codes (the embedded model on a CPU) and onnxruntime and onnx are
installed; `ENV` = "torch" keeps torch's kernel everywhere (the test suite sets it: its exact comparisons must not
depend on a timing). Knows nothing about routers, caches or the UI: only the Anatomy's `Weight`s.
"""

from __future__ import annotations

import logging
import os
import statistics
import time

import torch

from routerlab.core.kernels import nbits
from routerlab.core.kernels.batch_paths import kinds
from routerlab.core.kernels.weights import Codes, Int4, Weight

log = logging.getLogger(__name__)

ENV = "ROUTERLAB_KERNELS"  # "auto" (default): measure and choose; "torch": torch's int4 kernel for every map
MARGIN = 0.8  # onnxruntime's copy is a candidate where one row through a kind's maps costs at most this share of int4's
STEP_MARGIN = 0.98  # ... and is taken where a step's products with it cost at most this share of them without it
STEP_ROUNDS = 15  # a step's products take ~6 ms on 2 cores: more rounds, as the gain to confirm is a few percent
STEP_ORDER = ("qkv", "q", "kv", "o", "gate_up", "down")  # a layer's maps as a step meets them (q, kv: a skipped token's)
ROUNDS = 5
NAMES = {"head": "the head", "qkv": "q|k|v", "q": "q", "kv": "k|v", "o": "the output maps", "gate_up": "gate|up",
         "down": "down"}


def why_not(an) -> str | None:
    """Why the anatomy's maps keep torch's kernel without a measurement, or None where `tune` measures."""
    if os.environ.get(ENV, "auto").strip().lower() == "torch":
        return f"{ENV}=torch"
    if an.lowbit is None or an.lowbit.codes is None:
        return "no file codes (onnxruntime's copy is built from a GGUF file's own codes)"
    if not nbits.available():
        return "onnxruntime is not installed"
    return None


def _maps(an) -> dict[str, list[Weight]]:
    """Each kind's maps whose low-bit copy is torch's int4 kernel on a file's codes."""
    return {kind: ws for kind, ws in kinds(an).items() if all(isinstance(w.low, Int4) and w.names for w in ws)}


@torch.inference_mode()
def measure(an, rounds: int = ROUNDS) -> tuple[dict[str, tuple[float, float]], dict[str, list]]:
    """kind -> (seconds of one row through its maps with the int4 kernel, with onnxruntime's), medians of `rounds`
    alternating after a warm-up of each; and kind -> onnxruntime's copies (one per map, in order)."""
    threads = torch.get_num_threads()
    codes = an.lowbit.codes
    times, copies = {}, {}
    for kind, maps in _maps(an).items():
        theirs = [nbits.NBits(Codes.cat([codes[n] for n in w.names]), threads) for w in maps]
        x = torch.randn(1, maps[0].dense.shape[1], generator=torch.Generator().manual_seed(0)).to(an.dtype)
        times[kind] = _alternating([(w.low.mm, x) for w in maps], [(c.mm, x) for c in theirs], rounds)
        copies[kind] = theirs
    return times, copies


def choose(times: dict[str, tuple[float, float]], margin: float = MARGIN) -> set[str]:
    """The kinds whose maps may take onnxruntime's copy (`confirm` has the last word): where it costs at most
    `margin` of the int4 kernel's time."""
    return {kind for kind, (int4, theirs) in times.items() if theirs <= margin * int4}


def _step(an, copies: dict[str, list], ours: set[str]) -> list[tuple]:
    """A decode step's products in its order (each layer's maps, then the head), one row each: (product, input),
    the kinds in `ours` through onnxruntime's copies."""
    maps, inputs, out = _maps(an), {}, []
    order = [(kind, i) for i in range(an.n_layers) for kind in STEP_ORDER if kind in maps] + [("head", 0)] * ("head" in maps)
    for kind, i in order:
        w = maps[kind][i]
        k = w.dense.shape[1]
        x = inputs.setdefault(k, torch.randn(1, k, generator=torch.Generator().manual_seed(k)).to(an.dtype))
        out.append((copies[kind][i].mm if kind in ours else w.low.mm, x))
    return out


def _run(products: list[tuple]) -> float:
    t0 = time.perf_counter()
    for mm, x in products:
        mm(x)
    return time.perf_counter() - t0


def _alternating(a: list[tuple], b: list[tuple], rounds: int) -> tuple[float, float]:
    """Medians of `rounds` runs of two lists of (product, input), alternating which goes first, after a warm-up of each."""
    _run(a), _run(b)
    seconds: list[list[float]] = [[], []]
    for r in range(rounds):
        for i in (0, 1) if r % 2 == 0 else (1, 0):
            seconds[i].append(_run((a, b)[i]))
    return statistics.median(seconds[0]), statistics.median(seconds[1])


@torch.inference_mode()
def confirm(an, shortlist: set[str], copies: dict[str, list], times: dict, rounds: int = STEP_ROUNDS) -> tuple[set[str], dict]:
    """The kinds of `shortlist` that also make a step's products faster, tried one at a time, the largest saving
    first: a kind stays where a step's products with it cost at most `STEP_MARGIN` of them without it (its calls
    among torch's, whose pool of threads spins a while after each op: what timing a kind's maps alone does not see).
    Returns the kinds and the step's products' seconds with torch's kernel throughout and with the kinds kept."""
    ours: set[str] = set()
    steps = {"int4": None, "chosen": None}
    for kind in sorted(shortlist, key=lambda k: times[k][1] - times[k][0]):
        without, with_it = _alternating(_step(an, copies, ours), _step(an, copies, ours | {kind}), rounds)
        steps["int4"] = steps["int4"] or without
        if with_it <= STEP_MARGIN * without:
            ours.add(kind)
            steps["chosen"] = with_it
    steps["chosen"] = steps["chosen"] or steps["int4"]
    return ours, steps


def tune(an, rounds: int = ROUNDS) -> dict:
    """Measure, choose and apply (see the module docstring). Returns what was measured and chosen, for logs and
    reports: {"onnxruntime": [kinds], "one_row_ms": {kind: [int4, onnxruntime]}, "skipped": reason or None}."""
    reason = why_not(an)
    if reason is not None:
        return {"onnxruntime": [], "one_row_ms": {}, "skipped": reason}
    start = time.perf_counter()
    try:
        times, copies = measure(an, rounds)
        ours, steps = confirm(an, choose(times), copies, times)
    except Exception as err:  # an onnxruntime that fails to build or run a graph: torch's kernel, said so; never a failed start
        result = {"onnxruntime": [], "one_row_ms": {}, "skipped": f"onnxruntime failed ({type(err).__name__}: {err})"}
        log.warning("%s", describe(result))
        return result
    maps = _maps(an)
    for kind in ours:
        for w, copy in zip(maps[kind], copies[kind]):
            if kind == "head":
                w.one_low = copy  # one row; no decision reads it
            else:
                w.low = copy  # every decode product of the layer's maps: a row's decisions are the same in a batch
    result = {"onnxruntime": sorted(ours), "one_row_ms": {k: [round(1e3 * t, 3) for t in v] for k, v in times.items()},
              "step_products_ms": {k: None if v is None else round(1e3 * v, 3) for k, v in steps.items()},
              "skipped": None, "seconds": round(time.perf_counter() - start, 2)}
    log.info("%s", describe(result))
    return result


def chosen(an) -> list[str]:
    """The kinds whose maps multiply one row through onnxruntime now."""
    return [kind for kind, ws in kinds(an).items()
            if ws and all(isinstance(w.one_low, nbits.NBits) or isinstance(w.low, nbits.NBits) for w in ws)]


def label(an) -> str:
    """What `LowBitPlan.label` adds about the kernels: e.g. "; one row of the head through onnxruntime's MatMulNBits"."""
    ours = chosen(an)
    return f"; one row of {', '.join(NAMES.get(k, k) for k in ours)} through onnxruntime's MatMulNBits" if ours else ""


def weights_label(lowbit_label: str, an) -> str:
    """A `LowBitPlan.label` with the kinds that multiply through onnxruntime now, e.g. "the file's own Q4_1 + Q8_0
    codes (int4 kernel; the head through onnxruntime's MatMulNBits); 16-bit weights for prefill"."""
    return lowbit_label.replace(" (int4 kernel)", f" (int4 kernel{label(an)})")


def describe(result: dict) -> str:
    if result.get("skipped"):
        return f"one-row products: torch's int4 kernel for every map ({result['skipped']})"
    times = ", ".join(f"{NAMES.get(k, k)} {a:.2f} / {b:.2f}" for k, (a, b) in result["one_row_ms"].items())
    ours = result["onnxruntime"]
    which = ", ".join(NAMES.get(k, k) for k in ours) if ours else "no map"
    step = result.get("step_products_ms") or {}
    confirmed = f"; a step's products {step['int4']:.2f} -> {step['chosen']:.2f} ms" if step.get("int4") else ""
    return (f"one-row products through onnxruntime's MatMulNBits: {which} (ms a step's row with torch's int4 kernel / "
            f"onnxruntime's: {times}{confirmed}; measured in {result['seconds']:.1f} s)")
