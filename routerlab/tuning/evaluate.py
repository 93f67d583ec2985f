"""Quality of routed depth: perplexity, greedy agreement with the full model, skip rates; two baselines.

Every number comes from one run that scores the full-depth model and the routed model on the
same tokens. The routed forward is the engine's own, with REAL skipping (`kv` policy by default)
over the whole teacher-forced sequence; sequence-level routers decide from the prompt first, as
at generation. Skip rates count the response tokens' cells:
  skip_rate             skipped / routed (token, layer) cells
  skip_rate_all_layers  skipped / every layer's cells of the routed target (all L layers)
  skip_rate_prompt      skipped / routed cells of the prompt tokens (routed too, but not counted above)

kl_full is the mean KL(full || routed) per response token, in nats: how far the routed model's
next-token distribution is from the full model's, whatever the text. Perplexity on the full
model's own greedy answers is not such a distance: a routed model that is more sure of the full
model's favourite token scores lower there even while its distribution moves away (see README).

Baselines, built as router sets so the engine stays untouched:
  random  each routed (token, layer) cell skipped with probability p (seeded uniform "scores",
          threshold p)
  static  the k layers whose target sub-layer changes its input least (highest cosine between the
          hidden state before and after its residual update, measured on the data) skipped always
          (zero routers, score 0.5, under threshold 0.51)

Knows nothing about training or the UI.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from routerlab.core.base.config import RoutingConfig, check_kv_policy, check_threshold, default_layers
from routerlab.core.base.errors import RouterLabError
from routerlab.core.records.quality import KL_TOP, kl_top_k
from routerlab.core.routing.router import RouterSet

BASELINES = ("random", "static")
STATIC_THRESHOLD = 0.51  # a zero router scores 0.5: under this threshold it always skips


# -- baselines as router sets ------------------------------------------------------------------
class RandomRouter(torch.nn.Module):
    """Scores are seeded uniform numbers: under threshold p, each cell is skipped with probability p."""

    def __init__(self, generator: torch.Generator):
        super().__init__()
        self.generator = generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.rand(x.shape[:-1], generator=self.generator).to(x.device)  # (B, T)

    def score_one(self, x: torch.Tensor) -> float:
        return float(torch.rand((), generator=self.generator))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        p = self.forward(x).clamp(1e-6, 1 - 1e-6)
        return torch.log(p) - torch.log1p(-p)


class RandomRouterSet:
    """Duck-typed RouterSet of RandomRouters; one per request (its generator is per-request state)."""

    def __init__(self, config: RoutingConfig, n_layers: int, hidden_size: int, seed: int = 0):
        self.config, self.n_layers, self.hidden_size = config, n_layers, hidden_size
        self.generator = torch.Generator().manual_seed(seed)
        self._r = {i: RandomRouter(self.generator) for i in config.layers}

    def get(self, layer: int):
        return self._r.get(layer)

    def standin(self, layer: int):
        return None  # random skipping is plain skipping

    @property
    def granularity(self) -> str:
        return self.config.granularity


def static_routers(order: list[int], k: int, target: str, n_layers: int, hidden_size: int) -> RouterSet | None:
    """Zero routers on the k least important layers (skip them always under STATIC_THRESHOLD)."""
    if k <= 0:
        return None
    config = RoutingConfig(target=target, level="token", layers=tuple(order[:k]))
    return RouterSet(config, n_layers, hidden_size)


@torch.no_grad()
def layer_importance(anatomy, examples, target: str = "attention", limit: int = 32) -> list[float]:
    """Mean cosine similarity between the hidden state before and after each layer's `target` update.

    High similarity = the sub-layer changes its input little = least important. Measured on the
    response tokens of up to `limit` examples, full depth.
    """
    from routerlab.tuning.forward import layer_walk

    sums = torch.zeros(anatomy.n_layers, dtype=torch.float64)
    count = 0
    for ex in examples[:limit]:
        ids = torch.tensor([ex.ids], device=anatomy.embed.weight.device)
        for i, before, _, mid, _, h in layer_walk(anatomy, ids):
            a, b = {"attention": (before, mid), "mlp": (mid, h), "block": (before, h)}[target]
            cos = torch.nn.functional.cosine_similarity(a[0, ex.start:].float(), b[0, ex.start:].float(), dim=-1)
            sums[i] += float(cos.sum())
        count += ex.n_response
    return (sums / max(1, count)).tolist()


def static_order(importance: list[float]) -> list[int]:
    """Layers from least to most important (highest cosine first)."""
    return sorted(range(len(importance)), key=lambda i: -importance[i])


@torch.no_grad()
def response_scores(anatomy, routers: RouterSet, examples) -> torch.Tensor:
    """The routers' scores of every routed response cell of `examples`, sorted (scored at full depth)."""
    from routerlab.core.routing.gates import Plan
    from routerlab.tuning.forward import student_forward

    device = anatomy.embed.weight.device
    scores = torch.cat([student_forward(anatomy, torch.tensor([e.ids], device=device), e.start, Plan(routers, 0.0), logits=False)[1][e.start:]
                        .flatten().cpu() for e in examples])
    scores = scores[~torch.isnan(scores)].sort().values
    if not len(scores):
        raise RouterLabError("These routers scored no response token.", "Check the data and the routed layers.")
    return scores


def thresholds_for_skips(anatomy, routers: RouterSet, examples, skips) -> list[float]:
    """Thresholds at which `routers` skip about each fraction in `skips` of their routed response cells.

    Quantiles of the routers' own scores on `examples` (scored at full depth, so the realised
    skip rates differ a little; every sweep reports the measured ones). Trained routers' scores
    cluster near 0.5, so a fixed grid such as 0.3..0.9 would mostly skip nothing or everything.
    """
    scores = response_scores(anatomy, routers, examples)
    return [score_quantile(scores, f) for f in skips]


def score_quantile(scores: torch.Tensor, frac: float) -> float:
    """The threshold under which about `frac` of the sorted `scores` fall (6 decimals)."""
    return round(float(scores[min(len(scores) - 1, max(0, int(frac * len(scores))))]), 6)


# -- one evaluation ------------------------------------------------------------------------------
@dataclass
class _Full:
    """Per-example full-depth figures, cached across the points of a sweep."""

    nll: torch.Tensor  # (R,) negative log-likelihood of each response token
    argmax: torch.Tensor  # (R,)
    top_logp: torch.Tensor  # (R, k) the full model's k largest log-probabilities at each position
    top_ids: torch.Tensor  # (R, k) their token ids


def kl_to_full(full: _Full, logp: torch.Tensor) -> torch.Tensor:
    """KL(full || routed) at each response position (R,), nats, from the routed log-probs `logp` (R, V).

    The definition generation's per-token `kl_full` uses too (core/records/quality.py): exact over the full
    model's top-k tokens, the remaining tokens as one bucket.
    """
    return kl_top_k(full.top_logp, full.top_ids, logp)


@torch.no_grad()
def full_depth(anatomy, examples, top: int = KL_TOP, stepwise: bool = False) -> list[_Full]:
    """The full model's figures on each example; `stepwise`: one decode step per response token
    (tuning.forward.stepwise_forward), as generation computes them."""
    from routerlab.core.ops.forward import forward
    from routerlab.core.routing.gates import Plan
    from routerlab.tuning.forward import response_slice, stepwise_forward

    out = []
    for ex in examples:
        ids = torch.tensor([ex.ids], device=anatomy.embed.weight.device)
        if stepwise:
            logits, _ = stepwise_forward(anatomy, ids, ex.start, Plan(None))
        else:
            logits, _ = forward(anatomy, ids, torch.arange(ids.shape[1], device=ids.device), None, Plan(None),
                                logits_at=response_slice(ex.start))
        logp = torch.log_softmax(logits[0].float(), dim=-1)
        labels = ids[0, ex.start:]
        top_logp, top_ids = logp.topk(min(top, logp.shape[-1]), dim=-1)
        out.append(_Full(-logp.gather(1, labels[:, None])[:, 0].cpu(), logp.argmax(-1).cpu(), top_logp.cpu(), top_ids.cpu()))
    return out


@torch.no_grad()
def evaluate_examples(anatomy, examples, routers, threshold: float = 0.5, kv_policy: str = "kv",
                      full: list[_Full] | None = None, stepwise: bool = False, run=None) -> dict:
    """Full vs routed on tokenized examples. `routers` may be a RouterSet, a baseline set, or None.
    `stepwise`: every response token as its own decode step, as generation computes it (the low-bit
    weights, where the model has them); else one teacher-forced forward per example. `run`: another
    forward with `student_forward`'s signature and outputs (e.g. bench precision's step graph)."""
    from routerlab.core.routing.gates import Plan
    from routerlab.tuning.forward import stepwise_forward, student_forward

    check_threshold(threshold)
    check_kv_policy(kv_policy)
    full = full if full is not None else full_depth(anatomy, examples, stepwise=stepwise)
    run = run or (stepwise_forward if stepwise else student_forward)
    nll_full = nll_routed = kl = 0.0
    agree = tokens = skipped = routed_cells = prompt_skipped = prompt_cells = 0
    per_layer_skip = torch.zeros(anatomy.n_layers, dtype=torch.float64)
    for ex, f in zip(examples, full):
        ids = torch.tensor([ex.ids], device=anatomy.embed.weight.device)
        plan = Plan(routers, threshold, kv_policy)
        logits, scores = run(anatomy, ids, ex.start, plan)
        logp = torch.log_softmax(logits[0].float(), dim=-1)
        labels = ids[0, ex.start:]
        nll_routed += float(-logp.gather(1, labels[:, None]).sum())
        nll_full += float(f.nll.sum())
        kl += float(kl_to_full(f, logp).sum())
        agree += int((logp.argmax(-1).cpu() == f.argmax).sum())
        tokens += labels.numel()
        p = scores[: ex.start].cpu()
        prompt_skipped += int((p < threshold).sum())  # NaN (unrouted) compares False
        prompt_cells += int((~torch.isnan(p)).sum())
        s = scores[ex.start:].cpu()  # (R, L), NaN where unrouted
        routed = ~torch.isnan(s)
        skip = routed & (s < threshold)
        skipped += int(skip.sum())
        routed_cells += int(routed.sum())
        per_layer_skip += skip.sum(0).double()
    n_layers = anatomy.n_layers
    config = routers.config if routers is not None else None
    return {
        "perplexity_full": math.exp(nll_full / tokens),
        "perplexity_routed": math.exp(nll_routed / tokens),
        "perplexity_increase": math.exp((nll_routed - nll_full) / tokens) - 1.0,
        "agreement": agree / tokens,
        "kl_full": kl / tokens,
        "skip_rate": skipped / routed_cells if routed_cells else 0.0,
        "skip_rate_all_layers": skipped / (tokens * n_layers),
        "skip_rate_per_layer": {str(i): round(float(per_layer_skip[i]) / tokens, 4) for i in (config.layers if config else ())},
        "skip_rate_prompt": prompt_skipped / prompt_cells if prompt_cells else 0.0,
        "tokens": tokens,
        "examples": len(examples),
        "threshold": threshold,
        "granularity": config.granularity if config else "full",
        "routed_layers": list(config.layers) if config else [],
        "kv_policy": kv_policy,
    }


def baseline_set(kind: str, anatomy, examples, granularity: str, skip_rate_all_layers: float,
                 layers: tuple[int, ...] | None = None, seed: int = 0, importance: list[float] | None = None):
    """(routers, threshold, info) of a baseline at (about) `skip_rate_all_layers`."""
    config = RoutingConfig.from_granularity(granularity, layers if layers is not None else default_layers(anatomy.n_layers))
    n, d = anatomy.n_layers, anatomy.hidden_size
    if kind == "random":
        p = min(1.0, skip_rate_all_layers * n / len(config.layers))  # per routed cell
        return RandomRouterSet(config, n, d, seed), p, {"baseline": "random", "p": p}
    if kind == "static":
        importance = importance if importance is not None else layer_importance(anatomy, examples, config.target)
        order = static_order(importance)
        k = int(round(skip_rate_all_layers * n))
        routers = static_routers(order, k, config.target, n, d)
        return routers, STATIC_THRESHOLD, {"baseline": "static", "k": k, "dropped_layers": order[:k],
                                           "importance": [round(x, 4) for x in importance]}
    raise RouterLabError(f"Unknown baseline {kind!r}.", f"Choose one of: {', '.join(BASELINES)}.")


def sweep(anatomy, examples, routers: RouterSet, thresholds, *, random_p=(), static_k=(), seed: int = 0,
          kv_policy: str = "kv", log=print) -> dict:
    """The skip-rate vs perplexity curve of the tuned routers and both baselines, on the same tokens."""
    full = full_depth(anatomy, examples)
    out = {"tuned": [], "random": [], "static": []}
    for t in thresholds:
        r = evaluate_examples(anatomy, examples, routers, t, kv_policy, full)
        out["tuned"].append(r)
        log(_row(f"tuned t={t:.4f}", r))
    config = routers.config
    n, d = anatomy.n_layers, anatomy.hidden_size
    for p in random_p:
        rs = RandomRouterSet(config, n, d, seed)
        r = {**evaluate_examples(anatomy, examples, rs, p, kv_policy, full), "baseline": "random", "p": p}
        out["random"].append(r)
        log(_row(f"random p={p:.4f}", r))
    if static_k:
        importance = layer_importance(anatomy, examples, config.target)
        order = static_order(importance)
        out["importance"] = importance
        for k in static_k:
            rs = static_routers(order, k, config.target, n, d)
            r = {**evaluate_examples(anatomy, examples, rs, STATIC_THRESHOLD, kv_policy, full), "baseline": "static",
                 "k": k, "dropped_layers": order[:k]}
            out["static"].append(r)
            log(_row(f"static k={k} {order[:k]}", r))
    return out


def calibrate(points: list[dict], max_increase: float = 0.02) -> dict | None:
    """The sweep point that skips most while the perplexity rises at most `max_increase`."""
    ok = [p for p in points if p["perplexity_increase"] <= max_increase]
    return max(ok, key=lambda p: p["skip_rate_all_layers"]) if ok else None


def plot_sweep(result: dict, path, title: str = "skip rate vs perplexity") -> None:
    """Plotly HTML of perplexity increase vs skip rate (all layers) for tuned, random, static."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for name in ("tuned", "random", "static"):
        pts = sorted(result.get(name, []), key=lambda p: p["skip_rate_all_layers"])
        if pts:
            fig.add_trace(go.Scatter(x=[100 * p["skip_rate_all_layers"] for p in pts],
                                     y=[100 * p["perplexity_increase"] for p in pts], name=name, mode="lines+markers"))
    fig.update_layout(title=title, template="plotly_white", xaxis_title="attention executions skipped, all layers (%)",
                      yaxis_title="perplexity increase vs full depth (%)", height=450, width=750)
    fig.write_html(str(path), include_plotlyjs="cdn")


# -- the command ---------------------------------------------------------------------------------
def _row(name: str, r: dict) -> str:
    return (f"{name:<28} ppl {r['perplexity_routed']:8.4f} ({r['perplexity_increase']:+.2%})  agreement {r['agreement']:.1%}  "
            f"KL {r['kl_full']:.4f}  skip {r['skip_rate']:.1%} routed / {r['skip_rate_all_layers']:.1%} all layers "
            f"(prompt {r['skip_rate_prompt']:.1%} routed)")


def run_eval(args) -> dict:
    """`python -m routerlab eval`: one JSON-able dict (with a `_text` rendering for the terminal)."""
    from routerlab.core.model.models import load_model
    from routerlab.core.model.anatomy import Anatomy
    from routerlab.tuning.checkpoint import resolve_routers
    from routerlab.tuning.data import examples_of, load_records

    if args.granularity != "full":
        RoutingConfig.from_granularity(args.granularity)
    if args.threshold is not None:
        check_threshold(args.threshold)
    if args.kv_policy is not None:
        check_kv_policy(args.kv_policy)
    split = args.split or ("heldout" if args.data is None else "all")
    records = load_records(args.data, split)  # fail on bad data before loading the model
    loaded = load_model(args.model, device=args.device, trust_remote_code=args.trust_remote_code, dtype=args.dtype)
    routers, defaults = resolve_routers(args.routers, args.granularity, loaded.model)
    long = getattr(args, "long", 0) or 0
    examples = examples_of(records, loaded.tokenizer, long)[: args.limit]
    anatomy = Anatomy(loaded.model)
    threshold = defaults["threshold"] if args.threshold is None else args.threshold
    policy = args.kv_policy or defaults["kv_policy"]
    meta = {"model": loaded.name, "routers": defaults.get("source"), "data": str(args.data or "built-in"), "split": split,
            **({"long_inputs": long} if long else {})}
    if args.sweep:
        if routers is None:
            raise RouterLabError("--sweep needs routers.", "Pass --granularity attention-token (or --routers PATH).")
        try:
            thresholds = [check_threshold(float(t)) for t in args.sweep.split(",") if t.strip()]
        except ValueError:
            raise RouterLabError(f"--sweep {args.sweep!r} is not a list of numbers.", "Use e.g. 0.4,0.45,0.5.") from None
        lines: list[str] = []
        full = full_depth(anatomy, examples)
        tuned = [evaluate_examples(anatomy, examples, routers, t, policy, full) for t in thresholds]
        rates = sorted({round(r["skip_rate_all_layers"], 4) for r in tuned if r["skip_rate_all_layers"] > 0})
        n = anatomy.n_layers
        random_p = [min(1.0, s * n / len(routers.config.layers)) for s in rates]
        ks = sorted({max(1, int(round(s * n))) for s in rates})
        curve = sweep(anatomy, examples, routers, [], random_p=random_p, static_k=ks, seed=args.seed, kv_policy=policy,
                      log=lines.append)
        curve["tuned"] = tuned
        lines[:0] = [_row(f"tuned t={r['threshold']:.4f}", r) for r in tuned]
        if args.plot:
            plot_sweep(curve, args.plot, title=f"{routers.granularity}: skip rate vs perplexity ({split})")
        text = "\n".join([f"full depth ppl {tuned[0]['perplexity_full']:.4f} on {tuned[0]['tokens']} tokens"] + lines)
        return {**meta, "granularity": routers.granularity, "kv_policy": policy, "curve": curve, "_text": text}
    result = evaluate_examples(anatomy, examples, routers, threshold, policy)
    out = {**meta, **result}
    text = [f"full depth ppl {result['perplexity_full']:.4f} on {result['tokens']} tokens ({len(examples)} examples)",
            _row(f"{result['granularity']} t={threshold:.4f}", result)]
    if args.baseline:
        config = routers.config if routers is not None else RoutingConfig.from_granularity(args.granularity)
        rate = args.skip_rate if args.skip_rate is not None else result["skip_rate_all_layers"]
        layers = config.layers or default_layers(anatomy.n_layers)
        b_routers, b_threshold, info = baseline_set(args.baseline, anatomy, examples, config.granularity, rate, layers, args.seed)
        b = evaluate_examples(anatomy, examples, b_routers, b_threshold, policy)
        b.update(info, matched_skip_rate_all_layers=rate)
        out["baseline"] = b
        text.append(_row(f"{args.baseline} baseline", b))
    out["_text"] = "\n".join(text)
    return out
