"""Stand-in peers for tests/test_peers.py, importable by the spawned child process (tests/ is on its sys.path):
one that answers, one whose native code dies on its first decode (as llama.cpp's native build did on AMX), one
that cannot start."""

import os
import signal
from pathlib import Path


class Steady:
    version, path = "steady-1", Path("steady.gguf")

    def decode_rate(self, ids, new_tokens):
        return 10.0 * new_tokens + len(ids)

    def ttft(self, ids):
        return 0.25


class Segfaults(Steady):
    version = "segfaults-1"

    def decode_rate(self, ids, new_tokens):
        os.kill(os.getpid(), signal.SIGSEGV)


class FailsToStart:
    def __init__(self):
        raise RuntimeError("no such model file")
