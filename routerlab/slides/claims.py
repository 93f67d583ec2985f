"""What the workshop lesson states as fact about the shipped model, each as a check on a `figures` run's numbers.

Greedy decoding repeats itself on one machine, but processors take different kernels (AVX2, AVX-512 with native
bf16, AMX), and a router score near the threshold flips with the last bits: routed answers then part at a fragile
token and go their own way. So docs/workshop.md states only what held on every kernel path we ran (numbers in
assets/workshop/machines/) and leaves the exact numbers to the sheet a teacher's own machine writes
(slides/sheet.py). Each `Claim` carries the phrase the lesson uses (tests/test_workshop_doc.py finds it there) and
a check of a numbers.json record (`check`: the claims that hold and the ones that do not, with what was measured).
Knows nothing about models, plotly or files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Claim:
    exercise: int
    says: str  # the lesson's own words (whitespace aside)
    holds: Callable[[dict], bool]  # on numbers.json's "figures"
    measured: Callable[[dict], str]  # what this machine measured, for the sheet


def _rungs(f: dict) -> dict[float, dict]:
    return {r["threshold"]: r for r in f["ladder"]["rows"] if r["threshold"] is not None}


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _ladder(f: dict, key: str, fmt: Callable = _pct) -> str:
    return ", ".join(f"{t:.2f}: {fmt(r.get(key))}" for t, r in sorted(_rungs(f).items()))


def _rising(f: dict, key: str) -> bool:
    values = [r[key] for _, r in sorted(_rungs(f).items())]
    return all(a < b for a, b in zip(values, values[1:]))


def _policy(f: dict, name: str) -> dict:
    return f["kv"]["policies"][name]


def _pooled(f: dict) -> dict[int, float]:
    return {int(k): v for k, v in f["layers"]["all_prompts"].items() if v is not None}


def _prompt_rates(f: dict) -> dict[str, float]:
    return dict(zip(f["layers"]["prompts"], f["layers"]["skip_rate"]))


def _top(f: dict, k: int) -> list[int]:
    pooled = _pooled(f)
    return sorted(pooled, key=pooled.get, reverse=True)[:k]


def _same_text(a: dict, b: dict) -> bool:
    """Two runs wrote the same text (records from before texts were kept: the same length and first difference)."""
    if "text" in a and "text" in b:
        return a["text"] == b["text"]
    keys = ("generated_tokens", "first_difference_token", "wrote")
    return all(a.get(k) == b.get(k) for k in keys)


NEVER = (2, 18, 19, 28)

CLAIMS = (
    Claim(1, "skipped a few percent of the routed attention runs (under 10%)",
          lambda f: 0.02 <= f["heatmap"]["skip_rate"] <= 0.10, lambda f: f"skipped {_pct(f['heatmap']['skip_rate'])}"),
    Claim(1, "the routed model's top token was the full model's for more than four tokens in five",
          lambda f: f["heatmap"]["agreement"] > 0.8, lambda f: f"agreement {_pct(f['heatmap']['agreement'])}"),
    Claim(2, "the share skipped rises with the threshold", lambda f: _rising(f, "skip_rate"), lambda f: _ladder(f, "skip_rate")),
    Claim(2, "at 0.30 about one routed attention run in a hundred is skipped",
          lambda f: 0.003 <= _rungs(f)[0.3]["skip_rate"] <= 0.03, lambda f: _ladder(f, "skip_rate")),
    Claim(2, "0.70 skips several times as much as 0.50",
          lambda f: 3 <= _rungs(f)[0.7]["skip_rate"] / _rungs(f)[0.5]["skip_rate"] <= 6,
          lambda f: f"{_rungs(f)[0.7]['skip_rate'] / _rungs(f)[0.5]['skip_rate']:.1f} times"),
    Claim(2, "the mean KL from the full model rises with it", lambda f: _rising(f, "mean_kl"),
          lambda f: _ladder(f, "mean_kl", lambda x: f"{x:.3f}")),
    Claim(2, "top-token agreement is lowest at 0.70",
          lambda f: _rungs(f)[0.7]["agreement"] < min(_rungs(f)[0.3]["agreement"], _rungs(f)[0.5]["agreement"]),
          lambda f: _ladder(f, "agreement")),
    Claim(3, "attention was skipped most in layers 25 and 26", lambda f: set(_top(f, 2)) == {25, 26},
          lambda f: ", ".join(f"layer {i} {_pct(_pooled(f)[i])}" for i in _top(f, 3))),
    Claim(3, "layers 2, 18, 19 and 28 were never skipped", lambda f: all(_pooled(f).get(i) == 0.0 for i in NEVER),
          lambda f: ", ".join(f"layer {i} {_pct(_pooled(f).get(i))}" for i in NEVER)),
    Claim(3, "the poem and the recipe skipped more than twice as much as the advice",
          lambda f: min(_prompt_rates(f)["Poem"], _prompt_rates(f)["Recipe"]) > 2 * _prompt_rates(f)["Advice"],
          lambda f: ", ".join(f"{k} {_pct(v)}" for k, v in _prompt_rates(f).items())),
    Claim(4, "**mask** computes everything and throws the skipped update away (what the paper's code does): it saves nothing",
          lambda f: _policy(f, "mask")["attention_flops_saved"] == 0 and _policy(f, "mask")["kv_bytes_saved"] == 0,
          lambda f: f"mask saved {_pct(_policy(f, 'mask')['attention_flops_saved'])} of the attention work"),
    Claim(4, "the same text as mask", lambda f: _same_text(_policy(f, "kv"), _policy(f, "mask")),
          lambda f: "the same text" if _same_text(_policy(f, "kv"), _policy(f, "mask")) else "different texts"),
    Claim(4, "**drop** stores nothing for a skipped token",
          lambda f: _policy(f, "drop")["kv_bytes_saved"] > 0 and _policy(f, "kv")["kv_bytes_saved"] == 0,
          lambda f: f"drop saved {_policy(f, 'drop')['kv_bytes_saved'] / 1024:.1f} KiB of cache, kv none"),
    Claim(4, "mask, which pays for all of it and for the routers too, was the slowest of the three",
          lambda f: _policy(f, "mask")["speedup"] < min(_policy(f, "kv")["speedup"], _policy(f, "drop")["speedup"]),
          lambda f: ", ".join(f"{p} {_policy(f, p)['speedup']:.2f}x" for p in ("mask", "kv", "drop"))),
    Claim(4, "none of the three decoded more than 10% faster than the full model",
          lambda f: max(_policy(f, p)["speedup"] for p in ("mask", "kv", "drop")) < 1.10,
          lambda f: ", ".join(f"{p} {_policy(f, p)['speedup']:.2f}x" for p in ("mask", "kv", "drop"))),
    Claim(5, "every rung's text leaves the full model's within its first twenty tokens",
          lambda f: all(r.get("first_difference_token") is not None and r["first_difference_token"] <= 20 for r in _rungs(f).values()),
          lambda f: _ladder(f, "first_difference_token", lambda x: f"token {x}")),
)


def check(record: dict) -> list[tuple[Claim, bool, str]]:
    """Each claim, whether it holds on `record` (a numbers.json), and what was measured. A claim whose figure is
    missing from the record (a run with --only) does not hold, and says so."""
    figures = record.get("figures", {})
    out = []
    for claim in CLAIMS:
        try:
            out.append((claim, bool(claim.holds(figures)), claim.measured(figures)))
        except (KeyError, TypeError, ZeroDivisionError) as err:
            out.append((claim, False, f"not measured in this run ({type(err).__name__}: {err})"))
    return out
