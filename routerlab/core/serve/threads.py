"""How many threads torch's kernels use in the room's loop, chosen by timing the loop's own steps as it serves.

On 2 cores, two OpenMP threads make a quiet step fastest, but a parallel region waits for its slowest thread: when
anything else runs (the web server, the visitors' browsers or clients, a training job), one of the two loses its
core and the step stalls. Measured on a 2-core Xeon: the room's step with 2 threads ran 174 tokens/s alone
and 94 beside a process keeping half a core busy; with 1 thread 120 alone and 120 beside it. Which wins depends on
the machine and on the load of the moment, so `ThreadTuner` keeps measuring: it runs most steps with the count that
has been faster per token lately, for batches of about the same size, and now and then tries each other count for a
few steps (`trial`). Those trial steps cost: alone, one thread's step took 1.45x two threads' (above), so trying it
for 4 steps in every 64 cost about 3% of the loop. So the wait between trials of a batch size doubles
each time a trial keeps the choice (`explore_every`, up to `backoff` times that), and a trial comes at once when the
chosen count's own steps drift from what they were when the choice was last confirmed (`drift`: the load changed), so a
change in load still changes the choice within seconds.

A trial runs every count in turns (the others, then the count that ran, `trial` times), each measured afresh by the
median of its own turns, so the counts are compared under the same load, side by side; between trials a count's
record is the median of its last `window` steps at that batch size, so one stalled step decides nothing. Before, a
count's first single step set its record and later steps were averaged into it, and a trial's steps were compared
with the other count's from minutes before: a first two-thread step that met the web server drawing the first token
made one visitor's whole run decode on one thread (13.5 ms a step against 7.6, `app_vs_cli` on a 2-core Xeon,
2026-12-06); with trials measured afresh but not side by side, one visitor's runs in a `make room` still came at
0.72-1.13x the command line's.

Knows nothing about rows, models or the UI: only step times and batch sizes.
"""

from __future__ import annotations

import os
import statistics
from collections import deque

import torch


def _bucket(rows: int) -> int:
    """Batches of about the same size share a record: 1, 2-3, 4-7, 8-15, 16-31, 32+ rows."""
    return min(max(rows, 1).bit_length(), 6)


class ThreadTuner:
    """Call `before(rows)` before each step (it sets torch's thread count) and `after(rows, seconds)` after it."""

    def __init__(self, choices: tuple[int, ...] | None = None, explore_every: int = 64, trial: int = 4, window: int = 5,
                 backoff: int = 8, drift: float = 0.5, set_threads=torch.set_num_threads):
        cores = os.cpu_count() or 1
        self.choices = tuple(sorted(set(choices or (1, torch.get_num_threads()))))
        self.choices = tuple(c for c in self.choices if 1 <= c <= max(cores, 1)) or (1,)
        self.explore_every, self.trial, self.window, self.backoff, self.drift = explore_every, trial, window, backoff, drift
        self._set = set_threads
        self.per_token: dict[tuple[int, int], float] = {}  # (bucket, threads) -> seconds per row, median of `_recent`
        self._recent: dict[tuple[int, int], deque] = {}  # (bucket, threads) -> its last `window` steps' seconds per row
        self.current: int | None = None
        self._trying: list[int] = []  # counts still to try in this exploration, each for `trial` steps
        self._exploring: tuple[int, int] | None = None  # (bucket, its choice before) of the exploration under way
        self._every: dict[int, int] = {}  # bucket -> steps between its explorations now
        self._since: dict[int, int] = {}  # bucket -> its steps since its last exploration began
        self._settled: dict[int, tuple[int, float]] = {}  # bucket -> (choice, its seconds per row) as its last exploration ended
        self._last: dict[int, int] = {}  # bucket -> the count its last step ran with

    def choice(self, rows: int) -> int:
        """The count with the lowest recorded seconds per row for batches of this size (every thread while none has one)."""
        b = _bucket(rows)
        measured = [c for c in self.choices if (b, c) in self.per_token]
        if not measured:
            return max(self.choices)
        return min(measured, key=lambda c: self.per_token[(b, c)])

    def before(self, rows: int) -> int:
        b = _bucket(rows)
        if self._exploring is not None and not self._trying:
            self._settle()
        if len(self.choices) > 1 and self._exploring is None and self._due(b):
            best = self._last.get(b, self.choice(rows))  # the count these batches ran last
            for c in self.choices:  # every count measured afresh, side by side: a trial's own steps are its record
                self._recent.pop((b, c), None)
                self.per_token.pop((b, c), None)
            turn = [c for c in self.choices if c != best] + [best]  # the others, then the count that ran, in turns
            self._trying = turn * self.trial
            self._exploring, self._since[b] = (b, best), 0
        threads = self._trying.pop(0) if self._trying else self.choice(rows)
        if threads != self.current:
            self._set(threads)
            self.current = threads
        return threads

    def _due(self, b: int) -> bool:
        """Whether batches of bucket `b` try the other counts now: at once while a count has no record, then every
        `_every[b]` of their steps, or sooner (after half of `explore_every` at least) when the chosen count's seconds
        per row moved by more than `drift` since its last exploration ended."""
        if any((b, c) not in self.per_token for c in self.choices):  # a batch size new here: at once
            return True
        since = self._since.get(b, 0)
        if since >= self._every.get(b, self.explore_every):
            return True
        settled = self._settled.get(b)
        if settled is None or since < self.explore_every // 2:
            return False
        now = self.per_token.get((b, settled[0]))
        return now is not None and abs(now - settled[1]) > self.drift * settled[1]

    def _settle(self) -> None:
        """An exploration's trial steps are done: a bucket whose choice held waits twice as long for the next (up to
        `backoff` x `explore_every`); one whose choice changed, or drifted, starts again at `explore_every`."""
        b, before = self._exploring
        self._exploring = None
        best = min((c for c in self.choices if (b, c) in self.per_token), key=lambda c: self.per_token[(b, c)], default=None)
        if best is None:
            return
        settled = self._settled.get(b)
        held = best == before and (settled is None or (settled[0] == best and
                                                       abs(self.per_token[(b, best)] - settled[1]) <= self.drift * settled[1]))
        every = self._every.get(b, self.explore_every)
        self._every[b] = min(every * 2, self.explore_every * self.backoff) if held else self.explore_every
        self._settled[b] = (best, self.per_token[(b, best)])

    def widest(self) -> int:
        """All the threads, for a forward over many tokens (a packed prefill or quality pass): its large products
        divide well between threads even beside other load, unlike a decode step's small ones. The next `before`
        sets the step's own choice again."""
        threads = max(self.choices)
        if threads != self.current:
            self._set(threads)
            self.current = threads
        return threads

    def after(self, rows: int, seconds: float) -> None:
        if rows < 1 or seconds <= 0 or self.current is None:
            return
        b = _bucket(rows)
        self._since[b] = self._since.get(b, 0) + 1
        key = (b, self.current)
        self._last[b] = self.current
        recent = self._recent.setdefault(key, deque(maxlen=self.window))
        recent.append(seconds / rows)
        self.per_token[key] = statistics.median(recent)

    def summary(self) -> dict:
        """For logs and reports: per batch size, each count's recent milliseconds per row."""
        out: dict[str, dict[str, float]] = {}
        for (b, c), v in sorted(self.per_token.items()):
            lo = 1 << (b - 1)
            out.setdefault(f"{lo}+ rows", {})[f"{c} threads"] = round(v * 1e3, 2)
        return out
