"""Several sequences' forwards as one: their tokens packed side by side on one axis, so each weight is read once for
all of them, while each sequence keeps its own routing, KV policy and cache, appends to and attends over that cache
only.

What it is for: a room's rows that need a forward over many tokens at the same step (core/serve/room.py). Their quality
meters each score a chunk of their run at full depth (core/records/quality.py), and newcomers' prompts are read (prefill).
A forward over a few dozen tokens pays most of its cost in reading (on CPUs without bf16 units, converting) every
weight, so eight such forwards packed cost about what three do one by one. `forward_shared` also reads once the
stretch that prompts share from their start (a chat template's system turn) and copies its keys and values.

The layer is torch's one layer (core/ops/layer.py's `run_layer`) over the segments as sequences of one `Tokens`: each
deciding its own gates, the products run once over the packed rows that need them. Covers hard gates without
stand-ins (`layer.hard`: not `mask`, not training); other plans take the forward of one sequence
(core/ops/forward.py). Knows nothing about rooms, quality, sampling or the UI.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from routerlab.core.model.cache import LayerCache
from routerlab.core.model.anatomy import Anatomy
from routerlab.core.ops.layer import Seq, Tokens, hard, run_layer
from routerlab.core.routing.gates import Plan, score_table


@dataclass
class Segment:
    """One sequence of a packed forward: `ids` at positions start .. start + len(ids) - 1, appended to `caches`
    (one per layer) under `plan`; its logits are wanted at its last `n` positions. After the forward, `scores`
    holds its (T, L) router scores (NaN where unrouted)."""

    ids: list[int]
    start: int
    caches: list[LayerCache]
    n: int = 1
    plan: Plan = field(default_factory=lambda: Plan(None))
    scores: torch.Tensor | None = None


@torch.inference_mode()
def forward_packed(an: Anatomy, segments: list[Segment]) -> list[torch.Tensor]:
    """Each segment's logits (n, V) at its last n positions, in the order given (and its `scores`)."""
    device = an.embed.weight.device
    bounds, lo = [], 0
    for s in segments:
        if not s.ids or not 0 < s.n <= len(s.ids):
            raise ValueError(f"a segment needs tokens and 1..{len(s.ids)} logits, not {s.n}")
        if not hard(s.plan):
            raise ValueError("a packed forward takes hard gates without stand-ins (not `mask`, not training)")
        bounds.append((lo, lo + len(s.ids)))
        lo += len(s.ids)
    h = an.embed(torch.tensor([[t for s in segments for t in s.ids]], device=device))  # (1, N, D)
    seqs = []
    for s, (lo, hi) in zip(segments, bounds):
        positions = torch.arange(s.start, s.start + hi - lo, device=device)
        seqs.append(Seq(lo, hi, s.plan, positions, s.caches, an.rope(h, positions, s.start + hi - lo - 1)))
    tokens = Tokens(seqs)
    for i, parts in enumerate(an.layers):
        h = run_layer(i, parts, h, tokens)
    wanted = torch.cat([torch.arange(q.hi - s.n, q.hi, device=device) for q, s in zip(seqs, segments)])
    logits = an.logits(h[:, wanted])[0]  # (sum n, V): the head only where asked
    for q, s in zip(seqs, segments):
        s.scores = score_table(q.scores, q.hi - q.lo, an.n_layers, device)
    return list(logits.split([s.n for s in segments]))


SHARED_MIN = 8  # tokens prompts must share from their start before that stretch is read once for all of them


def forward_shared(an: Anatomy, segments: list[Segment], share: bool = True) -> list[torch.Tensor]:
    """`forward_packed`, but segments that start at position 0 under the same plan (token level or none) and share
    their first tokens (at least SHARED_MIN: a chat template's system turn, 24 tokens for the embedded model) read
    that stretch once: one forward over it, its keys and values copied into each one's caches, then the rest of
    each. Causal attention makes the copy exact: nothing before a position depends on what follows it. Each
    segment's `scores` still cover all its tokens. `share=False`: `forward_packed` as it is (to compare)."""
    shared = []
    for p, members in shared_stretches(segments) if share else []:
        first = segments[members[0]]
        caches = [LayerCache(parts.attn, p, c.dtype, c.device) for parts, c in zip(an.layers, first.caches)]
        shared.append((Segment(first.ids[:p], 0, caches, 1, first.plan), members))
    if not shared:
        return forward_packed(an, segments)
    forward_packed(an, [head for head, _ in shared])
    rest, heads = list(segments), {}
    for head, members in shared:
        p = len(head.ids)
        for k in members:
            s = segments[k]
            for mine, theirs in zip(s.caches, head.caches):
                if theirs.n:  # under drop a layer the stretch skipped everywhere holds nothing
                    mine.append(theirs.k[:, :, : theirs.n], theirs.v[:, :, : theirs.n], theirs.pos[: theirs.n])
            rest[k] = Segment(s.ids[p:], p, s.caches, s.n, s.plan)
            heads[k] = head
    logits = forward_packed(an, rest)
    for k, s in enumerate(segments):
        s.scores = torch.cat([heads[k].scores, rest[k].scores]) if k in heads else rest[k].scores
    return logits


def shared_stretches(segments: list[Segment]) -> list[tuple[int, list[int]]]:
    """(tokens, indices of the segments) for each stretch `forward_shared` reads once."""
    groups: dict[tuple, list[int]] = {}
    for k, s in enumerate(segments):
        plan = s.plan
        if s.start == 0 and len(s.ids) > SHARED_MIN and plan.level != "sequence":  # sequence level: the whole prompt decides
            groups.setdefault((id(plan.routers), plan.threshold, plan.policy, tuple(s.ids[:SHARED_MIN])), []).append(k)
    out = []
    for members in groups.values():
        if len(members) < 2:
            continue
        common = len(os.path.commonprefix([segments[k].ids for k in members]))
        p = min(common, *(len(segments[k].ids) - segments[k].n for k in members))  # each keeps the tokens it wants logits of
        if p >= SHARED_MIN:
            out.append((p, members))
    return out
