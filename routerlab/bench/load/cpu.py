"""CPU seconds used by processes, read from /proc: the server's own process, the processes it started (the engine
process), and this one (the benchmark's clients, which are threads here). Linux only; elsewhere None.
Knows nothing about servers or rooms: pids and clock ticks."""

from __future__ import annotations

import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user + system seconds) of a live process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (name) ": state, ppid, ...
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def tree(pid: int) -> dict[str, float] | None:
    """{"server": seconds of `pid` itself, "children": of every live process below it}; None where /proc is absent."""
    own = _stat(pid)
    if own is None:
        return None
    parents: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (s := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = s
    below, frontier = 0.0, [pid]
    while frontier:
        p = frontier.pop()
        for child, (ppid, seconds) in parents.items():
            if ppid == p:
                below += seconds
                frontier.append(child)
    return {"server": own[1], "children": below}


def this_process() -> float:
    t = os.times()
    return t.user + t.system
