"""How long torch's OpenMP workers spin before they sleep, set before torch loads (routerlab/__init__.py).

After each parallel op, libgomp's workers busy-wait for GOMP_SPINCOUNT turns (300,000 by default: milliseconds on
these machines) before sleeping. On 2 cores that spinning takes the core onnxruntime's pool needs when the step graph
(core/graph/step_graph.py) runs next, right after torch's sampling or a quality meter's pass. 30,000 turns keep torch's
own ops about as fast and leave that core to the graph; compare `GOMP_SPINCOUNT=300000 python -m
routerlab.bench.room_loop --decode --rows 1` with the same command without it (docs/results.md, "The step graph beside torch:
spinning"). A value the user set
(or OMP_WAIT_POLICY) is kept. Imports nothing.
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
