"""The cost model of skipping: what each piece of a decode step costs on this machine, and what a run's skips save.

Owns `cost_breakdown` (seconds per decode token of one layer's attention, what `kv` still pays when
it skips, one layer's MLP, the LM head, the whole step, measured inside whole decode steps of this
engine), `cost_line` / `costs_at` (the pieces at two contexts, and so at any: attention and the step
grow with the cache, linearly) and the arithmetic that turns skipped cells into an *estimated* speedup:
`saved_per_cell`, `ideal_speedup` (a number of skipped cells per token) and `estimate_speedup` (a
recorded Trace, each decoded token costed at its own context when the costs have a line).
An estimate removes exactly the measured cost of the skipped work and nothing else (routing's own
small cost is not counted); it is never a measurement of the run, and says so wherever it is shown.

Knows nothing about training, benchmarks or the UI: `bench speed` / `bench tradeoff` and the app's
`Resources` both call in here.
"""

from __future__ import annotations

import copy
import functools
import statistics
import time

from routerlab.core.records.trace import Trace

PIECES = ("attention_full", "attention_kv_only", "mlp", "head", "step", "routing", "overhead")


def seconds_per_call(fn, repeat: int, device="cpu") -> float:
    """Mean seconds of `fn()` over `repeat` calls after one warm-up call; on a GPU, until its queued work has run."""
    from routerlab.core.base.device import now

    fn()  # warm up
    t0 = now(device)
    for _ in range(repeat):
        fn()
    return (now(device) - t0) / repeat


def cost_breakdown(engine, ids: list[int], context: int, repeat: int = 30) -> dict[str, float]:
    """Seconds per decode token of each piece, measured inside whole decode steps at `context` cached tokens.

    Each piece is the difference between whole steps that run it and steps that do not, all timed
    in turn (so a noisy machine slows them alike), with routers on every layer in both, so router
    cost cancels: attention_full, one layer's attention sub-layer (steps with every router
    running vs every attention dropped); attention_kv_only, what `kv` still pays when it skips
    (keys/values and the cache write); mlp, one layer's MLP. Timing a piece on its own would
    under-count it: called over and over, its weights stay in the CPU caches, which a real step,
    streaming through every layer's weights, never sees. head: final norm + LM head (timed alone;
    it is larger than any CPU cache). step: the full model's step, no routers; routing: what
    routers cost when they skip nothing; overhead: the step minus all the pieces.
    """
    import torch

    from routerlab.core.base.config import RoutingConfig
    from routerlab.core.base.device import now
    from routerlab.core.ops.forward import forward
    from routerlab.core.routing.gates import Plan
    from routerlab.core.routing.router import RouterSet

    an = engine.anatomy
    n = an.n_layers
    ctx_ids = (ids * (context // max(1, len(ids)) + 1))[:context]
    every = tuple(range(n))
    attn = RouterSet.zeros(engine.model, RoutingConfig.from_granularity("attention-token", every))
    mlp = RouterSet.zeros(engine.model, RoutingConfig.from_granularity("mlp-token", every))
    plans = {  # zero routers score 0.5: threshold 0 never skips, threshold 1 always skips
        "step": lambda: Plan(None, 0.5, "kv"),
        "routed": lambda: Plan(attn, 0.0, "kv"),
        "no_attention": lambda: Plan(attn, 1.0, "drop"),
        "kv_only": lambda: Plan(attn, 1.0, "kv"),
        "routed_mlp": lambda: Plan(mlp, 0.0, "kv"),
        "no_mlp": lambda: Plan(mlp, 1.0, "kv"),
    }
    with torch.inference_mode():
        device = engine.device
        # One prefill, its cache copied for every plan: only the cache's size matters to a step's time (a plan that
        # drops every attention never reads it), and at 1,024 tokens six prefills were most of the measurement.
        base = engine.new_caches(context + 1)
        forward(an, torch.tensor([ctx_ids], device=device), torch.arange(context, device=device), base, plans["step"]())
        caches = {name: copy.deepcopy(base) for name in plans}
        token, pos = torch.tensor([[ctx_ids[-1]]], device=device), torch.tensor([context], device=device)
        times: dict[str, list[float]] = {k: [] for k in plans}
        for r in range(repeat + 1):
            order = list(plans)[r % len(plans):] + list(plans)[: r % len(plans)]
            for name in order:
                t0 = now(device)
                forward(an, token, pos, caches[name], plans[name]())
                if r:  # the first round warms up
                    times[name].append(now(device) - t0)
                for c in caches[name]:
                    c.n = min(c.n, context)  # forget the appended token: every step sees the same context

        t = {k: statistics.median(v) for k, v in times.items()}
        h = torch.randn(1, 1, an.hidden_size, dtype=engine.dtype, device=device) * 0.5
        head = seconds_per_call(lambda: an.logits(h), repeat, device)
    costs = {
        "attention_full": max(0.0, (t["routed"] - t["no_attention"]) / n),
        "attention_kv_only": max(0.0, (t["kv_only"] - t["no_attention"]) / n),
        "mlp": max(0.0, (t["routed_mlp"] - t["no_mlp"]) / n),
        "head": head,
        "step": t["step"],
        "routing": t["routed"] - t["step"],  # small: within a few ms of noise
    }
    costs["overhead"] = costs["step"] - n * (costs["attention_full"] + costs["mlp"]) - costs["head"]
    return costs


# The pieces that grow with the cache a decode step attends to (the rest, MLP and head, do not): their measured
# seconds per cached token make `costs_at` a line. Never below 0: a longer context cannot make them cheaper.
GROWS = ("attention_full", "attention_kv_only", "step")


def cost_line(engine, ids: list[int], contexts: tuple[int, int] = (128, 1024), repeat: int = 30) -> dict:
    """`cost_breakdown` at the shorter context, with `context` (it) and `per_token` (each GROWS piece's seconds per
    cached token, from the longer context's measurement): what `costs_at` reads. Contexts are capped by the model's."""
    short, long = sorted(max(2, min(c, engine.max_context - 2)) for c in contexts)
    near, far = cost_breakdown(engine, ids, short, repeat), cost_breakdown(engine, ids, long, repeat)
    slope = {k: max(0.0, (far[k] - near[k]) / max(1, long - short)) for k in GROWS}
    return dict(near, context=float(short), per_token=slope, long_context=float(long))


def costs_at(costs: dict, context: float | None) -> dict:
    """The pieces at `context` cached tokens: along the costs' line (`cost_line`), or as measured when they have
    none (one context) or no context is given. Only the GROWS pieces move (the rest, `overhead` too, as measured)."""
    slope = costs.get("per_token") if isinstance(costs, dict) else None
    if not slope or context is None or "context" not in costs:
        return costs
    d = float(context) - float(costs["context"])
    out = dict(costs, context=float(context))
    for k in GROWS:
        out[k] = max(0.0, costs[k] + slope.get(k, 0.0) * d)
    return out


@functools.lru_cache(maxsize=16)
def standin_seconds(hidden_size: int, rank: int, repeat: int = 200) -> float:
    """Seconds one skip stand-in of `rank` costs a decode token (one token through up(silu(down(x))) and
    the add), timed on its own once per process: a few small products, mostly dispatch."""
    import torch

    from routerlab.core.routing.standin import StandIn

    if rank <= 0:
        return 0.0
    standin, x = StandIn(hidden_size, rank), torch.randn(1, 1, hidden_size)
    with torch.inference_mode():
        return seconds_per_call(lambda: x + standin(x), repeat)


def saved_per_cell(costs: dict[str, float], policy: str, target: str = "attention", standin: float = 0.0) -> float:
    """Seconds one skipped cell (one routed sub-layer, one token) saves: never below 0 (noise in the
    measured pieces cannot turn a skip into a cost), 0 under `mask` (it computes everything).
    `standin`: seconds the skipped cell's stand-in costs instead (`standin_seconds`), 0 without one."""
    if policy == "mask":
        return 0.0
    attention = costs["attention_full"] - (costs["attention_kv_only"] if policy == "kv" else 0.0)
    if target == "attention":
        return max(0.0, attention - standin)
    mlp = costs["mlp"]
    return max(0.0, (mlp if target == "mlp" else max(0.0, attention) + mlp) - standin)


def ideal_speedup(costs: dict[str, float], skipped_cells: float, policy: str, target: str = "attention",
                  standin: float = 0.0, context: float | None = None) -> float:
    """Speedup if skipping `skipped_cells` cells per decode token removed exactly their measured cost and
    nothing else (less `standin` seconds per skipped cell for a set with stand-ins); at `context` cached tokens
    when the costs have a line (`cost_line`)."""
    costs = costs_at(costs, context)
    saved = skipped_cells * saved_per_cell(costs, policy, target, standin)
    return costs["step"] / max(1e-9, costs["step"] - saved)


def estimate_speedup(trace: Trace, costs: dict[str, float] | None, threshold: float | None = None) -> float | None:
    """A run's estimated decode speedup over the full model, from `cost_breakdown` figures: every
    decoded token costs the full model's measured step, minus the measured cost of the cells it
    skipped (recorded decisions, or what-if at `threshold`) under the run's target and KV policy.
    With a `cost_line`, each token's step and cells are costed at its own context (its position: the
    tokens before it), so a long prompt's run is estimated at the context it really decoded at.
    (Under `drop` a skipped token also leaves later tokens less cache to read: not counted.)

    At least 1 by construction. None when there are no costs or no decoded token yet. The tokens
    counted are those `Trace.decode_tokens_per_second` counts (a forward pass was timed).
    """
    if not costs or not costs.get("step"):
        return None
    decoded = [j for j, s in enumerate(trace.steps) if not s.is_prompt and s.seconds > 0]
    if not decoded:
        return None
    target = trace.meta.get("target") or "attention"  # as trace.savings reads it; the full model skips no cell
    policy = trace.meta.get("kv_policy_effective", trace.meta.get("kv_policy", "kv"))
    if threshold is None:  # the recorded decisions: no matrix to build (this runs once a second while streaming)
        skipped = [trace.steps[j].skipped for j in decoded]
    else:
        matrix = trace.executed_matrix(threshold)
        skipped = [sum(row[j] is False for row in matrix) for j in decoded]
    rank = int(trace.meta.get("standin_rank") or 0)
    standin = standin_seconds(int(trace.meta["hidden_size"]), rank) if rank and trace.meta.get("hidden_size") else 0.0
    if not costs.get("per_token"):  # one measured context: every token alike
        per_cell = saved_per_cell(costs, policy, target, standin)
        total = len(decoded) * costs["step"]
        return total / max(1e-9, total - sum(skipped) * per_cell)
    total = saved = 0.0
    for j, n in zip(decoded, skipped):
        at = costs_at(costs, trace.steps[j].position)
        total += at["step"]
        saved += n * saved_per_cell(at, policy, target, standin)
    return total / max(1e-9, total - saved)


def context_of(trace: Trace) -> float | None:
    """The mean context (cached tokens) the run's decoded tokens attended to: what its estimate is costed at."""
    positions = [s.position for s in trace.steps if not s.is_prompt and s.seconds > 0]
    return sum(positions) / len(positions) if positions else None
