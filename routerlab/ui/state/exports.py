"""What a run leaves on the server for its visitor to download, bounded: each session keeps its last few runs' files
and the whole server a budget of them, oldest evicted first.

A run's files (its trace JSON: ui/session._export) sit in a folder of their own inside the visitor's folder in
Gradio's cache, served from there until Gradio's sweep (layout.EXPORT_TTL) or the visitor's session ends. Without a
bound, a client starting many short runs, each from a new session, could fill the disk within the sweep's hour. The
ledger here counts every run folder written; past `per_session` folders in one session, or `total_bytes` in all, it
deletes the oldest (the newest is always kept: the one the visitor was just given). An older download then answers
404; the page only ever offers the latest. Thread-safe; knows nothing about what a folder holds.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

MB = 2**20
PER_SESSION = 4  # runs whose files one session keeps (the page offers the last; an API client may fetch a few back)


@dataclass
class _Run:
    folder: Path
    owner: int
    size: int
    at: float


class ExportLedger:
    def __init__(self, total_bytes: int, per_session: int = PER_SESSION):
        self.total_bytes = total_bytes
        self.per_session = per_session
        self.runs: list[_Run] = []
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls) -> ExportLedger:
        from routerlab.ui.state.resources import _env_int as env_int

        return cls(env_int("ROUTERLAB_EXPORTS_MB", 100) * MB)

    def held(self) -> int:
        with self._lock:
            return sum(r.size for r in self.runs)

    def add(self, folder: Path, owner: object) -> list[Path]:
        """Count a run folder just written by `owner` (a session); evict what the bounds say. Returns the evicted."""
        size = sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
        with self._lock:
            self.runs = [r for r in self.runs if r.folder.is_dir()]  # swept by Gradio, or the session ended
            self.runs.append(_Run(Path(folder), id(owner), size, time.monotonic()))
            mine = [r for r in self.runs if r.owner == id(owner)]
            gone = mine[:-self.per_session] if len(mine) > self.per_session else []
            total = sum(r.size for r in self.runs) - sum(r.size for r in gone)
            for r in self.runs[:-1]:
                if total <= self.total_bytes:
                    break
                if r not in gone:
                    gone.append(r)
                    total -= r.size
            self.runs = [r for r in self.runs if r not in gone]
        for r in gone:
            shutil.rmtree(r.folder, ignore_errors=True)
        return [r.folder for r in gone]


_LEDGER: ExportLedger | None = None
_LEDGER_LOCK = threading.Lock()


def ledger() -> ExportLedger:
    """The process's ledger (ROUTERLAB_EXPORTS_MB, 100 MB by default)."""
    global _LEDGER
    with _LEDGER_LOCK:
        if _LEDGER is None:
            _LEDGER = ExportLedger.from_env()
        return _LEDGER
