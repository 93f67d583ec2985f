"""core/decode/costs.py: the measured per-piece costs of a decode step and the speedup a run's skips are estimated to give."""

from __future__ import annotations

import pytest

from routerlab.core.decode.costs import PIECES, cost_breakdown, estimate_speedup, ideal_speedup, saved_per_cell
from routerlab.core.records.trace import Step, Trace

COSTS = {"attention_full": 2.0, "attention_kv_only": 0.5, "mlp": 3.0, "step": 100.0}


def trace(decisions: list[list[bool | None]], policy="kv", target="attention", prompt=1) -> Trace:
    """One prompt step, then one generated step per row of decisions (the last generated token: no forward, 0 s)."""
    n = len(decisions[0])
    steps = [Step(0, 1, "p", True, [None] * n, [None] * n, 0.5, 0.01)][:prompt]
    for j, row in enumerate(decisions):
        scores = [None if d is None else (0.9 if d else 0.1) for d in row]
        steps.append(Step(prompt + j, 2, "x", False, scores, list(row), 0.5, 0.02))
    steps.append(Step(prompt + len(decisions), 3, "y", False, [None] * n, [None] * n, 0.5, 0.0))
    return Trace(n, steps, {"target": target, "kv_policy": policy, "kv_policy_effective": policy})


def test_ideal_speedup_removes_exactly_the_skipped_work_per_target():
    assert ideal_speedup(COSTS, 10, "drop") == 100.0 / 80.0
    assert ideal_speedup(COSTS, 10, "kv") == 100.0 / 85.0
    assert ideal_speedup(COSTS, 10, "mask", "block") == 1.0
    assert ideal_speedup(COSTS, 10, "kv", "mlp") == 100.0 / 70.0
    assert ideal_speedup(COSTS, 10, "kv", "block") == 100.0 / 55.0


def test_noise_never_turns_a_skip_into_a_cost():
    noisy = dict(COSTS, attention_kv_only=2.5)  # measured leftover above the whole sub-layer: noise
    assert saved_per_cell(noisy, "kv") == 0.0 and ideal_speedup(noisy, 10, "kv") == 1.0
    assert estimate_speedup(trace([[False, False]] * 3), noisy) == 1.0


def test_estimate_of_a_trace_counts_its_skipped_cells_per_decoded_token():
    t = trace([[None, False, True], [None, False, False], [None, True, True]])  # 3 skips over 3 decoded tokens
    assert estimate_speedup(t, COSTS) == pytest.approx(300.0 / (300.0 - 3 * 1.5))
    assert estimate_speedup(trace([[None, False]], policy="drop"), COSTS) == pytest.approx(100.0 / 98.0)
    assert estimate_speedup(trace([[None, False]], policy="mask"), COSTS) == 1.0
    assert estimate_speedup(trace([[None, None]], target=None), COSTS) == 1.0  # the full model
    assert estimate_speedup(t, None) is None and estimate_speedup(Trace(1, [], {}), COSTS) is None


def test_what_if_estimate_uses_the_re_decided_cells():
    t = trace([[None, True, True]] * 4)  # scores 0.9: nothing skipped at 0.5, everything at 0.95
    assert estimate_speedup(t, COSTS) == 1.0
    assert estimate_speedup(t, COSTS, threshold=0.95) == pytest.approx(400.0 / (400.0 - 8 * 1.5))


def test_cost_breakdown_measures_every_piece_of_a_tiny_model():
    from routerlab.core.decode.engine import Engine
    from routerlab.core.model.models import tiny_model

    costs = cost_breakdown(Engine(tiny_model("llama"), None, name="tiny"), [5, 6, 7], context=8, repeat=2)
    assert set(costs) == set(PIECES) and costs["step"] > 0 and costs["attention_full"] >= 0 and costs["mlp"] >= 0


LINE = dict(COSTS, context=100.0, per_token={"attention_full": 0.01, "attention_kv_only": 0.0, "step": 0.3})


def test_costs_at_moves_attention_and_the_step_along_the_line():
    from routerlab.core.decode.costs import costs_at

    at = costs_at(LINE, 1100)
    assert at["attention_full"] == pytest.approx(12.0) and at["step"] == pytest.approx(400.0) and at["mlp"] == 3.0
    assert at["context"] == 1100.0 and costs_at(COSTS, 1100) is COSTS and costs_at(LINE, None) is LINE
    assert costs_at(LINE, 0)["attention_full"] == pytest.approx(1.0)  # below the measured context too, never below 0
    assert costs_at(dict(LINE, context=100.0), -10**6)["step"] == 0.0
    assert ideal_speedup(LINE, 10, "drop", context=1100) == pytest.approx(400.0 / 280.0)
    assert ideal_speedup(LINE, 10, "drop") == ideal_speedup(COSTS, 10, "drop")


def test_a_run_at_a_long_context_is_estimated_at_its_own_context():
    short = trace([[None, False, True]] * 3, prompt=1)  # positions 1..3: the line's measured context and below
    steps = [Step(p, 1, "p", True, [None] * 3, [None] * 3, 0.5, 0.01) for p in range(1000)]
    long = Trace(3, steps + [Step(1000 + j, 2, "x", False, [None, 0.1, 0.9], [None, False, True], 0.5, 0.02) for j in range(3)]
                 + [Step(1003, 3, "y", False, [None] * 3, [None] * 3, 0.5, 0.0)], dict(short.meta))
    at_short, at_long = estimate_speedup(short, LINE), estimate_speedup(long, LINE)
    # each decoded token costs the step at its own position, and saves one skipped cell's attention there
    expect = sum(LINE["step"] + 0.3 * (p - 100) for p in (1000, 1001, 1002))
    saved = sum((2.0 + 0.01 * (p - 100)) - 0.5 for p in (1000, 1001, 1002))
    assert at_long == pytest.approx(expect / (expect - saved))
    assert at_long > at_short > 1.0


def test_cost_line_measures_two_contexts_of_a_tiny_model():
    from routerlab.core.decode.costs import GROWS, cost_line
    from routerlab.core.decode.engine import Engine
    from routerlab.core.model.models import tiny_model

    line = cost_line(Engine(tiny_model("llama"), None, name="tiny"), [5, 6, 7], contexts=(64, 8), repeat=2)
    assert line["context"] == 8.0 and line["long_context"] == 64.0 and set(line["per_token"]) == set(GROWS)
    assert all(v >= 0 for v in line["per_token"].values()) and set(PIECES) <= set(line)
