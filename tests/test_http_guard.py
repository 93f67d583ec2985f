"""The page guard (routerlab/ui/web/http_guard.py) in front of a real Gradio server: a body over the cap is refused
without being held, a file field naming a URL is refused before Gradio would fetch it, every answer carries the
framing headers, plotly.js is served for the page's exports; and the exports' ledger (routerlab/ui/state/exports.py)
keeps a session's last runs and a budget in all.

A tiny Blocks (a text box and a File box, each with an API route) stands in for the app, with the guards the app
passes (`ui.launch_options`' middleware).
"""

from __future__ import annotations

import json
import os

import gradio as gr
import httpx
import pytest

from test_uploads import free_port

from routerlab.ui.state import uploads
from routerlab.ui.state.exports import ExportLedger
from routerlab.ui.web import http_guard
from routerlab.ui.web.http_guard import PLOTLY_ROUTE, url_in_file_field

MB = 2**20
LIMIT = 2 * MB


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    saved = os.environ.get("GRADIO_TEMP_DIR")
    os.environ["GRADIO_TEMP_DIR"] = str(tmp_path_factory.mktemp("gradio"))
    with gr.Blocks() as demo:
        box, file, out = gr.Textbox(), gr.File(type="filepath"), gr.Textbox()
        gr.Button().click(lambda t: f"{len(t)} characters", box, out, api_name="echo")
        gr.Button().click(lambda f: f"file {os.path.basename(f)}" if f else "none", file, out, api_name="file")
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                            app_kwargs={"middleware": [http_guard.middleware(LIMIT), uploads.middleware(uploads.UploadBudget())]})
    yield url.rstrip("/")
    demo.close()
    if saved is None:
        os.environ.pop("GRADIO_TEMP_DIR", None)
    else:
        os.environ["GRADIO_TEMP_DIR"] = saved


def call(url: str, route: str, data: list, **kwargs) -> httpx.Response:
    return httpx.post(f"{url}/gradio_api/call/{route}", json={"data": data}, timeout=60, **kwargs)


def result(url: str, route: str, answer: httpx.Response) -> str:
    event = answer.json()["event_id"]
    with httpx.stream("GET", f"{url}/gradio_api/call/{route}/{event}", timeout=60) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data:")]
    return json.loads(lines[-1][5:])[0]


def test_a_body_under_the_cap_is_served_and_one_over_it_refused(server):
    """(That the server holds no refused body is measured on a server of its own: `bench load`'s flood phase.)"""
    assert result(server, "echo", call(server, "echo", ["x" * 1000])) == "1000 characters"
    big = json.dumps({"data": ["x" * (50 * MB)]}).encode()
    refused = httpx.post(f"{server}/gradio_api/queue/join", content=big, headers={"content-type": "application/json"}, timeout=120)
    assert refused.status_code == 413 and "50.0 MB" in refused.json()["detail"] and "2 MB" in refused.json()["detail"]
    del big

    def chunks():  # no Content-Length: the cap counts what arrives
        for _ in range(8):
            yield b"x" * MB
    chunked = httpx.post(f"{server}/gradio_api/queue/join", content=chunks(), timeout=120)
    assert chunked.status_code == 413
    assert result(server, "echo", call(server, "echo", ["still serving"])) == "13 characters"


def test_a_file_field_naming_a_url_is_refused_and_an_upload_is_taken(server, tmp_path):
    remote = {"path": "https://example.org/big.bin", "meta": {"_type": "gradio.FileData"}}
    refused = call(server, "file", [remote])
    assert refused.status_code == 400 and "not a URL" in refused.json()["detail"]
    nested = httpx.post(f"{server}/gradio_api/queue/join", timeout=60,
                        json={"data": [{"x": [{**remote, "path": "http://10.0.0.1/a"}]}], "fn_index": 1, "session_hash": "abc"})
    assert nested.status_code == 400
    (tmp_path / "a.txt").write_text("hello")
    with open(tmp_path / "a.txt", "rb") as f:
        stored = httpx.post(f"{server}/gradio_api/upload", files=[("files", ("a.txt", f))], timeout=60).json()[0]
    taken = call(server, "file", [{"path": stored, "meta": {"_type": "gradio.FileData"}}])
    assert taken.status_code == 200 and result(server, "file", taken) == "file a.txt"


def test_every_answer_says_who_may_frame_the_page_and_plotly_js_is_served(server):
    page = httpx.get(server + "/", timeout=60)
    assert page.headers["x-frame-options"] == "SAMEORIGIN"
    assert page.headers["content-security-policy"] == "frame-ancestors 'self'"
    assert page.headers["x-content-type-options"] == "nosniff"
    js = httpx.get(server + PLOTLY_ROUTE, timeout=60)
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert js.content == http_guard.plotly_js() and len(js.content) > MB and b"plotly.js" in js.content[:1000]


def test_framing_headers_for_listed_origins():
    assert dict(http_guard.frame_headers(("https://a.example", "https://b.example")))[b"content-security-policy"] == \
        b"frame-ancestors 'self' https://a.example https://b.example"
    assert b"x-frame-options" not in dict(http_guard.frame_headers(("https://a.example",)))  # it cannot name another origin
    assert b"content-security-policy" not in dict(http_guard.frame_headers(("*",)))


def test_url_in_file_field_finds_a_url_anywhere_and_only_in_a_file_field():
    meta = {"_type": "gradio.FileData"}
    assert url_in_file_field({"data": [1, {"a": [{"path": "s3://bucket/x", "meta": meta}]}]}) == "s3://bucket/x"
    assert url_in_file_field({"data": [{"path": "/tmp/gradio/abc/a.txt", "meta": meta}]}) is None
    assert url_in_file_field({"data": ["https://example.org", {"path": "https://x", "meta": {"_type": "other"}}]}) is None


def test_the_body_limit_takes_a_training_text_at_its_cap():
    assert http_guard.body_limit(1_000_000) == 4_000_000 + MB


def test_the_export_ledger_keeps_a_sessions_last_runs_and_a_budget_in_all(tmp_path):
    ledger = ExportLedger(total_bytes=10_000, per_session=2)
    a, b = object(), object()

    def run(owner, name, size):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "trace.json").write_bytes(b"x" * size)
        return folder, ledger.add(folder, owner)
    first, _ = run(a, "a1", 1000)
    run(a, "a2", 1000)
    third, gone = run(a, "a3", 1000)
    assert gone == [first] and not first.exists() and third.exists()  # a session keeps its last two
    b1, _ = run(b, "b1", 3000)
    b2, gone = run(b, "b2", 6000)  # 2000 + 9000 > 10000: the oldest in all goes first
    assert gone == [tmp_path / "a2"] and ledger.held() == 1000 + 3000 + 6000
    huge, gone = run(b, "b3", 50_000)  # larger than the budget: everything older goes, the newest is kept
    assert huge.exists() and set(gone) == {third, b1, b2} and ledger.held() == 50_000
