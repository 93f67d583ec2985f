import math

import pytest

from routerlab.core.base.errors import RouterLabError
from routerlab.core.records.trace import Step, Trace, savings


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


@pytest.mark.parametrize("target, policy, expected", [
    ("block", "kv", (3010 / 6040, 3209 / 4330, 0.0)),  # a kept cache entry: a skip saves all but k and v
    ("block", "drop", (3020 / 6040, 3219 / 4330, 16.0)),
    ("mlp", "kv", (0.0, 199 / 300, 0.0)),  # an MLP router saves no attention and no cache
    ("attention", "drop", ((1010 + 2010 - 1.0) / 6040, (1010 + 2010 - 1.0) / 4030, 16.0)),  # a stand-in pays 0.5 a cell
])
def test_savings_by_hand(target, policy, expected):
    """Two routed layers, two steps: every cell's figure worked out on paper (projections 10, MLP 100, 1,000 a cached
    token, stand-ins 0.5 a skipped cell). Step 0 runs layer 0 and skips layer 1; step 1 skips layer 0, layer 1 unrouted."""
    steps = [Step(0, 1, "a", False, [0.9, 0.1], [True, False], 0.5, 0.01), Step(1, 2, "b", False, [0.2, None], [False, None], 0.5, 0.01)]
    costs = dict(q=1.0, k=2.0, v=3.0, o=4.0, mlp=100.0, score_per_ctx=1000.0, kv_bytes=8.0, standin=0.5)
    got = savings(Trace(2, steps, {"kv_policy": policy, "target": target, "costs": costs}))
    assert (got["attention_flops_saved"], got["routed_flops_saved"], got["kv_bytes_saved"]) == pytest.approx(expected, rel=1e-12)
    assert got["kv_bytes_full"] == 8.0 * 2 * 2


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
