"""The Explore tab's handlers: stream one generation, stop it, steer it, and the what-if view.

Owns `explore_run` (text, throttled heatmap with its quality strip, stats and status while
decoding; figures and exports at the end), `stop_run` / `show_last` (Stop for both tabs, then the stopped run's view)
and `threshold_moved` (the slider steers a running Explore or Compare run, or re-decides the last
run from its recorded scores). Knows nothing about the layout or tensors: it calls the engine
through `Resources`, draws with `plots`, and decodes through `stream.Decoder`.
"""

from __future__ import annotations

import logging
import time
from functools import lru_cache
from typing import Iterator

import gradio as gr

from routerlab.core.base.errors import RouterLabError
from routerlab.core.records.trace import Trace
from routerlab.ui.figures import plots
from routerlab.ui.figures import quality_plots as qp
from routerlab.ui.figures import safe
from routerlab.ui.state import fields
from routerlab.ui.state.resources import Resources
from routerlab.ui.state.session import Session, _export, _shown, _status, _warn, plot_data, without_paths
from routerlab.ui.state.stream import Decoder, prefill_progress
from routerlab.ui.web.heatmap_export import LABEL

log = logging.getLogger(__name__)

STATS_INTERVAL = 2.0  # seconds between stat-card updates while streaming (savings() walks every cell)


def _done_status(trace: Trace, res: Resources, wall: float, stats: dict | None = None) -> str:
    """The status line of a finished run; `stats`: its `plots.live_stats`, when the caller has them."""
    m = trace.meta
    n = len(trace.generated_steps)
    reason = {"eos": "end of text", "max_new_tokens": "max new tokens reached", "stopped": "stopped by you"}.get(m.get("stop_reason"), m.get("stop_reason"))
    stats = stats if stats is not None else plots.live_stats(trace, res.costs_for(m.get("model")))
    quality = ""
    if stats["mean_kl"] is not None:
        quality = (f"; quality cost: mean KL {stats['mean_kl']:.3f} nats, top-1 agreement {stats['agreement']:.0%} with the full model "
                   "(its top-1 on this text's own prefix)")
    quality += qp.text_phrase(stats)
    return _status(
        "stop" if m.get("stop_reason") == "stopped" else "ok",
        f"Done: {n} tokens in {wall:.1f} s ({reason}); {qp.speed_phrase(stats)}{quality}; "
        f"skip rate {stats['skip_rate']:.0%}, granularity {safe.text(m.get('granularity'))}, kv policy {safe.text(m.get('kv_policy_effective'))}. "
        + _what_if_hint(trace, "Move the threshold slider to see a what-if view from the recorded scores.") + _shared_note(m),
    )


def _has_scores(trace: Trace) -> bool:
    """The run recorded router scores a what-if view can re-decide (the full model's run has none)."""
    return any(s is not None for step in trace.steps for s in step.scores)


def _what_if_hint(trace: Trace, hint: str) -> str:
    """`hint` where the run has scores to re-decide; else what is true of a full-model run."""
    if _has_scores(trace):
        return hint
    return "The full model has no router scores, so no threshold changes what it did: pick a router set to see skipping."


def explore_run(res: Resources, prompt, threshold, router_label, kv_policy, max_new_tokens, temperature, model_name, session: Session,
                quality=True) -> Iterator[tuple]:
    """Stream one generation: text, heatmap (throttled), stats, status; then figures and exports.

    `quality` (the "Measure quality" switch, last so that API callers without it keep working): score
    each generated token against the full model (core/records/quality.py), shown as the heatmap's strip, the
    text's underline and the stats' mean KL and agreement.

    Yields 10 values: text, heatmap, stats, status, trace file, the heatmap download button's label, layer bar, score histogram, generate button,
    live heatmap frame. While streaming, the heatmap holds a placeholder and the heatmap's frames (figure JSON,
    `plots.heatmap_json(live=True)`) go to the last value, which the page draws into the heatmap's plot
    (layout.LIVE_HEATMAP_JS); the final figure goes to the heatmap itself, and the last value is emptied.
    """
    from routerlab.core.decode.engine import Control

    skip = gr.skip()
    session = session if isinstance(session, Session) else Session()
    try:
        res.check_prompt(prompt)
        engine = res.engine_for(model_name)
        routers = res.routers_for(engine, router_label, session.router_sets)
        config = res.generate_config(max_new_tokens, temperature, threshold, kv_policy, quality=quality)  # each checked (fields.py)
        control = Control(config.threshold)
        steps = engine.generate(prompt, routers, config, control)
    except RouterLabError as err:
        yield skip, skip, skip, _warn(err), skip, skip, skip, skip, gr.Button(interactive=True), skip
        return
    if session.control is not None:  # one Explore run per session: a new click ends the old one
        session.control.request_stop()
    session.control, session.trace, session.running = control, control.trace, True
    trace = control.trace
    live = routers is not None and routers.config.level == "token"
    note = "" if live else (" (full model: the threshold has no effect)" if routers is None else " (sequence level: decided once per prompt)")
    # the heatmap's placeholder for this run: live frames are drawn into it in the browser (never over a final figure)
    heat = _heat_note("Prefilling the prompt: the heatmap draws as tokens arrive.")
    # Every frame, the first included, repeats the values it does not change (see plot_data): no gr.skip(), which
    # Gradio turns into a rebuild of the component's whole config (an HTML component's: milliseconds of the server).
    live_frame = ""  # the latest heatmap frame (figure JSON); repeated in frames that do not redraw it
    stats = _shown(session, "stats", lambda: plots.stats_html({}))
    bar = _shown(session, "bar", _empty_bar)
    hist = _shown(session, "hist", _empty_hist)
    status = _status("run", f"Prefilling the prompt on {safe.text(engine.name)}{note}…")
    columns: dict = {}  # this run's heatmap columns, converted once each (plots._columns)
    spans: dict = {}  # this run's token spans, built once each (plots.token_html)
    yield plots.token_html(trace, cache=spans), heat, stats, status, None, LABEL, bar, hist, gr.Button(interactive=False), live_frame

    start = next_stats = time.perf_counter()
    decoder = Decoder([steps])
    costs = res.costs_for(engine.name)
    try:
        for snap, draw_plot in decoder.frames([trace], runs=[control]):  # frames wait out its quality passes
            snap = snap[0]
            if decoder.done.is_set():
                break  # the final view below draws everything once
            if len(snap.steps) < snap.meta.get("prompt_tokens", 1 << 30):  # still reading the prompt: say how far
                reading = prefill_progress([control])
                if reading:
                    yield plots.token_html(snap, cache=spans), heat, stats, _status("run", f"{reading.capitalize()} on {safe.text(engine.name)}{note}…"), None, LABEL, bar, hist, "Generate", live_frame
                continue
            if draw_plot:
                live_frame = plots.heatmap_json(snap, live=True, cache=columns)
                status = _status("run", f"Generating… {len(snap.generated_steps)} tokens, threshold {control.threshold:.2f}{note}{_sharing(control)}")
                if time.perf_counter() >= next_stats:
                    next_stats = time.perf_counter() + STATS_INTERVAL
                    stats = session.views["stats"] = plots.stats_html(plots.live_stats(snap, costs), running=True)
            yield plots.token_html(snap, cache=spans), heat, stats, status, None, LABEL, bar, hist, "Generate", live_frame
        decoder.raise_error()
    except RouterLabError as err:
        yield skip, _heat_note("No heatmap: the generation failed (see the status line)."), skip, _warn(err), skip, skip, skip, skip, gr.Button(interactive=True), ""
        return
    except Exception as err:  # keep the page alive; the console has the traceback
        log.error("generation failed", exc_info=err)
        gr.Warning(f"Generation failed: {safe.text(without_paths(str(err)))}")
        yield skip, _heat_note("No heatmap: the generation failed (see the status line)."), skip, _status("warn", f"Generation failed: {type(err).__name__}: {safe.text(without_paths(str(err)))}"), skip, skip, skip, skip, gr.Button(interactive=True), ""
        return
    finally:
        control.request_stop()  # no-op after a normal end; ends the decoder when the stream is cancelled
        session.running = False
    yield (*_final_view(res, session, trace, time.perf_counter() - start, columns, spans),)


def _sharing(control) -> str:
    """' · 3 generations share each step' while the room batches this run with others (core/serve/room.py)."""
    n = getattr(control, "sharing", 0)
    return f" · {n} generations share each step" if n > 1 else ""


def _shared_note(meta: dict) -> str:
    """How much of a finished run shared the room's steps: its tokens/s is then a share of a batched step."""
    room = meta.get("room") or {}
    if not room.get("shared_steps"):
        return ""
    return (f" Measured while sharing: {room['shared_steps']} of its {room['steps']} steps were batched with other "
            f"visitors' generations (up to {room['largest_batch']} at once), so its tokens/s is its share of each step.")


# Placeholders are made once: a figure costs milliseconds of the interpreter lock, and a room's visitors press Generate
# together (32 at once: about 0.6 s of the web server's time before the last of them saw "Prefilling").
@lru_cache(maxsize=8)
def _heat_note(message: str):
    """An empty heatmap that says `message`: the plot's placeholder while a run streams, or after it failed."""
    return plot_data(plots.empty_heatmap(message))


@lru_cache(maxsize=1)
def _empty_bar():
    return plot_data(plots.layer_skip_bar(None))


@lru_cache(maxsize=1)
def _empty_hist():
    return plot_data(plots.score_histogram(None))


def _final_view(res: Resources, session: Session, trace: Trace, wall: float, columns: dict | None = None,
                spans: dict | None = None) -> tuple:
    """A finished (or stopped) run's view, each part built once: the figures as JSON without plotly Figures (the
    heatmap's JSON is also the exported page's), with the stream's caches of heatmap columns and token spans.
    The download buttons are shown by a component update once per session, later runs only give them new files:
    each component update makes Gradio rebuild that component's whole config (milliseconds of the server's CPU)."""
    heatmap = plots.heatmap_json(trace, cache=columns)
    trace_file = _export(session, trace)
    res.note_reading(trace)  # a document's reading time, for the next visitor who picks one (layout.document_chosen)
    views = session.views
    stats = plots.live_stats(trace, res.costs_for(trace.meta.get("model")))
    views["stats"] = plots.stats_html(stats)
    views["bar"] = plot_data(plots.layer_skip_bar_json(trace, cache=columns))
    views["hist"] = plot_data(plots.score_histogram_json(trace, cache=columns))
    shown, views["downloads"] = views.get("downloads", False), True
    return (
        plots.token_html(trace, cache=spans),
        plot_data(heatmap),
        views["stats"],
        _done_status(trace, res, wall, stats),
        trace_file if shown else gr.DownloadButton(value=trace_file, visible=True),
        LABEL if shown else gr.Button(LABEL, visible=True),  # the page makes the file on the click (ui/web/heatmap_export.py)
        views["bar"],
        views["hist"],
        gr.Button(interactive=True),
        "",  # no live frame: the heatmap shows the final figure
    )


def stop_run(session: Session):
    """Ask this tab's running generations to stop; returns the status line."""
    stopped = False
    for control in (getattr(session, "control", None), getattr(session, "compare_control", None)):
        if control is not None:
            control.request_stop()
            stopped = True
    return _status("stop", "Stopping…" if stopped else "Nothing is running.")


def show_last(res: Resources, session: Session):
    """After Stop (which also cancels the stream): show whatever the stopped run recorded."""
    trace = getattr(session, "trace", None)
    if isinstance(session, Session):
        session.running = False  # the cancelled stream may never reach its own `finally`
    if trace is None or not trace.steps:
        return (gr.skip(),) * 8 + (gr.Button(interactive=True), gr.skip())
    view = list(_final_view(res, session, trace, 0.0))
    view[3] = _status("stop", f"Stopped after {len(trace.generated_steps)} tokens. "
                      + _what_if_hint(trace, "Move the slider for a what-if view, or regenerate."))
    return tuple(view)


def threshold_moved(res: Resources, threshold, session: Session):
    """Slider moved: steer a running generation, or show the what-if view of the last run.

    Returns heatmap, text, stats, status, layer bar, score histogram.
    """
    skip = gr.skip()
    try:
        value = fields.THRESHOLD.check(threshold)
    except RouterLabError as err:
        return skip, skip, skip, _warn(err), skip, skip
    session = session if isinstance(session, Session) else None
    if session is None:
        return (skip,) * 6
    if session.running and session.control is not None:  # a Compare ladder is never steered: each column keeps its threshold
        session.control.threshold = value
        return skip, skip, skip, _status("run", f"Threshold → {value:.2f} from the next token (Explore run)."), skip, skip
    trace = session.trace
    if trace is None or not trace.steps:
        echo, session.link_threshold = session.link_threshold == value, None
        if echo:  # a link set it, and its note already says so
            return (skip,) * 6
        return skip, skip, skip, _status("ok", f"Threshold {value:.2f}: it applies to the next generation."), skip, skip
    if not _has_scores(trace):  # the full model's run: nothing to re-decide
        return skip, skip, skip, _status("ok", f"Threshold {value:.2f}: it applies to the next generation with a router set "
                                               "(the last run was the full model, which has no router scores to re-decide)."), skip, skip
    stats = plots.live_stats(trace, res.costs_for(trace.meta.get("model")), threshold=value)
    recorded = trace.skip_rate()
    return (
        plots.heatmap(trace, threshold=value, what_if=True),
        plots.token_html(trace, threshold=value),
        plots.stats_html(stats),
        _status(
            "whatif",
            f"**What-if view** at threshold {value:.2f}: decisions re-made from the recorded scores, nothing re-run "
            f"(skip rate {trace.skip_rate(value):.0%} vs {recorded:.0%} recorded; tokens/s and text are the recorded run's). "
            "Press **Regenerate at this threshold** for the true run.",
        ),
        plots.layer_skip_bar(trace, threshold=value),
        plots.score_histogram(trace, threshold=value),
    )
