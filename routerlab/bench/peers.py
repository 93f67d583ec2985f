"""Peers `bench speed` measures the engine against, in the same run: llama.cpp on the very GGUF file the
embedded model ships in (through `llama-cpp-python`, when it imports: `make bench-peers` builds it).

A peer decodes the same token ids as the engine (the GGUF's vocabulary is the tokenizer's), greedily,
with the same number of threads. Never a requirement: absent, every figure of it is None.

A peer runs in a child process of its own (`InChild`): native code can die (llama.cpp's native build segfaults in
its first decode on AMX machines), and a crash must cost the benchmark that peer's figures, not the run. The child
times itself, so the pipe costs nothing measured; `PeerCrashed` names how the child ended (its signal).

Knows nothing about the engine, routers or the UI.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import os
import signal
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


class PeerCrashed(RuntimeError):
    """A peer's child process ended (a signal, an exit) or its call raised: the benchmark goes on without it."""


def _serve(conn, factory, args) -> None:
    """The child: build the peer, say what it is, then answer (method, args) calls until told to close."""
    try:
        peer = factory(*args)
        conn.send((True, {"version": getattr(peer, "version", "?"), "path": str(getattr(peer, "path", ""))}))
    except Exception as err:  # reported by the parent as the peer's failure to start
        conn.send((False, f"{type(err).__name__}: {err}"))
        return
    while True:
        try:
            method, call_args = conn.recv()
        except EOFError:
            return
        if method == "close":
            return
        try:
            conn.send((True, getattr(peer, method)(*call_args)))
        except Exception as err:
            conn.send((False, f"{type(err).__name__}: {err}"))


class InChild:
    """A peer (`factory(*args)`, e.g. LlamaCpp) in a spawned child process; its methods are called across a pipe.

    `decode_rate` and `ttft` run in the child and return its own timings. A child that dies raises PeerCrashed
    with its signal's name (SIGSEGV ...) from the call that was waiting; the parent stays up."""

    def __init__(self, factory, *args, name: str = "llama.cpp", timeout: float = 900.0):
        self.name, self.timeout = name, timeout
        ctx = multiprocessing.get_context("spawn")  # never fork a process whose torch threads are running
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, factory, args), daemon=True, name=f"peer-{name}")
        self._proc.start()
        child.close()
        info = self._reply("start")
        self.version, self.path = info["version"], Path(info["path"])

    def _ended(self) -> str:
        self._proc.join(timeout=5)
        code = self._proc.exitcode
        if code is not None and code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with code {code}"

    def _reply(self, what: str):
        deadline = time.monotonic() + self.timeout
        while not self._conn.poll(0.2):
            if not self._proc.is_alive() and not self._conn.poll(0):
                raise PeerCrashed(f"{self.name} crashed during {what}: its process was {self._ended()}")
            if time.monotonic() > deadline:
                self.close()
                raise PeerCrashed(f"{self.name} gave no answer to {what} in {self.timeout:.0f} s: stopped")
        try:
            ok, value = self._conn.recv()
        except (EOFError, OSError):
            raise PeerCrashed(f"{self.name} crashed during {what}: its process was {self._ended()}") from None
        if not ok:
            raise PeerCrashed(f"{self.name} failed during {what}: {value}")
        return value

    def _call(self, method: str, *args):
        if not self._proc.is_alive():
            raise PeerCrashed(f"{self.name} is not running (its process was {self._ended()})")
        self._conn.send((method, args))
        return self._reply(method)

    def decode_rate(self, ids: list[int], new_tokens: int) -> float:
        return self._call("decode_rate", list(ids), new_tokens)

    def ttft(self, ids: list[int]) -> float:
        return self._call("ttft", list(ids))

    def close(self) -> None:
        if self._proc.is_alive():
            with contextlib.suppress(OSError, BrokenPipeError):
                self._conn.send(("close", ()))
            self._proc.join(timeout=5)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(timeout=5)
        self._conn.close()
