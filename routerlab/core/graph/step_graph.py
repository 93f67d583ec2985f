"""A whole decode step of the model as one onnxruntime graph on a GGUF file's own codes: every layer's
norms, products (`MatMulNBits`, core/kernels/nbits.py), rotary, attention over its KV cache, residual adds, then the head,
in one `run`, so no tensor op a step is dispatched from Python.

Why: the engine's step is torch ops called from Python, ~20 a layer besides the products, each a few microseconds of
dispatch (more inside a step, as every layer's weights stream through the caches). On a 2-core Xeon with AMX
(2026-12-06 10:47, `python -m routerlab.bench.step_graph`, assets/bench/step-graph-amx.json) the engine decodes at
0.76x llama.cpp on the same file at 512 tokens of context, this graph at 1.00x (at 2,048 tokens: 0.91x and 0.90x).

What it covers: any number of rows at once (one request alone is one row; a room's rows, core/graph/graph_rows.py), each
with its own position, KV cache entry, mask and threshold, after the engine's own prefill (`load` copies a prefill's
KV cache in for a request alone), the full model or attention-token routers under `kv`, `mask` or `drop` (the
router's logit and each row's decision inside the graph, the attention under an `If` but for `mask`; under `drop`
each routed layer with entries of its own). Its activations are fp32 (the products quantise them to
8 bits per block of 32, as llama.cpp does) where the engine's are bf16, so its logits differ from torch's path by that
rounding (tested: KL per token, the same greedy tokens where the top two are not a near tie). Which path decodes is
measured at start-up (core/decode/decode_paths.py); where the graph wins, every request it can take decodes through it, alone
and in a room, so a request decodes the same either way.

Covers Llama-family anatomies whose every map has the file's codes (the embedded SmolLM2): `why_not` and
`routing_why_not` say what else keeps it off. Knows nothing about sampling, traces or the UI.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

from routerlab.core.graph import graph_forms
from routerlab.core.graph.own_entries import OwnEntries
from routerlab.core.kernels import nbits
from routerlab.core.routing.router import logit, sigmoid

# Caches hold a multiple of ALIGN entries: MLAS's one-row products (attention, `_groups`) treat a last partial block of
# 16 keys their own way, so a query's numbers would change with the capacity (a request alone, in a room) without it.
ALIGN = 16
log = logging.getLogger(__name__)
CACHE = torch.float32  # the KV caches' type in the graph (a request's own buffers, a room's slots)
DECODES = "the step graph (one onnxruntime run a step)"  # a trace's meta["decode"] where it decoded


def why_not(an) -> str | None:
    """Why an anatomy (core/model/anatomy.Anatomy, an engine's `anatomy`) cannot decode through a step graph, or None."""
    if not nbits.available():
        return "onnxruntime is not installed"
    if an.lowbit is None or an.lowbit.codes is None:
        return "no file codes (the graph multiplies a GGUF file's own codes)"
    if an.family != "llama":
        return f"a {an.family} model (the graph covers the Llama family)"
    rope = _rope(an.config)
    if rope.get("rope_type", "default") != "default":
        return f"{rope.get('rope_type')} rotary scaling"
    if getattr(an.config, "hidden_act", "silu") != "silu":
        return f"a {an.config.hidden_act} MLP (the graph computes SiLU)"
    if any(p.gate_up is None for p in an.layers):
        return "an MLP without a gate"
    if any(w.bias is not None for p in an.layers for w in (p.attn.qkv, p.attn.o, p.gate_up, p.down)):
        return "biases on its linear maps"
    names = [_head_name(an.lowbit.codes)] + [n for i in range(an.n_layers) for n in _layer_names(i)]
    missing = [n for n in names if n is None or n not in an.lowbit.codes]
    return f"no file codes for {len(missing)} maps" if missing else None


POLICIES = ("kv", "mask", "drop")  # the KV policies routed inside the graph


def routing_why_not(routers, policy: str = "kv") -> str | None:
    """Why a router set cannot route inside the step graph, or None: it routes attention token by token under `kv`,
    `mask` or `drop`, without stand-ins."""
    if routers is None:
        return None
    config = routers.config
    if config.target != "attention" or config.level != "token":
        return f"{config.granularity} routers (the graph routes attention, token by token)"
    if policy not in POLICIES:
        return f"the {policy} policy (the graph routes under {', '.join(POLICIES)})"
    if routers.standin_rank:
        return "stand-ins"
    return None


def _rope(config) -> dict:
    return getattr(config, "rope_parameters", None) or {"rope_theta": config.rope_theta, "rope_type": "default"}


def _head_name(codes) -> str | None:
    return next((n for n in ("lm_head.weight", "model.embed_tokens.weight") if n in codes), None)


def _layer_names(i: int) -> list[str]:
    pre = f"model.layers.{i}"
    return [f"{pre}.self_attn.{x}_proj.weight" for x in "qkvo"] + [f"{pre}.mlp.{x}_proj.weight" for x in ("gate", "up", "down")]


class _Nodes:
    """The nodes of one graph being built (the step's, or a branch of an `If`); initializers all go to the step's
    graph, which every branch sees."""

    def __init__(self, inits: list):
        self.nodes, self.inits = [], inits

    def __call__(self, op: str, ins: list[str], outs: list[str], **kw) -> str:
        from onnx import helper

        self.nodes.append(helper.make_node(op, ins, outs, **kw))
        return outs[0]

    def product(self, name: str, x: str, codes) -> str:
        nodes, inits = nbits.product_nodes(codes, x, name, prefix=name + ".")
        self.nodes += nodes
        self.inits += inits
        return name

    def constant(self, name: str, values, dtype) -> str:
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(np.array(values, dtype), name))
        return name


def build(an, max_positions: int, routers=None, policy: str = "kv") -> bytes:
    """The step graph as an ONNX model for `rows` requests at once (symbolic; one request alone is one row): inputs
    h (rows, D) fp32 (each token's embedding), position (rows, 1) int64, slot (rows, Hkv, 4) int64 (the cache entry
    each KV head's new key and value go to: row, head, 0, index), mask (rows, 1, 1, 1, capacity) fp32 (0 where a
    row's cache holds a key, -inf elsewhere) and each layer's keys and values (rows, Hkv, 1, capacity, hd) fp32,
    capacity symbolic (a request's own, or a room's slots: attention reads only what they may fill; a multiple of
    ALIGN; rotary tables for `max_positions`);
    outputs the logits (rows, V) and the caches again (bound to the same buffers, so the new entries are written in
    place).

    With `routers` (attention-token, `kv`, `mask` or `drop`: `routing_why_not`), input threshold (rows, 1) fp32 too (each
    row's threshold as a raw logit), and each routed layer outputs its router's raw logit (rows, 1): each row decides in
    the graph; a row that skips adds nothing (its key and value are written either way). Under `kv` the attention
    sub-layer runs under an `If` that any row runs it; under `mask` it always runs (the reference: it saves nothing).
    A row's numbers do not depend on the other rows' decisions, and are the same under both policies. Under `drop` a
    skipped token writes nothing a later token reads, so each routed layer's cache holds its own entries (its first
    n_i, n_i counting the tokens that ran it): inputs l{i}.slot (as `slot`, at the entry n_i), l{i}.mslot (rows, 1,
    5) int64 (row, 0, 0, 0, n_i) and l{i}.mask with output l{i}.mask.out (rows, 1, 1, 1, capacity), bound to one
    buffer as the caches are: the graph writes 0 at entry n_i where the row runs the layer (the host reads it there,
    and counts it), -inf where it skips; the q|k|v product goes under the `If` too."""
    from onnx import TensorProto, helper, numpy_helper

    from routerlab.core.kernels.weights import Codes

    params = dict(an.model.named_parameters())
    codes, cfg = an.lowbit.codes, an.config
    a = an.layers[0].attn
    d, inner, eps = cfg.hidden_size, cfg.intermediate_size, float(cfg.rms_norm_eps)
    inits: list = []
    step = _Nodes(inits)

    def weight(name: str) -> str:
        inits.append(numpy_helper.from_array(params[name].detach().float().numpy(), name))
        return name

    inv = 1.0 / (float(_rope(cfg)["rope_theta"]) ** (np.arange(0, a.head_dim, 2, dtype=np.float64) / a.head_dim))
    angles = np.arange(max_positions)[:, None] * inv[None]  # (max_positions, hd / 2)
    inits += [numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"), numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin")]
    cache = ["rows", a.n_kv_heads, 1, "capacity", a.head_dim]
    inputs = [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["rows", d]),
              helper.make_tensor_value_info("position", TensorProto.INT64, ["rows", 1]),
              helper.make_tensor_value_info("slot", TensorProto.INT64, ["rows", a.n_kv_heads, 4]),
              helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["rows", 1, 1, 1, "capacity"])]
    step.constant("qk.rows", [-1, 1, a.q_size + a.kv_size], np.int64)  # RotaryEmbedding reads (rows, 1, hidden)
    step.constant("qk.shape", _groups(a), np.int64)
    step.constant("row.shape", [-1, a.n_kv_heads, a.head_dim], np.int64)
    step.constant("att.shape", [-1, a.q_size], np.int64)
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["rows", cfg.vocab_size])]
    if routers is not None:
        inputs.append(helper.make_tensor_value_info("threshold", TensorProto.FLOAT, ["rows", 1]))
        step.constant("zero", 0.0, np.float32)
    if routers is not None and policy == "drop":
        step.constant("absent", -math.inf, np.float32)
    ms = {"domain": "com.microsoft", "epsilon": eps}
    exact = _folds(a.scaling)  # the queries' scaling in their codes' scales, or one Mul a layer by this constant
    scaling = None if exact else step.constant("scaling", float(a.scaling), np.float32)
    residual, update = "h", None  # the residual stream, and the update a SkipSimplifiedLayerNormalization adds to it
    for i in range(an.n_layers):
        pre, at = f"model.layers.{i}", an.layers[i].attn
        names = _layer_names(i)
        x = f"l{i}.x"
        if update is None:
            step("SimplifiedLayerNormalization", [residual, weight(f"{pre}.input_layernorm.weight")], [x], axis=-1, epsilon=eps)
        else:  # the last MLP's update added to the stream, and the sum normed, in one op
            step("SkipSimplifiedLayerNormalization", [update, residual, weight(f"{pre}.input_layernorm.weight")], [x, "", "", f"l{i}.h"], **ms)
            residual = f"l{i}.h"
        for kind in ("keys", "values"):
            inputs.append(helper.make_tensor_value_info(f"l{i}.{kind}", TensorProto.FLOAT, cache))
            outputs.append(helper.make_tensor_value_info(f"l{i}.{kind}.out", TensorProto.FLOAT, cache))
        router = routers.get(i) if routers is not None else None
        q = _scaled(codes[names[0]], at.scaling) if exact else codes[names[0]]
        qkv_codes = Codes.cat([q] + [codes[n] for n in names[1:3]])
        if router is not None and policy == "drop":
            inputs += [helper.make_tensor_value_info(f"l{i}.slot", TensorProto.INT64, ["rows", a.n_kv_heads, 4]),
                       helper.make_tensor_value_info(f"l{i}.mslot", TensorProto.INT64, ["rows", 1, 5]),
                       helper.make_tensor_value_info(f"l{i}.mask", TensorProto.FLOAT, ["rows", 1, 1, 1, "capacity"])]
            outputs.append(helper.make_tensor_value_info(f"l{i}.mask.out", TensorProto.FLOAT, ["rows", 1, 1, 1, "capacity"]))
            o = _dropped_attention(step, i, at, x, router, qkv_codes, codes[names[3]], scaling)
        else:
            _write(step, i, *_rotate(step, i, at, step.product(f"l{i}.qkv", x, qkv_codes), scaling))
            if router is None:
                _attend(step, i, at, f"l{i}.q", f"l{i}.att")
                o = step.product(f"l{i}.o", f"l{i}.att", codes[names[3]])
            else:
                o = _routed_attention(step, i, at, x, router, codes[names[3]], skips=policy == "kv")
        if router is not None:
            outputs.append(helper.make_tensor_value_info(f"l{i}.score", TensorProto.FLOAT, ["rows", 1]))
        x = f"l{i}.xm"
        step("SkipSimplifiedLayerNormalization", [o, residual, weight(f"{pre}.post_attention_layernorm.weight")], [x, "", "", f"l{i}.hm"], **ms)
        residual = f"l{i}.hm"
        gate_up = step.product(f"l{i}.gate_up", x, Codes.cat([codes[names[4]], codes[names[5]]]))
        step("Split", [gate_up, step.constant(f"l{i}.gate_up.sizes", [inner, inner], np.int64)], [f"l{i}.gate", f"l{i}.up"], axis=-1)
        step("Sigmoid", [f"l{i}.gate"], [f"l{i}.sigmoid"])
        step("Mul", [f"l{i}.gate", f"l{i}.sigmoid"], [f"l{i}.silu"])
        step("Mul", [f"l{i}.silu", f"l{i}.up"], [f"l{i}.act"])
        update = step.product(f"l{i}.down", f"l{i}.act", codes[names[6]])
    step("SkipSimplifiedLayerNormalization", [update, residual, weight("model.norm.weight")], ["final", "", "", "final.h"], **ms)
    step.product("logits", "final", codes[_head_name(codes)])
    graph = helper.make_graph(step.nodes, "decode_step", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=nbits.opsets()).SerializeToString()


def _groups(at) -> list[int]:
    """The queries' shape for attention: (rows, Hkv, G, 1, hd), each query one row against its KV head's cache
    (rows, Hkv, 1, capacity, hd): products of one row, which onnxruntime's MLAS computes without packing the keys
    or values first, as it does for groups of G rows (docs/method.md; `make bench-step-graph` measures the graph)."""
    return [-1, at.n_kv_heads, at.n_heads // at.n_kv_heads, 1, at.head_dim]


def _folds(scaling: float) -> bool:
    """Whether attention's scaling folds into the queries' codes exactly: a power of two (head_dim 64: 1/8)."""
    return math.frexp(scaling)[0] == 0.5


def _scaled(codes, by: float):
    """Codes whose weight is `by` times theirs: exact where `by` is a power of two."""
    from dataclasses import replace

    return replace(codes, scale=codes.scale * by, minimum=codes.minimum * by)


def _rotate(nodes: _Nodes, i: int, at, qkv: str, scaling: str | None) -> tuple[str, str]:
    """Layer i's q|k|v product (rows, q + 2 kv) -> its rotated queries l{i}.q (rows, 1, q_size), scaled for
    attention (by `scaling`'s node, or already in their codes when None); returns its rotated keys' and its values'
    names as rows (rows, Hkv, hd). q and k rotate in one pass (RotaryEmbedding at each row's `position`)."""
    ms = {"domain": "com.microsoft"}
    nodes("Split", [qkv, nodes.constant(f"l{i}.qkv.sizes", [at.q_size + at.kv_size, at.kv_size], np.int64)], [f"l{i}.qk", f"l{i}.v"], axis=-1)
    nodes("Reshape", [f"l{i}.qk", "qk.rows"], [f"l{i}.qk.3d"])
    nodes("RotaryEmbedding", [f"l{i}.qk.3d", "position", "cos", "sin"], [f"l{i}.qk.r"], num_heads=at.n_heads + at.n_kv_heads, **ms)
    q = f"l{i}.q" if scaling is None else f"l{i}.q.raw"
    nodes("Split", [f"l{i}.qk.r", nodes.constant(f"l{i}.qk.sizes", [at.q_size, at.kv_size], np.int64)], [q, f"l{i}.k"], axis=-1)
    if scaling is not None:
        nodes("Mul", [q, scaling], [f"l{i}.q"])
    return tuple(nodes("Reshape", [f"l{i}.{t}", "row.shape"], [f"l{i}.{t}.rows"]) for t in ("k", "v"))  # (rows, Hkv, hd)


def _write(nodes: _Nodes, i: int, keys: str, values: str, outs: tuple[str, str] | None = None, slot: str = "slot") -> None:
    """A token's key and value rows (rows, Hkv, hd) written into layer i's cache buffers in place (ScatterND at
    `slot`, the cache's inputs and outputs bound to the same memory), as l{i}.keys.out and l{i}.values.out (or
    `outs`)."""
    for part, t, out in zip(("keys", "values"), (keys, values), outs or (f"l{i}.keys.out", f"l{i}.values.out")):
        nodes("ScatterND", [f"l{i}.{part}", slot, t], [out])


def _attend(nodes: _Nodes, i: int, at, q: str, out: str, mask: str = "mask", caches: tuple[str, str] | None = None) -> None:
    """The rotated, scaled queries q (rows, 1, q_size) against layer i's cache: each query against its KV head's keys
    (`_groups`; a head's keys read from memory once for its group, again from the core's cache), `mask` (0 where a
    row holds a key, -inf elsewhere; the step's, or a routed layer's own under `drop`), softmax, values (`caches`:
    the keys' and values' names, default the layer's cache outputs); out (rows, q_size). (onnxruntime's
    GroupQueryAttention, one node, was 0.82x as fast at 2,048 tokens of context as groups of G rows, 1.03x at 512;
    one-off, AMX Xeon.)"""
    keys, values = caches or (f"l{i}.keys.out", f"l{i}.values.out")
    nodes("Reshape", [q, "qk.shape"], [f"l{i}.q.groups"])  # (rows, Hkv, G, 1, hd)
    # alpha 1 (the scaling is in q): MLAS's one-row kernel takes only that
    nodes("FusedMatMul", [f"l{i}.q.groups", keys], [f"l{i}.scores"], transB=1, alpha=1.0, domain="com.microsoft")
    nodes("Add", [f"l{i}.scores", mask], [f"l{i}.masked"])
    nodes("Softmax", [f"l{i}.masked"], [f"l{i}.probs"], axis=-1)
    nodes("MatMul", [f"l{i}.probs", values], [f"l{i}.att.groups"])
    nodes("Reshape", [f"l{i}.att.groups", "att.shape"], [out])


def _decide(step: _Nodes, i: int, x: str, router) -> None:
    """Layer i's router on its normed input x: its raw logit l{i}.score (rows, 1) and l{i}.runs, whether the logit
    reaches the row's threshold (a raw logit, input threshold)."""
    from onnx import numpy_helper

    step.inits.append(numpy_helper.from_array(router.proj.weight.detach().float().numpy().T.copy(), f"l{i}.router"))  # (D, 1)
    step("MatMul", [x, f"l{i}.router"], [f"l{i}.score"])  # (rows, 1)
    step("GreaterOrEqual", [f"l{i}.score", "threshold"], [f"l{i}.runs"])  # (rows, 1)


def _any(step: _Nodes, i: int) -> None:
    """l{i}.any: whether any row runs layer i (the condition of its `If`)."""
    step("ReduceMax", [f"l{i}.runs"], [f"l{i}.any"], keepdims=0)


def _skipped(step: _Nodes, i: int, x: str) -> _Nodes:
    """The `If`'s else branch where no row runs layer i: its update l{i}.skipped, zeros shaped as x (rows, D)."""
    skips = _Nodes(step.inits)
    skips("Mul", [x, "zero"], [f"l{i}.skipped"])
    return skips


def _if(step: _Nodes, i: int, outs: list[str], runs: _Nodes, ran: list[str], skips: _Nodes, skipped: list[str]) -> None:
    """Layer i's `If` on l{i}.any: `outs` from the branch `runs` (its outputs `ran`) where some row runs the layer,
    else from `skips` (`skipped`)."""
    from onnx import TensorProto, helper

    def values(names: list[str]) -> list:
        return [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names]

    step("If", [f"l{i}.any"], outs, then_branch=helper.make_graph(runs.nodes, f"l{i}.runs", [], values(ran)),
         else_branch=helper.make_graph(skips.nodes, f"l{i}.skips", [], values(skipped)))


def _routed_attention(step: _Nodes, i: int, at, x: str, router, o_codes, skips: bool = True) -> str:
    """Layer i's attention under its router (the key and value are written before, either way): each row's raw logit
    (output l{i}.score; the calibration and the sigmoid are monotone, so the graph compares the logit with each row's
    threshold as a raw logit, input threshold, and the host computes the score from it), a row whose logit does not
    clear its threshold adding nothing. `skips` (`kv`): the attention and the output map under `If` any row's logit
    clears its threshold; else (`mask`) computed for every row. Returns the update's name."""
    _decide(step, i, x, router)
    if not skips:
        _attend(step, i, at, f"l{i}.q", f"l{i}.att")
        step.product(f"l{i}.attended", f"l{i}.att", o_codes)
        step("Where", [f"l{i}.runs", f"l{i}.attended", "zero"], [f"l{i}.o"])
        return f"l{i}.o"
    _any(step, i)
    # The branches' initializers (the output map's codes, constants) are the step graph's, which the branches read as
    # outer values: with initializers of its own, a branch ran measurably slower (one-off comparisons, not
    # kept; `make bench-step-graph`'s routing lines measure what routing costs).
    runs = _Nodes(step.inits)
    _attend(runs, i, at, f"l{i}.q", f"l{i}.att")
    runs.product(f"l{i}.attended", f"l{i}.att", o_codes)
    runs("Where", [f"l{i}.runs", f"l{i}.attended", "zero"], [f"l{i}.ran"])
    _if(step, i, [f"l{i}.o"], runs, [f"l{i}.ran"], _skipped(step, i, x), [f"l{i}.skipped"])
    return f"l{i}.o"


def _dropped_attention(step: _Nodes, i: int, at, x: str, router, qkv_codes, o_codes, scaling: str | None) -> str:
    """Layer i's attention under its router and `drop`: a row that skips writes nothing a later token reads (its
    entry in the layer's own mask stays -inf), and where no row runs the layer nothing of it is computed, its q|k|v
    product and the key's and value's writes included (under an `If`: the caches are its outputs, bound to the
    buffers of its inputs, so neither branch copies them). The key and value go to the layer's next entry (l{i}.slot)
    and the graph writes that entry in the layer's mask: 0 where the row runs the layer, -inf where it skips (a key
    written there for a row that skips while others run is then nobody's: the host counts the entry only where it is
    0, and the row's next token writes over it). With the q|k|v product outside the `If` (as under `kv`), a step that
    skips every routed cell saved a fifth less and one that never skips cost the same (a one-off comparison, not kept). Returns the
    update's name."""
    _decide(step, i, x, router)
    step("Where", [f"l{i}.runs", "zero", "absent"], [f"l{i}.held"])  # the token's entry in the layer's mask
    step("ScatterND", [f"l{i}.mask", f"l{i}.mslot", f"l{i}.held"], [f"l{i}.mask.out"])
    _any(step, i)
    runs = _Nodes(step.inits)
    written = (f"l{i}.keys.written", f"l{i}.values.written")
    _write(runs, i, *_rotate(runs, i, at, runs.product(f"l{i}.qkv", x, qkv_codes), scaling), outs=written, slot=f"l{i}.slot")
    _attend(runs, i, at, f"l{i}.q", f"l{i}.att", mask=f"l{i}.mask.out", caches=written)
    runs.product(f"l{i}.attended", f"l{i}.att", o_codes)
    runs("Where", [f"l{i}.runs", f"l{i}.attended", "zero"], [f"l{i}.ran"])
    skips = _skipped(step, i, x)
    kept = [skips("Identity", [f"l{i}.{part}"], [f"l{i}.{part}.kept"]) for part in ("keys", "values")]
    _if(step, i, [f"l{i}.o", f"l{i}.keys.out", f"l{i}.values.out"], runs, [f"l{i}.ran", *written], skips, [f"l{i}.skipped", *kept])
    return f"l{i}.o"


def bind(binding, name: str, t: torch.Tensor, output: bool = False) -> None:
    """Bind a CPU tensor (fp32 or int64) to a graph input or output by address: it must outlive the binding's runs."""
    dtype = np.float32 if t.dtype == torch.float32 else np.int64
    (binding.bind_output if output else binding.bind_input)(name, "cpu", 0, dtype, list(t.shape), t.data_ptr())


def copied(t: torch.Tensor) -> torch.Tensor:
    """A copy of a CPU tensor made by numpy on this thread. torch copies a tensor this size (the logits, above its
    grain of 32,768 elements) on its OpenMP workers, which then spin: with libgomp's own spin count (torch imported
    before routerlab, as a notebook may, so routerlab/spin.py came too late) they took a core from the graph's next
    run: a step took about 1.4 times as long after torch's clone of its logits (a one-off comparison, not kept)."""
    return torch.from_numpy(t.numpy().copy())


def _held(cache) -> torch.Tensor:
    """The positions a layer's cache (core/model/cache.LayerCache) holds, on the CPU (none yet: empty)."""
    return torch.zeros(0, dtype=torch.int64) if cache.pos is None else cache.pos[: cache.n].to(device="cpu", dtype=torch.int64)


class StepGraph:
    """The graph's session, and decode steps through it for a request alone: `load` takes a request's prefill caches
    into fp32 buffers of its own capacity (its prompt and the tokens it may add), bound to the session; `step(token)`
    runs one token at the next position and returns its logits (V,) in fp32, a view of a bound output (valid until
    the step after next: steps alternate between two output buffers, so a caller holds the last step's logits while
    the next one runs, with no copy); `twin` gives another request buffers of its own on the same session. A room's
    rows run through the same session with bindings of their own (core/graph/graph_rows.py). `max_positions`: the longest
    request (prompt and new tokens) it takes."""

    def __init__(self, an, max_positions: int, threads: int | None = None, routers=None, policy: str = "kv"):
        import onnxruntime as ort

        reason = why_not(an) or routing_why_not(routers, policy)
        if reason is not None:
            raise ValueError(f"no step graph for this model: {reason}")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads, options.inter_op_num_threads = threads or torch.get_num_threads(), 1
        # Its pool spins between a step's ~1,000 small nodes (waking a sleeping thread for each: 0.69x llama.cpp at 512
        # tokens against 0.92x spinning, docs/results.md) and stops spinning when a run ends, so torch's work between
        # steps (sampling, prefills, the quality meter) has the cores.
        options.add_session_config_entry("session.intra_op.allow_spinning", "1")
        options.add_session_config_entry("session.force_spinning_stop", "1")
        # Each node's outputs from malloc, not onnxruntime's arena (locked bins): about 1-2% faster a step (0.99-1.07x in
        # 13 comparisons in one process, 1 to 32 rows) and less memory held (one-off figures, not kept).
        options.enable_cpu_mem_arena = False
        # Under `kv`, the step in mask's form too (no `If`, the same numbers to the bit; core/graph/graph_forms.py), on the same buffers
        self.plain = (ort.InferenceSession(build(an, max_positions, routers, "mask"), options, providers=["CPUExecutionProvider"])
                      if routers is not None and policy == "kv" else None)
        self.session = ort.InferenceSession(build(an, max_positions, routers, policy), options, providers=["CPUExecutionProvider"])
        self.sessions = (self.session,) if self.plain is None else (self.session, self.plain)
        self.max_positions, self.capacity, self.n = max_positions, 0, 0
        self.embed, self.layers, self.kv_shape = an.embed, an.n_layers, (an.layers[0].attn.n_kv_heads, an.layers[0].attn.head_dim)
        with torch.inference_mode(False):  # written in place in and out of inference mode
            self.h = torch.zeros(1, an.config.hidden_size)
            self.outs = (torch.empty(1, an.config.vocab_size), torch.empty(1, an.config.vocab_size))  # even, odd steps
            self.where = torch.zeros(1, 1, dtype=torch.int64)  # the token's position (rotary)
            self.slot = torch.tensor([[[0, h, 0, 0] for h in range(self.kv_shape[0])]], dtype=torch.int64)  # its cache entry, each KV head
            self.threshold = torch.full((1, 1), 0.5)
            self.logits_of_routers = torch.full((an.n_layers,), math.nan)  # the token's routers' raw logits (NaN: not routed)
        self._sample = self.logits_of_routers.numpy()[:, None]  # a numpy view of them, (layers, 1): graph_forms.History
        self._raw = (0.0,)
        self.routed = [i for i in range(an.n_layers) if routers is not None and routers.get(i) is not None]
        self.policy = policy
        self.dropped = self.routed if policy == "drop" else []  # layers with entries of their own: a skipped token is not there
        self.own: dict[int, OwnEntries] = {}
        self.calibration = routers.calibration if routers is not None else None
        self.caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.mask = torch.empty(0)
        self.binding: tuple = ()  # bindings a buffer of `outs` (one a session), the same inputs and caches
        self.bindings: dict = {}  # a room's slots -> their binding (core/graph/graph_rows.py)
        self.history = graph_forms.History(self.layers)  # the request's last steps' router logits (its form's choice)
        self.costs = None  # what the branching form costs and saves on this machine (graph_forms.measure), under `kv`
        self.form = None  # a form every step takes (benchmarks' comparisons); None: the one that pays
        if self.plain is not None:
            self.costs = graph_forms.measure(self)
            log.info("step graph under kv: %s", self.costs.describe())

    def twin(self) -> StepGraph:
        """The same session with buffers of its own for a request alone (`load`, `step`, `store`): another request
        decodes through one graph at the same time."""
        import copy

        twin = copy.copy(self)
        with torch.inference_mode(False):
            twin.h, twin.where = torch.zeros_like(self.h), torch.zeros_like(self.where)
            twin.outs = tuple(torch.empty_like(t) for t in self.outs)
            twin.slot, twin.threshold = self.slot.clone(), self.threshold.clone()
            twin.logits_of_routers = self.logits_of_routers.clone()
            twin._sample = twin.logits_of_routers.numpy()[:, None]
        twin.caches, twin.own, twin.binding, twin.capacity, twin.n = [], {}, (), 0, 0
        twin.history = graph_forms.History(self.layers)
        return twin

    def fill(self, context: int, new_tokens: int) -> None:
        """Buffers of `context` tokens (zero keys and values) and `new_tokens` more: a stand-in for graph_forms.measure."""
        self._bind(context + new_tokens + 1, {})
        self.mask[..., :context] = 0
        self.n = self.loaded = context
        self._threshold = None

    def _bind(self, capacity: int, entries: dict[int, int]) -> None:
        """Buffers of `capacity` tokens (keys and values of every layer, the mask; a multiple of ALIGN entries),
        bound as inputs and outputs; `entries`: the entries each routed layer under `drop` holds."""
        heads, dim = self.kv_shape
        self.capacity, capacity = capacity, -(-capacity // ALIGN) * ALIGN
        with torch.inference_mode(False):
            self.mask = torch.full((1, 1, 1, 1, capacity), -math.inf)  # 0 where the cache holds a token
            self.caches = [(torch.zeros(1, heads, capacity, dim, dtype=CACHE), torch.zeros(1, heads, capacity, dim, dtype=CACHE))
                           for _ in range(self.layers)]
        self.own = {i: OwnEntries(heads, capacity, entries[i]) for i in self.dropped}
        self.binding = tuple(self._binding(out) for out in self.outs)

    def _binding(self, logits: torch.Tensor) -> tuple:
        """Bindings of this request's buffers, its logits to `logits`: one a session (the forms share the buffers)."""
        return tuple(self._bound(session, logits) for session in self.sessions)

    def _bound(self, session, logits: torch.Tensor):
        b = session.io_binding()
        bound = [("h", self.h), ("position", self.where), ("slot", self.slot), ("mask", self.mask)]
        for name, t in bound + ([("threshold", self.threshold)] if self.routed else []):
            bind(b, name, t)
        for i in self.routed:
            bind(b, f"l{i}.score", self.logits_of_routers[i : i + 1].view(1, 1), output=True)
        for i, own in self.own.items():
            for name, t in (("slot", own.slot), ("mslot", own.mslot), ("mask", own.mask)):
                bind(b, f"l{i}.{name}", t)
            bind(b, f"l{i}.mask.out", own.mask, output=True)
        bind(b, "logits", logits, output=True)
        for i, pair in enumerate(self.caches):
            for kind, t in zip(("keys", "values"), pair):
                bind(b, f"l{i}.{kind}", t.unsqueeze(2))  # (1, Hkv, 1, capacity, hd), as the graph reads it
                bind(b, f"l{i}.{kind}.out", t.unsqueeze(2), output=True)
        return b

    def load(self, caches, new_tokens: int, threshold: float = 0.5, tokens: int | None = None) -> None:
        """Take over the engine's KV caches (core/model/cache.LayerCache, one per layer) after its prefill of `tokens`
        tokens (default: what the first layer holds), with room for `new_tokens` more: every layer holds positions
        0..n-1 (the full model, `kv` and `mask` write every token at every layer), but for a routed layer under
        `drop`, which holds the positions that ran it. `threshold`: where a routed layer's score runs its attention
        (routers given)."""
        n = caches[0].n if tokens is None else tokens
        if n + new_tokens > self.max_positions:
            raise ValueError(f"{n} tokens and {new_tokens} new ones do not fit a step graph of {self.max_positions}")
        every = torch.arange(n)
        for i, cache in enumerate(caches):
            held = _held(cache)
            if i in self.dropped and not bool((held < n).all()):
                raise ValueError(f"layer {i}'s cache holds positions beyond the {n} tokens read")
            if i not in self.dropped and not torch.equal(held, every):
                raise ValueError("the step graph takes caches that hold every position from 0 (a full-model prefill)")
        self._bind(n + new_tokens, {i: caches[i].n for i in self.dropped})
        for cache, (keys, values) in zip(caches, self.caches):
            if cache.n:  # a routed layer under `drop` holds its first cache.n entries, each token's key rotated at its position
                keys[:, :, : cache.n], values[:, :, : cache.n] = cache.k[:, :, : cache.n], cache.v[:, :, : cache.n]
        self.mask[..., :n] = 0
        self._threshold = None
        self.set_threshold(threshold)  # as the raw logit where the calibrated score reaches it
        self.n = self.loaded = n
        self.history = graph_forms.History(self.layers)

    def set_threshold(self, threshold: float) -> None:
        """The threshold in force from the next step (a live slider): its raw logit, where routers are in the graph."""
        if self.calibration is not None and threshold != self._threshold:
            raw = self.raw_threshold(threshold)
            self.threshold.fill_(raw)
            self._raw = (raw,)  # what the form's choice compares (graph_forms.History)
        self._threshold = threshold

    def raw_threshold(self, threshold: float) -> float:
        """A threshold as the raw logit a router's output is compared with in the graph (the calibrated score reaches
        `threshold` there)."""
        raw = self.calibration.raw_threshold(threshold)
        return -math.inf if raw <= 0.0 else math.inf if raw >= 1.0 else logit(raw)

    def score_row(self) -> list[float]:
        """The last token's scores as the engine's forward returns a decode step's: one float per layer, NaN where a
        layer is not routed."""
        row = [math.nan] * self.layers
        for i, s in self.scores().items():
            row[i] = s
        return row

    def store(self, caches) -> None:
        """Give the rows decoded since `load` back to the engine's caches (core/model/cache.LayerCache, in their dtype), so
        they hold what the request wrote, as if the engine had decoded it."""
        first, n = self.loaded, self.n
        if n > first:
            every = torch.arange(first, n)
            with torch.inference_mode():  # the engine's caches are inference tensors
                for i, (cache, (keys, values)) in enumerate(zip(caches, self.caches)):
                    own = self.own.get(i)
                    if own is None:
                        cache.append(keys[:, :, first:n].to(cache.dtype), values[:, :, first:n].to(cache.dtype), every)
                    elif own.ran:  # under `drop`: the entries of the tokens that ran layer i, at their positions
                        a, b = own.first, own.n
                        cache.append(keys[:, :, a:b].to(cache.dtype), values[:, :, a:b].to(cache.dtype), torch.tensor(own.ran))

    def scores(self) -> dict[int, float]:
        """The last token's calibrated router scores, routed layer -> score, as the engine's traces hold them."""
        raw = self.logits_of_routers.numpy()  # a numpy view: torch's indexing takes microseconds a layer
        return {i: self.score(float(raw[i])) for i in self.routed}

    def score(self, raw: float) -> float:
        """A router's raw logit as the calibrated score the engine's traces hold."""
        c = self.calibration
        return sigmoid(c.scale * raw + c.shift)

    def step(self, token: int) -> torch.Tensor:
        """Token `token` at position `n` through every layer: its logits (V,) in fp32. Under `kv`, through the form
        that pays where the request's routers are now (core/graph/graph_forms.py): the same numbers either way."""
        if self.plain is None:
            return self.run(token)
        out = self.run(token, self.history.choose(self.costs, self._raw, self.n) if self.form is None else self.form)
        self.history.after(self._sample)
        return out

    def run(self, token: int, form: int = graph_forms.BRANCH, advance: bool = True) -> torch.Tensor:
        """`step` through the session of `form`; `advance` False: the position stays (a measurement's steps)."""
        if self.n >= self.capacity:
            raise ValueError(f"the step graph holds {self.capacity} tokens for this request")
        self.h.copy_(self.embed.weight[token])
        self.where.fill_(self.n)
        self.slot[..., 3] = self.n
        self.mask[..., self.n] = 0
        which = self.n % 2
        self.sessions[form].run_with_iobinding(self.binding[which][form])
        if advance:
            for own in self.own.values():
                own.count(self.n)
            self.n += 1
        return self.outs[which].view(-1)
