"""onnxruntime's `MatMulNBits` on a GGUF file's own codes: a low-bit copy with the interface of `weights.Int4`, for
the maps whose one-row product it computes faster than torch's int4 kernel on the machine at hand (core/kernels/low_paths.py
measures that at start-up; where onnxruntime or onnx is not installed, every map keeps torch's kernel).

llama.cpp multiplies Q4_1 weights with activations quantised to 8 bits per block of 32 (integer dot products);
`MatMulNBits` at accuracy level 4 does the same. Here it computes the file's codes and scales: Q4_1 (w = q * d + m)
as (q - z) * d, 4-bit codes with the zero point z nearest -m / d, plus the rest m + z d (at most half a step) times
each block's input sum, the rest in 8 bits (`product_nodes`; centred codes, so the 8-bit activations' rounding is not
amplified by a large minimum cancelling against it); Q8_0 (w = d * q) exactly, as 8-bit codes with zero point 128.

Each map is a session of its own, with a pool of its own that does not spin while idle: measured on a 2-core Xeon
(`python -m routerlab.bench.products.nbits`), sessions sharing onnxruntime's global pool made decode 0.37x as fast, and
spinning pools on 2 cores far worse. A one-row call (a decode step's product) reuses its thread's binding and buffers:
measured on that Xeon (one-off, q|k|v of one layer, 5,000 calls), the call took 25.4 us when it built a binding,
bound fresh tensors and converted the input each time, of which 14-15 us were the session's run itself.
Knows nothing about models, routers or the UI: only `weights.Codes`.
"""

from __future__ import annotations

import importlib.util
import threading

import numpy as np
import torch


def available() -> bool:
    """Whether onnxruntime and onnx are installed (the second builds the graphs)."""
    return all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "onnx"))


def rows_independent() -> bool:
    """Whether this machine's `MatMulNBits` gives a row the same bits alone (M = 1) as among other rows (M > 1), probed
    once a process on a small product of `product_nodes`' own kind (4-bit codes with zero points, 8-bit rests).

    Read from MLAS's sources (onnxruntime/core/mlas/lib, sqnbitgemm_kernel_avx2.cpp and _avx512.cpp): at accuracy level
    4, AVX-512 runs every M through one kernel, each row's sums in the same order, so the probe says True; AVX2 (with or
    without VNNI) sends M = 1 to a kernel of its own that subtracts the zero point inside the integer dots, while M > 1
    multiplies the raw codes and adds each block's zero point times the activations' block sum in a float product after:
    the same sum in another order, other last bits, which the next product's 8-bit activations can turn into a step of
    their rounding (a score 0.008 apart, a near tie's greedy token other). There, a request alone (one row) and the same
    request in a room (several) agree within that rounding, not to the bit: docs/method.md, "Which parity holds where"."""
    global _ROWS_INDEPENDENT
    if _ROWS_INDEPENDENT is None:
        import onnxruntime as ort

        from routerlab.core.kernels.weights import quantize_int4

        g = torch.Generator().manual_seed(0)
        codes = quantize_int4(torch.randn(40, 128, generator=g) * 0.05)
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.log_severity_level = 1, 3
        session = ort.InferenceSession(nbits_graph(codes), options, providers=["CPUExecutionProvider"])
        x = torch.randn(5, 128, generator=g).numpy()
        together = session.run(None, {"A": x})[0]
        _ROWS_INDEPENDENT = all(np.array_equal(session.run(None, {"A": x[i : i + 1]})[0], together[i : i + 1]) for i in range(5))
    return _ROWS_INDEPENDENT


_ROWS_INDEPENDENT: bool | None = None


def _graph(nodes, inits, k: int, n: int) -> bytes:
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, "product", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])], inits)
    return helper.make_model(graph, opset_imports=opsets()).SerializeToString()


def opsets() -> list:
    """The operator sets the graphs use: ONNX's and onnxruntime's contrib ops (MatMulNBits and the like)."""
    from onnx import helper

    return [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]


def product_nodes(codes, x: str, y: str, prefix: str = "") -> tuple[list, list]:
    """ONNX nodes and initializers that compute y = x (M, K) by a `weights.Codes` (Q4_1, or Q8_0 as two 4-bit
    tiles) -> (M, N), names prefixed by `prefix`.

    Q4_1 (w = q * d + m per block of 32) as d * (q - z) + r: the file's codes q and scales d, a 4-bit zero point
    z = round(-m / d) (0..15) that takes in most of the minimum, and the rest r = m + z * d (at most d / 2 where the
    block holds both signs) times the block's input sum. One `MatMulNBits` gives both the codes' product and, in K / 32
    extra columns (codes 1 on their own block), the sums of the 8-bit activations it multiplied, as llama.cpp's Q8_1
    carries them; a second multiplies the sums by the rests in 8 bits. The rests held in fp32 beside the codes, an fp32
    product of their own, made the step graph measurably slower (a one-off comparison, not kept)."""
    from onnx import helper, numpy_helper

    c, d, m = codes.codes.numpy(), codes.scale.numpy(), codes.minimum.numpy()
    n, k = codes.shape
    blocks = k // codes.group
    if codes.group != 32:
        raise ValueError("the file's codes come in blocks of 32")
    if codes.tiles == 2:  # Q8_0 split as 16 * hi + lo = q + 128 (weights.read_q8_0): joined again, zero point 128
        u = (c[:, :k].astype(np.uint16) * 16 + c[:, k:]).astype(np.uint8).reshape(n, blocks, 32)
        inits = [numpy_helper.from_array(u, prefix + "B"), numpy_helper.from_array(np.ascontiguousarray(d[:, blocks:]).reshape(-1), prefix + "S"),
                 numpy_helper.from_array(np.full(n * blocks, 128, np.uint8), prefix + "Z")]
        return [helper.make_node("MatMulNBits", [x, prefix + "B", prefix + "S", prefix + "Z"], [y], domain="com.microsoft", K=k, N=n,
                                 bits=8, block_size=32, accuracy_level=4)], inits
    d, m = d.astype(np.float64), m.astype(np.float64)
    z = np.clip(np.rint(np.divide(-m, d, out=np.full_like(m, 8.0), where=d != 0)), 0, 15)
    rest = (m + z * d).astype(np.float32)  # (N, K/32)
    # the codes' columns, then one column a block that sums it: code 9 at zero point 8, scale 1 on its block, 0 elsewhere
    q = np.concatenate([c.reshape(n, blocks, 32), np.full((blocks, blocks, 32), 9, np.uint8)])
    scales = np.concatenate([d, np.eye(blocks)]).astype(np.float32)
    zero = np.concatenate([z.astype(np.uint8), np.full((blocks, blocks), 8, np.uint8)])
    inits = [numpy_helper.from_array(_nibbles(q), prefix + "B"), numpy_helper.from_array(scales.reshape(-1), prefix + "S"),
             numpy_helper.from_array(_nibbles(zero).reshape(-1), prefix + "Z"),
             numpy_helper.from_array(np.array([n, blocks], np.int64), prefix + "split")]
    codes8, scales8 = _eight_bits(rest)
    inits += [numpy_helper.from_array(codes8, prefix + "RB"), numpy_helper.from_array(scales8, prefix + "RS")]
    nodes = [helper.make_node("MatMulNBits", [x, prefix + "B", prefix + "S", prefix + "Z"], [prefix + "PS"], domain="com.microsoft",
                              K=k, N=n + blocks, bits=4, block_size=32, accuracy_level=4),  # sum of d * (q - z) * x, and the sums
             helper.make_node("Split", [prefix + "PS", prefix + "split"], [prefix + "P", prefix + "sums"], axis=-1),
             helper.make_node("MatMulNBits", [prefix + "sums", prefix + "RB", prefix + "RS"], [prefix + "R"], domain="com.microsoft",
                              K=blocks, N=n, bits=8, block_size=32, accuracy_level=4),  # sum of r * x (zero point 128)
             helper.make_node("Add", [prefix + "P", prefix + "R"], [y])]
    return nodes, inits


def _nibbles(a: np.ndarray) -> np.ndarray:
    """4-bit values (..., L) packed two a byte along the last axis, the first in the low nibble (L padded to even)."""
    if a.shape[-1] % 2:
        a = np.concatenate([a, np.zeros(a.shape[:-1] + (1,), a.dtype)], -1)
    return (a[..., 0::2] | (a[..., 1::2] << 4)).astype(np.uint8)


def _eight_bits(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(N, K) fp32 -> 8-bit codes (N, K/32 rounded up, 32) at zero point 128 and their scales, per block of 32."""
    n, k = w.shape
    blocks = -(-k // 32)
    padded = np.zeros((n, blocks * 32), np.float32)
    padded[:, :k] = w
    padded = padded.reshape(n, blocks, 32)
    most = np.abs(padded).max(-1)
    scale = np.where(most > 0, most / 127, 1.0).astype(np.float32)
    return (np.rint(padded / scale[..., None]) + 128).astype(np.uint8), scale.reshape(-1)


def nbits_graph(codes) -> bytes:
    """The product x (M, K) -> (M, N) by a `weights.Codes` (Q4_1, or Q8_0 as two 4-bit tiles), as an ONNX model."""
    nodes, inits = product_nodes(codes, "A", "Y")
    return _graph(nodes, inits, *codes.shape[::-1])


def _bytes(codes) -> int:
    """Bytes a product reads, as `product_nodes` stores them: Q8_0, a byte a weight and per block an fp32 scale and a
    zero point; Q4_1, with the sums' columns (K / 32 of them), half a byte a weight and per block an fp32 scale and half
    a byte of zero point, and the rests, a byte each (padded to blocks of 32) and an fp32 scale per 32."""
    n, k = codes.shape
    per_row = k // codes.group
    if codes.tiles == 2:
        return n * k + 5 * n * per_row
    rests = -(-per_row // 32)
    return (n + per_row) * (k // 2 + 4 * per_row + (per_row + 1) // 2) + n * rests * (32 + 4)


class NBits:
    """A low-bit copy (the interface of weights.Int4) whose product runs in an onnxruntime session.

    `per_session`: the session has a pool of its own (`threads`, not spinning while idle); False: it uses the
    process's global pool (bench/products/nbits.py measures both ways)."""

    def __init__(self, codes, threads: int, per_session: bool = True):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3  # warnings about unused initializers and the like are not the user's concern
        if per_session:
            options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        else:
            options.use_per_session_threads = False
        self.session = ort.InferenceSession(nbits_graph(codes), options, providers=["CPUExecutionProvider"])
        self.n, self.k = codes.shape
        self._mine = threading.local()  # this thread's one-row binding: (binding, input buffer, output buffer)
        self.label = f"onnxruntime MatMulNBits ({codes.source})"
        self.nbytes = _bytes(codes)

    def mm(self, x: torch.Tensor) -> torch.Tensor:
        """x (n, K) -> (n, N), a new tensor in x's dtype (computed in fp32); input and output bound to torch's memory,
        no copies through numpy. One row through this thread's own binding, bound once (sessions may run on several
        threads at once); more rows through a binding of their own."""
        if x.shape[0] == 1:
            one = getattr(self._mine, "one", None)
            if one is None:
                with torch.inference_mode(False):  # normal tensors: written in place inside inference mode and out of it
                    one = self._mine.one = self._bind(torch.empty(1, self.k), torch.empty(1, self.n))
            binding, a, y = one
            a.copy_(x)
            self.session.run_with_iobinding(binding)
            return y.clone() if x.dtype == torch.float32 else y.to(x.dtype)
        a = x.float().contiguous()
        y = torch.empty(x.shape[0], self.n)
        self.session.run_with_iobinding(self._bind(a, y)[0])
        return y if x.dtype == torch.float32 else y.to(x.dtype)

    def _bind(self, a: torch.Tensor, y: torch.Tensor) -> tuple:
        binding = self.session.io_binding()
        binding.bind_input("A", "cpu", 0, np.float32, list(a.shape), a.data_ptr())
        binding.bind_output("Y", "cpu", 0, np.float32, list(y.shape), y.data_ptr())
        return binding, a, y
