"""Talking to the app the way visitors do, and reading what it answers.

Owns the prompts and settings visitors use, the `gradio_client` Clients (one per visitor, plus one
cached probe client per server for the hidden stats endpoint), `submit`, the waits on a streaming job,
reading a run's trace and checking its decisions, and the raw HTTP calls that `gradio_client` will not
make (a stream dropped mid-generation, a hand-written JSON body). Knows nothing about how the server
is built or started, nor what any test concludes.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

LONG_PROMPT = "Write a long story about a dragon who learns to read. Describe every chapter in detail."
PROMPTS = [
    "Explain in three sentences why the sky is blue.",
    "Write a short poem about a lighthouse keeper.",
    "List three tips for learning a new language.",
    "What is the capital of France, and why is it famous?",
    LONG_PROMPT,
]
THRESHOLDS = [0.3, 0.45, 0.5, 0.55, 0.6, 0.7, 0.4, 0.8]
POLICIES = ["kv", "drop", "mask"]


def client(url: str):
    """A visitor's page. Over plain HTTP (the harness's 127.0.0.1) nothing is verified: gradio_client builds an HTTP
    client per request, and one that loads the CA bundle costs ~28 ms, which 32 visitors pressing Generate at once
    took from the 2 cores the server shares with them (a browser on its own machine costs the server nothing)."""
    from gradio_client import Client

    return Client(url, verbose=False, download_files=False, ssl_verify=not url.startswith("http://"))


def open_page(c, url: str) -> None:
    """What a browser does after reading the page: run its load events (queue=False, over /run/predict) in the
    client's session. The first event of a session makes Gradio build that session's state (a copy of every
    component's config: milliseconds of the server's CPU), at page load in a browser; a client that skipped this
    would pay it at its first Generate, inside what a room bench measures."""
    import httpx

    base = url.rstrip("/") + (c.config.get("api_prefix") or "")
    for dep in c.config.get("dependencies", []):
        if any(target[1] == "load" for target in dep.get("targets", [])):
            body = {"data": [None] * len(dep["inputs"]), "fn_index": dep["id"], "session_hash": c.session_hash,
                    "event_data": None, "trigger_id": None}
            httpx.post(base + "/run/predict", json=body, timeout=60).raise_for_status()


_probes: dict[str, Any] = {}
_probe_lock = threading.Lock()


def probe(url: str) -> dict:
    """The watched server's counters, RSS and limits (one cached client per server: probing must stay cheap)."""
    with _probe_lock:
        if url not in _probes:
            _probes[url] = client(url)
        return _probes[url].predict(api_name="/loadtest_stats")


def forget(url: str) -> None:
    with _probe_lock:
        c = _probes.pop(url, None)
    if c is not None:
        c.close()


def submit(c, prompt, threshold=0.5, router=None, policy="kv", max_new=8, temperature=0.0, model=None, api="/generate",
           quality=None):
    """A streaming call; `quality` (/generate's Measure-quality switch, its last parameter) is sent only when
    given: left out, the app's default (on) applies, as for any caller written before the switch existed."""
    from routerlab import ui

    args = (prompt, threshold, router or ui.UNTRAINED, policy, max_new, temperature, model) + (() if quality is None else (quality,))
    return c.submit(*args, api_name=api)


def tokens_shown(job) -> int:
    """Generated tokens in the last streamed text (one span per token; the prompt is not shown)."""
    for out in reversed(job.outputs()):
        if isinstance(out, (list, tuple)) and out and isinstance(out[0], str) and "rl-text" in out[0]:
            return out[0].split("<div class='rl-legend'>")[0].count("class='rl-tok")
    return 0


def wait_tokens(job, n: int, timeout: float) -> float:
    """Wait until `n` generated tokens were streamed; returns the moment (perf_counter)."""
    end = time.time() + timeout
    while tokens_shown(job) < n:
        if job.done():
            raise AssertionError("the run ended before the driver could act on it")
        if time.time() > end:
            raise AssertionError(f"{n} tokens were not streamed within {timeout:.0f} s")
        time.sleep(0.02)
    return time.perf_counter()


def wait_done(job, timeout: float) -> float:
    end = time.time() + timeout
    while not job.done():
        if time.time() > end:
            raise AssertionError(f"the run did not end within {timeout:.0f} s")
        time.sleep(0.02)
    return time.perf_counter()


def wait_until(fn, timeout: float, every: float = 0.02):
    end = time.perf_counter() + timeout
    while time.perf_counter() < end:
        value = fn()
        if value:
            return value
        time.sleep(every)
    return fn()


def trace_of(result):
    from routerlab.core.records.trace import Trace

    update = result[4]
    value = update.get("value", update) if isinstance(update, dict) else update
    path = value.get("path") if isinstance(value, dict) else value
    return Trace.from_json(Path(path).read_text())


def decision_errors(trace, threshold: float) -> int:
    """Routed cells whose decision is not `score >= threshold`, or steps recorded under another threshold."""
    bad = 0
    for s in trace.steps:
        if s.threshold != threshold:
            bad += 1
        for sc, e in zip(s.scores, s.executed):
            if sc is not None and e != (sc >= threshold):
                bad += 1
    return bad


# -- raw HTTP (what gradio_client does not do) ----------------------------------------------------
def _drop_stream(url: str, fn_index: int, data: list, after_tokens: int, timeout: float) -> float:
    """A visitor that closes its tab mid-stream: raw queue/join + queue/data SSE, then the connection is dropped."""
    import httpx

    session = uuid.uuid4().hex[:11]
    base = url.rstrip("/") + "/gradio_api/"
    r = httpx.post(base + "queue/join", json={"data": data, "fn_index": fn_index, "session_hash": session,
                                              "event_data": None, "trigger_id": None}, timeout=30)
    r.raise_for_status()
    end = time.time() + timeout
    with httpx.stream("GET", base + "queue/data", params={"session_hash": session}, timeout=timeout) as stream:
        for line in stream.iter_lines():
            if time.time() > end:
                raise AssertionError("no tokens streamed before the deadline")
            if not line.startswith("data:"):
                continue
            msg = json.loads(line[5:])
            if msg.get("msg") == "process_completed":
                raise AssertionError("the run ended before the tab was closed")
            out = (msg.get("output") or {}).get("data") or []
            if msg.get("msg") == "process_generating" and out and isinstance(out[0], list):
                # sse diffs: [["replace", [], html]] for the text output
                html = next((op[2] for op in out[0] if isinstance(op, list) and len(op) == 3 and isinstance(op[2], str)), "")
                if html.split("<div class='rl-legend'>")[0].count("class='rl-tok") >= after_tokens:
                    return time.perf_counter()  # leaving the with-block closes the connection
            elif msg.get("msg") == "process_generating" and out and isinstance(out[0], str):
                if out[0].split("<div class='rl-legend'>")[0].count("class='rl-tok") >= after_tokens:
                    return time.perf_counter()
    raise AssertionError("the stream ended unexpectedly")


def _fn_index(url: str, api_name: str) -> int:
    c = client(url)
    try:
        deps = c.config["dependencies"]
        i = next(i for i, d in enumerate(deps) if d.get("api_name") == api_name)
        return deps[i].get("id", i)
    finally:
        c.close()


def _raw_call(url: str, fn_index: int, data_json: str, timeout: float, session: str | None = None) -> str:
    """POST queue/join with a hand-written JSON body, read queue/data to the end; returns what came back, as text.
    `session`: the session hash to call as (a new one by default)."""
    import httpx

    session = session or uuid.uuid4().hex[:11]
    base = url.rstrip("/") + "/gradio_api/"
    body = '{"data": %s, "fn_index": %d, "session_hash": "%s", "event_data": null, "trigger_id": null}' % (data_json, fn_index, session)
    r = httpx.post(base + "queue/join", content=body.encode("utf-8", "surrogatepass"),
                   headers={"content-type": "application/json"}, timeout=30)
    if r.status_code != 200:
        return f"HTTP {r.status_code}: {r.text[:200]}"
    said: list[str] = []

    def strings(obj):
        if isinstance(obj, str):
            yield obj
        elif isinstance(obj, dict):
            for v in obj.values():
                yield from strings(v)
        elif isinstance(obj, list):
            for v in obj:
                yield from strings(v)

    with httpx.stream("GET", base + "queue/data", params={"session_hash": session}, timeout=timeout) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:"):
                msg = json.loads(line[5:])
                out = msg.get("output") or {}
                if out.get("error") is not None or (msg.get("msg") == "process_completed" and not msg.get("success", True)):
                    said.append(f"error: {out.get('error')}")
                said += [t for t in strings(out) if t.startswith(("⚠", "✓", "▶ Training"))]  # ▶ Training: /train's "started"
                if msg.get("msg") == "process_completed":
                    return said[-1] if said else json.dumps(out)[:300]
    return "stream ended without a result"
