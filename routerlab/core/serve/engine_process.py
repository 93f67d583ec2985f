"""The engine process: the model, the room and its decode loop in a process of their own, so no web server thread
ever takes the loop's interpreter lock or cores (as vLLM V1's engine-core process). Started by core/serve/remote.py
(`RemoteRoom`), which documents the messages; `main` is the process's entry.

Threads here: the main thread runs the room's loop (`run_where_fastest`, as app.py does in-process; or, for tests,
`stepped`: one `Room.step` per "step" message); a receiver turns the web side's messages into requests, threshold
moves and Stops; the loop puts every request's Steps into one queue itself (`Room.submit`'s sink: no thread per
request); one sender gathers everything ready into one message per send. Ctrl-C is the web process's to handle
(it sends "close"); when the web process dies the pipe ends, and so does this process.

Knows nothing about Gradio or the UI.
"""

from __future__ import annotations

import importlib
import logging
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass, field

from routerlab.core.records.trace import Step
from routerlab.core.serve.room import END
from routerlab.core.serve.wire import RouterCache, TraceWatch, pack_error

log = logging.getLogger(__name__)

COALESCE_S = 0.015  # how long the sender lets Steps gather before it sends them (and diffs every run's records) ...
ROWS_PER_COALESCE = 4  # ... for up to this many requests; with more, proportionally longer, up to COALESCE_MAX_S: each
COALESCE_MAX_S = 0.12  # send wakes the web process's threads, and on 2 cores each wake takes a core from the loop's
# OpenMP threads mid-step (a crowd's pages draw every few seconds anyway, ui/state/stream.py's SHARED_ROWS_PER_PACE)
POLL_S = 0.05  # with no new Step, the sender still looks this often for quality passes starting or ending
_END = object()


def coalesce_seconds(requests: int) -> float:
    """How long the sender lets Steps gather before a send, with `requests` in flight."""
    return min(COALESCE_MAX_S, COALESCE_S * max(1.0, requests / ROWS_PER_COALESCE))


@dataclass(frozen=True)
class EngineSpec:
    """How the engine process builds its Engine: `factory` ("module:function") called with `kwargs`. Picklable, so a
    spawned process builds the same model as the web process (`load_engine` with app.py's spec, dtype and quantize;
    `tiny_engine` in tests)."""

    factory: str = "routerlab.core.serve.engine_process:load_engine"
    kwargs: dict = field(default_factory=dict)

    def build(self):
        module, name = self.factory.split(":")
        return getattr(importlib.import_module(module), name)(**self.kwargs)


def load_engine(model: str | None = None, dtype: str = "auto", quantize: str = "auto"):
    """The app's engine (app.py load_engine): the model `load_model` loads, with its low-bit weights."""
    from routerlab.core.decode.engine import Engine
    from routerlab.core.model.models import load_model

    return Engine.from_loaded(load_model(model, dtype=dtype, quantize=quantize))


def tiny_engine(family: str = "llama", seed: int = 0, name: str = "tiny", **overrides):
    """A tiny random model's engine (models.tiny_model): the same weights in every process that builds it."""
    from routerlab.core.decode.engine import Engine
    from routerlab.core.model.models import tiny_model

    return Engine(tiny_model(family, seed, **overrides), name=name)


def main(conn, spec: EngineSpec, max_batch: int, cache_bytes: int | None, stepped: bool = False) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the terminal reaches us too: the web process closes us
    logging.basicConfig(level=logging.INFO, format="RouterLab engine process: %(message)s")
    try:
        from routerlab.core.serve.room import Room, run_where_fastest, where_to_run

        engine = spec.build()
        room = engine.room = Room(engine, max_batch, cache_bytes)
        choice = None if stepped else where_to_run(engine)  # measured before any request arrives
    except BaseException as err:  # the web side says so and serves from its own process
        conn.send(("failed", f"{type(err).__name__}: {err}"))
        return
    child = _Child(conn, engine, room)
    conn.send(("ready", {"pid": os.getpid(), "name": engine.name, "weights": engine.weights}))
    child.start()
    if stepped:
        child.serve_steps()
    else:
        run_where_fastest(room, engine, log=child.log, choice=choice)  # until "close", or the web process is gone
    child.stop()


@dataclass
class _Job:
    rid: int
    control: object
    watch: TraceWatch


@dataclass(frozen=True)
class _Sink:
    """Where the room puts a request's Steps (Room.submit's sink): straight into the sender's queue, from the loop's
    own thread, with no thread per request to wake."""

    job: _Job
    events: queue.SimpleQueue

    def put(self, item) -> None:
        self.events.put((self.job, _END if item is END else item))


class _Child:
    def __init__(self, conn, engine, room):
        self.conn, self.engine, self.room = conn, engine, room
        self.routers = RouterCache()
        self.jobs: dict[int, _Job] = {}
        self.events: queue.SimpleQueue = queue.SimpleQueue()  # (job, Step | _END | exception) or (None, message)
        self.steps: queue.SimpleQueue = queue.SimpleQueue()  # stepped mode: steps to run (None: end)
        self.send_lock = threading.Lock()
        self.closed = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._receive, name="routerlab-engine-receive", daemon=True).start()
        self._sender = threading.Thread(target=self._send_loop, name="routerlab-engine-send", daemon=True)
        self._sender.start()

    def log(self, message: str) -> None:
        self._send(("log", message))

    def serve_steps(self) -> None:
        while (n := self.steps.get()) is not None:
            for _ in range(n):
                self.room.step()
            self.events.put((None, ("stepped", self.room.busy)))

    def stop(self) -> None:
        self.closed.set()
        self._sender.join(5.0)

    def _send(self, message) -> None:
        with self.send_lock:
            try:
                self.conn.send(message)
            except (OSError, EOFError):  # the web process is gone: the receiver ends us
                pass

    # -- web -> engine -----------------------------------------------------------------------------
    def _receive(self) -> None:
        try:
            while True:
                msg = self.conn.recv()
                kind = msg[0]
                if kind == "submit":
                    self._submit(*msg[1:])
                elif kind in ("threshold", "stop"):
                    job = self.jobs.get(msg[1])
                    if job is None:  # it has ended meanwhile
                        continue
                    try:
                        if kind == "stop":
                            job.control.request_stop()
                        else:
                            job.control.threshold = msg[2]
                    except Exception as err:  # a bad value: the slider checks it first, so only a bug gets here
                        log.error("request %d: %s", msg[1], err)
                elif kind == "step":
                    self.steps.put(msg[1])
                elif kind == "close":
                    break
        except (EOFError, OSError):
            pass  # the web process is gone: end with it
        finally:
            for job in list(self.jobs.values()):
                job.control.request_stop()
            self.room.close()
            self.steps.put(None)

    def _submit(self, rid: int, ids, key, data, config, threshold) -> None:
        from routerlab.core.decode.engine import Control

        try:
            routers = self.routers.get(key, data, self.engine.device)
            control = Control(threshold)
            trace = self.engine.new_trace(ids, routers, config, control)
            job = self.jobs[rid] = _Job(rid, control, TraceWatch(trace, control))
            self.room.submit(ids, routers, config, control, trace, sink=_Sink(job, self.events))
        except Exception as err:
            self.jobs.pop(rid, None)
            self._send(("batch", [("error", rid, pack_error(err))], None))

    # -- engine -> web -----------------------------------------------------------------------------
    def _send_loop(self) -> None:
        stats = None
        while not self.closed.is_set():
            try:
                items = [self.events.get(timeout=POLL_S)]
                # A step makes a Step for every row: wait for the rest of it, so the watches of every job are diffed
                # (Python work that holds the interpreter lock the loop needs) once per batch, not once per row.
                time.sleep(coalesce_seconds(len(self.jobs)))
            except queue.Empty:
                items = []
            while True:
                try:
                    items.append(self.events.get_nowait())
                except queue.Empty:
                    break
            out, replies = [], []
            for job, item in items:
                if job is None:
                    replies.append(item)
                elif isinstance(item, Step):
                    out.append(("step", job.rid, item))
                    job.watch.sent_step(item)
                else:  # the run ended: what its end changed first (the last quality patches, stop_reason ...)
                    out += [(c[0], job.rid, *c[1:]) for c in job.watch.changes()]
                    out.append(("end", job.rid) if item is _END else ("error", job.rid, pack_error(item)))
                    self.jobs.pop(job.rid, None)
            for job in list(self.jobs.values()):
                out += [(c[0], job.rid, *c[1:]) for c in job.watch.changes()]
            room = self.room
            now = {"where": room.where, "thread": room.thread_name, "steps": room.steps, "largest": room.largest, "busy": room.busy,
                   "spent": room.time_spent()}
            if out or now != stats:
                stats = now
                self._send(("batch", out, now))
            for reply in replies:
                self._send(reply)
