"""One training at a time per server: a FIFO of TrainJobs and the worker thread that runs them.

Visitors see their place in the line (`position`) and can cancel a waiting job (`TrainJob.stop`).
The worker thread runs at a lower scheduling priority (`nice`, Linux: a thread's own nice value, which the
OpenMP threads it starts inherit), so visitors' decoding threads get the cores first and training takes
what is left; its time budget then buys fewer steps, never a later end. Not `torch.set_num_threads`: it
also sets the count every thread started later begins with (each generation decodes in a new thread).
The operator sets it (ROUTERLAB_TRAINING_NICE, docs/operators.md). Knows nothing about Gradio.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque

log = logging.getLogger(__name__)


class TrainingRunner:
    def __init__(self, nice: int = 10):
        self.nice = nice
        self._queue: deque = deque()
        self._running = None
        self._lock = threading.Condition()
        self._worker: threading.Thread | None = None
        self._owners: dict[int, str | None] = {}  # id(job) -> its visitor, while it waits or runs

    def submit(self, job, owner: str | None = None) -> int:
        """Queue `job` for `owner` (a visitor, or None); its place in the line (0: it runs next / now)."""
        with self._lock:
            self._owners[id(job)] = owner
            self._queue.append(job)
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._loop, name="routerlab-training", daemon=True)
                self._worker.start()
            self._lock.notify_all()
            return self.position(job)

    def position(self, job) -> int | None:
        """Jobs ahead of `job` (the running one counts); None once it left the line."""
        with self._lock:
            if job is self._running:
                return 0
            waiting = [j for j in self._queue if j.phase != "cancelled"]
            if job not in waiting:
                return None
            return waiting.index(job) + (self._running is not None)

    def phase(self) -> str | None:
        """The running job's phase ("queued" when only waiting ones), None when idle."""
        with self._lock:
            if self._running is not None:
                return self._running.phase
            return "queued" if any(j.phase != "cancelled" for j in self._queue) else None

    def held_by(self, owner: str) -> int:
        """`owner`'s jobs running or waiting (cancelled ones left out)."""
        with self._lock:
            jobs = [j for j in self._queue if j.phase != "cancelled"] + ([self._running] if self._running is not None else [])
            return sum(1 for j in jobs if self._owners.get(id(j)) == owner)

    def waiting(self) -> int:
        """Jobs in the line that have not started (cancelled ones left out)."""
        with self._lock:
            return sum(1 for j in self._queue if j.phase != "cancelled")

    @property
    def busy(self) -> bool:
        return self._running is not None or any(j.phase != "cancelled" for j in self._queue)

    def _loop(self) -> None:
        if self.nice:
            try:  # Linux: PRIO_PROCESS with a thread id sets that thread's nice value only
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + self.nice)
            except (AttributeError, OSError, PermissionError) as err:
                log.info("training runs at normal priority (%s)", err)
        while True:
            with self._lock:
                while not self._queue:
                    if not self._lock.wait(timeout=60):
                        self._worker = None
                        return
                job = self._queue.popleft()
                if job.phase == "cancelled":
                    self._owners.pop(id(job), None)
                    continue
                self._running = job
            try:
                log.info("training: %s starts", job.settings.label)
                job.run()
                log.info("training: %s ended (%s)", job.settings.label, job.phase)
            finally:
                with self._lock:
                    self._running = None
                    self._owners.pop(id(job), None)
