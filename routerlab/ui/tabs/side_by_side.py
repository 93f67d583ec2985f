"""Explore's routed speed against the full model's, measured side by side on this machine, now: after each routed run
that had the server to itself (`after_run`), and on the button's click.

Two runs' tok/s from separate generations cannot be compared on a busy machine: the same run's speed moves with
whatever else the cores are doing. `measure_beside_full` decodes the full model and the chosen
router set on the Explore prompt one token each in turn (`compare.lockstep_traces`, each run alone, the quality pass
off) and states the routed run's speed as the median over the rounds of the full step / the routed step
(`compare.lockstep_speeds`): the definition the Compare ladder and the quick sweep use. Beside it: the estimate from
per-layer costs (Explore's card) and, where they differ, why.

After a run, the measurement is made at once only where the run did not share the server's decode steps with anyone
(its trace's room record): in a crowd every extra token would be everyone's wait, so there the card says so and the
button measures on request. Knows nothing about the layout or tensors.
"""

from __future__ import annotations

import dataclasses

import gradio as gr

from routerlab.core.base.errors import RouterLabError
from routerlab.ui.figures import plots, safe
from routerlab.ui.state.resources import FULL, Resources
from routerlab.ui.state.session import Session, _status, _warn
from routerlab.ui.tabs.compare import lockstep_speeds, lockstep_traces

ROUNDS = 32  # tokens each run decodes: enough rounds for a median that one slow spell does not move
AFTER_RUN_ROUNDS = 16  # after a run: half the button's tokens (two short decodes), still a median over 16 rounds
LABEL = "Measure against the full model, side by side"
FIRST_NOTE = ("The cards time a run alone; on a busy machine two runs' tok/s do not compare. After a routed run, the full model "
              "and the routed model decode one token each in turn and this line says how their speeds compare; the button "
              "measures again, with more tokens.")
RUN_NOTE = ("When this run ends, if it had the server to itself, the routed model's speed against the full model's, "
            "both decoding in turn.")
FULL_NOTE = "This run is the full model: the reference the routed runs' speeds are measured against."
STOPPED_NOTE = "A stopped run is not measured here: press the button to time the routed model against the full model, side by side."


def after_run(res: Resources, session: Session, prompt, threshold, router_label, kv_policy, model_name) -> tuple:
    """After an Explore run: the side-by-side measurement of its router set on its prompt (AFTER_RUN_ROUNDS tokens
    each) where the run had the server to itself and ended by itself; else what the card should say instead.
    (the measurement's text, the status line)."""
    trace = session.trace if isinstance(session, Session) else None
    if trace is None:
        return gr.skip(), gr.skip()
    if router_label in (None, "", FULL):
        return FULL_NOTE, gr.skip()
    if trace.meta.get("stop_reason") == "stopped":
        return STOPPED_NOTE, gr.skip()
    shared = trace.meta.get("room", {}).get("shared_steps", 0)
    if shared:
        most = trace.meta["room"].get("largest_batch", 2)
        return (f"This run shared the server's decode steps with up to {most - 1} other generation{'s' if most > 2 else ''}, "
                "so its tok/s says little about routing. Press the button for a side-by-side measurement: it decodes the full "
                "model and the routed model one token each in turn, so both meet the same load."), gr.skip()
    text, _ = measure_beside_full(res, session, prompt, threshold, router_label, kv_policy, model_name, AFTER_RUN_ROUNDS)
    return text, gr.skip()  # the run's own status line stays; a refusal leaves the card as it was


def stopped(session: Session):
    """The card when Stop is pressed during a run (a cancelled run has no `after_run`)."""
    return STOPPED_NOTE if isinstance(session, Session) and session.running else gr.skip()


def measure_beside_full(res: Resources, session: Session, prompt, threshold, router_label, kv_policy, model_name, rounds: int = ROUNDS) -> tuple:
    """(the measurement's text for the page, the status line)."""
    try:
        res.check_prompt(prompt)
        engine = res.engine_for(model_name)
        if router_label in (None, "", FULL):
            raise RouterLabError("The full model is the reference here.", "Pick a router set to measure it against the full model.")
        routers = res.routers_for(engine, router_label, session.router_sets if isinstance(session, Session) else None)
        config = res.generate_config(min(rounds, res.limits.max_new_tokens), 0.0, threshold, kv_policy, quality=False)
        config = dataclasses.replace(config, shared=False)  # with the room: each run alone, one token each in turn
    except RouterLabError as err:
        return gr.skip(), _warn(err)
    full, routed = lockstep_traces(engine, prompt, [(None, config), (routers, config)])
    full_tps, routed_tps = lockstep_speeds([full, routed])
    if not full_tps or not routed_tps:
        return gr.skip(), _status("warn", "Nothing was decoded to time: the prompt's answer ended at once. Try another prompt.")
    ratio = routed_tps / full_tps
    stats = plots.live_stats(routed, res.costs_for(routed.meta.get("model")))
    estimate = stats.get("speedup_estimate")
    rounds = min(len(full.generated_steps), len(routed.generated_steps))
    text = (f"**{ratio:.2f}×** the full model's decode speed, measured side by side on this machine now: {rounds} tokens each, "
            f"one token each in turn (routed {routed_tps:.1f} tok/s, full {full_tps:.1f} tok/s; the median over the rounds, the way "
            f"the Compare ladder and the sweep measure). Skip rate {routed.skip_rate():.0%} at threshold {float(threshold):.2f}, "
            f"KV policy {safe.text(kv_policy)}.")
    if estimate:
        text += f" Estimated from per-layer costs: {estimate:.2f}×." + _why(ratio, estimate, kv_policy)
    return text, _status("ok", f"Measured: the routed run decodes at **{ratio:.2f}×** the full model here ({rounds} tokens each, side by side).")


def _why(ratio: float, estimate: float, kv_policy) -> str:
    if abs(ratio - estimate) <= 0.05:
        return " They agree within 5%."
    if ratio < estimate:
        return (" Measured is lower: the estimate counts only what the skipped cells save; each routed layer also pays its router "
                "(a small product and a decision every token), and " + ("under `kv` a skipped attention still computes its keys and "
                "values. " if kv_policy == "kv" else "") + "skipping pays more at longer contexts (a long document).")
    return " Measured is higher: the estimate's per-layer costs were measured at start-up, at a short context."
