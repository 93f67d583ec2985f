"""torch's forward of one sequence: the embedding, every layer (core/ops/layer.py's `run_layer`, one sequence of T
tokens: a prefill's, a decode step's one, training's teacher-forced pass) and the head at the positions asked for.
`FullDepth` is a quality meter's full model over the same forward. Used by the engine (core/decode/engine.py), a
room's lone torch rows (core/decode/runtime.py), the cost model, training and the benchmarks. Knows nothing about sampling,
traces, threads or the UI.
"""

from __future__ import annotations

import torch

from routerlab.core.model.cache import LayerCache
from routerlab.core.model.anatomy import Anatomy
from routerlab.core.ops.layer import Seq, Tokens, run_layer
from routerlab.core.routing.gates import Plan, score_table


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
    t = ids.shape[1]
    seq = Seq(0, t, plan, positions, caches, an.rope(h, positions, top))
    tokens = Tokens([seq])
    for i, parts in enumerate(an.layers):
        h = run_layer(i, parts, h, tokens)
    logits = an.logits(h[:, logits_at] if logits_at is not None else h[:, -1:])
    return logits, score_table(seq.scores, t, an.n_layers, h.device if scores_on is None else scores_on)


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
