"""The room benchmark: a whole room presses Generate at once, with the shared decode loop and without it, in one run.

Owns `room_bench`: for each mode (the room: one batched decode loop, `ROUTERLAB_ROOM=on` at the app's defaults, its loop
in an engine process; `room-thread`, on request: the same loop in the web server's process, `ROUTERLAB_ENGINE=thread`; and
the path before the room: each generation alone in a worker thread, `ROUTERLAB_ROOM=off` with the caps it had, 2 at
once and a queue of 16) it starts the real app in a child process, then at each level 1, 2, 4, 8, 16 and 32
visitors start one generation each at the same moment (64 new tokens, the page's example prompts and its default
settings: quality on). Per level: aggregate tokens/s, each visitor's own streaming rate (p5, p50), time to first
token (p50, p95), errors (a status without ✓ counts) and refusals (a full queue). At 8 visitors, with the room, the
full model and the default set at thresholds 0.5 and 0.7 (does skipping pay when rows share a step?). Knows nothing
about tensors; the server says where its loop ran.
"""

from __future__ import annotations

import os
import shlex
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from routerlab.bench.load import cpu
from routerlab.bench.load.driver import client, open_page, probe, submit, tokens_shown, trace_of
from routerlab.bench.load.server import spawn
from routerlab.bench.load.soak import page_defaults
from routerlab.bench.load.traffic import pct

LEVELS = (1, 2, 4, 8, 16, 32)
POLL_S = 0.1  # how often a visitor looks at its stream: the clients share the server's 2 cores, so they look rarely
MODES = {"room": {"ROUTERLAB_ROOM": "on", "ROUTERLAB_ENGINE": "process"},  # the app's default: the loop in an engine process
         "room-thread": {"ROUTERLAB_ROOM": "on", "ROUTERLAB_ENGINE": "thread"},  # the loop in the web server's own process
         "alone": {"ROUTERLAB_ROOM": "off", "ROUTERLAB_CONCURRENCY": "2", "ROUTERLAB_QUEUE_SIZE": "16"}}  # the path before the room, its caps
DEFAULT_MODES = ("room", "alone")


def _visitor(c, prompt: str, settings: dict, new_tokens: int, deadline: float, out: dict) -> None:
    """One visitor whose page is open (`c`, a connected client): presses Generate now and watches the stream."""
    t0 = time.perf_counter()
    first = last = None
    seen = 0
    try:
        job = submit(c, prompt, settings["threshold"], settings["router_set"], settings["kv_policy"], new_tokens)
        while not job.done():
            if time.perf_counter() > deadline:
                job.cancel()
                raise TimeoutError("not served before the deadline")
            shown = tokens_shown(job)
            if shown > seen:
                last = time.perf_counter()
                first, seen = first or last, shown
            time.sleep(POLL_S)
        result = job.result(timeout=30)
        end = time.perf_counter()
        status = str(result[3])
        tokens = len(trace_of(result).generated_steps)
        out.update(ok=status.startswith("✓"), status=status[:160], tokens=tokens, ttft=(first or end) - t0,
                   rate=(tokens - 1) / (end - first) if first and tokens > 1 and end > first else None, end=end)
    except Exception as err:
        text = f"{type(err).__name__}: {err}"
        out.update(ok=False, status=text[:200], tokens=0, refused="queue" in text.lower() and "full" in text.lower())
    finally:
        c.close()


def level_run(url: str, sessions: int, settings: dict, prompts: list[str], new_tokens: int = 64, deadline_s: float = 240.0,
              server_pid: int | None = None) -> dict:
    """`sessions` visitors start one generation each at the same moment. With `server_pid`, also the CPU seconds the
    web server's process, the processes it started (the engine process) and this one (the clients) used meanwhile."""
    outs = [dict() for _ in range(sessions)]
    # Every visitor's page is open before anyone presses Generate: connecting a client (it reads the app's config and
    # API) and running the page's load events (driver.open_page) is a page load, not part of what the room serves, and
    # 32 of them at once take seconds of the 2 cores.
    def page(_):
        c = client(url)
        open_page(c, url)
        return c

    with ThreadPoolExecutor(min(sessions, 8)) as pool:
        clients = list(pool.map(page, range(sessions)))
    cpu0, clients0 = (cpu.tree(server_pid) if server_pid else None), cpu.this_process()
    spent0 = _spent(url) if server_pid else None
    start = time.perf_counter()
    threads = [threading.Thread(target=_visitor, args=(clients[k], prompts[k % len(prompts)], settings, new_tokens, start + deadline_s, outs[k]),
                                daemon=True) for k in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(deadline_s + 60)
    ok = [o for o in outs if o.get("ok")]
    wall = max((o["end"] for o in ok), default=start) - start
    rates = [o["rate"] for o in ok if o.get("rate")]
    ttft = [o["ttft"] for o in ok]
    tokens = sum(o["tokens"] for o in ok)
    cpu1 = cpu.tree(server_pid) if cpu0 else None
    used = {"web_server_cpu_s": round(cpu1["server"] - cpu0["server"], 1), "engine_cpu_s": round(cpu1["children"] - cpu0["children"], 1),
            "clients_cpu_s": round(cpu.this_process() - clients0, 1)} if cpu1 else {}
    if used and tokens:
        used["server_cpu_ms_per_token"] = round(1e3 * (used["web_server_cpu_s"] + used["engine_cpu_s"]) / tokens, 1)
    if spent0:
        used["loop"] = loop_split(spent0, _spent(url))
    return {**used,
        "sessions": sessions, "served": len(ok), "errors": sum(not o.get("ok") and not o.get("refused") for o in outs),
        "refusals": sum(bool(o.get("refused")) for o in outs), "tokens": tokens,
        "aggregate_tokens_per_s": round(tokens / wall, 1) if wall > 0 else None,
        "visitor_tokens_per_s_p5": round(pct(rates, 0.05), 1) if rates else None,
        "visitor_tokens_per_s_p50": round(statistics.median(rates), 1) if rates else None,
        "time_to_first_token_s_p50": round(pct(ttft, 0.5), 2) if ttft else None,
        "time_to_first_token_s_p95": round(pct(ttft, 0.95), 2) if ttft else None,
        "wall_s": round(wall, 1), "failures": [o["status"] for o in outs if not o.get("ok")][:5],
    }


def _spent(url: str) -> dict | None:
    return (probe(url).get("room") or {}).get("spent") or None


def loop_split(before: dict, after: dict) -> dict:
    """Where the room's loop spent a run's time (Room.time_spent before and after it): each phase's share of the
    loop's seconds, the seconds, and the mean rows of a batched step. (The engine process sends its figures with its
    Steps, so `after` may miss the last few milliseconds.)"""
    phases = [k for k in after if k not in ("steps", "rows") and not k.startswith("packed_")]
    seconds = {k: after[k] - before.get(k, 0.0) for k in phases}
    total = sum(seconds.values())
    steps = after.get("steps", 0) - before.get("steps", 0)
    return {"seconds": round(total, 1), **{k: round(v / total, 3) for k, v in seconds.items() if total > 0},
            "mean_rows": round((after.get("rows", 0) - before.get("rows", 0)) / steps, 1) if steps else None,
            **{k: after[k] - before.get(k, 0) for k in after if k.startswith("packed_")}}


def app_vs_cli(url: str, settings: dict, prompt: str, new_tokens: int = 64, rounds: int = 3) -> dict:
    """One visitor alone in the app against `python -m routerlab generate` (a fresh process each round) on the same
    prompt and settings, alternating; decode tokens/s as each records it (the trace, the CLI's JSON)."""
    import json
    import subprocess
    import sys

    from routerlab.core.paths import ROOT

    app, cli = [], []
    cmd = [sys.executable, "-m", "routerlab", "generate", "--prompt", prompt, "--max-new-tokens", str(new_tokens),
           "--threshold", str(settings["threshold"]), "--kv-policy", settings["kv_policy"], "--json"]
    for _ in range(rounds):
        c = client(url)
        try:
            result = submit(c, prompt, settings["threshold"], settings["router_set"], settings["kv_policy"], new_tokens).result(timeout=300)
            app.append(trace_of(result).decode_tokens_per_second())
        finally:
            c.close()
        run = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT), timeout=600)
        cli.append(json.loads(run.stdout)["decode_tokens_per_second"])
    a, b = statistics.median(app), statistics.median(cli)
    return {"prompt": prompt, "new_tokens": new_tokens, "app_tokens_per_s": [round(x, 1) for x in app],
            "cli_tokens_per_s": [round(x, 1) for x in cli], "app_vs_cli": round(a / b, 2),
            "cli_command": shlex.join(["python", *cmd[1:]])}  # as a reader types it (the prompt quoted)


def ratios(report: dict) -> dict:
    """Per level, with the room: aggregate tokens/s and the slowest visitor's own rate (p5) against one session's own
    streaming rate (its visitor rate at level 1, the same run), and the aggregate against the alone path's."""
    modes = report["modes"]
    room = modes.get("room", {}).get("levels", {})
    alone, thread = (modes.get(m, {}).get("levels", {}) for m in ("alone", "room-thread"))
    one = room.get("1", {}).get("visitor_tokens_per_s_p50")

    def ratio(a, b):
        return round(a / b, 2) if a and b else None

    return {n: {"aggregate_vs_one_session": ratio(r["aggregate_tokens_per_s"], one),
                "visitor_p5_vs_one_session": ratio(r["visitor_tokens_per_s_p5"], one),
                "aggregate_vs_alone_path": ratio(r["aggregate_tokens_per_s"], alone.get(n, {}).get("aggregate_tokens_per_s")),
                **({"aggregate_vs_thread_engine": ratio(r["aggregate_tokens_per_s"], thread.get(n, {}).get("aggregate_tokens_per_s"))}
                   if thread else {})}
            for n, r in room.items()}


def room_bench(levels: tuple[int, ...] = LEVELS, new_tokens: int = 64, log=print, modes: tuple[str, ...] = DEFAULT_MODES,
               extras: bool = True) -> dict:
    """`modes`: which servers of MODES, one after another; `extras`: with the room, also one visitor against the command
    line and 8 visitors with the full model and two thresholds."""
    from routerlab import ui

    prompts = ui.load_prompts()
    report: dict = {"levels": list(levels), "new_tokens": new_tokens, "modes": {}}
    for mode in modes:
        env = MODES[mode]
        env = {**env, "GRADIO_TEMP_DIR": tempfile.mkdtemp(prefix="routerlab-room-")}
        server = spawn(env=env, log_path=Path(tempfile.gettempdir()) / f"routerlab-room-{mode}.log")
        try:
            settings = page_defaults(server.url)
            level_run(server.url, 1, settings, prompts, 8)  # warm-up: first calls pay one-time set-up
            rows = {}
            for n in levels:
                rows[str(n)] = level_run(server.url, n, settings, prompts, new_tokens, server_pid=server.pid)
                if log:
                    log(f"[room] {mode}, {n} at once: {rows[str(n)]}")
            out = {"server_env": {k: v for k, v in env.items() if k.startswith("ROUTERLAB_")}, "settings": settings,
                   "loop": probe(server.url).get("room"), "levels": rows}
            if mode == "room" and extras:
                out["one_visitor_vs_cli"] = app_vs_cli(server.url, settings, prompts[0], new_tokens)
                if log:
                    log(f"[room] one visitor against the command line: {out['one_visitor_vs_cli']}")
            if mode == "room" and extras and 8 in levels:
                variants = {"full model": dict(settings, router_set=ui.FULL),
                            f"{settings['router_set']} at 0.5": dict(settings, threshold=0.5),
                            f"{settings['router_set']} at 0.7": dict(settings, threshold=0.7)}
                out["eight_sessions"] = {name: level_run(server.url, 8, s, prompts, new_tokens) for name, s in variants.items()}
                if log:
                    log(f"[room] 8 at once: {out['eight_sessions']}")
            report["modes"][mode] = out
        finally:
            server.close()
    report["ratios"] = ratios(report)
    report["machine"] = {"cpus": os.cpu_count()}
    if "room" in report["modes"]:  # after the servers closed: the machine is the loop's alone
        report["loop_alone"] = loop_alone(levels)
        report["served_vs_loop"] = served_vs_loop(report)
        if log:
            log(f"[room] served against the loop alone: {report['served_vs_loop']}")
    return report


def loop_alone(levels: tuple[int, ...]) -> dict:
    """The room's loop alone at each level's rows (`python -m routerlab.bench.room_loop`, the app's way, in a process
    of its own with nothing else running): tokens/s and the CPU its process spent per token."""
    import json
    import subprocess
    import sys

    from routerlab.core.paths import ROOT

    cmd = [sys.executable, "-m", "routerlab.bench.room_loop", "--rows", ",".join(map(str, levels)), "--rounds", "1",
           "--modes", "shared"]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT), timeout=3600)
    if run.returncode != 0:
        return {"error": run.stderr.strip()[-400:]}
    rows = json.loads(run.stdout.strip().splitlines()[-1])["rows"]
    return {n: {"tokens_per_s": r["shared"], "cpu_ms_per_token": r["shared_cpu_ms_per_token"]} for n, r in rows.items()} | {
        "command": shlex.join(["python", *cmd[1:]])}  # 64 new tokens a row, as the levels


def served_vs_loop(report: dict) -> dict:
    """Per level, the room served against its loop alone at the same rows: aggregate tokens/s, the server's CPU per
    served token (web and engine processes) against the loop's per token, and the share of the machine the harness's
    clients took (their CPU seconds over the level's wall time x the cores)."""
    room = report["modes"].get("room", {}).get("levels", {})
    alone = report.get("loop_alone", {})
    cores = os.cpu_count() or 1
    out = {}
    for n, r in room.items():
        loop = alone.get(n)
        if not isinstance(loop, dict) or not r.get("tokens"):
            continue
        web, engine = (1e3 * r[k] / r["tokens"] for k in ("web_server_cpu_s", "engine_cpu_s"))
        out[n] = {"aggregate_vs_loop": round(r["aggregate_tokens_per_s"] / loop["tokens_per_s"], 2),
                  "server_cpu_vs_loop": round((web + engine) / loop["cpu_ms_per_token"], 2),
                  "web_cpu_ms_per_token": round(web, 2), "engine_cpu_ms_per_token": round(engine, 2),
                  "loop_cpu_ms_per_token": loop["cpu_ms_per_token"],
                  "clients_cpu_share": round(r["clients_cpu_s"] / (r["wall_s"] * cores), 3) if r.get("wall_s") else None}
    return out


def served_vs_step(report: dict) -> dict:
    """Per level, with the room: the served aggregate tokens/s against the same machine's batched step alone at that
    many rows (`steps`, measured in the same run), i.e. what serving keeps of what its engine can do."""
    room = report["modes"].get("room", {}).get("levels", {})
    sizes = report.get("steps", {}).get("sizes", {})
    return {n: round(r["aggregate_tokens_per_s"] / sizes[n]["tokens_per_s"], 2) for n, r in room.items()
            if n in sizes and r.get("aggregate_tokens_per_s") and sizes[n].get("tokens_per_s")}
