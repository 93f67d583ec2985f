"""A visitor's session ends when their tab closes, and uploads are capped: in the real app (embedded model) on a
free port, driven by Debian's headless Chromium (skips, with the reason, where Chromium or playwright is missing).

Closing the page drops its heartbeat connection; Gradio fires the app's unload event, which ends the tab's Session
(ui/state/session.py: its training is abandoned, its sets and temp folder deleted) at once instead of an hour later. An
upload over ROUTERLAB_MAX_UPLOAD_MB is refused by Gradio before it is stored. Time bounds are generous (a shared
2-core machine); the test prints what it measured.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import uuid

import pytest
from test_browser import _free_port, browser  # noqa: F401  (the module's Chromium fixture)

from routerlab import ui
from routerlab.ui.state import session as sessions


def test_launch_options_cap_uploads_from_the_environment(monkeypatch):
    monkeypatch.delenv("ROUTERLAB_MAX_UPLOAD_MB", raising=False)
    assert ui.launch_options()["max_file_size"] == 32 * 2**20 and ui.Limits.from_env().session_sets == 8
    monkeypatch.setenv("ROUTERLAB_MAX_UPLOAD_MB", "5")
    monkeypatch.setenv("ROUTERLAB_SESSION_SETS", "3")
    assert ui.launch_options()["max_file_size"] == 5 * 2**20 and ui.Limits.from_env().session_sets == 3
    assert ui.launch_options(ui.Limits(max_upload_mb=2))["max_file_size"] == 2 * 2**20


@pytest.fixture(scope="module")
def app(embedded):
    from routerlab.core.decode.engine import Engine

    engine = Engine(embedded.model, embedded.tokenizer, name=embedded.name)
    limits = ui.Limits(max_new_tokens=64, max_upload_mb=1)
    res = ui.Resources(engine, limits, status="Pick a prompt and press **Generate**.")
    demo = ui.build_demo(res)
    demo.queue(max_size=8)
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=_free_port(), prevent_thread_lock=True, quiet=True,
                            **ui.launch_options(limits))
    yield url, res
    demo.close()


def _post_upload(url: str, size: int) -> int:
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"set.zip\"\r\n"
            "Content-Type: application/zip\r\n\r\n").encode() + b"\0" * size + f"\r\n--{boundary}--\r\n".encode()
    request = urllib.request.Request(f"{url}gradio_api/upload", data=body, method="POST",
                                     headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_an_upload_over_the_cap_is_refused_before_it_is_stored(app):
    url, _ = app
    assert _post_upload(url, 512 * 2**10) == 200
    assert _post_upload(url, 2 * 2**20) == 413  # over the 1 MB cap: Gradio's "File size exceeded ..."


def test_closing_the_tab_stops_its_training_and_frees_its_folder(browser, app):  # noqa: F811
    url, res = app
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(120_000)
    page.goto(url)
    page.get_by_role("button", name="Generate", exact=True).wait_for()
    page.get_by_role("tab", name="Train").click()
    page.locator("#rl-tr-start").click()
    page.wait_for_function("['data', 'answering', 'training'].includes("
                           "document.querySelector('#rl-tr-progress .rl-train-progress')?.dataset.phase)")
    mine = [s for s in list(sessions._OPEN.values()) if s.job is not None]
    assert len(mine) == 1, "the page's load event filed its session"
    session, job = mine[0], mine[0].job
    workdir = session.workdir()
    assert workdir.is_dir()
    closed = time.perf_counter()
    context.close()  # the tab closes: its heartbeat connection drops
    end, ended, phase = closed + 60, None, job.phase
    while res.trainer.busy and time.perf_counter() < end:
        if ended is None and session.job is None:
            ended, phase = time.perf_counter() - closed, job.phase
        time.sleep(0.05)
    took = time.perf_counter() - closed
    print(f"\nthe tab closed; its session ended {ended or took:.1f} s later (the job {phase}), the training slot was free {took:.1f} s later")
    assert not res.trainer.busy, f"the training still held the slot {took:.0f} s after the tab closed"
    assert job.phase in ("stopped", "cancelled") and job.routers is None
    assert not workdir.exists() and session.job is None and session not in sessions._OPEN.values()


@pytest.mark.report
def test_report_a_400_prompt_upload_with_half_a_minute_and_stop_while_answering(browser, app, tmp_path):  # noqa: F811
    """A measurement (make browser-reports): 400 short prompts without answers uploaded as JSONL with
    a 0.5-minute budget, timed from Start to the job's end; then a 3-minute one stopped while answering, timed from
    the Stop click to the job's end (on the server: the page itself polls every 2 s)."""
    import json

    url, res = app
    data = tmp_path / "prompts400.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Question {k}: name one thing about the number {k}."}) + "\n" for k in range(400)))
    page = browser.new_page(viewport={"width": 1280, "height": 1200})
    page.set_default_timeout(300_000)
    try:
        page.goto(url)
        page.get_by_role("button", name="Generate", exact=True).wait_for()
        page.get_by_role("tab", name="Train").click()
        page.get_by_label("my own text").check()
        page.locator("#rl-tr-file input[type=file]").set_input_files(str(data))
        page.wait_for_timeout(1000)
        for minutes in (0.5, 3):
            page.locator("#rl-tr-minutes input[type=number]").fill(str(minutes))
            page.locator("#rl-tr-minutes input[type=number]").press("Enter")
            page.wait_for_timeout(500)
            started = time.perf_counter()
            page.locator("#rl-tr-start").click()
            page.wait_for_function("document.querySelector('#rl-tr-progress .rl-train-progress')?.dataset.phase === 'answering'")
            job = next(s.job for s in list(sessions._OPEN.values()) if s.job is not None)
            stopped = None
            if minutes == 3:
                page.wait_for_timeout(3000)
                page.locator("#rl-tr-stop").click()
                stopped = time.perf_counter()
            while job.phase not in ("done", "stopped", "failed", "cancelled"):
                time.sleep(0.05)
            ended = time.perf_counter()
            page.wait_for_function("['done', 'stopped', 'failed'].includes(document.querySelector('#rl-tr-progress .rl-train-progress')?.dataset.phase)")
            print(f"\n{minutes} min: the job ended ({job.phase}) {ended - started:.1f} s after Start"
                  + (f", {ended - stopped:.1f} s after Stop" if stopped else "") + f": {job.snapshot()['message']}")
    finally:
        page.close()
