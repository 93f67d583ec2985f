"""The Train tab's figures and HTML fragments, from a TrainJob snapshot (plain dicts; no torch).

`curves` (losses per step; skip share with its target and the held-out checkpoints), `layer_map`
(routed layers x steps: each layer's skip share, which layers the routers give up first), `progress_html`
(bar, phase, time left, trainable parameters) and `result_md` (the held-out comparison table). A set's label, a job's
message and a data source's name (a visitor's file name) are shown through safe.text.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from routerlab.ui.figures import safe

FONT = dict(family="Inter, ui-sans-serif, system-ui, sans-serif", size=13)
LOSSES = (("kd", "distillation (KL to the full model)", "#d9480f"), ("lm", "LM loss (next token)", "#1c7ed6"),
          ("budget", "budget term (over the skip target)", "#868e96"))


def _empty(title: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(template="plotly_white", height=300, font=FONT, title=title, xaxis={"visible": False}, yaxis={"visible": False})
    return fig


def curves(snap: dict | None) -> go.Figure:
    rows = (snap or {}).get("rows") or []
    if not rows:
        return _empty("Curves appear here while the routers train")
    steps = [r["step"] for r in rows]
    mode = "lines+markers" if len(rows) < 20 else "lines"  # a curve of one step is a point: drawn, not empty axes
    fig = make_subplots(rows=1, cols=2, subplot_titles=("losses per step", "skip share of routed cells"), horizontal_spacing=0.1)
    weights = (snap or {}).get("weights") or {}
    for key, name, color in LOSSES:
        if any(r.get(key) for r in rows):
            watched = weights.get(key) == 0  # measured for its curve, not trained on
            fig.add_trace(go.Scatter(x=steps, y=[r.get(key) for r in rows], name=name + (", not trained on" if watched else ""),
                                     mode=mode, line={"color": color, "dash": "dot" if watched else "solid"}), row=1, col=1)
    fig.add_trace(go.Scatter(x=steps, y=[r["skip"] for r in rows], name="skipped while training", mode=mode,
                             line={"color": "#2b8a3e"}), row=1, col=2)
    fig.add_trace(go.Scatter(x=steps, y=[1 - r["target"] for r in rows], name="skip target (ramps in)", mode=mode,
                             line={"color": "#2b8a3e", "dash": "dash"}), row=1, col=2)
    points = (snap or {}).get("checkpoints") or []
    if points:
        fig.add_trace(go.Scatter(x=[p["step"] for p in points], y=[p["skip_rate"] for p in points], mode="markers+text",
                                 name="held-out: skipped (KL to full)", marker={"color": "#5f3dc4", "size": 10},
                                 text=[f"KL {p['kl_full']:.3f}" for p in points], textposition="top center"), row=1, col=2)
    fig.update_yaxes(tickformat=".0%", rangemode="tozero", row=1, col=2)
    fig.update_xaxes(title_text="step")
    fig.update_layout(template="plotly_white", height=340, font=FONT, margin={"t": 40, "b": 40, "l": 50, "r": 20},
                      legend={"orientation": "h", "y": -0.25})
    return fig


def layer_map(snap: dict | None) -> go.Figure:
    rows = [r for r in (snap or {}).get("rows") or [] if r.get("layer_skip")]
    layers = (snap or {}).get("layers") or []
    if not rows or not layers:
        return _empty("Which layers the routers learn to skip appears here")
    z = [[r["layer_skip"][k] for r in rows] for k in range(len(layers))]  # layers x steps
    fig = go.Figure(go.Heatmap(z=z, x=[r["step"] for r in rows], y=[f"L{i}" for i in layers], zmin=0, zmax=1,
                               colorscale=[[0, "#f8f9fa"], [0.25, "#ffc078"], [1, "#c92a2a"]],
                               colorbar={"title": "skipped", "tickformat": ".0%"},
                               hovertemplate="step %{x}, %{y}: %{z:.0%} of its cells skipped<extra></extra>"))
    fig.update_layout(template="plotly_white", height=360, font=FONT, margin={"t": 40, "b": 40, "l": 50, "r": 20},
                      title="Each routed layer's skip share per step", xaxis_title="step", yaxis={"autorange": "reversed"})
    return fig


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}:{seconds % 60:02d}"


def _pace(rows: list[dict]) -> str:
    """ " (~2.4 s a step)": the recent steps' pace, from their times since training began."""
    timed = [r for r in rows[-8:] if isinstance(r.get("seconds"), (int, float))]
    if len(timed) < 2:
        return f" (the first took {timed[0]['seconds']:.0f} s)" if timed and timed[0]["seconds"] >= 1 else ""
    per = (timed[-1]["seconds"] - timed[0]["seconds"]) / (timed[-1]["step"] - timed[0]["step"])
    return f" (~{per:.1f} s a step)" if per > 0 else ""


def progress_html(snap: dict | None, budget_seconds: float, position: int | None = None) -> str:
    if not snap:
        return "<div class='rl-train-progress rl-muted'>No training yet.</div>"
    phase, elapsed = snap["phase"], snap.get("elapsed", 0.0)
    rows = snap.get("rows") or []
    if phase == "queued":
        ahead = f"{position} training{'s' if position != 1 else ''} ahead of yours" if position else "starting"
        frac, line = 0.0, f"Waiting in line: {ahead}. Stop cancels it."
    elif phase in ("done", "stopped", "failed", "cancelled"):
        frac, line = (1.0 if phase == "done" else min(1.0, elapsed / budget_seconds)), safe.text(snap.get("message", ""))
    else:
        frac = min(1.0, elapsed / budget_seconds)
        step = f" · step {rows[-1]['step']} of ~{snap.get('steps_planned') or '?'}{_pace(rows)}" if rows else ""
        at = snap.get("example")  # (step, example, batch): where the step in flight is
        if phase == "training" and at and at[0] > (rows[-1]["step"] if rows else 0) and at[1] < at[2]:
            step += f" · step {at[0]}: example {at[1]} of {at[2]} done"
        answering = f" · {snap.get('answered', 0)} of {snap.get('to_answer', 0)} prompts answered" if phase == "answering" else ""
        if phase == "answering" and snap.get("answer_until"):
            answering += f" (answering ends by {_clock(snap['answer_until'])})"
        left = budget_seconds - elapsed
        when = f"about {_clock(left)} left" if left >= 1 else f"{_clock(-left)} past the budget, finishing"
        line = f"{safe.text(snap.get('message', ''))}{step}{answering} · {_clock(elapsed)} elapsed, {when}"
    params = snap.get("trainable")
    share = (f"<div class='rl-muted'>Trainable parameters: <b>{params['routers']:,}</b> of {params['model']:,} "
             f"({params['routers'] / params['model']:.3%}); the base model is frozen.</div>") if params else ""
    return (f"<div class='rl-train-progress' data-phase='{phase}'><div class='rl-bar'><div class='rl-bar-fill' "
            f"style='width:{frac:.1%}'></div></div><div>{line}</div>{share}</div>")


def result_md(snap: dict | None) -> str:
    result = (snap or {}).get("result")
    if not result:
        return ""
    if result.get("calibrated") is False:  # stopped before the calibration and the comparison ended: kept as it was
        return "\n".join([f"**{safe.text(result.get('label', 'Your set'))}**, {result.get('steps')} steps in {result.get('seconds')} s: "
                          "stopped before it was calibrated and compared on its held-out slice, so it is kept as it was: "
                          "**uncalibrated** (0.5 is the training gate on the raw scores; the slider's other positions are not "
                          "fitted to its skip rates).", "",
                          "It is now in the **Granularity (router set)** menu for Explore, Compare and Layers (this browser tab only; "
                          "download it to keep it)."])
    rows = result.get("heldout", {}).get("rows", {})
    lines = [f"**{safe.text(result.get('label', 'Your set'))}** on its held-out slice ({result['heldout']['examples']} examples never trained on), "
             f"{result.get('steps')} steps in {result.get('seconds')} s:", "",
             "| | threshold | skipped (routed cells) | perplexity rise | KL to the full model |", "|---|---|---|---|---|"]
    for name, r in rows.items():
        setting = f"p = {safe.text(r['threshold'])}" if name.startswith("random") else safe.text(r["threshold"])  # random skipping has no threshold
        lines.append(f"| {safe.text(name)} | {setting} | {r['skip_rate']:.1%} | {r['perplexity_increase']:+.1%} | {r['kl_full']:.4f} |")
    if any(name.startswith("random") for name in rows):
        lines += ["", "p: random skipping has no router and no threshold; it skips each routed cell with probability p."]
    lines += ["", "It is now in the **Granularity (router set)** menu for Explore, Compare and Layers (this browser tab only; "
              "download it to keep it)."]
    return "\n".join(lines)
