"""The upload guard (routerlab/ui/state/uploads.py) in front of a real Gradio server: uploads stay within their budget on
disk, per visitor and for the server; another site's page cannot upload; what the app reads is deleted; a public
root URL set by the operator is what /config says, whatever Host a request claims.

A tiny Blocks (one File box) stands in for the app: the guard and Gradio's upload route are the same as the app's
(`ui.launch_options` passes the same middleware). Budgets are in KB so the test writes a few MB at most.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import httpx
import pytest

from routerlab import ui
from routerlab.ui.state import uploads
from routerlab.ui.state.uploads import Ledger, UploadBudget
from routerlab.ui.tabs.train_tab import upload_set
from routerlab.ui.web import http_guard

KB = 1024
# These tests stand in for visitors behind a proxy: each "visitor" is an X-Forwarded-For value from 127.0.0.1, trusted.
BUDGET = UploadBudget(session_bytes=300 * KB, session_files=4, total_bytes=700 * KB, total_files=12,
                      allowed_origins=("https://embed.example",), trusted_proxies=("127.0.0.1",))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def launch(budget=BUDGET, **kwargs):
    with gr.Blocks() as demo:
        box = gr.File()
        box.upload(lambda f: None, box, None)
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                            app_kwargs={"middleware": [uploads.middleware(budget)]}, **kwargs)
    return demo, url.rstrip("/")


@pytest.fixture
def server(tmp_path, monkeypatch):
    folder = tmp_path / "gradio"
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(folder))
    demo, url = launch()
    yield url, folder
    demo.close()


def post(url, size=200 * KB, visitor="10.0.0.1", origin=None, files=1, tag=""):
    """One multipart upload of `files` files of `size` bytes each (distinct contents: Gradio stores equal files once)."""
    headers = {"x-forwarded-for": visitor}
    if origin:
        headers["origin"] = origin
    parts = [("files", (f"f{k}.bin", f"{visitor} {tag} {k} {time.time()}".encode().ljust(size, b"x"))) for k in range(files)]
    return httpx.post(f"{url}/gradio_api/upload", files=parts, headers=headers, timeout=60)


def test_one_visitors_uploads_evict_their_own_oldest_and_stay_within_their_budget(server):
    url, folder = server
    stored = []
    for k in range(5):  # 5 x 200 KB against a 300 KB share: each new one takes the place of the one before
        r = post(url, tag=str(k))
        assert r.status_code == 200, r.text
        stored += [Path(p) for p in r.json()]
        assert folder_bytes(folder) <= BUDGET.session_bytes
    assert stored[-1].is_file() and not any(p.exists() for p in stored[:-1])


def test_many_visitors_fill_the_servers_budget_then_are_refused_with_a_readable_answer(server):
    url, folder = server
    answers = [post(url, visitor=f"10.0.1.{k}") for k in range(10)]  # 10 x 200 KB against 700 KB
    codes = [r.status_code for r in answers]
    assert codes[:3] == [200] * 3 and set(codes[3:]) == {429}, codes
    assert "upload space" in answers[-1].text and "Try again" in answers[-1].text
    assert answers[-1].headers["retry-after"]
    assert folder_bytes(folder) <= BUDGET.total_bytes
    assert httpx.get(f"{url}/config", timeout=30).status_code == 200  # still serving


def test_an_upload_over_a_visitors_budget_or_with_too_many_files_is_refused_and_not_kept(server):
    url, folder = server
    big = post(url, size=400 * KB)
    assert big.status_code == 413 and "at most 0 MB" not in big.text and "smaller" in big.text
    many = post(url, size=10 * KB, files=6)  # 6 files against 4 a visitor may keep
    assert many.status_code == 413 and "6 files" in many.text
    assert folder_bytes(folder) == 0


def test_uploads_from_another_sites_page_are_refused_and_the_apps_own_page_is_served(server):
    url, folder = server
    foreign = post(url, origin="http://evil.example")
    assert foreign.status_code == 403 and "ROUTERLAB_ALLOWED_ORIGINS" in foreign.text
    assert post(url, origin="null").status_code == 403  # a sandboxed frame or a local file
    assert folder_bytes(folder) == 0
    assert post(url, origin=url, visitor="10.0.2.1").status_code == 200  # the page's own origin
    assert post(url, origin="https://embed.example", visitor="10.0.2.2").status_code == 200  # listed for embedding
    assert post(url, visitor="10.0.2.3").status_code == 200  # no Origin: a script, not a browser's cross-site request


def test_the_server_evicts_other_visitors_oldest_uploads_once_they_are_old_enough(tmp_path):
    ledger = Ledger(BUDGET, tmp_path)
    made = []
    for k in range(4):
        (tmp_path / str(k)).mkdir()
        path = tmp_path / str(k) / "f.bin"
        path.write_bytes(b"x" * 200 * KB)
        assert ledger.reserve(k, f"v{k}", 200 * KB, keep_s=3600) in (None, "server")
        if k < 3:
            assert ledger.settle(k, f"v{k}", [path], keep_s=3600)
        made.append(path)
    assert ledger.reserve(9, "v9", 200 * KB, keep_s=3600) == "server"  # the others' uploads are too recent
    assert ledger.reserve(9, "v9", 200 * KB, keep_s=0) is None  # old enough: the oldest makes room
    assert not made[0].exists() and made[1].exists() and made[2].exists()


def test_uploads_the_app_reads_are_deleted_and_other_paths_are_left_alone(tmp_path, monkeypatch):
    folder = tmp_path / "gradio"
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(folder))
    (folder / "abc").mkdir(parents=True)
    upload = folder / "abc" / "set.zip"
    upload.write_bytes(b"not a zip")
    outside = tmp_path / "set.zip"
    outside.write_bytes(b"not a zip")
    res = SimpleNamespace(engine=SimpleNamespace(model=None))
    status, _, box = upload_set(res, ui.Session(), [str(upload)])
    assert "⚠" in status and box is None
    assert not upload.exists() and not (folder / "abc").exists()  # read (here: refused), then deleted
    upload_set(res, ui.Session(), [str(outside)])
    assert outside.exists()
    assert uploads.discard(["/etc/hostname", str(outside)], folder) == 0


def test_the_apps_launch_options_carry_the_guard_with_the_environments_budget(monkeypatch):
    monkeypatch.setenv("ROUTERLAB_UPLOAD_SESSION_MB", "12")
    monkeypatch.setenv("ROUTERLAB_UPLOAD_TOTAL_FILES", "9")
    monkeypatch.setenv("ROUTERLAB_ALLOWED_ORIGINS", "https://Example.org:443/, https://b.example:8443")
    page, wait, guard = ui.launch_options(ui.Limits(training_max_chars=1000))["app_kwargs"]["middleware"]
    assert wait.cls.__name__ == "WaitGuard"
    budget = guard.kwargs["budget"]
    assert guard.cls is uploads.UploadGuard and page.cls is http_guard.PageGuard  # the page's guard first, outermost
    assert page.kwargs == {"limit": 4000 + 2**20, "allowed_origins": ("https://example.org", "https://b.example:8443")}
    assert (budget.session_bytes, budget.total_files, budget.total_bytes) == (12 * 2**20, 9, 200 * 2**20)
    assert budget.allowed_origins == ("https://example.org", "https://b.example:8443")


def test_a_public_root_url_set_by_the_operator_is_what_config_says_whatever_the_host(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio"))
    forged = {"host": "evil.example", "x-forwarded-host": "evil.example"}
    demo, url = launch()
    try:  # without it, Gradio builds the root from the request: a forged Host is echoed
        assert "evil.example" in httpx.get(f"{url}/config", headers=forged, timeout=30).json()["root"]
    finally:
        demo.close()
    monkeypatch.setenv("GRADIO_ROOT_PATH", "https://routerlab.example")
    demo, url = launch()
    try:
        assert httpx.get(f"{url}/config", headers=forged, timeout=30).json()["root"] == "https://routerlab.example"
        assert post(url, origin="https://routerlab.example").status_code == 200  # the public page's own origin
    finally:
        demo.close()


def test_the_load_harness_flood_stays_within_the_budget_and_sees_the_refusals(server):
    """bench load's fault phase runs the same flood with 31 MB uploads against the real app's budget."""
    from routerlab.bench.load import upload_flood_test, verdict

    url, folder = server
    out = upload_flood_test(url, folder, BUDGET.describe() | {"session_mb": 300 / 1024, "total_mb": 700 / 1024}, size=200 * KB, log=None)
    assert out["ok"], out
    assert out["one_visitor"]["accepted"] == 10 and out["ten_visitors"]["accepted"] == 2  # 300 KB held, then 2 x 200 KB
    assert out["cross_origin"]["code"] == 403 and out["same_origin"]["code"] == 200
    assert verdict({"faults": _faults_passing(out)}) == []
    out["cross_origin"]["code"] = 200
    assert "upload flood" in verdict({"faults": _faults_passing(out | {"ok": False})})[0]


def _faults_passing(uploads: dict) -> dict:
    row = {"generator_closed": True, "next_request_ok": True, "no_generator_left": True, "stop_request_to_decode_end_ms": 1,
           "decode_step_ms_p50": 1}
    return {"stop": row, "cancel": row, "disconnect": row, "uploads": uploads, "token_cap": {"clean": True, "tokens": 1, "cap": 1},
            "exception": dict.fromkeys(("failing_run_clean", "other_run_ok", "same_client_next_run_ok", "broken_router_set_clean"), True)}


def test_a_file_gradio_refuses_as_too_large_leaves_the_visitors_budget_as_it_was(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio"))
    demo, url = launch(max_file_size=250 * KB)  # the app's ROUTERLAB_MAX_UPLOAD_MB, in small
    try:
        assert post(url, size=280 * KB).status_code == 413  # Gradio's own refusal, under the visitor's 300 KB share
        for k in range(3):  # a reservation left behind would refuse these
            assert post(url, size=120 * KB, tag=str(k)).status_code == 200
    finally:
        demo.close()


def _scope(peer, forwarded=None):
    headers = [(b"x-forwarded-for", forwarded.encode())] if forwarded is not None else []
    return {"client": (peer, 50000), "headers": headers}


def test_a_visitor_is_the_peer_unless_the_peer_is_a_trusted_proxy():
    visitor = uploads.visitor_of
    assert visitor(_scope("203.0.113.9", "10.9.9.9")) == "203.0.113.9"  # nobody trusted: the header is ignored
    assert visitor(_scope("203.0.113.9", "10.9.9.9"), ("10.0.0.0/8",)) == "203.0.113.9"  # the peer is no proxy of ours
    trusted = ("10.0.0.0/8", "127.0.0.1")
    assert visitor(_scope("10.1.2.3", "198.51.100.7"), trusted) == "198.51.100.7"
    # a forged hop before the real one, then a chain of our own proxies: the last hop none of them added
    assert visitor(_scope("127.0.0.1", "1.2.3.4, 198.51.100.7, 10.4.4.4"), trusted) == "198.51.100.7"
    assert visitor(_scope("10.1.2.3", "10.5.5.5"), trusted) == "10.5.5.5"  # every hop ours: the first
    assert visitor(_scope("10.1.2.3"), trusted) == "10.1.2.3"  # no header
    assert visitor(_scope("10.1.2.3", "not-an-address"), trusted) == "not-an-address"
    assert visitor(_scope("::1", "2001:db8::5"), ("::1/128",)) == "2001:db8::5"


def test_trusted_proxies_come_from_the_environment_or_a_spaces_private_network(monkeypatch, caplog):
    monkeypatch.delenv("ROUTERLAB_TRUSTED_PROXIES", raising=False)
    monkeypatch.delenv("SPACE_HOST", raising=False)
    assert uploads.trusted_proxies() == ()
    monkeypatch.setenv("SPACE_HOST", "someone-routerlab.hf.space")
    assert "10.0.0.0/8" in uploads.trusted_proxies() and UploadBudget.from_env().trusted_proxies == uploads.PRIVATE
    monkeypatch.setenv("ROUTERLAB_TRUSTED_PROXIES", "none")
    assert uploads.trusted_proxies() == ()
    monkeypatch.setenv("ROUTERLAB_TRUSTED_PROXIES", "192.0.2.1, 10.0.0.0/8, proxy.example")
    with caplog.at_level("WARNING"):
        assert uploads.trusted_proxies() == ("192.0.2.1", "10.0.0.0/8")
    assert "proxy.example" in caplog.text


def test_a_forged_header_from_an_untrusted_peer_fills_only_that_peers_share(tmp_path, monkeypatch):
    """Reached directly, a client sending a new X-Forwarded-For with every upload is one visitor: its uploads evict its
    own, the server's space stays free, and a visitor from another address uploads as usual. (From 127.0.0.2 and
    127.0.0.3: uvicorn itself takes X-Forwarded-For from 127.0.0.1, its FORWARDED_ALLOW_IPS default.)"""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio"))
    demo, url = launch(budget=UploadBudget(session_bytes=300 * KB, session_files=4, total_bytes=700 * KB, total_files=12))

    def upload(client, name, forged=None):
        headers = {"x-forwarded-for": forged} if forged else {}
        return client.post(f"{url}/gradio_api/upload", files=[("files", (name, f"{name} {time.time()}".encode().ljust(4 * KB, b"x")))],
                           headers=headers, timeout=60)

    forger = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"))
    visitor = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.3"))
    try:
        for k in range(16):  # a new address claimed each time: 16 uploads would be 16 visitors were the header believed
            r = upload(forger, f"f{k}.bin", forged=f"198.51.100.{k}")
            assert r.status_code == 200, (k, r.text)
        assert sum(1 for p in (tmp_path / "gradio").rglob("*") if p.is_file()) <= BUDGET.session_files
        for k in range(12):  # the server's count would be full from the forger's 16; it holds 4: room for another visitor
            assert upload(visitor, f"v{k}.bin").status_code == 200
    finally:
        forger.close()
        visitor.close()
        demo.close()


def test_a_handlers_request_names_its_visitor_as_an_upload_does():
    from types import SimpleNamespace as NS

    direct = NS(client=NS(host="203.0.113.9"), headers={"x-forwarded-for": "198.51.100.1"})
    assert uploads.visitor_of_request(direct, trusted=()) == "203.0.113.9"  # a forged header from a stranger: ignored
    proxied = NS(client=NS(host="10.0.0.5"), headers={"x-forwarded-for": "198.51.100.1, 10.0.0.7"})
    assert uploads.visitor_of_request(proxied, trusted=("10.0.0.0/8",)) == "198.51.100.1"
    assert uploads.visitor_of_request(None) is None and uploads.visitor_of_request(NS(client=None, headers={})) is None


def test_a_full_server_evicts_uploads_a_few_seconds_old_before_it_refuses_anyone(tmp_path):
    """Others' uploads older than KEEP_S (5 s) make room, oldest first; only the last few seconds' are kept."""
    ledger = Ledger(BUDGET, tmp_path)
    made = []
    for k in range(3):
        (tmp_path / str(k)).mkdir()
        path = tmp_path / str(k) / "f.bin"
        path.write_bytes(b"x" * 200 * KB)
        assert ledger.reserve(k, f"v{k}", 200 * KB) is None and ledger.settle(k, f"v{k}", [path])
        made.append(path)
    assert ledger.reserve(8, "v8", 200 * KB) == "server"  # all three arrived this second: kept
    for f in ledger.files[:2]:
        f.at -= 10  # two of them are ten seconds old
    assert ledger.reserve(9, "v9", 200 * KB) is None  # the oldest makes room
    assert not made[0].exists() and made[1].exists() and made[2].exists()
    assert uploads.KEEP_S == 5.0
