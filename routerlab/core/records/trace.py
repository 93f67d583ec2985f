"""Plain-data records of a generation: one Step per token, a Trace per run, matrices for plots, JSON.

Knows nothing about torch, models or the UI. A Step describes one token *as an input*: the router
scores and decisions of every layer while that token ran through the model. Layers without a
router hold `None`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from typing import Any

from routerlab.core.base.errors import RouterLabError

TRACE_VERSION = 2  # 2: optional per-step kl_full / full_top_token / full_top_text (version 1 files load)


@dataclass
class Step:
    position: int
    token_id: int
    text: str
    is_prompt: bool
    scores: list[float | None]  # one per decoder layer
    executed: list[bool | None]  # one per decoder layer; None where the layer has no router
    threshold: float
    seconds: float  # wall time of the forward pass that processed this token (prompt: share of prefill)
    # Quality cost of a generated token (None for the prompt, when switched off, or not scored yet):
    # KL(full || routed) of the distribution it was sampled from, in nats (see core/records/quality.py), and
    # the full model's top token at the same prefix where it differs from the routed model's top token.
    kl_full: float | None = None
    full_top_token: int | None = None
    full_top_text: str | None = None

    @property
    def routed(self) -> int:
        return sum(e is not None for e in self.executed)

    @property
    def skipped(self) -> int:
        return sum(e is False for e in self.executed)

    @property
    def layers_used(self) -> int:
        """Decoder layers whose routed sub-layer ran for this token (unrouted layers always run)."""
        return sum(e is not False for e in self.executed)


@dataclass
class Trace:
    """A whole run. `meta` carries model name, granularity, kv_policy and timings."""

    n_layers: int
    steps: list[Step] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    # -- views ---------------------------------------------------------------------------------
    @property
    def prompt_steps(self) -> list[Step]:
        return [s for s in self.steps if s.is_prompt]

    @property
    def generated_steps(self) -> list[Step]:
        return [s for s in self.steps if not s.is_prompt]

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.generated_steps)

    def score_matrix(self) -> list[list[float | None]]:
        """layers x tokens router scores (rows: layers, columns: steps in order)."""
        return [[s.scores[i] for s in self.steps] for i in range(self.n_layers)]

    def executed_matrix(self, threshold: float | None = None) -> list[list[bool | None]]:
        """layers x tokens decisions; with `threshold`, the what-if decisions from the recorded scores."""
        if threshold is None:
            return [[s.executed[i] for s in self.steps] for i in range(self.n_layers)]
        return [[None if s.scores[i] is None else s.scores[i] >= threshold for s in self.steps] for i in range(self.n_layers)]

    def skip_rate(self, threshold: float | None = None, generated_only: bool = True) -> float:
        """Skipped / routed sub-layer executions (over generated tokens by default)."""
        idx = [j for j, s in enumerate(self.steps) if not (generated_only and s.is_prompt)]
        cells = [row[j] for row in self.executed_matrix(threshold) for j in idx]
        routed = [c for c in cells if c is not None]
        return sum(not c for c in routed) / len(routed) if routed else 0.0

    def layer_skip_rates(self, generated_only: bool = True) -> list[float | None]:
        rates: list[float | None] = []
        for row in self.executed_matrix():
            cells = [c for c, s in zip(row, self.steps) if c is not None and not (generated_only and s.is_prompt)]
            rates.append(sum(not c for c in cells) / len(cells) if cells else None)
        return rates

    @property
    def scored_steps(self) -> list[Step]:
        """Generated steps whose quality cost has been measured (so far, while a run streams)."""
        return [s for s in self.generated_steps if s.kl_full is not None]

    def mean_kl(self) -> float | None:
        """Mean KL(full || routed) per scored generated token, nats; None when not measured."""
        scored = self.scored_steps
        return sum(s.kl_full for s in scored) / len(scored) if scored else None

    def agreement(self) -> float | None:
        """Share of scored generated tokens where the routed model's top token is the full model's; None when not measured."""
        scored = self.scored_steps
        return sum(s.full_top_token is None for s in scored) / len(scored) if scored else None

    def decode_tokens_per_second(self) -> float:
        """Generated tokens per second of the timed steps, everything in them counted (a quality pass too)."""
        timed = [s.seconds for s in self.generated_steps if s.seconds > 0]
        return len(timed) / sum(timed) if timed else 0.0

    def decode_speed(self, tokens: int | None = None, start: int = 0) -> float:
        """Decode tokens/s over generated tokens `start` .. `tokens` - 1 (None: to the end), without the time the
        per-token quality pass took (the engine scores a chunk inside a step and records how much of each step's seconds
        that was, `quality_seconds_by_step`): the routed model's speed, comparable with the full model's, which has no
        quality pass, and the same with the quality meter on or off."""
        steps = self.generated_steps[start:tokens]
        by_step = self.meta.get("quality_seconds_by_step")
        if by_step is not None:
            quality = sum(by_step[start:start + len(steps)])
        else:  # a trace from before per-step records: only its whole run can be corrected
            quality = float(self.meta.get("quality_seconds_in_steps", 0.0)) if tokens is None and start == 0 else 0.0
        timed = [s.seconds for s in steps if s.seconds > 0]
        seconds = sum(timed) - quality
        return len(timed) / seconds if timed and seconds > 0 else 0.0

    # -- JSON ----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"version": TRACE_VERSION, "n_layers": self.n_layers, "meta": self.meta, "steps": [_step_dict(s) for s in self.steps]}

    def to_json(self, one_step_per_line: bool = False) -> str:
        """The trace as JSON (NaN and infinities as null). `one_step_per_line`: the export's layout, a file a person can
        read and diff (the header, then each step on a line of its own), written as fast as the compact one: json's
        C encoder writes each line, where an `indent` would take its pure-Python encoder (a 124-token run: 12 ms)."""
        if not one_step_per_line:
            return _dumps(self.to_dict())
        head = _dumps({"version": TRACE_VERSION, "n_layers": self.n_layers, "meta": self.meta})
        steps = ",\n".join(_dumps(_step_dict(s)) for s in self.steps)
        return f'{head[:-1]},\n"steps": [\n{steps}\n]}}\n'

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Trace":
        try:
            n_layers = int(data["n_layers"])
            steps = [Step(**s) for s in data["steps"]]
        except (KeyError, TypeError, ValueError) as err:
            raise RouterLabError(f"Not a RouterLab trace ({err}).", "Export a trace from the app or `generate --json`.") from None
        for s in steps:
            if len(s.scores) != n_layers or len(s.executed) != n_layers:
                raise RouterLabError("Trace is inconsistent: a step's layer count differs from n_layers.")
        return cls(n_layers=n_layers, steps=steps, meta=dict(data.get("meta", {})))

    @classmethod
    def from_json(cls, text: str) -> "Trace":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise RouterLabError(f"Trace file is not valid JSON ({err.msg}).") from None
        return cls.from_dict(data)


_STEP_FIELDS = tuple(f.name for f in fields(Step))


def _step_dict(step: Step) -> dict[str, Any]:
    """`dataclasses.asdict` of a Step, without its recursive deep copy: a step's lists hold numbers, so a shallow copy
    of each list is a copy."""
    out = {name: getattr(step, name) for name in _STEP_FIELDS}
    out["scores"], out["executed"] = list(step.scores), list(step.executed)
    return out


def _dumps(obj) -> str:
    """json.dumps with NaN and infinities as null. Non-finite numbers are rare in a trace: the C encoder's
    `allow_nan=False` finds them; only then is the whole object walked."""
    try:
        return json.dumps(obj, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(obj))


def _finite(obj):
    """JSON has no NaN/inf: write them as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def savings(trace: Trace, threshold: float | None = None) -> dict[str, float]:
    """Work and memory the skipped cells saved, from the cost figures the engine put in `trace.meta`.

    meta["costs"] holds per-token FLOPs of one layer: q, k, v, o projections, mlp, and
    `score_per_ctx` (attention scores + weighted sum, per cached token), plus `kv_bytes` (one token's
    keys and values at one layer). Under `mask` nothing is saved; under `kv` a skipped token still
    pays k and v and keeps its cache entry; under `drop` it pays nothing and stores nothing.
    A set with stand-ins puts their FLOPs per skipped cell in `costs["standin"]`; every skipped cell pays them.
    """
    costs = trace.meta.get("costs")
    if not costs:
        return {"attention_flops_saved": 0.0, "routed_flops_saved": 0.0, "kv_bytes_saved": 0.0, "kv_bytes_full": 0.0}
    target = trace.meta.get("target") or "attention"  # None for the full model: nothing is routed
    policy = trace.meta.get("kv_policy_effective", trace.meta.get("kv_policy", "kv"))
    proj = costs["q"] + costs["k"] + costs["v"] + costs["o"]
    keeps_kv = policy == "kv" and target != "mlp"
    standin = costs.get("standin", 0.0)
    mlp = costs["mlp"]
    attn_total = attn_saved = routed_total = routed_saved = kv_saved = 0.0
    # The same sums in the same order as cell by cell, with what is constant over a step (or the run) taken out of the
    # loop over layers: a finished run's stats are computed as the web process shows them, for every visitor.
    matrix = trace.executed_matrix(threshold)
    for j, step in enumerate(trace.steps):
        attn = proj + costs["score_per_ctx"] * (step.position + 1)
        sub = attn if target == "attention" else mlp if target == "mlp" else attn + mlp
        saved_attn = 0.0 if target == "mlp" else (attn - costs["k"] - costs["v"]) if keeps_kv else attn
        cell_attn_saved = saved_attn - (standin if target == "attention" else 0.0)
        cell_routed_saved = saved_attn + (mlp if target != "attention" else 0.0) - standin
        for i in range(trace.n_layers):
            attn_total += attn
            decision = matrix[i][j]
            if decision is None:
                continue
            routed_total += sub
            if decision or policy == "mask":
                continue
            attn_saved += cell_attn_saved
            routed_saved += cell_routed_saved
            if target != "mlp" and not keeps_kv:
                kv_saved += costs["kv_bytes"]
    kv_full = costs["kv_bytes"] * trace.n_layers * len(trace.steps)
    return {
        "attention_flops_saved": attn_saved / attn_total if attn_total else 0.0,
        "routed_flops_saved": routed_saved / routed_total if routed_total else 0.0,
        "kv_bytes_saved": kv_saved,
        "kv_bytes_full": kv_full,
    }
