import math

import pytest

from routerlab.core.errors import RouterLabError
from routerlab.core.trace import Step, Trace, savings


def make_trace():
    steps = [
        Step(0, 1, "a", True, [None, 0.9, 0.2], [None, True, False], 0.5, 0.01),
        Step(1, 2, "b", False, [None, 0.4, 0.7], [None, False, True], 0.5, 0.02),
        Step(2, 3, "c", False, [None, 0.6, 0.1], [None, True, False], 0.5, 0.02),
    ]
    costs = dict(q=4.0, k=2.0, v=2.0, o=4.0, mlp=10.0, score_per_ctx=1.0, head=50.0, kv_bytes=8.0)
    return Trace(3, steps, {"kv_policy": "drop", "target": "attention", "costs": costs})


def test_json_round_trip_is_exact():
    trace = make_trace()
    assert Trace.from_json(trace.to_json()) == trace


def test_what_if_threshold_recomputes_decisions_from_scores():
    trace = make_trace()
    assert trace.skip_rate() == 0.5
    assert trace.skip_rate(threshold=0.0) == 0.0
    assert trace.skip_rate(threshold=1.0) == 1.0
    assert trace.layer_skip_rates() == [None, 0.5, 0.5]


def test_savings_follow_the_policy():
    trace = make_trace()
    drop = savings(trace)
    assert drop["kv_bytes_saved"] == 3 * 8.0 and drop["attention_flops_saved"] > 0
    trace.meta["kv_policy"] = "kv"
    kv = savings(trace)
    assert kv["kv_bytes_saved"] == 0 and 0 < kv["attention_flops_saved"] < drop["attention_flops_saved"]
    trace.meta["kv_policy"] = "mask"
    assert savings(trace)["attention_flops_saved"] == 0


def test_bad_trace_files_are_refused():
    with pytest.raises(RouterLabError, match="not valid JSON"):
        Trace.from_json("{nope")
    with pytest.raises(RouterLabError, match="Not a RouterLab trace"):
        Trace.from_json('{"steps": []}')


def test_nan_is_written_as_null():
    trace = make_trace()
    trace.meta["x"] = math.nan
    assert '"x": null' in trace.to_json()


def test_the_exported_layout_is_the_same_json_one_step_per_line():
    """The export (one_step_per_line) reads back as the compact form does, non-finite numbers as null in both, with
    the header on its own line and each step on a line of its own, and the trace's lists are copies, not its own."""
    import json

    trace = make_trace()
    trace.steps[1].kl_full, trace.meta["x"] = math.inf, -math.inf
    lines = trace.to_json(one_step_per_line=True).splitlines()
    assert json.loads("\n".join(lines)) == json.loads(trace.to_json())
    assert len(lines) == 2 + len(trace.steps) + 1 and lines[1] == '"steps": ['
    back = Trace.from_json("\n".join(lines))
    assert back.steps[1].kl_full is None and back.meta["x"] is None and back.steps[0] == trace.steps[0]
    trace.to_dict()["steps"][0]["scores"][1] = 0.0
    assert trace.steps[0].scores[1] == 0.9
