"""ui.py handlers on a tiny random model with a character tokenizer: no downloads, no server.

The handlers are called directly (as Gradio would call them); the gradio_client tests in
test_app_client.py drive the real app with the embedded model. A test that acts on a running
generation holds it first (tests/holding.py): the UI decodes in a worker thread, and nothing here
may depend on how fast that thread runs.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import gradio as gr
import plotly.graph_objects as go
import pytest
import torch
from holding import Holding

from routerlab import ui
from routerlab.core.base.config import RoutingConfig
from routerlab.core.base.errors import RouterLabError
from routerlab.core.records.trace import Trace
from routerlab.ui.web import heatmap_export

RANDOM = "attention-token (random, test)"


def char_tokenizer():
    """A 128-symbol character tokenizer matching tiny_model's vocabulary; id 3 is end of text."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {chr(i) if i >= 32 else f"<{i}>": i for i in range(128)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="?"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="?", eos_token="<127>")


def random_routers(model, seed=0):
    """Routers with small random weights: scores spread around 0.5, about half the tokens skip."""
    from routerlab.core.routing.router import RouterSet

    rs = RouterSet.zeros(model, RoutingConfig.from_granularity("attention-token", [1, 2]))
    g = torch.Generator().manual_seed(seed)
    for r in rs.routers.values():
        r.proj.weight.data = torch.randn(r.proj.weight.shape, generator=g) * 0.15
    return rs


def tiny_resources():
    """The app's Resources around a held tiny llama (tests/holding.py), with a random router set under RANDOM."""
    from routerlab.core.decode.engine import Engine
    from routerlab.core.model.models import tiny_model

    model = tiny_model("llama")
    engine = Holding(Engine(model, char_tokenizer(), name="tiny-llama"))
    sets = [ui.RouterSetInfo(label=RANDOM, granularity="attention-token"), *ui.available_router_sets(Path("/nonexistent"))]
    resources = ui.Resources(engine, ui.Limits(max_new_tokens=64, max_prompt_chars=200), router_sets=sets, prompts=["Hello there"])
    resources._routers[(engine.name, RANDOM)] = random_routers(model)  # stands in for a shipped, trained set
    return resources


@pytest.fixture(scope="module")
def res():
    return tiny_resources()


def run_all(gen):
    return list(gen)


def explore(res, session, prompt="Hello there", threshold=0.5, label=RANDOM, policy="kv", max_new=24, temperature=0.0, quality=True):
    return ui.explore_run(res, prompt, threshold, label, policy, max_new, temperature, res.default_model, session, quality)


def file_path(update) -> Path:
    """The file an output gives: a component update (the first run of a session) or the path itself (later runs)."""
    if isinstance(update, (str, Path)):
        return Path(update)
    value = update.value if hasattr(update, "value") else update["value"]
    return Path(value["path"] if isinstance(value, dict) else value)


def advance(gen, session, held):
    """Pull the stream until its run is held (after `held.after` generated tokens).

    The stream's second frame starts the decoder thread, which runs ahead of the frames; the hold stops
    it there. A frame follows every change of the trace, so the loop ends once the run is held.
    """
    for _ in gen:
        if len(session.trace.generated_steps) >= held.after:
            break
    held.wait()


def rebuilt(frame) -> list[int]:
    """The outputs of a frame that make Gradio rebuild a component's config: a component or a gr.skip()/update dict."""
    from gradio import utils

    return [k for k, v in enumerate(frame) if isinstance(v, gr.blocks.Block) or utils.is_prop_update(v)]


def test_a_run_rebuilds_only_its_button_and_once_per_session_the_downloads(res):
    # Every component update (gr.skip() included) makes Gradio rebuild that component's whole config in the web
    # server's process; a run repeats values instead. Its button is disabled and enabled again (2 updates); the download
    # buttons appear by an update once per session, later runs give them their new files as plain values.
    session = ui.Session()
    for round_ in range(2):
        outs = run_all(explore(res, session, max_new=6))
        assert [rebuilt(o) for o in outs[:-1]] == [[8]] + [[]] * (len(outs) - 2)  # the first frame disables the button
        final = outs[-1]
        assert rebuilt(final) == ([4, 5, 8] if round_ == 0 else [8])
        trace_file = file_path(final[4])
        assert json.loads(trace_file.read_text())["steps"] and trace_file.parent.name.startswith("run-")  # this run's own folder
        assert round_ == 0 or final[5] == heatmap_export.LABEL  # the heatmap's page is made in the browser


def pull_until(gen, wanted) -> list:
    """Pull frames until one is `wanted`; returns the frames pulled (all of them if none was)."""
    outs = []
    for out in gen:
        outs.append(out)
        if wanted(out):
            break
    return outs


def figure(value) -> dict:
    """A streamed figure as a dict, whether the handler gave a plotly Figure or serialized PlotData."""
    if isinstance(value, go.Figure):
        return value.to_dict()
    assert hasattr(value, "plot"), f"not a figure: {type(value)}"
    return json.loads(value.plot)


def is_skip(value) -> bool:
    return isinstance(value, dict) and value.get("__type__") == "update" and len(value) == 1


def live_figure(out) -> dict | None:
    """A frame's live heatmap (its last value: figure JSON the page draws into the heatmap), None when it has none."""
    return json.loads(out[9]) if len(out) > 9 and isinstance(out[9], str) and out[9] else None


def heatmap_kind(out) -> str | None:
    """The routerlab kind of a frame's heatmap ("live" while streaming), None when the frame has no figure."""
    if live_figure(out) is not None:
        return live_figure(out)["layout"]["meta"].get("routerlab")
    value = out[1]
    if not (isinstance(value, go.Figure) or hasattr(value, "plot")):
        return None
    return figure(value)["layout"].get("meta", {}).get("routerlab")


def test_explore_streams_text_then_final_figures_and_exports(res):
    session = ui.Session()
    with res.engine.hold(after=5):  # the run cannot end before a live heatmap was streamed
        gen = explore(res, session, max_new=40)
        streamed = pull_until(gen, lambda out: heatmap_kind(out) == "live")
    outs = streamed + run_all(gen)
    assert len(outs) >= 3 and all(len(o) == 10 for o in outs)
    text, heat, stats, status, trace_dl, html_dl, bar, hist, _, live = outs[-1]
    assert live == "" and figure(heat)["layout"]["meta"]["routerlab"] == "final"
    # while streaming the heatmap itself keeps one placeholder (gr.Plot remounts its plot for every new figure);
    # the frames travel in the last value and the page draws them into that placeholder
    placeholders = {o[1].plot for o in outs[:-1] if hasattr(o[1], "plot")}
    assert len(placeholders) == 1 and "routerlab" not in json.loads(placeholders.pop())["layout"].get("meta", {})
    assert "rl-tok" in text and figure(heat)["data"] and figure(bar)["data"] and figure(hist)["data"]
    assert status.startswith("✓ Done")
    assert "live" in [heatmap_kind(o) for o in outs[1:-1]], "the heatmap streams before the end"
    assert not any(is_skip(v) for o in outs[1:-1] for v in o), "no gr.skip() while streaming (Gradio rebuilds a component per skip)"
    trace = Trace.from_json(file_path(trace_dl).read_text())
    assert trace.generated_steps and trace.meta["granularity"] == "attention-token"
    # the heatmap's page is made in the browser on the click (ui/web/heatmap_export.py): the server only shows the button
    assert (html_dl.constructor_args if isinstance(html_dl, gr.Button) else {"value": html_dl})["value"] == heatmap_export.LABEL
    assert [p.name for p in file_path(trace_dl).parent.iterdir()] == ["routerlab-trace.json"]
    assert session.trace is not None and not session.running


def test_bad_input_is_a_status_line_not_an_exception(res):
    session = ui.Session()
    for prompt in ("", "x" * 201):
        outs = run_all(explore(res, session, prompt=prompt))
        assert len(outs) == 1 and outs[0][3].startswith("⚠")
        assert all(is_skip(v) for v in outs[0][:3])  # text and figures untouched (the prompt box is never an output)
    outs = run_all(explore(res, session, max_new=10_000))
    assert "Max new tokens: 10000 is out of range" in html.unescape(outs[0][3])  # the status line is Markdown: the message escaped


def test_unknown_or_disallowed_model_is_refused(res):
    with pytest.raises(RouterLabError, match="not available"):
        res.engine_for("someone/huge-model")
    outs = run_all(ui.explore_run(res, "Hi", 0.5, RANDOM, "kv", 8, 0.0, "someone/huge-model", ui.Session()))
    assert "not available" in outs[0][3]


def test_threshold_change_mid_run_changes_later_decisions(res):
    session = ui.Session()
    with res.engine.hold(after=5) as held:
        gen = explore(res, session, threshold=0.0, max_new=40)
        advance(gen, session, held)
        out = ui.threshold_moved(res, 1.0, session)
    assert "from the next token" in out[3]
    run_all(gen)
    trace = session.trace
    thresholds = [s.threshold for s in trace.generated_steps]
    assert thresholds[:5] == [0.0] * 5 and set(thresholds[5:]) == {1.0}, "the move applies from the next token on"
    gen_steps = [s for s in trace.generated_steps if any(e is not None for e in s.executed)]
    before = [s for s in gen_steps if s.threshold == 0.0]
    after = [s for s in gen_steps if s.threshold == 1.0]
    assert before and after
    assert all(e is not False for s in before for e in s.executed)  # threshold 0: everything ran
    assert all(e == (sc >= 1.0) for s in after for e, sc in zip(s.executed[1:3], s.scores[1:3]))
    assert sum(e is False for s in after for e in s.executed) > 0  # threshold 1: (nearly) every routed layer skipped


def test_what_if_after_run_is_labelled_and_differs(res):
    session = ui.Session()
    run_all(explore(res, session, threshold=0.5))
    heat, text, stats, status, bar, hist = ui.threshold_moved(res, 0.9, session)
    assert "What-if" in status and "WHAT-IF" in heat.layout.title.text
    assert "(what-if)" in stats
    assert session.trace.skip_rate(0.9) > session.trace.skip_rate()
    recorded = ui.threshold_moved(res, 0.5, session)[0]
    assert "WHAT-IF" in recorded.layout.title.text  # still labelled, even at the recorded threshold


def test_threshold_before_any_run_only_sets_the_next_start(res):
    out = ui.threshold_moved(res, 0.3, ui.Session())
    assert all(is_skip(v) for i, v in enumerate(out) if i != 3) and "next generation" in out[3]


def test_stop_ends_the_run_early(res):
    session = ui.Session()
    with res.engine.hold(after=3) as held:
        gen = explore(res, session, max_new=60)
        advance(gen, session, held)
        assert "Stopping" in ui.stop_run(session)
    outs = run_all(gen)
    assert session.trace.meta["stop_reason"] == "stopped"
    assert len(session.trace.generated_steps) == 3, "no token after the stop request"
    assert "stopped" in outs[-1][3].lower()
    assert "Nothing" in ui.stop_run(ui.Session())


def test_show_last_after_cancel_renders_the_partial_run(res):
    session = ui.Session()
    with res.engine.hold(after=3) as held:
        gen = explore(res, session, max_new=40)
        advance(gen, session, held)
        gen.close()  # what a Gradio cancel does to the stream
        held.wait_ended()  # closing the stream asks the run to stop: it lets go of the hold and ends
    view = ui.show_last(res, session)
    assert len(view) == 10 and "Stopped after 3 tokens" in view[3] and not session.running
    assert session.trace.meta["stop_reason"] == "stopped"


def test_sessions_do_not_share_controls(res):
    a, b = ui.Session(), ui.Session()
    with res.engine.hold(after=3, threshold=0.2) as held_a, res.engine.hold(after=3, threshold=0.8) as held_b:
        gen_a = explore(res, a, threshold=0.2, max_new=30)
        gen_b = explore(res, b, threshold=0.8, max_new=30)
        advance(gen_a, a, held_a), advance(gen_b, b, held_b)  # both runs are going, both held
        ui.threshold_moved(res, 0.6, a)
    run_all(gen_a), run_all(gen_b)
    assert {s.threshold for s in b.trace.steps} == {0.8}
    assert {s.threshold for s in a.trace.steps} == {0.2, 0.6}


def test_compare_streams_both_and_marks_divergence(res):
    """One threshold: the ladder is the full-vs-routed view (more in test_ui_ladder.py)."""
    session = ui.Session()
    outs = run_all(ui.compare_run(res, "Hello there", 0.9, RANDOM, "kv", 20, 0.0, res.default_model, session))
    full_html, routed_html, _, _, cmp_html, heat, status = outs[-1]
    full, routed = session.compare
    assert full.meta["granularity"] == "full" and routed.meta["granularity"] == "attention-token"
    assert "tok/s" in cmp_html and status.startswith("✓")
    div = ui.figures.plots.first_divergence(full, routed)
    if div is not None:
        assert "rl-diverge" in routed_html and f"token {div + 1}:" in cmp_html
    assert "applies to the next generation" in ui.threshold_moved(res, 0.2, session)[3]  # the slider never steers a ladder



def test_a_link_threshold_is_not_announced_twice(res):
    """Opening a link sets the slider: the link's note says so; the slider's change event adds no second line."""
    from types import SimpleNamespace

    from routerlab.ui.tabs.links import View, open_link

    session = ui.Session()
    request = SimpleNamespace(query_params={"threshold": "0.62"})
    out = open_link(res, View(prompt="Hi", routers=RANDOM), request, session)
    assert out[5] == 0.62 and "threshold 0.62" in out[10].value
    assert ui.threshold_moved(res, 0.62, session) == (gr.skip(),) * 6
    assert "applies to the next generation" in ui.threshold_moved(res, 0.4, session)[3]  # a move of the user's own is
    assert "applies to the next generation" in ui.threshold_moved(res, 0.62, session)[3]

@pytest.mark.parametrize("tab, button", [("explore", "Generate"), ("compare", "Compare"), ("train", "Start training"),
                                         ("tradeoff", None), ("layers", None), ("about", None)])
def test_a_link_note_names_the_button_of_its_tab(res, tab, button):
    """The Train tab's button is Start training, not Generate; Trade-off, Layers and About have nothing to run first."""
    from types import SimpleNamespace

    from routerlab.ui.tabs.links import View, open_link

    note = open_link(res, View(prompt="Hi", routers=RANDOM), SimpleNamespace(query_params={"tab": tab}), ui.Session())[10].value
    assert note.startswith("✓ Opened a link")
    if button is None:
        assert "Press" not in note
    else:
        assert f"Press **{button}**" in note and note.count("Press") == 1


def test_full_model_choice_runs_without_routers(res):
    session = ui.Session()
    status = run_all(explore(res, session, label=ui.FULL))[-1][3]
    assert session.trace.meta["granularity"] == "full"
    assert session.trace.skip_rate() == 0.0
    # no router scores: no what-if view to promise, and the slider says what it will do instead
    assert status.startswith("✓ Done") and "what-if" not in status and "no router scores" in status
    moved = ui.threshold_moved(res, 0.3, session)
    assert moved[0] == gr.skip() and "what-if" not in moved[3].lower() and "full model" in moved[3]


def test_untrained_router_set_never_skips_at_half(res):
    session = ui.Session()
    run_all(explore(res, session, label=ui.UNTRAINED, threshold=0.5))
    assert session.trace.skip_rate() == 0.0 and session.trace.meta["routed_layers"] == [1, 2]


def test_available_router_sets_lists_valid_folders_then_untrained(tmp_path, res):
    from routerlab.tuning.checkpoint import save_routers

    save_routers(random_routers(res.engine.model), tmp_path / "tiny-attn", res.engine.model, threshold=0.5, kv_policy="kv")
    half = tmp_path / "half"
    half.mkdir()
    (half / "router.json").write_text("{}")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "router.json").write_text("{not json")
    (broken / "routers.safetensors").write_bytes(b"")
    sets = ui.available_router_sets(tmp_path)
    assert [s.label for s in sets] == ["attention-token (tiny-attn)", ui.UNTRAINED]
    assert sets[0].path == tmp_path / "tiny-attn" and sets[1].path is None
    # a shipped set loads through the checkpoint module and then routes a run
    shipped = ui.Resources(res.engine, res.limits, router_sets=sets, prompts=["Hi"])
    session = ui.Session()
    run_all(ui.explore_run(shipped, "Hello", 0.5, sets[0].label, "kv", 12, 0.0, res.default_model, session))
    assert session.trace.meta["routed_layers"] == [1, 2] and session.trace.skip_rate() > 0
    # choosing it starts from its calibrated threshold and trained KV policy
    slider, radio, status = ui.router_set_chosen(shipped, sets[0].label)
    assert slider.value == 0.5 and radio.value == "kv" and "calibrated" in status
    slider, *rest = ui.router_set_chosen(shipped, ui.UNTRAINED)  # no calibration: the slider keeps its value, loses the set's skip rates
    assert all(is_skip(v) for v in rest) and slider.info == ui.layout.THRESHOLD_INFO


def test_a_set_broken_on_disk_is_named_without_the_servers_path(tmp_path, res):
    """The weights of a listed set go bad: the visitor reads which file is corrupted, never where the server keeps it."""
    from routerlab.tuning.checkpoint import WEIGHTS, save_routers

    folder = save_routers(random_routers(res.engine.model), tmp_path / "srv-secret" / "tiny-attn", res.engine.model, threshold=0.5, kv_policy="kv")
    sets = ui.available_router_sets(tmp_path / "srv-secret")
    (folder / WEIGHTS).write_bytes(b"\x00" * 7)
    shipped = ui.Resources(res.engine, res.limits, router_sets=sets, prompts=["Hi"])
    for run, at in ((ui.explore_run(shipped, "Hello", 0.5, sets[0].label, "kv", 4, 0.0, res.default_model, ui.Session()), 3),
                    (ui.compare_run(shipped, "Hello", [0.5], sets[0].label, "kv", 4, 0.0, res.default_model, ui.Session()), -1)):
        status = run_all(run)[-1][at]
        assert status.startswith("⚠") and WEIGHTS in status, status
        assert str(tmp_path) not in status and "srv-secret" not in status, status


def test_operator_allowed_models_load_once_others_are_refused(res):
    loads = []

    def loader(name):
        loads.append(name)
        return res.engine

    allowed = ui.Resources(res.engine, ui.Limits(allowed_models=("org/other",)), router_sets=res.router_sets, prompts=["Hi"], model_loader=loader)
    assert allowed.model_choices == [res.default_model, "org/other"]
    assert allowed.engine_for("org/other") is res.engine and allowed.engine_for("org/other") is res.engine
    assert loads == ["org/other"]
    with pytest.raises(RouterLabError, match="not available"):
        allowed.engine_for("org/not-listed")


def test_limits_from_env(monkeypatch):
    monkeypatch.setenv("ROUTERLAB_MAX_NEW_TOKENS", "32")
    monkeypatch.setenv("ROUTERLAB_MAX_PROMPT_CHARS", "oops")
    monkeypatch.setenv("ROUTERLAB_ALLOWED_MODELS", " a/b , c ")
    limits = ui.Limits.from_env()
    assert limits.max_new_tokens == 32 and limits.max_prompt_chars == 16000 and limits.allowed_models == ("a/b", "c")


def test_tradeoff_pick_sets_threshold_and_switches_tab():
    import pandas as pd

    df = pd.DataFrame({"method": ["tuned"], "threshold": [0.42], "speedup": [1.2], "perplexity": [9.0]})
    evt = gr.SelectData(None, {"index": [0, 2], "value": 1.2, "row_value": ["tuned", 0.42, 1.2, 9.0]})
    slider, tabs, status = ui.tradeoff_pick(df, evt)
    assert slider.value == 0.42 and tabs.selected == "explore" and "0.42" in status


def test_load_bench_handles_absence_and_bad_files(tmp_path):
    assert ui.load_bench(tmp_path / "missing") is None
    (tmp_path / "a.csv").write_text("method,speedup,perplexity,threshold\nrouted,1.2,9.5,0.5\n")
    (tmp_path / "b.csv").write_text("unrelated,columns\n1,2\n")
    df = ui.load_bench(tmp_path)
    assert list(df["method"]) == ["routed"]
    (tmp_path / "c.csv").write_text("method,granularity,speedup,perplexity,threshold,extra\ntuned,attention-token,1.1,9,0.4,x\ntuned,mlp-token,1.3,12,0.4,y\nfull,full,1.0,9,,z\n")
    df = ui.load_bench(tmp_path)
    assert "tuned mlp-token" in set(df["method"]) and "extra" not in df.columns


def test_load_bench_keeps_the_main_context_only(tmp_path):
    (tmp_path / "t.csv").write_text("method,speedup,perplexity,threshold,context_tokens\ntuned,1.0,9,0.4,60\n"
                                    "full,1.0,9,,60\ntuned,1.1,10,0.4,2000\nfull,1.0,9,,2000\n")
    df = ui.load_bench(tmp_path)
    assert list(df["method"]) == ["tuned", "full"] and list(df["speedup"]) == [1.0, 1.0]


def test_tradeoff_pick_ignores_rows_without_threshold():
    import pandas as pd

    df = pd.DataFrame({"method": ["full"], "threshold": [float("nan")], "speedup": [1.0], "perplexity": [9.0]})
    evt = gr.SelectData(None, {"index": [0, 0], "value": "full", "row_value": ["full", float("nan"), 1.0, 9.0]})
    assert "baseline" in ui.tradeoff_pick(df, evt)[2]
    df = pd.DataFrame({"method": ["tuned"], "threshold": [float("nan")], "speedup": [1.0], "perplexity": [9.0]})
    evt = gr.SelectData(None, {"index": [0, 0], "value": "tuned", "row_value": ["tuned", float("nan"), 1.0, 9.0]})
    assert "no threshold" in ui.tradeoff_pick(df, evt)[2]


def test_per_layer_costs_are_measured_and_estimate_a_speedup(res):
    costs = res.measure_costs(contexts=(16, 64), repeat=2)
    assert res.costs_for(None) is costs and costs["step"] > 0 and costs["context"] == 16
    assert costs["long_context"] == 64 and set(costs["per_token"]) == {"attention_full", "attention_kv_only", "step"}
    assert ui.figures.plots.live_stats(Trace(4, [], {}), costs)["speedup_estimate"] is None  # no decoded token yet


def test_build_demo_wires_named_endpoints(res):
    demo = ui.build_demo(res)
    names = {d.api_name for d in demo.fns.values() if d.api_name}
    assert {"generate", "regenerate", "stop", "set_threshold", "compare"} <= names


def test_long_documents_fill_the_prompt_and_fit_the_default_limits():
    from routerlab.core.base.documents import load_documents
    from routerlab.ui.layout import document_chosen

    docs = load_documents()
    assert len(docs) >= 2 and all(d.task and d.source and d.licence for d in docs)
    limits = ui.Limits()
    assert all(len(d.prompt) <= limits.max_prompt_chars for d in docs)
    res = tiny_resources()  # its limit (200 characters) leaves every document out: none is offered that would be refused
    assert res.documents == []
    res = ui.Resources(res.engine, ui.Limits(max_new_tokens=64), router_sets=res.router_sets, prompts=["Hello there"], documents=docs)
    assert [d.title for d in res.documents] == [d.title for d in docs]
    prompt, status = document_chosen(res, docs[0].title)
    assert prompt == docs[0].prompt and prompt.endswith(docs[0].task) and res.check_prompt(prompt) == prompt
    assert f"{len(prompt):,} characters" in status and "no long prompt has been read here yet" in status
    # once a long prompt was read here, the reading time is said from this server's own speed
    from test_plots import synthetic_trace

    read = synthetic_trace(n_prompt=400, n_gen=4)
    read.meta["prefill_seconds"] = 2.0  # 200 tokens/s
    res.note_reading(read)
    res.note_reading(synthetic_trace(n_prompt=20, n_gen=4))  # too short to time: left out
    tokens = len(res.engine.tokenizer(prompt)["input_ids"])
    _, status = document_chosen(res, docs[0].title)
    assert res.reading_rate() == 200 and f"takes about {round(tokens / 200)} s here" in status and "200 tokens/s" in status
    skip, status = document_chosen(res, "no such text")
    assert is_skip(skip) and "No long document" in status


def test_a_long_prompt_shows_how_far_its_reading_is_and_stop_ends_it(res, monkeypatch):
    """The prompt is read in chunks (core/decode/generation.py); the run is held after its first chunk (a Control that waits
    when it records it), so the frame that shows the progress is awaited, not raced."""
    import threading

    from routerlab.core.decode import engine as core_engine
    from routerlab.core.decode import generation

    monkeypatch.setattr(generation, "PREFILL_CHUNK", 16)
    reached, go = threading.Event(), threading.Event()

    class HeldControl(core_engine.Control):
        @property
        def prompt_read(self):
            return self._read

        @prompt_read.setter
        def prompt_read(self, value):
            self._read = value
            if 0 < value < self.prompt_tokens:
                reached.set()
                go.wait(60)

    monkeypatch.setattr(core_engine, "Control", HeldControl)
    session = ui.Session()
    prompt = "Hello there, " * 6  # 78 characters: 78 tokens of the character tokenizer, 5 chunks
    gen = explore(res, session, prompt=prompt, max_new=4, quality=False)
    try:
        outs = pull_until(gen, lambda out: isinstance(out[3], str) and "Reading the prompt" in out[3])
        assert reached.is_set()
        n = session.control.prompt_tokens
        assert n >= 70 and f"Reading the prompt: {session.control.prompt_read} of {n} tokens" in outs[-1][3]
        assert "Stopping" in ui.stop_run(session)  # Stop while the prompt is read
    finally:
        go.set()
    outs = run_all(gen)
    meta = session.trace.meta
    assert meta["stop_reason"] == "stopped" and meta["prefill_stopped_at"] < n and session.trace.generated_steps == []


def test_prefill_progress_counts_a_ladders_prompts():
    from types import SimpleNamespace

    from routerlab.ui.state.stream import prefill_progress

    run = lambda read, total=1800: SimpleNamespace(prompt_read=read, prompt_tokens=total)  # noqa: E731
    assert prefill_progress([run(512)]) == "reading the prompt: 512 of 1,800 tokens"
    assert prefill_progress([run(1800), run(300), run(0, 0)]) == "reading the prompt: 2,100 of 5,400 tokens (3 runs, one after another)"
    assert prefill_progress([run(1800)]) is None and prefill_progress([run(0, 0)]) is None


def test_a_typed_threshold_survives_choosing_a_router_set(tmp_path, res):
    """The visitor set 0.62: choosing a calibrated set keeps it and says the set's own; untouched, the set's applies."""
    from routerlab.tuning.checkpoint import save_routers

    save_routers(random_routers(res.engine.model), tmp_path / "tiny-attn", res.engine.model, threshold=0.4, kv_policy="drop")
    sets = ui.available_router_sets(tmp_path)
    shipped = ui.Resources(res.engine, res.limits, router_sets=sets, prompts=["Hi"])
    session = ui.Session()
    slider, radio, status = ui.router_set_chosen(shipped, sets[0].label, session, 0.62, 0.5)  # the page opened at 0.5
    assert "value" not in slider.constructor_args and radio.value == "drop" and "your threshold **0.62** stays" in status and "0.40" in status
    fresh = ui.Session()
    slider, _, status = ui.router_set_chosen(shipped, sets[0].label, fresh, 0.5, 0.5)  # untouched: the set's calibration
    assert slider.value == 0.4 and "calibrated 0.40" in status and fresh.threshold_auto == 0.4
    slider, _, status = ui.router_set_chosen(shipped, sets[0].label, fresh, 0.4, 0.5)  # still the app's value: applied again
    assert slider.value == 0.4


def test_a_link_opens_both_prompts_and_names_a_document_in_its_menu(res):
    from types import SimpleNamespace

    from routerlab.ui.tabs.links import View, open_link, view_link

    from urllib.parse import parse_qsl

    from routerlab.core.base.documents import load_documents

    res = ui.Resources(res.engine, ui.Limits(), router_sets=res.router_sets, prompts=["Hi"], documents=load_documents())
    doc, routers = res.documents[0], res.router_labels()[0]
    query = view_link(res, "Explore's own prompt", doc.prompt, 0.62, routers, "kv", 16, 0.0, True, "compare")[0].value
    out = open_link(res, View(prompt="Hi", routers=routers), SimpleNamespace(query_params=dict(parse_qsl(query.lstrip("?")))), ui.Session())
    assert out[2] == "Explore's own prompt" and out[3] == doc.prompt and out[5] == 0.62
    assert out[11] is None and out[12] == doc.title  # the Compare menu names its document; Explore's prompt is none


def test_after_a_run_alone_its_speed_is_measured_beside_the_full_model_and_after_a_shared_one_it_says_why_not(res):
    """The card after each run (ui/side_by_side.after_run): measured where the run had the server to itself; where it
    shared the room's steps, a note naming them and the button; for a stopped run, the button; the full model is the
    reference; nothing before any run."""
    from routerlab.ui.tabs.side_by_side import after_run

    session = ui.Session()
    run_all(explore(res, session, max_new=8))
    text, status = after_run(res, session, "Hello there", 0.5, RANDOM, "kv", res.default_model)
    assert re.search(r"\*\*\d+\.\d\d×\*\* the full model's decode speed, measured side by side on this machine now: 16 tokens", text), text
    assert is_skip(status), "the run's own status line stays"
    session.trace.meta["room"] = {"steps": 8, "shared_steps": 5, "largest_batch": 4}
    text, _ = after_run(res, session, "Hello there", 0.5, RANDOM, "kv", res.default_model)
    assert "up to 3 other generations" in text and "Press the button" in text
    session.trace.meta["stop_reason"] = "stopped"
    text, status = after_run(res, session, "Hello there", 0.5, RANDOM, "kv", res.default_model)
    assert "stopped run is not measured" in text and "press the button" in text and is_skip(status)
    assert all(is_skip(x) for x in after_run(res, ui.Session(), "Hello there", 0.5, RANDOM, "kv", res.default_model))  # no run yet
    text, _ = after_run(res, session, "Hello there", 0.5, ui.FULL, "kv", res.default_model)
    assert "full model" in text and "reference" in text


def test_measured_beside_the_full_model_side_by_side_and_explained(res):
    """The button's measurement: a ratio of two runs decoded one token each in turn, the estimate beside it, and a
    refusal (not a run) for the full model, which is the reference."""
    from routerlab.ui.tabs.side_by_side import measure_beside_full

    session = ui.Session()
    text, status = measure_beside_full(res, session, "Hello there", 0.5, RANDOM, "kv", res.default_model)
    assert status.startswith("✓") and re.search(r"\*\*\d+\.\d\d×\*\* the full model's decode speed, measured side by side", text), text
    assert "one token each in turn" in text and "Skip rate" in text
    skipped, refused = measure_beside_full(res, session, "Hello there", 0.5, ui.FULL, "kv", res.default_model)
    assert is_skip(skipped) and "reference" in refused
