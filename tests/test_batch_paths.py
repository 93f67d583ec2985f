"""Which product a decode batch's maps take (core/kernels/batch_paths.py): the crossing point read from measured times, the
fp32 copies given only where chosen (q and kv as views of their fused map's), and a batch computing the same either way."""

from __future__ import annotations

import torch

from routerlab.core.base.config import GenerateConfig
from routerlab.core.decode.engine import Control, Engine
from routerlab.core.decode.generation import Generation
from routerlab.core.kernels import batch_paths
from routerlab.core.kernels.weights import LowBitPlan
from routerlab.core.model.models import tiny_model
from routerlab.core.records.trace import Trace


def test_the_crossing_is_the_fewest_rows_from_which_the_copy_always_wins():
    ms = 1e-3
    assert batch_paths.crossing({2: (1 * ms, 2 * ms), 8: (4 * ms, 3 * ms), 32: (9 * ms, 5 * ms)}) == 8
    # a win at 8 that is lost at 16 does not count: from 32 only
    assert batch_paths.crossing({8: (4 * ms, 3 * ms), 16: (5 * ms, 6 * ms), 32: (9 * ms, 5 * ms)}) == 32
    assert batch_paths.crossing({8: (4 * ms, 3 * ms), 32: (9 * ms, 9.5 * ms)}) is None
    assert batch_paths.crossing({32: (10 * ms, 9.5 * ms)}) is None  # within the margin: not worth the memory


def _engine():
    return Engine(tiny_model("llama"), lowbit=LowBitPlan("int4"))


def test_apply_gives_copies_only_to_the_kinds_chosen_and_q_kv_share_their_fused_copy():
    an = _engine().anatomy
    batch_paths.apply(an, {"head": 4, "qkv": 8, "q": 8, "kv": 8, "o": None, "gate_up": None, "down": None})
    a = an.layers[0].attn
    assert an.head.wide_from == 4 and an.head.wide.dtype == torch.float32
    assert a.o.wide is None and an.layers[0].gate_up.wide is None
    assert a.kv.wide.data_ptr() == a.qkv.wide[a.q_size :].data_ptr()  # a view: no memory of its own
    torch.testing.assert_close(a.qkv.wide, a.qkv.dense.float())
    batch_paths.apply(an, {})
    assert an.head.wide is None and a.qkv.wide is None


def test_a_map_reads_its_copy_from_its_crossing_point_on():
    an = _engine().anatomy
    w = an.layers[0].gate_up
    x = torch.randn(8, w.dense.shape[1])
    low = w.batch(x)
    batch_paths.apply(an, {"gate_up": 8})
    wide = w.batch(x)
    torch.testing.assert_close(wide, torch.nn.functional.linear(x, w.dense))  # the dense weight's own product
    assert not torch.equal(wide, low)  # ... not the int4 kernel's (its bf16 input rounds differently)
    assert torch.equal(w.batch(x[:4]), low[:4])  # fewer rows than the crossing: the low-bit copy still


def test_tune_measures_every_kind_and_a_batch_still_decodes_the_same_tokens():
    engine = _engine()
    summary = batch_paths.tune(engine.anatomy, sizes=(2, 4), rounds=1)
    assert set(summary["wide_from"]) == {"head", "qkv", "q", "kv", "o", "gate_up", "down"}
    assert set(summary["step_products"]) == {2, 4}
    line = batch_paths.describe(summary)
    assert ("dense weights where they measured faster" in line) == any(v is not None for v in summary["wide_from"].values())
    batch_paths.apply(engine.anatomy, {k: 2 for k in summary["wide_from"]})  # every kind on its fp32 copy from 2 rows

    def rows():
        out = []
        for k in range(3):
            config = GenerateConfig(max_new_tokens=4, ignore_eos=True)
            control = Control(0.5)
            gen = Generation(engine, [5 + k, 17, 42], None, config, control, Trace(engine.n_layers, meta={"costs": engine.costs(None)}))
            gen.prefill()
            gen.begin()
            out.append(gen)
        return out

    with torch.inference_mode():
        wide, _ = engine.runtime.step(rows())
        batch_paths.apply(engine.anatomy, {})
        low, _ = engine.runtime.step(rows())
    assert wide.argmax(-1).tolist() == low.argmax(-1).tolist()
    torch.testing.assert_close(wide, low, atol=0.05, rtol=0.05)  # int4 kernel (bf16 input) against fp32: close, not equal


def test_the_dense_weight_in_its_own_dtype_is_a_candidate_and_costs_no_copy():
    engine = Engine(tiny_model("llama").to(torch.bfloat16), lowbit=LowBitPlan("int4"))
    an = engine.anatomy
    times = batch_paths.measure(an, sizes=(2, 4), rounds=1)
    assert all(len(t) == 3 for kind in times.values() for t in kind.values())  # low-bit, fp32 copy, bf16 weight
    ms = 1e-3
    assert batch_paths.which_dense({4: (5 * ms, 4 * ms, 3 * ms)}) == batch_paths.DENSE
    assert batch_paths.which_dense({4: (5 * ms, 3 * ms, 4 * ms)}) == "fp32"
    assert batch_paths.dense_times({4: (5 * ms, 4 * ms, 3 * ms)}, batch_paths.DENSE) == {4: (5 * ms, 3 * ms)}
    batch_paths.apply(an, {"gate_up": 4, "head": 4}, own={"gate_up"})
    w = an.layers[0].gate_up
    assert w.wide is w.dense and an.head.wide.dtype == torch.float32  # no copy for gate_up; an fp32 copy for the head
    x = torch.randn(4, w.dense.shape[1]).to(torch.bfloat16)
    torch.testing.assert_close(w.batch(x), torch.nn.functional.linear(x, w.dense))  # the bf16 weight's own product
    assert w(x[None]).dtype == torch.bfloat16  # a long input's product never mistakes the weight for an fp32 copy
    summary = batch_paths.tune(an, sizes=(2, 4), rounds=1)
    assert set(summary["wide_dtype"]) == {k for k, v in summary["wide_from"].items() if v is not None}
    assert set(summary["wide_dtype"].values()) <= {"bfloat16", "float32"}
