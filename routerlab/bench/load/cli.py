"""The command line of the harness: `python -m routerlab.bench.load [run|serve] [options]`.

Owns the arguments, `run_all` (the server's env caps, starting the server in a child process or in
this process, the phases in order, the JSON report) and `main` (writes the report, prints the JSON
or the summary, exit code 1 when anything failed). Knows nothing about what each phase measures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from routerlab.bench.load.driver import forget
from routerlab.bench.load.probes.faults import fault_tests
from routerlab.bench.load.probes.fuzz import fuzz_router_loading, safe_loading_checks
from routerlab.bench.load.probes.inputs import bad_input_test, queue_cap_test
from routerlab.bench.load.report import summary, verdict
from routerlab.bench.load.server import _serve_forever, serve, spawn
from routerlab.bench.load.soak import soak_test
from routerlab.bench.load.traffic import _mb, load_test
from routerlab.bench.load.training import training_load_test
from routerlab.core.base.paths import ASSETS

DEFAULT_OUT = ASSETS / "bench" / "load.json"
ROOM_OUT = ASSETS / "bench" / "room.json"
DESCRIPTION = "Load, fault, bad-input and loader-fuzz tests of the real app, over HTTP on localhost, measured."


def _cpu() -> str:
    from routerlab.bench.speed import cpu_model
    from routerlab.core.base.precision import cpu_has_native_bf16, cpu_vector_unit

    return f"{cpu_model()}, {cpu_vector_unit()}{', native bf16' if cpu_has_native_bf16() else ''}"


def _log_size(path: Path | None) -> int:
    return path.stat().st_size if path is not None and path.exists() else 0


# Gradio's own refusal of a request with too few arguments (a malformed call no page can send: the raw "wrong arity"
# case) is printed by Gradio's queue before any of the app's code runs; it is counted apart.
PROTOCOL = "didn't receive enough input values"


def _tracebacks(path: Path | None, start: int) -> dict | None:
    """Tracebacks the server logged since byte `start` of its log: for the app's inputs, and Gradio's protocol-level
    refusals (None: an in-process server has no log of its own)."""
    if path is None or not path.exists():
        return None
    with open(path, "rb") as f:
        f.seek(start)
        blocks = f.read().decode("utf-8", "replace").split("Traceback (most recent call last)")[1:]
    protocol = sum(PROTOCOL in b for b in blocks)
    return {"inputs": len(blocks) - protocol, "protocol": protocol}


def run_all(args, log=print) -> dict:
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    env = {"ROUTERLAB_MAX_NEW_TOKENS": str(args.cap), "ROUTERLAB_QUEUE_SIZE": str(args.queue_size),
           "ROUTERLAB_CONCURRENCY": str(args.concurrency), "ROUTERLAB_MAX_PROMPT_CHARS": "4000", "ROUTERLAB_ROOM": args.room,
           "GRADIO_TEMP_DIR": tempfile.mkdtemp(prefix="routerlab-gradio-")}
    report: dict[str, Any] = {"command": "python -m routerlab.bench.load " + " ".join(args.argv), "started": started,
                              "server_env": {k: v for k, v in env.items() if k.startswith("ROUTERLAB_")},
                              "machine": {"cpus": os.cpu_count(), "cpu": _cpu(), "loadavg_before": list(os.getloadavg())}}
    report["safe_loading"] = safe_loading_checks()
    if args.fuzz_cases:
        report["fuzz"] = fuzz_router_loading(args.fuzz_cases)
        log(f"[fuzz] {report['fuzz']}")
    server_log = None if args.inprocess else Path(tempfile.gettempdir()) / "routerlab-loadtest-server.log"
    if args.device:  # the child server loads its model where ROUTERLAB_DEVICE says (checked here, before it starts)
        from routerlab.core.base.device import ENV, choose_device

        env[ENV] = choose_device(args.device)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        if args.inprocess:
            from routerlab.core.decode.engine import Engine
            from routerlab.core.model.models import load_model

            loaded = load_model(device=args.device or "cpu")
            server = serve(Engine.from_loaded(loaded))
        else:
            server = spawn(env=env, log_path=server_log)
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    report["server"] = {"mode": "in-process" if args.inprocess else "child process (python -m routerlab.bench.load serve)", "pid": server.pid}
    try:
        phases = set(args.phases.split(","))
        if "load" in phases:
            report["load"] = load_test(server.url, args.sessions, args.generations, args.max_new, args.deadline, log=log)
        if "soak" in phases:
            report["soak"] = soak_test(server.url, args.soak_generations, log=log)
        if "training" in phases:
            report["training"] = training_load_test(server.url, min(4, args.sessions), min(16, args.generations), args.max_new, log=log)
            log(f"[training] {report['training']}")
        if "faults" in phases:
            report["faults"] = fault_tests(server.url, max_new=args.cap, log=log)
        if "bad_input" in phases:
            seen = _log_size(server_log)
            report["bad_input"] = bad_input_test(server.url, log=log)
            report["bad_input"]["server_log_tracebacks"] = _tracebacks(server_log, seen)  # for expected bad input: none
        if "queue" in phases:
            report["queue"] = queue_cap_test(server.url, args.queue_size)
            log(f"[queue] {report['queue']}")
        cache = Path(env["GRADIO_TEMP_DIR"])
        report["gradio_cache_mb"] = _mb(sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()))
    finally:
        forget(server.url)
        server.close()
    report["machine"]["loadavg_after"] = list(os.getloadavg())
    report["failures"] = verdict(report)
    report["passed"] = not report["failures"]
    return report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m routerlab.bench.load", description=DESCRIPTION)
    p.add_argument("mode", nargs="?", default="run", choices=["run", "serve", "room"],
                   help="run the tests (default), only serve, or the room benchmark (1-32 visitors at once, with the room and without; "
                        "writes --out, default assets/bench/room.json)")
    p.add_argument("--port", type=int, default=None, help="serve: port on 127.0.0.1")
    p.add_argument("--sessions", type=int, default=8, help="concurrent gradio_client visitors")
    p.add_argument("--generations", type=int, default=50, help="generations shared by the visitors")
    p.add_argument("--max-new", type=int, default=16, help="new tokens per load-test generation")
    p.add_argument("--cap", type=int, default=48, help="the server's ROUTERLAB_MAX_NEW_TOKENS (the token-cap fault test asks for exactly this)")
    p.add_argument("--concurrency", type=int, default=8, help="the server's ROUTERLAB_CONCURRENCY (8: every session's run in flight)")
    p.add_argument("--room", choices=["on", "off"], default="on", help="the server's ROUTERLAB_ROOM: one batched decode loop, or each run alone")
    p.add_argument("--queue-size", type=int, default=16, help="the server's ROUTERLAB_QUEUE_SIZE")
    p.add_argument("--fuzz-cases", type=int, default=200)
    p.add_argument("--deadline", type=float, default=1500.0, help="seconds the load phase may take at most")
    p.add_argument("--inprocess", action="store_true", help="serve from this process (RSS then includes the clients)")
    p.add_argument("--phases", default="load,training,faults,bad_input,queue",
                   help="which server phases to run (comma-separated; training: 4 visitors generate alone, then while one trains; "
                        "soak: --soak-generations at the page's defaults, 1 and then 8 at a time, 64-96 new tokens; run it with --cap 256)")
    p.add_argument("--soak-generations", type=int, default=100, help="generations per concurrency level of the soak phase")
    p.add_argument("--levels", default=None, help="room: visitors at once, comma-separated (default: 1,2,4,8,16,32)")
    p.add_argument("--room-modes", default=None, help="room: servers to measure, comma-separated, from room (the loop in an "
                   "engine process), room-thread (ROUTERLAB_ENGINE=thread) and alone (default: room,alone)")
    p.add_argument("--room-rounds", type=int, default=3, help="room: runs of each level and of the loop alone; the "
                   "record keeps their medians (default 3: this machine's speed drifts between runs)")
    p.add_argument("--no-extras", action="store_true", help="room: only the levels (no command-line comparison, no 8-visitor "
                   "variants, no isolated step)")
    p.add_argument("--device", default=None, help="where the server's model runs: cpu, cuda or cuda:N (default: "
                   "$ROUTERLAB_DEVICE, else cuda when available; the in-process server: cpu)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="JSON results file ('-' for none)")
    p.add_argument("--json", action="store_true", help="print the JSON report")
    return p


def _step_costs() -> dict:
    """The batched step itself, in this (main) thread: ms per step and per step's products at 1-32 rows."""
    from routerlab.bench.products.batch import batch_steps
    from routerlab.core.decode.engine import Engine
    from routerlab.core.kernels import batch_paths
    from routerlab.core.model.models import load_model
    from routerlab.tuning.checkpoint import load_routers
    from routerlab.ui.state.resources import ROUTERS_DIR

    engine = Engine.from_loaded(load_model(device="cpu"))
    routers = load_routers(ROUTERS_DIR / "attention-token", engine.model)[0]
    paths = batch_paths.tune(engine.anatomy)  # as the app does before serving a room
    return {"routers": "attention-token", "threshold": 0.5, "product_paths": paths, "sizes": batch_steps(engine, routers)}


def _room(args) -> int:
    from routerlab.bench.load.room import DEFAULT_MODES, LEVELS, MODES, room_bench

    try:
        levels = tuple(int(n) for n in args.levels.split(",")) if args.levels else LEVELS
        modes = tuple(m.strip() for m in args.room_modes.split(",")) if args.room_modes else DEFAULT_MODES
    except ValueError:
        print(f"error: --levels takes whole numbers, comma-separated (e.g. 1,8), not {args.levels!r}", file=sys.stderr)
        return 2
    if not levels or min(levels) < 1 or not set(modes) <= set(MODES) or args.room_rounds < 1:
        print(f"error: --levels: numbers >= 1; --room-modes: from {', '.join(MODES)}; --room-rounds: 1 or more", file=sys.stderr)
        return 2
    report = {"command": "python -m routerlab.bench.load " + " ".join(args.argv), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
              **room_bench(levels, log=lambda *a: print(*a, file=sys.stderr, flush=True), modes=modes, extras=not args.no_extras,
                         rounds=args.room_rounds)}
    report["machine"].update(cpu=_cpu())
    if not args.no_extras:
        from routerlab.bench.load.room import served_vs_step

        report["steps"] = _step_costs()
        report["served_vs_isolated_step"] = served_vs_step(report)
    out = ROOM_OUT if args.out == str(DEFAULT_OUT) else args.out
    if out != "-":
        Path(out).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps({"ratios": report["ratios"], "served_vs_loop": report.get("served_vs_loop"),
                      "served_vs_isolated_step": report.get("served_vs_isolated_step")}, indent=1))
    failed = sum(r["errors"] for m in report["modes"].values() for r in m["levels"].values())
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    if args.mode == "serve":
        return _serve_forever(args.port or 7861)
    if args.mode == "room":
        return _room(args)
    if args.queue_size < 1 or args.concurrency < 1 or args.sessions < 1 or args.generations < 1:
        print("error: sessions, generations, concurrency and queue size must be at least 1", file=sys.stderr)
        return 2
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (lambda *a: print(*a, flush=True))
    report = run_all(args, log=log)
    text = json.dumps(report, indent=1, ensure_ascii=False)
    if args.out != "-":
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    if args.json:
        print(text)
    else:
        print(summary(report))
    return 0 if report["passed"] else 1
