"""The five slide figures, drawn at 1920 x 1080 with slide-sized text: pure functions of plain numbers (or a Trace).

Owns the slide style (`FONT_PX` >= 20 px everywhere, titles larger; `slide`), the app's own figures restyled
for a slide (`heatmap`: plots.heatmap with its quality strip; `tradeoff`: the Trade-off tab's first figure),
and three new ones (`layers`, `ladder`, `kv`: bars and a layers x prompts map). Every figure is static: no
hover, no live-view metadata. The layer map and the bar figures draw the very dicts numbers.json holds
(slides/numbers.py makes them), so a slide and the file quote the same values. Knows nothing about torch, models or files.
"""

from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from routerlab.core.records.trace import Trace
from routerlab.slides.export import HEIGHT, WIDTH
from routerlab.ui.figures import plots

FONT_PX, TICK_PX, TITLE_PX = 24, 20, 38  # body text, tick labels, title (px at 1920 wide)
INK, MUTED = "#111827", "#4b5563"
FULL_COLOUR = "#374151"
RUNG_COLOURS = ("#f4a259", "#d9653b", "#b23a48", "#7f1d3f")  # lowest to highest threshold (the heatmap's warm scale)
POLICY_COLOURS = {"mask": "#4c6ef5", "kv": "#e8590c", "drop": "#c92a2a"}
SAME = "#d1d5db"  # a run whose text is the full model's: no token differs
TICKS = 28  # at most this many token labels under the heatmap


def slide(fig: go.Figure, title: str, subtitle: str, margin: dict) -> go.Figure:
    """Slide size and type: title and subtitle at the top left, every axis' text >= TICK_PX, nothing interactive."""
    fig.update_layout(
        width=WIDTH, height=HEIGHT, autosize=False, hovermode=False, dragmode=False, uirevision=None, meta=None,
        font=dict(family=plots.FONT["family"], size=FONT_PX, color=INK), paper_bgcolor="white", margin=margin,
        hoverlabel=dict(font=dict(size=TICK_PX)),
        title=dict(text=title, x=0.012, xanchor="left", y=0.975, yanchor="top", yref="container", font=dict(size=TITLE_PX),
                   subtitle=dict(text=subtitle, font=dict(size=FONT_PX - 2, color=MUTED))),
    )
    fig.update_xaxes(tickfont=dict(size=TICK_PX), title_font=dict(size=FONT_PX), automargin=True)
    fig.update_yaxes(tickfont=dict(size=TICK_PX), title_font=dict(size=FONT_PX), automargin=True)
    return fig


def note(fig: go.Figure, text: str) -> go.Figure:
    """A footnote under the plots, from their left edge (call it last: it is an annotation like the panel titles)."""
    if text:
        fig.add_annotation(text=text, xref="paper", yref="paper", x=0.0, y=-0.035, xanchor="left", yanchor="top", align="left",
                           showarrow=False, font=dict(size=FONT_PX - 4, color=MUTED))
    return fig


def _pct(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{100 * x:.{digits}f}%"


# -- 1. the heatmap of one run, with its quality strip ----------------------------------------------
def heatmap(trace: Trace, title: str, subtitle: str) -> go.Figure:
    """plots.heatmap(trace) restyled: fewer, larger token labels, three colour bars (ran, skipped, KL), bigger strip."""
    fig = go.Figure(plots.heatmap(trace, title=title).to_dict())  # built unvalidated (a streamed frame's shortcut): validate to restyle
    columns = list(fig.data[0].x)
    labels = [plots.token_label(s.text) for s in trace.steps]
    every = max(1, -(-len(columns) // TICKS))
    bar = dict(thickness=28, len=0.28, tickfont=dict(size=TICK_PX), x=1.01, xanchor="left")
    fig.update_traces(selector=dict(name="ran"), colorbar=dict(bar, y=0.86, title=dict(text="ran: router score", side="right", font=dict(size=TICK_PX))))
    fig.update_traces(selector=dict(name="skipped"), colorbar=dict(bar, y=0.5, title=dict(text="skipped: score", side="right", font=dict(size=TICK_PX))))
    fig.update_traces(selector=dict(name="quality cost"), showscale=True,
                      colorbar=dict(bar, y=0.14, tickvals=[0, 0.5, 1, 1.5, 2], ticktext=["0", "0.5", "1", "1.5", "≥2"],
                                    title=dict(text="strip: KL (nats)", side="right", font=dict(size=TICK_PX))))
    slide(fig, title, subtitle, dict(l=110, r=250, t=210, b=150))
    fig.update_layout(plot_bgcolor=plots.BACKGROUND)
    fig.update_xaxes(tickvals=columns[::every], ticktext=labels[::every], tickangle=-55)
    fig.update_layout(yaxis=dict(domain=[0.1, 1.0], title=dict(text="layer"), dtick=2))
    if "yaxis2" in fig.layout and fig.layout.yaxis2.domain:
        fig.update_layout(yaxis2=dict(domain=[0.0, 0.06], tickfont=dict(size=TICK_PX, color="#5b21b6")))
    fig.update_annotations(font_size=FONT_PX - 2)
    return fig


# -- 2. the trade-off curve: the Trade-off tab's first figure ---------------------------------------------
def tradeoff(fig: go.Figure, title: str, subtitle: str) -> go.Figure:
    """tradeoff_plots.quality_vs_skip restyled: thicker lines, larger markers, the legend under the panels."""
    for trace in fig.data:
        if getattr(trace, "line", None) is not None:
            trace.line.width = 1.6 * (trace.line.width or 2)
        if getattr(trace, "marker", None) is not None:
            trace.marker.size = 1.7 * (trace.marker.size or 6)
    slide(fig, title, subtitle, dict(l=110, r=50, t=200, b=210))
    fig.update_layout(legend=dict(orientation="h", x=0.0, xanchor="left", y=-0.13, yanchor="top", font=dict(size=TICK_PX)),
                      plot_bgcolor="white")
    fig.update_annotations(font_size=FONT_PX - 2)
    return fig


# -- 3. the layer map: skip rate per layer and prompt -----------------------------------------------------
def layers(numbers: dict, title: str, subtitle: str) -> go.Figure:
    """Left: layers x prompts, each cell the share of that layer's routed runs skipped while generating.
    Right: the same over all prompts' tokens together, as bars. A layer without a router is blank."""
    n = len(numbers["all_prompts"])
    ys = list(range(n))
    z = np.array([[np.nan if r is None else r for r in numbers["per_layer"][str(i)]] for i in ys], dtype=float)
    pooled = [numbers["all_prompts"][str(i)] for i in ys]
    top = max([float(np.nanmax(z)) if np.isfinite(z).any() else 0.0, 0.05])
    top_bar = max([v for v in pooled if v is not None] + [0.02])
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, column_widths=[0.64, 0.36], horizontal_spacing=0.02)
    fig.add_trace(go.Heatmap(
        z=z, x=[f"{html.escape(t)}<br>{n_gen} tokens" for t, n_gen in zip(numbers["prompts"], numbers["generated_tokens"])], y=ys, zmin=0.0, zmax=top, xgap=2, ygap=2,
        colorscale=[[0.0, "#fff7ed"], [0.35, "#f4a259"], [1.0, "#b23a48"]], texttemplate="%{z:.0%}", textfont=dict(size=TICK_PX),
        showscale=False,
    ), row=1, col=1)
    fig.add_trace(go.Bar(
        y=ys, x=[0.0 if v is None else v for v in pooled], orientation="h", marker=dict(color=["#cbd5e1" if v is None else "#b23a48" for v in pooled]),
        text=["no router" if v is None else f"{100 * v:.0f}%" for v in pooled], textposition="outside", cliponaxis=False,
        textfont=dict(size=TICK_PX), showlegend=False,
    ), row=1, col=2)
    slide(fig, title, subtitle, dict(l=120, r=60, t=225, b=110))
    fig.update_layout(plot_bgcolor=plots.BACKGROUND)
    fig.update_yaxes(title_text="layer", dtick=1, range=[-0.5, n - 0.5], row=1, col=1)
    fig.update_yaxes(dtick=1, range=[-0.5, n - 0.5], row=1, col=2)
    fig.update_xaxes(side="top", row=1, col=1)
    fig.update_xaxes(tickformat=".0%", range=[0, top_bar * 1.35], showgrid=True, gridcolor="#ffffff",
                     title_text="all prompts' generated tokens together", row=1, col=2)
    return fig


# -- 4. and 5.: rows of bars, one panel per number ------------------------------------------------------
def _panels(rows: list[dict], panels: list[tuple[str, str, str]], colours: list[str], title: str, subtitle: str,
            footnote: str = "", left: int = 260) -> go.Figure:
    """One column of horizontal bars per panel (key, panel title, how the bars' text is written), one row per run;
    a row's value under `key`, its text under `key + '_text'` (the first row on top)."""
    labels = [r["label"] for r in rows]
    fig = make_subplots(rows=1, cols=len(panels), shared_yaxes=True, horizontal_spacing=0.035, subplot_titles=[p[1] for p in panels])
    for k, (key, _, _) in enumerate(panels, start=1):
        values = [r.get(key) or 0.0 for r in rows]
        fig.add_trace(go.Bar(
            y=labels, x=values, orientation="h", text=[r[key + "_text"] for r in rows], textposition="outside", cliponaxis=False,
            textfont=dict(size=TICK_PX), marker=dict(color=[r.get(key + "_colour", c) for r, c in zip(rows, colours)]), showlegend=False,
        ), row=1, col=k)
        top = max(values + [1e-9])
        fmt = panels[k - 1][2]
        fig.update_xaxes(range=[0, top * 1.75], showticklabels=False, showgrid=False, zeroline=True, zerolinecolor="#9ca3af", row=1, col=k)
        if fmt == "%":
            fig.update_xaxes(tickformat=".0%", row=1, col=k)
    slide(fig, title, subtitle, dict(l=left, r=110, t=250, b=110 if footnote else 50))
    fig.update_layout(plot_bgcolor="white", bargap=0.35)
    fig.update_yaxes(autorange="reversed")
    fig.update_annotations(font_size=FONT_PX - 2, yshift=12)
    return note(fig, footnote)


def _diff_cells(row: dict) -> dict:
    """The 'first token that differs' cell of a run: a bar up to that token, light grey when none does."""
    j, n = row.get("first_difference_token"), row.get("generated_tokens") or 0
    if row.get("reference"):
        return dict(diff=0.0, diff_text="(reference)")
    if j is None:  # the same text, or one run stopped early with the other's text so far
        return dict(diff=float(n), diff_text="none: same text" if row.get("same_text_as_full") else f"none in {n} tokens", diff_colour=SAME)
    return dict(diff=float(j), diff_text=f"token {j} of {n}")


def ladder(numbers: dict, title: str, subtitle: str, footnote: str = "") -> go.Figure:
    """The Compare tab's ladder as five panels: skipped, decode tokens/s, mean KL, top-1 agreement, first difference."""
    rows, colours = [], []
    for k, r in enumerate(numbers["rows"]):
        full = r["threshold"] is None
        label = "<b>full model</b>" if full else f"<b>threshold {r['threshold']:.2f}</b>" + ("<br>(calibrated default)" if r.get("calibrated") else "")
        speed = f"{r['tokens_per_second']:.1f}" + ("" if full or not r.get("speedup") else f" · {r['speedup']:.2f}×")
        rows.append(dict(
            label=label, skip=r["skip_rate"], skip_text=_pct(r["skip_rate"]), tps=r["tokens_per_second"], tps_text=speed,
            kl=r["mean_kl"], kl_text="0 (itself)" if full else ("–" if r["mean_kl"] is None else f"{r['mean_kl']:.3f}"),
            agree=r["agreement"], agree_text=_pct(r["agreement"], 0), **_diff_cells(dict(r, reference=full)),
        ))
        colours.append(FULL_COLOUR if full else RUNG_COLOURS[min(k - 1, len(RUNG_COLOURS) - 1)])
    panels = [("skip", "skipped<br>(routed attention runs)", "%"), ("tps", "decode tokens/s<br>(× the full model)", ""),
              ("kl", "mean KL from the full<br>model (nats per token)", ""), ("agree", "top token is the<br>full model's", "%"),
              ("diff", "first generated token<br>that differs", "")]
    return _panels(rows, panels, colours, title, subtitle, footnote)


def kv(numbers: dict, title: str, subtitle: str, footnote: str = "") -> go.Figure:
    """The three KV policies at one threshold next to the full model: speed, work and cache saved, same text or not."""
    rows, colours = [], []
    full = numbers["full"]
    rows.append(dict(label="<b>full model</b>", tps=full["tokens_per_second"], tps_text=f"{full['tokens_per_second']:.1f}",
                     attn=0.0, attn_text="(reference)", kvb=0.0, kvb_text="(reference)", **_diff_cells(dict(reference=True))))
    colours.append(FULL_COLOUR)
    for policy, r in numbers["policies"].items():
        kv_share = r["kv_bytes_saved"] / r["kv_bytes_full"] if r["kv_bytes_full"] else 0.0
        speed = f"{r['tokens_per_second']:.1f}" + (f" · {r['speedup']:.2f}×" if r.get("speedup") else "")
        rows.append(dict(
            label=f"<b>{policy}</b><br>{_pct(r['skip_rate'], 0)} skipped", tps=r["tokens_per_second"], tps_text=speed,
            attn=r["attention_flops_saved"], attn_text=_pct(r["attention_flops_saved"]),
            kvb=kv_share, kvb_text=f"{plots._fmt_bytes(r['kv_bytes_saved'])} ({_pct(kv_share)})", **_diff_cells(r),
        ))
        colours.append(POLICY_COLOURS.get(policy, FULL_COLOUR))
    panels = [("tps", "decode tokens/s<br>(× the full model)", ""), ("attn", "attention FLOPs<br>not computed", "%"),
              ("kvb", "KV cache<br>never stored", "%"), ("diff", "first generated token<br>that differs from the full model's", "")]
    return _panels(rows, panels, colours, title, subtitle, footnote, left=230)
