"""The numbers each slide figure shows, as plain dicts: what slides/draw.py draws and numbers.json holds.

Owns one function per figure (`heatmap`, `layers`, `ladder`, `kv` from Traces; `tradeoff` from the drawn
figure's own traces), `machine` (where the runs were timed) and `rounded` (the file's floats, 5 decimals).
Speeds are the Compare tab's (`compare.lockstep_speeds`: decode tokens/s with the quality pass's time taken out, over the
tokens every run of a figure decoded in the same lockstep rounds, each speedup the median of the rounds' ratios);
a "first difference" is the 1-based index of the first generated token that is not the full model's (None:
the same text). Knows nothing about plotly styling or files.
"""

from __future__ import annotations

import os

from routerlab.core.records.trace import Trace, savings
from routerlab.ui.figures import plots
from routerlab.ui.tabs.compare import decode_speed, ladder_rows, lockstep_speeds, shared_tokens


def _first_difference(full: Trace | None, trace: Trace) -> dict:
    j = plots.first_divergence(full, trace) if full is not None else None
    if j is None:
        return {"first_difference_token": None, "same_text_as_full": full is not None and trace.text == full.text}
    return {"first_difference_token": j + 1, "same_text_as_full": False,
            "wrote": trace.generated_steps[j].text, "full_model_wrote": full.generated_steps[j].text}


def _layer_rates(trace: Trace) -> dict[str, float | None]:
    return {str(i): r for i, r in enumerate(trace.layer_skip_rates())}


def heatmap(trace: Trace) -> dict:
    """The run the heatmap draws: its skip rate, quality cost (mean and per token: the strip), text and per-layer rates."""
    return {
        "threshold": trace.meta.get("threshold_start"), "kv_policy": trace.meta.get("kv_policy"),
        "prompt_tokens": len(trace.prompt_steps), "generated_tokens": len(trace.generated_steps),
        "skip_rate": trace.skip_rate(), "mean_kl": trace.mean_kl(), "agreement": trace.agreement(),
        "decode_tokens_per_second": decode_speed(trace), "text": trace.text,
        "kl_per_token": [s.kl_full for s in trace.generated_steps], "layer_skip_rates": _layer_rates(trace),
    }


def layers(titles: list[str], traces: list[Trace]) -> dict:
    """Per layer, each prompt's skip rate and all prompts' generated tokens pooled (None: the layer has no router)."""
    n = traces[0].n_layers
    per_layer: dict[str, list] = {str(i): [] for i in range(n)}
    skipped, routed = [0] * n, [0] * n
    for trace in traces:
        for i, rate in enumerate(trace.layer_skip_rates()):
            per_layer[str(i)].append(rate)
        for step in trace.generated_steps:
            for i, ran in enumerate(step.executed):
                if ran is not None:
                    routed[i] += 1
                    skipped[i] += not ran
    return {
        "prompts": titles, "generated_tokens": [len(t.generated_steps) for t in traces], "skip_rate": [t.skip_rate() for t in traces],
        "per_layer": per_layer, "all_prompts": {str(i): (skipped[i] / routed[i] if routed[i] else None) for i in range(n)},
        "routed_layers": [i for i in range(n) if routed[i]],
    }


def ladder(full: Trace, rungs: list[Trace], calibrated: float) -> dict:
    """The Compare tab's ladder rows (compare.ladder_rows), each with its first difference and token count."""
    rows = []
    for row, trace in zip(ladder_rows(full, rungs), [full, *rungs]):
        row = {k: v for k, v in row.items() if k != "first_divergence"}
        row.update(generated_tokens=len(trace.generated_steps), text=trace.text, calibrated=row["threshold"] is not None and abs(row["threshold"] - calibrated) < 1e-9)
        if trace is not full:
            row.update(_first_difference(full, trace))
        rows.append(row)
    return {"rows": rows, "full_model_text": full.text}


def kv(full: Trace, policies: dict[str, Trace]) -> dict:
    """Each KV policy's run at one threshold: speed against the full model's, what it saved (core.records.trace.savings), its text."""
    f_tps, *speeds = lockstep_speeds([full, *policies.values()])  # each against the full model over the rounds both decoded
    out = {}
    for (policy, trace), tps in zip(policies.items(), speeds):
        out[policy] = {
            "threshold": trace.meta.get("threshold_start"), "kv_policy_effective": trace.meta.get("kv_policy_effective"),
            "generated_tokens": len(trace.generated_steps), "skip_rate": trace.skip_rate(), "tokens_per_second": tps,
            "speedup": tps / f_tps if tps and f_tps else None, "mean_kl": trace.mean_kl(), "agreement": trace.agreement(),
            **savings(trace), **_first_difference(full, trace), "text": trace.text, "timed_tokens": shared_tokens([full, trace]),
        }
    return {"full": {"tokens_per_second": f_tps, "generated_tokens": len(full.generated_steps)}, "policies": out}


def tradeoff(fig, results: dict, folder) -> dict:
    """The curves as drawn: per series and panel, skipped share (% of all layers' sub-layer runs) and the value plotted."""
    series = []
    for trace in fig.data:
        if not trace.x:
            continue
        custom = list(trace.customdata) if trace.customdata is not None else [None] * len(trace.x)
        series.append({
            "series": trace.name, "panel": "mean KL from the full model (nats)" if trace.xaxis in (None, "x") else "perplexity rise (%)",
            "skipped_percent": list(trace.x), "value": list(trace.y),
            "value_text": [c[0] if c is not None else None for c in custom], "setting": [c[1] if c is not None else None for c in custom],
        })
    return {"source": str(folder), "held_out": results.get("heldout_name"), "thresholds_on_calibrated_scale": results.get("calibrated"),
            "series": series}


def machine() -> dict:
    """The processor, its cores and threads, vector unit and native bf16 (as `bench` and `_machine()` report them)."""
    import torch

    from routerlab.bench.speed import cpu_model
    from routerlab.core.base.precision import cpu_has_native_bf16, cpu_vector_unit

    return {"cpu": cpu_model(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "vector_unit": cpu_vector_unit(), "native_bf16": cpu_has_native_bf16()}


def rounded(obj, digits: int = 5):
    """`obj` with every float rounded (numbers.json is read by people); NaN and inf become None."""
    if isinstance(obj, float):
        return round(obj, digits) if obj == obj and abs(obj) != float("inf") else None
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [rounded(v, digits) for v in obj]
    return obj
