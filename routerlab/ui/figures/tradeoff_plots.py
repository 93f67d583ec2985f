"""The Trade-off tab's figures: pure functions of the committed benchmark results to plotly.

  - `quality_vs_skip`: skipped fraction against quality cost, two panels (KL from the full model on
    held-out prompts; perplexity rise in the trade-off sweep), tuned vs random vs static, per granularity;
  - `measured_vs_ideal`: measured speedup against the ideal one (the y = x line: skipping turned into time);
  - `time_split`: one decode step split into its measured pieces, and the speed ceiling of each granularity;
  - `time_pieces` / `ceilings`: the arithmetic behind the last one, as plain data;
  - `tradeoff_curve`: speed against quality per method (the sweep's rows, shipped or the visitor's quick sweep).

Inputs are plain data: rows of the sweep (dicts with `method`, `granularity`, `skip_rate_all_layers`,
`perplexity_increase`, `speedup`, `ideal_speedup`, ...), a held-out result (`bench`'s heldout_*.json:
`curve` -> tuned / random / static rows with `kl_full`) and a speed result (speed.json, `cost_seconds`).
Missing data gives a placeholder figure that says which file is missing. Knows nothing about torch,
Gradio, files or how the numbers were measured.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from routerlab.ui.figures import safe
from routerlab.ui.figures.plots import FONT, _empty_figure

# Colour by what skips (attention warm, MLP purple, block teal), dash by level (token solid,
# sequence dashed); the baselines in neutral grey and blue, with their own markers.
SERIES_COLORS = {"attention": "#e8590c", "mlp": "#7048e8", "block": "#0c8599", "random": "#868e96", "static": "#1c7ed6", "full": "#212529"}
BASELINES = ("random", "static")
FLOOR = 0.001  # a perplexity rise below 0.1% (or a fall) is drawn at 0.1% on the log axis; the hover has the value


def finite(x) -> float | None:
    """x as a finite float, or None (a missing, malformed or non-finite value in a result file)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _kind(row: dict) -> str:
    """tuned / tuned-drop / official-mask / random / static / full (load_bench may add the granularity to the name)."""
    return str(row.get("method", "?")).split(" ")[0]


def series_name(row: dict) -> str:
    kind, gran = _kind(row), str(row.get("granularity", ""))
    if kind in BASELINES:
        return f"{kind} ({gran})" if gran else kind
    policy = {"tuned-drop": ", drop", "official-mask": ", mask (official code)"}.get(kind, "")
    return f"tuned {gran}{policy}" if kind.startswith(("tuned", "official")) else kind


def _style(row: dict) -> dict:
    kind, gran = _kind(row), str(row.get("granularity", "attention-token"))
    if kind in BASELINES:
        return dict(line=dict(color=SERIES_COLORS[kind], width=2, dash="dot"), marker=dict(symbol="square" if kind == "static" else "x", size=8))
    target, _, level = gran.partition("-")
    color = "#c92a2a" if kind == "tuned-drop" else "#adb5bd" if kind == "official-mask" else SERIES_COLORS.get(target, SERIES_COLORS["full"])
    dash = "dash" if level == "sequence" else ("dashdot" if kind == "tuned-drop" else "solid")
    width = 3.5 if gran == "attention-token" and kind == "tuned" else 2
    return dict(line=dict(color=color, width=width, dash=dash), marker=dict(size=7 if width > 3 else 6, symbol="circle"))


def _groups(rows: list[dict], x: str) -> dict[str, list[dict]]:
    """Rows by series, each in order of `x`; the full model's row and rows without `x` left out."""
    out: dict[str, list[dict]] = {}
    for row in rows:
        if _kind(row) == "full" or finite(row.get(x)) is None:
            continue
        out.setdefault(series_name(row), []).append(row)
    return {k: sorted(v, key=lambda r: finite(r.get(x))) for k, v in out.items()}


def _base_layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    fig.update_layout(title=dict(text=title, font=dict(size=14), x=0.01), height=height, font=FONT, plot_bgcolor="white", paper_bgcolor="white",
                      margin=dict(l=60, r=20, t=80, b=50), legend=dict(orientation="h", y=-0.18, font=dict(size=11)), hoverlabel=dict(font_size=12))
    fig.update_xaxes(showgrid=True, gridcolor="#eeeeee", zeroline=False)
    fig.update_yaxes(showgrid=True, gridcolor="#eeeeee", zeroline=False)
    return fig


# -- 1. skipped fraction against quality cost ---------------------------------------------------------
def quality_vs_skip(rows: list[dict] | None, heldout: dict | None, heldout_name: str = "held-out prompts") -> go.Figure:
    """Two panels over the same x (share of all layers' sub-layer runs skipped): left, KL from the full
    model on held-out prompts (tuned vs random vs static); right, the perplexity rise in the sweep,
    per granularity, on a log axis. Either panel says so when its file is missing."""
    curve = heldout.get("curve") if isinstance(heldout, dict) else None
    rows = [r for r in rows or [] if isinstance(r, dict)]
    if not curve and not rows:
        return _empty_figure("No trade-off results in assets/bench/ (tradeoff.csv, heldout_sampled.json): run `make tradeoff` and `make heldout-sampled`.", height=420)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.09, subplot_titles=(
        f"KL from the full model ({safe.text(heldout_name)}; lower = closer)",
        "Perplexity rise in the trade-off sweep (log scale; lower = better)"))
    seen: set[str] = set()

    def add(name: str, group: list[dict], y: str, col: int, scale: float, floor: float | None = None) -> None:
        xs = [100 * finite(r["skip_rate_all_layers"]) for r in group]
        raw = [finite(r.get(y)) for r in group]
        ys = [None if v is None else max(scale * v, floor) if floor else scale * v for v in raw]
        text = [f"threshold {safe.text(r.get('threshold', '–'))}" if _kind(r) not in BASELINES else _baseline_setting(r) for r in group]
        unit = "%" if scale == 100 else " nats"
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="lines+markers", name=safe.text(name), legendgroup=name, showlegend=name not in seen, **_style(group[0]),
            customdata=[[("–" if v is None else f"{scale * v:+.2f}" if scale == 100 else f"{v:.3f}"), t] for v, t in zip(raw, text)],
            hovertemplate=f"<b>{safe.text(name)}</b><br>skipped %{{x:.1f}}% of all layers<br>%{{customdata[0]}}{unit}<br>%{{customdata[1]}}<extra></extra>",
        ), row=1, col=col)
        seen.add(name)

    if curve:
        for kind in ("tuned", *BASELINES):
            group = [dict(r, method=kind) for r in curve.get(kind, []) if isinstance(r, dict) and finite(r.get("kl_full")) is not None and finite(r.get("skip_rate_all_layers")) is not None]
            if group:
                add(series_name(group[0]), sorted(group, key=lambda r: finite(r["skip_rate_all_layers"])), "kl_full", 1, 1.0)
    else:
        fig.add_annotation(text="no held-out result (heldout_sampled.json)", showarrow=False, x=0.5, y=0.5, xref="x domain", yref="y domain", font=dict(color="#6b7280"), row=1, col=1)
    # the official code's masking skips nothing: its quality is the tuned kv rows' own (it belongs in the speed figure)
    groups = _groups([r for r in rows if finite(r.get("perplexity_increase")) is not None and _kind(r) != "official-mask"], "skip_rate_all_layers")
    for name, group in groups.items():
        add(name, group, "perplexity_increase", 2, 100.0, floor=100 * FLOOR)
    if not groups:
        fig.add_annotation(text="no trade-off sweep (tradeoff.csv)", showarrow=False, x=0.5, y=0.5, xref="x2 domain", yref="y2 domain", font=dict(color="#6b7280"), row=1, col=2)
    _base_layout(fig, "<b>What skipping costs</b>: at the same share skipped, tuned routers move the output far less than random or static skipping", 520)
    fig.update_xaxes(title_text="skipped (% of all layers' sub-layer runs)", ticksuffix="%")
    fig.update_yaxes(title_text="mean KL(full ‖ routed), nats per token", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="perplexity rise vs full model", type="log", dtick=1, ticksuffix="%", row=1, col=2)
    fig.update_annotations(font_size=12)
    return fig


def _baseline_setting(row: dict) -> str:
    if _kind(row) == "random":
        p = finite(row.get("p", row.get("threshold")))
        return f"each cell skipped with probability {p:.3f}" if p is not None else "random cells skipped"
    k = row.get("k")
    return f"{k} whole layer(s) dropped" if k is not None else "the least important layers dropped"


# -- 2. measured against ideal speedup -----------------------------------------------------------------
def measured_vs_ideal(rows: list[dict] | None, speed: dict | None = None) -> go.Figure:
    """Measured speedup (y) against the ideal one (x) for every sweep row, with y = x: a point on the
    line turned all the skipped work into time; below it, overheads ate part of it. speed.json's
    'attention off on the deep layers' runs (one per KV policy) are added as large markers."""
    rows = [r for r in rows or [] if isinstance(r, dict) and finite(r.get("speedup")) is not None and finite(r.get("ideal_speedup")) is not None]
    deep = _deep_points(speed)
    if not rows and not deep:
        return _empty_figure("No speed results in assets/bench/ (tradeoff.csv with ideal_speedup, speed.json): run `make tradeoff` and `make bench`.", height=420)
    fig = go.Figure()
    values = [1.0]
    for name, group in _groups(rows, "ideal_speedup").items():
        xs, ys = [finite(r["ideal_speedup"]) for r in group], [finite(r["speedup"]) for r in group]
        values += xs + ys
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="markers", name=safe.text(name), marker=dict(size=10, color=_style(group[0])["line"]["color"], symbol=_point_symbol(group[0]), opacity=0.85, line=dict(width=1, color="white")),
            customdata=[[f"{100 * (finite(r.get('skip_rate_all_layers')) or 0):.1f}%", safe.text(r.get("threshold", "–"))] for r in group],
            hovertemplate=f"<b>{safe.text(name)}</b><br>ideal %{{x:.3f}}×, measured %{{y:.3f}}×<br>skipped %{{customdata[0]}} · threshold %{{customdata[1]}}<extra></extra>",
        ))
    for policy, (ideal, measured, label) in deep.items():
        values += [ideal, measured]
        fig.add_trace(go.Scatter(
            x=[ideal], y=[measured], mode="markers+text", name=safe.text(label), text=[f" deep layers off, {policy}" if policy == "mask" else f"deep layers off, {policy} "],
            textposition="bottom right" if policy == "mask" else "middle left",
            marker=dict(size=15, symbol="diamond", color={"mask": "#adb5bd", "kv": "#e8590c", "drop": "#c92a2a"}.get(policy, "#212529"), line=dict(width=1.5, color="#212529")),
            hovertemplate=f"<b>{safe.text(label)}</b><br>ideal %{{x:.3f}}×, measured %{{y:.3f}}×<extra></extra>",
        ))
    lo, hi = min(values) - 0.02, max(values) + 0.03
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="measured = ideal", line=dict(color="#495057", dash="dash", width=1.5), hoverinfo="skip"))
    fig.add_hline(y=1.0, line=dict(color="#ced4da", width=1))
    _base_layout(fig, "<b>Measured against ideal speedup</b>: on the dashed line every skipped FLOP became time; below it, overheads took a share", 560)
    fig.update_layout(legend=dict(orientation="v", x=1.02, y=1.0, yanchor="top"), margin=dict(r=10))
    fig.update_xaxes(title_text="ideal speedup (the skipped work's measured cost removed), ×", range=[lo, hi])
    fig.update_yaxes(title_text="measured speedup (decode tok/s vs full, lockstep), ×", range=[lo, hi])
    return fig


def _point_symbol(row: dict) -> str:
    kind = _kind(row)
    if kind in BASELINES:
        return _style(row)["marker"]["symbol"]
    return "triangle-up" if str(row.get("granularity", "")).endswith("-sequence") else "circle"


def _deep_points(speed: dict | None) -> dict[str, tuple[float, float, str]]:
    if not isinstance(speed, dict) or not isinstance(speed.get("speedup"), dict) or not isinstance(speed.get("ideal_speedup"), dict):
        return {}
    n = len(speed.get("skipped_layers") or [])
    out = {}
    for policy in ("mask", "kv", "drop"):
        measured, ideal = finite(speed["speedup"].get(policy)), finite(speed["ideal_speedup"].get(policy))
        if measured is not None and ideal is not None:
            out[policy] = (ideal, measured, f"attention off on {n} deep layers, {policy} (bench speed)")
    return out


# -- 3. where the time goes ----------------------------------------------------------------------------
def _layers(costs: dict) -> int | None:
    """The layer count behind a cost breakdown (overhead = step - n * (attention + MLP) - head)."""
    af, mlp, step, head, over = (finite(costs.get(k)) for k in ("attention_full", "mlp", "step", "head", "overhead"))
    if None in (af, mlp, step, head, over) or af + mlp <= 0:
        return None
    n = round((step - over - head) / (af + mlp))
    return n if n > 0 else None


def time_pieces(costs: dict | None) -> list[tuple[str, float]] | None:
    """One decode step's measured pieces in seconds, in order: attention (queries, scores, output),
    keys & values, MLP, LM head, the rest (embedding, norms, residual adds, Python), then routing (what
    routers on every layer add to a step; may be below the noise). None when the costs are incomplete."""
    if not isinstance(costs, dict):
        return None
    n = _layers(costs)
    if n is None:
        return None
    af, kv, mlp = (finite(costs.get(k)) or 0.0 for k in ("attention_full", "attention_kv_only", "mlp"))
    kv = min(kv, af)
    return [
        ("attention (queries, scores, output)", n * (af - kv)),
        ("keys & values", n * kv),
        ("MLP", n * mlp),
        ("LM head", finite(costs["head"])),
        ("the rest (embedding, norms, residuals, Python)", max(0.0, finite(costs["overhead"]))),
        ("routing (routers on every layer)", finite(costs.get("routing")) or 0.0),
    ]


def ceilings(costs: dict | None) -> list[tuple[str, float]] | None:
    """The speedup each granularity reaches if it skipped its sub-layer on every layer for every token:
    step / (step - saved), `saved` what the engine really leaves out (kv keeps writing keys/values)."""
    pieces = time_pieces(costs)
    if pieces is None:
        return None
    p = dict(pieces)
    attention, kv, mlp = p["attention (queries, scores, output)"], p["keys & values"], p["MLP"]
    step = finite(costs["step"])
    saved = {"attention, kv policy": attention, "attention, drop policy": attention + kv, "MLP": mlp,
             "block, kv policy": attention + mlp, "block, drop policy": attention + kv + mlp}
    return [(name, step / (step - s)) for name, s in saved.items() if step - s > 0]


PIECE_COLORS = ["#e8590c", "#ffa94d", "#7048e8", "#495057", "#ced4da", "#2b8a3e"]


def time_split(speed: dict | None) -> go.Figure:
    """Top: one decode step of the measured model as a bar split into its pieces (ms and share).
    Bottom: the speed ceiling of each granularity if every layer skipped what it can skip."""
    costs = speed.get("cost_seconds") if isinstance(speed, dict) else None
    pieces, tops = time_pieces(costs), ceilings(costs)
    if pieces is None or tops is None:
        return _empty_figure("No cost breakdown in assets/bench/speed.json (cost_seconds): run `make bench`.", height=420)
    step = finite(costs["step"])
    where = f"{speed.get('model', 'the model')} on {speed.get('device', '?')}, {speed.get('threads', '?')} threads, {speed.get('prompt_tokens', '?')}-token prompt"
    fig = make_subplots(rows=2, cols=1, row_heights=[0.4, 0.6], vertical_spacing=0.27, subplot_titles=(
        f"One decode step of the full model: {1000 * step:.1f} ms ({safe.text(where)}, measured)",
        "Speed ceiling if every layer skipped it for every token: step / (step − what skipping saves)"))
    for (name, seconds), color in zip(pieces, PIECE_COLORS):
        if name.startswith("routing"):
            continue  # not a piece of the full model's step: said in the note under the bar
        share = seconds / step
        fig.add_trace(go.Bar(
            y=["decode step"], x=[1000 * seconds], orientation="h", name=safe.text(name), marker=dict(color=color, line=dict(color="white", width=1)),
            text=[f"{safe.text(name.split(' (')[0])}<br>{1000 * seconds:.1f} ms · {share:.0%}" if share >= 0.12 else f"{safe.text(name.split(' (')[0])}<br>{share:.0%}"],
            textposition="inside", insidetextanchor="middle", textangle=0, showlegend=False,
            textfont=dict(color="white" if color in ("#e8590c", "#7048e8", "#495057", "#2b8a3e") else "#212529"),
            hovertemplate=f"<b>{safe.text(name)}</b><br>%{{x:.2f}} ms per step ({share:.1%})<extra></extra>",
        ), row=1, col=1)
    routing = dict(pieces)["routing (routers on every layer)"]
    over = finite(costs["overhead"])
    note = ("attention: queries, scores, output projection · the rest: embedding, norms, residual adds, Python\nrouting: "
            + (f"{1000 * routing:+.1f} ms measured (routers on every layer), within the noise" if routing <= 0
               else f"+{1000 * routing:.1f} ms per step with routers on every layer (on top of this step)")
            + (f"\nthe pieces, each measured inside whole steps, add up to {1000 * -over:.1f} ms more than the step: noise" if over < 0 else ""))
    fig.add_annotation(text="<br>".join(safe.text(line) for line in note.split("\n")), showarrow=False, x=0, y=-0.3, align="left", yanchor="top", xref="x domain", yref="y domain", xanchor="left", font=dict(size=11, color="#6b7280"), row=1, col=1)
    names, values = [t[0] for t in tops], [t[1] for t in tops]
    fig.add_trace(go.Bar(
        y=names, x=values, orientation="h", showlegend=False, text=[f"{v:.2f}×" for v in values], textposition="outside",
        marker=dict(color=[SERIES_COLORS["block" if n.startswith("block") else "mlp" if n.startswith("MLP") else "attention"] for n in names], opacity=[0.55 if "drop" in n else 1.0 for n in names]),
        hovertemplate="<b>%{y}</b>: at most %{x:.2f}× the full model's decode speed<extra></extra>",
    ), row=2, col=1)
    _base_layout(fig, "<b>Where the time goes</b>: skipping saves only the part it skips; the LM head and the rest always run", 600)
    fig.update_layout(barmode="stack", margin=dict(l=160, r=40, t=90, b=50))
    fig.update_xaxes(ticksuffix=" ms", row=1, col=1)
    fig.update_xaxes(title_text="× the full model's decode speed (ceiling)", range=[1.0, max(values) * 1.15], row=2, col=1)
    fig.update_yaxes(autorange="reversed", row=2, col=1)
    fig.update_annotations(font_size=12)
    return fig


POLICY_DASH = {"kv": "solid", "drop": "dot"}
THRESHOLD_COLORS = ("#f59f00", "#c92a2a", "#862e9c")


def context_curve(result: dict | None) -> go.Figure:
    """`bench context` (assets/bench/context.json): measured speedup against context length for each threshold and KV
    policy (lockstep, against the full model), the ideal dashed beside each, KL and agreement in the hover."""
    points = [p for p in (result or {}).get("points", []) if isinstance(p, dict) and finite(p.get("context")) is not None]
    if not points:
        return _empty_figure("No context curve in assets/bench/ (context.json): run `make context`.", height=420)
    fig = go.Figure()
    cases = []
    for p in points:
        for r in p.get("runs", []):
            key = (finite(r.get("threshold")), str(r.get("kv_policy")))
            if key not in cases:
                cases.append(key)
    thresholds = sorted({t for t, _ in cases if t is not None})
    for t, policy in cases:
        color = THRESHOLD_COLORS[thresholds.index(t) % len(THRESHOLD_COLORS)] if t in thresholds else "#212529"
        xs, ys, ideal, hover = [], [], [], []
        for p in points:
            r = next((r for r in p.get("runs", []) if (finite(r.get("threshold")), str(r.get("kv_policy"))) == (t, policy)), None)
            if r is None or finite(r.get("speedup")) is None:
                continue
            xs.append(finite(p["context"]))
            ys.append(finite(r["speedup"]))
            ideal.append(finite(r.get("ideal_speedup")))
            hover.append([f"{100 * (finite(r.get('skip_rate')) or 0):.0f}%", f"{finite(r.get('mean_kl')) or 0:.3f}",
                          f"{100 * (finite(r.get('agreement')) or 0):.0f}%", f"{finite(r.get('ideal_speedup')) or 0:.2f}"])
        name = f"{t:.2f} {safe.text(policy)}"
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="lines+markers", name=f"{name} measured", line=dict(color=color, dash=POLICY_DASH.get(policy, "solid"), width=2.5),
            marker=dict(size=8, color=color), customdata=hover,
            hovertemplate=(f"<b>threshold {name}</b><br>%{{x}} tokens of context: %{{y:.2f}}× the full model (ideal %{{customdata[3]}}×)"
                           "<br>skipped %{customdata[0]} · KL %{customdata[1]} nats · top-1 agreement %{customdata[2]}<extra></extra>"),
        ))
        if any(v is not None for v in ideal):
            fig.add_trace(go.Scatter(x=xs, y=ideal, mode="markers", name=f"{name} ideal", marker=dict(size=7, symbol="line-ew-open", color=color,
                                     line=dict(width=2, color=color)), hovertemplate=f"<b>{name} ideal</b>: %{{y:.2f}}×<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color="#495057", width=1, dash="dash"))
    where = f"{safe.text(result.get('model', ''))} on {safe.text(result.get('device', '?'))}, {result.get('threads', '?')} threads"
    _base_layout(fig, f"<b>Where skipping pays</b>: decode speedup against context length ({where}; `make context`)", 460)
    fig.update_layout(legend=dict(orientation="v", x=1.02, y=1.0, yanchor="top"), margin=dict(r=10))
    fig.update_xaxes(title_text="context: prompt tokens (log scale)", type="log")
    fig.update_yaxes(title_text="speedup over the full model (lockstep), ×")
    return fig


QUALITY_AXES = {
    "perplexity": ("perplexity (lower is better)", "down = better"),
    "agreement": ("agreement with the full model (higher is better)", "up = better"),
}


def tradeoff_curve(df, current_threshold: float | None = None, quality: str = "perplexity") -> go.Figure:
    """Speed (x) vs quality (y) per method, one line per method.

    `df` is a pandas DataFrame with at least `method`, `speedup` and the `quality` column
    (`perplexity`, lower is better, or `agreement`, higher is better); optional columns
    `threshold`, `kv_policy`, `skip_rate` show in the hover. None or an empty frame gives a
    placeholder figure instead of an error.
    """
    if df is None or len(df) == 0 or not {"method", "speedup", quality} <= set(df.columns):
        return _empty_figure("No benchmark results yet (assets/bench/). Run a sweep to draw the curve.", height=380)
    y_title, better = QUALITY_AXES.get(quality, (quality, ""))
    fig = go.Figure()
    extra = [c for c in ("threshold", "granularity", "kv_policy", "skip_rate", "skip_rate_all_layers", "agreement") if c in df.columns and c != quality]
    for method, group in df.groupby("method", sort=False):
        group = group.sort_values("threshold" if "threshold" in group.columns and group["threshold"].notna().all() else "speedup")  # a sweep, in order
        custom = [[safe.text(v) for v in row] for row in group[extra].astype(str).values.tolist()] if extra else None
        hover = "<b>%{fullData.name}</b><br>speedup %{x:.2f}×<br>" + quality + " %{y:.3f}"
        for k, col in enumerate(extra):
            hover += f"<br>{col} %{{customdata[{k}]}}"
        fig.add_trace(
            go.Scatter(
                x=group["speedup"].astype(float).tolist(),
                y=group[quality].astype(float).tolist(),
                mode="lines+markers",
                name=safe.text(method),
                customdata=custom,
                hovertemplate=hover + "<extra></extra>",
            )
        )
    if current_threshold is not None and "threshold" in df.columns:
        with_t = df[df["threshold"].notna()]
        near = with_t.iloc[(with_t["threshold"].astype(float) - current_threshold).abs().argsort()[:1]]
        fig.add_trace(
            go.Scatter(
                x=near["speedup"].astype(float).tolist(),
                y=near[quality].astype(float).tolist(),
                mode="markers",
                marker=dict(size=16, symbol="circle-open", color="#111827", line=dict(width=2)),
                name=f"current threshold {current_threshold:.2f}",
                hoverinfo="skip",
            )
        )
    fig.update_layout(
        title=dict(text=f"Speed vs quality (right = faster, {better})", font=dict(size=13)),
        height=420,
        font=FONT,
        margin=dict(l=60, r=20, t=50, b=50),
        xaxis=dict(title="speedup vs full model (×)"),
        yaxis=dict(title=y_title),
        plot_bgcolor="white",
        legend=dict(orientation="h", y=-0.2),
    )
    return fig

