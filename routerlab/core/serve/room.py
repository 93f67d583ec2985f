"""The room: one decode loop for the whole process, every running generation one token per step, in one batch.

`Room.submit` takes a request (what `Engine.generate_ids` was given) and returns its Steps as an iterator, read
by any thread; the Steps are computed by whichever thread runs the room (`run`, or `start` for a thread of its
own). Each `step`:

  1. admits waiting requests while the batch has room (at most `max_batch` rows, and at most `cache_bytes` of KV
     caches as the rows' longest runs would fill them), prefilling their prompts until PREFILL_BUDGET_S of the step
     is spent (at least one forward: short prompts together in one packed forward, core/ops/packed.py), so streams
     already running stall for about that long at most, and a crowd that arrives together is read within a step or
     two (a served room first lets a crowd gather: `gather`, GATHER_GAP_S); a long prompt (more than one prefill
     chunk) is read a chunk a step, so nobody waits for a whole document;
  2. lets each row begin its token (its quality meter's due pass, Stop, sampling, end of text; core/decode/generation.py);
  3. runs every row that feeds a token through one batched forward (core/ops/batch.py): each row with its own routers,
     threshold and KV policy; a row that ends leaves at once and its caches go with it;
  4. advances each solo run (`config.shared=False`: Compare's columns, whose speeds are compared) by one token of
     its own batch-1 forward, so they decode in lockstep, timed alone, on the same fast thread.

While rows share the step, their quality meters score full chunks only (and what is left when a row ends), never a
partial chunk on a timer: a full-depth pass over a few tokens costs nearly what one over a whole chunk does, and every
row in the room waits for it. A row alone refreshes on its timer, as a generation alone does.

A failure inside the batched forward fails the rows of that step (each reader raises it), never the room.
Knows nothing about Gradio or the UI.
"""

from __future__ import annotations

import logging
import queue
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator

import torch

from routerlab.core.base.device import is_cuda, now
from routerlab.core.decode import generation
from routerlab.core.decode.generation import Generation
from routerlab.core.graph import step_graph
from routerlab.core.kernels import batch_paths
from routerlab.core.ops.packed import forward_shared
from routerlab.core.records.quality import score_together
from routerlab.core.records.trace import Step, Trace
from routerlab.core.serve.lockstep import in_turn
from routerlab.core.serve.threads import ThreadTuner

log = logging.getLogger(__name__)

MAX_BATCH = 32  # rows in one step (ROUTERLAB_MAX_BATCH): the int4 kernel still gains per row at 32 on 2 cores
PREFILL_BUDGET_S = 0.3  # prompt prefills one step may take before the running rows get their next token
# A served room gathers a crowd (run_where_fastest turns it on): newcomers wait while others keep arriving less than
# GATHER_GAP_S apart, GATHER_MAX_S at most from the first of them, then are read in one packed prefill. Reading the
# first arrival at once took both cores from the web process still handing over the rest: 32 visitors pressing
# Generate together reached the loop over 0.9 s in three prefills, with gaps of 0.2-0.4 s while each ran.
GATHER_GAP_S, GATHER_MAX_S = 0.1, 0.6
# Rows' quality passes that fall due together run as one packed forward of at most this many scored tokens (their
# logits: 256 x 49k floats, 50 MB) and about this many tokens fed (first passes read the prompt too).
PACK_LOGITS, PACK_TOKENS = 256, 2048
_END = object()
END = _END  # what a request's sink (Room.submit) receives after its last Step


@dataclass(eq=False)  # compared by identity: `entry in self._rows` must not compare prompts, routers and queues
class _Entry:
    """One request in the room: its reader's queue, and its Generation (shared) or step iterator (solo)."""

    args: tuple  # (ids, routers, config, control, trace)
    out: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)  # or the request's sink (Room.submit)
    gen: Generation | None = None
    solo: Iterator[Step] | None = None
    reading: Iterator[int] | None = None  # a long prompt's chunks still to read (Generation.prefill_chunks)
    cache_bytes: int = 0
    arrived: float = 0.0  # time.perf_counter() at submit

    @property
    def control(self):
        return self.args[3]


class Room:
    def __init__(self, engine, max_batch: int = MAX_BATCH, cache_bytes: int | None = None):
        self.engine = engine
        self.max_batch = max(1, int(max_batch))
        self.cache_bytes = cache_bytes  # None: no cap beyond max_batch
        self.pack_quality = True  # rows' quality passes due together run packed (False: one by one, for comparison)
        self.pack_prefill = True  # newcomers' short prompts read in one packed forward (False: one by one)
        self.share_starts = True  # packed forwards read the start prompts share once (packed.forward_shared)
        self.prefill_budget_s = PREFILL_BUDGET_S  # tests set it to inf: who joins a step then never depends on timing
        self.gather = (0.0, 0.0)  # (gap, most) seconds newcomers wait for others arriving (`_held_for`); off: (0, 0)
        self._last_arrival = 0.0
        self._cond = threading.Condition()
        self._waiting: deque[_Entry] = deque()
        self._rows: list[_Entry] = []
        self._reading: list[_Entry] = []  # rows whose long prompt is being read, a chunk a step; then in _rows
        self._solos: list[_Entry] = []
        self._solo_turn = 0  # which solo run goes first at the next step
        self._closed = False
        self.thread_name: str | None = None  # the thread that runs the loop, once it runs
        self.where: str | None = None  # "main" or "worker", when chosen by `run_where_fastest`
        self.steps = 0  # batched steps so far
        self.largest = 0  # the largest batch so far
        self.threads = None  # a core.serve.threads.ThreadTuner choosing torch's thread count per step (set when serving)
        # Where the loop's time went, in seconds since it started (read by `make room` to attribute the served rate):
        # prefill (newcomers' prompts), quality (the meters' full-depth passes, also at a row's end), forward (the
        # batched step), solo (Compare's columns), other (sampling, bookkeeping), idle (nothing to do); and
        # rows: the rows stepped in all (rows / steps: the mean batch).
        self.spent = dict.fromkeys(("prefill", "quality", "forward", "solo", "other", "idle"), 0.0)
        self.rows_stepped = 0
        self.packed = {"prefills": 0, "prompts": 0, "quality_passes": 0, "meters": 0}  # packed forwards, and what they held
        self._left_quality = 0.0  # scoring seconds of the rows that left
        self._position_bytes = engine.n_layers * int(engine.costs(None)["kv_bytes"])  # KV bytes of one position, all layers
        if engine.decode == "graph":  # rows through the step graph hold caches of its type (core/graph/graph_rows.py)
            self._position_bytes = self._position_bytes * step_graph.CACHE.itemsize // engine.dtype.itemsize

    # -- the readers' side -------------------------------------------------------------------------
    def submit(self, ids: list[int], routers, config, control, trace: Trace, sink=None) -> Iterator[Step] | None:
        """Queue a request; its Steps come out of the iterator this returns, as the loop makes them. With `sink`
        (anything with `put`), the loop puts each Step there itself instead, then `END` (or the exception that ended
        the run), and this returns None: no thread has to wait on each request's queue. (The engine process's sender
        reads every request from one queue so: a reader thread per request means 32 threads woken at every step of a
        32-row loop, each taking a core from the loop's OpenMP threads on a 2-core machine.)"""
        out = queue.SimpleQueue() if sink is None else sink
        entry = _Entry((ids, routers, config, control, trace), out=out, cache_bytes=self.row_bytes(len(ids) + config.max_new_tokens))
        with self._cond:
            if self._closed:
                raise RuntimeError("the room is closed")
            entry.arrived = self._last_arrival = time.perf_counter()
            self._waiting.append(entry)
            self._cond.notify_all()
        return self.read(entry) if sink is None else None

    @staticmethod
    def read(entry: _Entry) -> Iterator[Step]:
        """A request's Steps from its queue until the end, an error raised (core/serve/remote.py's rooms read theirs so)."""
        try:
            while True:
                item = entry.out.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:  # also a reader that stopped reading (a closed tab): the row leaves at its next step
            entry.control.request_stop()

    def time_spent(self) -> dict:
        """`spent` (seconds, rounded to ms) with the steps and rows stepped so far (rows / steps: the mean batch)."""
        return {**{k: round(v, 3) for k, v in self.spent.items()}, "steps": self.steps, "rows": self.rows_stepped,
                **{f"packed_{k}": v for k, v in self.packed.items()}}

    def row_bytes(self, tokens: int) -> int:
        """KV cache bytes one row of `tokens` positions holds at most (every layer keeps every position)."""
        return tokens * self._position_bytes

    @property
    def busy(self) -> dict:
        with self._cond:
            return {"rows": len(self._rows) + len(self._reading), "solo": len(self._solos), "waiting": len(self._waiting)}

    # -- the loop ------------------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None) -> None:
        """Run the loop in the calling thread until `stop` is set or the room is closed."""
        self.thread_name = threading.current_thread().name
        log.info("the room decodes in thread %r (batches of up to %d rows)", self.thread_name, self.max_batch)
        while not (stop is not None and stop.is_set()):
            t0 = time.perf_counter()
            with self._cond:
                while not (self._rows or self._reading or self._solos or self._closed or (stop is not None and stop.is_set())):
                    held = self._held_for(time.perf_counter()) if self._waiting else None
                    if held is not None and (held <= 0.0 or any(not e.args[2].shared for e in self._waiting)):
                        break  # a solo run joins at once
                    self._cond.wait(0.5 if held is None else held)
                if self._closed:
                    return
            self.spent["idle"] += time.perf_counter() - t0
            self.step()

    def start(self) -> threading.Thread:
        """Run the loop in a daemon thread of its own."""
        thread = self._thread = threading.Thread(target=self.run, name="routerlab-room", daemon=True)
        thread.start()
        return thread

    def close(self, timeout: float = 30.0) -> None:
        """End the loop after its step in flight. A loop `start` began is waited for: a daemon thread still inside a
        torch op when the interpreter exits aborts the process ("terminate called without an active exception")."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        thread = getattr(self, "_thread", None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def step(self) -> None:
        """One step of the whole room (see the module docstring)."""
        start = time.perf_counter()
        quality0 = self._quality_seconds()
        if self.threads is not None:  # prefills and quality passes: forwards over many tokens (ThreadTuner.widest)
            self.threads.widest()
        self._admit()
        self._read_long()
        prefilled = time.perf_counter()
        self.spent["prefill"] += prefilled - start
        rows = []
        shared = len(self._rows) > 1
        for entry in self._rows:  # quality passes while shared: full chunks only (module docstring), packed here
            if entry.gen.meter is not None:
                entry.gen.meter.refresh_seconds = None if shared else entry.gen.config.quality_refresh
                entry.gen.meter.deferred = shared and self.pack_quality and self._packable(entry)
        if shared:  # one packed pass a step at most: a crowd's passes spread over steps, never one long stall
            self._score_together([e for e in self._rows if self._packable(e) and e.gen.meter.due()], first_only=True)
        ending = []
        for entry in list(self._rows):
            try:
                self._put(entry, entry.gen.begin())
            except Exception as err:  # e.g. the quality meter's pass: this row fails, the others go on
                self._end(entry, err)
                continue
            (ending if entry.gen.done else rows).append(entry)
        while self._score_together([e for e in ending if e in self._rows and self._packable(e) and e.gen.meter.pending]):
            pass  # the last tokens of the rows that end: their meters' passes packed too (a row's flush scores the rest)
        for entry in ending:
            if entry in self._rows:
                self._end(entry)
        forward = 0.0
        if rows:
            if self.threads is not None:
                self.threads.before(len(rows))
            t0 = time.perf_counter()
            self._forward(rows)
            forward = time.perf_counter() - t0
            if self.threads is not None:
                self.threads.after(len(rows), forward)
            self.rows_stepped += len(rows)
        solo = time.perf_counter()
        # Who goes first rotates every step, as in a lockstep (core/serve/lockstep.py): solo runs are side-by-side measurements
        # (a Compare ladder, the quick sweep), and a fixed order gave the first one whatever the batched forward left it.
        order, self._solo_turn = in_turn(self._solos, self._solo_turn), self._solo_turn + 1
        for entry in order:
            try:
                step = next(entry.solo, _END)
            except Exception as err:
                step = err
            if step is _END or isinstance(step, BaseException):
                self._solos.remove(entry)
            entry.out.put(step)
        end = time.perf_counter()
        quality = self._quality_seconds() - quality0
        self.spent["forward"] += forward
        self.spent["quality"] += quality
        self.spent["solo"] += end - solo
        self.spent["other"] += max(0.0, (solo - prefilled) - forward - quality)

    def _packable(self, entry: _Entry) -> bool:
        meter = entry.gen.meter
        return meter is not None and meter.full_forward is not None and self.engine.packable(meter.full_forward)

    def _score_together(self, entries: list[_Entry], first_only: bool = False) -> bool:
        """The rows' due quality passes packed into few full-depth forwards (quality.score_together), each of at most
        PACK_LOGITS scored tokens and about PACK_TOKENS fed (`first_only`: only the first of them; the others stay
        due and are scored at the next steps). A group of one runs that meter's own pass, as a run alone does (while the
        room is shared, a row's `begin` leaves its passes to the room: one due alone must still be scored). A failed pass
        fails the rows it scored for. Whether it ran any."""
        if not entries or not self.pack_quality:
            return False
        groups, group, logits, fed = [], [], 0, 0
        for entry in entries:
            t, n = entry.gen.meter.next_pass()
            if group and (logits + n > PACK_LOGITS or fed + t > PACK_TOKENS):
                groups.append(group)
                group, logits, fed = [], 0, 0
            group.append(entry)
            logits, fed = logits + n, fed + t
        groups.append(group)
        for group in groups[:1] if first_only else groups:
            try:
                if len(group) == 1:
                    group[0].gen.meter.score()
                    continue
                score_together([e.gen.meter for e in group], lambda calls: self.engine.full_passes(calls, self.share_starts))
                self.packed["quality_passes"] += 1
                self.packed["meters"] += len(group)
            except Exception as err:
                log.error("a packed quality pass of %d rows failed", len(group), exc_info=err)
                for entry in group:
                    self._end(entry, err)
        return True

    def _quality_seconds(self) -> float:
        """The quality meters' scoring seconds so far, over the rows in the room and those that left (`_end` adds theirs)."""
        return self._left_quality + sum(e.gen.meter.seconds for e in self._rows if e.gen is not None and e.gen.meter is not None)

    def _admit(self) -> None:
        """Solo runs join at once; shared ones while the batch and the cache cap allow: the short prompts waiting read
        together in one packed prefill of about PACK_TOKENS (core/ops/packed.py), a long one alone, until PREFILL_BUDGET_S
        of this step is spent (at least one forward), so a crowd arriving together is read in a step or two while the
        streams already running pause for about that long at most."""
        start = time.perf_counter()
        while True:
            with self._cond:
                admitted = self._take_waiting()
            if not admitted:
                return
            self._prefill(admitted)
            if time.perf_counter() - start >= self.prefill_budget_s:
                return

    def _held_for(self, now: float) -> float:
        """Seconds the waiting shared requests are still held while a crowd gathers (`gather`; 0: they may join now):
        until none has arrived for the gap, or the most since the first of them waiting. Solo runs are never held. (The
        caller holds the lock.)"""
        gap, most = self.gather
        first = next((e.arrived for e in self._waiting if e.args[2].shared), None)
        if gap <= 0.0 or first is None:
            return 0.0
        return max(0.0, min(self._last_arrival + gap, first + most) - now)

    def _take_waiting(self) -> list[_Entry]:
        """The waiting requests that join now (the caller holds the lock): every solo run, and, unless a crowd is still
        gathering (`_held_for`), the shared ones in order of arrival that fit the batch and the cache cap, as many short
        prompts as one packed prefill takes or one long prompt (more than one prefill chunk) alone."""
        taken: list[_Entry] = []
        held, tokens = sum(e.cache_bytes for e in (*self._rows, *self._reading)), 0
        rows = len(self._rows) + len(self._reading)
        gathering = self._held_for(time.perf_counter()) > 0.0
        for entry in list(self._waiting):
            ids, routers, config, control, trace = entry.args
            if not config.shared:
                self._waiting.remove(entry)
                entry.solo = self.engine.alone(ids, routers, config, control, trace)
                self._solos.append(entry)
                continue
            if gathering:
                continue
            alone = not self.pack_prefill or len(ids) > generation.PREFILL_CHUNK
            if rows + len(taken) >= self.max_batch or (taken and (alone or tokens + len(ids) > PACK_TOKENS)):
                continue
            if self.cache_bytes is not None and (rows or taken) and held + entry.cache_bytes > self.cache_bytes:
                continue
            self._waiting.remove(entry)
            taken.append(entry)
            held, tokens = held + entry.cache_bytes, tokens + len(ids)
            if alone:
                break
        return taken

    def _prefill(self, entries: list[_Entry]) -> None:
        """Read the prompts of the rows that join: those that pack (`Generation.packed_prefill`) in one forward, the
        others one by one. A failure fails the rows whose prompt it was reading."""
        started = []
        for entry in entries:
            try:
                entry.gen = Generation(self.engine, *entry.args)
                self.engine.runtime.prepare(entry.gen)  # a router set's first request builds its step graph now, not in its decode
                started.append(entry)
            except Exception as err:
                self._end(entry, err)
        packed = [(e, seg) for e in started if (seg := e.gen.packed_prefill()) is not None] if len(started) > 1 else []
        for entry in started:
            if any(entry is e for e, _ in packed):
                continue
            if len(entry.gen.ids) > generation.PREFILL_CHUNK:  # a long prompt: a chunk a step (`_read_long`)
                # PREFILL_CHUNK tokens a step while others share the loop (each of their steps waits for the chunk); in
                # an empty room, a generation alone's chunks (generation.prefill_chunk: longer where bf16 is native)
                crowd = self._rows or self._reading or self._waiting or len(started) > 1
                entry.reading = entry.gen.prefill_chunks(generation.PREFILL_CHUNK if crowd else generation.prefill_chunk(self.engine))
                self._reading.append(entry)
                continue
            try:
                with torch.inference_mode():
                    self._put(entry, entry.gen.prefill())
            except Exception as err:
                self._end(entry, err)
                continue
            self._rows.append(entry)
        if not packed:
            return
        t0 = time.perf_counter()
        try:
            logits = forward_shared(self.engine.anatomy, [seg for _, seg in packed], self.share_starts)
        except Exception as err:
            log.error("a packed prefill of %d prompts failed", len(packed), exc_info=err)
            for entry, _ in packed:
                self._end(entry, err)
            return
        seconds, tokens = time.perf_counter() - t0, sum(len(seg.ids) for _, seg in packed)
        self.packed["prefills"] += 1
        self.packed["prompts"] += len(packed)
        for (entry, seg), out in zip(packed, logits):
            self._put(entry, entry.gen.prefilled(seg, out, seconds * len(seg.ids) / tokens))
            self._rows.append(entry)

    def _read_long(self) -> None:
        """One chunk of each long prompt being read (core/decode/generation.py reads them in chunks): the running rows get a
        token between its chunks, never wait for a whole document. A prompt read to its end (or to a Stop) joins the
        rows; a failure fails its row."""
        for entry in list(self._reading):
            try:
                with torch.inference_mode():
                    if next(entry.reading, None) is not None:
                        continue
            except Exception as err:
                self._end(entry, err)
                continue
            self._reading.remove(entry)
            entry.reading = None
            self._put(entry, entry.gen.prompt_steps)
            self._rows.append(entry)

    def _forward(self, rows: list[_Entry]) -> None:
        n = len(rows)
        self.steps += 1
        self.largest = max(self.largest, n)
        try:
            logits, scores = self.engine.runtime.step([e.gen for e in rows])
        except Exception as err:
            log.error("a batched step of %d rows failed", n, exc_info=err)
            for entry in rows:
                self._end(entry, err)
            return
        for j, entry in enumerate(rows):
            gen = entry.gen
            step = gen.end(logits[j].view(1, 1, -1), scores[j])
            room = gen.trace.meta.setdefault("room", {"steps": 0, "shared_steps": 0, "largest_batch": 1})
            room["steps"] += 1
            room["shared_steps"] += n > 1
            room["largest_batch"] = max(room["largest_batch"], n)
            entry.control.sharing = n
            entry.out.put(step)

    def _put(self, entry: _Entry, steps: list[Step]) -> None:
        for step in steps:
            entry.out.put(step)

    def _end(self, entry: _Entry, error: BaseException | None = None) -> None:
        """The row leaves: its last tokens scored (unless it failed), its costs recorded, its reader told."""
        gen = entry.gen
        if gen is not None:
            try:
                if error is None:
                    gen.flush()
            except Exception as err:
                error = err
            finally:
                gen.close()
        if entry in self._reading:
            self._reading.remove(entry)
        if entry in self._rows:
            self._rows.remove(entry)
            if gen is not None and gen.meter is not None:
                self._left_quality += gen.meter.seconds
        entry.control.sharing = 0
        entry.out.put(error if error is not None else _END)


def run_where_fastest(room: Room, engine, log=print, choice: tuple[str, dict] | None = None, products: bool = True) -> None:
    """Run the room's loop where torch is fastest on this machine, until Ctrl-C or `room.close()`. Call it from the main
    thread; `choice`: a `where_to_run` measured earlier (measure while the machine is quiet, before serving).
    `products`: first measure which product each kind of weight is fastest with at each batch size (core/kernels/batch_paths.py)."""
    if products:
        try:
            log(batch_paths.describe(batch_paths.tune(engine.anatomy)))
        except Exception as err:  # a measurement that fails leaves the products as they are; serving goes on
            log(f"could not measure the decode batch's products ({type(err).__name__}: {err}); they keep the low-bit copies")
    if room.threads is None and torch.get_num_threads() > 1 and not is_cuda(engine.device):  # a GPU's step: no CPU threads to tune
        room.threads = ThreadTuner()  # 1 or all threads, whichever the loop's own steps find faster under the load of the moment
        log(f"the loop times its own steps with {' and '.join(map(str, room.threads.choices))} threads and keeps the faster for each batch size")
    room.gather = (GATHER_GAP_S, GATHER_MAX_S)  # a crowd pressing Generate together is read in one packed prefill
    try:
        where, m = choice or where_to_run(engine)
    except Exception as err:  # the thread probe failed (e.g. a device it could not use): the main thread, said so
        log(f"could not measure where torch runs fastest ({type(err).__name__}: {err}); the loop runs in the main thread")
        where, m = "main", {"this_thread_s": float("nan"), "worker_thread_s": float("nan")}
    log(f"one decode loop serves every visitor, in the {where} thread (a step's products took {m['this_thread_s'] * 1e3:.1f} ms "
        f"from the main thread, {m['worker_thread_s'] * 1e3:.1f} ms from a worker; batches of up to {room.max_batch})")
    room.where = where
    try:
        if where == "main":
            room.run()
        else:
            room.start().join()
    except KeyboardInterrupt:
        pass
    finally:
        room.close()


def where_to_run(engine) -> tuple[str, dict]:
    """'main' unless torch's products run at least 10% faster from a worker thread than from the calling (main) thread:
    on some machines its parallel kernels run several times slower outside the main thread, and the gap can grow under
    load beyond what a quiet start-up shows. With the measurements, for the log."""
    m = measured_thread_choice(engine)
    return ("worker" if m["worker_thread_s"] <= 0.9 * m["this_thread_s"] else "main"), m


def measured_thread_choice(engine, rounds: int = 5) -> dict:
    """Seconds one full-depth decode step's products take from this thread and from a worker thread (the median of
    `rounds`, the two alternating after a warm-up of each): torch's parallel kernels run several times slower
    outside the main thread on some machines (docs/operators.md)."""
    an = engine.anatomy
    x = torch.zeros(1, an.hidden_size, dtype=engine.dtype, device=engine.device)

    def products() -> float:
        with torch.inference_mode():
            t0 = time.perf_counter()
            for p in an.layers:
                p.attn.qkv.batch(x, p.upcast)
                if p.gate_up is not None:
                    p.gate_up.batch(x, p.upcast)
            return now(x.device) - t0

    def in_worker() -> float:
        out: list[float] = []
        worker = threading.Thread(target=lambda: out.append(min(products() for _ in range(3))), name="routerlab-probe")
        worker.start()
        worker.join()
        return out[0]

    products(), in_worker()  # warm-up: first calls pay one-time set-up
    here, there = [], []
    for _ in range(rounds):
        here.append(min(products() for _ in range(3)))
        there.append(in_worker())
    return {"this_thread_s": statistics.median(here), "worker_thread_s": statistics.median(there),
            "this_thread": threading.current_thread().name}
