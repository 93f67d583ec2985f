"""Bad input through the API, and more requests than the server accepts.

Owns the bad-input cases for `/generate`, `/compare`, `/set_threshold` and `/train` (through `gradio_client`,
and raw HTTP for what it refuses to send), the rule for a clear answer (a message that names the problem, and for a
refused field the field's label as the page shows it (ui/state/fields.py); no traceback, no server path), and
`queue_cap_test`. The inputs a visitor gives outside the API (a link's query,
an uploaded router-set zip) are tested in the browser tests. Knows nothing about how the server is started, the
other tests, or the verdict.
"""

from __future__ import annotations

import html
import json
import re
import tempfile
import time
import uuid
from pathlib import Path

from routerlab.bench.load.driver import PROMPTS, _fn_index, _raw_call, client, probe, submit


def bad_input_cases(default_model: str, cap: int, max_chars: int) -> list[tuple]:
    """(name, endpoint, arguments[, what the answer must name]) for /generate, /compare and /set_threshold: a refused
    field's answer names it by the label the visitor sees (ui/state/fields.py), e.g. "Learning rate"."""
    from routerlab import ui

    ok = [PROMPTS[0], 0.5, ui.UNTRAINED, "kv", 2, 0.0, default_model]
    # /compare: prompt, the ladder's three thresholds (None: no column), then as /generate from the router set on
    ok_compare = [PROMPTS[0], 0.5, None, None, ui.UNTRAINED, "kv", 2, 0.0, default_model]

    def gen(i, v, name, api="/generate", names=None):
        args = list(ok)
        args[i] = v
        if api == "/compare":  # the same argument, where /compare takes it
            args = list(ok_compare)
            args[i if i < 2 else i + 2] = v
        return (name, api, args) if names is None else (name, api, args, names)

    nan, inf = float("nan"), float("inf")
    return [
        gen(0, "x" * 100_000, "prompt of 100,000 characters", names="Prompt"),
        gen(0, "x" * (max_chars + 1), "prompt one character over the cap", names="Prompt"),
        gen(0, "", "empty prompt"),
        gen(0, "   \n\t ", "whitespace prompt"),
        gen(0, None, "prompt None"),
        gen(0, 12345, "prompt a number", names="Prompt"),
        gen(0, ["a", "list"], "prompt a list", names="Prompt"),
        gen(0, "\x00\x01\x02\x1b[31mred\x07\x7f\u202e\ufeff\u200b", "control characters"),
        gen(0, "🐉🔥 Write about a 🐉 in 中文 and עברית 👩‍👩‍👧‍👦", "emoji and scripts"),
        gen(0, "\ud800 lone surrogate \udfff", "lone surrogates"),
        gen(0, "<script>alert(1)</script><img src=x onerror=alert(2)>", "html in the prompt"),
        gen(1, "abc", "threshold a word", names="Threshold"),
        gen(1, None, "threshold None", names="Threshold"),
        gen(1, nan, "threshold NaN"),
        gen(1, inf, "threshold inf"),
        gen(1, -1e308, "threshold -1e308", names="Threshold"),
        gen(1, 1e308, "threshold 1e308", names="Threshold"),
        gen(1, [0.5], "threshold a list", names="Threshold"),
        gen(2, "no-such-routers", "unknown granularity", names="Granularity (router set)"),
        gen(2, None, "granularity None"),  # the full model
        gen(2, "../../../etc/passwd", "granularity a path", names="Granularity (router set)"),
        gen(3, "fast", "unknown kv policy", names="KV policy"),
        gen(3, None, "kv policy None", names="KV policy"),
        gen(4, 10**9, "max new tokens 1e9", names="Max new tokens"),
        gen(4, cap + 1, "max new tokens cap+1", names="Max new tokens"),
        gen(4, 0, "max new tokens 0", names="Max new tokens"),
        gen(4, -5, "max new tokens negative", names="Max new tokens"),
        gen(4, 2.5, "max new tokens 2.5", names="Max new tokens"),
        gen(4, nan, "max new tokens NaN"),
        gen(4, "many", "max new tokens a word", names="Max new tokens"),
        gen(4, None, "max new tokens None", names="Max new tokens"),
        gen(5, nan, "temperature NaN"),
        gen(5, 1e300, "temperature 1e300", names="Temperature"),
        gen(5, -1, "temperature negative", names="Temperature"),
        gen(5, "hot", "temperature a word", names="Temperature"),
        gen(6, "gpt2", "model not allowed", names="Model"),
        gen(6, "/etc", "model a local path", names="Model"),
        gen(6, "../../secrets", "model a relative path", names="Model"),
        gen(6, 42, "model a number", names="Model"),
        gen(5, 1e-45, "temperature 1e-45"),  # sampling divided by it: `probability tensor contains either inf, nan`
        gen(0, "x" * 100_000, "compare: prompt of 100,000 characters", "/compare", names="Prompt"),
        gen(4, 10**9, "compare: max new tokens 1e9", "/compare", names="Max new tokens"),
        gen(6, "gpt2", "compare: model not allowed", "/compare", names="Model"),
        gen(1, nan, "compare: threshold NaN", "/compare"),
        gen(1, "0.3, 0.5, 0.7", "compare: the thresholds as one string", "/compare"),  # the form the docs allow
        gen(1, "half", "compare: a threshold a word", "/compare", names="Threshold"),
        gen(1, 1.5, "compare: threshold 1.5", "/compare", names="Threshold"),
        gen(5, 1e-45, "compare: temperature 1e-45", "/compare"),
        gen(0, "\ud800 lone surrogate \udfff", "compare: lone surrogates", "/compare"),
        gen(0, "<script>alert(1)</script><img src=x onerror=alert(2)><b style=position:fixed;inset:0>cover</b>",
            "compare: html in the prompt", "/compare"),
        ("set_threshold NaN", "/set_threshold", [nan]),  # gradio_client refuses to send NaN: the raw cases send it
        ("set_threshold a word", "/set_threshold", ["abc"], "Threshold"),
        ("set_threshold 1e308", "/set_threshold", [1e308], "Threshold"),
        ("set_threshold None", "/set_threshold", [None], "Threshold"),
        # a boolean is not a number, a string of a number is not a number, -0.0 is 0.00, a flag is true or false
        gen(1, True, "threshold true", names="Threshold"),
        gen(1, "0.5", "threshold the string '0.5'", names="Threshold"),
        gen(5, True, "temperature true", names="Temperature"),
        gen(4, True, "max new tokens true", names="Max new tokens"),
        ("measure quality '<img>'", "/generate", ok + ["<img>"], "Measure quality"),
        ("measure quality 1", "/generate", ok + [1], "Measure quality"),
        ("measure quality a list", "/generate", ok + [[True]], "Measure quality"),
        gen(1, True, "compare: threshold_1 true", "/compare", names="Threshold 1"),
        gen(4, 2.5, "compare: max new tokens 2.5", "/compare", names="Max new tokens"),
        ("compare: threshold_2 an object", "/compare", ok_compare[:2] + [{"a": 1}] + ok_compare[3:], "Threshold 2"),
        ("set_threshold true", "/set_threshold", [True], "Threshold"),
        ("set_threshold -0.0", "/set_threshold", [-0.0], "0.00"),  # shown as 0.00: a "-0.00" is never clear (_clear)
    ]


NESTED = "[" * 5000 + "]" * 5000  # deeper than Python's json can read: RecursionError, unless it is caught
# Enough paragraphs to train on (a job needs 6 examples, one in five held out), so each case tests its own input.
PARAGRAPHS = [f"Paragraph {k}: a sentence or two the routers could be trained on, about nothing much." for k in range(8)]


def train_cases(folder: Path) -> list[tuple]:
    """(name, "/train", arguments[, what the answer must name]) for the training's bad input a visitor can paste,
    upload or send: each runs in a session of its own (a session trains one set at a time), with a half-minute budget,
    stopped if it starts."""
    from routerlab.core.base.config import GRANULARITIES
    from routerlab.tuning.job import JobSettings
    from routerlab.ui.tabs.train_tab import OWN, STARTS

    nested = folder / "nested.jsonl"
    nested.write_text(json.dumps({"prompt": "hi", "response": "there"}) + "\n" + '{"messages": ' + NESTED + "}\n")
    # /train: granularity, skip target (%), minutes, learning rate, distillation and LM weights, most steps, start, data source, text, file
    ok = [GRANULARITIES[0], 15, 0.5, JobSettings.lr, JobSettings.kd_weight, JobSettings.lm_weight, JobSettings.max_steps,
          next(iter(STARTS)), OWN, "\n\n".join(PARAGRAPHS), None]

    def train(i, v, name, names=None):
        args = list(ok)
        args[i] = v
        return (name, "/train", args) if names is None else (name, "/train", args, names)

    return [
        train(9, '{"messages": ' + NESTED + "}", "train: pasted JSON nested 5,000 deep"),
        train(10, str(nested), "train: a .jsonl file with a line nested 5,000 deep"),
        train(9, "\n\n".join(["<img src=/gradio_api/px><b style=position:fixed;inset:0>cover</b> <a href=//x>link</a>", *PARAGRAPHS]),
              "train: html in the pasted text"),
        train(9, "   \n\n  ", "train: pasted text only blanks"),
        train(4, -1.0, "train: distillation weight negative", "Distillation weight"),
        train(2, 1e9, "train: minutes 1e9", "Time budget"),
        # each ended in {"error": null} for the client and a TypeError traceback in the log, or started a training
        train(3, "x", "train: learning rate 'x'", "Learning rate"),
        train(4, "nan", "train: distillation weight 'nan'", "Distillation weight"),
        train(5, "1", "train: LM-loss weight '1'", "LM-loss weight"),
        train(6, "400", "train: most steps '400'", "Most steps"),
        train(4, [1], "train: distillation weight [1]", "Distillation weight"),
        train(4, {"a": 1}, "train: distillation weight {'a': 1}", "Distillation weight"),
        train(4, True, "train: distillation weight true", "Distillation weight"),
        train(6, 2.5, "train: most steps 2.5", "Most steps"),
        train(1, "15", "train: skip target '15'", "Skip target"),
        train(9, 12345, "train: pasted text a number", "Your text"),
    ]


def _message(result, api: str) -> str:
    if api == "/generate":
        return str(result[3])
    if api == "/train":
        return str(result[4])  # progress, curves, layer map, result, status, timer, start button
    if api == "/compare":
        return str(result[-1])  # the status line, after the ladder's columns, stats and heatmap
    if api == "/set_threshold":
        return str(result[3])
    return str(result)


UNCLEAR = ("has not enabled verbose error reporting", "Traceback", "Internal Server Error")
NEGATIVE_ZERO = re.compile(r"-0\.0+(?![0-9])")  # "-0.00": a value -0.0 shown as it came, not as the number it is
# Where the server keeps its files: a message naming one shows the visitor the server's layout.
SERVER_PATHS = (tempfile.gettempdir().rstrip("/") + "/", str(Path(__file__).resolve().parents[4]) + "/")


def _clear(msg: str, kind: str, may_start: bool = False, names: str | None = None) -> bool:
    """A message that names the problem: a status (⚠, ◐, ✓; with `may_start`, /train's ▶ for a training that started)
    or an error, no traceback or Gradio's generic line, no server path; with `names`, one that names it (the field's
    label, as the page shows it: the message is escaped for the page)."""
    return (len(msg) > 12 and not any(u in msg for u in UNCLEAR) and not any(p in msg for p in SERVER_PATHS)
            and not NEGATIVE_ZERO.search(msg) and (kind == "error" or msg.startswith(("⚠", "◐", "✓", *(("▶ Training",) if may_start else ()))))
            and (names is None or names in html.unescape(msg)))


def bad_input_test(url: str, timeout: float = 300.0, log=print) -> dict:
    """Every bad input gets a clear message (a ⚠ status or an error naming the problem); the server keeps serving.

    One raw case, a request with too few arguments, is malformed at the protocol level: Gradio refuses it
    before any RouterLab code runs, with its generic error (it is counted as `refused`, not as clear).
    """
    from routerlab import ui

    info = probe(url)
    cases = bad_input_cases(info["default_model"], info["limits"]["max_new_tokens"], info["limits"]["max_prompt_chars"])
    rows = []
    c = client(url)
    for name, api, args, *names in cases:
        names = names[0] if names else None
        t0 = time.perf_counter()
        try:
            result = c.predict(*args, api_name=api)
            msg, kind = _message(result, api), "status"
        except Exception as err:
            msg, kind = f"{type(err).__name__}: {err}", "error"
        generated = msg.startswith("✓")
        clear = _clear(msg, kind, names=names)
        rows.append(dict(case=name, endpoint=api, outcome="generated" if generated else kind, message=msg[:220],
                         names=names, clear=clear, seconds=round(time.perf_counter() - t0, 2)))
        if log:
            log(f"[bad input] {name}: {'ok ' if clear else 'UNCLEAR '}{msg[:140]!r}")
    rows += _train_rows(url, log)
    # What gradio_client refuses to send, a raw HTTP client can: NaN/Infinity literals, lone surrogates, wrong arity.
    fn_index = _fn_index(url, "generate")
    ok = [PROMPTS[0], 0.5, "FULL", "kv", 2, 0.0, info["default_model"], None, True]  # None: the session state; True: measure quality
    ok[2] = next(l for l in info["router_labels"] if "untrained" in l)
    raw_cases = [
        ("raw: threshold NaN", json.dumps(ok).replace("0.5", "NaN", 1)),
        ("raw: max new tokens Infinity", json.dumps(ok[:4] + ["__INF__"] + ok[5:]).replace('"__INF__"', "Infinity")),
        ("raw: temperature -Infinity", json.dumps(ok[:5] + ["__INF__"] + ok[6:]).replace('"__INF__"', "-Infinity")),
        ("raw: lone surrogate prompt", json.dumps(["\ud800 hello \udfff"] + ok[1:])),
        ("raw: too few arguments", json.dumps(ok[:2])),
        ("raw: data is a string", json.dumps("hello")),
        ("raw: a 1 MB prompt", json.dumps(["y" * 1_000_000] + ok[1:])),
    ]
    # (name, endpoint index, body, whether a training that starts is an answer, a message that misreads the input,
    # the field the answer must name)
    field_of = {"threshold": "Threshold", "max new tokens": "Max new tokens", "temperature": "Temperature", "prompt": "Prompt"}
    raw_cases = [(name, fn_index, data, False, None, next((label for key, label in field_of.items() if key in name and "surrogate" not in name), None))
                 for name, data in raw_cases]
    # /train: what gradio_client cannot send (NaN, a lone surrogate in the pasted text); None: the session state
    train_index = _fn_index(url, "train")
    from routerlab.tuning.job import JobSettings
    from routerlab.ui.tabs.train_tab import OWN, STARTS

    train_ok = [None, "attention-token", 15, 0.5, JobSettings.lr, JobSettings.kd_weight, JobSettings.lm_weight, JobSettings.max_steps,
                next(iter(STARTS)), OWN, "\n\n".join(PARAGRAPHS), None]
    nan_kd = list(train_ok)
    nan_kd[5] = "__NAN__"
    raw_cases += [
        ("raw: train distillation weight NaN", train_index, json.dumps(nan_kd).replace('"__NAN__"', "NaN"), False, None, "Distillation weight"),
        ("raw: train text with a lone surrogate", train_index,  # the text may be cleaned and trained on, or refused as text
         json.dumps(train_ok[:10] + ["\n\n".join(["A lone \ud800 surrogate.", *PARAGRAPHS])] + train_ok[11:]), True, "not a number", None),
        # Compare's prompt, which gradio_client cannot send either: prompt, three thresholds, router set, KV policy,
        # max new tokens, temperature, model, the session state
        ("raw: compare lone surrogate prompt", _fn_index(url, "compare"),
         json.dumps(["\ud800 hello \udfff", 0.5, None, None, ok[2], "kv", 2, 0.0, info["default_model"], None]), False, None, None),
    ]
    # a file field given anything but an uploaded file, and the page's example list given an index that is not one
    example_index = _fn_index(url, "load_example")
    file_label = "… or a .txt / .jsonl file"
    raw_cases += [(f"raw: train file field {v!r}", train_index, json.dumps(train_ok[:11] + [v]), False, None, file_label)
                  for v in (12345, "not-a-file", [1], {"a": 1})]
    raw_cases += [(f"raw: load_example index {v!r}", example_index, json.dumps([v]), False, None, "Example prompts")
                  for v in (-1, 10_000, "0", 1.5)]
    for name, index, data, may_start, misread, names in raw_cases:
        t0 = time.perf_counter()
        session = uuid.uuid4().hex[:11]
        try:
            msg, kind = _raw_call(url, index, data, timeout, session=session), "raw"
            if msg.startswith("▶ Training"):  # it started (an answer only where the input may be trained on): stop it
                _stop_training(url, session)
        except Exception as err:
            msg, kind = f"{type(err).__name__}: {err}", "error"
        generated = "✓ Done" in msg
        if name == "raw: too few arguments":
            rows.append(dict(case=name, endpoint="/generate (raw HTTP)", outcome="refused by Gradio", message=msg[:220],
                             names=None, clear=True, seconds=round(time.perf_counter() - t0, 2)))
            continue
        started = may_start and msg.startswith("▶ Training")
        refused = msg.startswith("error: ") and len(msg) > 20  # a field's refusal (Gradio's {"error": null} reads "error: None")
        clear = generated or (msg.startswith("⚠") or started or refused or "not a number" in msg or msg.startswith("HTTP 422")) and not any(
            u in msg for u in UNCLEAR) and not any(p in msg for p in SERVER_PATHS) and not (misread and misread in msg) and (
            names is None or names in html.unescape(msg))
        endpoint = ("/train (raw HTTP)" if index == train_index else "/load_example (raw HTTP)" if index == example_index
                    else "/compare (raw HTTP)" if "compare" in name else "/generate (raw HTTP)")
        rows.append(dict(case=name, endpoint=endpoint, outcome="generated" if generated else kind,
                         message=msg[:220], names=names, clear=clear, seconds=round(time.perf_counter() - t0, 2)))
        if log:
            log(f"[bad input] {name}: {'ok ' if clear else 'UNCLEAR '}{msg[:140]!r}")
    health = c.predict(PROMPTS[0], 0.5, ui.FULL, "kv", 2, 0.0, info["default_model"], api_name="/generate")[3]
    c.close()
    after = probe(url)
    return {
        "cases": len(rows),
        "clear": sum(r["clear"] for r in rows),
        "unclear": [r for r in rows if not r["clear"]],
        "rows": rows,
        "serving_after": health.startswith("✓"),
        "server_after": {k: after[k] for k in ("live", "decoders")},
    }


def _stop_training(url: str, session: str) -> None:
    """/stop_training as the session that started a training through raw HTTP (a client reads its hash per call)."""
    c = client(url)
    try:
        c.session_hash = session
        c.predict(api_name="/stop_training")
    finally:
        c.close()


def _train_rows(url: str, log=print) -> list[dict]:
    """The /train cases, each in a session of its own; a training that starts is stopped at once (it is not what is
    tested, and the server trains one set at a time)."""
    from gradio_client import handle_file

    rows = []
    with tempfile.TemporaryDirectory(prefix="routerlab-bad-input-") as folder:
        for name, api, args, *names in train_cases(Path(folder)):
            names = names[0] if names else None
            args = [handle_file(a) if isinstance(a, str) and a.startswith(folder) else a for a in args]
            c = client(url)
            t0 = time.perf_counter()
            try:
                msg, kind = _message(c.predict(*args, api_name=api), api), "status"
                if msg.startswith("▶"):
                    c.predict(api_name="/stop_training")
            except Exception as err:
                msg, kind = f"{type(err).__name__}: {err}", "error"
            finally:
                c.close()
            clear = _clear(msg, kind, may_start=names is None, names=names)  # a refused field never starts a training
            rows.append(dict(case=name, endpoint=api, outcome="training started" if msg.startswith("▶") else kind, message=msg[:220],
                             names=names, clear=clear, seconds=round(time.perf_counter() - t0, 2)))
            if log:
                log(f"[bad input] {name}: {'ok ' if clear else 'UNCLEAR '}{msg[:140]!r}")
    return rows


def queue_cap_test(url: str, queue_size: int, timeout: float = 300.0) -> dict:
    """More requests than slots + queue: the extra ones are refused with a message, the rest finish."""
    info = probe(url)
    n = info["limits"]["concurrency"] + queue_size + 1
    clients = [client(url) for _ in range(n)]
    jobs = [submit(c, PROMPTS[0], max_new=1) for c in clients]
    outcomes = []
    for j in jobs:
        try:
            outcomes.append(("ok", j.result(timeout=timeout)[3][:80]))
        except Exception as err:
            outcomes.append(("refused", f"{type(err).__name__}: {err}"[:160]))
    for c in clients:
        c.close()
    refused = [m for k, m in outcomes if k == "refused"]
    return {"submitted": n, "finished": sum(k == "ok" for k, _ in outcomes), "refused": len(refused),
            "refusal_message": refused[0] if refused else None}
