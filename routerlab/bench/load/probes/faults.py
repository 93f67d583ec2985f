"""Cancellation and faults: what happens to the server when a run is interrupted or fails.

Owns `interrupt_test` (Stop, Job.cancel, a dropped connection, with every worker slot full and one
request queued behind), `exception_test` (an injected exception, a truncated router set),
`token_cap_test` and `fault_tests`, which runs them all and the upload flood (flood.py). Knows nothing about how the server is
started, the load run, bad input, or the verdict.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from routerlab.bench.load.driver import (LONG_PROMPT, PROMPTS, _drop_stream, _fn_index, client, probe, submit, trace_of,
                                         wait_done, wait_tokens, wait_until)
from routerlab.bench.load.probes.flood import upload_flood_test
from routerlab.bench.load.probes.public import public_host_tests
from routerlab.bench.load.server import BROKEN_LABEL, FAULT_MARKER


def _occupy(url: str, n: int, max_new: int):
    """`n` long generations that hold every worker slot (so a new request can start only when one frees)."""
    clients = [client(url) for _ in range(n)]
    jobs = [submit(c, LONG_PROMPT, max_new=max_new) for c in clients]
    return clients, jobs


def _release(clients, jobs) -> None:
    for c, j in zip(clients, jobs):
        if not j.done():
            c.predict(api_name="/stop")
    for c, j in zip(clients, jobs):
        try:
            wait_done(j, 120)
        finally:
            c.close()



def _stop_rows(url: str, before: dict) -> dict:
    stats = probe(url)
    new = stats["stop_to_end"][len(before["stop_to_end"]):]
    flush = stats["stop_flush"][len(before["stop_flush"]):]
    first = min(range(len(new)), key=new.__getitem__) if new else None
    return {"stop_request_to_decode_end_ms": round(1000 * new[first], 1) if new else None,
            "quality_flush_after_stop_ms": round(1000 * flush[first], 1) if new else None,
            "decode_step_ms_p50": None if stats["step_p50"] is None else round(1000 * stats["step_p50"], 1)}


def interrupt_test(url: str, kind: str, max_new: int = 48, timeout: float = 300.0) -> dict:
    """Fill every worker slot with long runs, queue one more request, then interrupt the first run by
    `kind`: "stop" (the Stop endpoint), "cancel" (gradio_client's Job.cancel) or "disconnect" (a raw
    stream dropped mid-generation, as a closed tab does; nothing calls /cancel). Measures when the
    server-side engine generator ends, and when the queued request gets its first token."""
    from routerlab import ui

    info = probe(url)
    slots, cap = info["limits"]["concurrency"], info["limits"]["max_new_tokens"]
    long_new = min(max_new, cap)
    before = probe(url)
    n_fill = slots if kind != "disconnect" else slots - 1
    clients, jobs = _occupy(url, n_fill, long_new)
    try:
        for j in jobs:
            wait_tokens(j, 3, timeout)
        if kind == "disconnect":
            data = [LONG_PROMPT, 0.5, ui.UNTRAINED, "kv", long_new, 0.0, info["default_model"], None, True]  # state, quality
            t_int = _drop_stream(url, _fn_index(url, "generate"), data, 3, timeout)
        waiting = client(url)
        queued = submit(waiting, LONG_PROMPT, max_new=2)  # waits behind the occupied slots
        if kind == "stop":
            t_int = time.perf_counter()
            clients[0].predict(api_name="/stop")
        elif kind == "cancel":
            t_int = time.perf_counter()
            jobs[0].cancel()
        closed = wait_until(lambda: probe(url)["closed"] > before["closed"], 60)
        t_closed = time.perf_counter()
        t_first = wait_tokens(queued, 1, timeout)
        queued_ok = queued.result(timeout=timeout)[3].startswith("✓")
        waiting.close()
    finally:
        _release(clients[1:] if kind != "disconnect" else clients, jobs[1:] if kind != "disconnect" else jobs)
        if kind != "disconnect":
            clients[0].close()
    return dict(
        generator_closed=bool(closed),
        interrupt_to_generator_end_s=round(t_closed - t_int, 3),
        **_stop_rows(url, before),
        next_request_first_token_s=round(t_first - t_int, 2),
        next_request_ok=queued_ok,
        no_generator_left=bool(wait_until(lambda: probe(url)["live"] == 0, 60)),
    )


def exception_test(url: str, timeout: float = 300.0) -> dict:
    """An exception inside one generation while another runs: a clear status for that one, the other finishes,
    the same visitor's next run works; a router set with a truncated weights file fails with a clean message."""
    a, b = client(url), client(url)
    try:
        good = submit(a, PROMPTS[0], max_new=4)
        bad = submit(b, FAULT_MARKER + " " + PROMPTS[1], max_new=4)
        bad_status = bad.result(timeout=timeout)[3]
        good_status = good.result(timeout=timeout)[3]
        after = submit(b, PROMPTS[2], max_new=2).result(timeout=timeout)[3]
        broken = submit(b, PROMPTS[0], router=BROKEN_LABEL, max_new=2).result(timeout=timeout)[3]
    finally:
        a.close()
        b.close()
    return dict(
        failing_run_status=bad_status[:160],
        failing_run_clean="Generation failed" in bad_status and "injected fault" in bad_status,
        other_run_ok=good_status.startswith("✓"),
        same_client_next_run_ok=after.startswith("✓"),
        broken_router_set_status=broken[:200],
        broken_router_set_clean=broken.startswith("⚠") and "corrupted" in broken,
    )


def token_cap_test(url: str, timeout: float = 600.0) -> dict:
    """Ask for exactly the server's cap on a prompt that does not end early: it ends cleanly at the cap."""
    cap = probe(url)["limits"]["max_new_tokens"]
    c = client(url)
    try:
        result = submit(c, LONG_PROMPT, max_new=cap).result(timeout=timeout)
    finally:
        c.close()
    trace = trace_of(result)
    n = len(trace.generated_steps)
    return dict(cap=cap, tokens=n, stop_reason=trace.meta.get("stop_reason"), status=result[3][:120],
                clean=result[3].startswith("✓") and n <= cap and trace.meta.get("stop_reason") in ("max_new_tokens", "eos"))


def _serving(url: str, timeout: float) -> bool:
    """A fresh visitor's short generation ends well."""
    c = client(url)
    try:
        return submit(c, PROMPTS[0], max_new=2).result(timeout=timeout)[3].startswith("✓")
    finally:
        c.close()


def fault_tests(url: str, max_new: int = 48, timeout: float = 300.0, log=print, uploads: bool = True) -> dict:
    """Stop, cancel, a dropped connection, an injected exception, a broken router set, the token cap, and (`uploads`)
    the upload flood (flood.py) and the public host's probes (public.py: exports, a forged header, a second training,
    a 50 MB body, a URL in a file field, SIGINT)."""
    out: dict[str, Any] = {"concurrency": probe(url)["limits"]["concurrency"]}
    c = client(url)
    t0 = time.perf_counter()
    job = submit(c, LONG_PROMPT, max_new=3)
    out["idle_ttft_s"] = round(wait_tokens(job, 1, timeout) - t0, 2)  # baseline: an idle server's first token
    wait_done(job, timeout)
    c.close()
    for kind in ("stop", "cancel", "disconnect"):
        out[kind] = interrupt_test(url, kind, max_new, timeout)
        if log:
            log(f"[faults] {kind}: {out[kind]}")
    out["exception"] = exception_test(url, timeout)
    out["token_cap"] = token_cap_test(url, timeout * 2)
    if log:
        log(f"[faults] exception: {out['exception']}\n[faults] token cap: {out['token_cap']}")
    if uploads:
        info = probe(url)
        out["uploads"] = upload_flood_test(url, Path(info["upload_folder"]), info["limits"]["uploads"],
                                           serving=lambda: _serving(url, timeout), log=log)
        out["public"] = public_host_tests(url, Path(info["upload_folder"]), log=log)
    out["server_after"] = {k: v for k, v in probe(url).items() if k in ("live", "decoders", "opened", "closed", "injected")}
    return out
