"""Peers `bench speed` measures the engine against, in the same run: llama.cpp on the very GGUF file the
embedded model ships in (through `llama-cpp-python`, when it imports: `make bench-peers` builds it).

A peer decodes the same token ids as the engine (the GGUF's vocabulary is the tokenizer's), greedily,
with the same number of threads. Never a requirement: absent, every figure of it is None.

Knows nothing about the engine, routers or the UI.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import time
from pathlib import Path


def llama_cpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def gguf_weight_bytes(path: Path) -> int:
    """Bytes of the tensors llama.cpp reads for one decode step of a GGUF with a tied head: all of them
    (the embedding is read once as the output matrix; its one-row lookup is noise)."""
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(path).tensors)


@contextlib.contextmanager
def _quiet_stderr():
    """llama.cpp's C code logs to fd 2 on load even when told not to: keep the bench output readable."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class LlamaCpp:
    """llama.cpp on a GGUF file: decode tokens/s after a prompt, and time to the first token."""

    def __init__(self, path: Path, context: int, threads: int):
        from llama_cpp import Llama

        with _quiet_stderr():
            self.llm = Llama(model_path=str(path), n_ctx=context, n_threads=threads, n_threads_batch=threads,
                             n_batch=512, verbose=False)
        self.path, self.threads = Path(path), threads
        self.version = _version()

    def _greedy(self, ids: list[int], new_tokens: int) -> list[float]:
        """Timestamps: the start, then one after each new token (the first after the prefill)."""
        self.llm.reset()  # forget the last run's tokens: otherwise a shared prefix would skip the prefill
        times = [time.perf_counter()]
        for n, _token in enumerate(self.llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, reset=True)):
            times.append(time.perf_counter())
            if n + 1 >= new_tokens:
                break
        return times

    def decode_rate(self, ids: list[int], new_tokens: int) -> float:
        """Tokens/s from the first new token to the last (prefill excluded), as `generate_rate` counts."""
        times = self._greedy(ids, new_tokens)
        return (len(times) - 2) / (times[-1] - times[1])

    def ttft(self, ids: list[int]) -> float:
        times = self._greedy(ids, 1)
        return times[1] - times[0]


def _version() -> str:
    try:
        import llama_cpp

        return str(getattr(llama_cpp, "__version__", "?"))
    except ImportError:
        return "?"
