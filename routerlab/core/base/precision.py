"""Which floating-point type the base model runs in: `auto` picks bf16 where the hardware computes it
natively, fp32 elsewhere. Routers always keep fp32 weights and compare their scores in fp32.

Detects, never assumes: on CUDA it asks torch; on a CPU it reads the instruction-set flags the
operating system reports (x86: `avx512_bf16` or `amx_bf16`; Arm: `bf16`) and torch's vector unit.
Where bf16 is only emulated (e.g. an AVX2-only x86), one-row bf16 products (a decode step) are
still faster than fp32, because a decode step is bound by the bytes it reads, but many-row products
(a prefill) are much slower: there the engine computes long inputs in fp32 (`needs_upcast`).

Knows nothing about models, routers or the UI.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from pathlib import Path

import torch

from routerlab.core.base.errors import RouterLabError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
CHOICES = ("auto", *DTYPES)  # what --dtype and ROUTERLAB_DTYPE accept
ALIASES = {"fp32": "float32", "bf16": "bfloat16"}
X86_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str) -> set[str]:
    """Instruction-set flags from the text of /proc/cpuinfo (x86 `flags`, Arm `Features`)."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return flags


def flags_have_bf16(flags: set[str]) -> bool:
    return any(f in flags for f in X86_BF16_FLAGS) or "bf16" in flags


@functools.cache
def cpu_has_native_bf16() -> bool:
    """True when this CPU has bf16 matrix instructions (read from the OS, cached)."""
    info = Path("/proc/cpuinfo")
    if info.exists():
        try:
            return flags_have_bf16(cpu_flags(info.read_text(errors="replace")))
        except OSError:
            return False
    if platform.system() == "Darwin":  # Apple silicon: M2 and later report FEAT_BF16
        try:
            out = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True, timeout=2)
            return out.stdout.strip() == "1"
        except (OSError, subprocess.SubprocessError):
            return False
    return False


def native_bf16(device: str) -> bool:
    if str(device).startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return cpu_has_native_bf16()


def check_dtype(name: str | None) -> str:
    """A --dtype / ROUTERLAB_DTYPE value, normalised ('bf16' -> 'bfloat16'); None or '' means auto."""
    value = ALIASES.get(str(name or "auto").strip().lower(), str(name or "auto").strip().lower())
    if value not in CHOICES:
        raise RouterLabError(f"Unknown dtype {name!r}.", f"Choose one of: {', '.join(CHOICES)} (or bf16, fp32).")
    return value


MATRIX_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")  # what decides a product's path


def cpu_matrix_flags() -> list[str]:
    """Which of MATRIX_FLAGS this CPU reports (x86; empty elsewhere or unreadable): benchmark notes name them."""
    try:
        flags = cpu_flags(Path("/proc/cpuinfo").read_text(errors="replace"))
    except OSError:
        return []
    return [f for f in MATRIX_FLAGS if f in flags]


def machine_kind(vector_unit: str | None = None, flags: list[str] | None = None) -> str:
    """The kind of CPU a benchmark result belongs to: 'amx' (AMX tiles), else torch's vector unit in lower case
    ('avx512', 'avx2', ...): what `make bench` results are kept apart by (assets/bench/speed-<kind>.json)."""
    flags = cpu_matrix_flags() if flags is None else flags
    if "amx_bf16" in flags:
        return "amx"
    return (vector_unit or cpu_vector_unit()).lower()


def cpu_vector_unit() -> str:
    """torch's view of this CPU's vector instructions: 'AVX512', 'AVX2', 'SVE256', 'DEFAULT', ..."""
    try:
        return torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):
        return "DEFAULT"


def auto_dtype(device: str) -> torch.dtype:
    """bf16 where the device computes it natively (CUDA with bf16; a CPU with bf16 matrix
    instructions); on a CPU with wide vector units but no bf16 instructions, bf16 *storage*
    (a decode step reads half the bytes; torch converts on the fly) with long inputs computed in
    fp32 (see `needs_upcast`); fp32 elsewhere. `bench speed` measures the choice against fp32."""
    if str(device).startswith("cuda"):
        return torch.bfloat16 if native_bf16(device) else torch.float32
    if cpu_has_native_bf16() or cpu_vector_unit() != "DEFAULT":
        return torch.bfloat16
    return torch.float32


def resolve_dtype(name: str | torch.dtype | None, device: str) -> torch.dtype:
    """The torch dtype for `name` on `device` (`auto`: see `auto_dtype`)."""
    if isinstance(name, torch.dtype):
        return name
    value = check_dtype(name)
    return auto_dtype(device) if value == "auto" else DTYPES[value]


def needs_upcast(dtype: torch.dtype, device: str) -> bool:
    """True when long inputs should be computed in fp32: half-precision weights on a CPU without
    native bf16 matrix instructions, where torch emulates the multi-row products slowly."""
    return dtype in (torch.bfloat16, torch.float16) and not str(device).startswith("cuda") and not cpu_has_native_bf16()


def describe(dtype: torch.dtype, device: str) -> str:
    """One line for logs, the app and benchmark rows: what runs in which precision, and why."""
    name = dtype_name(dtype)
    if needs_upcast(dtype, device):
        return f"{name} weights, long inputs computed in float32 (no native bf16 on this CPU: {cpu_vector_unit()})"
    if dtype == torch.bfloat16:
        return f"{name} (native on {'this GPU' if str(device).startswith('cuda') else 'this CPU'})"
    return name


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def env_dtype(default: str = "auto") -> str:
    """ROUTERLAB_DTYPE, validated (the app's way to choose a precision)."""
    return check_dtype(os.environ.get("ROUTERLAB_DTYPE") or default)
