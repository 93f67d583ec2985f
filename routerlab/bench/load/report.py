"""Judging and summarising a run's report: what failed, as sentences, and the few lines printed at the end.

Owns `within_a_step`, `verdict` and `summary`. Works on the report dict alone: knows nothing about
the server, the clients, or how the numbers were measured.
"""

from __future__ import annotations


def within_a_step(row: dict) -> bool:
    """Decoding ended within about one decode step of the stop request: the step in flight finishes, no new one
    starts. Bound: 3 median steps (a step under load is slower than the median) plus 250 ms of scheduling.
    The quality pass's final flush after it (scoring the tokens already written; server.WatchedEngine)
    is not decoding and is reported apart (`quality_flush_after_stop_ms`)."""
    ms, step = row.get("stop_request_to_decode_end_ms"), row.get("decode_step_ms_p50")
    return ms is not None and step is not None and ms <= 3 * step + 250


def verdict(report: dict) -> list[str]:
    """What failed, as sentences; empty when everything passed."""
    bad = []
    load = report.get("load")
    if load:
        if load["errors"]:
            bad.append(f"load: {load['errors']} errors: {load['error_messages'][:3]}")
        if load["decision_errors"]:
            bad.append(f"load: {load['decision_errors']} decisions do not match their session's threshold")
        if not load["rss_growth_ok"]:
            bad.append(f"load: memory in use grew {load['rss_live_growth_mb']} MB (raw RSS {load['rss_growth_mb']} MB)")
        if load["server_after"]["live"] or load["server_after"]["decoders"]:
            bad.append(f"load: generators left running {load['server_after']}")
    soak = report.get("soak")
    if soak:
        if soak["errors"]:
            bad.append(f"soak: {soak['errors']} of {soak['generations']} generations failed: "
                       f"{[m for r in soak['levels'].values() for m in r['error_messages']][:3]}")
        for level, r in soak["levels"].items():
            if r["server_after"]["live"] or r["server_after"]["decoders"]:
                bad.append(f"soak ({level} at a time): generators left running {r['server_after']}")
    tr = report.get("training")
    if tr:
        if tr["errors"] or tr["decision_errors"]:
            bad.append(f"training: {tr['errors']} errors, {tr['decision_errors']} decisions off their session's threshold")
        if not tr["training_was_running"]:
            bad.append(f"training: the training was not running during the second load run ({tr['training_started']!r})")
    faults = report.get("faults")
    if faults:
        for name in ("stop", "cancel", "disconnect"):
            row = faults[name]
            if not (row["generator_closed"] and row["next_request_ok"] and row["no_generator_left"]):
                bad.append(f"faults/{name}: {row}")
            elif not within_a_step(row):
                bad.append(f"faults/{name}: decoding ended {row['stop_request_to_decode_end_ms']} ms after the stop request "
                           f"(decode step p50 {row['decode_step_ms_p50']} ms)")
        if not all(faults["exception"][k] for k in ("failing_run_clean", "other_run_ok", "same_client_next_run_ok", "broken_router_set_clean")):
            bad.append(f"faults/exception: {faults['exception']}")
        if not faults["token_cap"]["clean"] or faults["token_cap"]["tokens"] > faults["token_cap"]["cap"]:
            bad.append(f"faults/token cap: {faults['token_cap']}")
        up = faults.get("uploads")
        if up and not up["ok"]:
            bad.append(f"faults/upload flood: the folder grew {up['one_visitor']['folder_growth_mb']} MB from one visitor "
                       f"(budget {up['budget']['session_mb']}), {up['folder_growth_mb']} MB in all (budget {up['budget']['total_mb']}); "
                       f"cross-origin {up['cross_origin']}, same-origin {up['same_origin']}, serving after: {up['serving_after']}")
        public = faults.get("public")
        if public and not public["ok"]:
            bad += [f"faults/public host/{name}: {row}" for name, row in public.items() if isinstance(row, dict) and not row.get("ok")]
    bi = report.get("bad_input")
    if bi:
        if bi["unclear"]:
            bad.append(f"bad input: unclear answers for {[r['case'] for r in bi['unclear']]}")
        if not bi["serving_after"]:
            bad.append("bad input: the server stopped serving")
        if (bi.get("server_log_tracebacks") or {}).get("inputs"):
            bad.append(f"bad input: the server logged {bi['server_log_tracebacks']['inputs']} traceback(s) for expected bad input")
    fz = report.get("fuzz")
    if fz and (fz["crashes"] or not fz["scan_ok"]):
        bad.append(f"fuzz: {fz['crashes'][:3]} scan_ok={fz['scan_ok']}")
    q = report.get("queue")
    if q and (q["refused"] == 0 or q["finished"] == 0):
        bad.append(f"queue cap: {q}")
    sl = report.get("safe_loading")
    if sl and sl["load_model_trust_remote_code_default"] is not False:
        bad.append("trust_remote_code is on by default")
    return bad


def summary(report: dict) -> str:
    lines = []
    load = report.get("load")
    if load:
        lines.append(
            f"load: {load['sessions']} sessions, {load['generations']} generations, {load['errors']} errors, "
            f"{load['decision_errors']} wrong decisions in {load['traces_checked']} traces; {load['throughput_tokens_per_s']} tok/s total; "
            f"engine step p50/p95 {load['engine_step_ms_p50']}/{load['engine_step_ms_p95']} ms; client per-token p50/p95 "
            f"{load['client_per_token_ms_p50']}/{load['client_per_token_ms_p95']} ms; RSS {load['rss_mb_early_median']} -> "
            f"{load['rss_mb_late_median']} MB ({load['rss_growth_mb']:+} MB), {load['rss_mb_after_malloc_trim']} MB after malloc_trim "
            f"({load['rss_live_growth_mb']:+} MB in use)")
    soak = report.get("soak")
    if soak:
        for level, r in soak["levels"].items():
            lines.append(f"soak, {level} at a time ({soak['settings']['router_set']}, threshold {soak['settings']['threshold']}, "
                         f"{soak['settings']['kv_policy']}, quality {'on' if soak['settings']['measure_quality'] else 'off'}, "
                         f"{soak['new_tokens'][0]}-{soak['new_tokens'][1]} new tokens): {r['generations']} generations, {r['errors']} errors; "
                         f"{r['throughput_tokens_per_s']} tok/s total; first token p50/p95 {r['time_to_first_token_s_p50']}/"
                         f"{r['time_to_first_token_s_p95']} s")
    f = report.get("faults")
    if f:
        for k in ("stop", "cancel", "disconnect"):
            r = f[k]
            lines.append(f"{k}: generator ended {r['interrupt_to_generator_end_s']} s after the interrupt "
                         f"(stop->decode end {r['stop_request_to_decode_end_ms']} ms, then the quality pass's final flush "
                         f"{r.get('quality_flush_after_stop_ms')} ms; decode step p50 {r['decode_step_ms_p50']} ms); "
                         f"next request's first token after {r['next_request_first_token_s']} s")
        lines.append(f"exception: {f['exception']}; token cap: {f['token_cap']['tokens']}/{f['token_cap']['cap']} ({f['token_cap']['stop_reason']})")
        up = f.get("uploads")
        if up:
            lines.append(f"upload flood ({up['upload_mb']} MB each): one visitor {up['one_visitor']['accepted']}/{up['one_visitor']['uploads']} accepted, "
                         f"folder +{up['one_visitor']['folder_growth_mb']} MB (budget {up['budget']['session_mb']}); ten visitors "
                         f"{up['ten_visitors']['accepted']}/{up['ten_visitors']['uploads']}, +{up['folder_growth_mb']} MB in all "
                         f"(budget {up['budget']['total_mb']}); cross-origin {up['cross_origin']['code']}, same-origin "
                         f"{up['same_origin']['code']}; serving after: {up['serving_after']}")
        pub = f.get("public")
        if pub:
            e, g, t, bo, u = (pub[k] for k in ("exports", "forged_header", "second_training", "body", "url_file"))
            lines.append(f"public host: {e['generations']} one-token runs grew the folder {e['folder_growth_mb']} MB; a real visitor's "
                         f"upload after {g.get('forged_uploads')} forged-header uploads: HTTP {g.get('real_visitor_code')}; a second "
                         f"training: {'refused' if t['ok'] else 'NOT refused'}; a {bo['body_mb']} MB body: HTTP {bo['code']}, server "
                         f"+{bo['server_growth_mb']} MB; a URL in a file field: {u['answer'][:8]}; SIGINT: "
                         f"{(pub.get('sigint') or {}).get('seconds')} s")
    b = report.get("bad_input")
    if b:
        lines.append(f"bad input: {b['clear']}/{b['cases']} clear; serving after: {b['serving_after']}")
    if report.get("fuzz"):
        z = report["fuzz"]
        lines.append(f"fuzz: {z['cases']} cases, {z['clean_error']} clean errors, {z['loaded']} loaded, {len(z['crashes'])} crashes")
    if report.get("queue"):
        lines.append(f"queue: {report['queue']}")
    lines.append("PASSED" if report["passed"] else "FAILED:\n  " + "\n  ".join(report["failures"]))
    return "\n".join(lines)
