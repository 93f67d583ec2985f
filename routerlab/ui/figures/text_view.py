"""The text view of a run: each token as a tinted span (layers used), underlined by its quality cost.

Owns `token_label` (a short, visible, escaped label for a token, also the heatmap's tick text),
`token_html` (the generated text, tint, hover titles, legends; a cache for a streamed run) and
`first_divergence` (where two runs' texts part). plots.py re-exports them. Knows nothing about
torch, the engine or Gradio: plain Steps in, HTML strings out; everything the model wrote is escaped.
"""

from __future__ import annotations

import html
from typing import Iterable

from routerlab.core.records.trace import Step, Trace
from routerlab.ui.figures import quality_plots as qp
from routerlab.ui.figures import safe


def token_label(text: str, width: int = 10) -> str:
    """A short, visible label for a token: whitespace made visible, truncated, escaped (safe.text: HTML and plotly alike)."""
    return safe.text(qp.visible(text, width))


def _tint(fraction_used: float) -> str:
    """Background for a token that used `fraction_used` of the layers: white (all) -> teal (few)."""
    f = max(0.0, min(1.0, 1.0 - fraction_used))
    # interpolate white (255,255,255) -> teal (45,160,160)
    r, g, b = (round(255 + (t - 255) * min(1.0, f * 2.5)) for t in (45, 160, 160))
    return f"rgb({r},{g},{b})"


def token_html(
    trace: Trace | None,
    threshold: float | None = None,
    diverge_at: int | None = None,
    include_prompt: bool = False,
    steps: Iterable[Step] | None = None,
    cache: dict | None = None,
) -> str:
    """Generated text with each token tinted by how many layers it used (deeper tint = more skipped), and,
    for a run that measures its quality cost, underlined by its KL to the full model (quality_plots.token_mark;
    the hover title gives the KL and both top tokens where they differ).

    Everything the model wrote is HTML-escaped. `diverge_at` (index among generated tokens) gets a
    red outline: the first token where this run and the other one in Compare disagree.
    `cache` (a dict the caller keeps for one growing run, recorded decisions, no outline): each token's
    span is built once, and once more when its quality cost arrives; a streamed frame only joins them.
    """
    if trace is None:
        return "<div class='rl-text rl-muted'>The generated text appears here.</div>"
    n = max(1, trace.n_layers)
    chosen = list(steps) if steps is not None else [s for s in trace.steps if include_prompt or not s.is_prompt]
    matrix = trace.executed_matrix(threshold) if threshold is not None else None
    index = {id(s): j for j, s in enumerate(trace.steps)} if matrix is not None else {}
    if matrix is not None or diverge_at is not None:
        cache = None
    parts, gen_i = [], 0
    quality = qp.measured(trace)
    for s in chosen:
        hit = cache.get(id(s)) if cache is not None else None
        if hit is not None and hit[0] is s.kl_full:
            parts.append(hit[1])
            continue
        if matrix is not None:
            j = index[id(s)]
            used = sum(matrix[i][j] is not False for i in range(trace.n_layers))
        else:
            used = s.layers_used
        text = "⏎<br>".join(safe.text(line) for line in s.text.split("\n"))
        title = f"pos {s.position} · {used}/{n} layers used"
        cls = "rl-tok rl-prompt" if s.is_prompt else "rl-tok"
        if not s.is_prompt and diverge_at is not None and gen_i == diverge_at:
            cls += " rl-diverge"
            title += " · first token that differs"
        mark, about = qp.token_mark(s, quality, _plain_label)
        parts.append(f"<span class='{cls}' style='background:{_tint(used / n)}{mark}' title='{safe.text(title + about)}'>{text}</span>")
        if cache is not None:
            cache[id(s)] = (s.kl_full, parts[-1])
        if not s.is_prompt:
            gen_i += 1
    body = "".join(parts) or "<span class='rl-muted'>(no tokens yet)</span>"
    legend = (
        "<div class='rl-legend'>tint: <span class='rl-tok' style='background:" + _tint(1.0) + "'>all layers</span> "
        "<span class='rl-tok' style='background:" + _tint(0.8) + "'>80%</span> "
        "<span class='rl-tok' style='background:" + _tint(0.6) + "'>≤60% of layers used</span></div>"
    )
    return f"<div class='rl-text'>{body}</div>{legend}{qp.legend() if quality else ''}"


def _plain_label(text: str) -> str:
    """token_label without the escaping (for a title attribute, which is escaped once as a whole)."""
    return html.unescape(token_label(text, 16))


def first_divergence(a: Trace | None, b: Trace | None) -> int | None:
    """Index of the first generated token where two runs differ (None when one is a prefix of the other)."""
    if a is None or b is None:
        return None
    ga, gb = a.generated_steps, b.generated_steps
    for j, (x, y) in enumerate(zip(ga, gb)):
        if x.token_id != y.token_id:
            return j
    return None
