"""How long torch's OpenMP workers spin before they sleep, set before torch loads (routerlab/__init__.py).

After each parallel op, libgomp's workers busy-wait for GOMP_SPINCOUNT turns (300,000 by default: milliseconds on
these machines) before sleeping. On 2 cores that spinning takes the core onnxruntime's pool needs when the step graph
(core/step_graph.py) runs next, right after torch's sampling or a quality meter's pass. With 30,000 turns, the room's
loop alone at one row (`python -m routerlab.bench.room_loop --decode --rows 1`, AVX-512 EPYC, 12-06, one-off
processes side by side): the graph 44-47 -> 66-67 tokens/s, torch's ops 54-56 -> 59-63; two later pairs, the
machine's speed drifting: the graph 50.6 and 58.1 -> 64.1 and 57.0, torch's ops 60-73 either way (OMP_WAIT_POLICY=
PASSIVE, no spinning at all: torch's ops fell to 32-34). A value the user set (or OMP_WAIT_POLICY) is kept. Imports
nothing.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

ENV = "GOMP_SPINCOUNT"
TURNS = "30000"
DEFAULT = "300000"  # libgomp's own when neither variable is set
ours = False  # set here, not by the user


def set_default() -> None:
    global ours
    if ENV not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ[ENV], ours = TURNS, True


@contextmanager
def as_libgomp_default():
    """While a peer process starts (llama.cpp, measured against us, uses libgomp too): libgomp's own spin, so a
    benchmark's peer runs as it would anywhere else."""
    if not ours:
        yield
        return
    os.environ[ENV] = DEFAULT
    try:
        yield
    finally:
        os.environ[ENV] = TURNS
