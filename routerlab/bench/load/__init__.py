"""Load, fault, bad-input and loader-fuzz tests of the real app, over HTTP on localhost, measured.

    python -m routerlab.bench.load                         # full run: 8 sessions, 50 generations, JSON to assets/bench/load.json
    python -m routerlab.bench.load --sessions 4 --generations 8 --max-new 8 --out -   # a short run
    python -m routerlab.bench.load serve --port 7861       # only the watched server (what the full run spawns)

The driver talks to the app the way visitors do: one `gradio_client.Client` per visitor on the
named endpoints (`/generate`, `/stop`, `/set_threshold`, `/compare`), plus one raw HTTP stream that
is dropped mid-generation (a closed tab). The server is the real `ui.build_demo` on the embedded
model, built from `Limits.from_env()` (so the operator caps are what is tested), with two test-only
additions that never ship in `app.py`:
  - `WatchedEngine` wraps the shared Engine: it counts generators opened and closed, times the gap
    between a stop request and the end of decoding, and raises inside one generation when the
    prompt carries `FAULT_MARKER` (the fault-injection hook);
  - a hidden `/loadtest_stats` endpoint reports those counters, the server's RSS and its threads.
A router set whose weights file is truncated is offered too, to show a bad set fails cleanly.

Bounded: a fixed number of generations, each capped in tokens, and a wall-clock deadline; it
stops by itself and never contacts anything but 127.0.0.1. Knows nothing about tensors.

The package, by what its parts do (none imports this `__init__`, which only re-exports):
  - `server`:  the watched server (WatchedEngine, the hidden endpoints, serve, spawn, READY)
  - `driver`:  talking to the app (gradio_client Clients, probes, waits, traces, raw HTTP)
  - `traffic`: the load run (`load_test`)
  - `faults`:  stop / cancel / disconnect, an injected exception, a broken router set, the token cap, the upload flood
  - `flood`:   the upload flood (31 MB uploads from one visitor and from ten, another site's page)
  - `inputs`:  bad input through the API, the queue cap
  - `fuzz`:    the router loader fuzzed, the safe-loading checks (no server)
  - `report`:  the verdict and the summary of a report
  - `cli`:     arguments, `run_all`, `main` (`__main__` runs it)
"""

from __future__ import annotations

from routerlab.bench.load.cli import DEFAULT_OUT, build_parser, main, run_all
from routerlab.bench.load.driver import (LONG_PROMPT, POLICIES, PROMPTS, THRESHOLDS, client, decision_errors, forget,
                                         probe, submit, tokens_shown, trace_of, wait_done, wait_tokens, wait_until)
from routerlab.bench.load.probes.faults import exception_test, fault_tests, interrupt_test, token_cap_test
from routerlab.bench.load.probes.flood import upload_flood_test
from routerlab.bench.load.probes.fuzz import fuzz_router_loading, safe_loading_checks
from routerlab.bench.load.probes.inputs import UNCLEAR, bad_input_cases, bad_input_test, queue_cap_test
from routerlab.bench.load.report import summary, verdict, within_a_step
from routerlab.bench.load.server import (BROKEN_LABEL, FAULT_MARKER, READY, Server, WatchedEngine, build_server,
                                         free_port, malloc_trim, rss_bytes, serve, spawn)
from routerlab.bench.load.traffic import load_test, pct

__all__ = [
    "BROKEN_LABEL", "DEFAULT_OUT", "FAULT_MARKER", "LONG_PROMPT", "POLICIES", "PROMPTS", "READY", "THRESHOLDS", "UNCLEAR",
    "Server", "WatchedEngine", "bad_input_cases", "bad_input_test", "build_parser", "build_server", "client",
    "decision_errors", "exception_test", "fault_tests", "forget", "free_port", "fuzz_router_loading", "interrupt_test",
    "load_test", "main", "malloc_trim", "pct", "probe", "queue_cap_test", "rss_bytes", "run_all", "safe_loading_checks",
    "serve", "spawn", "submit", "summary", "token_cap_test", "tokens_shown", "trace_of", "upload_flood_test", "verdict", "wait_done",
    "wait_tokens", "wait_until", "within_a_step",
]
