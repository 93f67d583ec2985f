"""A whole decode step of the model as one onnxruntime graph on a GGUF file's own codes (issue 51): every layer's
norms, products (`MatMulNBits`, core/nbits.py), rotary, attention with its KV cache and residual adds, then the head,
in one `run`, so no tensor op a step is dispatched from Python.

Why: the engine's step is torch ops called from Python, ~20 a layer besides the products, each a few microseconds of
dispatch (more inside a step, as every layer's weights stream through the caches). On a 2-core Xeon with AMX
(2026-12-06, `python -m routerlab.bench.step_graph`), the products, attention and head alone are ~1.1x llama.cpp's
whole step, and the engine's other ops bring it to ~0.7x; this graph decodes as fast as llama.cpp on the same file.

What it is today: the full model (no routers), one request, after the engine's own prefill (`load` copies the
prefill's KV cache in). Its activations are fp32 (the products quantise them to 8 bits per block of 32, as llama.cpp
does) where the engine's are bf16, so its logits differ from the engine's by that rounding (tested: the same greedy
tokens where the top two are not a near tie). Routing inside it (a router's score in the graph, the sub-layer under
an `If`) is the next step; until then the engine does not decode through it.

Covers Llama-family anatomies whose every map has the file's codes (the embedded SmolLM2): `why_not` says what else
keeps it off. Knows nothing about routers, sampling or the UI.
"""

from __future__ import annotations

import numpy as np
import torch

from routerlab.core import nbits


def why_not(engine) -> str | None:
    """Why `engine`'s model cannot decode through a step graph, or None where it can."""
    an = engine.anatomy
    if not nbits.available():
        return "onnxruntime is not installed"
    if an.lowbit is None or an.lowbit.codes is None:
        return "no file codes (the graph multiplies a GGUF file's own codes)"
    if an.family != "llama":
        return f"a {an.family} model (the graph covers the Llama family)"
    rope = _rope(an.config)
    if rope.get("rope_type", "default") != "default":
        return f"{rope.get('rope_type')} rotary scaling"
    names = [_head_name(an.lowbit.codes)] + [n for i in range(an.n_layers) for n in _layer_names(i)]
    missing = [n for n in names if n is None or n not in an.lowbit.codes]
    return f"no file codes for {len(missing)} maps" if missing else None


def _rope(config) -> dict:
    return getattr(config, "rope_parameters", None) or {"rope_theta": config.rope_theta, "rope_type": "default"}


def _head_name(codes) -> str | None:
    return next((n for n in ("lm_head.weight", "model.embed_tokens.weight") if n in codes), None)


def _layer_names(i: int) -> list[str]:
    pre = f"model.layers.{i}"
    return [f"{pre}.self_attn.{x}_proj.weight" for x in "qkvo"] + [f"{pre}.mlp.{x}_proj.weight" for x in ("gate", "up", "down")]


def build(engine, capacity: int) -> bytes:
    """The step graph as an ONNX model: inputs h (1, 1, D) fp32, seqlens_k (1,) int32 (the new token's position),
    total_len () int32 and each layer's keys and values (1, Hkv, capacity, hd) fp32; outputs the logits (1, 1, V) and
    the caches again (bound to the same buffers: GroupQueryAttention writes the new token's key and value in place)."""
    from onnx import TensorProto, helper, numpy_helper

    from routerlab.core.weights import Codes

    an, params = engine.anatomy, dict(engine.model.named_parameters())
    codes, cfg = an.lowbit.codes, an.config
    a = an.layers[0].attn
    d, inner, eps = cfg.hidden_size, cfg.intermediate_size, float(cfg.rms_norm_eps)
    nodes, inits, sums = [], [], {}

    def product(name: str, x: str, c) -> str:
        more_nodes, more_inits = nbits.product_nodes(c, x, name, prefix=name + ".", sums=sums, one_row=True)
        nodes.extend(more_nodes)
        inits.extend(more_inits)
        return name

    def weight(name: str) -> str:
        inits.append(numpy_helper.from_array(params[name].detach().float().numpy(), name))
        return name

    def constant(name: str, values, dtype) -> str:
        inits.append(numpy_helper.from_array(np.array(values, dtype), name))
        return name

    def node(op: str, ins: list[str], outs: list[str], **kw):
        nodes.append(helper.make_node(op, ins, outs, **kw))

    inv = 1.0 / (float(_rope(cfg)["rope_theta"]) ** (np.arange(0, a.head_dim, 2, dtype=np.float64) / a.head_dim))
    angles = np.arange(capacity)[:, None] * inv[None]  # (capacity, hd / 2)
    inits += [numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"), numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin")]
    cache = [1, a.n_kv_heads, capacity, a.head_dim]
    inputs = [helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 1, d]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("total_len", TensorProto.INT32, [])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1, cfg.vocab_size])]
    ms = {"domain": "com.microsoft", "epsilon": eps}
    residual, update = "h", None  # the residual stream, and the update a SkipSimplifiedLayerNormalization adds to it
    for i in range(an.n_layers):
        pre, at = f"model.layers.{i}", an.layers[i].attn
        names = _layer_names(i)
        x = f"l{i}.x"
        if update is None:
            node("SimplifiedLayerNormalization", [residual, weight(f"{pre}.input_layernorm.weight")], [x], axis=-1, epsilon=eps)
        else:  # the last MLP's update added to the stream, and the sum normed, in one op
            node("SkipSimplifiedLayerNormalization", [update, residual, weight(f"{pre}.input_layernorm.weight")], [x, "", "", f"l{i}.h"], **ms)
            residual = f"l{i}.h"
        qkv = product(f"l{i}.qkv", x, Codes.cat([codes[n] for n in names[:3]]))
        node("Split", [qkv, constant(f"l{i}.qkv.sizes", [at.q_size, at.kv_size, at.kv_size], np.int64)], [f"l{i}.q", f"l{i}.k", f"l{i}.v"], axis=-1)
        for kind in ("keys", "values"):
            inputs.append(helper.make_tensor_value_info(f"l{i}.{kind}", TensorProto.FLOAT, cache))
            outputs.append(helper.make_tensor_value_info(f"l{i}.{kind}.out", TensorProto.FLOAT, cache))
        node("GroupQueryAttention", [f"l{i}.q", f"l{i}.k", f"l{i}.v", f"l{i}.keys", f"l{i}.values", "seqlens_k", "total_len", "cos", "sin"],
             [f"l{i}.att", f"l{i}.keys.out", f"l{i}.values.out"], domain="com.microsoft", num_heads=at.n_heads,
             kv_num_heads=at.n_kv_heads, scale=float(at.scaling), do_rotary=1)
        o = product(f"l{i}.o", f"l{i}.att", codes[names[3]])
        x = f"l{i}.xm"
        node("SkipSimplifiedLayerNormalization", [o, residual, weight(f"{pre}.post_attention_layernorm.weight")], [x, "", "", f"l{i}.hm"], **ms)
        residual = f"l{i}.hm"
        gate_up = product(f"l{i}.gate_up", x, Codes.cat([codes[names[4]], codes[names[5]]]))
        node("Split", [gate_up, constant(f"l{i}.gate_up.sizes", [inner, inner], np.int64)], [f"l{i}.gate", f"l{i}.up"], axis=-1)
        node("Sigmoid", [f"l{i}.gate"], [f"l{i}.sigmoid"])
        node("Mul", [f"l{i}.gate", f"l{i}.sigmoid"], [f"l{i}.silu"])
        node("Mul", [f"l{i}.silu", f"l{i}.up"], [f"l{i}.act"])
        update = product(f"l{i}.down", f"l{i}.act", codes[names[6]])
    node("SkipSimplifiedLayerNormalization", [update, residual, weight("model.norm.weight")], ["final", "", "", "final.h"], **ms)
    product("logits", "final", codes[_head_name(codes)])
    graph = helper.make_graph(nodes, "decode_step", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=nbits.opsets()).SerializeToString()


class StepGraph:
    """One request's decode steps through the graph: its KV cache in fp32 buffers of `capacity` tokens, bound once.

    `load` takes the engine's prefill caches; `step(token)` runs one token at the next position and returns its
    logits (V,) in fp32, a view of the bound output (valid until the next step)."""

    def __init__(self, engine, capacity: int, threads: int | None = None):
        import onnxruntime as ort

        reason = why_not(engine)
        if reason is not None:
            raise ValueError(f"no step graph for this model: {reason}")
        an = engine.anatomy
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads, options.inter_op_num_threads = threads or torch.get_num_threads(), 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # torch's pool shares the cores
        self.session = ort.InferenceSession(build(engine, capacity), options, providers=["CPUExecutionProvider"])
        self.capacity, self.n, self.embed = capacity, 0, an.embed
        a = an.layers[0].attn
        with torch.inference_mode(False):  # written in place in and out of inference mode
            self.h = torch.zeros(1, 1, an.config.hidden_size)
            self.logits = torch.empty(1, 1, an.config.vocab_size)
            self.position = torch.zeros(1, dtype=torch.int32)
            self.total = torch.zeros((), dtype=torch.int32)
            self.caches = [(torch.zeros(1, a.n_kv_heads, capacity, a.head_dim), torch.zeros(1, a.n_kv_heads, capacity, a.head_dim))
                           for _ in range(an.n_layers)]
        b = self.binding = self.session.io_binding()
        for name, t in (("h", self.h), ("seqlens_k", self.position), ("total_len", self.total)):
            b.bind_input(name, "cpu", 0, np.float32 if t.dtype == torch.float32 else np.int32, list(t.shape), t.data_ptr())
        b.bind_output("logits", "cpu", 0, np.float32, list(self.logits.shape), self.logits.data_ptr())
        for i, pair in enumerate(self.caches):
            for kind, t in zip(("keys", "values"), pair):
                b.bind_input(f"l{i}.{kind}", "cpu", 0, np.float32, list(t.shape), t.data_ptr())
                b.bind_output(f"l{i}.{kind}.out", "cpu", 0, np.float32, list(t.shape), t.data_ptr())

    def load(self, caches) -> None:
        """Take over the engine's KV caches (core/cache.LayerCache, one per layer) after its prefill: every layer holds
        the same positions 0..n-1 (the full model writes every token at every layer)."""
        n = caches[0].n
        if n > self.capacity:
            raise ValueError(f"a cache of {n} tokens does not fit a step graph of {self.capacity}")
        for cache, (keys, values) in zip(caches, self.caches):
            if cache.n != n or not torch.equal(cache.pos[:n].cpu(), torch.arange(n)):
                raise ValueError("the step graph takes caches that hold every position from 0 (a full-model prefill)")
            keys[:, :, :n] = cache.k[:, :, :n]
            values[:, :, :n] = cache.v[:, :, :n]
        self.n = n

    def step(self, token: int) -> torch.Tensor:
        """Token `token` at position `n` through every layer: its logits (V,) in fp32."""
        if self.n >= self.capacity:
            raise ValueError(f"the step graph holds {self.capacity} tokens")
        self.h.copy_(self.embed.weight[token])
        self.position.fill_(self.n)
        self.total.fill_(self.n + 1)
        self.session.run_with_iobinding(self.binding)
        self.n += 1
        return self.logits.view(-1)

