"""What a stranger can do to a public server beyond uploads (as the fault phase runs it), each probe measured.

Owns `public_host_tests`:
  - exports: 40 one-token generations, each from a new session, and how much Gradio's folder grew (a run keeps only
    its trace; the heatmap's page is made in the browser);
  - a forged header: a client at one address (127.0.0.2) uploads 16 tiny files under each of 16 forged
    `X-Forwarded-For` values, then a visitor at another address (127.0.0.3) uploads: that upload must be taken;
  - a second training from the same visitor (another session) while their first waits or runs: refused with a message;
  - a 50 MB request body: refused, and how much the server process grew;
  - a file field naming a URL: refused;
  - SIGINT: `python app.py` started apart, interrupted once serving, the seconds until it and its engine process end.
Knows nothing about how the guards work, only what a client sees and the server's own stats (`probe`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from routerlab.bench.load.driver import PROMPTS, _fn_index, _raw_call, client, probe, submit, wait_until
from routerlab.bench.load.probes.flood import folder_bytes
from routerlab.bench.load.server import free_port
from routerlab.core.base.paths import ROOT

MB = 2**20


def exports_test(url: str, folder: Path, runs: int = 40, timeout: float = 300.0) -> dict:
    before, t0, done = folder_bytes(folder), time.perf_counter(), 0
    for _ in range(runs):
        c = client(url)
        try:
            done += submit(c, PROMPTS[0], max_new=1).result(timeout=timeout)[3].startswith("✓")
        finally:
            c.close()
    growth = (folder_bytes(folder) - before) / MB
    return {"generations": runs, "done": done, "seconds": round(time.perf_counter() - t0, 1), "folder_growth_mb": round(growth, 2),
            "ok": done == runs and growth <= 10}


def _upload(url: str, source: str, forged: str | None, tag: str, size: int = 16):
    import httpx

    transport = httpx.HTTPTransport(local_address=source)
    headers = {"x-forwarded-for": forged} if forged else {}
    with httpx.Client(transport=transport, timeout=60) as h:
        r = h.post(url.rstrip("/") + "/gradio_api/upload", headers=headers,
                   files=[("files", (f"f{k}.txt", f"{tag} {k} {time.time_ns()}".encode().ljust(size, b"x"))) for k in range(16)])
    return r.status_code


def forged_header_test(url: str) -> dict:
    """16 forged headers x 16 files from 127.0.0.2, then one visitor's upload from 127.0.0.3 (needs the server on
    127.0.0.1 and a Linux loopback that answers the whole 127/8)."""
    from urllib.parse import urlsplit

    if urlsplit(url).hostname not in ("127.0.0.1", "localhost"):
        return {"skipped": "the server is not on 127.0.0.1", "ok": True}
    t0 = time.perf_counter()
    codes = [_upload(url, "127.0.0.2", f"10.66.{k}.1", f"forged{k}") for k in range(16)]
    real = _upload(url, "127.0.0.3", None, "real")
    return {"forged_uploads": len(codes), "forged_accepted": codes.count(200), "seconds": round(time.perf_counter() - t0, 2),
            "real_visitor_code": real, "ok": real == 200}


def second_training_test(url: str) -> dict:
    """One visitor (this machine's address), two sessions: the second /train is refused while the first runs or waits."""
    first, second = client(url), client(url)
    try:
        a = str(first.predict(granularity="attention-token", skip_target=15, minutes=1, source="built-in prompts", api_name="/train")[4])
        b = str(second.predict(granularity="attention-token", skip_target=15, minutes=1, source="built-in prompts", api_name="/train")[4])
    finally:
        first.predict(api_name="/stop_training")
        wait_until(lambda: probe(url).get("training_phase") in ("done", "stopped", "failed", "cancelled", None), 300)
        first.close()
        second.close()
    return {"first": a[:160], "second": b[:200], "ok": "⚠" not in a and b.startswith("⚠") and "A training you started" in b}


def body_test(url: str, size: int = 50 * MB) -> dict:
    import httpx

    rss = probe(url)["rss"]
    body = b'{"data": ["' + b"x" * size + b'"], "fn_index": 0, "session_hash": "big"}'
    r = httpx.post(url.rstrip("/") + "/gradio_api/queue/join", content=body, headers={"content-type": "application/json"}, timeout=120)
    grew = (probe(url)["rss"] - rss) / MB
    return {"body_mb": round(len(body) / MB, 1), "code": r.status_code, "answer": r.text[:200], "server_growth_mb": round(grew, 1),
            "ok": r.status_code == 413 and grew <= 10}


def url_file_test(url: str, timeout: float = 60.0) -> dict:
    from routerlab.tuning.job import JobSettings
    from routerlab.ui.tabs.train_tab import OWN, STARTS

    data = [None, "attention-token", 15, 0.5, JobSettings.lr, JobSettings.kd_weight, JobSettings.lm_weight, JobSettings.max_steps,
            next(iter(STARTS)), OWN, "", {"path": "https://example.org/big.txt", "meta": {"_type": "gradio.FileData"}}]
    said = _raw_call(url, _fn_index(url, "train"), json.dumps(data), timeout)
    return {"answer": said[:200], "ok": said.startswith("HTTP 400") and "not a URL" in said}


def sigint_test(env: dict | None = None, timeout: float = 600.0) -> dict:
    """`python app.py` in a process group of its own; once it serves, SIGINT; seconds until the group is gone."""
    import httpx

    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port)], cwd=ROOT, start_new_session=True,
                            env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def serving():
        try:
            return httpx.get(f"http://127.0.0.1:{port}/config", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False
    try:
        if not wait_until(lambda: serving() or proc.poll() is not None, timeout, every=0.5) or proc.poll() is not None:
            return {"ok": False, "error": f"app.py did not serve (exit code {proc.poll()})"}
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        ended = wait_until(lambda: proc.poll() is not None and not _group_alive(proc.pid), 30, every=0.05)
        seconds = round(time.perf_counter() - t0, 2)
        return {"seconds": seconds if ended else None, "exit_code": proc.poll(), "ok": bool(ended) and seconds <= 5}
    finally:
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie leader still counts as alive to killpg: look for members that are not zombies
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def public_host_tests(url: str, folder: Path, log=print, sigint: bool = True) -> dict:
    out = {"exports": exports_test(url, folder), "forged_header": forged_header_test(url),
           "second_training": second_training_test(url), "body": body_test(url), "url_file": url_file_test(url)}
    if sigint:
        out["sigint"] = sigint_test()
    if log:
        for name, row in out.items():
            log(f"[faults] public host / {name}: {'ok' if row.get('ok') else 'FAILED'} {row}")
    out["ok"] = all(row.get("ok") for row in out.values() if isinstance(row, dict))
    return out
