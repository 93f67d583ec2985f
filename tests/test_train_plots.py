"""The Train tab's curves say which losses the routers learn from: a loss at weight 0 is drawn dotted, marked as watched."""

from __future__ import annotations

from routerlab.ui import train_plots

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
