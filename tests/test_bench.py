"""`bench speed` end to end on the embedded model, at a toy size: the report's shape, not its speed."""

import math

from routerlab.bench.speed import format_speed, ideal_speedup, speed_benchmark


def test_speed_report_has_ratios_and_ideals(embedded):
    r = speed_benchmark(prompt_tokens=24, new_tokens=4, rounds=1, loaded=embedded, ttft_tokens=40, ttft_rounds=1)
    for key in ("generate", "engine", "engine_never_skip", "deep_off_mask", "deep_off_kv", "deep_off_drop"):
        assert r["tokens_per_second"][key] > 0
    assert math.isfinite(r["engine_vs_generate"]) and math.isfinite(r["drop_speedup"])
    assert r["dtype"] in ("float32", "bfloat16") and math.isfinite(r["engine_vs_fp32_engine"])
    assert ("engine_fp32" in r["tokens_per_second"]) == (r["dtype"] != "float32")
    # SmolLM2-135M ties its head to the embedding: a step reads every weight once, ~135M parameters
    per_param = 2 if r["dtype"] == "bfloat16" else 4
    assert 120e6 * per_param < r["decode_weight_bytes"] < 140e6 * per_param
    assert r["bandwidth_bound_tokens_per_second"] > 0 and 0 < r["fraction_of_bandwidth_bound"] < 1.5
    assert r["ttft_seconds"]["prompt_tokens"] == 40 and r["ttft_seconds"]["engine"] > 0 and r["ttft_seconds"]["generate"] > 0
    assert r["ideal_speedup"]["mask"] == 1.0
    assert r["skipped_layers"] == list(range(15, 30)) and math.isfinite(r["routing"])
    assert "engine_vs_generate" in format_speed(r)


def test_ideal_speedup_removes_exactly_the_skipped_work():
    costs = {"attention_full": 2.0, "attention_kv_only": 0.5, "step": 100.0}
    assert ideal_speedup(costs, 10, "drop") == 100.0 / 80.0
    assert ideal_speedup(costs, 10, "kv") == 100.0 / 85.0
    assert ideal_speedup(costs, 10, "mask") == 1.0
