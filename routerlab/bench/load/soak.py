"""The soak: many generations at the page's own defaults, as visitors make them, one and several at a time.

Owns `soak_test`: reads /generate's defaults from the app's API description (the router set, threshold, KV
policy, temperature and Measure quality a visitor gets without touching a control), then runs `load_test` at
each concurrency level with those settings, the example prompts and 64-96 new tokens a run. Every run must end
with a `✓` status and decisions that follow its threshold: one failure is an error. Knows nothing about how the
server is started.
"""

from __future__ import annotations

from routerlab.bench.load.driver import client
from routerlab.bench.load.traffic import load_test

LEVELS = (1, 8)
NEW_TOKENS = (64, 96)  # a visitor's runs: the page's default (96) and shorter ones


def page_defaults(url: str) -> dict:
    """/generate's parameter defaults, as the page starts (the values a visitor leaves alone)."""
    c = client(url)
    try:
        params = c.view_api(print_info=False, return_format="dict")["named_endpoints"]["/generate"]["parameters"]
    finally:
        c.close()
    return {p["parameter_name"]: p.get("parameter_default") for p in params}


def soak_test(url: str, generations: int = 100, levels: tuple[int, ...] = LEVELS, new_tokens: tuple[int, int] = NEW_TOKENS,
              deadline_s: float = 3600.0, log=print) -> dict:
    from routerlab.ui import load_prompts

    defaults = page_defaults(url)
    if defaults.get("measure_quality") is not True or defaults.get("temperature") not in (0, 0.0):
        raise RuntimeError(f"the soak expects the page to start with quality on and greedy decoding: {defaults}")
    runs = {}
    for sessions in levels:
        runs[str(sessions)] = load_test(url, sessions, generations, new_tokens, deadline_s, log=log,
                                        router_labels=[defaults["router_set"]], thresholds=[defaults["threshold"]],
                                        policies=[defaults["kv_policy"]], prompts=load_prompts())
        r = runs[str(sessions)]
        if log:
            log(f"[soak] {sessions} at a time: {r['generations']} generations, {r['errors']} errors, {r['tokens']} tokens, "
                f"{r['throughput_tokens_per_s']} tok/s, first token p50/p95 {r['time_to_first_token_s_p50']}/{r['time_to_first_token_s_p95']} s")
    keep = ("sessions", "generations", "errors", "error_messages", "decision_errors", "tokens", "wall_s", "throughput_tokens_per_s",
            "engine_step_ms_p50", "engine_step_ms_p95", "time_to_first_token_s_p50", "time_to_first_token_s_p95",
            "rss_mb_after_malloc_trim", "rss_growth_ok", "stop_reasons", "server_after")
    return {
        "settings": {k: defaults.get(k) for k in ("router_set", "threshold", "kv_policy", "temperature", "model", "measure_quality")},
        "new_tokens": list(new_tokens), "prompts": "assets/prompts.json (the page's examples), in turn",
        "levels": {k: {f: r.get(f) for f in keep} for k, r in runs.items()},
        "generations": sum(r["generations"] for r in runs.values()),
        "errors": sum(r["errors"] for r in runs.values()),  # a run with a wrong decision is one of them
        "decision_errors": sum(r["decision_errors"] for r in runs.values()),
    }
