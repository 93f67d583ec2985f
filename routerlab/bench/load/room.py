"""The room benchmark: a whole room presses Generate at once, with the shared decode loop and without it, in one run.

Owns `room_bench`: for each mode (the room: one batched decode loop, `ROUTERLAB_ROOM=on` at the app's defaults, its loop
in an engine process; `room-thread`, on request: the same loop in the web server's process, `ROUTERLAB_ENGINE=thread`; and
the path before the room: each generation alone in a worker thread, `ROUTERLAB_ROOM=off` with the caps it had, 2 at
once and a queue of 16) it starts the real app in a child process, then at each level 1, 2, 4, 8, 16 and 32
visitors start one generation each at the same moment (64 new tokens, the page's example prompts and its default
settings: quality on). Per level: aggregate tokens/s, each visitor's own streaming rate (p5, p50), time to first
token (p50, p95), errors (a status without ✓ counts) and refusals (a full queue); each level runs `rounds` times
(medians kept), with the room each round between two runs of its loop alone at as many rows (`LoopAlone`, a process
of its own). At 8 visitors, with the room, the
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
        done_at = []  # when the stream ended, to the callback's precision rather than the POLL_S look's
        job.add_done_callback(lambda _: done_at.append(time.perf_counter()))
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
        end = done_at[0] if done_at else time.perf_counter()
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
    spent0 = _spent(url) if server_pid else None  # before the CPU is read: this probe is the harness's, not a visitor's
    cpu0, clients0 = (cpu.tree(server_pid) if server_pid else None), cpu.this_process()
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
        used["web_cpu_ms_per_token"] = round(1e3 * used["web_server_cpu_s"] / tokens, 2)
        used["engine_cpu_ms_per_token"] = round(1e3 * used["engine_cpu_s"] / tokens, 2)
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


ROUND_FIELDS = ("aggregate_tokens_per_s", "server_cpu_ms_per_token", "web_cpu_ms_per_token", "engine_cpu_ms_per_token",
                "time_to_first_token_s_p95", "errors", "refusals", "served", "tokens", "loop_tokens_per_s", "loop_cpu_ms_per_token",
                "loop_tokens", "loop_runs_tokens_per_s", "aggregate_vs_loop", "server_cpu_vs_loop")  # what each round of a level keeps in its record


def level_rounds(url: str, sessions: int, settings: dict, prompts: list[str], new_tokens: int = 64, rounds: int = 3,
                 server_pid: int | None = None, alone: "LoopAlone | None" = None) -> dict:
    """`level_run` `rounds` times: this machine's speed drifts by tens of percent from minute to minute (the same
    `python -m routerlab generate ... --json`, five runs back to back on the Xeon with AMX: 41.7-72.1 tokens/s), so one
    run of a level is not a measure. With `alone`, each round also runs the loop alone at as many rows just before and
    just after the served run, and takes the round's ratios to the mean of the two (`bracketed`): a drift during the
    round moves both sides alike, where one run of the loop on one side put the whole drift into the ratio. Each
    measure of the record is its median over the rounds (ratios taken per round first; refusals too); errors are
    summed, `served` is the fewest, `loop` is the split of the round with the median aggregate, and `rounds` keeps each
    round's figures."""
    runs = []
    for _ in range(max(rounds, 1)):
        before = alone.measure(sessions) if alone is not None else None
        r = level_run(url, sessions, settings, prompts, new_tokens, server_pid=server_pid)
        if alone is not None:
            loop = bracketed(before, alone.measure(sessions))
            r |= {"loop_tokens_per_s": loop["tokens_per_s"], "loop_cpu_ms_per_token": loop["cpu_ms_per_token"],
                  "loop_tokens": loop.get("tokens"), "loop_runs_tokens_per_s": loop["runs"]}
            if r.get("tokens") and r.get("aggregate_tokens_per_s"):
                r |= {"aggregate_vs_loop": round(r["aggregate_tokens_per_s"] / loop["tokens_per_s"], 3),
                      "server_cpu_vs_loop": round(r["server_cpu_ms_per_token"] / loop["cpu_ms_per_token"], 3)
                      if r.get("server_cpu_ms_per_token") else None}
        runs.append(r)
    if len(runs) == 1:
        return runs[0]
    out = dict(runs[0])
    for key, value in runs[0].items():
        values = [r.get(key) for r in runs]
        if key == "errors":
            out[key] = sum(values)
        elif key == "served":
            out[key] = min(values)
        elif key == "failures":
            out[key] = [f for r in runs for f in r[key]][:5]
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and key != "sessions":
            present = [v for v in values if v is not None]
            mid = statistics.median(present) if present else None
            out[key] = mid if mid is None or isinstance(mid, int) else round(mid, 3)
    by_rate = sorted(runs, key=lambda r: r.get("aggregate_tokens_per_s") or 0.0)
    if "loop" in out:
        out["loop"] = by_rate[len(by_rate) // 2].get("loop")
    out.pop("loop_runs_tokens_per_s", None)  # each round's own pair stays in `rounds`
    out["rounds"] = [{k: r.get(k) for k in ROUND_FIELDS if k in r} for r in runs]
    return out


def bracketed(before: dict, after: dict) -> dict:
    """The loop alone's runs just before and just after a served run, as one reference: the means of their tokens/s
    and CPU per token (`runs`: the two tokens/s, kept in the round's record)."""
    return {"tokens_per_s": round((before["tokens_per_s"] + after["tokens_per_s"]) / 2, 1),
            "cpu_ms_per_token": round((before["cpu_ms_per_token"] + after["cpu_ms_per_token"]) / 2, 2),
            "tokens": before.get("tokens"), "runs": [before["tokens_per_s"], after["tokens_per_s"]]}


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


def app_vs_cli(url: str, settings: dict, prompt: str, new_tokens: int = 64, rounds: int = 7) -> dict:
    """One visitor alone in the app against `python -m routerlab generate` (a fresh process each round) on the same
    prompt and settings, alternating (who goes first alternates too: the machine's speed drifts); decode tokens/s as
    each records it (the trace, the CLI's JSON), and the median of the rounds' ratios."""
    import json
    import subprocess
    import sys

    from routerlab.core.base.paths import ROOT

    app, cli = [], []
    cmd = [sys.executable, "-m", "routerlab", "generate", "--prompt", prompt, "--max-new-tokens", str(new_tokens),
           "--threshold", str(settings["threshold"]), "--kv-policy", settings["kv_policy"], "--json"]
    def in_app():
        c = client(url)
        try:
            result = submit(c, prompt, settings["threshold"], settings["router_set"], settings["kv_policy"], new_tokens).result(timeout=300)
            app.append(trace_of(result).decode_tokens_per_second())
        finally:
            c.close()

    def on_command_line():
        run = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT), timeout=600)
        cli.append(json.loads(run.stdout)["decode_tokens_per_second"])

    for k in range(rounds):
        for measure in ((in_app, on_command_line) if k % 2 == 0 else (on_command_line, in_app)):
            measure()
    return {"prompt": prompt, "new_tokens": new_tokens, "app_tokens_per_s": [round(x, 1) for x in app],
            "cli_tokens_per_s": [round(x, 1) for x in cli],
            "app_vs_cli": round(statistics.median(a / b for a, b in zip(app, cli)), 2),
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
               extras: bool = True, rounds: int = 3) -> dict:
    """`modes`: which servers of MODES, one after another; `extras`: with the room, also one visitor against the command
    line and 8 visitors with the full model and two thresholds; `rounds`: runs of each level, each between two runs of the
    room's loop alone at as many rows (`level_rounds`, `LoopAlone`), medians kept."""
    from routerlab import ui

    prompts = ui.load_prompts()
    report: dict = {"levels": list(levels), "new_tokens": new_tokens, "rounds": rounds, "modes": {}}
    alone = LoopAlone() if "room" in modes else None
    try:
        _serve_modes(report, levels, new_tokens, log, modes, extras, rounds, prompts, alone)
    finally:
        if alone is not None:
            alone.close()
    report["ratios"] = ratios(report)
    report["machine"] = {"cpus": os.cpu_count()}
    if alone is not None:
        report["loop_alone"] = alone.summary()
        report["served_vs_loop"] = served_vs_loop(report)
        if log:
            log(f"[room] served against the loop alone: {report['served_vs_loop']}")
    return report


def _serve_modes(report: dict, levels, new_tokens: int, log, modes, extras: bool, rounds: int, prompts, alone) -> None:
    """room_bench's servers, one after another, each measured at every level (into `report["modes"]`)."""
    from routerlab import ui

    for mode in modes:
        env = MODES[mode]
        env = {**env, "GRADIO_TEMP_DIR": tempfile.mkdtemp(prefix="routerlab-room-")}
        server = spawn(env=env, log_path=Path(tempfile.gettempdir()) / f"routerlab-room-{mode}.log")
        try:
            settings = page_defaults(server.url)
            level_run(server.url, 1, settings, prompts, 8)  # warm-up: first calls pay one-time set-up
            rows = {}
            for n in levels:
                rows[str(n)] = level_rounds(server.url, n, settings, prompts, new_tokens, rounds, server_pid=server.pid,
                                            alone=alone if mode == "room" else None)
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


class LoopAlone:
    """The room's loop alone (`python -m routerlab.bench.room_loop --stdin`: the app's way, in a process of its own,
    its main thread), kept running between the served rounds so that each round's ratios compare runs a minute apart
    at most; while a server is measured it waits on its input. `measure(rows)`: tokens/s and the CPU its process spent
    per token, 64 new tokens a row at most, each row ending at the end of text as the visitors' do (the same prompts,
    greedy: the same tokens, so `loop_tokens` equals a level's `tokens`)."""

    def __init__(self):
        import subprocess
        import sys

        from routerlab.core.base.paths import ROOT

        self.cmd = [sys.executable, "-m", "routerlab.bench.room_loop", "--stdin"]
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, cwd=str(ROOT))
        self.runs: dict[int, list[dict]] = {}
        self._reply()  # loaded, its products chosen (batch_paths.tune) before any server starts: its timings see a quiet machine

    def measure(self, rows: int) -> dict:
        self.proc.stdin.write(f"{rows}\n")
        self.proc.stdin.flush()
        result = self._reply()
        self.runs.setdefault(rows, []).append(result)
        return result

    def _reply(self) -> dict:
        import json

        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the loop alone ended early ({shlex.join(self.cmd)}, exit {self.proc.poll()})")
            if line.startswith("{"):
                return json.loads(line)

    def summary(self) -> dict:
        """Per row count, the medians of its runs, and the command (as a reader types it)."""
        return {str(n): {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
                         "cpu_ms_per_token": statistics.median(r["cpu_ms_per_token"] for r in runs), "runs": len(runs)}
                for n, runs in self.runs.items()} | {"command": shlex.join(["python", *self.cmd[1:]])}

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except Exception:
            self.proc.kill()


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
        if not r.get("tokens") or not (isinstance(loop, dict) or r.get("aggregate_vs_loop")):
            continue
        web = r.get("web_cpu_ms_per_token", 1e3 * r["web_server_cpu_s"] / r["tokens"])
        engine = r.get("engine_cpu_ms_per_token", 1e3 * r["engine_cpu_s"] / r["tokens"])
        if r.get("aggregate_vs_loop"):  # measured round by round beside the loop alone (level_rounds): the median ratios
            ratios_ = {"aggregate_vs_loop": round(r["aggregate_vs_loop"], 2), "server_cpu_vs_loop": round(r["server_cpu_vs_loop"], 2),
                       "loop_cpu_ms_per_token": r["loop_cpu_ms_per_token"]}
        else:
            ratios_ = {"aggregate_vs_loop": round(r["aggregate_tokens_per_s"] / loop["tokens_per_s"], 2),
                       "server_cpu_vs_loop": round((web + engine) / loop["cpu_ms_per_token"], 2),
                       "loop_cpu_ms_per_token": loop["cpu_ms_per_token"]}
        out[n] = {"aggregate_vs_loop": ratios_["aggregate_vs_loop"], "server_cpu_vs_loop": ratios_["server_cpu_vs_loop"],
                  "web_cpu_ms_per_token": round(web, 2), "engine_cpu_ms_per_token": round(engine, 2),
                  "loop_cpu_ms_per_token": ratios_["loop_cpu_ms_per_token"],
                  "clients_cpu_share": round(r["clients_cpu_s"] / (r["wall_s"] * cores), 3) if r.get("wall_s") else None}
    return out


def served_vs_step(report: dict) -> dict:
    """Per level, with the room: the served aggregate tokens/s against the same machine's batched step alone at that
    many rows (`steps`, measured in the same run), i.e. what serving keeps of what its engine can do."""
    room = report["modes"].get("room", {}).get("levels", {})
    sizes = report.get("steps", {}).get("sizes", {})
    return {n: round(r["aggregate_tokens_per_s"] / sizes[n]["tokens_per_s"], 2) for n, r in room.items()
            if n in sizes and r.get("aggregate_tokens_per_s") and sizes[n].get("tokens_per_s")}
