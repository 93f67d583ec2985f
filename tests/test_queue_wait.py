"""A generation that would wait past ROUTERLAB_MAX_WAIT_S is refused as it joins the line, with the wait said
(routerlab/ui/web/queue_wait.py), on a real Gradio server: one slot held by a slow run, the next request refused at once
with the message at its first input, while a bad input still gets its own message; with a slot free, or no finished
run yet to estimate from, nothing is refused."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace as NS

import gradio as gr
import pytest
from gradio_client import Client

from routerlab.ui.web.queue_wait import WaitCap, middleware, register, validation_answer


class Fn:  # a BlockFunction as the queue keys its times: hashable, with its line
    def __init__(self, line):
        self.concurrency_id = line


def line(waiting=0, running=0, limit=2, means=()):
    queue = NS(event_queue_per_concurrency_id={"gen": NS(queue=[None] * waiting, current_concurrency=running, concurrency_limit=limit)},
               process_time_per_fn={Fn("gen"): NS(avg_time=m, count=1) for m in means} | {Fn("other"): NS(avg_time=1e6, count=1)})
    return WaitCap(NS(_queue=queue), max_wait_s=60)


def test_the_wait_is_estimated_as_gradio_estimates_it():
    assert line(waiting=0, running=1, limit=2, means=[100]).expected_wait() == 0.0  # a slot is free
    assert line(waiting=3, running=2, limit=2, means=[]).expected_wait() is None  # nothing finished yet: no estimate
    assert line(waiting=3, running=2, limit=2, means=[40, 60]).expected_wait() == pytest.approx(4 * 50 / 2)
    assert line(waiting=0, running=2, limit=2, means=[50]).refusal() is None  # 50 s: within the minute
    said = line(waiting=5, running=2, limit=2, means=[50]).refusal()
    assert "5 requests waiting" in said and "2.5 min" in said and "60 s" in said
    answer = json.loads(validation_answer(NS(inputs=[1, 2], input_parameter_names=["prompt", "threshold"]), said))["detail"]
    assert [(e["is_valid"], e["parameter_name"]) for e in answer] == [(False, "prompt"), (True, "threshold")]


def test_a_request_past_the_cap_is_refused_at_once_on_a_real_server():
    release = threading.Event()
    with gr.Blocks() as demo:
        box, out = gr.Textbox(), gr.Textbox()
        cap = WaitCap(demo, max_wait_s=0.5)
        register(demo, cap)

        def slow(text):
            if text == "hold":
                release.wait(60)
            else:
                time.sleep(1.0)  # the line's mean: a second
            return text
        gr.Button().click(slow, box, out, api_name="go", concurrency_limit=1, concurrency_id="gen")
        gr.Button().click(lambda t: t, box, out, api_name="other", concurrency_limit=1, concurrency_id="other")
    demo.queue()
    _, url, _ = demo.launch(prevent_thread_lock=True, quiet=True, app_kwargs={"middleware": [middleware()]})
    try:
        first = Client(url, verbose=False)
        assert first.predict("quick", api_name="/go") == "quick"  # a finished run: the line's mean time (1 s) is known
        held = Client(url, verbose=False).submit("hold", api_name="/go")
        deadline = time.monotonic() + 30
        while cap.ahead()[1] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        release_later = threading.Timer(30, release.set)  # never leave the slot held
        release_later.start()
        t0 = time.perf_counter()
        with pytest.raises(Exception, match="This server is busy"):
            Client(url, verbose=False).predict("late", api_name="/go")
        assert time.perf_counter() - t0 < 10  # told at once, not after the held run
        assert Client(url, verbose=False).predict("elsewhere", api_name="/other") == "elsewhere"  # another line: not capped
        release.set()
        assert held.result(timeout=30) == "hold"
        assert Client(url, verbose=False).predict("again", api_name="/go") == "again"  # a free slot: served
        release_later.cancel()
    finally:
        release.set()
        demo.close()
