"""Runs advanced side by side: one token each in turn on the calling thread, who goes first rotating every round, so
every run's k-th token is decoded in the same round as the others' (their speeds compare like with like). Used by
the figures' runs and the Trade-off tab's quick sweep. Knows nothing about what the runs are beyond Step iterators."""

from __future__ import annotations

from typing import Callable, Iterator


def lockstep(runs: list[Iterator], on_round: Callable[[int], None] | None = None) -> None:
    """Exhaust `runs` (engine.generate iterators), one step of each per round; `on_round(rounds done)` after each."""
    live, turn = list(runs), 0
    while live:
        k = turn % len(live)
        for run in live[k:] + live[:k]:
            if next(run, None) is None:
                live.remove(run)
        turn += 1
        if on_round is not None:
            on_round(turn)
