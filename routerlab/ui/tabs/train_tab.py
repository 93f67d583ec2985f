"""Train tab: start a Router-Tuning job, watch it (a 2 s timer polls its snapshot), stop it, keep or share the set.

Handlers: `train_start` (checks the settings and the visitor's text, queues a tuning.job.TrainJob on the
server's one TrainingRunner), `train_tick` (progress, curves, layer map; when the job ends, its set joins
this tab's router-set menu and a zip is offered), `train_stop`, `upload_set` (a zip or loose files,
validated by tuning.bundle.read_upload). A tab keeps at most `Limits.session_sets` sets: a new one drops the
oldest (its files too), and the status line says which. Bad input comes back as a status message that says
whether a setting or the text is at fault; the inputs are never touched, so nothing the visitor entered is lost.
No tensors here: the job and the bundle own them.
"""

from __future__ import annotations

import re
import shutil
import threading

import gradio as gr

from routerlab.core.base.errors import RouterLabError
from routerlab.tuning.job import FINAL
from routerlab.ui.figures import safe, train_plots
from routerlab.ui.state import fields
from routerlab.ui.state.resources import FULL, Resources, RouterSetInfo
from routerlab.ui.state.session import Session, _status, _warn

BUILT_IN, OWN = "built-in prompts", "my own text"
STOP_WAIT = 1.5  # seconds Stop waits for the job to end, so that the tick chained to it frees the page at once
_TAKE = threading.Lock()  # an ended job is taken by one tick only (the timer's and Stop's may run together)
STARTS = {"a fit of update sizes": "probe", "zero (the paper)": "zeros"}  # where the routers start (TrainConfig.init)
SOURCE, START = fields.Choice("Data", (BUILT_IN, OWN)), fields.Choice("Routers start from", tuple(STARTS))  # the radios' fields
TRAIN_INTRO = """**Router-Tuning, here and now.** The model stays frozen: only one tiny router per routed layer learns
(a single linear score of the layer's input, 576 numbers), deciding token by token whether that layer's
attention (or MLP, or whole block) runs. Each step, the routed model is taught to match the full model
(**distillation**: KL to the full model's next-token distribution) and to skip at least the **skip target** (**budget term**: how far the executed share is above it; it ramps in over
the first 40% of steps). The **LM loss** (how well it predicts the data's own tokens) is drawn too; it is
trained on only if you give it a weight under Advanced. The routers start from a fit of how much each layer changes each token (a few
seconds of full-depth passes), or from zero as in the paper. A held-out slice, never trained on, checks the
set a few times and at the end."""


def _labels(res: Resources, session: Session) -> list[str]:
    return res.router_labels() + list(session.router_sets)


def _add_set(res: Resources, session: Session, label: str, folder, routers, config) -> tuple[str, str]:
    """(the set's menu label, a sentence naming the sets dropped to stay within the tab's cap, or "")."""
    base, k = label, 2
    while label in session.router_sets or label in res.router_labels():
        label, k = f"{base} #{k}", k + 1
    dropped = []
    while len(session.router_sets) >= max(1, res.limits.session_sets):
        old = next(iter(session.router_sets))  # insertion order: the oldest first
        info, _ = session.router_sets.pop(old)
        if info.path is not None and session.workdir() in info.path.parents:
            shutil.rmtree(info.path, ignore_errors=True)
        dropped.append(old)
    session.router_sets[label] = (RouterSetInfo(label=label, granularity=config["granularity"], path=folder, meta=config), routers)
    said = (f" This tab keeps {res.limits.session_sets} router sets: {', '.join(f'**{safe.text(d)}**' for d in dropped)} "
            f"{'was' if len(dropped) == 1 else 'were'} dropped (download a set to keep it).") if dropped else ""
    return label, said


def _shipped_folder(res: Resources, granularity: str):
    return next((r.path for r in res.router_sets if r.path is not None and r.granularity == granularity), None)


def train_start(res: Resources, session: Session, granularity, skip_pct, minutes, lr, kd_weight, lm_weight, max_steps,
                start_from, source, pasted, upload, visitor: str | None = None):
    """Queue a training; returns progress, curves, layer map, result, status, timer, start button. `visitor`: who
    asks (uploads.visitor_of_request), one training running or waiting each, whatever tab they ask from."""
    from routerlab.tuning.job import JobSettings, TrainJob

    skip = gr.skip()
    session = session if isinstance(session, Session) else Session()
    try:
        if res.trainer is None:
            raise RouterLabError("Training is turned off on this server.", "The operator can turn it on with ROUTERLAB_TRAINING=on.")
        if session.job is not None and session.job.phase not in ("done", "stopped", "failed", "cancelled"):
            raise RouterLabError("Your last training is still going.", "Stop it first, or wait for it to end.")
        if visitor is not None and res.trainer.held_by(visitor):
            raise RouterLabError("A training you started (in this tab or another) is still running or waiting.",
                                 "Each visitor trains one set at a time: wait for it to end, or stop it in its tab.")
        if res.trainer.waiting() >= res.limits.training_queue:
            raise RouterLabError(f"{res.trainer.waiting()} trainings are already waiting on this server, the most it queues.",
                                 "Try again when one has finished; the Explore tab works meanwhile.")
        settings = JobSettings(granularity=fields.GRANULARITY.check(granularity), skip=fields.SKIP_TARGET.check(skip_pct) / 100,
                               minutes=fields.MINUTES.within(maximum=res.limits.training_minutes).check(minutes),
                               lr=fields.LEARNING_RATE.check(lr), kd_weight=fields.KD_WEIGHT.check(kd_weight),
                               lm_weight=fields.LM_WEIGHT.check(lm_weight), max_steps=fields.MAX_STEPS.check(max_steps),
                               init=STARTS[START.check(start_from)])
        pasted = fields.TRAIN_TEXT.within(res.limits.training_max_chars).check(pasted) if SOURCE.check(source) == OWN else None
        data = _user_data(pasted, upload, res.limits.training_max_chars) if source == OWN else None
        engine = res.engine
        session.sets_made += 1
        folder = session.workdir() / f"mine-{session.sets_made}-{settings.granularity}"
        job = TrainJob(engine.model, engine.tokenizer, settings, folder, data=data, shipped=_shipped_folder(res, settings.granularity))
    except RouterLabError as err:
        return skip, skip, skip, skip, _warn(err), skip, skip
    session.job, session.job_drawn = job, None
    position = res.trainer.submit(job, owner=visitor)
    what = "the built-in self-distilled prompts" if data is None else data.describe()
    wait = f" {position} training(s) ahead of yours." if position else ""
    return (train_plots.progress_html(job.snapshot(), settings.minutes * 60, position), train_plots.curves(None),
            train_plots.layer_map(None), "", _status("run", f"Training {safe.text(settings.label)} on {safe.text(what)}.{wait}"),
            gr.Timer(active=True), gr.Button(interactive=False))


def _user_data(pasted, upload, max_chars: int):
    """The visitor's text parsed (user_data.parse_user_data); anything it did not foresee is still a message about the text."""
    from routerlab.tuning.user_data import parse_user_data

    try:
        return parse_user_data(pasted, upload, max_chars)
    except RouterLabError:
        raise
    except (ValueError, TypeError, RecursionError, OSError) as err:  # a bug in reading: said as such, without a path
        raise RouterLabError(f"Your text could not be read ({type(err).__name__}).",
                             "Check that it is plain UTF-8 text or JSON lines, or paste a shorter part of it.") from None


def train_tick(res: Resources, session: Session):
    """The job's progress; when it ends: its set in this tab's menu, the zip to download. 9 outputs."""
    skip = gr.skip()
    job = session.job if isinstance(session, Session) else None
    if job is None:
        return skip, skip, skip, skip, skip, gr.Timer(active=False), skip, skip, gr.Button(interactive=True)
    snap = job.snapshot()
    budget = job.settings.minutes * 60
    progress = train_plots.progress_html(snap, budget, res.trainer.position(job) if res.trainer else None)
    if snap["phase"] not in FINAL:
        drawn = (len(snap["rows"]), len(snap["checkpoints"]))
        if drawn == session.job_drawn:  # no new step since the last tick: redrawing the same figures costs the
            return progress, skip, skip, skip, skip, skip, skip, skip, skip  # visitor's browser CPU that training needs
        session.job_drawn = drawn
        return progress, train_plots.curves(snap), train_plots.layer_map(snap), skip, skip, skip, skip, skip, skip
    with _TAKE:
        if session.job is not job:  # another tick took it and draws the end
            return (skip,) * 9
        session.job, session.job_drawn = None, None  # ended: the next tick finds nothing to follow
    status, menu, download = _status("stop", safe.text(snap["message"])), skip, gr.DownloadButton(visible=False)
    if snap["phase"] in ("done", "stopped") and job.routers is not None:
        from routerlab.tuning.bundle import zip_folder
        from routerlab.tuning.checkpoint import read_config

        label, dropped = _add_set(res, session, job.settings.label, job.folder, job.routers, read_config(job.folder))
        name = re.sub(r"[^a-z0-9-]+", "-", label.lower()).strip("-")
        archive = zip_folder(job.folder, job.folder.parent / f"routerlab-{name}.zip")
        menu = gr.Dropdown(choices=_labels(res, session))
        download = gr.DownloadButton(f"Download {label} (zip)", value=str(archive), visible=True)
        status = _status("ok", f"{safe.text(snap['message'])} **{safe.text(label)}** is in the router-set menu (this tab only).{dropped}")
    return (progress, train_plots.curves(snap), train_plots.layer_map(snap), train_plots.result_md(snap), status,
            gr.Timer(active=False), menu, download, gr.Button(interactive=True))


def train_stop(session: Session, wait: float = STOP_WAIT):
    """Stop this tab's training (a queued one is cancelled) and wait up to `wait` s for it to end (it ends at its
    next example, in any phase; the page chains a `train_tick` that then frees Start); returns the status line."""
    job = session.job if isinstance(session, Session) else None
    if job is None:
        return _status("stop", "No training is running.")
    waiting = job.phase == "queued"
    job.stop()
    if waiting:
        return _status("stop", "Cancelled: your training left the line before it started.")
    job.wait(wait)
    return _status("stop", "Stopping: the routers as they are now are kept, uncalibrated and not compared …")


def upload_set(res: Resources, session: Session, files):
    """A visitor's router set (zip or loose files) into this tab's menu. Returns status, the menu and the
    emptied upload box (so the next upload is read alone, not with this one's files). The uploaded files are deleted
    once read (only those in Gradio's upload folder)."""
    from routerlab.tuning.bundle import read_upload
    from routerlab.ui.state.uploads import discard

    session = session if isinstance(session, Session) else Session()
    paths = [f if isinstance(f, str) else getattr(f, "name", f) for f in (files if isinstance(files, list) else [files] if files else [])]
    try:
        folder, routers, config = read_upload(paths, res.engine.model, session.workdir())
    except RouterLabError as err:
        return _warn(err), gr.skip(), None
    finally:
        discard(paths)  # read (into the session's folder) or refused: Gradio's copy is spent, and the box is emptied
    label, dropped = _add_set(res, session, f"uploaded: {config['granularity']}", folder, routers, config)
    return (_status("ok", f"Loaded **{safe.text(label)}** ({len(config['layers'])} routed layers, threshold {safe.text(config['threshold'])}); "
                    f"pick it in the router-set menu.{dropped}"), gr.Dropdown(choices=_labels(res, session)), None)


def own_set(session, label: str):
    """This tab's (RouterSetInfo, routers) for a menu label, or None (a shipped set, the full model)."""
    if not isinstance(session, Session) or label in (None, "", FULL):
        return None
    return session.router_sets.get(label)
