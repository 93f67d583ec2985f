"""The load run with a training: visitors generate while one visitor trains routers in the Train tab.

Owns `training_load_test`: the same `load_test` twice on the same server, first alone, then while a
training started through the app's own `/train` endpoint runs (the server's stats say whether it was
still training when the second run ended). Reports both runs, the training's effect on the visitors'
decode step and throughput (median step ms with / without), and whether every trace followed its own
session's threshold. Knows nothing about how the server is started.
"""

from __future__ import annotations

import time

from routerlab.bench.load.driver import client, probe, wait_until
from routerlab.bench.load.traffic import load_test

KEYS = ("errors", "decision_errors", "traces_checked", "tokens", "wall_s", "throughput_tokens_per_s", "engine_step_ms_p50",
        "engine_step_ms_p95", "time_to_first_token_s_p50")


def training_load_test(url: str, sessions: int = 4, generations: int = 16, max_new: int = 16, minutes: float = 6.0,
                       log=print) -> dict:
    nice = probe(url)["limits"].get("training_nice")
    alone = load_test(url, sessions, generations, max_new, log=log)
    trainer = client(url)
    # By name, as a script would call it (positional calls broke when the tab gained a control); the tab's defaults otherwise.
    out = trainer.predict(granularity="attention-token", skip_target=15, minutes=minutes, source="built-in prompts", api_name="/train")
    started = str(out[4])  # the status line
    if "⚠" in started:
        raise RuntimeError(f"the training did not start: {started}")
    busy = wait_until(lambda: probe(url).get("training_phase") == "training" or None, 180)  # past data and the first pass
    during = load_test(url, sessions, generations, max_new, log=log)
    still = probe(url).get("training_phase")
    trainer.predict(api_name="/stop_training")
    t0 = time.perf_counter()
    ended = wait_until(lambda: (lambda p: (p or "ended") if p in ("done", "stopped", "failed", "cancelled", None) else None)(
        probe(url).get("training_phase")), 300)
    stop_to_end = round(time.perf_counter() - t0, 1)
    trainer.close()
    a, d = (alone.get("engine_step_ms_p50"), during.get("engine_step_ms_p50"))
    ta, td = (alone.get("throughput_tokens_per_s"), during.get("throughput_tokens_per_s"))
    return {
        "sessions": sessions, "generations": generations, "max_new_tokens": max_new, "training_minutes": minutes,
        "training_nice": nice,
        "training_started": started[:160], "training_was_running": bool(busy) and still == "training",
        "training_end": ended, "stop_to_end_seconds": stop_to_end,  # Stop, then the held-out calibration and comparison
        "alone": {k: alone.get(k) for k in KEYS}, "with_training": {k: during.get(k) for k in KEYS},
        "errors": alone["errors"] + during["errors"], "decision_errors": alone["decision_errors"] + during["decision_errors"],
        "decode_step_slowdown": round(d / a, 2) if a and d else None,
        "throughput_ratio": round(td / ta, 2) if ta and td else None,
    }
