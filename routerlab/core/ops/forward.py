"""torch's decoder layer and forward: a routed model's layers as the engine runs them, with real skipping.

`run_layer` is one layer for T tokens (a prefill's, or a decode step's one) with or without a KV cache: the router
decides from the normed input (`gates.decide`), a skipped attention computes nothing, or only its keys and values
under `kv`, or writes nothing under `drop`; a set with stand-ins adds its stand-in's update to every skipped cell
(`standin_add`). `forward` runs the embedding, every layer (a one-token step with a cache takes
`one_token.run_layer_one`: the same numbers in fewer tensor ops) and the head at the positions asked for. `FullDepth`
is a quality meter's full model over the same function. Used by the engine (core/decode/engine.py), a room's rows that
the batched step does not cover (core/ops/batch.py), the cost model, training's teacher-forced forward and the
benchmarks. Knows nothing about sampling, traces, threads or the UI.
"""

from __future__ import annotations

import torch

from routerlab.core.model.cache import LayerCache
from routerlab.core.model.routed import Anatomy, LayerParts
from routerlab.core.ops.one_token import one_token_ok, run_layer_one
from routerlab.core.ops.sublayers import attend, project_kv, project_q, project_qkv, run_mlp
from routerlab.core.routing.gates import ALL, Gate, Plan, Scores, decide, score_table


# -- one layer -------------------------------------------------------------------------------
def _gated_add(h: torch.Tensor, update: torch.Tensor, gate: Gate) -> torch.Tensor:
    if gate.kind == "soft":
        update = update * gate.mult.to(update.dtype)[None, :, None]
    if gate.kind == "some":
        return h.index_add(1, gate.index, update)
    return h + update


def standin_add(h: torch.Tensor, x: torch.Tensor, gate: Gate, standin) -> torch.Tensor:
    """h plus the stand-in's update on `x` (1, T, D) for the tokens `gate` skips; h as is without a stand-in.

    Soft gates (training, `mask`): h + (1 - g) * standin(x), so the layer's output is
    g * sublayer + (1 - g) * standin, the straight-through gradient reaching both.
    """
    if standin is None or gate.kind == "all":
        return h
    if gate.kind == "none":
        return h + standin(x)
    if gate.kind == "some":
        return h.index_add(1, gate.rest, standin(x[:, gate.rest]))
    return h + standin(x) * (1.0 - gate.mult.to(h.dtype))[None, :, None]


def attention_part(parts: LayerParts, h: torch.Tensor, x: torch.Tensor, gate: Gate, positions: torch.Tensor,
                   table: tuple[torch.Tensor, torch.Tensor], cache: LayerCache | None, plan: Plan,
                   standin=None) -> torch.Tensor:
    a = parts.attn
    keeps_kv = plan.policy == "kv" and plan.level != "sequence"  # sequence level: nobody ever queries a skipped layer
    if gate.kind == "none":
        if keeps_kv and cache is not None:
            cache.append(*project_kv(a, x, table), positions)
        return standin_add(h, x, gate, standin)
    if gate.kind == "some":  # only the running tokens pay for queries (and, under drop, keys/values)
        idx = gate.index
        q_pos, q_rope = positions[idx], (table[0][:, :, idx], table[1][:, :, idx])
        if keeps_kv:
            q, (k, v), k_pos = project_q(a, x[:, idx], q_rope), project_kv(a, x, table), positions
        else:
            (q, k, v), k_pos = project_qkv(a, x[:, idx], q_rope), q_pos
    else:
        (q, k, v), q_pos, k_pos = project_qkv(a, x, table), positions, positions
    if cache is not None:
        k, v, k_pos = cache.append(k, v, k_pos)
    out = attend(a, q, q_pos, k, v, k_pos, later_keys=gate.kind == "some")
    if parts.attn_post_norm is not None:
        out = parts.attn_post_norm(out)
    return standin_add(_gated_add(h, out, gate), x, gate, standin)


def mlp_part(parts: LayerParts, h: torch.Tensor, x: torch.Tensor, gate: Gate, standin=None) -> torch.Tensor:
    if gate.kind == "none":
        return standin_add(h, x, gate, standin)
    out = run_mlp(parts, x[:, gate.index] if gate.kind == "some" else x)
    if parts.mlp_post_norm is not None:
        out = parts.mlp_post_norm(out)
    return standin_add(_gated_add(h, out, gate), x, gate, standin)


def run_layer(i: int, parts: LayerParts, h: torch.Tensor, positions: torch.Tensor, rope, cache: LayerCache | None,
              plan: Plan, scores: Scores) -> torch.Tensor:
    router = plan.router(i)
    standin = plan.routers.standin(i) if router is not None else None
    target = plan.target
    x = parts.attn_norm(h)
    gate = ALL
    if router is not None and target in ("attention", "block"):
        gate = decide(router, x, i, plan, scores)
    h = attention_part(parts, h, x, gate, positions, rope, cache, plan, standin if target == "attention" else None)
    if target == "block":  # skipped tokens leave both parts untouched, then take the stand-in of the block's input
        if gate.kind != "none":
            h = mlp_part(parts, h, parts.mlp_norm(h), gate)
        return standin_add(h, x, gate, standin)
    x = parts.mlp_norm(h)
    gate = ALL
    if router is not None and target == "mlp":
        gate = decide(router, x, i, plan, scores)
    return mlp_part(parts, h, x, gate, standin if target == "mlp" else None)


def forward(an: Anatomy, ids: torch.Tensor, positions: torch.Tensor, caches: list[LayerCache] | None, plan: Plan,
            logits_at: slice | None = None, top: int | None = None, scores_on=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `ids` (1, T) at `positions` (T,). Returns logits and scores (T, L), NaN where unrouted.

    Logits are those of the positions `logits_at` picks ((1, n, V)), or of the last one ((1, 1, V)):
    the head is a fifth of this model's work per position, so only the positions asked for pay it.
    `top`: the largest position, when the caller knows it (on a GPU, reading it from `positions` is a host wait).
    `scores_on`: where the score table goes (default the model's device); a decode step's caller that reads the
    scores on the host passes "cpu": a one-token step's scores are host floats already, so no device round trip.
    """
    h = an.embed(ids)  # (1, T, D)
    tables = an.rope(h, positions, top)
    scores: Scores = {}
    layer = run_layer_one if ids.shape[1] == 1 and caches is not None and one_token_ok(an, plan) else run_layer
    for i, parts in enumerate(an.layers):
        cache = caches[i] if caches is not None else None
        h = layer(i, parts, h, positions, tables[parts.attn.rope_key], cache, plan, scores)
    logits = an.logits(h[:, logits_at] if logits_at is not None else h[:, -1:])
    return logits, score_table(scores, ids.shape[1], an.n_layers, h.device if scores_on is None else scores_on)


class FullDepth:
    """A quality meter's full model (quality.FullForward): the run's tokens at full depth, with a KV cache of its own;
    `Engine.full_passes` packs several into one forward."""

    def __init__(self, an: Anatomy, caches: list[LayerCache]):
        self.an, self.caches = an, caches

    @torch.inference_mode()
    def __call__(self, chunk: list[int], start: int, n: int) -> torch.Tensor:
        device = self.an.embed.weight.device
        t = torch.tensor([chunk], device=device)  # (1, T)
        positions = torch.arange(start, start + len(chunk), device=device)  # (T,)
        logits, _ = forward(self.an, t, positions, self.caches, Plan(None), logits_at=slice(len(chunk) - n, None))
        return logits[0]  # (n, V)
