"""Small frozen configs, validated on construction. Names of targets, levels and KV policies live here only.

Knows nothing about torch or transformers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from routerlab.core.base.errors import RouterLabError

TARGETS = ("attention", "mlp", "block")
LEVELS = ("token", "sequence")
KV_POLICIES = ("mask", "kv", "drop")
# Below this temperature sampling is greedy: the scaled logits overflow float32 (1e-45 gave inf and a NaN softmax)
# long before the distribution differs from argmax's, whose most likely token then has all the probability anyway.
GREEDY_BELOW = 1e-4
DECAYS = ("constant", "cosine")  # learning-rate schedules after warmup (train --decay)
KV_POLICY_HELP = {
    "mask": "compute everything, zero the skipped update (the official code; saves nothing)",
    "kv": "skipped tokens compute only keys/values; same numbers as mask, less work",
    "drop": "skipped tokens write nothing to the cache at that layer; most saving, different numbers",
}
GRANULARITIES = tuple(f"{t}-{lv}" for t in TARGETS for lv in LEVELS)


def check_threshold(threshold: float) -> float:
    """Return `threshold` as a float in [0, 1] or raise a RouterLabError naming the bad value."""
    try:
        value = float(threshold)
    except (TypeError, ValueError):
        raise RouterLabError(f"Threshold {threshold!r} is not a number.", "Use a value between 0 and 1, e.g. 0.5.") from None
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise RouterLabError(f"Threshold {threshold!r} is outside [0, 1].", "Use a value between 0 and 1, e.g. 0.5.")
    return value + 0.0  # -0.0 becomes 0.0 (shown as "0.00", not "-0.00")


def check_kv_policy(policy: str) -> str:
    if policy not in KV_POLICIES:
        raise RouterLabError(f"Unknown KV policy {policy!r}.", f"Choose one of: {', '.join(KV_POLICIES)}.")
    return policy


@dataclass(frozen=True)
class RoutingConfig:
    """Where routers sit: target sub-layer, decision level, and which decoder layers are routed."""

    target: str = "attention"
    level: str = "token"
    layers: tuple[int, ...] = ()

    def __post_init__(self):
        if self.target not in TARGETS:
            raise RouterLabError(f"Unknown routing target {self.target!r}.", f"Choose one of: {', '.join(TARGETS)}.")
        if self.level not in LEVELS:
            raise RouterLabError(f"Unknown routing level {self.level!r}.", f"Choose one of: {', '.join(LEVELS)}.")
        object.__setattr__(self, "layers", tuple(sorted({int(i) for i in self.layers})))

    @property
    def granularity(self) -> str:
        return f"{self.target}-{self.level}"

    @classmethod
    def from_granularity(cls, granularity: str, layers: tuple[int, ...] | list[int] = ()) -> "RoutingConfig":
        """Parse 'attention-token' style names (the only place they are parsed)."""
        if granularity not in GRANULARITIES:
            raise RouterLabError(f"Unknown granularity {granularity!r}.", f"Choose one of: {', '.join(GRANULARITIES)}.")
        target, level = granularity.split("-")
        return cls(target=target, level=level, layers=tuple(layers))


def default_layers(n_layers: int) -> tuple[int, ...]:
    """Routed layers by default: every layer but the first and the last.

    The official recipe routes the deeper half; on SmolLM2-135M the tuned routers find more
    cheap skips when they may also use the early-middle layers (see README, measured).
    """
    return tuple(range(1, max(1, n_layers - 1)))


@dataclass(frozen=True)
class GenerateConfig:
    """One generation request. The threshold here is the starting value; a Control may move it live."""

    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    threshold: float = 0.5
    kv_policy: str = "kv"
    chat: bool = True  # wrap the prompt in the tokenizer's chat template when it has one
    seed: int | None = None
    system_prompt: str | None = None
    ignore_eos: bool = False  # benchmarks: always produce max_new_tokens
    # Per-token quality cost (KL to the full model, its top token): a full-depth pass over the run's
    # own tokens, `quality_chunk` tokens per forward. Off here (no extra work); the CLI turns it on.
    # While streaming, a token waits at most `quality_refresh` seconds for its score (a live view
    # refreshes); None: only full chunks and the end of the run (cheapest; nobody is watching).
    quality: bool = False
    quality_chunk: int = 32  # = quality.CHUNK (chosen by `bench quality`; this module knows no torch)
    quality_refresh: float | None = 2.0
    # With an engine that serves a room (core/serve/room.py): decode as a row of the room's shared batch, or (False) alone,
    # in lockstep with the room's other solo runs: Compare's columns, whose step times are compared side by side.
    shared: bool = True
    max_new_tokens_cap: int = field(default=4096, repr=False)

    def __post_init__(self):
        check_threshold(self.threshold)
        check_kv_policy(self.kv_policy)
        if not isinstance(self.max_new_tokens, int) or not 1 <= self.max_new_tokens <= self.max_new_tokens_cap:
            raise RouterLabError(
                f"max_new_tokens={self.max_new_tokens!r} is not allowed.",
                f"Use a whole number from 1 to {self.max_new_tokens_cap}.",
            )
        if isinstance(self.quality_chunk, bool) or not isinstance(self.quality_chunk, int) or self.quality_chunk < 1:
            raise RouterLabError(f"quality_chunk={self.quality_chunk!r} is not allowed.", "Use a whole number >= 1, e.g. 32.")
        if self.quality_refresh is not None and not (isinstance(self.quality_refresh, (int, float)) and self.quality_refresh >= 0):
            raise RouterLabError(f"quality_refresh={self.quality_refresh!r} is not allowed.", "Use seconds >= 0, or None.")
        t = float(self.temperature)
        if math.isnan(t) or not 0.0 <= t <= 5.0:
            raise RouterLabError(f"Temperature {self.temperature!r} is outside [0, 5].", "Use 0 for greedy decoding.")
        p = float(self.top_p)
        if math.isnan(p) or not 0.0 < p <= 1.0:
            raise RouterLabError(f"top_p {self.top_p!r} is outside (0, 1].", "Use 1.0 to disable nucleus sampling.")
