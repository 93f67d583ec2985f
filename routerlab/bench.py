"""`bench speed`: decode tokens/s of transformers' generate and of the engine, measured side by side.

Every configuration runs once per round, in a rotating order, and the report gives medians of
the per-round figures and of the per-round ratios: machines here are noisy, so only numbers
measured next to each other are compared. The ideal speedup of a skipping run comes from the
measured cost of exactly the work it skips (timed in the same process, at the same context).

Knows nothing about the UI or training.
"""

from __future__ import annotations

import statistics
import time

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from .config import GenerateConfig, RoutingConfig, default_layers
from .engine import Engine, Plan, forward
from .models import load_model
from .router import RouterSet

# A fixed English passage, repeated to any length: deterministic prompts without a data file.
PASSAGE = (
    "The history of computing is a story of layers. Early machines were wired by hand for each problem; "
    "stored programs turned wiring into data, and compilers turned programs into text that people could "
    "read. Operating systems hid the hardware, networks hid the distance between machines, and libraries "
    "hid the details of each task behind a name. Every layer made the next one possible, and every layer "
    "cost something: time, memory, or the attention of the people who had to understand it. "
)


def bench_prompt(tokenizer, n_tokens: int, vocab_size: int = 128) -> list[int]:
    """`n_tokens` of the passage (token ids `i % vocab_size` when there is no tokenizer: tiny test models)."""
    if tokenizer is None:
        return [(7 * i + 3) % vocab_size for i in range(n_tokens)]
    ids: list[int] = []
    while len(ids) < n_tokens:
        ids += tokenizer(PASSAGE, add_special_tokens=False)["input_ids"]
    return ids[:n_tokens]


class _Clock(StoppingCriteria):
    """Called by generate after each new token: a timestamp per token, no stopping."""

    def __init__(self):
        self.times: list[float] = []

    def __call__(self, input_ids, scores, **kwargs):
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def generate_rate(model, ids: list[int], new_tokens: int) -> float:
    """Decode tokens/s of transformers' own generate on the bare model (prefill excluded)."""
    clock = _Clock()
    x = torch.tensor([ids], device=model.device)
    with torch.inference_mode():
        model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       do_sample=False, stopping_criteria=StoppingCriteriaList([clock]), pad_token_id=0)
    return (len(clock.times) - 1) / (clock.times[-1] - clock.times[0])


def engine_rate(engine: Engine, ids: list[int], routers, threshold: float, policy: str, new_tokens: int) -> float:
    config = GenerateConfig(max_new_tokens=new_tokens, threshold=threshold, kv_policy=policy, ignore_eos=True,
                            max_new_tokens_cap=max(4096, new_tokens))
    seconds = [s.seconds for s in engine.generate_ids(ids, routers, config) if not s.is_prompt and s.seconds > 0]
    return len(seconds) / sum(seconds)


def _timeit(fn, repeat: int) -> float:
    fn()  # warm up
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t0) / repeat


@torch.inference_mode()
def cost_breakdown(engine: Engine, ids: list[int], context: int, repeat: int = 30) -> dict[str, float]:
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
    caches = {}
    for name, plan in plans.items():
        caches[name] = engine.new_caches(context + 1)
        forward(an, torch.tensor([ctx_ids]), torch.arange(context), caches[name], plan())
    token, pos = torch.tensor([[ctx_ids[-1]]]), torch.tensor([context])
    times: dict[str, list[float]] = {k: [] for k in plans}
    for r in range(repeat + 1):
        order = list(plans)[r % len(plans):] + list(plans)[: r % len(plans)]
        for name in order:
            t0 = time.perf_counter()
            forward(an, token, pos, caches[name], plans[name]())
            if r:  # the first round warms up
                times[name].append(time.perf_counter() - t0)
            for c in caches[name]:
                c.n = min(c.n, context)  # forget the appended token: every step sees the same context
    t = {k: statistics.median(v) for k, v in times.items()}
    h = torch.randn(1, 1, an.hidden_size, dtype=engine.dtype) * 0.5
    costs = {
        "attention_full": max(0.0, (t["routed"] - t["no_attention"]) / n),
        "attention_kv_only": max(0.0, (t["kv_only"] - t["no_attention"]) / n),
        "mlp": max(0.0, (t["routed_mlp"] - t["no_mlp"]) / n),
        "head": _timeit(lambda: an.logits(h), repeat),
        "step": t["step"],
        "routing": t["routed"] - t["step"],
    }
    costs["overhead"] = costs["step"] - n * (costs["attention_full"] + costs["mlp"]) - costs["head"]
    return costs


def ideal_speedup(costs: dict[str, float], skipped_layers: int, policy: str) -> float:
    """Speedup if skipping removed exactly the skipped work and nothing else."""
    saved_per_layer = {"mask": 0.0, "kv": costs["attention_full"] - costs["attention_kv_only"],
                       "drop": costs["attention_full"]}[policy]
    return costs["step"] / (costs["step"] - skipped_layers * saved_per_layer)


def speed_benchmark(model_spec: str | None = None, *, prompt_tokens: int = 512, new_tokens: int = 128, rounds: int = 5,
                    threads: int | None = None, loaded=None) -> dict:
    if threads:
        torch.set_num_threads(threads)
    loaded = loaded or load_model(model_spec)
    model, tok = loaded.model, loaded.tokenizer
    engine = Engine(model, tok, loaded.name)
    n = engine.n_layers
    ids = bench_prompt(tok, prompt_tokens)
    never = RouterSet.zeros(model, RoutingConfig.from_granularity("attention-token", default_layers(n)))
    deep = tuple(range(n // 2, n))  # the deeper half of all layers
    forced = RouterSet.zeros(model, RoutingConfig.from_granularity("attention-token", deep))
    runs = {
        "generate": lambda: generate_rate(model, ids, new_tokens),
        "engine_never_skip": lambda: engine_rate(engine, ids, never, 0.0, "kv", new_tokens),
        "deep_off_mask": lambda: engine_rate(engine, ids, forced, 1.0, "mask", new_tokens),
        "deep_off_kv": lambda: engine_rate(engine, ids, forced, 1.0, "kv", new_tokens),
        "deep_off_drop": lambda: engine_rate(engine, ids, forced, 1.0, "drop", new_tokens),
    }
    names = list(runs)
    rates: dict[str, list[float]] = {k: [] for k in names}
    engine_rate(engine, ids[:64], never, 0.0, "kv", 8)  # warm-up
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:  # rotate the order each round
            rates[name].append(runs[name]())
    costs = cost_breakdown(engine, ids, prompt_tokens + new_tokens // 2)

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(rates[a], rates[b]))

    result = {
        "model": loaded.name,
        "device": str(engine.device),
        "threads": torch.get_num_threads(),
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "rounds": rounds,
        "skipped_layers": list(deep),
        "tokens_per_second": {k: statistics.median(v) for k, v in rates.items()},
        "engine_vs_generate": ratio("engine_never_skip", "generate"),
        "speedup": {p: ratio(f"deep_off_{p}", "engine_never_skip") for p in ("mask", "kv", "drop")},
        "ideal_speedup": {p: ideal_speedup(costs, len(deep), p) for p in ("mask", "kv", "drop")},
        "cost_seconds": costs,
    }
    result["drop_speedup"] = result["speedup"]["drop"]
    result["fraction_of_ideal"] = {p: result["speedup"][p] / result["ideal_speedup"][p] for p in result["speedup"]}
    return result


def format_speed(r: dict) -> str:
    tps = r["tokens_per_second"]
    lines = [
        f"bench speed: {r['model']} on {r['device']} ({r['threads']} threads), prompt {r['prompt_tokens']} tokens, "
        f"{r['new_tokens']} new tokens, {r['rounds']} interleaved rounds (medians)",
        f"  transformers generate (bare model)      {tps['generate']:7.2f} tok/s",
        f"  engine, routers attached, never skip    {tps['engine_never_skip']:7.2f} tok/s   engine_vs_generate {r['engine_vs_generate']:.3f}",
    ]
    for p in ("mask", "kv", "drop"):
        lines.append(f"  engine, layers {r['skipped_layers'][0]}-{r['skipped_layers'][-1]} attention off, {p:<4}   "
                     f"{tps['deep_off_' + p]:7.2f} tok/s   speedup {r['speedup'][p]:.3f}  ideal {r['ideal_speedup'][p]:.3f}  "
                     f"({r['fraction_of_ideal'][p]:.0%} of ideal)")
    c = r["cost_seconds"]
    lines.append("  cost per decode token (ms): " + ", ".join(
        f"{k} {v * 1e3:.3f}" for k, v in c.items()) + "  [attention/mlp: one layer]")
    return "\n".join(lines)
