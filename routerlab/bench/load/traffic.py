"""The load run: concurrent visitors share a fixed number of generations, each with its own settings.

Owns `load_test` (throughput, per-token latency, time to first token, decisions checked against each
session's threshold, the server's RSS over the run and after `malloc_trim`) and the small number
helpers it reports with. Knows nothing about how the server is started, the fault or bad-input tests,
or the verdict.
"""

from __future__ import annotations

import math
import random
import statistics
import threading
import time

from routerlab.bench.load.driver import (POLICIES, PROMPTS, THRESHOLDS, _probe_lock, _probes, client, decision_errors,
                                         probe, submit, tokens_shown, trace_of, wait_until)
from routerlab.bench.load.server import BROKEN_LABEL


def pct(values, q: float):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))]


def _mb(n) -> float:
    return round(n / 2**20, 1)


def load_test(url: str, sessions: int = 8, generations: int = 50, max_new: int | tuple[int, int] = 16, deadline_s: float = 1200.0,
              router_labels: list[str] | None = None, log=print, thresholds: list[float] = THRESHOLDS,
              policies: list[str] = POLICIES, prompts: list[str] = PROMPTS) -> dict:
    """`sessions` concurrent visitors share `generations` runs, each with its own threshold, policy and router set.
    `max_new`: new tokens per run, or a (low, high) range each run draws from (seeded by the run's number)."""
    from routerlab import ui

    stats0 = probe(url)
    # random routers first: their scores spread around 0.5, so each session's threshold decides differently
    labels = router_labels or sorted((l for l in stats0["router_labels"] if l != BROKEN_LABEL),
                                     key=lambda l: ("random (loadtest)" not in l, l == ui.UNTRAINED, l == ui.FULL))
    lock = threading.Lock()
    taken = [0]
    runs: list[dict] = []
    errors: list[str] = []
    rss: list[tuple[int, int]] = [(0, stats0["rss"])]
    start = time.perf_counter()
    end = start + deadline_s

    def visitor(k: int):
        c = client(url)
        threshold, policy, label = thresholds[k % len(thresholds)], policies[k % len(policies)], labels[k % len(labels)]
        try:
            while time.perf_counter() < end:
                with lock:
                    if taken[0] >= generations:
                        return
                    taken[0] += 1
                    n = taken[0]
                prompt = prompts[n % len(prompts)]
                new = max_new if isinstance(max_new, int) else random.Random(n).randint(*max_new)
                t0 = time.perf_counter()
                job = submit(c, prompt, threshold, label, policy, new)
                first = last = None
                seen = 0
                try:
                    while not job.done():
                        if time.perf_counter() > end + 120:
                            job.cancel()
                            raise TimeoutError("deadline")
                        shown = tokens_shown(job)
                        if shown > seen:
                            now = time.perf_counter()
                            first = first or now
                            last, seen = now, shown
                        time.sleep(0.03)
                    result = job.result(timeout=30)
                    trace = trace_of(result)
                    status = result[3]
                    gen = trace.generated_steps
                    wrong = decision_errors(trace, threshold)
                    run = dict(visitor=k, threshold=threshold, kv_policy=policy, routers=label, tokens=len(gen), asked=new,
                               wall=time.perf_counter() - t0, ttft=(first - t0) if first else None,
                               stream_per_token=((last - first) / (seen - 1)) if first and seen > 1 else None,
                               step_seconds=[s.seconds for s in gen if s.seconds > 0], decision_errors=wrong,
                               stop_reason=trace.meta.get("stop_reason"), ok=status.startswith("✓") and wrong == 0)  # 0 tokens is fine: a heavy skip may say end-of-text at once
                    if not run["ok"]:
                        errors.append(f"visitor {k}: status {status[:120]!r}, {wrong} wrong decisions")
                except Exception as err:  # any failure of one run is counted, the visitor goes on
                    errors.append(f"visitor {k}: {type(err).__name__}: {str(err)[:200]}")
                    run = dict(visitor=k, ok=False, tokens=0)
                r = probe(url)["rss"]
                with lock:
                    runs.append(run)
                    rss.append((len(runs), r))
                    done = len(runs)
                if log:
                    log(f"[load] {done}/{generations} visitor {k} t={threshold} {policy}: {run.get('tokens')} tokens, "
                        f"rss {_mb(r)} MB{'' if run['ok'] else ' ERROR'}")
        finally:
            c.close()

    threads = [threading.Thread(target=visitor, args=(k,), daemon=True) for k in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(1.0, end + 180 - time.perf_counter()))
    wall = time.perf_counter() - start
    after = wait_until(lambda: (lambda s: s if s["live"] == 0 and s["decoders"] == 0 else None)(probe(url)), 30) or probe(url)
    with _probe_lock:
        trimmed = _probes[url].predict(api_name="/loadtest_trim")
    steps = [x for r in runs for x in r.get("step_seconds", [])]
    per_token = [r["stream_per_token"] for r in runs if r.get("stream_per_token")]
    ttft = [r["ttft"] for r in runs if r.get("ttft")]
    tokens = sum(r.get("tokens", 0) for r in runs)
    # RSS: the first `sessions` runs warm caches up; compare the next quarter with the last quarter.
    series = [b for _, b in rss[1:]]
    warm = series[min(sessions, len(series) // 2):]
    q = max(1, len(warm) // 4)
    early, late = (statistics.median(warm[:q]), statistics.median(warm[-q:])) if warm else (0, 0)
    growth = late - early
    return {
        "sessions": sessions,
        "generations": len(runs),
        "generations_asked": generations,
        "max_new_tokens": max_new if isinstance(max_new, int) else list(max_new),
        "errors": len(errors) + (generations - len(runs)),
        "error_messages": errors[:20],
        "decision_errors": sum(r.get("decision_errors", 0) for r in runs),
        "traces_checked": sum(1 for r in runs if "decision_errors" in r),
        "tokens": tokens,
        "wall_s": round(wall, 2),
        "throughput_tokens_per_s": round(tokens / wall, 2) if wall else None,
        "engine_step_ms_p50": round(1000 * pct(steps, 0.5), 1) if steps else None,
        "engine_step_ms_p95": round(1000 * pct(steps, 0.95), 1) if steps else None,
        "client_per_token_ms_p50": round(1000 * pct(per_token, 0.5), 1) if per_token else None,
        "client_per_token_ms_p95": round(1000 * pct(per_token, 0.95), 1) if per_token else None,
        "time_to_first_token_s_p50": round(pct(ttft, 0.5), 2) if ttft else None,
        "time_to_first_token_s_p95": round(pct(ttft, 0.95), 2) if ttft else None,
        "rss_mb_start": _mb(rss[0][1]),
        "rss_mb_series": [_mb(b) for b in series],
        "rss_mb_early_median": _mb(early),
        "rss_mb_late_median": _mb(late),
        "rss_growth_mb": _mb(growth),
        "rss_mb_end": _mb(trimmed["before"]),
        "rss_mb_after_malloc_trim": _mb(trimmed["after"]),
        # A leak is memory still in use at the end: RSS after glibc returned its free pages, against the early median.
        # Raw RSS also carries freed-but-kept heap (fragmentation from many threads), reported, not judged.
        "rss_live_growth_mb": _mb(trimmed["after"] - early),
        "rss_growth_ok": trimmed["after"] - early <= max(48 * 2**20, 0.05 * early),
        "thresholds": sorted({r["threshold"] for r in runs if "threshold" in r}),
        "kv_policies": sorted({r["kv_policy"] for r in runs if "kv_policy" in r}),
        "router_sets": sorted({r["routers"] for r in runs if "routers" in r}),
        "stop_reasons": sorted({str(r.get("stop_reason")) for r in runs if "stop_reason" in r}),
        "server_after": {k: after[k] for k in ("live", "decoders", "threads", "opened", "closed")},
    }
