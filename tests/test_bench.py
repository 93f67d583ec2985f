"""`bench speed` end to end on the embedded model, at a toy size: the report's shape, not its speed."""

import os
import math

from routerlab.bench.speed import format_speed, ideal_speedup, speed_benchmark


def test_speed_report_has_ratios_and_ideals(embedded):
    r = speed_benchmark(prompt_tokens=24, new_tokens=4, rounds=1, loaded=embedded, long_context=48, ttft_tokens=40,
                        ttft_rounds=1, peers=False, log=lambda *_: None)
    for key in ("generate", "engine", "engine_never_skip", "deep_off_mask", "deep_off_kv", "deep_off_drop", "engine_16bit"):
        assert r["tokens_per_second"][key] > 0
    assert math.isfinite(r["engine_vs_generate"]) and math.isfinite(r["drop_speedup"])
    assert math.isfinite(r["engine_vs_16bit_engine"]) and r["engine_vs_llama_cpp"] is None  # peers off
    assert "Q4_1" in r["weights"] and r["cpu_model"]
    # SmolLM2-135M ties its head to the embedding: a step reads every weight once, ~135M parameters; the default
    # path reads the file's 4-bit codes (5 bits a weight with scales and zero points; the head's 8-bit codes as two halves)
    b = r["bytes_per_step"]
    per_param = 2 if r["dtype"] == "bfloat16" else 4
    assert 120e6 * per_param < b["engine_16bit"] == b["generate"] < 140e6 * per_param
    assert 60e6 < b["engine"] < 110e6 and r["decode_weight_bytes"] == b["engine"]
    assert r["bandwidth_bound_tokens_per_second"] > 0 and 0 < r["fraction_of_bandwidth_bound"] < 1.5
    f = r["ttft_seconds"]
    assert f["prompt_tokens"] == 40 and f["engine"] > 0 and f["generate"] > 0 and f["llama_cpp"] is None
    assert r["long_context"]["context_tokens"] == 48 and r["long_context"]["tokens_per_second"]["engine"] > 0
    assert r["ideal_speedup"]["mask"] == 1.0
    assert r["skipped_layers"] == list(range(15, 30)) and math.isfinite(r["routing"])
    floor = r["kernel_floor_seconds"]
    assert set(floor) == {"products", "attention", "head", "total"} and r["kernel_floor_vs_llama_cpp"] is None
    assert min(floor.values()) > 0 and math.isclose(floor["total"], floor["products"] + floor["attention"] + floor["head"])
    text = format_speed(r)
    assert "engine_vs_generate" in text and "llama.cpp: not measured" in text and "kernel floor" in text


def test_ideal_speedup_removes_exactly_the_skipped_work():
    costs = {"attention_full": 2.0, "attention_kv_only": 0.5, "step": 100.0}
    assert ideal_speedup(costs, 10, "drop") == 100.0 / 80.0
    assert ideal_speedup(costs, 10, "kv") == 100.0 / 85.0
    assert ideal_speedup(costs, 10, "mask") == 1.0


def test_make_room_sets_each_served_level_beside_the_isolated_step_of_as_many_rows():
    from routerlab.bench.load.room import served_vs_step

    report = {"modes": {"room": {"levels": {"1": {"aggregate_tokens_per_s": 40.0}, "8": {"aggregate_tokens_per_s": 60.0},
                                            "32": {"aggregate_tokens_per_s": None}}}},
              "steps": {"sizes": {"1": {"tokens_per_s": 50.0}, "8": {"tokens_per_s": 120.0}, "32": {"tokens_per_s": 200.0}}}}
    assert served_vs_step(report) == {"1": 0.8, "8": 0.5}


def test_make_room_splits_a_levels_loop_time_by_phase():
    from routerlab.bench.load.room import loop_split

    before = {"prefill": 1.0, "quality": 0.0, "forward": 2.0, "solo": 0.0, "other": 0.5, "idle": 10.0, "steps": 10, "rows": 10}
    after = {"prefill": 3.0, "quality": 2.0, "forward": 7.0, "solo": 0.0, "other": 1.5, "idle": 10.0, "steps": 60, "rows": 410}
    split = loop_split(before, after)
    assert split["seconds"] == 10.0 and split["forward"] == 0.5 and split["prefill"] == 0.2 and split["idle"] == 0.0
    assert split["mean_rows"] == 8.0


def test_make_room_sets_the_servers_cpu_per_token_beside_the_loop_alone_at_as_many_rows():
    from routerlab.bench.load import room

    report = {"modes": {"room": {"levels": {
        "8": {"tokens": 500, "web_server_cpu_s": 1.0, "engine_cpu_s": 9.0, "clients_cpu_s": 0.2, "wall_s": 5.0, "aggregate_tokens_per_s": 100.0},
        "32": {"tokens": 0, "aggregate_tokens_per_s": None}}}},
        "loop_alone": {"8": {"tokens_per_s": 125.0, "cpu_ms_per_token": 16.0}, "command": "python -m routerlab.bench.room_loop"}}
    out = room.served_vs_loop(report)
    assert list(out) == ["8"]  # a level without tokens has no ratio
    row = out["8"]
    assert row["web_cpu_ms_per_token"] == 2.0 and row["engine_cpu_ms_per_token"] == 18.0 and row["server_cpu_vs_loop"] == 1.25
    assert row["aggregate_vs_loop"] == 0.8 and row["clients_cpu_share"] == round(0.2 / (5.0 * (os.cpu_count() or 1)), 3)


def test_a_room_level_keeps_the_median_of_its_rounds_each_between_two_runs_of_the_loop_alone(monkeypatch):
    from routerlab.bench.load import room

    events = []
    served = iter([{"sessions": 8, "served": 8, "errors": 0, "refusals": 0, "tokens": 500, "aggregate_tokens_per_s": a,
                    "server_cpu_ms_per_token": c, "failures": [], "loop": {"forward": a}} for a, c in ((80.0, 20.0), (120.0, 14.0), (100.0, 15.0))])

    def level_run(*a, **k):
        events.append("served")
        return next(served)

    monkeypatch.setattr(room, "level_run", level_run)
    # the machine drifts: the loop alone runs 150, 170, 150, 170, ... tokens/s, each pair around a served run means 160
    loops = iter([{"tokens_per_s": t, "cpu_ms_per_token": c, "tokens": 500} for t, c in ((150.0, 11.0), (170.0, 9.0)) * 3])

    class Alone:
        def measure(self, rows):
            events.append(rows)
            return next(loops)

    r = room.level_rounds("http://x", 8, {}, ["p"], rounds=3, alone=Alone())
    assert events == [8, "served", 8] * 3 and len(r["rounds"]) == 3
    assert r["rounds"][0]["loop_runs_tokens_per_s"] == [150.0, 170.0] and r["loop_tokens_per_s"] == 160.0
    assert r["loop_cpu_ms_per_token"] == 10.0 and "loop_runs_tokens_per_s" not in r
    assert r["aggregate_tokens_per_s"] == 100.0 and r["server_cpu_ms_per_token"] == 15.0 and r["served"] == 8
    assert r["aggregate_vs_loop"] == 0.625 and r["server_cpu_vs_loop"] == 1.5  # medians of the rounds' ratios
    assert r["loop"] == {"forward": 100.0}  # the split of the median round
    out = room.served_vs_loop({"modes": {"room": {"levels": {"8": {**r, "web_server_cpu_s": 1.0, "engine_cpu_s": 6.5,
                                                                    "clients_cpu_s": 0.1, "wall_s": 5.0}}}}})
    assert out["8"]["aggregate_vs_loop"] == 0.62 and out["8"]["server_cpu_vs_loop"] == 1.5
