"""A room served from an engine process of its own: `RemoteRoom` has the room's reader side (`submit` returns an iterator
of Steps; `busy`, `where`, `steps`, `largest`, `max_batch`, `close`), so `engine.room = RemoteRoom(...)` leaves the UI as
it is, while the model, the room and its loop live in a child process (core/serve/engine_process.py) whose main thread no
web server thread ever interrupts. Anchor: vLLM V1's engine-core process behind its API server.

One duplex pipe; the web side sends under a lock, and one dispatcher thread reads everything the engine sends and
hands it to each request's queue. Messages (tuples; `rid`: a request's number on the web side):

  web -> engine   ("submit", rid, ids, key, bytes | None, config, threshold)  the request; the router set by value
                                                  (wire.pack_routers: bytes only when the engine may not have `key`)
                  ("threshold", rid, value)       a slider moved (a watcher thread looks every WATCH_S)
                  ("stop", rid)                   Stop, a new click, or a reader that stopped reading (a closed tab)
                  ("step", n)                     stepped mode only (tests): run n steps of the room
                  ("close",)                      end the process
  engine -> web   ("ready", info) | ("failed", text)   once, after the model loaded
                  ("log", text)                   for the server's log (where the loop runs)
                  ("batch", events, stats)        everything ready at once: per request ("step", rid, Step),
                                                  ("patch", rid, index, kl_full, full_top_token, full_top_text),
                                                  ("meta", rid, set, extend), ("state", rid, sharing, measuring,
                                                  scoring, quality_chunks, prompt_tokens, prompt_read), then
                                                  ("end", rid) or ("error", rid, e);
                                                  stats: where, thread, steps, largest, busy of the room
                  ("stepped", busy)               stepped mode: the steps asked for ran

The web side writes each Step into the run's own Trace (the one `Engine.generate_ids` made here) and the patches, meta
and Control state onto it, as the in-process room does, so whoever reads `control.trace` sees the same thing.

If the engine process dies, every reader in flight gets a RouterLabError that says so and asks to press Generate again,
a fresh process starts, and requests that arrive meanwhile wait for it; traces and trained sets live here and are not
lost. If this process dies, the pipe ends and the engine process ends with it. Knows nothing about Gradio or the UI.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from routerlab.core.base.errors import RouterLabError
from routerlab.core.records.trace import Step, Trace
from routerlab.core.serve.engine_process import EngineSpec, main
from routerlab.core.serve.room import _END, MAX_BATCH, Room, run_where_fastest
from routerlab.core.serve.wire import SentKeys, apply_change, pack_routers, unpack_error

_log = logging.getLogger(__name__)

WATCH_S = 0.02  # how often the watcher looks for moved sliders and Stops to send
START_TIMEOUT_S = 600.0  # a first start may convert the embedded model (about a minute on 2 cores)


@dataclass
class _Job:
    rid: int
    control: object
    trace: Trace
    request: tuple  # (ids, routers' (key, bytes) or None, config)
    out: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    sent: bool = False  # in the engine process now running
    threshold: float | None = None  # as last sent
    stop_sent: bool = False


class RemoteRoom:
    """The room's reader side, its loop in a spawned engine process built from `spec` (see the module docstring).
    Raises RouterLabError when the process cannot start. `stepped`: the loop runs only when `step` is called (tests)."""

    def __init__(self, spec: EngineSpec, max_batch: int = MAX_BATCH, cache_bytes: int | None = None, stepped: bool = False,
                 log: Callable[[str], None] | None = None, start_timeout: float = START_TIMEOUT_S):
        self.spec, self.max_batch, self.cache_bytes, self.stepped = spec, max(1, int(max_batch)), cache_bytes, stepped
        self.log = log or (lambda m: _log.info("%s", m))
        self.start_timeout = start_timeout
        self.where: str | None = None
        self.thread_name: str | None = None
        self.steps = 0
        self.largest = 0
        self._spent: dict = {}
        self.restarts = 0
        self._busy = {"rows": 0, "solo": 0, "waiting": 0}
        self._lock = threading.RLock()  # jobs, the connection and sends
        self._jobs: dict[int, _Job] = {}
        self._ids = itertools.count()
        self._keys = SentKeys()
        self._stepped: queue.SimpleQueue = queue.SimpleQueue()
        self._closing = False
        self._conn = self._process = None
        self._start()
        threading.Thread(target=self._watch, name="routerlab-remote-watch", daemon=True).start()

    # -- the readers' side ---------------------------------------------------------------------------
    def submit(self, ids: list[int], routers, config, control, trace: Trace) -> Iterator[Step]:
        job = _Job(next(self._ids), control, trace, (list(ids), pack_routers(routers), config))
        with self._lock:
            if self._closing:
                raise RuntimeError("the room is closed")
            self._jobs[job.rid] = job
            if self._conn is not None:
                self._send_job(job)
        return self.read(job)

    @staticmethod
    def read(job: _Job) -> Iterator[Step]:
        """The room's own reader: Steps until the end, an error raised, and a reader that stops reading (a closed tab)
        stops its row (the watcher tells the engine)."""
        return Room.read(job)

    @property
    def busy(self) -> dict:
        return dict(self._busy)

    def time_spent(self) -> dict:
        """The engine process's `Room.time_spent`, as last sent."""
        return dict(self._spent)

    @property
    def pid(self) -> int | None:
        """The engine process's id (None while none runs)."""
        return self._process.pid if self._process is not None else None

    def step(self, n: int = 1, timeout: float = 120.0) -> dict:
        """Stepped mode: send what the sliders and Stops changed, run `n` steps of the room, return its `busy`."""
        self._push_controls()
        while not self._stepped.empty():  # a reply left by a crash nobody was waiting on
            self._stepped.get_nowait()
        with self._lock:
            if self._conn is None:
                raise RuntimeError("no engine process runs now (it is restarting)")
            self._conn.send(("step", n))
        try:
            return self._stepped.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"the engine process did not step within {timeout:.0f} s") from None

    def close(self, timeout: float = 30.0) -> None:
        """End the engine process (its step in flight first) and fail the readers still waiting."""
        with self._lock:
            self._closing = True
            process, conn = self._process, self._conn
            if conn is not None:
                try:
                    conn.send(("close",))
                except OSError:
                    pass
        if process is not None:
            try:
                process.join(timeout)
            finally:  # also a second Ctrl-C while it ends: never leave it behind
                if process.is_alive():
                    process.kill()
                    process.join(5.0)
        self._fail(lambda job: True, RouterLabError("The server is shutting down: this generation was cut short."))

    # -- the engine process --------------------------------------------------------------------------
    def _start(self) -> None:
        """Spawn the engine process and wait until its model is loaded; RouterLabError if it cannot start."""
        ctx = multiprocessing.get_context("spawn")
        mine, theirs = ctx.Pipe(duplex=True)
        process = ctx.Process(target=main, args=(theirs, self.spec, self.max_batch, self.cache_bytes, self.stepped),
                              name="routerlab-engine", daemon=True)
        t0 = time.perf_counter()
        process.start()
        theirs.close()  # only the child holds that end now: its death ends our reads
        reply = None
        try:
            while process.is_alive() or mine.poll():
                if mine.poll(0.5):
                    reply = mine.recv()
                    break
                if time.perf_counter() - t0 > self.start_timeout:
                    break
        except (EOFError, OSError):
            reply = None
        if not reply or reply[0] != "ready":
            process.kill()
            process.join(5.0)
            why = reply[1] if reply else (f"it exited with code {process.exitcode}" if process.exitcode is not None
                                          else f"it did not load the model within {self.start_timeout:.0f} s")
            raise RouterLabError(f"The engine process did not start ({why}).", "See the server's log.")
        self.log(f"the engine process (pid {process.pid}) loaded {reply[1]['name']} in {time.perf_counter() - t0:.1f} s")
        with self._lock:
            self._keys.clear()
            self._conn, self._process = mine, process
            for job in self._jobs.values():  # requests that arrived while it started
                if not job.sent:
                    self._send_job(job)
        threading.Thread(target=self._dispatch, args=(mine, process), name="routerlab-remote-dispatch", daemon=True).start()

    def _send_job(self, job: _Job) -> None:
        """Under the lock. A send that fails leaves the job unsent: the dispatcher restarts the process, then sends it."""
        ids, packed, config = job.request
        key, data = packed if packed is not None else (None, None)
        try:
            self._conn.send(("submit", job.rid, ids, key, data if key is None or self._keys.touch(key) else None,
                             config, job.control.threshold))
        except OSError:
            return
        job.sent, job.threshold = True, job.control.threshold

    def _dispatch(self, conn, process) -> None:
        try:
            while True:
                msg = conn.recv()
                if msg[0] == "batch":
                    self._apply(msg[1], msg[2])
                elif msg[0] == "log":
                    self.log(f"engine process: {msg[1]}")
                elif msg[0] == "stepped":
                    self._stepped.put(msg[1])
        except (EOFError, OSError):
            pass
        if self._closing:
            return
        process.join(5.0)
        code = process.exitcode
        self.log(f"the engine process (pid {process.pid}) stopped unexpectedly (exit code {code}); starting a fresh one")
        with self._lock:
            self._conn = self._process = None
            self._fail(lambda job: job.sent, RouterLabError(
                f"The engine process stopped unexpectedly (exit code {code}) during this generation.",
                "Press Generate again: a fresh engine process is starting."))
        self._stepped.put({"rows": 0, "solo": 0, "waiting": 0})  # a test waiting on `step` goes on
        self._restart()

    def _restart(self) -> None:
        while not self._closing:
            try:
                self._start()
                self.restarts += 1
                return
            except RouterLabError as err:
                self.log(f"{err} Trying again in 10 s.")
                self._fail(lambda job: True, err)
                time.sleep(10.0)

    def _apply(self, events: list, stats: dict | None) -> None:
        if stats is not None:
            self.where, self.thread_name, self.steps, self.largest, self._busy = (
                stats["where"], stats["thread"], stats["steps"], stats["largest"], stats["busy"])
            self._spent = stats.get("spent", {})
        for event in events:
            kind, rid = event[0], event[1]
            job = self._jobs.get(rid)
            if job is None:
                continue
            if kind == "step":
                job.trace.steps.append(event[2])  # as Generation records it, before the reader sees it
                job.out.put(event[2])
            elif kind in ("end", "error"):
                with self._lock:
                    self._jobs.pop(rid, None)
                job.out.put(_END if kind == "end" else unpack_error(event[2]))
            else:
                apply_change(job.trace, job.control, (kind, *event[2:]))

    def _fail(self, which, error: BaseException) -> None:
        with self._lock:
            failed = [job for job in self._jobs.values() if which(job)]
            for job in failed:
                self._jobs.pop(job.rid, None)
        for job in failed:
            job.out.put(error)

    # -- sliders and Stops -----------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._closing:
            time.sleep(WATCH_S)
            try:
                self._push_controls()
            except Exception as err:  # never let the watcher die: Stop must keep working
                _log.error("sending a threshold or Stop failed", exc_info=err)

    def _push_controls(self) -> None:
        with self._lock:
            if self._conn is None:
                return
            for job in list(self._jobs.values()):
                if not job.sent:
                    continue
                try:
                    if job.control.stop_requested and not job.stop_sent:
                        self._conn.send(("stop", job.rid))
                        job.stop_sent = True
                    elif job.control.threshold != job.threshold:
                        self._conn.send(("threshold", job.rid, job.control.threshold))
                        job.threshold = job.control.threshold
                except OSError:
                    return  # the process is gone: the dispatcher sees it too


# -- serving ----------------------------------------------------------------------------------------
def open_room(engine, spec: EngineSpec | None, max_batch: int = MAX_BATCH, cache_bytes: int | None = None,
              log: Callable[[str], None] = print):
    """The room that serves `engine` (set as `engine.room`): its loop in an engine process built from `spec`, or in this
    process when `spec` is None or the engine process cannot start (said in the log)."""
    room = None
    if spec is not None:
        try:
            room = RemoteRoom(spec, max_batch, cache_bytes, log=log)
            log(f"the decode loop runs in the engine process (pid {room.pid}); this process serves the pages (ROUTERLAB_ENGINE=process)")
        except RouterLabError as err:
            log(f"{err} The decode loop runs in this process instead, beside the web server, as ROUTERLAB_ENGINE=thread does.")
    if room is None:
        room = Room(engine, max_batch, cache_bytes)
    engine.room = room
    return room


def serve_room(room, engine, log: Callable[[str], None] = print) -> None:
    """Until Ctrl-C, in the main thread: an in-process room's loop runs here (`run_where_fastest`); a RemoteRoom's runs
    in its engine process, and this thread only waits. Either way the room is closed at the end."""
    if not isinstance(room, RemoteRoom):
        log("the decode loop runs in this process, beside the web server (ROUTERLAB_ENGINE=thread)")
        run_where_fastest(room, engine, log=log)
        return
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:  # Ctrl-C: a second to end its loop (in start-up it may be timing its steps for seconds), then it is killed
        room.close(timeout=1.0)
