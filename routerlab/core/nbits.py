"""onnxruntime's `MatMulNBits` on a GGUF file's own codes: a low-bit copy with the interface of `weights.Int4`, for
the maps whose one-row product it computes faster than torch's int4 kernel on the machine at hand (core/low_paths.py
measures that at start-up; where onnxruntime or onnx is not installed, every map keeps torch's kernel).

llama.cpp multiplies Q4_1 weights with activations quantised to 8 bits per block of 32 (integer dot products);
`MatMulNBits` at accuracy level 4 does the same. Here it computes exactly the file's codes: Q4_1 (w = q * d + m) as
(q - 8) * d, 4-bit codes with zero point 8, plus (m + 8 d) times each block's input sum (a small fp32 product in the
same graph; centred codes, so the 8-bit activations' rounding is not amplified by a large minimum it no longer
cancels against), Q8_0 (w = d * q) as 8-bit codes with zero point 128.

Each map is a session of its own, with a pool of its own that does not spin while idle: measured on a 2-core Xeon
(`python -m routerlab.bench.nbits`), sessions sharing onnxruntime's global pool made decode 0.37x as fast, and
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


def _graph(nodes, inits, k: int, n: int) -> bytes:
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, "product", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])], inits)
    return helper.make_model(graph, opset_imports=opsets()).SerializeToString()


def opsets() -> list:
    """The operator sets the graphs use: ONNX's and onnxruntime's contrib ops (MatMulNBits and the like)."""
    from onnx import helper

    return [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]


def product_nodes(codes, x: str, y: str, prefix: str = "", sums: dict | None = None, gemm: bool = False) -> tuple[list, list]:
    """ONNX nodes and initializers that compute y = x (..., K) by a `weights.Codes` (Q4_1, or Q8_0 as two 4-bit
    tiles) -> (..., N), names prefixed by `prefix`. `sums` (input name -> its block sums' name) shares one input's
    block sums between the Q4_1 products that read it (core/step_graph.py: q|k|v and the like). `gemm`: x is 2-D
    (M, K), so the rest and its addition are one `Gemm` (one node fewer)."""
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
    q = c.reshape(n, blocks, 32)
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)  # two codes a byte, the first in the low nibble
    inits = [numpy_helper.from_array(packed, prefix + "B"), numpy_helper.from_array(d.reshape(-1).astype(np.float32), prefix + "S"),
             numpy_helper.from_array(np.full(n * ((blocks + 1) // 2), 0x88, np.uint8), prefix + "Z"),  # zero point 8 in both nibbles
             numpy_helper.from_array(np.ascontiguousarray((m + 8 * d).T).astype(np.float32), prefix + "MT")]  # (K/32, N): the rest
    nodes = []
    sums = {} if sums is None else sums
    if x not in sums:  # (M, K/32): each block's input sum
        sums[x] = f"{x}.sums"
        inits += [numpy_helper.from_array(np.array([-1, blocks, 32], np.int64), f"{x}.shape"),
                  numpy_helper.from_array(np.array([2], np.int64), f"{x}.axis")]
        nodes += [helper.make_node("Reshape", [x, f"{x}.shape"], [f"{x}.blocks"]),
                  helper.make_node("ReduceSum", [f"{x}.blocks", f"{x}.axis"], [sums[x]], keepdims=0)]
    nodes.append(helper.make_node("MatMulNBits", [x, prefix + "B", prefix + "S", prefix + "Z"], [prefix + "P"], domain="com.microsoft",
                                  K=k, N=n, bits=4, block_size=32, accuracy_level=4))  # sum of d * (q - 8) * x
    if gemm:  # sums @ MT + P: the rest, sum of (m + 8 d) * x, and its addition in one node
        nodes.append(helper.make_node("Gemm", [sums[x], prefix + "MT", prefix + "P"], [y]))
    else:
        nodes += [helper.make_node("MatMul", [sums[x], prefix + "MT"], [prefix + "minima"]),  # sum of (m + 8 d) * x
                  helper.make_node("Add", [prefix + "P", prefix + "minima"], [y])]
    return nodes, inits


def nbits_graph(codes) -> bytes:
    """The product x (M, K) -> (M, N) by a `weights.Codes` (Q4_1, or Q8_0 as two 4-bit tiles), as an ONNX model."""
    nodes, inits = product_nodes(codes, "A", "Y")
    return _graph(nodes, inits, *codes.shape[::-1])


def _bytes(codes) -> int:
    """Bytes a product reads, as `nbits_graph` stores them: Q8_0, a byte a weight and per block an fp32 scale and a
    zero point; Q4_1, half a byte a weight and per block an fp32 scale, half a byte of zero point and an fp32 rest."""
    n, k = codes.shape
    blocks = n * k // codes.group
    return n * k + 5 * blocks if codes.tiles == 2 else n * k // 2 + 8 * blocks + (blocks + 1) // 2


class NBits:
    """A low-bit copy (the interface of weights.Int4) whose product runs in an onnxruntime session.

    `per_session`: the session has a pool of its own (`threads`, not spinning while idle); False: it uses the
    process's global pool (bench/nbits.py measures both ways)."""

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
