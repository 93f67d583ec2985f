"""The teacher-forced forward that training and evaluation share: routed, or at full depth.

Lives below both `train` and `evaluate` so neither imports the other for it. Knows nothing about
losses, optimisers or metrics.
"""

from __future__ import annotations

import torch

from routerlab.core.ops.forward import forward
from routerlab.core.ops.layer import Seq, Tokens, attention, mlp
from routerlab.core.routing.gates import ALL, Plan


def response_slice(start: int) -> slice:
    """The positions whose logits predict the response tokens ids[start:]."""
    return slice(start - 1, -1)


def student_forward(anatomy, ids: torch.Tensor, start: int, plan, logits: bool = True):
    """Teacher-forced logits of the response predictions (1, R, V) + scores (T, L) under `plan`.

    Sequence level decides from the prompt only. With `logits=False` only the scores are wanted:
    the head then runs on the last position alone.
    """
    positions = torch.arange(ids.shape[1], device=ids.device)
    if plan.level == "sequence":  # as at generation: decide once from the mean-pooled prompt
        forward(anatomy, ids[:, :start], positions[:start], None, plan)
    return forward(anatomy, ids, positions, None, plan, logits_at=response_slice(start) if logits else None)


def stepwise_forward(anatomy, ids: torch.Tensor, start: int, plan, logits: bool = True):
    """`student_forward`'s outputs as generation computes them: the prompt in one forward, then each
    response token as its own decode step through the KV cache, so a model with low-bit weights
    (core/kernels/weights.py) uses them as it does when it generates. Slower (one forward per token)."""
    from routerlab.core.model.cache import LayerCache

    t = ids.shape[1]
    positions = torch.arange(t, device=ids.device)
    caches = [LayerCache(p.attn, t, anatomy.dtype, ids.device) for p in anatomy.layers]
    out, scores = forward(anatomy, ids[:, :start], positions[:start], caches, plan)  # predicts ids[start]
    outs, rows = [out], [scores]
    for p in range(start, t):  # the last token's step only adds its scores
        out, scores = forward(anatomy, ids[:, p : p + 1], positions[p : p + 1], caches, plan)
        rows.append(scores)
        if p < t - 1:
            outs.append(out)
    return (torch.cat(outs, dim=1) if logits else outs[-1]), torch.cat(rows)


@torch.no_grad()
def teacher_logits(anatomy, ids: torch.Tensor, start: int) -> torch.Tensor:
    """Full-depth logits of the response predictions (R, V): the same model with no routers."""
    logits, _ = forward(anatomy, ids, torch.arange(ids.shape[1], device=ids.device), None, Plan(None),
                        logits_at=response_slice(start))
    return logits[0]


def layer_walk(anatomy, ids: torch.Tensor):
    """The full model over `ids` (1, T), one layer at a time: yields (layer, h_in, x_attn, mid, x_mlp, out),
    the hidden state before the layer, its attention norm's output, the state after attention, the MLP
    norm's output and the state after the MLP. For measurements of what each sub-layer does; call it
    under no_grad."""
    positions = torch.arange(ids.shape[1], device=ids.device)
    h = anatomy.embed(ids)
    tokens = Tokens([Seq(0, ids.shape[1], Plan(None), positions, None, anatomy.rope(h, positions))])
    for i, parts in enumerate(anatomy.layers):
        x_attn = parts.attn_norm(h)
        mid = attention(i, parts, h, x_attn, [ALL], tokens)
        x_mlp = parts.mlp_norm(mid)
        out = mlp(i, parts, mid, [ALL], tokens)
        yield i, h, x_attn, mid, x_mlp, out
        h = out
