"""`bench precision`: the same routers on the same held-out answers with the base in float32, in bfloat16, and
on the default path (bfloat16 with the model's low-bit weights at decode, every response token a decode step).

Reports, for each precision, the full and routed model's perplexity, KL from that precision's own
full model and the skip rate at the routers' default threshold, and how many routing decisions
bfloat16 flips: (a) scored at full depth (only the router inputs differ), (b) as the routed model
runs (a flip early in a sequence also changes what later layers see). The bf16 model is the fp32
one rounded, so the comparison isolates precision. The default path is scored as it generates (one
decode step per response token, `stepwise_forward`), against the float32 model: its perplexity, its KL
from the float32 model, and the routing decisions it flips as routed. Writes assets/bench/precision.json
with --save.

Knows nothing about the UI.
"""

from __future__ import annotations

import copy
import time

import torch

from routerlab.core.base.precision import describe, dtype_name
from routerlab.core.kernels import low_paths
from routerlab.core.model.models import load_model
from routerlab.core.model.anatomy import Anatomy
from routerlab.core.routing.gates import Plan
from routerlab.tuning.checkpoint import resolve_routers
from routerlab.tuning.data import encode_all, load_records
from routerlab.tuning.evaluate import evaluate_examples, full_depth
from routerlab.tuning.forward import stepwise_forward, student_forward

DEFAULT_DATA = "assets/data/selfdistill_extra.jsonl"


@torch.no_grad()
def decisions(anatomy, routers, examples, threshold: float, policy: str, routed: bool, stepwise: bool = False) -> torch.Tensor:
    """1 where a routed response cell runs, 0 where it skips (flat over examples, unrouted cells dropped)."""
    out = []
    device = anatomy.embed.weight.device
    run = stepwise_forward if stepwise else student_forward
    for ex in examples:
        ids = torch.tensor([ex.ids], device=device)
        plan = Plan(routers, threshold if routed else 0.0, policy)  # threshold 0: nothing skips, scores at full depth
        _, scores = run(anatomy, ids, ex.start, plan, logits=False)
        s = scores[ex.start:].flatten().float().cpu()
        out.append(s[~torch.isnan(s)] >= threshold)
    return torch.cat(out)


def precision_report(model_spec: str | None = None, data: str = DEFAULT_DATA, split: str = "heldout", limit: int | None = None,
                     granularity: str = "attention-token", routers_path: str | None = None, quantize: str = "auto",
                     log=print) -> dict:
    fp32 = load_model(model_spec, device="cpu", dtype="float32", quantize=quantize)
    models = {"float32": fp32.model, "bfloat16": copy.deepcopy(fp32.model).to(torch.bfloat16)}
    examples = encode_all(load_records(data, split), fp32.tokenizer)[:limit]
    out = {"model": fp32.name, "data": data, "split": split, "examples": len(examples), "granularity": granularity}
    found, fulls = {}, {}
    for name, model in models.items():
        routers, defaults = resolve_routers(routers_path, granularity, model)
        anatomy = Anatomy(model)
        threshold, policy = defaults["threshold"], defaults["kv_policy"]
        t0 = time.perf_counter()
        fulls[name] = full_depth(anatomy, examples)
        result = evaluate_examples(anatomy, examples, routers, threshold, policy, full=fulls[name])
        found[name] = {
            "full": decisions(anatomy, routers, examples, threshold, policy, routed=False),
            "routed": decisions(anatomy, routers, examples, threshold, policy, routed=True),
        }
        out[name] = {
            "precision": describe(next(model.parameters()).dtype, "cpu"),
            "seconds": time.perf_counter() - t0,
            **{k: result[k] for k in ("perplexity_full", "perplexity_routed", "perplexity_increase", "kl_full",
                                      "agreement", "skip_rate", "skip_rate_all_layers", "tokens", "threshold")},
        }
        log(f"{name}: full ppl {result['perplexity_full']:.4f}, routed {result['perplexity_routed']:.4f} "
            f"({result['perplexity_increase']:+.2%}), skip {result['skip_rate_all_layers']:.2%} of all layers, "
            f"{out[name]['seconds']:.0f} s")
    a, b = out["float32"], out["bfloat16"]
    out["perplexity_full_bf16_vs_fp32"] = b["perplexity_full"] / a["perplexity_full"] - 1.0
    out["perplexity_routed_bf16_vs_fp32"] = b["perplexity_routed"] / a["perplexity_routed"] - 1.0
    for kind in ("full", "routed"):
        x, y = found["float32"][kind], found["bfloat16"][kind]
        n = min(len(x), len(y))  # equal: same tokens, same routed layers
        out[f"decisions_flipped_{kind}"] = float((x[:n] != y[:n]).float().mean())
        out["routed_cells"] = n
    out["dtype_names"] = [dtype_name(torch.float32), dtype_name(torch.bfloat16)]
    if fp32.lowbit is not None:
        out["default"] = default_path(models["bfloat16"], fp32.lowbit, fulls["float32"], examples, routers_path, granularity,
                                      found["float32"]["routed"], log)
    return out


def default_path(model, lowbit, reference, examples, routers_path, granularity: str, fp32_routed: torch.Tensor, log) -> dict:
    """The bf16 model with its low-bit weights at decode, scored one decode step per response token,
    against the float32 model (teacher-forced: the same numbers a float32 generation computes)."""
    anatomy = Anatomy(model, lowbit)  # `reference`: the float32 model's full_depth figures
    kernels = low_paths.tune(anatomy)  # each kind's one-row product as the app chooses it on this machine
    weights = low_paths.weights_label(lowbit.label, anatomy)
    t0 = time.perf_counter()
    own = evaluate_examples(anatomy, examples, None, full=reference, stepwise=True)  # no routers: the model vs fp32
    routers, defaults = resolve_routers(routers_path, granularity, model)
    threshold, policy = defaults["threshold"], defaults["kv_policy"]
    routed = evaluate_examples(anatomy, examples, routers, threshold, policy, stepwise=True)
    runs = decisions(anatomy, routers, examples, threshold, policy, routed=True, stepwise=True)
    n = min(len(runs), len(fp32_routed))
    result = {
        "weights": weights,
        "kernels": kernels,
        "seconds": time.perf_counter() - t0,
        "perplexity_full": own["perplexity_routed"],
        "perplexity_full_fp32": own["perplexity_full"],
        "perplexity_full_vs_fp32": own["perplexity_routed"] / own["perplexity_full"] - 1.0,
        "kl_from_fp32": own["kl_full"],
        "agreement_with_fp32": own["agreement"],
        **{k: routed[k] for k in ("perplexity_routed", "perplexity_increase", "kl_full", "agreement", "skip_rate",
                                  "skip_rate_all_layers", "tokens", "threshold")},
        "decisions_flipped_routed": float((runs[:n] != fp32_routed[:n]).float().mean()),
    }
    result["step_graph"] = step_graph_path(anatomy, examples, reference, log)
    log(f"default path ({weights}): full ppl {result['perplexity_full']:.4f} ({result['perplexity_full_vs_fp32']:+.2%} vs "
        f"fp32), KL from fp32 {result['kl_from_fp32']:.4f}, routed ppl {result['perplexity_routed']:.4f} "
        f"({result['perplexity_increase']:+.2%}), decisions flipped {result['decisions_flipped_routed']:.2%}, {result['seconds']:.0f} s")
    return result


def step_graph_path(anatomy, examples, reference, log) -> dict:
    """The full model decoding through the step graph (core/graph/step_graph.py: the whole step as one onnxruntime graph,
    fp32 activations, 8-bit products) after the default path's own prefill, teacher-forced, against the float32 model;
    {"skipped": reason} where it cannot run."""
    from routerlab.core.graph import step_graph
    from routerlab.core.model.cache import LayerCache
    from routerlab.core.ops.forward import forward

    reason = step_graph.why_not(anatomy)
    if reason is not None:
        return {"skipped": reason}
    graph = step_graph.StepGraph(anatomy, max(len(ex.ids) for ex in examples) + 1)

    def through_graph(an, ids, start, plan, logits=True):
        t = ids.shape[1]
        caches = [LayerCache(p.attn, t, an.dtype, ids.device) for p in an.layers]
        out, _ = forward(an, ids[:, :start], torch.arange(start), caches, plan)  # the prompt; predicts ids[start]
        graph.load(caches, t - start)
        rows = [out[0, -1].float()] + [graph.step(int(ids[0, p])).clone() for p in range(start, t - 1)]
        return torch.stack(rows)[None], torch.full((t, an.n_layers), float("nan"))

    t0 = time.perf_counter()
    own = evaluate_examples(anatomy, examples, None, full=reference, run=through_graph)
    result = {"seconds": time.perf_counter() - t0, "perplexity_full": own["perplexity_routed"],
              "perplexity_full_vs_fp32": own["perplexity_routed"] / own["perplexity_full"] - 1.0,
              "kl_from_fp32": own["kl_full"], "agreement_with_fp32": own["agreement"]}
    log(f"step graph (the full model, one onnxruntime graph a step): ppl {result['perplexity_full']:.4f} "
        f"({result['perplexity_full_vs_fp32']:+.2%} vs fp32), KL from fp32 {result['kl_from_fp32']:.4f}, "
        f"top-1 agreement {result['agreement_with_fp32']:.2%}, {result['seconds']:.0f} s")
    return result


def format_precision(r: dict) -> str:
    a, b = r["float32"], r["bfloat16"]
    lines = [f"bench precision: {r['model']}, {r['granularity']} routers at threshold {a['threshold']}, "
             f"{r['examples']} {r['split']} examples of {r['data']} ({a['tokens']} response tokens)"]
    for name, x in (("float32", a), ("bfloat16", b)):
        lines.append(f"  {name:<9} full ppl {x['perplexity_full']:.4f}  routed ppl {x['perplexity_routed']:.4f} "
                     f"({x['perplexity_increase']:+.2%})  KL {x['kl_full']:.4f}  skip {x['skip_rate_all_layers']:.2%} of all layers")
    lines.append(f"  bf16 vs fp32: full ppl {r['perplexity_full_bf16_vs_fp32']:+.2%}, routed ppl {r['perplexity_routed_bf16_vs_fp32']:+.2%}; "
                 f"decisions flipped {r['decisions_flipped_full']:.2%} (scored at full depth), "
                 f"{r['decisions_flipped_routed']:.2%} (as routed) of {r['routed_cells']} routed cells")
    d = r.get("default")
    if d:
        lines.append(f"  default path ({d['weights']}; every response token a decode step): full ppl {d['perplexity_full']:.4f} "
                     f"({d['perplexity_full_vs_fp32']:+.2%} vs float32), KL from float32 {d['kl_from_fp32']:.4f}, top-1 agreement "
                     f"{d['agreement_with_fp32']:.2%}; routed ppl {d['perplexity_routed']:.4f} ({d['perplexity_increase']:+.2%}), "
                     f"skip {d['skip_rate_all_layers']:.2%} of all layers; decisions flipped vs float32 {d['decisions_flipped_routed']:.2%} (as routed)")
        g = d.get("step_graph") or {}
        if g.get("skipped"):
            lines.append(f"  step graph: not measured ({g['skipped']})")
        elif g:
            lines.append(f"  step graph (the full model, the whole decode step as one onnxruntime graph; the engine's path where it measures faster at start-up): "
                         f"ppl {g['perplexity_full']:.4f} ({g['perplexity_full_vs_fp32']:+.2%} vs float32), KL from float32 "
                         f"{g['kl_from_fp32']:.4f}, top-1 agreement {g['agreement_with_fp32']:.2%}")
    return "\n".join(lines)
