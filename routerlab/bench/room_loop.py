"""The room's loop alone, with and without packed forwards, side by side: `python -m routerlab.bench.room_loop`.

N requests (the example prompts in turn, the page's defaults: the default router set at 0.5, `kv`, greedy, 64 new
tokens, Measure quality on) join one `Room` at once, stepped in the main thread of this process (no web server, no
clients) until all end; the same load three ways, alternating rounds: packed forwards that read the prompts' shared
start once (the app's way), packed forwards only, and one row at a time (`Room.share_starts`, `Room.pack_quality`,
`Room.pack_prefill`). Prints each run's tokens/s, the CPU seconds its process spent per token (every thread: what the
served room's engine process is compared with) and where the loop's time went (`Room.time_spent`), and the medians.
Measures the decode loop's own work, so `make room`'s served figures can be read against it. Knows nothing about
servers or the UI. With `--stdin` (what `make room` compares its served rounds with), each row ends at the end of
text, as on the page; elsewhere every row writes all its tokens, so runs compare the same work.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

from routerlab.core.base.config import GenerateConfig
from routerlab.core.decode.engine import Control, Engine
from routerlab.core.kernels import batch_paths, low_paths
from routerlab.core.routing.gates import Plan
from routerlab.core.serve.room import Room

KNOBS = ("pack_quality", "pack_prefill")


MODES = ("shared", "packed", "one_by_one")  # packed forwards reading shared prompt starts once; packed only; neither


def run(engine, routers, prompts: list[str], n: int, mode: str, new_tokens: int = 64, to_end_of_text: bool = False) -> dict:
    """`to_end_of_text`: a row ends at the model's end of text, as on the page (else every row makes `new_tokens`)."""
    room = engine.room = Room(engine)
    for knob in KNOBS:
        setattr(room, knob, mode != "one_by_one")
    room.share_starts = mode == "shared"
    room.prefill_budget_s = float("inf")  # every request is there at the start: all join the first step
    try:
        config = GenerateConfig(max_new_tokens=new_tokens, ignore_eos=not to_end_of_text, quality=True, threshold=0.5)
        readers = [engine.generate_ids(engine.encode(prompts[k % len(prompts)], config), routers, config, Control(0.5))
                   for k in range(n)]
        t0, cpu0 = time.perf_counter(), time.process_time()
        while any(room.busy.values()):
            room.step()
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0  # cpu: every thread of this process
        tokens = sum(len([s for s in r if not s.is_prompt]) for r in readers)
    finally:
        engine.room = None
    spent = room.time_spent()
    phases = {k: spent[k] for k in ("prefill", "quality", "forward", "other")}
    total = sum(phases.values())
    return {"tokens_per_s": round(tokens / wall, 1), "cpu_ms_per_token": round(1e3 * cpu / tokens, 2), "tokens": tokens, "share": {k: round(v / total, 2) for k, v in phases.items()},
            "packed": room.packed}


def main(argv: list[str] | None = None) -> int:
    from routerlab.core.model.models import load_model
    from routerlab.tuning.checkpoint import load_routers
    from routerlab.ui.state.resources import ROUTERS_DIR, load_prompts

    p = argparse.ArgumentParser(prog="python -m routerlab.bench.room_loop", description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="8,32", help="requests at once, comma-separated")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of the three ways")
    p.add_argument("--modes", default=",".join(MODES), help=f"which of {', '.join(MODES)} (comma-separated; shared is the app's way)")
    p.add_argument("--router-set", default="attention-token")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: $ROUTERLAB_DEVICE, else cuda when available)")
    p.add_argument("--stdin", action="store_true", help="instead: the app's way (shared) at each row count read from "
                   "standard input, one per line, printing one JSON line per run (make room runs it between its served rounds)")
    p.add_argument("--paths", action="store_true", help="instead: the app's way (shared) with the products batch_paths "
                   "chooses now against fp32 copies only (its rule before), alternating rounds")
    p.add_argument("--kernels", action="store_true", help="instead: the app's way (shared) with the one-row kernels "
                   "core/kernels/low_paths.py chooses against torch's int4 kernel for every map, alternating rounds")
    p.add_argument("--decode", action="store_true", help="instead: the app's way (shared) with every row the step graph "
                   "can take decoding through it (core/graph/graph_rows.py) against torch's ops for every row, alternating rounds")
    args = p.parse_args(argv)
    engine = Engine.from_loaded(load_model(device=args.device), choose_kernels=not args.kernels)
    routers = load_routers(ROUTERS_DIR / args.router_set, engine.model)[0]
    prompts = load_prompts()
    if args.paths:
        return compare_paths(engine, routers, prompts, [int(x) for x in args.rows.split(",")], args.rounds)
    if args.kernels:
        return compare_kernels(engine, routers, prompts, [int(x) for x in args.rows.split(",")], args.rounds)
    if args.decode:
        return compare_decode(engine, routers, prompts, [int(x) for x in args.rows.split(",")], args.rounds)
    print(batch_paths.describe(batch_paths.tune(engine.anatomy)), flush=True)  # as a served room does before serving
    if args.stdin:
        return serve_stdin(engine, routers, prompts)
    modes = tuple(m for m in MODES if m in args.modes.split(","))
    if not modes:
        p.error(f"--modes takes some of {', '.join(MODES)}, not {args.modes!r}")
    report = {"machine": platform.processor() or platform.machine(), "rows": {}}
    for n in [int(x) for x in args.rows.split(",")]:
        run(engine, routers, prompts, n, "shared", new_tokens=8)  # warm-up
        rates: dict[str, list[float]] = {m: [] for m in modes}
        cpu: dict[str, list[float]] = {m: [] for m in modes}
        for r in range(args.rounds):
            for mode in (modes if r % 2 == 0 else modes[::-1]):
                out = run(engine, routers, prompts, n, mode)
                rates[mode].append(out["tokens_per_s"])
                cpu[mode].append(out["cpu_ms_per_token"])
                print(f"{n} rows, {mode}: {json.dumps(out)}", flush=True)
        med = {m: statistics.median(v) for m, v in rates.items()}
        ratios = {f"{m}_vs_one_by_one": round(med[m] / med["one_by_one"], 2) for m in modes[:2] if "one_by_one" in med and m != "one_by_one"}
        report["rows"][n] = {**med, **ratios, **{f"{m}_cpu_ms_per_token": statistics.median(v) for m, v in cpu.items()}}
        print(f"== {n} rows: " + ", ".join(f"{m} {v:.1f}" for m, v in med.items()) + " tokens/s", flush=True)
    print(json.dumps(report))
    return 0


def serve_stdin(engine, routers, prompts: list[str]) -> int:
    """One run of the app's way (shared) per row count read from standard input; a JSON line each (rows, tokens/s, CPU
    per token, tokens). Each row ends at the end of text, as the page's do: the served rounds it is compared with ask
    the same prompts for the same work (with every row made to write all its tokens, the loop alone wrote 2,048 tokens
    where 32 visitors were served 1,763: the same prefill and quality passes over 14% more tokens). The first run at a
    row count is preceded by a short warm-up. Ends at the end of its input."""
    warm: set[int] = set()
    print(json.dumps({"ready": True}), flush=True)
    for line in iter(input_line, None):
        n = int(line)
        if n not in warm:
            run(engine, routers, prompts, n, "shared", new_tokens=8)
            warm.add(n)
        out = run(engine, routers, prompts, n, "shared", to_end_of_text=True)
        print(json.dumps({"rows": n, "tokens_per_s": out["tokens_per_s"], "cpu_ms_per_token": out["cpu_ms_per_token"],
                          "tokens": out["tokens"]}), flush=True)
    return 0


def input_line() -> str | None:
    """The next non-empty line of standard input, None at its end."""
    while True:
        try:
            line = input().strip()
        except EOFError:
            return None
        if line:
            return line


def alternate(engine, routers, prompts: list[str], rows: list[int], rounds: int, use, names: tuple[str, str]) -> int:
    """The room's loop (shared, the app's way) under two settings, `use(name)` switching to one (names: the setting
    measured, then its baseline), alternating rounds at each row count; prints medians, their ratio and a JSON report."""
    ours, base = names
    report = {"machine": platform.processor() or platform.machine(), "rows": {}}
    for n in rows:
        use(ours)
        run(engine, routers, prompts, n, "shared", new_tokens=8)  # warm-up
        rates: dict[str, list[float]] = {name: [] for name in names}
        for r in range(rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                use(name)
                rates[name].append(run(engine, routers, prompts, n, "shared")["tokens_per_s"])
        med = {k: statistics.median(v) for k, v in rates.items()}
        report["rows"][n] = {**med, f"{ours}_vs_{base}": round(med[ours] / med[base], 3), "rounds": rates}
        print(f"== {n} rows: {ours} {med[ours]:.1f}, {base} {med[base]:.1f} tokens/s ({med[ours] / med[base]:.2f}x)", flush=True)
    print(json.dumps(report))
    return 0


def compare_paths(engine, routers, prompts: list[str], rows: list[int], rounds: int) -> int:
    """The room's loop with batch_paths' choice against its fp32-copies-only choice, from one measurement."""
    an = engine.anatomy
    measured = batch_paths.measure(an)
    choices = {"chosen": batch_paths.choose(measured)[:2], "fp32_only": batch_paths.choose(measured, dense=False)[:2]}
    for name, (choice, own) in choices.items():
        print(f"{name}: " + ", ".join(f"{k} from {v}{' (own dtype)' if k in own else ''}" for k, v in choice.items() if v), flush=True)
    return alternate(engine, routers, prompts, rows, rounds, lambda name: batch_paths.apply(an, *choices[name]),
                     ("chosen", "fp32_only"))


def compare_kernels(engine, routers, prompts: list[str], rows: list[int], rounds: int) -> int:
    """The room's loop with the one-row kernels low_paths chooses against torch's int4 kernel for every map (the
    products of more rows as batch_paths chooses them, the same both ways). `engine` comes with torch's kernel
    throughout (`choose_kernels=False`)."""
    an = engine.anatomy
    maps = [w for ws in batch_paths.kinds(an).values() for w in ws]
    print(batch_paths.describe(batch_paths.tune(an)), flush=True)  # as a served room does before serving
    copies = {"int4": [(w.low, w.one_low) for w in maps]}
    print(low_paths.describe(low_paths.tune(an)), flush=True)
    copies["chosen"] = [(w.low, w.one_low) for w in maps]

    def use(name: str) -> None:
        for w, (low, one_low) in zip(maps, copies[name]):
            w.low, w.one_low = low, one_low

    return alternate(engine, routers, prompts, rows, rounds, use, ("chosen", "int4"))


def compare_decode(engine, routers, prompts: list[str], rows: list[int], rounds: int) -> int:
    """The room's loop with its rows through the step graph against torch's ops (the kernels and products of more rows
    as the engine chose them, the same both ways)."""
    print(batch_paths.describe(batch_paths.tune(engine.anatomy)), flush=True)  # as a served room does before serving
    reason = engine.runtime.why_not(Plan(routers))
    if reason is not None:
        raise SystemExit(f"room_loop --decode: no step graph ({reason})")

    def use(name: str) -> None:
        engine.decode = name

    return alternate(engine, routers, prompts, rows, rounds, use, ("graph", "torch"))


if __name__ == "__main__":
    raise SystemExit(main())
