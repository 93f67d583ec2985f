"""Safe loading, without a server: router folders fuzzed through the app's own loader, and the caps from env.

Owns `fuzz_router_loading` (random, truncated and bit-flipped router folders must fail only with
`RouterLabError`) and `safe_loading_checks` (no trust_remote_code by default, the operator caps read
from the environment). Knows nothing about HTTP, the watched server or the report.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path

from routerlab.core.base.errors import RouterLabError


def fuzz_router_loading(cases: int = 60, seed: int = 0) -> dict:
    """Random, truncated and bit-flipped router folders through the app's own path (`Resources.routers_for`,
    `available_router_sets`): only RouterLabError (a clean message), never another exception."""
    from routerlab import ui
    from routerlab.core.base.config import RoutingConfig
    from routerlab.core.decode.engine import Engine
    from routerlab.core.model.models import tiny_model
    from routerlab.core.routing.router import RouterSet
    from routerlab.tuning.checkpoint import CONFIG, WEIGHTS, save_routers

    rng = random.Random(seed)
    model = tiny_model("llama")
    engine = Engine(model, None, name="tiny-llama")
    routers = RouterSet.zeros(model, RoutingConfig.from_granularity("attention-token", [1, 2]))
    root = Path(tempfile.mkdtemp(prefix="routerlab-fuzz-"))
    good = save_routers(routers, root / "good", model)
    weights, config = (good / WEIGHTS).read_bytes(), (good / CONFIG).read_text()

    def mutate_bytes(b: bytes) -> bytes:
        kind = rng.randrange(4)
        if kind == 0:
            return b[: rng.randrange(len(b))]
        if kind == 1:
            return bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 600)))
        out = bytearray(b)
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(len(out))] = rng.getrandbits(8)
        if kind == 3:  # a header claiming a huge tensor
            out[:8] = rng.getrandbits(64).to_bytes(8, "little")
        return bytes(out)

    def mutate_json(s: str) -> str:
        data = json.loads(s)
        kind = rng.randrange(6)
        if kind == 0:
            return s[: rng.randrange(len(s))]
        if kind == 1:
            key = rng.choice(list(data))
            data[key] = rng.choice([None, -1, 1e308, "x" * 50, [], {}, float("nan"), True])
        elif kind == 2:
            data["layers"] = rng.choice([[-1], [10**9], ["1"], [1.5], list(range(200)), None])
        elif kind == 3:
            data["base_model"] = rng.choice([None, {}, {"n_layers": "4"}, {"n_layers": 4, "hidden_size": 64}, []])
        elif kind == 4:
            return "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randint(0, 200)))
        else:
            data.pop(rng.choice(list(data)))
        return json.dumps(data)

    counts = {"clean_error": 0, "loaded": 0}
    crashes: list[str] = []
    for n in range(cases):
        folder = root / f"case{n}"
        folder.mkdir()
        which = rng.randrange(3)
        (folder / WEIGHTS).write_bytes(mutate_bytes(weights) if which != 1 else weights)
        (folder / CONFIG).write_text(mutate_json(config) if which != 0 else config, encoding="utf-8", errors="surrogatepass")
        info = ui.RouterSetInfo(label=f"fuzz {n}", granularity="attention-token", path=folder)
        res = ui.Resources(engine, ui.Limits(), router_sets=[info], prompts=["x"])
        try:
            res.routers_for(engine, info.label)
            counts["loaded"] += 1
        except RouterLabError:
            counts["clean_error"] += 1
        except Exception as err:  # anything else is a loader bug
            crashes.append(f"case {n}: {type(err).__name__}: {str(err)[:160]}")
    import logging

    quiet = logging.getLogger(ui.__name__)
    level, quiet.level = quiet.level, logging.ERROR
    try:  # the start-up scan of the router folder skips bad folders with a warning, never crashes
        offered = [i.label for i in ui.available_router_sets(root)]
        scan_ok = True
    except Exception as err:
        crashes.append(f"available_router_sets: {type(err).__name__}: {err}")
        offered, scan_ok = [], False
    finally:
        quiet.level = level
    return {"cases": cases, **counts, "crashes": crashes, "scan_offered": len(offered), "scan_ok": scan_ok}


def safe_loading_checks() -> dict:
    """Static and environment checks: no trust_remote_code by default, the allow-list, the caps from env."""
    import inspect

    from routerlab import ui
    from routerlab.core.model import models

    default_trc = inspect.signature(models.load_model).parameters["trust_remote_code"].default
    env = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("ROUTERLAB_")}
    try:
        defaults = ui.Limits.from_env()
        os.environ.update({"ROUTERLAB_MAX_NEW_TOKENS": "7", "ROUTERLAB_MAX_PROMPT_CHARS": "99", "ROUTERLAB_QUEUE_SIZE": "3",
                           "ROUTERLAB_CONCURRENCY": "1", "ROUTERLAB_ALLOWED_MODELS": "org/a, org/b"})
        set_ = ui.Limits.from_env()
        os.environ.update({"ROUTERLAB_MAX_NEW_TOKENS": "lots", "ROUTERLAB_QUEUE_SIZE": "-4"})
        junk = ui.Limits.from_env()
    finally:
        for k in [k for k in os.environ if k.startswith("ROUTERLAB_")]:
            del os.environ[k]
        os.environ.update(env)
    return {
        "load_model_trust_remote_code_default": default_trc,
        "defaults": dict(max_new_tokens=defaults.max_new_tokens, max_prompt_chars=defaults.max_prompt_chars,
                         queue_size=defaults.queue_size, concurrency=defaults.concurrency, allowed_models=list(defaults.allowed_models),
                         room=defaults.room, max_batch=defaults.max_batch, room_cache_mb=defaults.room_cache_mb),
        "from_env": dict(max_new_tokens=set_.max_new_tokens, max_prompt_chars=set_.max_prompt_chars, queue_size=set_.queue_size,
                         concurrency=set_.concurrency, allowed_models=list(set_.allowed_models)),
        "junk_env_falls_back": dict(max_new_tokens=junk.max_new_tokens, queue_size=junk.queue_size),
    }
