"""Several sequences' forwards as one: their tokens packed side by side on one axis, so each weight is read once for
all of them, while each sequence keeps its own routing, KV policy and cache, appends to and attends over that cache
only.

What it is for: a room's rows that need a forward over many tokens at the same step (core/serve/room.py). Their quality
meters each score a chunk of their run at full depth (core/records/quality.py), and newcomers' prompts are read (prefill).
A forward over a few dozen tokens pays most of its cost in reading (on CPUs without bf16 units, converting) every
weight, so eight such forwards packed cost about what three do one by one. `forward_shared` also reads once the
stretch that prompts share from their start (a chat template's system turn) and copies its keys and values.

Computes what `engine.forward` computes for each sequence under its `Plan`: layer by layer the same operations, each
sequence deciding its own gates from its own scores; the products run over the packed rows that need them: one q|k|v
product for the tokens that attend (and, under `kv`, one query product for the running tokens and one k|v product for
all tokens of those sequences), one output map, one MLP. Covers hard gates without stand-ins (`packable`: not `mask`,
not training); other plans take the engine's forward. Knows nothing about rooms, quality, sampling or the UI.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from routerlab.core.model.cache import LayerCache
from routerlab.core.model.routed import Anatomy, LayerParts
from routerlab.core.ops.sublayers import attend_heads, run_mlp, split_kv, split_q, split_qkv
from routerlab.core.routing.gates import ALL, Gate, Plan, decide, score_table


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


def packable(plan: Plan) -> bool:
    """Whether a forward under `plan` can join a packed one: hard gates (not `mask`, not training), no stand-ins."""
    routers = plan.routers
    return routers is None or (not plan.ste and plan.policy != "mask" and not getattr(routers, "standin_rank", 0))


@torch.inference_mode()
def forward_packed(an: Anatomy, segments: list[Segment]) -> list[torch.Tensor]:
    """Each segment's logits (n, V) at its last n positions, in the order given (and its `scores`)."""
    device = an.embed.weight.device
    bounds, lo = [], 0
    for s in segments:
        if not s.ids or not 0 < s.n <= len(s.ids):
            raise ValueError(f"a segment needs tokens and 1..{len(s.ids)} logits, not {s.n}")
        if not packable(s.plan):
            raise ValueError("a packed forward takes hard gates without stand-ins (not `mask`, not training)")
        bounds.append((lo, lo + len(s.ids)))
        lo += len(s.ids)
    h = an.embed(torch.tensor([[t for s in segments for t in s.ids]], device=device))  # (1, N, D)
    seqs = [_Seq(s, lo, hi, an.rope(h, torch.arange(s.start, s.start + hi - lo, device=device), s.start + hi - lo - 1))
            for s, (lo, hi) in zip(segments, bounds)]
    for i, parts in enumerate(an.layers):
        h = _layer(i, parts, h, seqs)
    wanted = torch.cat([torch.arange(q.hi - q.seg.n, q.hi, device=device) for q in seqs])
    logits = an.logits(h[:, wanted])[0]  # (sum n, V): the head only where asked
    for q in seqs:
        q.seg.scores = score_table(q.scores, q.hi - q.lo, an.n_layers, device)
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


class _Seq:
    """One segment inside the packed forward: where its tokens sit (lo .. hi), its positions, rotary tables, scores."""

    def __init__(self, seg: Segment, lo: int, hi: int, tables: dict):
        self.seg, self.lo, self.hi, self.tables = seg, lo, hi, tables
        self.plan = seg.plan
        self.positions = torch.arange(seg.start, seg.start + hi - lo, device=tables[next(iter(tables))][0].device)
        self.scores: dict = {}
        routed = self.plan.routers is not None
        self.keeps_kv = routed and self.plan.policy == "kv" and self.plan.level != "sequence"  # skipped attention writes

    def gate(self, i: int, x: torch.Tensor, targets: tuple[str, ...]) -> Gate:
        """This sequence's gate at layer i for a sub-layer of `targets`, from its own tokens of x (1, N, D)."""
        router = self.plan.router(i) if self.plan.target in targets else None
        return ALL if router is None else decide(router, x[:, self.lo : self.hi], i, self.plan, self.scores)

    def rows(self, gate: Gate) -> torch.Tensor:
        """The packed rows (global indices) of this sequence's tokens that run under `gate`: host-side bookkeeping (on
        the CPU whatever the model's device: which rows, in order or not, is read on the host), moved once per use."""
        if gate.kind == "all":
            return torch.arange(self.lo, self.hi, device="cpu")
        if gate.kind == "none":
            return torch.arange(0, device="cpu")
        return gate.index.cpu() + self.lo


class _Product:
    """One product over rows gathered from many sequences: rows are added per sequence, the product runs once, and
    each sequence takes back its own slice."""

    def __init__(self):
        self.parts: list[torch.Tensor] = []
        self.at: dict[int, tuple[int, int]] = {}  # sequence -> (start, end) in the product's rows
        self.n = 0
        self.out: torch.Tensor | None = None

    def add(self, who: int, rows: torch.Tensor) -> None:
        self.at[who] = (self.n, self.n + len(rows))
        self.parts.append(rows)
        self.n += len(rows)

    def run(self, weight, x: torch.Tensor, upcast: bool) -> None:
        if self.n:
            rows = torch.cat(self.parts)
            self.out = weight(x if self.n == x.shape[1] and _in_order(rows) else x[:, rows.to(x.device)], upcast)

    def of(self, who: int) -> torch.Tensor:
        start, end = self.at[who]
        return self.out[:, start:end]


def _in_order(rows: torch.Tensor) -> bool:
    return bool((rows == torch.arange(len(rows), device=rows.device)).all())


def _pick(table: tuple[torch.Tensor, torch.Tensor], gate: Gate) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary table (cos, sin), each (1, 1, T, hd), at the tokens a `some` gate runs."""
    return (table[0][:, :, gate.index], table[1][:, :, gate.index]) if gate.kind == "some" else table


def _layer(i: int, parts: LayerParts, h: torch.Tensor, seqs: list[_Seq]) -> torch.Tensor:
    a = parts.attn
    x = parts.attn_norm(h)
    gates = [q.gate(i, x, ("attention", "block")) for q in seqs]
    qkv, q_only, kv_only = _Product(), _Product(), _Product()  # rows that attend; (kv) their queries; (kv) all keys
    for k, (q, g) in enumerate(zip(seqs, gates)):
        if q.keeps_kv and g.kind != "all":
            q_only.add(k, q.rows(g))
            kv_only.add(k, q.rows(ALL))
        else:
            qkv.add(k, q.rows(g))
    qkv.run(a.qkv, x, a.upcast)
    q_only.run(a.q, x, a.upcast)
    kv_only.run(a.kv, x, a.upcast)
    heads, running = [], []
    for k, (q, g) in enumerate(zip(seqs, gates)):
        table, cache = q.tables[a.rope_key], q.seg.caches[i]
        if q.keeps_kv and g.kind != "all":
            keys, values = split_kv(a, kv_only.of(k), table)
            if g.kind == "none":
                cache.append(keys, values, q.positions)
                continue
            queries, q_pos, k_pos = split_q(a, q_only.of(k), _pick(table, g)), q.positions[g.index], q.positions
        elif g.kind == "none":
            continue
        else:
            queries, keys, values = split_qkv(a, qkv.of(k), _pick(table, g))
            q_pos = k_pos = q.positions[g.index] if g.kind == "some" else q.positions
        keys, values, k_pos = cache.append(keys, values, k_pos)
        heads.append(attend_heads(a, queries, q_pos, keys, values, k_pos, later_keys=g.kind == "some"))
        running.append(q.rows(g))
    if heads:
        out = a.o(torch.cat(heads, dim=1), a.upcast)
        if parts.attn_post_norm is not None:
            out = parts.attn_post_norm(out)
        h = _add(h, torch.cat(running), out)
    x = parts.mlp_norm(h)
    mlp = [g if q.plan.target == "block" else q.gate(i, x, ("mlp",)) for q, g in zip(seqs, gates)]  # a block's gate is both parts'
    rows = torch.cat([q.rows(g) for q, g in zip(seqs, mlp)])
    if len(rows):
        out = run_mlp(parts, x if len(rows) == x.shape[1] and _in_order(rows) else x[:, rows.to(x.device)])
        if parts.mlp_post_norm is not None:
            out = parts.mlp_post_norm(out)
        h = _add(h, rows, out)
    return h


def _add(h: torch.Tensor, rows: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
    """h (1, N, D) plus update (1, n, D) on the packed `rows`."""
    if len(rows) == h.shape[1] and _in_order(rows):
        return h + update
    return h.index_add(1, rows.to(h.device), update)
