"""The host's waits for the device per decoded token of one run (`bench speed` on CUDA and `bench.gpu.gpu_check` report it)."""

from __future__ import annotations

from routerlab.core.base.config import GenerateConfig
from routerlab.core.base.device import SyncCounter
from routerlab.core.decode.engine import Control, Engine
from routerlab.core.routing.router import RouterSet


def decode_syncs(engine: Engine, ids: list[int], routers: RouterSet | None, new_tokens: int, policy: str = "kv") -> dict:
    """Host waits per decoded token with quality off: what a decode step itself costs in syncs."""
    control = Control(0.5)
    config = GenerateConfig(max_new_tokens=new_tokens, ignore_eos=True, max_new_tokens_cap=max(4096, new_tokens), kv_policy=policy)
    steps = engine.generate_ids(ids, routers, config, control)
    for step in steps:  # the prefill's Steps come first: count from the first decoded token on
        if not step.is_prompt:
            break
    with SyncCounter(engine.device) as syncs:
        decoded = 1 + sum(1 for _ in steps)
    n_routed = len(routers.config.layers) if routers is not None else 0
    return {"per_token": syncs.count / decoded if syncs.cuda else 0.0, "routed_layers": n_routed,
            "where": dict(sorted(syncs.where.items(), key=lambda kv: -kv[1])[:12])}
