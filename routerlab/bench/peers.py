"""Peers `bench speed` measures the engine against, in the same run: llama.cpp on the very GGUF file the
embedded model ships in (through `llama-cpp-python`, when it imports: `make bench-peers` builds it).

A peer decodes the same token ids as the engine (the GGUF's vocabulary is the tokenizer's), greedily,
with the same number of threads. Never a requirement: absent, every figure of it is None.

A peer runs in a child process of its own (`InChild`): native code can die (llama.cpp's native build segfaults in
its first decode on AMX machines), and a crash must cost the benchmark that peer's figures, not the run. The child
times itself, so the pipe costs nothing measured; `PeerCrashed` names how the child ended (its signal).

`python -m routerlab.bench.peers --check` decodes a few tokens with llama.cpp in its child and says whether it ran
(`make bench-peers` runs it after the build); `--cmake-args` prints the build flags for this CPU without llama.cpp's
native path (GGML_NATIVE off, AVX2/AVX-512 families on as the CPU has them, AMX never), for the rebuild when the native
build crashes.

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

from routerlab import spin


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
        with spin.as_libgomp_default():  # the peer's OpenMP spins as it would anywhere else
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


# llama.cpp's per-ISA switches, by the /proc/cpuinfo flag that allows each. AMX is left out on purpose: its path is what
# crashed natively built llama.cpp on AMX machines, and the AVX-512 paths decode fine there.
ISA_FLAGS = (("avx", "GGML_AVX"), ("avx2", "GGML_AVX2"), ("fma", "GGML_FMA"), ("f16c", "GGML_F16C"), ("bmi2", "GGML_BMI2"),
             ("avx512f", "GGML_AVX512"), ("avx512vbmi", "GGML_AVX512_VBMI"), ("avx512_vnni", "GGML_AVX512_VNNI"),
             ("avx512_bf16", "GGML_AVX512_BF16"), ("avx_vnni", "GGML_AVX_VNNI"))


def cmake_args(cpu_flags: set[str]) -> str:
    """CMAKE_ARGS for a llama.cpp build without the native path: each ISA switch on where the CPU has it."""
    switches = ["-DGGML_NATIVE=OFF", *(f"-D{name}={'ON' if flag in cpu_flags else 'OFF'}" for flag, name in ISA_FLAGS)]
    return " ".join(switches)


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """This CPU's feature flags (Linux /proc/cpuinfo); empty where it cannot be read."""
    try:
        text = cpuinfo if cpuinfo is not None else Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def check(new_tokens: int = 4) -> tuple[bool, str]:
    """Whether llama.cpp decodes the embedded model's GGUF here (in its child process), and what happened."""
    if not llama_cpp_available():
        return False, "llama-cpp-python is not installed (`make bench-peers` builds it)"
    from routerlab.core.model.models import embedded_gguf_path

    try:
        peer = InChild(LlamaCpp, embedded_gguf_path(fetch=False), 64, 1)
        try:
            rate = peer.decode_rate([1, 2, 3, 4], new_tokens)
        finally:
            peer.close()
    except PeerCrashed as err:
        return False, str(err)
    return True, f"llama.cpp {peer.version} decodes here ({rate:.1f} tokens/s on one thread, {new_tokens} tokens)"


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m routerlab.bench.peers", description="llama.cpp, the peer of `bench speed`")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--check", action="store_true", help="decode a few tokens with llama.cpp in a child process")
    what.add_argument("--cmake-args", action="store_true", help="print CMAKE_ARGS for a build without the native path")
    args = parser.parse_args(argv)
    if args.cmake_args:
        print(cmake_args(cpu_flags()))
        return 0
    ok, message = check()
    print(message)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
