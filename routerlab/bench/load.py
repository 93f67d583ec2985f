"""Load, fault, bad-input and loader-fuzz tests of the real app, over HTTP on localhost, measured.

    python -m routerlab.bench.load                         # full run: 8 sessions, 50 generations, JSON to assets/bench/load.json
    python -m routerlab.bench.load --sessions 4 --generations 8 --max-new 8 --out -   # a short run
    python -m routerlab.bench.load serve --port 7861       # only the watched server (what the full run spawns)

The driver talks to the app the way visitors do: one `gradio_client.Client` per visitor on the
named endpoints (`/generate`, `/stop`, `/set_threshold`, `/compare`), plus one raw HTTP stream that
is dropped mid-generation (a closed tab). The server is the real `ui.build_demo` on the embedded
model, built from `Limits.from_env()` (so the operator caps are what is tested), with two test-only
additions that never ship in `app.py`:
  - `WatchedEngine` wraps the shared Engine: it counts generators opened and closed, times the gap
    between a stop request and the end of decoding, and raises inside one generation when the
    prompt carries `FAULT_MARKER` (the fault-injection hook);
  - a hidden `/loadtest_stats` endpoint reports those counters, the server's RSS and its threads.
A router set whose weights file is truncated is offered too, to show a bad set fails cleanly.

Bounded: a fixed number of generations, each capped in tokens, and a wall-clock deadline; it
stops by itself and never contacts anything but 127.0.0.1. Knows nothing about tensors.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from routerlab.core.paths import ASSETS, ROOT
from routerlab.core.errors import RouterLabError

FAULT_MARKER = "[[routerlab-loadtest:fault]]"
READY = "ROUTERLAB-LOADTEST-READY"
BROKEN_LABEL = "attention-token · broken (loadtest)"
LONG_PROMPT = "Write a long story about a dragon who learns to read. Describe every chapter in detail."
PROMPTS = [
    "Explain in three sentences why the sky is blue.",
    "Write a short poem about a lighthouse keeper.",
    "List three tips for learning a new language.",
    "What is the capital of France, and why is it famous?",
    LONG_PROMPT,
]
THRESHOLDS = [0.3, 0.45, 0.5, 0.55, 0.6, 0.7, 0.4, 0.8]
POLICIES = ["kv", "drop", "mask"]
DEFAULT_OUT = ASSETS / "bench" / "load.json"


# -- the watched server ---------------------------------------------------------------------------
class _StampedEvent(threading.Event):
    """A threading.Event that remembers when it was first set (the moment Stop was asked for)."""

    at: float | None = None

    def set(self) -> None:
        if self.at is None:
            self.at = time.perf_counter()
        super().set()


class WatchedEngine:
    """The shared Engine, with counters around every generation (test servers only)."""

    def __init__(self, engine):
        self._engine = engine
        self._lock = threading.Lock()
        self.opened = self.closed = self.injected = 0
        self.stop_to_end: list[float] = []  # seconds from a stop request to the end of decoding
        self.step_seconds: list[float] = []  # recent decode step times (for "one decode step")

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def generate(self, prompt, routers, config, control=None):
        from routerlab.core.engine import Control

        control = control or Control(config.threshold)
        control._stop = _StampedEvent()  # same behaviour; it only records when Stop was asked for
        steps = self._engine.generate(prompt, routers, config, control)  # bad input raises here, eagerly
        return self._watch(steps, control, isinstance(prompt, str) and FAULT_MARKER in prompt)

    def _watch(self, steps, control, fail: bool):
        with self._lock:
            self.opened += 1
        generated = 0
        try:
            for step in steps:
                if not step.is_prompt:
                    generated += 1
                    with self._lock:
                        self.step_seconds = (self.step_seconds + [step.seconds])[-200:]
                    if fail and generated == 2:
                        with self._lock:
                            self.injected += 1
                        raise RuntimeError("injected fault (loadtest)")
                yield step
        finally:
            steps.close()
            end = time.perf_counter()
            with self._lock:
                self.closed += 1
                if control._stop.at is not None:
                    self.stop_to_end.append(end - control._stop.at)

    def stats(self) -> dict:
        with self._lock:
            steps = sorted(self.step_seconds)
            return {
                "opened": self.opened,
                "closed": self.closed,
                "live": self.opened - self.closed,
                "injected": self.injected,
                "stop_to_end": list(self.stop_to_end),
                "step_p50": steps[len(steps) // 2] if steps else None,
            }


def rss_bytes(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def malloc_trim() -> bool:
    """Ask glibc to hand freed heap pages back to the OS (diagnostic: what part of RSS is freed-but-kept memory)."""
    import ctypes

    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0)) or True
    except (OSError, AttributeError):
        return False


def _broken_router_set(engine, folder: Path):
    """A router set with a valid router.json and a truncated weights file: choosing it must fail cleanly."""
    from routerlab.tuning.checkpoint import WEIGHTS, save_routers
    from routerlab.core.config import RoutingConfig, default_layers
    from routerlab.core.router import RouterSet
    from routerlab.ui import RouterSetInfo

    routers = RouterSet.zeros(engine.model, RoutingConfig.from_granularity("attention-token", default_layers(engine.n_layers)))
    save_routers(routers, folder, engine.model)
    data = (folder / WEIGHTS).read_bytes()
    (folder / WEIGHTS).write_bytes(data[: len(data) // 3])
    return RouterSetInfo(label=BROKEN_LABEL, granularity="attention-token", path=folder)


def _random_router_set(engine, folder: Path, granularity: str, seed: int):
    """Routers with random weights, so scores spread around 0.5 and each threshold decides differently.
    Written and read back through the real checkpoint path (safetensors + validated JSON)."""
    import torch

    from routerlab.tuning.checkpoint import read_config, save_routers
    from routerlab.core.config import RoutingConfig, default_layers
    from routerlab.core.router import RouterSet
    from routerlab.ui import RouterSetInfo

    routers = RouterSet.zeros(engine.model, RoutingConfig.from_granularity(granularity, default_layers(engine.n_layers)))
    gen = torch.Generator().manual_seed(seed)
    for r in routers.routers.values():
        r.proj.weight.data.copy_(torch.randn(r.proj.weight.shape, generator=gen) * 0.02)
    save_routers(routers, folder, engine.model)
    return RouterSetInfo(label=f"{granularity} · random (loadtest)", granularity=granularity, path=folder, meta=read_config(folder))


@dataclass
class Server:
    url: str
    limits: Any
    close: Callable[[], None]
    pid: int
    res: Any = None  # in-process only
    watched: WatchedEngine | None = None  # in-process only


def build_server(engine, limits=None, router_sets=None, workdir: Path | None = None):
    """The real app (`ui.build_demo`) on a WatchedEngine, plus the hidden stats endpoint. Returns (demo, res, watched)."""
    import gradio as gr

    from routerlab import ui

    limits = limits or ui.Limits.from_env()
    watched = WatchedEngine(engine)
    sets = list(router_sets if router_sets is not None else ui.available_router_sets())
    workdir = Path(workdir or tempfile.mkdtemp(prefix="routerlab-loadtest-"))
    sets.insert(0, _broken_router_set(engine, workdir / "broken"))
    sets += [_random_router_set(engine, workdir / g, g, seed) for seed, g in enumerate(("attention-token", "attention-sequence"))]
    res = ui.Resources(watched, limits, router_sets=sets)
    demo = ui.build_demo(res)

    def stats():
        return {**watched.stats(), "rss": rss_bytes(), "threads": threading.active_count(),
                "decoders": sum(t.name == "routerlab-decode" for t in threading.enumerate()),
                "limits": {"max_new_tokens": limits.max_new_tokens, "max_prompt_chars": limits.max_prompt_chars,
                           "queue_size": limits.queue_size, "concurrency": limits.concurrency,
                           "allowed_models": list(limits.allowed_models)},
                "router_labels": res.router_labels(), "default_model": res.default_model}

    def trim():
        before = rss_bytes()
        return {"before": before, "after": rss_bytes() if malloc_trim() else before}

    with demo:  # test-only endpoints; app.py never adds them
        probe = gr.JSON(visible=False)
        gr.Button(visible=False).click(stats, None, probe, api_name="loadtest_stats", queue=False)
        gr.Button(visible=False).click(trim, None, probe, api_name="loadtest_trim", queue=False)
    demo.queue(max_size=limits.queue_size, default_concurrency_limit=limits.concurrency)
    return demo, res, watched


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(engine, limits=None, router_sets=None, port: int | None = None) -> Server:
    """Launch the watched app in this process on 127.0.0.1 (non-blocking)."""
    from routerlab import ui

    demo, res, watched = build_server(engine, limits, router_sets)
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=port or free_port(), prevent_thread_lock=True,
                            quiet=True, **ui.launch_options())
    return Server(url=url, limits=res.limits, close=demo.close, pid=os.getpid(), res=res, watched=watched)


def spawn(port: int | None = None, env: dict | None = None, timeout: float = 600.0, log_path: Path | None = None) -> Server:
    """Start `python -m routerlab.bench.load serve` in a child process (its RSS is the server's alone)."""
    port = port or free_port()
    log = open(log_path or os.devnull, "w")
    proc = subprocess.Popen([sys.executable, "-m", "routerlab.bench.load", "serve", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=log, text=True, env={**os.environ, **(env or {})},
                            cwd=str(ROOT))
    end = time.time() + timeout
    url = None
    while time.time() < end:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(READY):
            url = line.split()[1]
            break
    if url is None:
        proc.kill()
        raise RuntimeError(f"the server did not start (see {log_path})")
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep draining its stdout

    def close():
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()

    from routerlab import ui

    return Server(url=url, limits=ui.Limits.from_env(), close=close, pid=proc.pid)


def _serve_forever(port: int) -> int:
    from routerlab.core.engine import Engine
    from routerlab.core.models import load_model

    loaded = load_model(device="cpu")
    server = serve(Engine(loaded.model, loaded.tokenizer, name=loaded.name), port=port)
    print(READY, server.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0


# -- client helpers -------------------------------------------------------------------------------
def client(url: str):
    from gradio_client import Client

    return Client(url, verbose=False, download_files=False)


_probes: dict[str, Any] = {}
_probe_lock = threading.Lock()


def probe(url: str) -> dict:
    """The watched server's counters, RSS and limits (one cached client per server: probing must stay cheap)."""
    with _probe_lock:
        if url not in _probes:
            _probes[url] = client(url)
        return _probes[url].predict(api_name="/loadtest_stats")


def forget(url: str) -> None:
    with _probe_lock:
        c = _probes.pop(url, None)
    if c is not None:
        c.close()


def submit(c, prompt, threshold=0.5, router=None, policy="kv", max_new=8, temperature=0.0, model=None, api="/generate"):
    from routerlab import ui

    return c.submit(prompt, threshold, router or ui.UNTRAINED, policy, max_new, temperature, model, api_name=api)


def tokens_shown(job) -> int:
    """Generated tokens in the last streamed text (one span per token; the prompt is not shown)."""
    for out in reversed(job.outputs()):
        if isinstance(out, (list, tuple)) and out and isinstance(out[0], str) and "rl-text" in out[0]:
            return out[0].split("<div class='rl-legend'>")[0].count("class='rl-tok")
    return 0


def wait_tokens(job, n: int, timeout: float) -> float:
    """Wait until `n` generated tokens were streamed; returns the moment (perf_counter)."""
    end = time.time() + timeout
    while tokens_shown(job) < n:
        if job.done():
            raise AssertionError("the run ended before the driver could act on it")
        if time.time() > end:
            raise AssertionError(f"{n} tokens were not streamed within {timeout:.0f} s")
        time.sleep(0.02)
    return time.perf_counter()


def wait_done(job, timeout: float) -> float:
    end = time.time() + timeout
    while not job.done():
        if time.time() > end:
            raise AssertionError(f"the run did not end within {timeout:.0f} s")
        time.sleep(0.02)
    return time.perf_counter()


def wait_until(fn, timeout: float, every: float = 0.02):
    end = time.perf_counter() + timeout
    while time.perf_counter() < end:
        value = fn()
        if value:
            return value
        time.sleep(every)
    return fn()


def trace_of(result):
    from routerlab.core.trace import Trace

    update = result[4]
    value = update.get("value", update) if isinstance(update, dict) else update
    path = value.get("path") if isinstance(value, dict) else value
    return Trace.from_json(Path(path).read_text())


def decision_errors(trace, threshold: float) -> int:
    """Routed cells whose decision is not `score >= threshold`, or steps recorded under another threshold."""
    bad = 0
    for s in trace.steps:
        if s.threshold != threshold:
            bad += 1
        for sc, e in zip(s.scores, s.executed):
            if sc is not None and e != (sc >= threshold):
                bad += 1
    return bad


def pct(values, q: float):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))]


def _mb(n) -> float:
    return round(n / 2**20, 1)


# -- 1. load ----------------------------------------------------------------------------------------
def load_test(url: str, sessions: int = 8, generations: int = 50, max_new: int = 16, deadline_s: float = 1200.0,
              router_labels: list[str] | None = None, log=print) -> dict:
    """`sessions` concurrent visitors share `generations` runs, each with its own threshold, policy and router set."""
    from routerlab import ui

    stats0 = probe(url)
    # random routers first: their scores spread around 0.5, so each session's threshold decides differently
    labels = router_labels or sorted((l for l in stats0["router_labels"] if l != BROKEN_LABEL),
                                     key=lambda l: ("random (loadtest)" not in l, l == ui.UNTRAINED, l == ui.FULL))
    lock = threading.Lock()
    taken = [0]
    runs: list[dict] = []
    errors: list[str] = []
    rss: list[tuple[int, int]] = [(0, stats0["rss"])]
    start = time.perf_counter()
    end = start + deadline_s

    def visitor(k: int):
        c = client(url)
        threshold, policy, label = THRESHOLDS[k % len(THRESHOLDS)], POLICIES[k % len(POLICIES)], labels[k % len(labels)]
        try:
            while time.perf_counter() < end:
                with lock:
                    if taken[0] >= generations:
                        return
                    taken[0] += 1
                    n = taken[0]
                prompt = PROMPTS[n % len(PROMPTS)]
                t0 = time.perf_counter()
                job = submit(c, prompt, threshold, label, policy, max_new)
                first = last = None
                seen = 0
                try:
                    while not job.done():
                        if time.perf_counter() > end + 120:
                            job.cancel()
                            raise TimeoutError("deadline")
                        shown = tokens_shown(job)
                        if shown > seen:
                            now = time.perf_counter()
                            first = first or now
                            last, seen = now, shown
                        time.sleep(0.03)
                    result = job.result(timeout=30)
                    trace = trace_of(result)
                    status = result[3]
                    gen = trace.generated_steps
                    wrong = decision_errors(trace, threshold)
                    run = dict(visitor=k, threshold=threshold, kv_policy=policy, routers=label, tokens=len(gen),
                               wall=time.perf_counter() - t0, ttft=(first - t0) if first else None,
                               stream_per_token=((last - first) / (seen - 1)) if first and seen > 1 else None,
                               step_seconds=[s.seconds for s in gen if s.seconds > 0], decision_errors=wrong,
                               stop_reason=trace.meta.get("stop_reason"), ok=status.startswith("✓") and wrong == 0)  # 0 tokens is fine: a heavy skip may say end-of-text at once
                    if not run["ok"]:
                        errors.append(f"visitor {k}: status {status[:120]!r}, {wrong} wrong decisions")
                except Exception as err:  # any failure of one run is counted, the visitor goes on
                    errors.append(f"visitor {k}: {type(err).__name__}: {str(err)[:200]}")
                    run = dict(visitor=k, ok=False, tokens=0)
                r = probe(url)["rss"]
                with lock:
                    runs.append(run)
                    rss.append((len(runs), r))
                    done = len(runs)
                if log:
                    log(f"[load] {done}/{generations} visitor {k} t={threshold} {policy}: {run.get('tokens')} tokens, "
                        f"rss {_mb(r)} MB{'' if run['ok'] else ' ERROR'}")
        finally:
            c.close()

    threads = [threading.Thread(target=visitor, args=(k,), daemon=True) for k in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(1.0, end + 180 - time.perf_counter()))
    wall = time.perf_counter() - start
    after = wait_until(lambda: (lambda s: s if s["live"] == 0 and s["decoders"] == 0 else None)(probe(url)), 30) or probe(url)
    with _probe_lock:
        trimmed = _probes[url].predict(api_name="/loadtest_trim")
    steps = [x for r in runs for x in r.get("step_seconds", [])]
    per_token = [r["stream_per_token"] for r in runs if r.get("stream_per_token")]
    ttft = [r["ttft"] for r in runs if r.get("ttft")]
    tokens = sum(r.get("tokens", 0) for r in runs)
    # RSS: the first `sessions` runs warm caches up; compare the next quarter with the last quarter.
    series = [b for _, b in rss[1:]]
    warm = series[min(sessions, len(series) // 2):]
    q = max(1, len(warm) // 4)
    early, late = (statistics.median(warm[:q]), statistics.median(warm[-q:])) if warm else (0, 0)
    growth = late - early
    return {
        "sessions": sessions,
        "generations": len(runs),
        "generations_asked": generations,
        "max_new_tokens": max_new,
        "errors": len(errors) + (generations - len(runs)),
        "error_messages": errors[:20],
        "decision_errors": sum(r.get("decision_errors", 0) for r in runs),
        "traces_checked": sum(1 for r in runs if "decision_errors" in r),
        "tokens": tokens,
        "wall_s": round(wall, 2),
        "throughput_tokens_per_s": round(tokens / wall, 2) if wall else None,
        "engine_step_ms_p50": round(1000 * pct(steps, 0.5), 1) if steps else None,
        "engine_step_ms_p95": round(1000 * pct(steps, 0.95), 1) if steps else None,
        "client_per_token_ms_p50": round(1000 * pct(per_token, 0.5), 1) if per_token else None,
        "client_per_token_ms_p95": round(1000 * pct(per_token, 0.95), 1) if per_token else None,
        "time_to_first_token_s_p50": round(pct(ttft, 0.5), 2) if ttft else None,
        "time_to_first_token_s_p95": round(pct(ttft, 0.95), 2) if ttft else None,
        "rss_mb_start": _mb(rss[0][1]),
        "rss_mb_series": [_mb(b) for b in series],
        "rss_mb_early_median": _mb(early),
        "rss_mb_late_median": _mb(late),
        "rss_growth_mb": _mb(growth),
        "rss_mb_end": _mb(trimmed["before"]),
        "rss_mb_after_malloc_trim": _mb(trimmed["after"]),
        # A leak is memory still in use at the end: RSS after glibc returned its free pages, against the early median.
        # Raw RSS also carries freed-but-kept heap (fragmentation from many threads), reported, not judged.
        "rss_live_growth_mb": _mb(trimmed["after"] - early),
        "rss_growth_ok": trimmed["after"] - early <= max(48 * 2**20, 0.05 * early),
        "thresholds": sorted({r["threshold"] for r in runs if "threshold" in r}),
        "kv_policies": sorted({r["kv_policy"] for r in runs if "kv_policy" in r}),
        "router_sets": sorted({r["routers"] for r in runs if "routers" in r}),
        "stop_reasons": sorted({str(r.get("stop_reason")) for r in runs if "stop_reason" in r}),
        "server_after": {k: after[k] for k in ("live", "decoders", "threads", "opened", "closed")},
    }


# -- 2. cancellation and faults ------------------------------------------------------------------
def _occupy(url: str, n: int, max_new: int):
    """`n` long generations that hold every worker slot (so a new request can start only when one frees)."""
    clients = [client(url) for _ in range(n)]
    jobs = [submit(c, LONG_PROMPT, max_new=max_new) for c in clients]
    return clients, jobs


def _release(clients, jobs) -> None:
    for c, j in zip(clients, jobs):
        if not j.done():
            c.predict(api_name="/stop")
    for c, j in zip(clients, jobs):
        try:
            wait_done(j, 120)
        finally:
            c.close()


def _drop_stream(url: str, fn_index: int, data: list, after_tokens: int, timeout: float) -> float:
    """A visitor that closes its tab mid-stream: raw queue/join + queue/data SSE, then the connection is dropped."""
    import httpx

    session = uuid.uuid4().hex[:11]
    base = url.rstrip("/") + "/gradio_api/"
    r = httpx.post(base + "queue/join", json={"data": data, "fn_index": fn_index, "session_hash": session,
                                              "event_data": None, "trigger_id": None}, timeout=30)
    r.raise_for_status()
    end = time.time() + timeout
    with httpx.stream("GET", base + "queue/data", params={"session_hash": session}, timeout=timeout) as stream:
        for line in stream.iter_lines():
            if time.time() > end:
                raise AssertionError("no tokens streamed before the deadline")
            if not line.startswith("data:"):
                continue
            msg = json.loads(line[5:])
            if msg.get("msg") == "process_completed":
                raise AssertionError("the run ended before the tab was closed")
            out = (msg.get("output") or {}).get("data") or []
            if msg.get("msg") == "process_generating" and out and isinstance(out[0], list):
                # sse diffs: [["replace", [], html]] for the text output
                html = next((op[2] for op in out[0] if isinstance(op, list) and len(op) == 3 and isinstance(op[2], str)), "")
                if html.split("<div class='rl-legend'>")[0].count("class='rl-tok") >= after_tokens:
                    return time.perf_counter()  # leaving the with-block closes the connection
            elif msg.get("msg") == "process_generating" and out and isinstance(out[0], str):
                if out[0].split("<div class='rl-legend'>")[0].count("class='rl-tok") >= after_tokens:
                    return time.perf_counter()
    raise AssertionError("the stream ended unexpectedly")


def _stop_rows(url: str, before: dict) -> dict:
    stats = probe(url)
    new = stats["stop_to_end"][len(before["stop_to_end"]):]
    return {"stop_request_to_decode_end_ms": round(1000 * min(new), 1) if new else None,
            "decode_step_ms_p50": None if stats["step_p50"] is None else round(1000 * stats["step_p50"], 1)}


def interrupt_test(url: str, kind: str, max_new: int = 48, timeout: float = 300.0) -> dict:
    """Fill every worker slot with long runs, queue one more request, then interrupt the first run by
    `kind`: "stop" (the Stop endpoint), "cancel" (gradio_client's Job.cancel) or "disconnect" (a raw
    stream dropped mid-generation, as a closed tab does; nothing calls /cancel). Measures when the
    server-side engine generator ends, and when the queued request gets its first token."""
    from routerlab import ui

    info = probe(url)
    slots, cap = info["limits"]["concurrency"], info["limits"]["max_new_tokens"]
    long_new = min(max_new, cap)
    before = probe(url)
    n_fill = slots if kind != "disconnect" else slots - 1
    clients, jobs = _occupy(url, n_fill, long_new)
    try:
        for j in jobs:
            wait_tokens(j, 3, timeout)
        if kind == "disconnect":
            data = [LONG_PROMPT, 0.5, ui.UNTRAINED, "kv", long_new, 0.0, info["default_model"], None]
            t_int = _drop_stream(url, _fn_index(url, "generate"), data, 3, timeout)
        waiting = client(url)
        queued = submit(waiting, LONG_PROMPT, max_new=2)  # waits behind the occupied slots
        if kind == "stop":
            t_int = time.perf_counter()
            clients[0].predict(api_name="/stop")
        elif kind == "cancel":
            t_int = time.perf_counter()
            jobs[0].cancel()
        closed = wait_until(lambda: probe(url)["closed"] > before["closed"], 60)
        t_closed = time.perf_counter()
        t_first = wait_tokens(queued, 1, timeout)
        queued_ok = queued.result(timeout=timeout)[3].startswith("✓")
        waiting.close()
    finally:
        _release(clients[1:] if kind != "disconnect" else clients, jobs[1:] if kind != "disconnect" else jobs)
        if kind != "disconnect":
            clients[0].close()
    return dict(
        generator_closed=bool(closed),
        interrupt_to_generator_end_s=round(t_closed - t_int, 3),
        **_stop_rows(url, before),
        next_request_first_token_s=round(t_first - t_int, 2),
        next_request_ok=queued_ok,
        no_generator_left=bool(wait_until(lambda: probe(url)["live"] == 0, 60)),
    )


def exception_test(url: str, timeout: float = 300.0) -> dict:
    """An exception inside one generation while another runs: a clear status for that one, the other finishes,
    the same visitor's next run works; a router set with a truncated weights file fails with a clean message."""
    a, b = client(url), client(url)
    try:
        good = submit(a, PROMPTS[0], max_new=4)
        bad = submit(b, FAULT_MARKER + " " + PROMPTS[1], max_new=4)
        bad_status = bad.result(timeout=timeout)[3]
        good_status = good.result(timeout=timeout)[3]
        after = submit(b, PROMPTS[2], max_new=2).result(timeout=timeout)[3]
        broken = submit(b, PROMPTS[0], router=BROKEN_LABEL, max_new=2).result(timeout=timeout)[3]
    finally:
        a.close()
        b.close()
    return dict(
        failing_run_status=bad_status[:160],
        failing_run_clean="Generation failed" in bad_status and "injected fault" in bad_status,
        other_run_ok=good_status.startswith("✓"),
        same_client_next_run_ok=after.startswith("✓"),
        broken_router_set_status=broken[:200],
        broken_router_set_clean=broken.startswith("⚠") and "corrupted" in broken,
    )


def token_cap_test(url: str, timeout: float = 600.0) -> dict:
    """Ask for exactly the server's cap on a prompt that does not end early: it ends cleanly at the cap."""
    cap = probe(url)["limits"]["max_new_tokens"]
    c = client(url)
    try:
        result = submit(c, LONG_PROMPT, max_new=cap).result(timeout=timeout)
    finally:
        c.close()
    trace = trace_of(result)
    n = len(trace.generated_steps)
    return dict(cap=cap, tokens=n, stop_reason=trace.meta.get("stop_reason"), status=result[3][:120],
                clean=result[3].startswith("✓") and n <= cap and trace.meta.get("stop_reason") in ("max_new_tokens", "eos"))


def fault_tests(url: str, max_new: int = 48, timeout: float = 300.0, log=print) -> dict:
    """Stop, cancel, a dropped connection, an injected exception, a broken router set, the token cap."""
    out: dict[str, Any] = {"concurrency": probe(url)["limits"]["concurrency"]}
    c = client(url)
    t0 = time.perf_counter()
    job = submit(c, LONG_PROMPT, max_new=3)
    out["idle_ttft_s"] = round(wait_tokens(job, 1, timeout) - t0, 2)  # baseline: an idle server's first token
    wait_done(job, timeout)
    c.close()
    for kind in ("stop", "cancel", "disconnect"):
        out[kind] = interrupt_test(url, kind, max_new, timeout)
        if log:
            log(f"[faults] {kind}: {out[kind]}")
    out["exception"] = exception_test(url, timeout)
    out["token_cap"] = token_cap_test(url, timeout * 2)
    if log:
        log(f"[faults] exception: {out['exception']}\n[faults] token cap: {out['token_cap']}")
    out["server_after"] = {k: v for k, v in probe(url).items() if k in ("live", "decoders", "opened", "closed", "injected")}
    return out


# -- 3. bad input through the API ----------------------------------------------------------------
def bad_input_cases(default_model: str, cap: int, max_chars: int) -> list[tuple[str, str, list]]:
    """(name, endpoint, arguments) for /generate, /compare and /set_threshold."""
    from routerlab import ui

    ok = [PROMPTS[0], 0.5, ui.UNTRAINED, "kv", 2, 0.0, default_model]

    def gen(i, v, name, api="/generate"):
        args = list(ok)
        args[i] = v
        return (name, api, args)

    nan, inf = float("nan"), float("inf")
    return [
        gen(0, "x" * 100_000, "prompt of 100,000 characters"),
        gen(0, "x" * (max_chars + 1), "prompt one character over the cap"),
        gen(0, "", "empty prompt"),
        gen(0, "   \n\t ", "whitespace prompt"),
        gen(0, None, "prompt None"),
        gen(0, 12345, "prompt a number"),
        gen(0, ["a", "list"], "prompt a list"),
        gen(0, "\x00\x01\x02\x1b[31mred\x07\x7f\u202e\ufeff\u200b", "control characters"),
        gen(0, "🐉🔥 Write about a 🐉 in 中文 and עברית 👩‍👩‍👧‍👦", "emoji and scripts"),
        gen(0, "\ud800 lone surrogate \udfff", "lone surrogates"),
        gen(0, "<script>alert(1)</script><img src=x onerror=alert(2)>", "html in the prompt"),
        gen(1, "abc", "threshold a word"),
        gen(1, None, "threshold None"),
        gen(1, nan, "threshold NaN"),
        gen(1, inf, "threshold inf"),
        gen(1, -1e308, "threshold -1e308"),
        gen(1, 1e308, "threshold 1e308"),
        gen(1, [0.5], "threshold a list"),
        gen(2, "no-such-routers", "unknown granularity"),
        gen(2, None, "granularity None"),
        gen(2, "../../../etc/passwd", "granularity a path"),
        gen(3, "fast", "unknown kv policy"),
        gen(3, None, "kv policy None"),
        gen(4, 10**9, "max new tokens 1e9"),
        gen(4, cap + 1, "max new tokens cap+1"),
        gen(4, 0, "max new tokens 0"),
        gen(4, -5, "max new tokens negative"),
        gen(4, 2.5, "max new tokens 2.5"),
        gen(4, nan, "max new tokens NaN"),
        gen(4, "many", "max new tokens a word"),
        gen(4, None, "max new tokens None"),
        gen(5, nan, "temperature NaN"),
        gen(5, 1e300, "temperature 1e300"),
        gen(5, -1, "temperature negative"),
        gen(5, "hot", "temperature a word"),
        gen(6, "gpt2", "model not allowed"),
        gen(6, "/etc", "model a local path"),
        gen(6, "../../secrets", "model a relative path"),
        gen(6, 42, "model a number"),
        gen(0, "x" * 100_000, "compare: prompt of 100,000 characters", "/compare"),
        gen(4, 10**9, "compare: max new tokens 1e9", "/compare"),
        gen(6, "gpt2", "compare: model not allowed", "/compare"),
        gen(1, nan, "compare: threshold NaN", "/compare"),
        ("set_threshold NaN", "/set_threshold", [nan]),
        ("set_threshold a word", "/set_threshold", ["abc"]),
        ("set_threshold 1e308", "/set_threshold", [1e308]),
        ("set_threshold None", "/set_threshold", [None]),
    ]


def _message(result, api: str) -> str:
    if api == "/generate":
        return str(result[3])
    if api == "/compare":
        return str(result[4])
    if api == "/set_threshold":
        return str(result[3])
    return str(result)


UNCLEAR = ("has not enabled verbose error reporting", "Traceback", "Internal Server Error")


def _fn_index(url: str, api_name: str) -> int:
    c = client(url)
    try:
        deps = c.config["dependencies"]
        i = next(i for i, d in enumerate(deps) if d.get("api_name") == api_name)
        return deps[i].get("id", i)
    finally:
        c.close()


def _raw_call(url: str, fn_index: int, data_json: str, timeout: float) -> str:
    """POST queue/join with a hand-written JSON body, read queue/data to the end; returns what came back, as text."""
    import httpx

    session = uuid.uuid4().hex[:11]
    base = url.rstrip("/") + "/gradio_api/"
    body = '{"data": %s, "fn_index": %d, "session_hash": "%s", "event_data": null, "trigger_id": null}' % (data_json, fn_index, session)
    r = httpx.post(base + "queue/join", content=body.encode("utf-8", "surrogatepass"),
                   headers={"content-type": "application/json"}, timeout=30)
    if r.status_code != 200:
        return f"HTTP {r.status_code}: {r.text[:200]}"
    said: list[str] = []

    def strings(obj):
        if isinstance(obj, str):
            yield obj
        elif isinstance(obj, dict):
            for v in obj.values():
                yield from strings(v)
        elif isinstance(obj, list):
            for v in obj:
                yield from strings(v)

    with httpx.stream("GET", base + "queue/data", params={"session_hash": session}, timeout=timeout) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:"):
                msg = json.loads(line[5:])
                out = msg.get("output") or {}
                if out.get("error") is not None or (msg.get("msg") == "process_completed" and not msg.get("success", True)):
                    said.append(f"error: {out.get('error')}")
                said += [t for t in strings(out) if t.startswith(("⚠", "✓"))]
                if msg.get("msg") == "process_completed":
                    return said[-1] if said else json.dumps(out)[:300]
    return "stream ended without a result"


def bad_input_test(url: str, timeout: float = 300.0, log=print) -> dict:
    """Every bad input gets a clear message (a ⚠ status or an error naming the problem); the server keeps serving.

    One raw case, a request with too few arguments, is malformed at the protocol level: Gradio refuses it
    before any RouterLab code runs, with its generic error (it is counted as `refused`, not as clear).
    """
    from routerlab import ui

    info = probe(url)
    cases = bad_input_cases(info["default_model"], info["limits"]["max_new_tokens"], info["limits"]["max_prompt_chars"])
    rows = []
    c = client(url)
    for name, api, args in cases:
        t0 = time.perf_counter()
        try:
            result = c.predict(*args, api_name=api)
            msg, kind = _message(result, api), "status"
        except Exception as err:
            msg, kind = f"{type(err).__name__}: {err}", "error"
        generated = msg.startswith("✓")
        clear = generated or (len(msg) > 12 and not any(u in msg for u in UNCLEAR) and (kind == "error" or msg.startswith(("⚠", "◐", "✓"))))
        rows.append(dict(case=name, endpoint=api, outcome="generated" if generated else kind, message=msg[:220],
                         clear=clear, seconds=round(time.perf_counter() - t0, 2)))
        if log:
            log(f"[bad input] {name}: {'ok ' if clear else 'UNCLEAR '}{msg[:140]!r}")
    # What gradio_client refuses to send, a raw HTTP client can: NaN/Infinity literals, lone surrogates, wrong arity.
    fn_index = _fn_index(url, "generate")
    ok = [PROMPTS[0], 0.5, "FULL", "kv", 2, 0.0, info["default_model"], None]
    ok[2] = next(l for l in info["router_labels"] if "untrained" in l)
    raw_cases = [
        ("raw: threshold NaN", json.dumps(ok).replace("0.5", "NaN", 1)),
        ("raw: max new tokens Infinity", json.dumps(ok[:4] + ["__INF__"] + ok[5:]).replace('"__INF__"', "Infinity")),
        ("raw: temperature -Infinity", json.dumps(ok[:5] + ["__INF__"] + ok[6:]).replace('"__INF__"', "-Infinity")),
        ("raw: lone surrogate prompt", json.dumps(["\ud800 hello \udfff"] + ok[1:])),
        ("raw: too few arguments", json.dumps(ok[:2])),
        ("raw: data is a string", json.dumps("hello")),
        ("raw: a 1 MB prompt", json.dumps(["y" * 1_000_000] + ok[1:])),
    ]
    for name, data in raw_cases:
        t0 = time.perf_counter()
        try:
            msg, kind = _raw_call(url, fn_index, data, timeout), "raw"
        except Exception as err:
            msg, kind = f"{type(err).__name__}: {err}", "error"
        generated = "✓ Done" in msg
        if name == "raw: too few arguments":
            rows.append(dict(case=name, endpoint="/generate (raw HTTP)", outcome="refused by Gradio", message=msg[:220],
                             clear=True, seconds=round(time.perf_counter() - t0, 2)))
            continue
        clear = generated or (msg.startswith("⚠") or "not a number" in msg or msg.startswith("HTTP 422")) and not any(u in msg for u in UNCLEAR)
        rows.append(dict(case=name, endpoint="/generate (raw HTTP)", outcome="generated" if generated else kind,
                         message=msg[:220], clear=clear, seconds=round(time.perf_counter() - t0, 2)))
        if log:
            log(f"[bad input] {name}: {'ok ' if clear else 'UNCLEAR '}{msg[:140]!r}")
    health = c.predict(PROMPTS[0], 0.5, ui.FULL, "kv", 2, 0.0, info["default_model"], api_name="/generate")[3]
    c.close()
    after = probe(url)
    return {
        "cases": len(rows),
        "clear": sum(r["clear"] for r in rows),
        "unclear": [r for r in rows if not r["clear"]],
        "rows": rows,
        "serving_after": health.startswith("✓"),
        "server_after": {k: after[k] for k in ("live", "decoders")},
    }


def queue_cap_test(url: str, queue_size: int, timeout: float = 300.0) -> dict:
    """More requests than slots + queue: the extra ones are refused with a message, the rest finish."""
    info = probe(url)
    n = info["limits"]["concurrency"] + queue_size + 1
    clients = [client(url) for _ in range(n)]
    jobs = [submit(c, PROMPTS[0], max_new=1) for c in clients]
    outcomes = []
    for j in jobs:
        try:
            outcomes.append(("ok", j.result(timeout=timeout)[3][:80]))
        except Exception as err:
            outcomes.append(("refused", f"{type(err).__name__}: {err}"[:160]))
    for c in clients:
        c.close()
    refused = [m for k, m in outcomes if k == "refused"]
    return {"submitted": n, "finished": sum(k == "ok" for k, _ in outcomes), "refused": len(refused),
            "refusal_message": refused[0] if refused else None}


# -- 4. safe loading -------------------------------------------------------------------------------
def fuzz_router_loading(cases: int = 60, seed: int = 0) -> dict:
    """Random, truncated and bit-flipped router folders through the app's own path (`Resources.routers_for`,
    `available_router_sets`): only RouterLabError (a clean message), never another exception."""
    from routerlab import ui
    from routerlab.tuning.checkpoint import CONFIG, WEIGHTS, save_routers
    from routerlab.core.config import RoutingConfig
    from routerlab.core.engine import Engine
    from routerlab.core.models import tiny_model
    from routerlab.core.router import RouterSet

    rng = random.Random(seed)
    model = tiny_model("llama")
    engine = Engine(model, None, name="tiny-llama")
    routers = RouterSet.zeros(model, RoutingConfig.from_granularity("attention-token", [1, 2]))
    root = Path(tempfile.mkdtemp(prefix="routerlab-fuzz-"))
    good = save_routers(routers, root / "good", model)
    weights, config = (good / WEIGHTS).read_bytes(), (good / CONFIG).read_text()

    def mutate_bytes(b: bytes) -> bytes:
        kind = rng.randrange(4)
        if kind == 0:
            return b[: rng.randrange(len(b))]
        if kind == 1:
            return bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 600)))
        out = bytearray(b)
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(len(out))] = rng.getrandbits(8)
        if kind == 3:  # a header claiming a huge tensor
            out[:8] = rng.getrandbits(64).to_bytes(8, "little")
        return bytes(out)

    def mutate_json(s: str) -> str:
        data = json.loads(s)
        kind = rng.randrange(6)
        if kind == 0:
            return s[: rng.randrange(len(s))]
        if kind == 1:
            key = rng.choice(list(data))
            data[key] = rng.choice([None, -1, 1e308, "x" * 50, [], {}, float("nan"), True])
        elif kind == 2:
            data["layers"] = rng.choice([[-1], [10**9], ["1"], [1.5], list(range(200)), None])
        elif kind == 3:
            data["base_model"] = rng.choice([None, {}, {"n_layers": "4"}, {"n_layers": 4, "hidden_size": 64}, []])
        elif kind == 4:
            return "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randint(0, 200)))
        else:
            data.pop(rng.choice(list(data)))
        return json.dumps(data)

    counts = {"clean_error": 0, "loaded": 0}
    crashes: list[str] = []
    for n in range(cases):
        folder = root / f"case{n}"
        folder.mkdir()
        which = rng.randrange(3)
        (folder / WEIGHTS).write_bytes(mutate_bytes(weights) if which != 1 else weights)
        (folder / CONFIG).write_text(mutate_json(config) if which != 0 else config, encoding="utf-8", errors="surrogatepass")
        info = ui.RouterSetInfo(label=f"fuzz {n}", granularity="attention-token", path=folder)
        res = ui.Resources(engine, ui.Limits(), router_sets=[info], prompts=["x"])
        try:
            res.routers_for(engine, info.label)
            counts["loaded"] += 1
        except RouterLabError:
            counts["clean_error"] += 1
        except Exception as err:  # anything else is a loader bug
            crashes.append(f"case {n}: {type(err).__name__}: {str(err)[:160]}")
    import logging

    quiet = logging.getLogger(ui.__name__)
    level, quiet.level = quiet.level, logging.ERROR
    try:  # the start-up scan of the router folder skips bad folders with a warning, never crashes
        offered = [i.label for i in ui.available_router_sets(root)]
        scan_ok = True
    except Exception as err:
        crashes.append(f"available_router_sets: {type(err).__name__}: {err}")
        offered, scan_ok = [], False
    finally:
        quiet.level = level
    return {"cases": cases, **counts, "crashes": crashes, "scan_offered": len(offered), "scan_ok": scan_ok}


def safe_loading_checks() -> dict:
    """Static and environment checks: no trust_remote_code by default, the allow-list, the caps from env."""
    import inspect

    from routerlab.core import models
    from routerlab import ui

    default_trc = inspect.signature(models.load_model).parameters["trust_remote_code"].default
    env = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("ROUTERLAB_")}
    try:
        defaults = ui.Limits.from_env()
        os.environ.update({"ROUTERLAB_MAX_NEW_TOKENS": "7", "ROUTERLAB_MAX_PROMPT_CHARS": "99", "ROUTERLAB_QUEUE_SIZE": "3",
                           "ROUTERLAB_CONCURRENCY": "1", "ROUTERLAB_ALLOWED_MODELS": "org/a, org/b"})
        set_ = ui.Limits.from_env()
        os.environ.update({"ROUTERLAB_MAX_NEW_TOKENS": "lots", "ROUTERLAB_QUEUE_SIZE": "-4"})
        junk = ui.Limits.from_env()
    finally:
        for k in [k for k in os.environ if k.startswith("ROUTERLAB_")]:
            del os.environ[k]
        os.environ.update(env)
    return {
        "load_model_trust_remote_code_default": default_trc,
        "defaults": dict(max_new_tokens=defaults.max_new_tokens, max_prompt_chars=defaults.max_prompt_chars,
                         queue_size=defaults.queue_size, concurrency=defaults.concurrency, allowed_models=list(defaults.allowed_models)),
        "from_env": dict(max_new_tokens=set_.max_new_tokens, max_prompt_chars=set_.max_prompt_chars, queue_size=set_.queue_size,
                         concurrency=set_.concurrency, allowed_models=list(set_.allowed_models)),
        "junk_env_falls_back": dict(max_new_tokens=junk.max_new_tokens, queue_size=junk.queue_size),
    }


# -- the whole run ----------------------------------------------------------------------------------
def within_a_step(row: dict) -> bool:
    """Decoding ended within about one decode step of the stop request: the step in flight finishes, no new one
    starts. Bound: 3 median steps (a step under load is slower than the median) plus 250 ms of scheduling."""
    ms, step = row.get("stop_request_to_decode_end_ms"), row.get("decode_step_ms_p50")
    return ms is not None and step is not None and ms <= 3 * step + 250


def verdict(report: dict) -> list[str]:
    """What failed, as sentences; empty when everything passed."""
    bad = []
    load = report.get("load")
    if load:
        if load["errors"]:
            bad.append(f"load: {load['errors']} errors: {load['error_messages'][:3]}")
        if load["decision_errors"]:
            bad.append(f"load: {load['decision_errors']} decisions do not match their session's threshold")
        if not load["rss_growth_ok"]:
            bad.append(f"load: memory in use grew {load['rss_live_growth_mb']} MB (raw RSS {load['rss_growth_mb']} MB)")
        if load["server_after"]["live"] or load["server_after"]["decoders"]:
            bad.append(f"load: generators left running {load['server_after']}")
    faults = report.get("faults")
    if faults:
        for name in ("stop", "cancel", "disconnect"):
            row = faults[name]
            if not (row["generator_closed"] and row["next_request_ok"] and row["no_generator_left"]):
                bad.append(f"faults/{name}: {row}")
            elif not within_a_step(row):
                bad.append(f"faults/{name}: decoding ended {row['stop_request_to_decode_end_ms']} ms after the stop request "
                           f"(decode step p50 {row['decode_step_ms_p50']} ms)")
        if not all(faults["exception"][k] for k in ("failing_run_clean", "other_run_ok", "same_client_next_run_ok", "broken_router_set_clean")):
            bad.append(f"faults/exception: {faults['exception']}")
        if not faults["token_cap"]["clean"] or faults["token_cap"]["tokens"] > faults["token_cap"]["cap"]:
            bad.append(f"faults/token cap: {faults['token_cap']}")
    bi = report.get("bad_input")
    if bi:
        if bi["unclear"]:
            bad.append(f"bad input: unclear answers for {[r['case'] for r in bi['unclear']]}")
        if not bi["serving_after"]:
            bad.append("bad input: the server stopped serving")
    fz = report.get("fuzz")
    if fz and (fz["crashes"] or not fz["scan_ok"]):
        bad.append(f"fuzz: {fz['crashes'][:3]} scan_ok={fz['scan_ok']}")
    q = report.get("queue")
    if q and (q["refused"] == 0 or q["finished"] == 0):
        bad.append(f"queue cap: {q}")
    sl = report.get("safe_loading")
    if sl and sl["load_model_trust_remote_code_default"] is not False:
        bad.append("trust_remote_code is on by default")
    return bad


def run_all(args, log=print) -> dict:
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    env = {"ROUTERLAB_MAX_NEW_TOKENS": str(args.cap), "ROUTERLAB_QUEUE_SIZE": str(args.queue_size),
           "ROUTERLAB_CONCURRENCY": str(args.concurrency), "ROUTERLAB_MAX_PROMPT_CHARS": "4000",
           "GRADIO_TEMP_DIR": tempfile.mkdtemp(prefix="routerlab-gradio-")}
    report: dict[str, Any] = {"command": "python -m routerlab.bench.load " + " ".join(args.argv), "started": started,
                              "server_env": {k: v for k, v in env.items() if k.startswith("ROUTERLAB_")},
                              "machine": {"cpus": os.cpu_count(), "loadavg_before": list(os.getloadavg())}}
    report["safe_loading"] = safe_loading_checks()
    if args.fuzz_cases:
        report["fuzz"] = fuzz_router_loading(args.fuzz_cases)
        log(f"[fuzz] {report['fuzz']}")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        if args.inprocess:
            from routerlab.core.engine import Engine
            from routerlab.core.models import load_model

            loaded = load_model(device="cpu")
            server = serve(Engine(loaded.model, loaded.tokenizer, name=loaded.name))
        else:
            server = spawn(env=env, log_path=Path(tempfile.gettempdir()) / "routerlab-loadtest-server.log")
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    report["server"] = {"mode": "in-process" if args.inprocess else "child process (python -m routerlab.bench.load serve)", "pid": server.pid}
    try:
        phases = set(args.phases.split(","))
        if "load" in phases:
            report["load"] = load_test(server.url, args.sessions, args.generations, args.max_new, args.deadline, log=log)
        if "faults" in phases:
            report["faults"] = fault_tests(server.url, max_new=args.cap, log=log)
        if "bad_input" in phases:
            report["bad_input"] = bad_input_test(server.url, log=log)
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
    p = argparse.ArgumentParser(prog="python -m routerlab.bench.load", description=__doc__.split("\n")[0])
    p.add_argument("mode", nargs="?", default="run", choices=["run", "serve"], help="run the tests (default) or only serve")
    p.add_argument("--port", type=int, default=None, help="serve: port on 127.0.0.1")
    p.add_argument("--sessions", type=int, default=8, help="concurrent gradio_client visitors")
    p.add_argument("--generations", type=int, default=50, help="generations shared by the visitors")
    p.add_argument("--max-new", type=int, default=16, help="new tokens per load-test generation")
    p.add_argument("--cap", type=int, default=48, help="the server's ROUTERLAB_MAX_NEW_TOKENS (the token-cap fault test asks for exactly this)")
    p.add_argument("--concurrency", type=int, default=2, help="the server's ROUTERLAB_CONCURRENCY")
    p.add_argument("--queue-size", type=int, default=16, help="the server's ROUTERLAB_QUEUE_SIZE")
    p.add_argument("--fuzz-cases", type=int, default=200)
    p.add_argument("--deadline", type=float, default=1500.0, help="seconds the load phase may take at most")
    p.add_argument("--inprocess", action="store_true", help="serve from this process (RSS then includes the clients)")
    p.add_argument("--phases", default="load,faults,bad_input,queue", help="which server phases to run (comma-separated)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="JSON results file ('-' for none)")
    p.add_argument("--json", action="store_true", help="print the JSON report")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    if args.mode == "serve":
        return _serve_forever(args.port or 7861)
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


def summary(report: dict) -> str:
    lines = []
    load = report.get("load")
    if load:
        lines.append(
            f"load: {load['sessions']} sessions, {load['generations']} generations, {load['errors']} errors, "
            f"{load['decision_errors']} wrong decisions in {load['traces_checked']} traces; {load['throughput_tokens_per_s']} tok/s total; "
            f"engine step p50/p95 {load['engine_step_ms_p50']}/{load['engine_step_ms_p95']} ms; client per-token p50/p95 "
            f"{load['client_per_token_ms_p50']}/{load['client_per_token_ms_p95']} ms; RSS {load['rss_mb_early_median']} -> "
            f"{load['rss_mb_late_median']} MB ({load['rss_growth_mb']:+} MB), {load['rss_mb_after_malloc_trim']} MB after malloc_trim "
            f"({load['rss_live_growth_mb']:+} MB in use)")
    f = report.get("faults")
    if f:
        for k in ("stop", "cancel", "disconnect"):
            r = f[k]
            lines.append(f"{k}: generator ended {r['interrupt_to_generator_end_s']} s after the interrupt "
                         f"(stop->decode end {r['stop_request_to_decode_end_ms']} ms, decode step p50 {r['decode_step_ms_p50']} ms); "
                         f"next request's first token after {r['next_request_first_token_s']} s")
        lines.append(f"exception: {f['exception']}; token cap: {f['token_cap']['tokens']}/{f['token_cap']['cap']} ({f['token_cap']['stop_reason']})")
    b = report.get("bad_input")
    if b:
        lines.append(f"bad input: {b['clear']}/{b['cases']} clear; serving after: {b['serving_after']}")
    if report.get("fuzz"):
        z = report["fuzz"]
        lines.append(f"fuzz: {z['cases']} cases, {z['clean_error']} clean errors, {z['loaded']} loaded, {len(z['crashes'])} crashes")
    if report.get("queue"):
        lines.append(f"queue: {report['queue']}")
    lines.append("PASSED" if report["passed"] else "FAILED:\n  " + "\n  ".join(report["failures"]))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
