"""The Train tab's curves say which losses the routers learn from: a loss at weight 0 is drawn dotted, marked as watched."""

from __future__ import annotations

import plotly.graph_objects as go

from routerlab.ui.figures import train_plots

ROWS = [{"step": k, "target": 1 - 0.03 * k, "loss": 0.2, "kd": 0.1 / k, "lm": 1.0, "budget": 0.01, "skip": 0.02 * k}
        for k in range(1, 5)]


def _losses(weights):
    fig = train_plots.curves({"rows": ROWS, "checkpoints": [], "weights": weights})
    return {t.name.split(" (")[0]: t for t in fig.data if t.xaxis == "x"}


def test_a_loss_at_weight_0_is_drawn_as_watched_not_trained_on():
    lm = _losses({"kd": 1.0, "lm": 0.0})["LM loss"]
    assert lm.name.endswith("not trained on") and lm.line.dash == "dot"
    kd = _losses({"kd": 1.0, "lm": 0.0})["distillation"]
    assert "not trained on" not in kd.name and kd.line.dash == "solid"
    lm = _losses({"kd": 1.0, "lm": 1.0})["LM loss"]
    assert "not trained on" not in lm.name and lm.line.dash == "solid"
    assert "not trained on" not in _losses({})["LM loss"].name  # a snapshot without weights (an older job) draws plainly


def test_a_tick_without_a_new_step_sends_no_figures():
    """The page polls every 2 s; a step takes longer. Redrawing unchanged figures costs the browser's CPU, which a local
    visitor's training shares, so a tick sends the figures only when a step or a checkpoint has arrived."""
    from types import SimpleNamespace

    from routerlab.ui.state.session import Session
    from routerlab.ui.tabs.train_tab import train_tick

    snap = {"phase": "training", "rows": ROWS[:2], "checkpoints": [], "layers": [], "elapsed": 5.0, "message": "",
            "steps_planned": 10, "trainable": None, "weights": {}}
    job = SimpleNamespace(snapshot=lambda: dict(snap), settings=SimpleNamespace(minutes=3.0), phase="training")
    session, res = Session(), SimpleNamespace(trainer=None)
    session.job = job
    drawn = lambda out: [isinstance(x, go.Figure) for x in out[1:3]]  # noqa: E731  (the curves, the layer map)
    assert drawn(train_tick(res, session)) == [True, True]
    assert drawn(train_tick(res, session)) == [False, False]  # nothing new: both skipped
    snap["rows"] = ROWS[:3]
    assert drawn(train_tick(res, session)) == [True, True]
    snap["checkpoints"] = [{"step": 3, "skip_rate": 0.05, "kl_full": 0.1, "perplexity_increase": 0.02}]
    assert drawn(train_tick(res, session)) == [True, True]


def test_result_and_progress_show_names_and_messages_as_text():
    """A set's label, its rows' names and a job's message (which can name a visitor's file) stay text: no tag, no
    extra table cell."""
    import html

    hostile = "<img src=/x>|**b**"
    result = {"label": hostile, "steps": 3, "seconds": 1.0, "heldout": {"examples": 4, "rows": {
        hostile: {"threshold": 0.5, "skip_rate": 0.1, "perplexity_increase": 0.02, "kl_full": 0.01}}}}
    md = train_plots.result_md({"result": result})
    row = next(line for line in md.splitlines() if "0.0100" in line)
    assert "<img" not in md and "**b**" not in md and row.count("|") == 6, row
    assert html.unescape(md).count(hostile) == 2
    for phase in ("training", "done"):
        bar = train_plots.progress_html({"phase": phase, "elapsed": 1.0, "message": hostile, "rows": []}, 60.0)
        assert "<img" not in bar and hostile in html.unescape(bar)


def test_a_one_step_curve_is_drawn_and_the_pace_is_said():
    from routerlab.ui.figures import train_plots

    row = {"step": 1, "steps_planned": 40, "target": 0.9, "skip": 0.05, "seconds": 12.0, "kd": 0.5}
    snap = {"phase": "training", "elapsed": 20.0, "rows": [row], "checkpoints": [], "message": "Training"}
    fig = train_plots.curves(snap)
    assert all("markers" in t.mode for t in fig.data)
    assert "the first took 12 s" in train_plots.progress_html(snap, 180)
    rows = [row, {**row, "step": 5, "seconds": 20.0}]
    assert "~2.0 s a step" in train_plots.progress_html({**snap, "rows": rows}, 180)


def test_the_progress_line_says_where_a_long_step_is():
    from routerlab.ui.figures import train_plots

    snap = {"phase": "training", "elapsed": 30.0, "rows": [], "checkpoints": [], "message": "Training", "example": (1, 3, 8)}
    assert "step 1: example 3 of 8 done" in train_plots.progress_html(snap, 180)
    row = {"step": 1, "steps_planned": 40, "target": 0.9, "skip": 0.05, "seconds": 12.0}
    done = {**snap, "rows": [row], "example": (1, 8, 8)}
    assert "example" not in train_plots.progress_html(done, 180)  # the step ended: its row says it
