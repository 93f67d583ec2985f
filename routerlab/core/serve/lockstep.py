"""Runs advanced side by side: one token each in turn on the calling thread, who goes first rotating every round, so
every run's k-th token is decoded in the same round as the others' (their speeds compare like with like). Used by
the figures' runs and the Trade-off tab's quick sweep; `in_turn`, the order of a round, also by the room's solo runs,
the UI's Decoder and the benchmarks. Knows nothing about what the runs are beyond Step iterators."""

from __future__ import annotations

from typing import Callable, Iterator, TypeVar

T = TypeVar("T")


def in_turn(items: list[T], turn: int) -> list[T]:
    """`items` in the order of round `turn`: who goes first rotates every round, so none always runs first or after
    the same one. A new list: the caller may remove items while going through it."""
    k = turn % len(items) if items else 0
    return items[k:] + items[:k]


def lockstep(runs: list[Iterator], on_round: Callable[[int], None] | None = None) -> None:
    """Exhaust `runs` (engine.generate iterators), one step of each per round; `on_round(rounds done)` after each."""
    live, turn = list(runs), 0
    while live:
        for run in in_turn(live, turn):
            if next(run, None) is None:
                live.remove(run)
        turn += 1
        if on_round is not None:
            on_round(turn)
