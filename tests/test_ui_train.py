"""The Train tab's handlers on a tiny model with a character tokenizer: a training from pasted text runs to the
end, its set joins this tab's menu (and no other session's), generates, downloads as a zip and comes back
through an upload deciding exactly the same; bad settings, bad text and bad uploads are status messages.

The training runs in the server's worker thread; the test waits for it to end (with a generous timeout),
never for a particular speed."""

from __future__ import annotations

import html
import threading
import time
import zipfile

import gradio as gr
import pytest
from test_ui import tiny_resources as _tiny_resources

from routerlab import ui
from routerlab.core.base.config import GenerateConfig
from routerlab.core.base.errors import RouterLabError
from routerlab.ui.tabs.train_tab import BUILT_IN, OWN, train_start, train_stop, train_tick, upload_set

TEXT = "\n\n".join(f"Paragraph {k}: the quick brown fox jumps over the lazy dog, again and again, {k} times." for k in range(12))


def tiny_resources():
    """test_ui's tiny app; its tokenizer's end of text set to id 3 (in the tiny model's 128-token vocabulary),
    which training appends to every example."""
    res = _tiny_resources()
    res.engine.tokenizer.eos_token = "<3>"
    return res


def _start(res, session, source=OWN, text=TEXT, minutes=1, steps=3, **kw):
    args = dict(granularity="attention-token", skip_pct=20, minutes=minutes, lr=3e-2, kd_weight=1.0, lm_weight=1.0,
                max_steps=steps, start_from="zero (the paper)", source=source, pasted=text, upload=None)
    args.update(kw)
    return train_start(res, session, *args.values())


def _wait(res, session, timeout=120):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        out = train_tick(res, session)
        if session.job is None:
            return out
        time.sleep(0.05)
    raise AssertionError("the training did not end")


def test_a_training_from_pasted_text_lands_in_this_sessions_menu_downloads_and_uploads(tmp_path):
    res = tiny_resources()
    session, other = ui.Session(), ui.Session()
    out = _start(res, session)
    assert "Training mine: attention-token" in out[4] and isinstance(out[5], gr.Timer)
    progress, curves, layer_map, result, status, timer, menu, download, start = _wait(res, session)
    assert "Done." in status and "is in the router-set menu" in status, status
    label = next(iter(session.router_sets))
    assert (label, label) in menu.choices and label not in res.router_labels() and not other.router_sets
    assert "| mine at 0.5 |" in result and "random at my share" in result
    assert len(curves.data) >= 2 and layer_map.data[0].type == "heatmap"
    archive = download.value["path"] if isinstance(download.value, dict) else download.value  # gradio serves a copy
    assert zipfile.ZipFile(archive).testzip() is None
    # generate with it: the engine sees this tab's set
    engine = res.engine
    mine = res.routers_for(engine, label, session.router_sets)
    with pytest.raises(RouterLabError, match="Unknown router set"):
        res.routers_for(engine, label, other.router_sets)  # another visitor does not have it
    # upload the zip in another session: the same decisions on the same prompt
    status2, menu2, box = upload_set(res, other, [archive])
    assert box is None  # the upload box is emptied for the next upload
    assert "Loaded" in status2, status2
    theirs = res.routers_for(engine, next(iter(other.router_sets)), other.router_sets)
    config = GenerateConfig(max_new_tokens=12, threshold=0.5)
    a = engine.run("Hello there", mine, config)
    b = engine.run("Hello there", theirs, config)
    assert [s.token_id for s in a.generated_steps] == [s.token_id for s in b.generated_steps]
    assert a.executed_matrix() == b.executed_matrix()
    assert any(cell is False for row in a.executed_matrix() for cell in row)  # it did skip something


def test_bad_settings_text_and_uploads_are_status_messages_and_touch_no_input(tmp_path):
    res = tiny_resources()
    session = ui.Session()
    out = _start(res, session, text="too short")
    assert out[4].startswith("⚠") and "examples" in out[4]
    assert all(v == gr.skip() for k, v in enumerate(out) if k != 4)  # nothing else on the page changes
    assert session.job is None
    assert "Time budget (minutes): 30 is out of range. Use a number from 0.5 to 10." in _start(res, session, minutes=30)[4]
    assert "Learning rate: 'fast' is text, not a number" in html.unescape(_start(res, session, lr="fast")[4])  # as the page shows it
    assert "Distillation weight: NaN is not a number" in _start(res, session, kd_weight=float("nan"))[4]
    for key in ("lr", "lm_weight", "minutes", "skip_pct"):
        assert "Infinity is infinite, not a number" in _start(res, session, **{key: float("inf")})[4]
    assert "Most steps: Infinity is infinite" in _start(res, session, max_steps=float("inf"))[4]  # not int()'s OverflowError
    assert "empty" in _start(res, session, text="")[4]
    surrogate = _start(res, session, text=TEXT[:30] + "\ud800" + TEXT[30:])[4]  # a text problem, not "a setting is not a number"
    assert "pasted text holds half a character" in surrogate and "number" not in surrogate, surrogate
    deep = _start(res, session, text='{"text": "a line of text that is long enough"}\n' * 6 + '{"text": ' + "[" * 5000 + "]" * 5000 + "}")[4]
    assert "line 7: nested too deeply" in deep, deep
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"PK definitely not")
    status, menu, _ = upload_set(res, session, [str(bad)])
    assert status.startswith("⚠") and "not a readable zip" in status
    status, _, _ = upload_set(res, session, [])
    assert "Nothing was uploaded" in status
    assert "No training is running" in train_stop(session)


def test_a_training_files_name_is_shown_as_text(tmp_path):
    """The status names the data's source, a visitor's file name: escaped like any text from outside (ui/figures/safe.py)."""
    import html

    name = "<img src=hostile-file>.txt"
    (tmp_path / name).write_text(TEXT)
    res = tiny_resources()
    session = ui.Session()
    status = _start(res, session, text=None, upload=str(tmp_path / name), steps=10_000)[4]
    train_stop(session)
    assert "<img" not in status and name in html.unescape(status), status
    _wait(res, session)


def test_training_off_and_one_at_a_time(tmp_path):
    res = tiny_resources()
    res.trainer = None
    assert "turned off" in _start(res, ui.Session())[4]
    res = tiny_resources()
    session = ui.Session()
    _start(res, session, steps=10_000)  # runs until stopped (or its 1-minute budget ends)
    again = _start(res, session)
    assert "still going" in again[4]
    assert "Stopping" in train_stop(session)
    status = _wait(res, session)[4]
    assert "Stopped" in status or "Cancelled" in status, status


def test_a_second_visitor_waits_in_line_and_can_cancel():
    res = tiny_resources()
    first, second = ui.Session(), ui.Session()
    _start(res, first, steps=10_000)  # runs until stopped (or its 1-minute budget ends)
    out = _start(res, second)
    assert "1 training(s) ahead of yours" in out[4] and "Waiting in line" in out[0]
    assert "Cancelled" in train_stop(second)
    train_stop(first)
    assert "Cancelled" in _wait(res, second)[4]
    _wait(res, first)


def test_a_full_line_refuses_the_next_training_at_once_and_a_place_frees_it():
    """Past ROUTERLAB_TRAINING_QUEUE trainings waiting, a new one is refused with a message (not the 20th place in a
    line); the visitor's settings and text are untouched; one cancelled frees its place."""
    from dataclasses import replace

    res = tiny_resources()
    res.limits = replace(res.limits, training_queue=2)
    running, *waiting = [ui.Session() for _ in range(3)]
    _start(res, running, steps=10_000)  # runs until stopped
    for s in waiting:
        assert "ahead of yours" in _start(res, s)[4]
    late = ui.Session()
    refused = _start(res, late)
    assert "2 trainings are already waiting" in refused[4] and late.job is None
    assert "Cancelled" in train_stop(waiting[0])
    assert "ahead of yours" in _start(res, late)[4]
    for s in (late, waiting[1], running):
        train_stop(s)
    for s in (late, waiting[1], running, waiting[0]):
        _wait(res, s)


def test_a_visitor_trains_one_set_at_a_time_whatever_tab_they_ask_from():
    """A second training from the same visitor (another tab: another session) is refused with a message while their
    first runs or waits; another visitor is queued; the first visitor may start again once theirs is stopped."""
    res = tiny_resources()
    tab1, tab2, other = ui.Session(), ui.Session(), ui.Session()
    assert "Training" in _start(res, tab1, steps=10_000, visitor="10.0.0.1")[4]
    refused = _start(res, tab2, visitor="10.0.0.1")
    assert "A training you started" in refused[4] and "one set at a time" in refused[4] and tab2.job is None
    assert "ahead of yours" in _start(res, other, visitor="10.0.0.2")[4]
    train_stop(tab1)
    _wait(res, tab1)
    assert "ahead of yours" in _start(res, tab2, visitor="10.0.0.1")[4] or tab2.job is not None
    for s in (tab2, other):
        train_stop(s)
    for s in (tab2, other):
        _wait(res, s)


def test_closing_the_tab_stops_the_training():
    from routerlab.ui.state.session import _delete_session

    res = tiny_resources()
    session = ui.Session()
    _start(res, session, steps=10_000)  # runs until stopped (or its 1-minute budget ends)
    job = session.job
    _delete_session(session)
    end = time.monotonic() + 120
    while job.phase not in ("done", "stopped", "failed", "cancelled") and time.monotonic() < end:
        time.sleep(0.05)
    assert job.phase in ("stopped", "cancelled")


def _a_set_zip(res, tmp_path):
    """A router set for the tiny model, zipped as the app's Download makes it."""
    from routerlab.core.base.config import RoutingConfig
    from routerlab.core.routing.router import RouterSet
    from routerlab.tuning.bundle import zip_folder
    from routerlab.tuning.checkpoint import save_routers

    model = res.engine.model
    routers = RouterSet.zeros(model, RoutingConfig.from_granularity("attention-token", [1, 2]))
    return zip_folder(save_routers(routers, tmp_path / "set", model), tmp_path / "routerlab-set.zip")


def test_a_tab_keeps_at_most_its_cap_of_sets_and_says_which_it_dropped(tmp_path):
    from dataclasses import replace

    res = tiny_resources()
    res.limits = replace(res.limits, session_sets=2)
    session = ui.Session()
    archive = _a_set_zip(res, tmp_path)
    for _ in range(2):
        assert "Loaded" in upload_set(res, session, [str(archive)])[0]
    first, folder = next(iter(session.router_sets.items()))[0], next(iter(session.router_sets.values()))[0].path
    status, menu, _ = upload_set(res, session, [str(archive)])
    assert len(session.router_sets) == 2 and first not in session.router_sets
    assert f"This tab keeps 2 router sets: **{first}** was dropped" in status and (first, first) not in menu.choices
    assert not folder.exists()  # its files went with it


def test_a_closed_tab_ends_its_session_at_once_through_the_unload_handler(tmp_path):
    """What demo.unload runs: the tab's Session, filed on page load under its session hash, ends: the training stops
    (abandoned: nothing is saved), the sets and the temp folder go. A second end (Gradio's delete callback an hour
    later) is harmless."""
    from types import SimpleNamespace

    from routerlab.ui.state.session import _delete_session, close_tab, keep_session, open_sessions

    res = tiny_resources()
    session, other = ui.Session(), ui.Session()
    keep_session(session, SimpleNamespace(session_hash="tab-1"))
    keep_session(other, SimpleNamespace(session_hash="tab-2"))
    assert "Loaded" in upload_set(res, session, [str(_a_set_zip(res, tmp_path))])[0]
    _start(res, session, steps=10_000)  # runs until stopped (or its 1-minute budget ends)
    job, workdir = session.job, session.workdir()
    assert workdir.is_dir() and session.router_sets
    before = open_sessions()
    close_tab(SimpleNamespace(session_hash="tab-1"))
    assert open_sessions() == before - 1 and not session.router_sets and session.job is None and not workdir.exists()
    end = time.monotonic() + 120
    while res.trainer.position(job) is not None and time.monotonic() < end:  # the line is free once it has ended
        time.sleep(0.05)
    assert job.phase in ("stopped", "cancelled") and job.routers is None and not job.folder.exists() and not workdir.exists()
    assert other.hash == "tab-2" and not res.trainer.busy  # the other tab is untouched
    close_tab(SimpleNamespace(session_hash="tab-1"))  # twice: nothing left to end
    _delete_session(session)
    _delete_session(other)
    assert open_sessions() == before - 2


def test_the_progress_line_says_when_answering_ends_and_never_claims_time_left_past_the_budget():
    from routerlab.ui.figures.train_plots import progress_html

    answering = {"phase": "answering", "elapsed": 5.0, "message": "The full model answers up to 334 prompts first …",
                 "answered": 8, "to_answer": 334, "answer_until": 12.0, "rows": []}
    line = progress_html(answering, 30.0)
    assert "8 of 334 prompts answered (answering ends by 0:12)" in line and "about 0:25 left" in line
    late = dict(answering, phase="evaluating", elapsed=41.0, message="Calibrating …")
    line = progress_html(late, 30.0)
    assert "0:11 past the budget, finishing" in line and "left" not in line


class _Hold:
    """A job that holds the training line until released: the visitor's job waits behind it, so a test can watch it
    from its first state change on."""

    settings = type("S", (), {"label": "hold"})()

    def __init__(self):
        self.release, self._phase = threading.Event(), "queued"

    @property
    def phase(self):
        return self._phase

    def stop(self):
        self.release.set()

    def run(self):
        self._phase = "training"
        self.release.wait(60)
        self._phase = "done"


def _stop_in(job, when) -> threading.Event:
    """Land Stop where `when(changes, job)` first holds: the job's thread waits there (on the job's own stop flag, not on
    a clock) until the test has pressed Stop. Returns the event set when that point is reached."""
    reached = threading.Event()

    def watcher(changes):
        if not reached.is_set() and when(changes, job):
            reached.set()
            end = time.monotonic() + 60
            while not job.stopping and time.monotonic() < end:
                time.sleep(0.005)

    job.watch(watcher)
    return reached


@pytest.mark.parametrize("run", range(3))
def test_stop_during_the_steps_and_during_the_calibration_frees_the_page_at_once_and_keeps_the_routers(tmp_path, run):
    """Stop pressed after the first step, and as the calibration starts: the job ends before train_stop returns (it waits
    up to STOP_WAIT = 1.5 s, then the page's chained tick frees Start), the routers are kept as they were,
    uncalibrated (router.json without a calibration, 0.5 the training gate) and said so; Start works again."""
    from routerlab.tuning.checkpoint import read_config
    from routerlab.ui.tabs.train_tab import STOP_WAIT

    res = tiny_resources()
    session = ui.Session()
    landings = {"training": lambda changes, job: len(changes.get("rows", ())) == 1,  # after step 1, the others to come
                "evaluating": lambda changes, job: changes.get("phase") == "evaluating"}
    for phase, when in landings.items():
        hold = _Hold()
        res.trainer.submit(hold)  # the line is held: the job cannot start before it is watched
        out = _start(res, session, steps=8, minutes=5)
        assert "1 training(s) ahead of yours" in out[4], out[4]
        job = session.job
        reached = _stop_in(job, when)
        hold.release.set()
        assert reached.wait(120), f"the job never reached {phase} ({job.snapshot()['message']})"
        assert job.phase == phase
        asked = time.perf_counter()
        status = train_stop(session)
        took = time.perf_counter() - asked
        assert job.wait(0), f"still {job.phase} after Stop waited {took:.1f} s"
        assert took < STOP_WAIT + 0.5 and "Stopping" in status
        progress, curves, layers, result, status, timer, menu, download, start = train_tick(res, session)  # chained to Stop
        assert start.interactive is True and timer.active is False and session.job is None
        snap = job.snapshot()
        assert snap["phase"] == "stopped", snap["message"]
        steps = len(snap["rows"])
        assert snap["message"].startswith(f"Stopped at step {steps}: the routers are kept as they were, uncalibrated")
        assert steps >= 1 and (steps == 1 if phase == "training" else True)
        assert "uncalibrated" in result and "| mine at 0.5 |" not in result
        label = next(reversed(session.router_sets))
        assert f"**{label}** is in the router-set menu" in html.unescape(status) and (label, label) in menu.choices
        config = read_config(job.folder)
        assert "calibration" not in config and config["threshold"] == 0.5 and config["training"]["stopped"] is True
        assert "Not calibrated, not compared" in (job.folder / "README.md").read_text()
        assert res.routers_for(res.engine, label, session.router_sets) is not None  # the kept set generates
    again = _start(res, session, steps=2)  # Start works again
    assert "still going" not in again[4] and "Training mine" in again[4], again[4]
    status = _wait(res, session)[4]
    assert "Done." in status, status
