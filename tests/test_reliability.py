"""Reliability and security, short versions of `python -m routerlab.bench.load` (the full run writes assets/bench/load.json).

The server is the real app (`ui.build_demo`) on the embedded model, on 127.0.0.1, with the
loadtest's watched engine; every check goes through the HTTP API the way a visitor or a script does.
Small on purpose: 3 sessions x 1 generation, caps of a few tokens, so the file stays near a minute.

Checks that need a generation to be in some state when something happens (still running when it is
interrupted, holding the only slot while others queue) hold that run first (tests/holding.py), so
no outcome depends on how fast the server's threads run.
"""

from __future__ import annotations

import html
import math
import threading
from concurrent.futures import ThreadPoolExecutor

import gradio as gr
import httpx
import pytest
from holding import WAIT_S, Holding

from routerlab import ui
from routerlab.bench import load as lt
from routerlab.core.base.errors import RouterLabError
from routerlab.core.records.trace import Step, Trace, savings

CAP = 12  # the test server's ROUTERLAB_MAX_NEW_TOKENS


@pytest.fixture(scope="module")
def engine(embedded):
    from routerlab.core.decode.engine import Engine

    return Holding(Engine(embedded.model, embedded.tokenizer, name=embedded.name))


@pytest.fixture(scope="module")
def server(engine):
    srv = lt.serve(engine, ui.Limits(max_new_tokens=CAP, max_prompt_chars=4000, queue_size=3, concurrency=1))
    yield srv
    lt.forget(srv.url)
    srv.close()


def waiting_in_queue(url: str) -> int:
    """Requests the server has accepted that wait for a worker slot (Gradio's queue status)."""
    return httpx.get(url.rstrip("/") + "/gradio_api/queue/status", timeout=30).json()["queue_size"]


def test_concurrent_sessions_keep_their_own_threshold_and_memory_settles(server, engine):
    # 3 visitors fit in the server's 1 slot + 3 queue places however their requests interleave. The first run holds
    # the slot until the other two wait in line: with 3 generations for 3 visitors, each visitor then runs exactly
    # one, with its own threshold (no visitor can finish and take another's).
    with ThreadPoolExecutor(1) as pool, engine.hold(after=0, max_new_tokens=4) as first:
        running = pool.submit(lt.load_test, server.url, sessions=3, generations=3, max_new=4, deadline_s=240, log=None)
        first.wait()
        assert lt.wait_until(lambda: waiting_in_queue(server.url) == 2, WAIT_S), "the other visitors did not queue"
        first.release()
    report = running.result()
    assert report["errors"] == 0, report["error_messages"]
    assert report["traces_checked"] == 3 and report["decision_errors"] == 0
    assert len(report["thresholds"]) == 3 and len(report["router_sets"]) == 3  # random routers: thresholds really differ
    assert report["server_after"]["live"] == 0 and report["server_after"]["decoders"] == 0


def test_the_soak_runs_at_the_page_defaults_and_every_run_completes(server):
    """`bench load --phases soak` in small: the page's own settings (its default router set, quality on), one and
    then two visitors at a time; every run ends with a ✓ status and decisions that follow its threshold."""
    from routerlab.bench.load.soak import page_defaults, soak_test

    defaults = page_defaults(server.url)
    assert defaults["measure_quality"] is True and defaults["router_set"] not in (ui.FULL, lt.BROKEN_LABEL)
    report = soak_test(server.url, generations=2, levels=(1, 2), new_tokens=(4, 6), deadline_s=240, log=None)
    assert report["settings"]["router_set"] == defaults["router_set"] and report["generations"] == 4
    assert report["errors"] == 0, report
    assert all(r["tokens"] > 0 and r["server_after"]["live"] == 0 for r in report["levels"].values())


@pytest.fixture(scope="module")
def room_server(embedded):
    """The app with its room: every generation a row of one batched decode loop (core/serve/room.py), in a thread here."""
    from routerlab.core.decode.engine import Engine

    srv = lt.serve(Engine(embedded.model, embedded.tokenizer, name=embedded.name),
                   ui.Limits(max_new_tokens=CAP, max_prompt_chars=4000, queue_size=8, concurrency=8))
    assert srv.room is not None
    yield srv
    lt.forget(srv.url)
    srv.close()


def test_a_room_serves_visitors_at_once_each_with_its_own_threshold(room_server):
    from routerlab.bench.load.room import level_run
    from routerlab.bench.load.soak import page_defaults

    report = lt.load_test(room_server.url, sessions=3, generations=6, max_new=6, deadline_s=240, log=None)
    assert report["errors"] == 0, report["error_messages"]
    assert report["traces_checked"] == 6 and report["decision_errors"] == 0 and len(report["thresholds"]) == 3
    assert report["server_after"]["live"] == 0
    row = level_run(room_server.url, 4, page_defaults(room_server.url), ui.load_prompts(), new_tokens=5, server_pid=room_server.pid)
    assert row["served"] == 4 and row["errors"] == row["refusals"] == 0 and row["tokens"] > 0
    assert row["web_server_cpu_s"] > 0 and row["clients_cpu_s"] >= 0 and row["server_cpu_ms_per_token"] > 0  # CPU read from /proc
    stats = lt.probe(room_server.url)["room"]
    assert stats["steps"] > 0 and stats["rows"] == stats["waiting"] == 0 and stats["thread"] == "routerlab-room"


@pytest.fixture
def one_more_token_after_an_interrupt(monkeypatch):
    """Gradio acts on a cancel or a closed tab when the stream yields its next frame, and a held run yields
    none. So once the server has registered such an interrupt (Gradio's `cancel_tasks`, `Queue.clean_events`),
    the holds added to the list this returns let their run make exactly one more token: the frame after which
    Gradio closes the stream (and the run, asked to stop, lets go of its hold). A Stop needs none of this:
    it asks the run itself to stop."""
    import gradio.queueing
    import gradio.routes

    holds = []

    def step():
        while holds:  # once per hold: a later interrupt of the same run (its client hanging up) changes nothing
            held = holds.pop()
            held.release(until=held.after + 1)

    cancel_tasks, clean_events = gradio.routes.cancel_tasks, gradio.queueing.Queue.clean_events

    async def cancel_then_step(task_ids):
        step()  # the tasks are cancelled below, before this coroutine yields: the stepped frame comes after
        return await cancel_tasks(task_ids)

    async def clean_then_step(self, **kwargs):
        await clean_events(self, **kwargs)  # marks the session's running events dead
        step()

    monkeypatch.setattr(gradio.routes, "cancel_tasks", cancel_then_step)
    monkeypatch.setattr(gradio.queueing.Queue, "clean_events", clean_then_step)
    return holds


@pytest.mark.parametrize("kind", ["stop", "cancel", "disconnect"])
def test_interrupted_run_frees_the_worker_within_a_step(server, engine, one_more_token_after_an_interrupt, kind):
    # The long run is held after 3 tokens, so the interrupt always reaches it while it is running.
    with engine.hold(after=3, max_new_tokens=CAP) as long_run:
        if kind != "stop":
            one_more_token_after_an_interrupt.append(long_run)
        row = lt.interrupt_test(server.url, kind, max_new=CAP, timeout=120)
    assert long_run.was_held and long_run.let_go_by == "stop", "the run was asked to stop while it was held"
    assert long_run.trace.meta["stop_reason"] == "stopped" and long_run.tokens == (3 if kind == "stop" else 4)
    assert row["generator_closed"] and row["no_generator_left"], row
    assert row["next_request_ok"], row  # the request queued behind it started and finished
    assert lt.within_a_step(row), row


def test_an_exception_in_one_run_leaves_the_app_serving(server):
    row = lt.exception_test(server.url, timeout=120)
    assert row["failing_run_clean"], row["failing_run_status"]
    assert row["other_run_ok"] and row["same_client_next_run_ok"]
    assert row["broken_router_set_clean"], row["broken_router_set_status"]


def test_a_run_at_the_token_cap_ends_cleanly(server):
    row = lt.token_cap_test(server.url, timeout=120)
    assert row["clean"] and row["tokens"] <= CAP, row


def test_bad_input_through_the_api_gets_clear_messages(server):
    report = lt.bad_input_test(server.url, timeout=120, log=None)
    assert not report["unclear"], report["unclear"]
    assert report["serving_after"] and report["server_after"]["live"] == 0
    by_case = {r["case"]: r["message"] for r in report["rows"]}
    assert "up to 4000" in by_case["prompt of 100,000 characters"]
    assert "Max new tokens: 1000000000 is out of range. Use a whole number from 1 to 12." in by_case["max new tokens 1e9"]
    assert "Model: Value: gpt2 is not in the list of choices" in by_case["model not allowed"]
    assert "Threshold: NaN is not a number" in by_case["raw: threshold NaN"]
    # inputs of the wrong kind: each answer names the field (the bad-input phase checks it for every case that has one)
    named = {r["case"]: r for r in report["rows"] if r["names"]}
    for case in ("train: learning rate 'x'", "train: distillation weight 'nan'", "train: LM-loss weight '1'", "train: most steps '400'",
                 "train: distillation weight [1]", "train: distillation weight {'a': 1}", "train: distillation weight true",
                 "compare: threshold_1 true", "measure quality '<img>'", "max new tokens 2.5", "set_threshold -0.0"):
        assert named[case]["clear"] and named[case]["outcome"] != "training started", named[case]
    assert "Learning rate: 'x' is text, not a number" in html.unescape(by_case["train: learning rate 'x'"])


def test_requests_beyond_the_queue_are_refused_with_a_message(server, engine, monkeypatch):
    # The first run holds the only slot until the server refused a request: until then nothing leaves the queue.
    import gradio.queueing

    refused = threading.Event()
    push = gradio.queueing.Queue.push

    async def push_noting_refusals(self, *args, **kwargs):
        answer = await push(self, *args, **kwargs)
        if answer[2] == "queue_full":
            refused.set()
        return answer

    monkeypatch.setattr(gradio.queueing.Queue, "push", push_noting_refusals)
    with ThreadPoolExecutor(1) as pool, engine.hold(after=0, max_new_tokens=1) as first:
        running = pool.submit(lt.queue_cap_test, server.url, queue_size=3, timeout=120)
        first.wait()
        assert refused.wait(WAIT_S), "no request was refused while every slot and queue place was taken"
        first.release()
    report = running.result()
    assert report["refused"] >= 1 and report["finished"] >= 1, report
    assert "Queue is full" in report["refusal_message"]


def test_router_loader_fuzz_fails_only_with_clean_errors():
    report = lt.fuzz_router_loading(cases=60, seed=1)
    assert report["crashes"] == [] and report["scan_ok"]
    assert report["clean_error"] > 0


def test_safe_defaults_and_env_caps():
    report = lt.safe_loading_checks()
    assert report["load_model_trust_remote_code_default"] is False
    assert report["defaults"] == dict(max_new_tokens=256, max_prompt_chars=16000, queue_size=64, concurrency=32, allowed_models=[],
                                      room=True, max_batch=32, room_cache_mb=2048)  # sized for a room of 32 visitors
    assert report["from_env"]["max_new_tokens"] == 7 and report["from_env"]["allowed_models"] == ["org/a", "org/b"]
    assert report["junk_env_falls_back"] == dict(max_new_tokens=256, queue_size=1)


def test_app_never_enables_remote_code(monkeypatch):
    import app

    seen = {}

    def fake_load_model(spec=None, **kwargs):
        seen.update(kwargs, spec=spec)
        raise RouterLabError("stop here")

    monkeypatch.setattr("routerlab.core.model.models.load_model", fake_load_model)
    with pytest.raises(RouterLabError):
        app.load_engine("someone/custom-code-model")
    assert seen.get("trust_remote_code", False) is False


def test_only_allow_listed_models_load():
    loaded = []

    class FakeEngine:
        name, n_layers = "base", 2

    res = ui.Resources(FakeEngine(), ui.Limits(allowed_models=("org/ok",)), router_sets=[], prompts=["x"],
                       model_loader=lambda name: loaded.append(name) or FakeEngine())
    for name in ("org/evil", "/etc", "../x", "gpt2"):
        with pytest.raises(RouterLabError, match="not available"):
            res.engine_for(name)
    assert loaded == []
    res.engine_for("org/ok")
    assert loaded == ["org/ok"]


def test_number_slider_refuses_non_numbers_with_a_message():
    slider = ui.NumberSlider(0.0, 1.0, value=0.5, label="Threshold")
    assert slider.get_block_name() == "slider" and slider.preprocess(0.25) == 0.25
    for bad in ("abc", None, [0.5], True, math.nan, math.inf):
        with pytest.raises(gr.Error, match="not a number"):
            slider.preprocess(bad)


def test_full_model_trace_has_savings_without_a_target():
    costs = {"q": 1, "k": 1, "v": 1, "o": 1, "mlp": 4, "score_per_ctx": 1, "kv_bytes": 8}
    trace = Trace(2, [Step(0, 1, "a", True, [None, None], [None, None], 0.5, 0.1)],
                  {"target": None, "costs": costs, "kv_policy": "kv"})
    assert savings(trace)["attention_flops_saved"] == 0.0


def test_prompt_with_unpaired_surrogates_is_refused_cleanly():
    class FakeEngine:
        name, n_layers = "base", 2

    res = ui.Resources(FakeEngine(), router_sets=[], prompts=["x"])
    with pytest.raises(RouterLabError, match="not valid text"):
        res.check_prompt("hello \ud800")
    assert res.check_prompt("emoji 🐉 and \x00 control") == "emoji 🐉 and \x00 control"


def test_served_exports_are_swept_from_gradio_cache():
    """Each run's exports (heatmap HTML with plotly.js, ~5 MB) are copied into gradio's cache; without a sweep a
    public demo's disk fills up run by run."""
    from routerlab.core.decode.engine import Engine
    from routerlab.core.model.models import tiny_model

    demo = ui.build_demo(ui.Resources(Engine(tiny_model("llama"), None, name="tiny"), router_sets=[], prompts=["x"]))
    frequency, age = demo.delete_cache
    assert frequency <= 3600 and age <= 24 * 3600
