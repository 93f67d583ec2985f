"""The real app, served on localhost with the embedded model, driven through gradio_client.

Each test talks to the app the way a visitor's browser or a script would: named API endpoints,
one Client per visitor (a Client is one session, so its gr.State is its own). The app runs in this
process on an engine whose runs a test can hold (tests/holding.py): a test that acts on a running
generation holds it first, so nothing depends on how fast the server's threads run.
"""

from __future__ import annotations

import html
import json
import re
import socket
import statistics
import threading
import time
from pathlib import Path

import pytest
from holding import Holding

from routerlab import ui
from routerlab.core.records.trace import Trace

LONG_PROMPT = "Write a long story about a dragon who learns to read. Describe every chapter."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app(embedded):
    from routerlab.core.decode.engine import Engine

    engine = Holding(Engine(embedded.model, embedded.tokenizer, name=embedded.name))
    res = ui.Resources(engine, ui.Limits(max_new_tokens=256, concurrency=2, queue_size=8))
    demo = ui.build_demo(res)
    demo.queue(max_size=8)
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True, **ui.launch_options())
    yield url, res
    demo.close()


def client(url):
    from gradio_client import Client

    return Client(url, verbose=False, download_files=False)


def submit(c, res, prompt=LONG_PROMPT, threshold=0.5, max_new=24, router=ui.UNTRAINED, quality=None):
    """/generate with positional arguments; `quality` (the Measure-quality switch, the endpoint's last
    parameter) is sent only when given, as a caller written before the switch existed would."""
    args = (prompt, threshold, router, "kv", max_new, 0.0, res.default_model) + (() if quality is None else (quality,))
    return c.submit(*args, api_name="/generate")


def generated_so_far(job) -> int:
    """Generated tokens shown in the last streamed text (one span per token, prompt not shown)."""
    for out in reversed(job.outputs()):
        if isinstance(out[0], str) and "rl-text" in out[0]:
            return out[0].split("<div class='rl-legend'>")[0].count("class='rl-tok")
    return 0


def wait_for_tokens(job, n: int, timeout: float = 120.0) -> None:
    """Wait until the client was shown `n` generated tokens (a guard of `timeout` s against a hang)."""
    end = time.time() + timeout
    while generated_so_far(job) < n:
        assert not job.done(), "the run ended before the test could act on it"
        assert time.time() < end, f"{n} tokens were not streamed within {timeout:.0f} s"
        time.sleep(0.05)


def wait_done(job, timeout: float = 120.0) -> None:
    end = time.time() + timeout
    while not job.done():
        assert time.time() < end, f"the job did not end within {timeout:.0f} s"
        time.sleep(0.05)


def trace_from(result) -> Trace:
    update = result[4]
    value = update.get("value", update) if isinstance(update, dict) else update
    path = value.get("path") if isinstance(value, dict) else value
    return Trace.from_json(Path(path).read_text())


def consistent(trace: Trace) -> bool:
    """Every recorded decision is `score >= that step's threshold`."""
    return all(e == (sc >= s.threshold) for s in trace.steps for sc, e in zip(s.scores, s.executed) if sc is not None)


def test_generate_streams_text_trace_and_figure(app):
    url, res = app
    with res.engine.hold(after=1, max_new_tokens=16) as held:
        job = submit(client(url), res, prompt="Explain in three sentences why the sky is blue.", max_new=16)
        held.wait()
        wait_for_tokens(job, 1)  # a streamed frame the client got while the run could not have ended
    result = job.result(timeout=300)
    assert len(job.outputs()) >= 3, "the run streams intermediate updates"
    text, plot, stats, status = result[:4]
    assert "rl-tok" in text and status.startswith("✓ Done")
    assert plot["type"] == "plotly"
    figure = json.loads(plot["plot"])
    assert [t["name"] for t in figure["data"][:2]] == ["ran", "skipped"]
    trace = trace_from(result)
    assert 1 <= len(trace.generated_steps) <= 16 and trace.meta["model"] == res.default_model
    assert trace.meta["granularity"] == "attention-token" and consistent(trace)
    # the quality switch was left out: on by default, so every generated token has its KL and the strip shows it
    assert trace.meta["quality"] and all(s.kl_full is not None for s in trace.generated_steps)
    assert "quality cost" in [t["name"] for t in figure["data"]] and "mean KL" in stats


def test_threshold_change_mid_stream_changes_later_decisions(app):
    url, res = app
    c = client(url)
    with res.engine.hold(after=3, max_new_tokens=48) as held:
        job = submit(c, res, threshold=0.5, max_new=48)
        held.wait()
        status = c.predict(0.6, api_name="/set_threshold")[3]
    assert "from the next token" in status
    trace = trace_from(job.result(timeout=300))
    thresholds = [s.threshold for s in trace.generated_steps]
    assert thresholds[:3] == [0.5] * 3 and set(thresholds[3:]) == {0.6}, "the move applies from the next token on"
    routed = trace.meta["routed_layers"]
    decided = [s for s in trace.generated_steps if s.scores[routed[0]] is not None]
    before = [s for s in decided if s.threshold == 0.5]
    after = [s for s in decided if s.threshold == 0.6]
    assert before and after, "the run has tokens on both sides of the change"
    assert all(s.executed[i] for s in before for i in routed)  # untrained routers score 0.5: all run at 0.5
    assert not any(s.executed[i] for s in after for i in routed)  # ... and all skip at 0.6
    assert max(s.position for s in before) < min(s.position for s in after)
    # after the run, the same slider gives a what-if view, not a change to the finished trace
    what_if = c.predict(0.4, api_name="/set_threshold")
    assert "What-if" in what_if[3] and "WHAT-IF" in json.loads(what_if[0]["plot"])["layout"]["title"]["text"]


def test_stop_ends_the_run(app):
    url, res = app
    c = client(url)
    with res.engine.hold(after=3, max_new_tokens=200) as held:
        job = submit(c, res, max_new=200)
        held.wait()
        assert "Stopping" in c.predict(api_name="/stop")
        held.wait_ended()  # a held run lets go when asked to stop, and the engine ends before another token
    assert held.let_go_by == "stop"
    assert held.trace.meta["stop_reason"] == "stopped" and len(held.trace.generated_steps) == 3
    wait_done(job)  # Stop also cancels the stream
    assert generated_so_far(job) <= 3
    try:
        trace = trace_from(job.result(timeout=5))
    except Exception:  # a cancelled stream has no final result; ending is what matters
        return
    assert trace.meta["stop_reason"] == "stopped" and len(trace.generated_steps) == 3


def test_two_clients_at_once_get_separate_consistent_traces(app):
    url, res = app
    a, b = client(url), client(url)
    with res.engine.hold(after=2, threshold=0.5) as held_a, res.engine.hold(after=2, threshold=0.6) as held_b:
        job_a = submit(a, res, threshold=0.5, max_new=32)
        job_b = submit(b, res, threshold=0.6, max_new=32)
        held_a.wait(), held_b.wait()  # both runs are going at once
        b.predict(0.45, api_name="/set_threshold")  # moves only b's run
    trace_a, trace_b = trace_from(job_a.result(timeout=300)), trace_from(job_b.result(timeout=300))
    assert {s.threshold for s in trace_a.steps} == {0.5}
    assert {s.threshold for s in trace_b.steps} == {0.6, 0.45} and trace_b.steps[0].threshold == 0.6
    assert consistent(trace_a) and consistent(trace_b)
    assert trace_a.skip_rate() == 0.0  # untrained routers at 0.5: nothing skipped, whatever b did
    assert trace_b.skip_rate() > 0.0


def test_compare_endpoint_runs_both_models(app):
    url, res = app
    out = client(url).predict("What is the capital of France?", 0.6, None, None, ui.UNTRAINED, "kv", 12, 0.0, res.default_model, api_name="/compare")
    full_html, routed_html, none_1, none_2, cmp_html, heat, status = out
    assert "rl-tok" in full_html and "rl-tok" in routed_html and "tok/s" in cmp_html and status.startswith("✓")
    assert "Threshold 0.60" in routed_html and "(no threshold)" in none_1 + none_2


def test_compare_takes_the_ladder_as_one_string_and_names_a_bad_one(app):
    """The docs' "0.3, 0.5, 0.7" in threshold_1 runs the three columns (gr.Number alone raised a bare error); a word
    comes back as a ⚠ status naming it."""
    url, res = app
    c = client(url)
    *columns, table, heat, status = c.predict("Hi", "0.3, 0.5, 0.7", None, None, ui.UNTRAINED, "kv", 2, 0.0, res.default_model, api_name="/compare")
    assert status.startswith("✓") and all(f"Threshold {t:.2f}" in col for col, t in zip(columns[1:], (0.3, 0.5, 0.7)))
    status = c.predict("Hi", "half", None, None, ui.UNTRAINED, "kv", 2, 0.0, res.default_model, api_name="/compare")[-1]
    assert status.startswith("⚠") and "'half' is not a number" in html.unescape(status)  # as the page shows it


def test_the_api_refuses_issue_50s_inputs_naming_each_field(app):
    """Each of these ended in {"error": null} for the client and a TypeError traceback in the log, or was taken as
    something else (true as 1, "<img>" as on, 2.5 tokens): now an error that names the field as the page labels it."""
    from gradio_client.exceptions import AppError

    url, res = app
    c = client(url)
    refused = [("/train", "learning_rate", "x", "Learning rate: 'x' is text"), ("/train", "kd_weight", "nan", "Distillation weight: 'nan'"),
               ("/train", "lm_weight", "1", "LM-loss weight: '1'"), ("/train", "max_steps", "400", "Most steps: '400'"),
               ("/train", "kd_weight", [1], "Distillation weight: [1] is a list"),
               ("/train", "kd_weight", {"a": 1}, "Distillation weight: {'a': 1} is an object"),
               ("/train", "kd_weight", True, "Distillation weight: true is a yes/no value"),
               ("/generate", "measure_quality", "<img>", "Measure quality (full-model pass): '<img>' is not true or false"),
               ("/generate", "max_new_tokens", 2.5, "Max new tokens: 2.5 is not a whole number")]
    for api, name, value, said in refused:
        with pytest.raises(AppError) as caught:
            c.predict(**{name: value}, api_name=api)
        assert html.unescape(str(caught.value)).startswith(said), (api, name, str(caught.value))
    status = c.predict("Hi", True, None, None, ui.UNTRAINED, "kv", 2, 0.0, res.default_model, api_name="/compare")[-1]
    assert html.unescape(status).startswith("⚠ Threshold 1: true is a yes/no value, not a number"), status


def test_a_tiny_temperature_generates_greedily(app):
    """Temperature 1e-45 ended in `probability tensor contains either inf, nan`."""
    url, res = app
    c = client(url)
    out = [c.predict("Name a colour.", 0.5, ui.UNTRAINED, "kv", 4, t, res.default_model, False, api_name="/generate") for t in (0.0, 1e-45)]
    assert all(o[3].startswith("✓ Done") for o in out)
    assert [s.token_id for s in trace_from(out[1]).generated_steps] == [s.token_id for s in trace_from(out[0]).generated_steps]


RUN_PARAMETERS = ["prompt", "threshold", "router_set", "kv_policy", "max_new_tokens", "temperature", "model", "measure_quality"]


def test_api_names_every_parameter(app):
    """A script sees each endpoint's parameters by name (view_api, keyword arguments), never `param_0`, `param_1`, ...;
    the session (gr.State) is not a parameter, and the Measure-quality switch stays last."""
    from routerlab.ui.tabs.compare import RUNGS

    url, _ = app
    api = client(url).view_api(print_info=False, return_format="dict")
    named = {name: [p["parameter_name"] for p in info["parameters"]] for name, info in api["named_endpoints"].items()}
    assert named["/generate"] == named["/regenerate"] == RUN_PARAMETERS
    assert named["/compare"] == ["prompt", *(f"threshold_{k + 1}" for k in range(RUNGS)), *RUN_PARAMETERS[2:-1]]
    assert named["/train"] == ["granularity", "skip_target", "minutes", "learning_rate", "kd_weight", "lm_weight", "max_steps",
                               "init", "source", "text", "file"]
    assert named["/set_threshold"] == ["threshold"] and named["/sweep"] == ["prompt", "router_set", "kv_policy", "model"]
    assert named["/stop"] == named["/stop_compare"] == named["/stop_training"] == []
    unnamed = {name: ps for name, ps in named.items() if any(re.fullmatch(r"param_\d+", p) for p in ps)}
    assert not unnamed, f"endpoints with unnamed parameters: {unnamed}"
    # every /generate and /train parameter may be left out (the page's value applies; /train's text and file: none)
    for name in ("/generate", "/train"):
        assert all(p["parameter_has_default"] for p in api["named_endpoints"][name]["parameters"]), name


def test_generate_takes_named_arguments(app):
    """docs/operators.md's example: named arguments, the rest left at the page's values; 8 values come back."""
    url, res = app
    c = client(url)
    out = c.predict(prompt="Name three colours.", threshold=0.6, router_set=ui.UNTRAINED, max_new_tokens=4, measure_quality=False,
                    api_name="/generate")
    assert len(out) == 8 and "rl-tok" in out[0] and out[1]["type"] == "plotly" and out[3].startswith("✓ Done") and out[7] == ""
    trace = trace_from(out)
    assert 1 <= len(trace.generated_steps) <= 4 and {s.threshold for s in trace.steps} == {0.6} and not trace.meta["quality"]
    page = {p["parameter_name"]: p["parameter_default"] for p in c.view_api(print_info=False, return_format="dict")["named_endpoints"]["/generate"]["parameters"]}
    assert trace.meta["model"] == page["model"] == res.default_model and trace.meta["kv_policy"] == page["kv_policy"]


@pytest.mark.report
def test_report_streaming_rate_and_overhead(app, capsys):
    """Prints heatmap updates per second while streaming, and decode tokens/s with and without the app
    streaming to a client (same prompt, greedy, alternating runs; the engine times each decode step, so
    any CPU the UI takes from decoding shows up there). Reported, never asserted: this box is shared.
    `make browser-reports` runs it."""
    url, res = app
    engine = res.engine
    routers = res.routers_for(engine, ui.UNTRAINED)
    config = res.generate_config(64, 0.0, 0.5, "kv", quality=False)
    c = client(url)
    direct, through_app, rates = [], [], []
    for _ in range(2):
        # in a worker thread, like the app's own decoding: on CPU, torch in the main thread can be several times slower
        runs = []
        worker = threading.Thread(target=lambda: runs.append(engine.run(LONG_PROMPT, routers, config)))
        worker.start()
        worker.join()
        direct.append(runs[0].decode_tokens_per_second())
        job = submit(c, res, max_new=64, quality=False)
        stamps, seen, last_frame = [], 0, None
        while not job.done():
            outs = job.outputs()
            for o in outs[seen:]:  # frames repeat an unchanged heatmap frame (the last value): count only new ones
                if isinstance(o[-1], str) and o[-1].startswith("{") and o[-1] != last_frame:
                    stamps.append(time.perf_counter())
                    last_frame = o[-1]
            seen = len(outs)
            time.sleep(0.01)
        through_app.append(trace_from(job.result()).decode_tokens_per_second())
        if len(stamps) >= 2:
            rates.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
    m = statistics.median
    with capsys.disabled():
        print(
            f"\n[app] heatmap updates while streaming: {f'{m(rates):.1f}/s' if rates else 'fewer than 2 per run'}; decode tokens/s direct "
            f"{m(direct):.2f} vs streamed through the app {m(through_app):.2f} (ratio {m(through_app) / m(direct):.2f})"
        )


def test_a_file_field_given_no_file_and_a_bad_example_index_are_refused_by_name(app):
    """Values of the wrong kind where a file goes (Train's text file, a router set upload) or an example index that is
    not one (the page's `load_example`, reached by its index) get a message naming the field, not `{"error": null}`."""
    from routerlab.bench.load.driver import _fn_index, _raw_call
    from routerlab.tuning.job import JobSettings
    from routerlab.ui.tabs.train_tab import OWN, STARTS

    url, res = app
    train = _fn_index(url, "train")
    ok = [None, "attention-token", 15, 0.5, JobSettings.lr, JobSettings.kd_weight, JobSettings.lm_weight, JobSettings.max_steps,
          next(iter(STARTS)), OWN, "", None]
    for value in (12345, "not-a-file", [1, 2], {"a": 1}, True):
        said = _raw_call(url, train, json.dumps(ok[:11] + [value]), timeout=60)
        assert "… or a .txt / .jsonl file takes a file uploaded to this app" in html.unescape(said), (value, said)
    deps = client(url).config["dependencies"]
    example = next(d.get("id", i) for i, d in enumerate(deps) if d.get("api_name") == "load_example")
    for value in (-1, 10_000, "0", 1.5, [0]):
        said = _raw_call(url, example, json.dumps([value]), timeout=60)
        assert "Example prompts:" in said and "is not one of the" in said, (value, said)
    assert res.prompts[1] in _raw_call(url, example, "[1]", timeout=60)  # a real index loads its prompt
