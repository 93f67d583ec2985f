"""ui/state/fields.py: every field a visitor or a client sends, checked by type and range in one place, with a message that
names the field and what is allowed; the handlers and the page's components give the same answer for inputs of the wrong kind
(learning_rate "x", kd_weight "nan" / [1] / {"a": 1} / true, max_new_tokens 2.5, measure_quality "<img>",
Compare's threshold_1 true, -0.0); messages quote the visitor's own input, never a stripped version."""

from __future__ import annotations

import html
import io
import json
import math
import zipfile

import gradio as gr
import pytest

from routerlab.core.base.errors import RouterLabError, quote
from routerlab.ui.state import fields
from routerlab.ui.state.fields import FieldError

NOT_NUMBERS = ["0.5", "x", "nan", "", [1], {"a": 1}, True, False, None, math.nan, math.inf, -math.inf]


@pytest.mark.parametrize("bad", NOT_NUMBERS, ids=repr)
def test_a_number_field_refuses_every_non_number_naming_the_field_and_its_range(bad):
    with pytest.raises(FieldError) as caught:
        fields.LEARNING_RATE.check(bad)
    message = str(caught.value)
    assert message.startswith("Learning rate: ") and "Use a number from 1e-05 to 1." in message, message
    assert caught.value.label == "Learning rate" and caught.value.quoted == (quote(bad),)


def test_a_number_field_takes_ints_and_floats_in_range_and_makes_minus_zero_zero():
    threshold = fields.THRESHOLD
    assert threshold.check(0) == 0.0 and threshold.check(1) == 1.0 and threshold.check(0.25) == 0.25
    zero = threshold.check(-0.0)
    assert zero == 0.0 and math.copysign(1.0, zero) == 1.0 and f"{zero:.2f}" == "0.00"
    for bad in (-0.01, 1.01, 1e308, -1e308, 10**400):
        with pytest.raises(FieldError, match=r"^Threshold: .* is out of range\. Use a number from 0 to 1\."):
            threshold.check(bad)


def test_a_count_refuses_fractions_and_booleans_and_returns_an_int():
    steps = fields.MAX_STEPS
    assert steps.check(400) == 400 and isinstance(steps.check(400.0), int)
    for bad, said in ((2.5, "2.5 is not a whole number"), (True, "true is a yes/no value"), ("400", "'400' is text"),
                      (0, "0 is out of range"), (10_001, "10001 is out of range")):
        with pytest.raises(FieldError, match=f"^Most steps: {said}") as caught:
            steps.check(bad)
        assert "Use a whole number from 1 to 10,000." in str(caught.value)
    cap = fields.MAX_NEW_TOKENS.within(maximum=12)
    with pytest.raises(FieldError, match="from 1 to 12"):
        cap.check(13)


def test_an_optional_number_takes_a_blank():
    assert fields.RUNGS[1].check(None) is None
    with pytest.raises(FieldError, match="Learning rate: null is not a number"):
        fields.LEARNING_RATE.check(None)


@pytest.mark.parametrize("bad", ["<img>", "true", 1, 0, [True], {"a": 1}, math.nan], ids=repr)
def test_a_flag_takes_only_true_or_false(bad):
    with pytest.raises(FieldError, match=r"^Measure quality \(full-model pass\): .* is not true or false"):
        fields.MEASURE_QUALITY.check(bad)


def test_a_flag_left_out_is_its_default():
    assert fields.MEASURE_QUALITY.check(None) is True and fields.MEASURE_QUALITY.check(False) is False


@pytest.mark.parametrize("bad", ["fast", "", "KV", ["kv"], {"kv": 1}, 1, True, None], ids=repr)
def test_a_choice_takes_only_one_of_its_strings(bad):
    with pytest.raises(FieldError, match=r"^KV policy: .* is not one of the choices\. Choose one of: 'mask', 'kv', 'drop'\."):
        fields.KV_POLICY.check(bad)
    assert fields.KV_POLICY.check("drop") == "drop"


@pytest.mark.parametrize("bad", [12345, ["a", "list"], {"a": 1}, True, 2.5], ids=repr)
def test_a_text_field_takes_only_strings(bad):
    with pytest.raises(FieldError, match=r"^Prompt: .* is not text"):
        fields.PROMPT.check(bad)


def test_a_text_field_caps_the_length_and_reads_none_as_empty():
    short = fields.PROMPT.within(10)
    assert short.check("0123456789") == "0123456789" and short.check(None) == ""
    with pytest.raises(FieldError, match="Prompt: 11 characters; this server takes up to 10"):
        short.check("x" * 11)


def test_a_quote_is_the_clients_value_cut_to_a_readable_length():
    assert quote(True) == "true" and quote(None) == "null" and quote(math.nan) == "NaN" and quote(-math.inf) == "-Infinity"
    assert quote("<img src=/gradio_api/pxZIP>/../x") == "'<img src=/gradio_api/pxZIP>/../x'"
    long = quote("y" * 10_000)
    assert len(long) == 60 and long.endswith("…")


# -- the handlers: inputs of the wrong kind ---------------------------------------------------------------------------
def test_the_train_tab_refuses_the_issues_inputs_naming_each_field():
    from test_ui_train import _start, tiny_resources

    from routerlab import ui

    res = tiny_resources()
    session = ui.Session()
    cases = [("lr", "x", "Learning rate"), ("kd_weight", "nan", "Distillation weight"), ("lm_weight", "1", "LM-loss weight"),
             ("max_steps", "400", "Most steps"), ("kd_weight", [1], "Distillation weight"),
             ("kd_weight", {"a": 1}, "Distillation weight"), ("kd_weight", True, "Distillation weight"),
             ("max_steps", 2.5, "Most steps"), ("skip_pct", "15", "Skip target (% of routed cells)"),
             ("minutes", None, "Time budget (minutes)"), ("granularity", ["attention-token"], "What to route"),
             ("start_from", "<img>", "Routers start from"), ("source", 1, "Data"), ("pasted", 12345, "Your text")]
    for key, value, label in cases:
        status = html.unescape(_start(res, session, **{key: value})[4])
        assert status.startswith(f"⚠ {label}: {quote(value)} "), (key, value, status)
        assert session.job is None, (key, value)  # nothing started


def test_explore_and_compare_refuse_the_issues_inputs_naming_each_field():
    from test_ui import RANDOM, run_all

    from routerlab import ui

    res = _tiny()
    cases = [dict(max_new_tokens=2.5), dict(quality="<img>"), dict(quality=1), dict(threshold=True), dict(temperature="hot"),
             dict(threshold="0.5"), dict(kv_policy=["kv"]), dict(prompt=["a", "list"]), dict(router_label=[1]), dict(model_name={"a": 1})]
    labels = ["Max new tokens: 2.5", "Measure quality (full-model pass): '<img>'", "Measure quality (full-model pass): 1 ",
              "Threshold: true", "Temperature: 'hot'", "Threshold: '0.5'", "KV policy: ['kv']", "Prompt: ['a', 'list']",
              "Granularity (router set): [1]", "Model: {'a': 1}"]
    for case, label in zip(cases, labels):
        args = dict(prompt="Hi", threshold=0.5, router_label=RANDOM, kv_policy="kv", max_new_tokens=2, temperature=0.0,
                    model_name=None, session=ui.Session(), quality=True)
        args.update(case)
        outs = run_all(ui.explore_run(res, **args))
        assert len(outs) == 1 and html.unescape(outs[0][3]).startswith(f"⚠ {label}"), (case, outs[0][3])
    for thresholds, label in (([True, None, None], "Threshold 1: true"), ([0.3, "half", None], "Threshold 2: 'half'"),
                              ([None, None, math.nan], "Threshold 3: NaN"), ([None, None, [0.5]], "Threshold 3: [0.5]")):
        outs = run_all(ui.compare_run(res, "Hi", thresholds, RANDOM, "kv", 2, 0.0, None, ui.Session()))
        assert html.unescape(outs[0][-1]).startswith(f"⚠ {label}"), (thresholds, outs[0][-1])
    status = ui.threshold_moved(res, "0.5", ui.Session())[3]
    assert html.unescape(status).startswith("⚠ Threshold: '0.5' is text"), status


def test_the_quick_sweep_refuses_a_bad_kv_policy_naming_it():
    from test_ui import RANDOM

    from routerlab import ui

    plot, table, status = ui.tradeoff_sweep(_tiny(), "Hi", RANDOM, ["kv"], None)
    assert table is None and html.unescape(status).startswith("⚠ KV policy: ['kv'] is not one of the choices"), status


def _tiny():
    from test_ui import tiny_resources

    return tiny_resources()


# -- the page's components: the same fields, the same words ---------------------------------------------------------
def test_the_pages_components_refuse_with_their_fields_message():
    from routerlab.ui import layout

    lr = layout.field_number(fields.LEARNING_RATE, 0.01)
    assert lr.label == "Learning rate" and lr.minimum == 1e-5 and lr.maximum == 1.0 and lr.preprocess(0.5) == 0.5
    for bad in ("x", [1], {"a": 1}, True, math.nan):
        with pytest.raises(gr.Error) as caught:
            lr.preprocess(bad)
        assert html.unescape(caught.value.message).startswith(f"Learning rate: {quote(bad)} "), caught.value.message
        assert caught.value.print_exception is False  # expected bad input: no traceback in the server's log
    steps = layout.field_number(fields.MAX_STEPS, 400)
    assert steps.preprocess(400) == 400
    with pytest.raises(gr.Error, match="Most steps: 2.5 is not a whole number"):
        steps.preprocess(2.5)
    measure = layout.checked(layout.CheckedCheckbox(value=True, label=fields.MEASURE_QUALITY.label), fields.MEASURE_QUALITY)
    assert measure.preprocess(False) is False and measure.get_block_name() == "checkbox"
    with pytest.raises(gr.Error, match="is not true or false"):
        measure.preprocess("<img>")
    threshold = layout.field_slider(fields.THRESHOLD, value=0.5)
    zero = threshold.preprocess(-0.0)
    assert f"{zero:.2f}" == "0.00"
    prompt = layout.checked(layout.CheckedTextbox(label="Prompt"), fields.PROMPT.within(5))
    with pytest.raises(gr.Error, match="Prompt: 12345 is not text"):
        prompt.preprocess(12345)
    assert "field" not in lr.get_config()  # the field is the server's: nothing of it goes to the browser


# -- router.json typed strictly ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("threshold", [" 0.5\n", "0.5", True, None, [0.5]], ids=repr)
def test_a_router_json_threshold_must_be_a_json_number(tmp_path, threshold):
    from routerlab.tuning.checkpoint import CONFIG, read_config

    folder = _saved_folder(tmp_path)
    config = json.loads((folder / CONFIG).read_text())
    config["threshold"] = threshold
    (folder / CONFIG).write_text(json.dumps(config))
    with pytest.raises(RouterLabError, match="threshold .* is not a number"):
        read_config(folder)


def test_a_router_json_threshold_of_minus_zero_reads_as_zero(tmp_path):
    from routerlab.tuning.checkpoint import CONFIG, read_config

    folder = _saved_folder(tmp_path)
    config = json.loads((folder / CONFIG).read_text())
    config["threshold"] = -0.0
    (folder / CONFIG).write_text(json.dumps(config))
    value = read_config(folder)["threshold"]
    assert value == 0.0 and math.copysign(1.0, value) == 1.0


def test_a_router_json_layer_may_not_be_a_boolean(tmp_path):
    from routerlab.tuning.checkpoint import CONFIG, read_config

    folder = _saved_folder(tmp_path)
    config = json.loads((folder / CONFIG).read_text())
    config["layers"] = [True]
    (folder / CONFIG).write_text(json.dumps(config))
    with pytest.raises(RouterLabError, match="bad layers"):
        read_config(folder)


def _saved_folder(tmp_path):
    from routerlab.core.base.config import RoutingConfig
    from routerlab.core.model.models import tiny_model
    from routerlab.core.routing.router import RouterSet
    from routerlab.tuning.checkpoint import save_routers

    model = tiny_model("llama")
    return save_routers(RouterSet.zeros(model, RoutingConfig.from_granularity("attention-token", [1])), tmp_path / "set", model)


# -- messages quote the visitor's own input ---------------------------------------------------------------------------
def _zip(members: dict) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


@pytest.mark.parametrize("member", ["<img src=/gradio_api/pxZIP>/../x", "/tmp/router.json", "C:/x/router.json", "a\\..\\b"])
def test_an_upload_refusal_quotes_the_zip_members_own_name_escaped(tmp_path, member):
    """'<img src=/gradio_api/pxZIP>/../x' was shown as '<img src=pxZIP>x', and '/tmp/router.json' as 'router.json'."""
    from routerlab import ui
    from routerlab.ui.tabs.train_tab import upload_set

    res = _tiny()
    path = tmp_path / "set.zip"
    path.write_bytes(_zip({member: b"{}"}))
    status, menu, box = upload_set(res, ui.Session(), [str(path)])
    assert status.startswith("⚠") and "<" not in status, status  # escaped for the page: no element, no Markdown
    assert f"({quote(member)})" in html.unescape(status), status  # the visitor's own name, whole


def test_without_paths_keeps_the_quoted_input_and_cuts_the_servers_paths():
    from routerlab.ui.state.session import without_paths

    text = "The zip holds '/tmp/router.json'; see /srv/app/routerlab/x.py"
    assert without_paths(text, ("'/tmp/router.json'",)) == "The zip holds '/tmp/router.json'; see x.py"
    assert without_paths(text) == "The zip holds 'router.json'; see x.py"


def test_a_training_rows_keys_are_quoted_whole():
    """The keys of a pasted JSON line the app cannot read are the visitor's own: shown whole (escaped), no path cut."""
    from test_ui_train import _start, tiny_resources

    from routerlab import ui

    key = "<img src=/gradio_api/hostile-train>"
    text = "\n".join(json.dumps({key: f"row {k} of some text that is long enough"}) for k in range(8))
    status = _start(tiny_resources(), ui.Session(), text=text)[4]
    assert status.startswith("⚠") and "<img" not in status and f"keys: ['{key}']" in html.unescape(status), status
