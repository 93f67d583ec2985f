"""The watched server: the real app (`ui.build_demo`) on the shared Engine, with test-only additions.

Owns `WatchedEngine` (counts generators opened and closed, times stop request -> end of decoding,
raises inside a generation whose prompt carries `FAULT_MARKER`), the hidden `/loadtest_stats` and
`/loadtest_trim` endpoints, the truncated and random router sets it offers, `serve` (in this process)
and `spawn` (a child process running `python -m routerlab.bench.load serve`, which prints `READY`).
Knows nothing about the clients, the tests run against it, or the report.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from routerlab.core.base.paths import ROOT

FAULT_MARKER = "[[routerlab-loadtest:fault]]"
READY = "ROUTERLAB-LOADTEST-READY"
BROKEN_LABEL = "attention-token · broken (loadtest)"


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
        # ... and, apart, the quality pass's final flush after it (scoring tokens already written, not decoding)
        self.stop_flush: list[float] = []
        self.step_seconds: list[float] = []  # recent decode step times (for "one decode step")

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def generate(self, prompt, routers, config, control=None):
        from routerlab.core.decode.engine import Control

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
                    meta = control.trace.meta if control.trace is not None else {}
                    flush = max(0.0, meta.get("quality_seconds", 0.0) - meta.get("quality_seconds_in_steps", 0.0))
                    self.stop_to_end.append(end - control._stop.at - flush)
                    self.stop_flush.append(flush)

    def stats(self) -> dict:
        with self._lock:
            steps = sorted(self.step_seconds)
            return {
                "opened": self.opened,
                "closed": self.closed,
                "live": self.opened - self.closed,
                "injected": self.injected,
                "stop_to_end": list(self.stop_to_end),
                "stop_flush": list(self.stop_flush),
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
    from routerlab.core.base.config import RoutingConfig, default_layers
    from routerlab.core.routing.router import RouterSet
    from routerlab.tuning.checkpoint import WEIGHTS, save_routers
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

    from routerlab.core.base.config import RoutingConfig, default_layers
    from routerlab.core.routing.router import RouterSet
    from routerlab.tuning.checkpoint import read_config, save_routers
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
    room: Any = None  # the engine's core.serve.room.Room, when it has one (in-process only)


def build_server(engine, limits=None, router_sets=None, workdir: Path | None = None):
    """The real app (`ui.build_demo`) on a WatchedEngine, plus the hidden stats endpoint. Returns (demo, res, watched)."""
    import gradio as gr

    from routerlab import ui
    from routerlab.ui.state.uploads import upload_folder

    limits = limits or ui.Limits.from_env()
    watched = WatchedEngine(engine)
    sets = list(router_sets if router_sets is not None else ui.available_router_sets())
    workdir = Path(workdir or tempfile.mkdtemp(prefix="routerlab-loadtest-"))
    # the broken and random sets go last: the page's default set stays the real app's (the first shipped token-level one)
    sets += [_broken_router_set(engine, workdir / "broken")]
    sets += [_random_router_set(engine, workdir / g, g, seed) for seed, g in enumerate(("attention-token", "attention-sequence"))]
    res = ui.Resources(watched, limits, router_sets=sets)
    demo = ui.build_demo(res)

    def stats():
        return {**watched.stats(), "rss": rss_bytes(), "threads": threading.active_count(),
                "decoders": sum(t.name == "routerlab-decode" for t in threading.enumerate()),
                "limits": {"max_new_tokens": limits.max_new_tokens, "max_prompt_chars": limits.max_prompt_chars,
                           "queue_size": limits.queue_size, "concurrency": limits.concurrency,
                           "allowed_models": list(limits.allowed_models), "training": limits.training,
                           "training_nice": limits.training_nice, "uploads": ui.UploadBudget.from_env().describe()},
                "upload_folder": str(upload_folder()),
                "router_labels": res.router_labels(), "default_model": res.default_model,
                "training_phase": res.trainer.phase() if res.trainer else None, "room": _room_stats(engine)}

    def trim():
        before = rss_bytes()
        return {"before": before, "after": rss_bytes() if malloc_trim() else before}

    with demo:  # test-only endpoints; app.py never adds them
        probe = gr.JSON(visible=False)
        gr.Button(visible=False).click(stats, None, probe, api_name="loadtest_stats", queue=False)
        gr.Button(visible=False).click(trim, None, probe, api_name="loadtest_trim", queue=False)
    ui.enable_queue(demo, limits)
    return demo, res, watched


def _room_stats(engine) -> dict | None:
    """Where the engine's room decodes and how full it has been (None: each generation decodes alone)."""
    room = getattr(engine, "room", None)
    if room is None:
        return None
    return {"where": room.where, "thread": room.thread_name, "max_batch": room.max_batch, "steps": room.steps,
            "largest_batch": room.largest, **room.busy, "spent": room.time_spent()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(engine, limits=None, router_sets=None, port: int | None = None, room_thread: bool = True, spec=None) -> Server:
    """Launch the watched app in this process on 127.0.0.1 (non-blocking). With `limits.room` and an Engine itself (a
    test's Holding wrapper decodes alone), the engine gets a room: with `spec` (an engine_process.EngineSpec of the same
    model) its loop runs in an engine process, as app.py runs it with ROUTERLAB_ENGINE=process; else in a thread of its
    own, unless `room_thread` is False (the caller then runs `server.room`'s loop, e.g. in the main thread)."""
    from routerlab import ui
    from routerlab.core.decode.engine import Engine
    from routerlab.core.serve.remote import RemoteRoom, open_room

    demo, res, watched = build_server(engine, limits, router_sets)
    room = None
    if res.limits.room and isinstance(engine, Engine):
        room = open_room(engine, spec, res.limits.max_batch, res.limits.room_cache_mb << 20,
                         log=lambda m: print(m, file=sys.stderr, flush=True))
        if room_thread and not isinstance(room, RemoteRoom):
            room.start()
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=port or free_port(), prevent_thread_lock=True,
                            quiet=True, **ui.launch_options())

    def close():
        demo.close()
        if room is not None:
            room.close()
            engine.room = None

    return Server(url=url, limits=res.limits, close=close, pid=os.getpid(), res=res, watched=watched, room=room)


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
    from routerlab import ui
    from routerlab.core.decode.engine import Engine
    from routerlab.core.model.models import load_model
    from routerlab.core.serve.engine_process import EngineSpec
    from routerlab.core.serve.remote import RemoteRoom
    from routerlab.core.serve.room import run_where_fastest, where_to_run

    loaded = load_model(device="cpu")
    engine = Engine.from_loaded(loaded)
    spec = EngineSpec(kwargs={"model": None}) if ui.Limits.from_env().room_process else None  # the same model (ROUTERLAB_ENGINE)
    server = serve(engine, port=port, room_thread=False, spec=spec)
    local = server.room is not None and not isinstance(server.room, RemoteRoom)  # its loop runs in this main thread
    choice = where_to_run(engine) if local else None  # measured before any client arrives
    print(READY, server.url, flush=True)
    try:
        if local:
            run_where_fastest(server.room, engine, log=lambda m: print(m, file=sys.stderr, flush=True), choice=choice)  # as app.py does
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0

