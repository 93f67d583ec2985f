"""Weight formats: GGUF blocks read as the file means them, packed products equal to their dense weight,
requantisation bounded, and the engine deciding the same on every weight path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from routerlab.core.base.config import GenerateConfig, RoutingConfig
from routerlab.core.decode.engine import Engine
from routerlab.core.kernels.weights import FEW_ROWS, Codes, LowBitPlan, Weight, int4_packable, quantize_int4, quantize_int8, read_q4_1, read_q8_0
from routerlab.core.model.models import _unpermute_order, read_gguf_codes, tiny_model
from routerlab.core.ops.forward import forward
from routerlab.core.routing.gates import Plan
from routerlab.core.routing.router import RouterSet


def _q4_1_row(d: list[float], m: list[float], codes: np.ndarray) -> np.ndarray:
    """One GGUF Q4_1 row, written as llama.cpp writes it: per block fp16 d, fp16 m, then 16 bytes whose
    low nibbles are weights 0-15 and high nibbles weights 16-31."""
    out = []
    for b in range(len(d)):
        c = codes[32 * b : 32 * b + 32].astype(np.uint8)
        out += [np.array([d[b], m[b]], dtype=np.float16).view(np.uint8), c[:16] | (c[16:] << 4)]
    return np.concatenate(out)


def test_q4_1_blocks_read_as_code_times_scale_plus_minimum():
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, 64)
    raw = np.stack([_q4_1_row([0.5, 0.25], [-1.0, 2.0], codes)])  # (1, 2 blocks * 20 bytes)
    c = read_q4_1(raw)
    expected = np.concatenate([codes[:32] * 0.5 - 1.0, codes[32:] * 0.25 + 2.0])
    assert c.codes.tolist() == [codes.tolist()]
    np.testing.assert_array_equal(c.dequantize().numpy()[0], expected.astype(np.float32))


def test_q8_0_split_into_two_four_bit_halves_is_exact():
    rng = np.random.default_rng(1)
    q = rng.integers(-128, 128, (16, 64)).astype(np.int8)
    d = rng.uniform(0.001, 0.01, (16, 2)).astype(np.float16)
    raw = np.concatenate([np.concatenate([d[:, b : b + 1].view(np.uint8), q[:, 32 * b : 32 * b + 32].view(np.uint8)], axis=1)
                          for b in range(2)], axis=1)  # (16, 2 blocks * 34 bytes)
    c = read_q8_0(raw)
    assert c.tiles == 2 and c.shape == (16, 64) and int(c.codes.max()) <= 15
    expected = q.astype(np.float32) * np.repeat(d.astype(np.float32), 32, axis=1)
    np.testing.assert_array_equal(c.dequantize().numpy(), expected)


@pytest.mark.parametrize("tiles", [1, 2])
def test_packed_int4_product_matches_its_dequantised_weight(tiles):
    torch.manual_seed(0)
    n, k = 48, 128
    codes = Codes(torch.randint(0, 16, (n, tiles * k), dtype=torch.uint8), torch.rand(n, tiles * k // 32) * 0.01 + 0.001,
                  torch.randn(n, tiles * k // 32) * 0.02, 32, tiles)
    x = torch.randn(3, k)
    y = codes.pack().mm(x).float()
    reference = x.bfloat16().float() @ codes.dequantize().T  # the kernel takes bf16 activations
    assert torch.allclose(y, reference, rtol=0.02, atol=0.02 * reference.abs().max().item())


def test_requantised_int4_is_within_half_a_step_and_int8_within_half_a_step_per_channel():
    torch.manual_seed(0)
    w = torch.randn(32, 64)
    c = quantize_int4(w, 32)
    step = c.scale.repeat_interleave(32, dim=1)
    assert ((c.dequantize() - w).abs() <= step / 2 + 1e-6).all()
    q8 = quantize_int8(w)
    assert ((q8.codes.float() * q8.scales.float()[:, None] - w).abs() <= q8.scales.float()[:, None] * 0.51).all()


def test_shapes_the_int4_kernel_cannot_take_keep_their_dense_weight():
    assert int4_packable(16, 64, 32) and not int4_packable(8, 64, 32) and not int4_packable(16, 48, 32)
    assert LowBitPlan("int4").low(["w"], torch.randn(8, 64)) is None


def test_a_weight_uses_its_low_bit_copy_only_for_few_rows():
    torch.manual_seed(0)
    dense = torch.randn(32, 64)
    low = quantize_int4(dense).pack()
    w = Weight(dense, torch.zeros(32), low)
    few, many = torch.randn(1, FEW_ROWS, 64), torch.randn(1, FEW_ROWS + 1, 64)
    assert torch.equal(w(few), low.mm(few[0]).float()[None]), "few rows: the low-bit product"
    assert torch.equal(w(many), torch.nn.functional.linear(many, dense)), "more rows: the dense weight"


def test_unpermute_order_undoes_llama_cpp_row_interleave():
    rows, heads = 12, 2  # llama.cpp's converter: w.reshape(heads, 2, rows // heads // 2, ...).swapaxes(1, 2)
    w = torch.arange(rows)
    permuted = w.reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(-1)
    assert torch.equal(permuted[_unpermute_order(rows, heads)], w)


@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_kv_policy_matches_mask_on_low_bit_weights(fmt):
    model = tiny_model("llama")
    engine = Engine(model, lowbit=LowBitPlan(fmt))
    assert engine.anatomy.layers[0].attn.qkv.low is not None and fmt in engine.weights
    routers = RouterSet.zeros(model, RoutingConfig.from_granularity("attention-token", (1, 2)))
    with torch.no_grad():
        for layer in (1, 2):
            routers.get(layer).proj.weight.normal_(0, 0.5)
    ids = [(5 * i + 3) % 128 for i in range(12)]
    runs = {}
    for policy in ("mask", "kv"):
        config = GenerateConfig(max_new_tokens=10, threshold=0.5, kv_policy=policy, ignore_eos=True, quality=False)
        steps = list(engine.generate_ids(ids, routers, config))
        runs[policy] = ([s.token_id for s in steps], [s.executed for s in steps])
    assert runs["mask"] == runs["kv"]
    assert any(e is False for row in runs["kv"][1] for e in row), "some cells were skipped"


def test_low_bit_decode_steps_match_the_dense_weights_they_stand_for():
    """Teacher-forced decode logits of the int4 path against the dense path holding the codes' own
    weights: only the kernel's bf16 rounding differs."""
    model = tiny_model("llama").to(torch.bfloat16)
    dense = Engine(model)
    for layer in dense.anatomy.layers:  # the dense weights become the ones the codes stand for
        for w in (layer.attn.qkv, layer.attn.o, layer.gate_up, layer.down):
            w.dense.copy_(quantize_int4(w.dense).dequantize())
    dense.anatomy.head.dense.copy_(quantize_int4(dense.anatomy.head.dense).dequantize())
    low = Engine(model, lowbit=LowBitPlan("int4"))
    ids = [(7 * i + 1) % 128 for i in range(16)]
    logits = []
    with torch.inference_mode():
        for engine in (dense, low):
            caches, rows = engine.new_caches(len(ids)), []
            forward(engine.anatomy, torch.tensor([ids[:8]]), torch.arange(8), caches, Plan(None))
            for p in range(8, len(ids)):  # one token at a time: the low-bit products
                out, _ = forward(engine.anatomy, torch.tensor([[ids[p]]]), torch.tensor([p]), caches, Plan(None))
                rows.append(out[0, -1].float())
            logits.append(torch.stack(rows))
    scale = logits[0].abs().max()
    assert (logits[0] - logits[1]).abs().max() <= 0.05 * scale
    assert (logits[0].argmax(-1) == logits[1].argmax(-1)).float().mean() >= 0.75


def test_embedded_codes_dequantise_to_transformers_weights_exactly(embedded):
    from routerlab.core.model.models import embedded_gguf_path

    model = embedded.model
    codes = read_gguf_codes(embedded_gguf_path(), model.config)
    layer = model.model.layers[5]
    for name, module in [("q_proj", layer.self_attn.q_proj), ("k_proj", layer.self_attn.k_proj),
                         ("v_proj", layer.self_attn.v_proj), ("o_proj", layer.self_attn.o_proj)]:
        w = codes[f"model.layers.5.self_attn.{name}.weight"].dequantize()
        assert torch.equal(w.to(module.weight.dtype), module.weight), name
    head = codes["lm_head.weight"].dequantize()[:256]
    assert torch.equal(head.to(model.lm_head.weight.dtype), model.lm_head.weight[:256])
    assert embedded.lowbit is not None and "Q4_1" in embedded.lowbit.label
