"""Weight formats and the products of linear maps: the one place that knows how a weight is stored.

A decode step reads every weight once, so the bytes a weight occupies bound its speed. A `Weight`
holds a linear map's dense weight in the model's dtype (prefill, training, long inputs: products of
many rows are compute-bound, and there torch's weight-only int4 kernel is slower than a dense one)
and, optionally, a low-bit copy used for products of at most `FEW_ROWS` rows (a decode step):

- `Codes`: 4-bit codes in groups along the input, w = code * scale + minimum (GGUF's Q4_1 layout).
  They come straight from a GGUF file's Q4_1 blocks (`read_q4_1`: the file's own codes, no
  requantisation), from its Q8_0 blocks (`read_q8_0`: each 8-bit code split into two 4-bit halves,
  w = d * (16 * hi + lo - 128), one product over the input tiled twice: exact for Q8_0's per-group
  scales), or from requantising a dense weight (`quantize_int4`). `Codes.pack()` makes an `Int4`.
- `Int4`: torch's CPU weight-only int4 kernel (`_weight_int4pack_mm_for_cpu`). It computes in bf16
  (its fp32 path is ~17x slower), so activations are rounded to bf16 for the product and the result
  returned in the caller's dtype; scales and zero points are held in bf16, as the kernel requires.
- `Int8`: per-output-channel symmetric int8 (`_weight_int8pack_mm`), requantised from a dense weight.

Also the dense products under the precision policy (`linear`, `wants_upcast`: long inputs computed
in fp32 where bf16 is only emulated) and the fusion of maps that share an input (`fuse_linears`).

Knows nothing about transformers' module paths (anatomy.Anatomy and models.py name the weights),
routers, KV policies or files other than a GGUF tensor's raw blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

UPCAST_MIN_TOKENS = 8  # rows from which an fp32 product beats the emulated bf16 one (see bench speed)
FEW_ROWS = 4  # products of at most this many rows use a low-bit copy: a decode step (int4 loses to dense beyond)
# A decode batch's rows (core/ops/batch.py) use the low-bit copy up to this many rows: on a 2-core Xeon with native bf16
# the int4 kernel took 27 ms for the embedded model's products at 8 rows against 48 ms dense, and drew level at 32
# (assets/bench/room.json, "steps": `make room` measures both on the machine at hand).
BATCH_ROWS = 32
KERNEL_DTYPE = torch.bfloat16  # the int4 / int8 CPU kernels' fast path
FORMATS = ("16bit", "int4", "int8")  # what --quantize accepts (16bit: no low-bit copy)


# -- dense products ------------------------------------------------------------------------------
def wants_upcast(n_tokens: int, upcast: bool) -> bool:
    return upcast and n_tokens >= UPCAST_MIN_TOKENS


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, upcast: bool = False) -> torch.Tensor:
    """x @ weight.T + bias, computed in fp32 for long inputs when `upcast`: bf16 weights on a CPU without
    native bf16 units, where torch's many-row bf16 products fall back to a slow path (measured: a
    512-token prefill 6.6x slower than fp32), while one-row products stay fast."""
    if wants_upcast(x.shape[-2], upcast):
        b = bias.float() if bias is not None else None
        return F.linear(x.float(), weight.float(), b).to(x.dtype)
    return F.linear(x, weight, bias)


def fuse_linears(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for several linear maps of the same input, stacked by output rows.

    The originals' parameters are re-pointed to views of the fused tensor, so no weight is held
    twice and the modules (and transformers' own forward) compute exactly as before. Biases are
    fused when every map has one (Qwen 2), else left to the modules (none of the supported
    families mixes them).
    """
    weight = torch.cat([lin.weight.detach() for lin in linears])  # (sum(out), in)
    for lin, part in zip(linears, weight.split([lin.out_features for lin in linears])):
        lin.weight.data = part
    bias = None
    if all(lin.bias is not None for lin in linears):
        bias = torch.cat([lin.bias.detach() for lin in linears])
        for lin, part in zip(linears, bias.split([lin.out_features for lin in linears])):
            lin.bias.data = part
    elif any(lin.bias is not None for lin in linears):
        raise ValueError("cannot fuse linear maps where only some have a bias")
    return weight, bias


# -- low-bit kernels -----------------------------------------------------------------------------
INT4_GROUPS = (32, 64, 128, 256)  # group sizes the CPU int4 kernel takes


def kernel_input(x: torch.Tensor) -> torch.Tensor:
    """x as the low-bit kernels require it: bf16 and contiguous. They refuse a strided input (a slice of a wider
    norm output, a row of a batch), so every caller's layout is made acceptable here, never at the call sites;
    both are no-ops for the usual contiguous bf16 row."""
    return x.to(KERNEL_DTYPE).contiguous()


def int4_packable(n: int, k: int, group: int) -> bool:
    """The CPU int4 kernel's shape rules: output rows in multiples of 16, whole groups of a size it takes."""
    return n % 16 == 0 and group in INT4_GROUPS and k % group == 0


@dataclass(frozen=True)
class Int4:
    """Packed int4 weight for torch's CPU kernel: w = (code - 8) * scale + zero, per group of the input."""

    packed: torch.Tensor  # (N, K * tiles / 2) uint8, the kernel's layout
    scales_zeros: torch.Tensor  # (K * tiles / group, N, 2) bf16
    group: int
    tiles: int = 1  # the input is repeated this many times along K (Q8_0 as two 4-bit halves)
    label: str = "int4"

    def mm(self, x: torch.Tensor) -> torch.Tensor:
        """x (n, K), of any dtype and layout -> (n, N) in bf16."""
        x = kernel_input(x)
        if self.tiles > 1:
            x = x.repeat(1, self.tiles)  # (n, tiles * K)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group, self.scales_zeros)

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scales_zeros.numel() * self.scales_zeros.element_size()


@dataclass(frozen=True)
class Int8:
    """Per-output-channel symmetric int8: w = code * scale."""

    codes: torch.Tensor  # (N, K) int8
    scales: torch.Tensor  # (N,) bf16
    label: str = "int8 per channel (requantised)"

    def mm(self, x: torch.Tensor) -> torch.Tensor:
        """x (n, K), of any dtype and layout -> (n, N) in bf16."""
        return torch.ops.aten._weight_int8pack_mm(kernel_input(x), self.codes, self.scales)

    @property
    def nbytes(self) -> int:
        return self.codes.numel() + 2 * self.scales.numel()


def quantize_int8(weight: torch.Tensor) -> Int8:
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-12).to(KERNEL_DTYPE)  # (N,), as the kernel will hold them
    codes = (w / scales.float()[:, None]).round().clamp(-128, 127).to(torch.int8)
    return Int8(codes.contiguous(), scales)


# -- 4-bit codes: from a GGUF file or a dense weight ---------------------------------------------
@dataclass(frozen=True)
class Codes:
    """4-bit codes with a scale and a minimum per group along the input: w = code * scale + minimum.

    With `tiles` > 1 the input is tiled: the weight is the sum of `tiles` blocks of K columns each.
    Rows are output features; `cat` stacks maps of the same input, `permute_rows` reorders them.
    """

    codes: torch.Tensor  # (N, tiles * K) uint8 in 0..15
    scale: torch.Tensor  # (N, tiles * K / group) float32
    minimum: torch.Tensor  # (N, tiles * K / group) float32
    group: int
    tiles: int = 1
    source: str = "int4"  # what made them, for labels: "Q4_1", "Q8_0", "int4 g32 (requantised)"

    @property
    def shape(self) -> tuple[int, int]:
        n, k = self.codes.shape
        return n, k // self.tiles

    def dequantize(self) -> torch.Tensor:
        """The float32 weight (N, K) the codes stand for."""
        n, k = self.codes.shape
        w = self.codes.float().view(n, -1, self.group) * self.scale[..., None] + self.minimum[..., None]
        return w.view(n, self.tiles, k // self.tiles).sum(dim=1)

    def permute_rows(self, order: torch.Tensor) -> Codes:
        return replace(self, codes=self.codes[order], scale=self.scale[order], minimum=self.minimum[order])

    @staticmethod
    def cat(parts: list[Codes]) -> Codes:
        first = parts[0]
        if any((p.group, p.tiles, p.shape[1]) != (first.group, first.tiles, first.shape[1]) for p in parts):
            raise ValueError("cannot stack codes of different layouts")
        return replace(first, codes=torch.cat([p.codes for p in parts]), scale=torch.cat([p.scale for p in parts]),
                       minimum=torch.cat([p.minimum for p in parts]))

    def pack(self) -> Int4:
        n, k = self.codes.shape
        if not int4_packable(n, k, self.group):
            raise ValueError(f"a ({n}, {k}) weight in groups of {self.group} does not fit the int4 kernel")
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(self.codes.to(torch.int32).contiguous(), 1)
        zero = self.minimum + 8 * self.scale  # the kernel's form: (code - 8) * scale + zero
        scales_zeros = torch.stack([self.scale, zero], dim=-1).transpose(0, 1).contiguous()  # (K/g, N, 2)
        label = f"{self.source} codes as int4 (group {self.group})"
        return Int4(packed, scales_zeros.to(KERNEL_DTYPE), self.group, self.tiles, label)


def quantize_int4(weight: torch.Tensor, group: int = 32) -> Codes:
    """Requantise a dense (N, K) weight to 4-bit codes, asymmetric per group of `group` inputs (as Q4_1)."""
    w = weight.detach().float()
    n, k = w.shape
    if k % group:
        raise ValueError(f"input size {k} is not a multiple of the group size {group}")
    g = w.view(n, k // group, group)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)  # (N, K/g)
    scale = ((hi - lo) / 15).clamp(min=1e-12)
    codes = ((g - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.uint8).view(n, k)
    return Codes(codes, scale, lo, group, source=f"int4 g{group} (requantised)")


_Q4_1_BLOCK, _Q8_0_BLOCK, _QK = 20, 34, 32  # bytes per block of 32 weights: Q4_1 d, m (fp16) + 16 B; Q8_0 d + 32 B


def read_q4_1(raw: np.ndarray) -> Codes:
    """GGUF Q4_1 rows (N, K / 32 * 20) uint8 -> Codes: per block, fp16 d and m, then 16 bytes whose low
    nibbles are weights 0-15 and high nibbles weights 16-31; w = q * d + m."""
    n = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(n, -1, _Q4_1_BLOCK)  # (N, K/32, 20)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0]
    qs = blocks[..., 4:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, -1)  # (N, K)
    return Codes(torch.from_numpy(codes), torch.from_numpy(d.astype(np.float32)), torch.from_numpy(m.astype(np.float32)),
                 _QK, source="Q4_1")


def read_q8_0(raw: np.ndarray) -> Codes:
    """GGUF Q8_0 rows (N, K / 32 * 34) uint8 -> Codes over the input tiled twice: per block an fp16 d and
    32 int8 q; q + 128 = 16 * hi + lo, so w = d * q = (16 d) * hi - 128 d  +  d * lo, exactly."""
    n = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(n, -1, _Q8_0_BLOCK)  # (N, K/32, 34)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # (N, K/32)
    q = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8).reshape(n, -1)  # (N, K) in 0..255
    codes = np.concatenate([q >> 4, q & 0x0F], axis=1)  # (N, 2K): hi block, then lo block
    scale = np.concatenate([16 * d, d], axis=1)
    minimum = np.concatenate([-128 * d, np.zeros_like(d)], axis=1)
    return Codes(torch.from_numpy(codes), torch.from_numpy(scale), torch.from_numpy(minimum), _QK, tiles=2, source="Q8_0")


# -- a linear map as the engine sees it --------------------------------------------------------------
@dataclass(eq=False)  # not frozen: core/kernels/batch_paths.py sets `wide` once a machine is measured
class Weight:
    """A linear map: its dense weight (N, K) and bias, and a low-bit copy for products of few rows."""

    dense: torch.Tensor
    bias: torch.Tensor | None = None
    low: Int4 | Int8 | None = None
    # The dense product a decode batch (`batch`) takes from `wide_from` rows on: an fp32 copy of `dense`, or `dense`
    # itself (its own dtype, no copy: where bf16 products are native), whichever measured faster than the low-bit
    # kernel on this machine (core/kernels/batch_paths.py); None: `batch` keeps the low-bit copy.
    wide: torch.Tensor | None = None
    wide_from: int | None = None
    # The parameter names whose low-bit codes `low` stacks (a fused q|k|v: three), where it came from a file's codes:
    # core/kernels/low_paths.py builds another kernel's copy of the same codes from them.
    names: tuple[str, ...] = ()
    # Another kernel's copy of the same codes for products of one row (a decode step, a batch of one), where
    # core/kernels/low_paths.py measured it faster than `low`'s at one row; more rows keep `low` (or `wide`).
    one_low: object | None = None

    def __call__(self, x: torch.Tensor, upcast: bool = False) -> torch.Tensor:
        """x (..., T, K) -> (..., T, N): the low-bit copy for a decode step's few rows (x of shape (1, T, K),
        as the engine passes them), else the dense weight (its fp32 copy, where it has one, for a long input that
        is computed in fp32 anyway: no conversion of the weight per call)."""
        if self.low is None or x.dim() != 3 or x.shape[0] != 1 or x.shape[1] > FEW_ROWS:
            if self.wide is not None and self.wide.dtype == torch.float32 and wants_upcast(x.shape[-2], upcast):
                return self._wide_rows(x)
            return linear(x, self.dense, self.bias, upcast)
        return self._low_rows(x[0])[None]  # (1, T, N)

    def one(self, x: torch.Tensor) -> torch.Tensor:
        """x (1, 1, K) or (1, K) -> (1, N) in x's dtype: one token's product (a decode step), in as few ops as it takes."""
        x = x.view(1, -1)
        if self.low is None:
            return F.linear(x, self.dense, self.bias)
        return self._low_rows(x)

    def batch(self, x: torch.Tensor, upcast: bool = False) -> torch.Tensor:
        """x (n, K) -> (n, N) in x's dtype: one row per request of a decode batch; the low-bit copy up to BATCH_ROWS
        rows (for one row, the same product as `one`), or the fp32 copy from `wide_from` rows where that measured faster."""
        if self.wide is not None and x.shape[0] >= self.wide_from:
            return self._wide_rows(x)
        if self.low is None or x.shape[0] > BATCH_ROWS:
            return linear(x, self.dense, self.bias, upcast)
        return self._low_rows(x)

    def _wide_rows(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., K) -> (..., N) through the fp32 copy (or the dense weight itself), in x's dtype."""
        if self.wide is self.dense:
            return F.linear(x.to(self.dense.dtype), self.dense, self.bias).to(x.dtype)
        y = F.linear(x.float(), self.wide, None if self.bias is None else self.bias.float())
        return y.to(x.dtype)

    def _low_rows(self, x: torch.Tensor) -> torch.Tensor:
        """x (n, K) -> (n, N) through the low-bit copy (one row: `one_low`, where it has one), in x's dtype, plus the bias."""
        low = self.one_low if self.one_low is not None and x.shape[0] == 1 else self.low
        y = low.mm(x)  # (n, N) in the kernel's dtype
        if y.dtype != x.dtype:
            y = y.to(x.dtype)
        return y if self.bias is None else y + self.bias

    def rows(self, start: int, stop: int) -> Weight:
        """Rows start:stop (dense only): a part of a fused map whose low-bit copy is held separately."""
        b = None if self.bias is None else self.bias[start:stop]
        return Weight(self.dense[start:stop], b)

    @property
    def label(self) -> str:
        return self.low.label if self.low is not None else str(self.dense.dtype).removeprefix("torch.")

    @property
    def nbytes(self) -> int:
        """Bytes a decode step reads for this map: its one-row copy or the low-bit copy, where it has one."""
        dense = self.dense.numel() * self.dense.element_size()
        low = self.one_low if self.one_low is not None else self.low
        return (low.nbytes if low is not None else dense) + (0 if self.bias is None else self.bias.numel() * self.bias.element_size())


# -- which low-bit copies a model gets ---------------------------------------------------------------
@dataclass(frozen=True)
class LowBitPlan:
    """How the linear maps of a model get their low-bit copies for decode steps.

    `codes` (parameter name -> Codes): a model file's own codes (the embedded GGUF); maps whose names
    are all there are packed from them, stacked in the order given (a fused q|k|v), others keep only
    their dense weight. Without `codes`, every map is requantised from its dense weight to `format`.
    """

    format: str  # "int4" | "int8"
    codes: dict[str, Codes] | None = None
    group: int = 32  # requantised int4 only

    def __post_init__(self):
        if self.format not in FORMATS[1:]:
            raise ValueError(f"unknown low-bit format {self.format!r}; choose from {FORMATS[1:]}")

    def low(self, names: list[str], dense: torch.Tensor) -> Int4 | Int8 | None:
        """The low-bit copy of the map made of `names` (stacked), or None where it keeps only its dense weight."""
        if self.codes is not None:
            if not all(n in self.codes for n in names):
                return None
            codes = Codes.cat([self.codes[n] for n in names])
            return codes.pack() if int4_packable(*codes.codes.shape, codes.group) else None
        if self.format == "int8":
            return quantize_int8(dense)
        n, k = dense.shape
        return quantize_int4(dense, self.group).pack() if int4_packable(n, k, self.group) else None

    @property
    def label(self) -> str:
        """One line for logs, trace meta and the UI."""
        if self.codes is not None:
            sources = sorted({c.source for c in self.codes.values()})
            return f"the file's own {' + '.join(sources)} codes (int4 kernel); 16-bit weights for prefill"
        if self.format == "int8":
            return "int8 per channel, requantised; 16-bit weights for prefill"
        return f"int4 group {self.group}, requantised; 16-bit weights for prefill"
