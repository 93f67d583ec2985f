"""Figures and small HTML views of a run: pure functions of a Trace (or a results table) to plotly / HTML.

Knows nothing about torch, models, the engine or Gradio. Every function takes plain data and
returns a new figure or string, so the UI can call them from any thread, and tests can call them
on synthetic traces. Figures are built with `plotly.graph_objects` from numpy arrays (plotly then
ships them as compact typed arrays), never with plotly express: a 300-token x 30-layer heatmap
must redraw in a few tens of milliseconds while a generation streams (a streamed frame skips the
Figure altogether: `heatmap_json`). The text view lives in text_view.py (re-exported here), the
quality strip's traces and the quality / speed cards' wording in quality_plots.py.

Colour conventions, shared by every figure:
  - a cell that RAN is coloured by its router score on a warm scale (yellow-orange-red);
  - a cell that was SKIPPED is coloured by its score on a grey scale (light = low score);
  - a layer without a router (always runs) is left blank (the neutral plot background).
"""

from __future__ import annotations

import base64
import json
import math
from functools import lru_cache
from typing import Any

import numpy as np
import plotly.graph_objects as go

from routerlab.core.decode.costs import context_of, estimate_speedup
from routerlab.core.records.divergence import departure, repetition
from routerlab.core.records.trace import Step, Trace, savings
from routerlab.ui.figures import quality_plots as qp
from routerlab.ui.figures import safe
from routerlab.ui.figures.text_view import first_divergence, token_html, token_label  # noqa: F401 (callers use plots.token_html)

RAN_SCALE = [[0.0, "#fff3b0"], [0.5, "#f4a259"], [1.0, "#b23a48"]]
SKIP_SCALE = [[0.0, "#f4f4f4"], [1.0, "#6b7280"]]
CHANGED = "#2563eb"  # what-if: cells whose decision differs from the recorded run
BACKGROUND = "#e9e6df"  # unrouted cells: the plot background shows through
FONT = dict(family="Inter, system-ui, sans-serif", size=12)
MAX_TICKS = 40


# -- small text helpers ----------------------------------------------------------------------------
def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _empty_figure(message: str, height: int = 260) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(
        height=height,
        font=FONT,
        xaxis=dict(visible=False),
        yaxis=dict(visible=False),
        plot_bgcolor="white",
        paper_bgcolor="white",
        margin=dict(l=20, r=20, t=30, b=20),
        annotations=[dict(text=safe.text(message), showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font=dict(size=14, color="#6b7280"))],
    )
    return fig


def empty_heatmap(message: str = "Generate to see which layers each token skips.") -> go.Figure:
    return _empty_figure(message, height=320)


# -- the layers x tokens heatmap -------------------------------------------------------------------
def _decisions(trace: Trace, threshold: float | None) -> np.ndarray:
    """layers x tokens: 1 ran, 0 skipped, NaN unrouted (recorded decisions, or what-if at `threshold`)."""
    matrix = trace.executed_matrix(threshold)
    return np.array([[np.nan if c is None else float(c) for c in row] for row in matrix], dtype=float).reshape(trace.n_layers, len(trace.steps))


def _scores(trace: Trace) -> np.ndarray:
    rows = trace.score_matrix()
    return np.array([[np.nan if c is None else float(c) for c in row] for row in rows], dtype=float).reshape(trace.n_layers, len(trace.steps))


def _columns(trace: Trace, cache: dict | None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Scores and recorded decisions (layers x tokens, NaN where unrouted) and token labels.

    With `cache` (a dict the caller keeps for one growing run; steps are only ever appended),
    only the steps added since the last call are converted: a streamed redraw stays cheap at
    several hundred tokens.
    """
    steps, n_layers = trace.steps, trace.n_layers
    k = 0
    if cache is not None and steps and cache.get("first") is steps[0] and cache.get("n", 0) <= len(steps):
        k = cache["n"]
    new = steps[k:]
    s_new = np.array([[np.nan if v is None else v for v in st.scores] for st in new], dtype=float).reshape(len(new), n_layers).T
    d_new = np.array([[np.nan if e is None else float(e) for e in st.executed] for st in new], dtype=float).reshape(len(new), n_layers).T
    labels_new = [token_label(st.text) for st in new]
    if k:
        scores = np.concatenate([cache["scores"], s_new], axis=1)
        recorded = np.concatenate([cache["recorded"], d_new], axis=1)
        labels = cache["labels"] + labels_new
    else:
        scores, recorded, labels = s_new, d_new, labels_new
    if cache is not None and steps:
        cache.update(first=steps[0], n=len(steps), scores=scores, recorded=recorded, labels=labels)
    return scores, recorded, labels


def _skip_rate(decided: np.ndarray, generated: np.ndarray) -> float:
    """Trace.skip_rate from a decisions matrix: skipped / routed cells over generated columns."""
    cells = decided[:, generated] if generated.any() else decided[:, :0]
    routed = ~np.isnan(cells)
    return float((cells[routed] == 0.0).sum() / routed.sum()) if routed.any() else 0.0


def _threshold_changes(steps: list[Step]) -> list[tuple[int, float]]:
    """(column, new threshold) where the live threshold moved during generation."""
    changes, last = [], None
    for j, s in enumerate(steps):
        if last is not None and not s.is_prompt and abs(s.threshold - last) > 1e-9:
            changes.append((j, s.threshold))
        last = s.threshold
    return changes


def _ticks(positions: list, labels: list[str], max_ticks: int = MAX_TICKS) -> tuple[list, list[str]]:
    if not positions:
        return [], []
    every = max(1, math.ceil(len(positions) / max_ticks))
    idx = list(range(0, len(positions), every))
    return [positions[j] for j in idx], [labels[j] for j in idx]


def heatmap(trace: Trace | None, threshold: float | None = None, what_if: bool = False, title: str | None = None,
            live: bool = False, cache: dict | None = None) -> go.Figure:
    """Layers (rows, layer 0 at the bottom) x tokens (columns, one per position): router score and decision.

    `what_if=True` re-decides every cell from the recorded scores at `threshold` (nothing is re-run)
    and says so in the title; cells whose decision differs from the recorded run get a blue tint.
    Vertical lines mark the prompt/generated boundary and every live threshold change. A run that
    measures its quality cost gets a strip under its generated columns (quality_plots.strip_traces:
    each token's KL to the full model, grey where not measured yet), on the same x axis.

    Columns are categories named "position: token", so the hover shows the token without a
    per-cell text array (that array was most of the figure's bytes); scores travel as float32
    for the same reason. Sparse tick labels show the token text alone.

    `layout.meta.routerlab` says "live" (the run is still going) or "final": the app's in-browser
    what-if preview only re-splits a final figure (traces 0 and 1 hold every routed score), and
    leaves alone a what-if figure already drawn for that threshold (`meta.what_if`).
    `cache`: see `_columns` (for redraws of one growing run).
    """
    parts = _heatmap_parts(trace, threshold, what_if, title, live, cache)
    return empty_heatmap() if parts is None else _fast_figure(*parts)


def heatmap_json(trace: Trace | None, threshold: float | None = None, what_if: bool = False, title: str | None = None,
                 live: bool = False, cache: dict | None = None) -> str:
    """`heatmap(...).to_json()` without building a plotly Figure: a streamed frame's heatmap. Building the
    Figure (even unvalidated, it deep-copies and walks every list) cost most of a frame's time, time the
    decoder thread waits for the GIL; this serializes the same dicts directly (tests check they agree)."""
    parts = _heatmap_parts(trace, threshold, what_if, title, live, cache)
    return empty_heatmap().to_json() if parts is None else figure_json(*parts)


def _heatmap_parts(trace, threshold, what_if, title, live, cache) -> tuple[list[dict], dict] | None:
    """The heatmap's traces and layout as plain dicts (numpy arrays for z); None without steps."""
    if trace is None or not trace.steps:
        return None
    steps = trace.steps
    n_layers, n_tok = trace.n_layers, len(steps)
    positions = [s.position for s in steps]
    scores, recorded, labels = _columns(trace, cache)
    columns = [f"{p}: {lab}" for p, lab in zip(positions, labels)]  # unique category per column
    if what_if and threshold is not None:  # the rule of Trace.executed_matrix(threshold), vectorised
        decided = np.where(np.isnan(scores), np.nan, (scores >= threshold).astype(float))
    else:
        decided = recorded
    generated = np.array([not s.is_prompt for s in steps])
    # float32: plotly ships numpy arrays as base64 typed arrays; half the bytes of float64
    ran = np.where(decided == 1.0, scores, np.nan).astype(np.float32)
    skipped = np.where(decided == 0.0, scores, np.nan).astype(np.float32)
    layers = list(range(n_layers))
    rank = trace.meta.get("standin_rank") or 0  # a set with stand-ins: every skipped cell ran one
    skip_note = f"<b>skipped</b>: its rank-{rank} stand-in ran" if rank else "<b>skipped</b>"

    # No gaps: plotly then draws a heatmap as one pixel per cell, scaled up (a gap makes it paint every cell
    # into a plot-sized canvas and encode that as a PNG, most of a streamed redraw's browser time). The
    # rows are parted by thin lines instead (shapes below).
    common = dict(type="heatmap", x=columns, y=layers, zmin=0.0, zmax=1.0, hoverongaps=False, xgap=0, ygap=0)
    # A live frame is redrawn every 2 s while the browser shares the CPU with decoding: its colour bars keep
    # their titles but draw no numbers, and its x axis half the token labels (an eighth to a fifth of a redraw's
    # browser time; docs/results.md, "Streaming overhead, measured: where the page's time goes"). The final figure has both.
    bar = dict(thickness=10, len=0.45, tickfont=dict(size=10), showticklabels=not live)
    data = [
        dict(
            common,
            z=ran,
            colorscale=RAN_SCALE,
            name="ran",
            hovertemplate="pos <b>%{x}</b><br>layer %{y} · score %{z:.3f}<br>ran<extra></extra>",
            colorbar=dict(bar, y=0.77, title=dict(text="ran: score", side="right", font=dict(size=11))),
        ),
        dict(
            common,
            z=skipped,
            colorscale=SKIP_SCALE,
            name="skipped",
            hovertemplate="pos <b>%{x}</b><br>layer %{y} · score %{z:.3f}<br>" + skip_note + "<extra></extra>",
            colorbar=dict(bar, y=0.23, title=dict(text="stand-in ran: score" if rank else "skipped: score", side="right",
                                                  font=dict(size=11))),
        ),
    ]
    changed_count = 0
    if what_if and threshold is not None:
        diff = (decided != recorded) & ~np.isnan(decided)
        changed_count = int(diff.sum())
        if changed_count:
            data.append(
                dict(
                    type="heatmap",
                    z=np.where(diff, 1.0, np.nan).astype(np.float32),
                    x=columns,
                    y=layers,
                    colorscale=[[0.0, CHANGED], [1.0, CHANGED]],
                    opacity=0.55,
                    showscale=False,
                    hoverinfo="skip",
                    name="differs from recorded",
                    xgap=0,
                    ygap=0,
                )
            )

    strip = qp.measured(trace)
    if strip:
        data += qp.strip_traces(steps, columns, token_label)

    shapes = [dict(type="line", xref="paper", x0=0, x1=1, y0=i + 0.5, y1=i + 0.5, line=dict(color=BACKGROUND, width=1))
              for i in range(n_layers - 1)]  # row separators
    annotations = []
    first_gen = next((j for j, s in enumerate(steps) if not s.is_prompt), None)
    if first_gen:
        shapes.append(dict(type="line", x0=first_gen - 0.5, x1=first_gen - 0.5, y0=0, y1=1, yref="paper", line=dict(color="#111827", width=2)))
        annotations.append(dict(x=first_gen - 0.5, y=1.0, yref="paper", text="prompt │ generated", showarrow=False, yanchor="bottom", font=dict(size=11)))
    changes = _threshold_changes(steps) if not what_if else []
    if changes and first_gen is not None:
        # each stretch between threshold moves with its own decode speed (the quality pass's time left out), labelled a
        # row above "prompt | generated" so the labels never overlap it; neighbours alternate between two rows
        bounds = [first_gen] + [col for col, _ in changes] + [len(steps)]
        marks = [(first_gen, steps[first_gen].threshold, "t=")] + [(col, thr, "t→") for col, thr in changes]
        for k, (col, thr, sign) in enumerate(marks):
            speed = trace.decode_speed(bounds[k + 1] - first_gen, start=col - first_gen)
            if sign == "t→":
                shapes.append(dict(type="line", x0=col - 0.5, x1=col - 0.5, y0=0, y1=1, yref="paper", line=dict(color="#1d4ed8", width=2, dash="dash")))
            annotations.append(dict(x=col - 0.5, y=1.0, yref="paper", text=f"{sign}{thr:.2f}" + (f" · {speed:.0f} tok/s" if speed else ""),
                                    showarrow=False, xanchor="left", yanchor="bottom", yshift=16 + 13 * (k % 2),
                                    font=dict(size=10, color="#1d4ed8")))

    if title is None:
        meta = trace.meta
        where = safe.text(f"{meta.get('model', 'model')} · {meta.get('granularity', '?')} · kv={meta.get('kv_policy_effective', meta.get('kv_policy', '?'))}")
        if what_if and threshold is not None:
            rate = _skip_rate(decided, generated)
            title = (
                f"<b>WHAT-IF</b> at threshold {threshold:.2f}, re-decided from the recorded scores (not a new run): "
                f"skip rate {rate:.0%}; <span style='color:{CHANGED}'>blue tint</span>: {changed_count} decisions differ · {where}"
            )
        else:
            title = f"{'Live run' if live else 'Recorded run'} · skip rate {_skip_rate(recorded, generated):.0%} (generated tokens) · {where}"
    # A long prompt (a document) would squeeze the generated tokens into a sliver: the view opens on them, with a few
    # prompt tokens before; plotly's double-click (autoscale) shows the whole prompt.
    start = 0
    n_gen = len(steps) - first_gen if first_gen else 0
    if first_gen and first_gen > max(64, 3 * n_gen):
        start = first_gen - max(8, n_gen // 4)
        title += " · <i>zoomed to the generated tokens: double-click for the prompt</i>"
    tickvals, ticktext = _ticks(columns[start:], labels[start:], MAX_TICKS // 2 if live else MAX_TICKS)
    height = max(300, min(720, 110 + 16 * n_layers)) + (qp.STRIP_PX + qp.GAP_PX if strip else 0)
    layout = dict(
        title=dict(text=title, font=dict(size=13), x=0.01, xanchor="left"),
        height=height,
        margin=dict(l=50, r=90, t=60, b=70),
        font=FONT,
        plot_bgcolor=BACKGROUND,
        paper_bgcolor="white",
        xaxis=dict(type="category", title=None, tickmode="array", tickvals=tickvals, ticktext=ticktext, tickangle=-50, tickfont=dict(size=10), showgrid=False, zeroline=False, range=[start - 0.5, n_tok - 0.5]),
        yaxis=dict(title="layer", dtick=1 if n_layers <= 24 else 2, showgrid=False, zeroline=False, range=[-0.5, n_layers - 0.5]),
        shapes=shapes,
        annotations=annotations,
        template={},  # everything is styled here; plotly's default template adds ~6 KB to every streamed frame
        uirevision="heatmap",  # keep the user's zoom while streaming
        meta=dict(routerlab="live" if live else "final", **({"what_if": threshold} if what_if and threshold is not None else {})),
        hoverlabel=dict(font=dict(family="ui-monospace, monospace")),
    )
    if strip:  # the layers above, the strip below; the x axis (token ticks) under the strip
        layout["yaxis"]["domain"], layout["yaxis2"] = qp.strip_axes(height - 60 - 70)
        layout["xaxis"]["anchor"] = "y2"
    return data, layout


def figure_json(data: list[dict], layout: dict) -> str:
    """Plotly figure JSON of plain trace / layout dicts, as plotly writes it: numpy arrays as base64 typed arrays."""

    def encode(obj):
        if isinstance(obj, np.ndarray):
            arr = np.ascontiguousarray(obj)
            return {"dtype": arr.dtype.str[1:], "bdata": base64.b64encode(arr.tobytes()).decode("ascii"),
                    "shape": ", ".join(str(n) for n in arr.shape)}
        if isinstance(obj, np.generic):
            return obj.item()
        raise TypeError(f"not JSON: {type(obj).__name__}")

    return json.dumps({"data": data, "layout": layout}, default=encode, separators=(",", ":"))


def templated_json(data: list[dict], layout: dict) -> str:
    """`figure_json` of a figure that leaves its template to plotly (layout without `template`): plotly's default
    template goes in, as `Figure.to_json` writes it, so the figure looks the same."""
    return figure_json(data, layout if "template" in layout else {**layout, "template": _default_template()})


@lru_cache(maxsize=1)
def _default_template() -> dict:
    return json.loads(go.Figure().to_json())["layout"]["template"]


def _fast_figure(data: list[dict], layout: dict) -> go.Figure:
    """A figure built without plotly's per-element validation (30x faster for a 300x30 heatmap).

    Validation walks every cell of every array in Python; the streaming heatmap cannot afford it.
    tests/test_plots.py rebuilds each figure with validation on, so a misspelt property still fails there.
    """
    return go.Figure(data=data, layout=layout, _validate=False)


# -- per-layer views -------------------------------------------------------------------------------
def layer_skip_bar(trace: Trace | None, threshold: float | None = None) -> go.Figure:
    """Skip rate per layer over generated tokens (recorded, or what-if at `threshold`)."""
    parts = _bar_parts(trace, threshold)
    return _empty_figure("No run yet.") if parts is None else _fast_figure(*parts)


def layer_skip_bar_json(trace: Trace | None, threshold: float | None = None, cache: dict | None = None) -> str:
    """`layer_skip_bar(...).to_json()` without building the Figure (a run's final view: milliseconds of the server).
    `cache`: the run's heatmap columns (`_columns`), whose recorded decisions it reads instead of converting them again."""
    parts = _bar_parts(trace, threshold, cache)
    return layer_skip_bar(None).to_json() if parts is None else templated_json(*parts)


def _bar_parts(trace: Trace | None, threshold: float | None, cache: dict | None = None) -> tuple[list[dict], dict] | None:
    if trace is None or not trace.steps:
        return None
    gen = [j for j, s in enumerate(trace.steps) if not s.is_prompt] or list(range(len(trace.steps)))
    decided = (_columns(trace, cache)[1] if cache is not None and threshold is None else _decisions(trace, threshold))[:, gen]
    rates, colours, texts = [], [], []
    for i in range(trace.n_layers):
        row = decided[i][~np.isnan(decided[i])]
        if row.size == 0:
            rates.append(0.0)
            colours.append("#cbd5e1")
            texts.append("not routed")
        else:
            r = float(1.0 - row.mean())
            rates.append(r)
            colours.append("#b23a48")
            texts.append(f"{r:.0%}")
    bar = dict(
        type="bar",
        x=list(range(trace.n_layers)),
        y=rates,
        marker=dict(color=colours),
        text=texts,
        textposition="outside" if trace.n_layers <= 16 else "none",
        cliponaxis=False,
        hovertemplate="layer %{x}<br>skipped %{y:.1%}<extra></extra>",
    )
    label = f"what-if at {threshold:.2f}" if threshold is not None else "recorded"
    # Layers without a router have no bar to colour (rate 0): the title names them instead.
    unrouted = [i for i, t in enumerate(texts) if t == "not routed"]
    if len(unrouted) == trace.n_layers:
        label += "; no layer has a router: nothing skips"
    elif unrouted:
        label += f"; {_layer_names(unrouted)} no router, always run{'s' if len(unrouted) == 1 else ''}"
    layout = dict(
        title=dict(text=f"Skip rate per layer ({label})", font=dict(size=13)),
        height=320,
        font=FONT,
        margin=dict(l=50, r=20, t=50, b=40),
        xaxis=dict(title="layer", dtick=1 if trace.n_layers <= 32 else 2),
        yaxis=dict(title="skipped", tickformat=".0%", range=[0, 1.1]),
        plot_bgcolor="white",
    )
    return [bar], layout


def _layer_names(layers: list[int]) -> str:
    """'layer 0 has', 'layers 0 and 29 have', 'layers 0, 1 and 29 have' (a long list: its count)."""
    if len(layers) == 1:
        return f"layer {layers[0]} has"
    if len(layers) > 6:
        return f"{len(layers)} layers have"
    return f"layers {', '.join(map(str, layers[:-1]))} and {layers[-1]} have"


# Light where a layer has few of its tokens' scores, dark where it has many; most cells hold a few percent (20 bins), so
# the scale changes fastest there: a uniform layer (5% a bin) reads mid-light, a layer whose tokens crowd one bin dark.
SHARE_SCALE = [[0.0, "#f7fbff"], [0.02, "#deebf7"], [0.05, "#9ecae1"], [0.15, "#4292c6"], [0.4, "#08519c"], [1.0, "#08306b"]]


def score_histogram(trace: Trace | None, bins: int = 20, threshold: float | None = None) -> go.Figure:
    """Per-layer score distributions as one layers x score-bins heatmap (share of that layer's tokens)."""
    parts = _histogram_parts(trace, bins, threshold)
    return _empty_figure("No run yet.") if parts is None else _fast_figure(*parts)


def score_histogram_json(trace: Trace | None, bins: int = 20, threshold: float | None = None, cache: dict | None = None) -> str:
    """`score_histogram(...).to_json()` without building the Figure. `cache`: the run's heatmap columns (`_columns`),
    whose scores it reads instead of converting them again."""
    parts = _histogram_parts(trace, bins, threshold, cache)
    return score_histogram(None).to_json() if parts is None else templated_json(*parts)


def layer_shares(scores: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Per layer (a row of `scores`, NaN where unrouted), the share of its scores in each bin of `edges`, as
    `np.histogram` bins them (each bin closed on the left, the last on both sides; scores outside clipped into the
    range); NaN for a layer without scores. All layers in one pass: a run's final view bins every one of them."""
    n_layers, bins = scores.shape[0], len(edges) - 1
    scored = ~np.isnan(scores)
    values = np.clip(scores[scored], edges[0], edges[-1])
    where = np.minimum(np.searchsorted(edges, values, side="right") - 1, bins - 1)
    layer = np.nonzero(scored)[0]
    counts = np.bincount(layer * bins + where, minlength=n_layers * bins).reshape(n_layers, bins).astype(float)
    totals = scored.sum(axis=1)
    shares = np.full((n_layers, bins), np.nan)
    shares[totals > 0] = counts[totals > 0] / totals[totals > 0, None]
    return shares


def _histogram_parts(trace: Trace | None, bins: int, threshold: float | None, cache: dict | None = None) -> tuple[list[dict], dict] | None:
    if trace is None or not trace.steps:
        return None
    scores = _columns(trace, cache)[0] if cache is not None else _scores(trace)
    edges = np.linspace(0.0, 1.0, bins + 1)
    counts = layer_shares(scores, edges)
    centers = ((edges[:-1] + edges[1:]) / 2).tolist()
    hist = dict(
        type="heatmap",
        z=counts.astype(np.float32),
        x=centers,
        y=list(range(trace.n_layers)),
        colorscale=SHARE_SCALE,
        zmin=0.0,
        zmax=1.0,
        hoverongaps=False,
        colorbar=dict(title=dict(text="share", side="right"), thickness=10, tickformat=".0%"),
        hovertemplate="layer %{y}<br>score ≈ %{x:.2f}<br>%{z:.1%} of tokens<extra></extra>",
    )
    thr = threshold if threshold is not None else (trace.steps[-1].threshold if trace.steps else None)
    shapes = []
    if thr is not None:
        shapes.append(dict(type="line", x0=thr, x1=thr, y0=0, y1=1, yref="paper", line=dict(color="#b23a48", width=2, dash="dash")))
    layout = dict(
        title=dict(text=f"Router score distribution per layer (all tokens; dashed line: threshold {thr:.2f})" if thr is not None else "Router score distribution per layer", font=dict(size=13)),
        height=max(300, min(640, 100 + 14 * trace.n_layers)),
        font=FONT,
        margin=dict(l=50, r=60, t=50, b=40),
        xaxis=dict(title="router score", range=[0, 1]),
        yaxis=dict(title="layer", dtick=1 if trace.n_layers <= 24 else 2),
        plot_bgcolor=BACKGROUND,
        shapes=shapes,
    )
    return [hist], layout


# -- live numbers ----------------------------------------------------------------------------------
def live_stats(trace: Trace | None, costs: dict[str, float] | None = None, threshold: float | None = None) -> dict[str, Any]:
    """The numbers the Explore tab shows: skip rate, measured decode speed, the speedup estimated from the
    per-layer `costs` measured at start-up (core.decode.costs), work and memory saved, and the quality cost so far.

    With `threshold` (a what-if view) the skip rate, savings and estimated speedup all follow the
    decisions re-made at that threshold; tokens/s and the quality cost stay the recorded run's.
    """
    if trace is None:
        return {}
    saved = savings(trace, threshold)
    scored = trace.scored_steps
    generated = trace.generated_steps
    loop = repetition([s.token_id for s in generated])
    return {
        "generated_tokens": len(trace.generated_steps),
        "prompt_tokens": len(trace.prompt_steps),
        "skip_rate": trace.skip_rate(threshold),
        "tokens_per_second": trace.decode_speed(),  # the quality pass's time taken out, as Compare does
        "speedup_estimate": estimate_speedup(trace, costs, threshold),
        "costs_measured": bool(costs),
        "costs_context": (costs or {}).get("context"),
        "costs_line": bool((costs or {}).get("per_token")),  # each token costed at its own context (core.decode.costs.cost_line)
        "run_context": context_of(trace),
        "quality": qp.measured(trace),
        "mean_kl": trace.mean_kl(),
        "agreement": trace.agreement(),
        "kl_scored": len(scored),
        "departure": departure(trace),  # where the text leaves the full model's greedy answer (core/records/divergence.py)
        "repetition": loop,
        "repeated_unit": "".join(s.text for s in generated[loop.start : loop.start + loop.period]) if loop else "",
        "attention_flops_saved": saved["attention_flops_saved"],
        "routed_flops_saved": saved["routed_flops_saved"],
        "kv_bytes_saved": saved["kv_bytes_saved"],
        "kv_bytes_full": saved["kv_bytes_full"],
        "prefill_seconds": trace.meta.get("prefill_seconds"),
        "stop_reason": trace.meta.get("stop_reason"),
        "kv_policy": trace.meta.get("kv_policy_effective", trace.meta.get("kv_policy")),
        "granularity": trace.meta.get("granularity"),
        "what_if": threshold is not None,
    }


def stats_html(stats: dict[str, Any], running: bool = False) -> str:
    """The live numbers as a row of small cards (plain HTML, no scripts)."""
    if not stats:
        return "<div class='rl-stats rl-muted'>No run yet.</div>"

    def card(label: str, value: str, hint: str = "") -> str:
        return f"<div class='rl-card' title='{safe.text(hint)}'><div class='rl-card-v'>{safe.text(value)}</div><div class='rl-card-l'>{safe.text(label)}</div></div>"

    kv_full = stats.get("kv_bytes_full") or 0.0
    kv_saved = stats.get("kv_bytes_saved") or 0.0
    what_if = " (what-if)" if stats.get("what_if") else ""
    speed_label, speed_value, speed_hint = qp.speed_card(stats)
    cards = [
        card("skip rate" + what_if, f"{stats['skip_rate']:.0%}", "skipped / routed sub-layer runs over generated tokens"),
        card("tokens/s (measured)", f"{stats['tokens_per_second']:.1f}", "this run's decode tokens per second: measured wall time per token"
             + (", not counting the quality meter's full-depth passes (as Compare does)" if stats.get("quality") else "")),
        card(speed_label + what_if, speed_value, speed_hint),
        *(card(label, value, hint) for label, value, hint in qp.quality_cards(stats)),
        card("attention FLOPs saved" + what_if, f"{stats['attention_flops_saved']:.0%}", "share of attention FLOPs (projections + scores) not computed"),
        card("KV cache saved", _fmt_bytes(kv_saved) + (f" ({kv_saved / kv_full:.0%})" if kv_full else ""), "bytes of keys/values never stored (drop policy only)"),
    ]
    state = "running…" if running else (f"stopped: {stats['stop_reason']}" if stats.get("stop_reason") else "")
    tokens = f"{stats['generated_tokens']} generated + {stats['prompt_tokens']} prompt tokens"
    foot = f"<div class='rl-foot'>{tokens} · {safe.text(stats.get('granularity') or '')} · kv policy <b>{safe.text(stats.get('kv_policy') or '?')}</b> · {safe.text(state)}</div>"
    why = ""
    if stats.get("skip_rate") and (stats.get("attention_flops_saved") or 0.0) < stats["skip_rate"]:
        why = ("<div class='rl-foot rl-muted'>Why attention FLOPs saved is below the skip rate: the skip rate counts the routed "
               "layers' runs only, the saving is over every layer's attention (a layer without a router never skips), and a skipped "
               "attention under <b>kv</b> still computes its keys and values for later tokens (under <b>drop</b> it does not).</div>")
    return f"<div class='rl-stats'>{''.join(cards)}</div>{foot}{why}"
