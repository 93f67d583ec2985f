"""The quality half of the trade-off, drawn: per-token KL to the full model as a strip, a token tint and stat cards.

Owns the KL colour scale (shared by the heatmap's strip and the text view's underline, so one
colour means one KL everywhere), `strip_traces` (the row under the heatmap's generated columns:
one cell per generated token, grey where not measured yet), the text view's per-token style and
hover title (`token_mark`) and legend, and the quality and speed stat cards' wording.

Knows nothing about torch, the engine or Gradio: it reads `Step.kl_full` / `full_top_text` (written
by core/records/quality.py's QualityMeter) and returns plain dicts and strings; plots.py places them.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from routerlab.core.records.divergence import MAX_PERIOD, REPEAT_MIN_TIMES, REPEAT_MIN_TOKENS
from routerlab.core.records.trace import Step, Trace

KL_MAX = 2.0  # nats: the darkest colour (the strip clips above; hover and title show the true value)
# Stops in KL nats. Most tokens of a good run sit far below 0.1 nats and a few spike to several,
# so the scale spends most of its colours near 0: a plain linear 0-2 scale would paint almost all white.
KL_STOPS = [(0.0, (245, 243, 255)), (0.02, (221, 214, 254)), (0.1, (167, 139, 250)), (0.5, (124, 58, 237)), (KL_MAX, (59, 7, 100))]
KL_SCALE = [[kl / KL_MAX, f"rgb{rgb}"] for kl, rgb in KL_STOPS]
PENDING = "#cbd5e1"  # a generated token whose KL is not measured yet (scored in chunks, at least every 2 s)
STRIP_PX, GAP_PX = 20, 12  # the strip's height and its gap to the heatmap, in pixels
LEGEND_KL = (0.01, 0.1, 0.5, KL_MAX)


def measured(trace: Trace) -> bool:
    """Whether this run measures its quality cost (switched on, or a trace that carries KLs)."""
    return bool(trace.meta.get("quality")) or any(s.kl_full is not None for s in trace.steps)


def kl_colour(kl: float) -> str:
    """The colour of a KL (nats) on KL_STOPS, linear between stops; KL_MAX and above are the darkest."""
    kl = min(max(float(kl), 0.0), KL_MAX) if math.isfinite(kl) else KL_MAX
    for (k0, c0), (k1, c1) in zip(KL_STOPS, KL_STOPS[1:]):
        if kl <= k1:
            f = (kl - k0) / (k1 - k0)
            return "rgb({},{},{})".format(*(round(a + (b - a) * f) for a, b in zip(c0, c1)))
    return "rgb({},{},{})".format(*KL_STOPS[-1][1])


def top_tokens(step: Step, label: Callable[[str], str]) -> str:
    """The hover line on a token's top tokens: both where the full model's differs, else that they agree.
    `label` makes a token's text short and visible (plots.token_label: whitespace shown, HTML escaped)."""
    if step.full_top_token is not None:
        return f"routed: {label(step.text)} · full model: {label(step.full_top_text or '')}"
    return "full model's top token = routed model's"


# -- the strip under the heatmap -------------------------------------------------------------------
def strip_traces(steps: list[Step], columns: list[str], label: Callable[[str], str]) -> list[dict]:
    """Two heatmap traces on the axis `y2`, one cell per generated column: the KL (NaN where not measured)
    and grey cells where a generated token's KL is not measured yet. `columns` are the heatmap's x categories."""
    gen = [(c, s) for c, s in zip(columns, steps) if not s.is_prompt]
    xs = [c for c, _ in gen]
    kl = np.array([np.nan if s.kl_full is None else s.kl_full for _, s in gen], dtype=float)
    text = [top_tokens(s, label) if s.kl_full is not None else "" for _, s in gen]
    pending = np.where(np.isnan(kl), 0.0, np.nan)
    common = dict(type="heatmap", x=xs, y=[0], xaxis="x", yaxis="y2", xgap=0, ygap=0, hoverongaps=False, showscale=False)
    return [
        dict(common, z=kl.reshape(1, -1).astype(np.float32), text=[text], zmin=0.0, zmax=KL_MAX, colorscale=KL_SCALE,
             name="quality cost", hovertemplate="pos <b>%{x}</b><br>KL to the full model %{z:.3f} nats<br>%{text}<extra></extra>"),
        dict(common, z=pending.reshape(1, -1).astype(np.float32), zmin=0.0, zmax=1.0, colorscale=[[0.0, PENDING], [1.0, PENDING]],
             name="not measured yet", hovertemplate="pos <b>%{x}</b><br>KL not measured yet (scored in chunks)<extra></extra>"),
    ]


def strip_axes(plot_px: float) -> tuple[list[float], dict]:
    """The heatmap's y domain above the strip, and the strip's own y axis (`yaxis2`), for a plot area of `plot_px` pixels."""
    low = min(0.3, (STRIP_PX + GAP_PX) / max(1.0, plot_px))
    strip = dict(domain=[0.0, min(0.2, STRIP_PX / max(1.0, plot_px))], range=[-0.5, 0.5], tickmode="array", tickvals=[0],
                 ticktext=["KL"], showgrid=False, zeroline=False, fixedrange=True, tickfont=dict(size=10, color="#5b21b6"))
    return [low, 1.0], strip


# -- the text view ---------------------------------------------------------------------------------
def token_mark(step: Step, on: bool, label: Callable[[str], str]) -> tuple[str, str]:
    """(CSS for the token's quality underline, text for its hover title) of a generated token."""
    if not on or step.is_prompt:
        return "", ""
    if step.kl_full is None:
        return f";box-shadow:inset 0 -3px 0 {PENDING}", " · KL not measured yet"
    return f";box-shadow:inset 0 -3px 0 {kl_colour(step.kl_full)}", f" · KL to the full model {step.kl_full:.3f} nats · {top_tokens(step, label)}"


def legend() -> str:
    swatches = " ".join(
        f"<span class='rl-tok' style='box-shadow:inset 0 -3px 0 {kl_colour(k)}'>{'≥' if k >= KL_MAX else ''}{k:g}</span>" for k in LEGEND_KL)
    return (f"<div class='rl-legend'>underline: quality cost, KL of each token's prediction from the full model's (nats): {swatches} "
            f"<span class='rl-tok' style='box-shadow:inset 0 -3px 0 {PENDING}'>not measured yet</span></div>")


# -- stat cards ------------------------------------------------------------------------------------
def visible(text: str, width: int = 10) -> str:
    """A short, visible form of a token's text (whitespace shown, truncated), not escaped: text_view.token_label
    escapes it for HTML; a card escapes its value itself."""
    shown = text.replace("\n", "⏎").replace("\t", "⇥")
    if shown.strip() == "":
        shown = "␣" * max(1, min(len(shown), 3))
    elif shown.startswith(" "):
        shown = "·" + shown[1:]
    return shown[: width - 1] + "…" if len(shown) > width else shown


AGREEMENT_HINT = ("share of the generated tokens where the full model's top-1 next token, given the routed text's own "
                  "prefix, is the routed model's top-1. Both read the routed text: once it has left the full model's "
                  "answer, the full model predicts a text it did not write (a loop is easy to predict), so see "
                  "“leaves the full model's answer”")
DEPARTURE_HINT = ("the first generated token that is not the full model's top-1 after the same text (the quality pass reads "
                  "the routed text at full depth): with greedy decoding every token before it is the full model's own "
                  "answer, word for word; from it on the texts differ (Compare shows both)")
REPEAT_HINT = (f"flagged when some unit of 1-{MAX_PERIOD} tokens repeats back to back over at least {REPEAT_MIN_TOKENS} "
               f"tokens and {REPEAT_MIN_TIMES} times (each token the same as the one a unit before it)")


def quality_cards(stats: dict) -> list[tuple[str, str, str]]:
    """(label, value, hint) of the mean-KL, agreement, departure and repetition cards; 'not measured' when the switch
    was off (repetition needs no full model)."""
    repeat = ("repeats itself", repeat_value(stats), REPEAT_HINT)
    if not stats.get("quality"):
        off = "not measured: switch on “Measure quality (full-model pass)” and generate again"
        return [("mean KL to full model", "not measured", off), ("top-1 agreement", "not measured", off),
                ("leaves the full model's answer", "not measured", off), repeat]
    scored, n = stats.get("kl_scored", 0), stats.get("generated_tokens", 0)
    so_far = f" ({scored} of {n} tokens measured so far)" if scored < n else ""
    mean, agree = stats.get("mean_kl"), stats.get("agreement")
    return [
        ("mean KL to full model", "–" if mean is None else f"{mean:.3f} nats",
         "KL(full || routed) of each generated token's next-token distribution, on the routed text's own prefix, averaged" + so_far),
        ("top-1 agreement", "–" if agree is None else f"{agree:.0%}", AGREEMENT_HINT + so_far),
        ("leaves the full model's answer", departure_value(stats), DEPARTURE_HINT + so_far),
        repeat,
    ]


def departure_value(stats: dict) -> str:
    """Where the text leaves the full model's greedy answer: 'token 2: “·a” for “·the”', 'not in 60 tokens', or why not."""
    d = stats.get("departure")
    if d is None or not d.scored:
        return "–"
    if stats.get("granularity") == "full":
        return "never: this is the full model"
    if not d.greedy:
        return "– (sampled text: no greedy answer)"
    if d.index is None:
        return f"not in {d.scored} tokens"
    return f"token {d.index + 1}: “{visible(d.wrote, 12)}” for “{visible(d.instead, 12)}”"


def repeat_value(stats: dict) -> str:
    """'no', or 'yes, from token 14: “.·a” ×20 to the end' (REPEAT_HINT's rule)."""
    loop = stats.get("repetition")
    if loop is None:
        return "no"
    return (f"yes, from token {loop.start + 1}: “{visible(stats.get('repeated_unit', ''), 16)}” ×{loop.times:.0f}"
            + (" to the end" if loop.to_end else ""))


def text_phrase(stats: dict) -> str:
    """What the finished run's status line says about the text itself: where it leaves the full model's answer, and
    whether it repeats itself ('' when neither applies)."""
    parts = []
    d = stats.get("departure")
    if stats.get("quality") and d is not None and d.index is not None and stats.get("granularity") != "full":
        parts.append(f"it leaves the full model's answer at token {d.index + 1}")
    elif stats.get("quality") and d is not None and d.greedy and d.scored and stats.get("granularity") != "full":
        parts.append(f"it is the full model's answer for all {d.scored} tokens")
    if stats.get("repetition") is not None:
        parts.append(f"it repeats itself from token {stats['repetition'].start + 1}")
    return "; " + " and ".join(parts) if parts else ""


def speed_card(stats: dict) -> tuple[str, str, str]:
    """(label, value, hint) of the estimated speedup: never a ratio of speeds measured under different conditions."""
    est = stats.get("speedup_estimate")
    if est is None:
        hint = ("per-layer costs not measured on this server (started with --no-warmup)" if not stats.get("costs_measured")
                else "no decoded token yet")
        return "est. speedup", "–", hint
    ctx, run = stats.get("costs_context"), stats.get("run_context")
    at = f" at {ctx:.0f} cached tokens" if ctx else ""
    if stats.get("costs_line") and run:  # attention's cost grows with the cache: this run's own context counts
        at = f" at two contexts; each token costed at its own, this run's mean {run:,.0f} cached tokens"
    return ("est. speedup (per-layer costs)", f"{max(1.0, est):.2f}×",
            "estimated from measured per-layer costs: the full model's measured decode step, minus the measured cost of the "
            f"skipped sub-layers under this KV policy (timed on this machine{at}); not a side-by-side measurement (Compare measures one)")


def speed_phrase(stats: dict) -> str:
    """The speed half of the finished run's status line."""
    tps = stats.get("tokens_per_second") or 0.0
    est = stats.get("speedup_estimate")
    phrase = f"decode {tps:.1f} tok/s (measured" + (", not counting the quality pass)" if stats.get("quality") else ")")
    if est is not None:
        phrase += f", speedup {max(1.0, est):.2f}× estimated from measured per-layer costs"
    return phrase
