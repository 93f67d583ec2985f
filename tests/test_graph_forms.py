"""core/graph/graph_forms.py: under `kv` a routed step graph runs each step in the form that pays (with `If`s or in mask's
form): the same numbers whichever form a step takes, the branching form chosen exactly where the cells every row is
expected to skip save more than the branches cost."""

import math

import numpy as np
import pytest
import torch

from routerlab.core.graph import graph_forms
from routerlab.core.graph.graph_forms import BRANCH, PLAIN, W, Costs, History

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


def test_the_saving_of_a_skipped_cell_grows_with_context_and_decides_the_form():
    costs = Costs(branches_ms=0.3, saved_ms=(0.05, 0.09), contexts=(64, 512), cells=20)
    assert costs.saved_at(64) == pytest.approx(0.05) and costs.saved_at(288) == pytest.approx(0.07)
    assert costs.saved_at(960) == pytest.approx(0.13)  # linear beyond the second context too
    assert not costs.branch(5.0, 64) and costs.branch(7.0, 64)  # 5 x 0.05 < 0.3 < 7 x 0.05
    assert costs.branch(5.0, 512)  # at 512 tokens five skipped cells pay
    assert "0.300 ms a step" in costs.describe() and "0.090 ms at 512 tokens" in costs.describe()
    # a measurement that says the branches cost nothing, or more than any skipping saves, is bounded by SHARE
    free, dear = Costs(-0.1, (0.05,), (64,), cells=20), Costs(5.0, (0.05,), (64,), cells=20)
    assert free.share(64) == graph_forms.SHARE[0] and not free.branch(1.0, 64) and free.branch(3.0, 64)
    assert dear.share(64) == graph_forms.SHARE[1] and dear.branch(13.0, 64)


def test_a_prediction_reads_each_rows_last_steps_at_its_threshold_now():
    layers, rows = 4, 2
    history = History(layers, rows)
    raw = np.array([[np.nan, np.nan], [-1.0, -1.0], [-1.0, 2.0], [3.0, 3.0]], np.float32)  # layer 0 unrouted
    assert history.skipped(np.array([0.0, 0.0])) == 0.0  # no sample yet: nothing predicted
    for _ in range(W):
        history.add(raw)
    assert history.skipped(np.array([0.0, 0.0])) == 1.0  # layer 1 both rows skip; layer 2 only one
    assert history.skipped(np.array([2.5, 2.5])) == 2.0  # a higher threshold: layer 2 too
    assert history.skipped(np.array([math.inf, math.inf])) == 3.0  # every routed layer; the unrouted one never
    costs = Costs(0.1, (0.06,), (64,), cells=3)
    assert history.choose(costs, (0.0, 0.0), 64) == PLAIN  # 1 cell x 0.06 < 0.1
    assert history.choose(costs, (2.5, 2.5), 64) == BRANCH  # the threshold moved: chosen again at once
    history.add(raw * 0 + 5.0)  # the rows' logits rise: the choice holds until EVERY steps have passed
    for _ in range(graph_forms.EVERY - 1):
        history.after(raw * 0 + 5.0)
        assert history.choose(costs, (2.5, 2.5), 64) == BRANCH
    history.after(raw * 0 + 5.0)
    assert history.steps == graph_forms.EVERY and history.choose(costs, (2.5, 2.5), 64) == PLAIN


@pytest.fixture(scope="module")
def graph(embedded):
    from routerlab.core.decode.engine import Engine
    from routerlab.core.graph.step_graph import StepGraph
    from routerlab.tuning.checkpoint import resolve_routers

    engine = Engine.from_loaded(embedded, choose_kernels=False)
    routers = resolve_routers(None, "attention-token", embedded.model)[0]
    return engine, routers, StepGraph(engine.anatomy, 128, routers=routers)


def test_a_kv_graph_measured_its_forms_and_a_step_takes_either_with_the_same_numbers(graph):
    """Two requests from the same prefill at 0.7: one every step with `If`s, one switching form at every step; the
    same logits, router logits and caches to the bit."""
    from routerlab.core.ops.forward import forward
    from routerlab.core.routing.gates import Plan

    engine, routers, g = graph
    assert g.plain is not None and len(g.sessions) == 2
    costs = g.costs
    assert costs.branches_ms == costs.branches_ms and all(s >= 0 for s in costs.saved_ms)  # measured, not NaN
    ids = list(range(200, 240))
    caches = engine.new_caches(len(ids) + 1)
    with torch.inference_mode():
        logits, _ = forward(engine.anatomy, torch.tensor([ids]), torch.arange(len(ids)), caches, Plan(routers, 0.7, "kv"))
    a, b = g.twin(), g.twin()
    for twin in (a, b):
        twin.load(caches, 20, 0.7, tokens=len(ids))
    token, skipped = int(logits[0, -1].max(0).indices), 0
    for k in range(20):
        out_a = a.run(token, BRANCH).clone()
        out_b = b.run(token, (BRANCH, PLAIN)[k % 2]).clone()
        assert torch.equal(out_a, out_b) and torch.equal(a.logits_of_routers.nan_to_num(), b.logits_of_routers.nan_to_num())
        skipped += sum(s < 0.7 for s in a.scores().values())
        token = int(out_a.max(0).indices)
    assert skipped > 0  # some cells skipped: the forms' difference was exercised
    assert all(torch.equal(x, y) for pa, pb in zip(a.caches, b.caches) for x, y in zip(pa, pb))


def test_a_requests_steps_choose_the_plain_form_where_nothing_skips_and_branches_where_all_does(graph):
    engine, routers, g = graph
    twin = g.twin()
    twin.fill(32, 6 * W * graph_forms.STRIDE)
    chosen = []
    run = twin.run

    def recording(token, form=BRANCH, advance=True):
        chosen.append(form)
        return run(token, form, advance)

    twin.run = recording
    twin.costs = Costs(0.2, (0.05,), (64,), cells=len(g.routed))
    steps = W * graph_forms.STRIDE + graph_forms.EVERY
    twin.threshold.fill_(-math.inf)  # never skip
    twin._raw = (-math.inf,)
    for _ in range(steps):
        twin.step(5)
    assert set(chosen) == {PLAIN}
    twin.threshold.fill_(math.inf)  # every cell skips: the samples show it once they have replaced the old ones
    twin._raw = (math.inf,)
    chosen.clear()
    for _ in range(steps):
        twin.step(5)
    assert chosen[-1] == BRANCH
