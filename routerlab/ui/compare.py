"""The Compare tab's handlers: one prompt through the full and the routed model, side by side.

Owns `compare_run` (both runs advanced one token each in turn by one Decoder, so they are timed
under the same load), `_StopBoth` (the Control the session holds: threshold to the routed run,
Stop to both) and `compare_html` (the speed cards). Knows nothing about the layout, the Explore
tab or tensors.
"""

from __future__ import annotations

import logging

import gradio as gr

from routerlab.core.errors import RouterLabError
from routerlab.core.trace import Trace
from routerlab.ui import plots
from routerlab.ui.resources import FULL, UNTRAINED, Resources
from routerlab.ui.session import Session, _shown, _status, _warn, plot_data
from routerlab.ui.stream import Decoder

log = logging.getLogger(__name__)


def compare_run(res: Resources, prompt, threshold, router_label, kv_policy, max_new_tokens, temperature, model_name, session: Session):
    """The same prompt through the full model and the routed model, interleaved step by step.

    Yields full text, routed text, comparison HTML, routed heatmap, status.
    """
    from routerlab.core.engine import Control

    skip = gr.skip()
    session = session if isinstance(session, Session) else Session()
    try:
        res.check_prompt(prompt)
        engine = res.engine_for(model_name)
        label = router_label if router_label not in (None, "", FULL) else UNTRAINED
        routers = res.routers_for(engine, label)
        seed = 0 if float(temperature or 0) > 0 else None  # same samples for both when sampling
        config = res.generate_config(max_new_tokens, temperature, threshold, kv_policy, seed=seed)
        full_control, routed_control = Control(config.threshold), Control(config.threshold)
        full_steps = engine.generate(prompt, None, config, full_control)
        routed_steps = engine.generate(prompt, routers, config, routed_control)
    except RouterLabError as err:
        yield skip, skip, skip, skip, _warn(err)
        return
    if session.compare_control is not None:
        session.compare_control.request_stop()
    both = _StopBoth(full_control, routed_control)
    session.compare_control, session.compare_running = both, True
    full, routed = full_control.trace, routed_control.trace
    yield plots.token_html(None), plots.token_html(None), skip, skip, _status("run", "Prefilling both…")
    decoder = Decoder([full_steps, routed_steps])
    heat = _shown(session, "compare_heat", lambda: plot_data(plots.empty_heatmap("The routed run's heatmap appears here.")))
    columns: dict = {}
    try:
        for (f, r), draw_plot in decoder.frames([full, routed]):
            div = plots.first_divergence(f, r)
            finished = decoder.done.is_set()
            if draw_plot and r.steps:  # otherwise repeat the last one (see plot_data)
                heat = session.views["compare_heat"] = plot_data(plots.heatmap(r, live=not finished, cache=columns))
            yield (
                plots.token_html(f, diverge_at=div),
                plots.token_html(r, diverge_at=div),
                compare_html(f, r, div),
                heat,
                _status("ok", "Done. The red outline marks the first token where the two runs differ.") if finished else _status("run", "Generating both, one token each in turn…"),
            )
        decoder.raise_error()
    except RouterLabError as err:
        yield skip, skip, skip, skip, _warn(err)
    except Exception as err:
        log.error("compare failed", exc_info=err)
        yield skip, skip, skip, skip, _status("warn", f"Compare failed: {type(err).__name__}: {err}")
    finally:
        both.request_stop()  # ends the decoder if the stream was cancelled
        session.compare_running = False
        session.compare = (full, routed)


class _StopBoth:
    """The Compare run's Control as the session sees it: threshold goes to the routed run, Stop to both."""

    def __init__(self, full, routed):
        self.full, self.routed = full, routed

    @property
    def threshold(self) -> float:
        return self.routed.threshold

    @threshold.setter
    def threshold(self, value: float) -> None:
        self.routed.threshold = value

    def request_stop(self) -> None:
        self.full.request_stop()
        self.routed.request_stop()

    @property
    def stop_requested(self) -> bool:
        return self.routed.stop_requested or self.full.stop_requested


def compare_html(full: Trace | None, routed: Trace | None, diverge_at: int | None) -> str:
    if full is None or routed is None:
        return ""
    f_tps, r_tps = full.decode_tokens_per_second(), routed.decode_tokens_per_second()
    speed = f"{r_tps / f_tps:.2f}×" if f_tps and r_tps else "–"
    if diverge_at is None:
        same = min(len(full.generated_steps), len(routed.generated_steps))
        div = f"identical so far ({same} tokens)"
    else:
        tok = routed.generated_steps[diverge_at].text
        div = f"first difference at generated token {diverge_at + 1} (routed wrote “{plots.token_label(tok, 16)}”)"
    stats = {
        "full": (f"{f_tps:.1f} tok/s", f"{len(full.generated_steps)} tokens"),
        "routed": (f"{r_tps:.1f} tok/s", f"{len(routed.generated_steps)} tokens, skip rate {routed.skip_rate():.0%}"),
    }
    return (
        "<div class='rl-stats'>"
        f"<div class='rl-card'><div class='rl-card-v'>{stats['full'][0]}</div><div class='rl-card-l'>full model · {stats['full'][1]}</div></div>"
        f"<div class='rl-card'><div class='rl-card-v'>{stats['routed'][0]}</div><div class='rl-card-l'>routed · {stats['routed'][1]}</div></div>"
        f"<div class='rl-card'><div class='rl-card-v'>{speed}</div><div class='rl-card-l'>routed vs full (measured side by side)</div></div>"
        f"</div><div class='rl-foot'>{div}</div>"
    )
