"""bench kernels (routerlab/bench/products/kernels.py): every candidate product is timed and its error measured, on a tiny model."""

from __future__ import annotations

import pytest

from routerlab.bench.products import kernels
from routerlab.core.decode.engine import Engine
from routerlab.core.kernels.weights import LowBitPlan
from routerlab.core.model.models import tiny_model


@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_every_candidate_is_timed_and_its_error_measured(fmt):
    engine = Engine(tiny_model("llama", hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2),
                    lowbit=LowBitPlan(fmt))
    result = kernels.measure(engine, rows=(1, 4), rounds=1, log=lambda _: None)
    assert set(result["kinds"]) == {"qkv", "o", "gate_up", "down", "head"}
    for kind in result["kinds"].values():
        for n in (1, 4):
            row = kind["by_rows"][n]
            assert {fmt, "fp32"} <= set(row)
            assert all(v["us_per_map"] > 0 for v in row.values())
            assert row["fp32"]["relative_error"] < 1e-5  # the reference itself, to rounding
            assert 0 < row[fmt]["relative_error"] < 0.2  # a low-bit copy is not exact
            if kernels.fbgemm_available():
                assert 0 < row["int8-dyn"]["relative_error"] < 0.1
    assert set(result["step_products_ms"]) == {1, 4}
