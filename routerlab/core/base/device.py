"""Where the model runs, said once: choosing the device, honest clocks on it, and counting the host's waits for it.

- `choose_device(name)`: an explicit `--device`, else `$ROUTERLAB_DEVICE`, else CUDA where torch sees it, else the CPU;
  a device that is not there is a RouterLabError that says what to pass instead.
- `synchronize(device)` / `now(device)`: a GPU runs its kernels after the host queued them, so a clock read right
  after a call times the launch, not the work. Every benchmark reads `now(device)`: the GPU's queue drained first.
- `SyncCounter`: how many times the host waited for the GPU (`.item()`, `.tolist()`, `.cpu()`, a data-dependent
  shape), counted by torch's own sync debug mode. A decode step on a GPU pays one such wait per routing decision
  read on the host (docs/method.md, "Routing on a GPU"); the counter is how `bench gpu-check` reports them.

Knows nothing about models, routers or the UI.
"""

from __future__ import annotations

import os
import time
import warnings

import torch

from routerlab.core.base.errors import RouterLabError

ENV = "ROUTERLAB_DEVICE"


def choose_device(name: str | None = None) -> str:
    """The device to load on: `name` ("cpu", "cuda", "cuda:1"), else $ROUTERLAB_DEVICE, else CUDA if available."""
    name = (name or os.environ.get(ENV) or "").strip().lower()
    if not name or name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return "cpu"
    if name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit()):
        if not torch.cuda.is_available():
            raise RouterLabError(f"The device {name!r} was asked for (--device or ${ENV}), but torch sees no CUDA GPU here.",
                                 "Pass --device cpu (or unset ROUTERLAB_DEVICE), or install a CUDA build of torch.")
        index = int(name[5:]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise RouterLabError(f"The device {name!r} does not exist: torch sees {torch.cuda.device_count()} GPU(s).",
                                 "Pass --device cuda:0 (or another index below the count).")
        return name
    raise RouterLabError(f"Unknown device {name!r} (--device or ${ENV}).", "Use cpu, cuda or cuda:N.")


def is_cuda(device) -> bool:
    return torch.device(device).type == "cuda"


def synchronize(device) -> None:
    """Wait until every kernel queued on `device` has run (nothing to wait for on a CPU)."""
    if is_cuda(device):
        torch.cuda.synchronize(device)


def now(device) -> float:
    """perf_counter() once `device` has finished what was queued: the clock every timing on a GPU reads."""
    synchronize(device)
    return time.perf_counter()


def prepare(device) -> None:
    """Process-wide settings a decode loop on `device` needs. On CUDA: attention never takes cuDNN's kernel, which
    builds an execution plan for each new shape, and a decode step's key lengths change every token (under `drop`
    every layer's differ). On an H200 (torch 2.11) it spent 15 ms of host time per call, 94% of a `drop` run's
    (assets/bench/gpu-profile-drop-h200.txt); flash and memory-efficient attention take any length as it comes."""
    if is_cuda(device):
        torch.backends.cuda.enable_cudnn_sdp(False)


def peak_memory_bytes(device) -> int | None:
    """The most memory torch's allocator held on a GPU since the last reset (None on a CPU: not tracked)."""
    return int(torch.cuda.max_memory_allocated(device)) if is_cuda(device) else None


class SyncCounter:
    """Counts the host's waits for a CUDA device inside a `with` block, by torch's sync debug mode ("warn": torch warns
    at every synchronising call; the warnings are counted, not shown). On a CPU there is nothing to wait for: 0.

        with SyncCounter(device) as syncs:
            ...
        syncs.count
    """

    def __init__(self, device):
        self.cuda = is_cuda(device)
        self.count = 0
        self.where: dict[str, int] = {}  # "file.py:line" of each synchronising call -> how many times

    def __enter__(self) -> "SyncCounter":
        if self.cuda:
            self._catch = warnings.catch_warnings(record=True)
            self._seen = self._catch.__enter__()
            warnings.simplefilter("always")
            self._mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc) -> None:
        if not self.cuda:
            return
        torch.cuda.set_sync_debug_mode(self._mode)
        self._catch.__exit__(*exc)
        for w in self._seen:
            text = str(w.message)
            if "synchroniz" in text:
                self.count += 1
                key = f"{os.path.relpath(w.filename) if 'routerlab' in w.filename else os.path.basename(w.filename)}:{w.lineno}"
                self.where[key] = self.where.get(key, 0) + 1
