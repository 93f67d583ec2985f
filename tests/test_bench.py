"""`bench speed` end to end on the embedded model, at a toy size: the report's shape, not its speed."""

import math

from routerlab.bench.speed import format_speed, ideal_speedup, speed_benchmark


def test_speed_report_has_ratios_and_ideals(embedded):
    r = speed_benchmark(prompt_tokens=24, new_tokens=4, rounds=1, loaded=embedded)
    for key in ("generate", "engine", "engine_never_skip", "deep_off_mask", "deep_off_kv", "deep_off_drop"):
        assert r["tokens_per_second"][key] > 0
    assert math.isfinite(r["engine_vs_generate"]) and math.isfinite(r["drop_speedup"])
    assert r["ideal_speedup"]["mask"] == 1.0
    assert r["skipped_layers"] == list(range(15, 30)) and math.isfinite(r["routing"])
    assert "engine_vs_generate" in format_speed(r)


def test_ideal_speedup_removes_exactly_the_skipped_work():
    costs = {"attention_full": 2.0, "attention_kv_only": 0.5, "step": 100.0}
    assert ideal_speedup(costs, 10, "drop") == 100.0 / 80.0
    assert ideal_speedup(costs, 10, "kv") == 100.0 / 85.0
    assert ideal_speedup(costs, 10, "mask") == 1.0
