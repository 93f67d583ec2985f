"""torch's decoder layer, written once: `run_layer` computes one layer for every forward torch runs.

A forward's tokens are a `Tokens`: one or more sequences (`Seq`) side by side on one axis, each with its own plan
(router set or none, threshold, KV policy), positions, rotary tables and KV caches. A prompt's prefill is one
sequence of T tokens; a decode step alone is one sequence of one token; a room's rows are B sequences of one token
each, whose caches sit in the slots of one `Slots` (core/model/slots.py); a quality meter's packed passes and
newcomers' prompts are several sequences of many tokens (core/ops/packed.py); training's teacher-forced pass is one
sequence under straight-through gates. The layer is the same for all of them:

  x = attn_norm(h); each sequence decides its gate from its own tokens of x (`gates.decide`; rows that share a
  router in a decode step are scored in one product); one q|k|v product for every token that attends (under `kv`, a
  query product for the running tokens and a k|v product for every token of those sequences); each sequence
  appends to its cache and attends over it (a room's rows: one write and one attention call over the slots, each
  row masked to its own length); one output map; then the same for the MLP (a block's gate is both parts').

A skipped sub-layer computes nothing for the tokens that skip it (under `kv` a skipped attention still writes their
keys and values; under `drop` nothing), and a sub-layer every token skips is not computed at all. Soft gates
(training's straight-through gates, `mask`) run every token and multiply its update; a set with stand-ins adds its
stand-in's update where a cell is skipped (`standin_add`). Products take the decode-row kernels (`Weight.batch`)
where every sequence is one token, else the kernels of a forward's tokens (`Weight.__call__`). Knows nothing about
sampling, traces, threads or the UI.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from routerlab.core.kernels.rotary import rope
from routerlab.core.model.cache import LayerCache
from routerlab.core.model.anatomy import LayerParts
from routerlab.core.model.slots import Slots
from routerlab.core.ops.sublayers import attend_heads, split_kv, split_q, split_qkv
from routerlab.core.routing.gates import ALL, NONE, Gate, Plan, decide

ATTENTION, MLP = ("attention", "block"), ("mlp",)  # the router targets deciding each part


def hard(plan: Plan) -> bool:
    """Whether `plan` gates with hard 0/1 decisions and no stand-ins (not `mask`, not training): what a room's rows
    and packed forwards take; other plans run as one sequence."""
    routers = plan.routers
    return routers is None or (not plan.ste and plan.policy != "mask" and not getattr(routers, "standin_rank", 0))


class Seq:
    """One sequence of a forward: its tokens at lo .. hi of the packed axis, at `positions` (T,), appended to
    `caches` (one per layer, or None: no cache) under `plan`; `tables` its rotary tables (rope kind -> cos, sin);
    `scores` collects its router scores (layer -> (T,) tensor, or a float for one token)."""

    __slots__ = ("lo", "hi", "plan", "positions", "caches", "tables", "scores", "target", "keeps_kv", "standins")

    def __init__(self, lo: int, hi: int, plan: Plan, positions: torch.Tensor, caches: list[LayerCache] | None,
                 tables: dict | None):
        self.lo, self.hi, self.plan, self.positions, self.caches, self.tables = lo, hi, plan, positions, caches, tables
        self.scores: dict = {}
        routed = plan.routers is not None
        self.target = plan.target
        self.keeps_kv = routed and plan.policy == "kv" and plan.level != "sequence"  # sequence level: never queried
        self.standins = routed and bool(getattr(plan.routers, "standin_rank", 0))


class Tokens:
    """A forward's sequences, packed in order on one axis (seqs[k] at lo .. hi, the next starting where it ends).

    `slots`: the sequences are a room's rows (one token each, caches in these slots, row b in slot b), with
    `positions` (B,) and `rotary` their step's tables (rope kind -> `SlotRotary`)."""

    def __init__(self, seqs: list[Seq], slots: Slots | None = None, positions: torch.Tensor | None = None,
                 rotary: dict | None = None):
        self.seqs, self.slots, self.positions, self.rotary = seqs, slots, positions, rotary
        self.n = seqs[-1].hi
        self.one = len(seqs) == 1
        self.rows = self.n == len(seqs)  # every sequence one token: a decode step's rows
        # Rows that share a router set at token level are scored together, once a layer (`_gates`); the others decide
        # one by one (one sequence, sequence level, soft gates, sequences of many tokens).
        self.sets: dict[int, tuple[Plan, list[int]]] = {}
        self.each: list[int] = []
        for k, s in enumerate(seqs):
            if not self.one and not hard(s.plan):  # soft gates and stand-ins are written for one sequence (`_standins`)
                raise ValueError("a forward of several sequences takes hard gates without stand-ins (not `mask`, "
                                 "not training)")
            if s.plan.routers is None:
                continue
            if self.rows and not self.one and s.plan.level != "sequence":
                self.sets.setdefault(id(s.plan.routers), (s.plan, []))[1].append(k)
            else:
                self.each.append(k)
        self.everyone = list(range(len(seqs)))
        # What every layer asks, answered once a forward (a decode step is mostly fixed costs: no loop it can spare)
        self.alls = [ALL] * len(seqs)  # every sequence runs (read only)
        self.every = _Pick()  # every row, in order: the product of a part no sequence skips
        for k, s in enumerate(seqs):
            self.every.add(k, s, ALL)
        self.every.done(self.n)
        self.blocks = [k for k, s in enumerate(seqs) if s.target == "block"]  # a block's gate is both parts'
        self.mlp_routed = any(s.target == "mlp" for s in seqs)
        self.standins = {s.target for s in seqs if s.standins}  # the parts where some sequence adds stand-ins

    def x(self, s: Seq, x: torch.Tensor) -> torch.Tensor:
        """A sequence's own tokens of x (1, N, D)."""
        return x if self.one else x[:, s.lo : s.hi]


# -- the layer -------------------------------------------------------------------------------------------------------
def run_layer(i: int, parts: LayerParts, h: torch.Tensor, tokens: Tokens) -> torch.Tensor:
    """Layer i on h (1, N, D): every sequence routed by its own plan, products once for the tokens that run them."""
    x = parts.attn_norm(h)
    gates = _gates(i, x, tokens, ATTENTION)
    h = attention(i, parts, h, x, gates, tokens)
    h = mlp(i, parts, h, gates, tokens)
    if "block" in tokens.standins:  # a skipped block: its stand-in, on its input
        h = _standins(i, h, x, gates, tokens, "block")
    return h


def _gates(i: int, x: torch.Tensor, tokens: Tokens, targets: tuple[str, ...]) -> list[Gate]:
    """Each sequence's gate at layer i for the part `targets` routes, from its own tokens of x (ALL where unrouted)."""
    seqs = tokens.seqs
    if not tokens.each and not tokens.sets:
        return tokens.alls
    gates = [ALL] * len(seqs)
    for k in tokens.each:
        s = seqs[k]
        router = s.plan.router(i) if s.target in targets else None
        if router is not None:
            gates[k] = decide(router, tokens.x(s, x), i, s.plan, s.scores)
    if tokens.sets:
        groups: dict[int, tuple] = {}
        for plan, members in tokens.sets.values():
            router = plan.router(i) if plan.target in targets else None
            if router is not None:
                groups.setdefault(id(router), (router, []))[1].extend(members)
        for router, members in groups.values():
            for k, score in zip(members, router.score_rows(x[0] if members == tokens.everyone else x[0, members])):
                s = seqs[k]
                s.scores[i] = score
                gates[k] = ALL if score >= s.plan.threshold else NONE
    return gates


def _standin_of(i: int, s: Seq, part: str):
    """The stand-in for sequence s at layer i where its set routes `part` there and has stand-ins, else None."""
    if not s.standins or s.target != part or s.plan.router(i) is None:
        return None
    return s.plan.routers.standin(i)


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


def _standins(i: int, h: torch.Tensor, x: torch.Tensor, gates: list[Gate], tokens: Tokens, part: str) -> torch.Tensor:
    """The stand-in's update where the sequence skips `part` (a plan with stand-ins is its forward's only sequence)."""
    return standin_add(h, x, gates[0], _standin_of(i, tokens.seqs[0], part))


class _Pick:
    """Rows of the packed axis that one product runs: sequences add theirs in order, the product runs once, each
    takes back its own slice. `whole`: the rows are every row in order (no gather, no scatter); `which`: the rows as
    ints where every sequence is one token (a room's rows)."""

    __slots__ = ("parts", "spans", "n", "end", "whole", "which", "soft", "_index")

    def __init__(self):
        self.parts: list = []  # (lo, hi) ranges, or index tensors
        self.spans: dict[int, tuple[int, int]] = {}  # sequence -> its rows in the product
        self.n = self.end = 0
        self.whole, self.which, self.soft, self._index = True, [], [], None

    def add(self, k: int, s: Seq, gate: Gate) -> None:
        if gate.kind == "none":
            return
        if gate.kind == "some":
            self.parts.append(gate.index + s.lo)
            n, self.whole = gate.index.shape[0], False
        else:
            self.whole = self.whole and s.lo == self.end
            self.parts.append((s.lo, s.hi))
            self.which.append(s.lo)
            n = s.hi - s.lo
            if gate.kind == "soft":
                self.soft.append(gate.mult)
        self.end = s.hi
        self.spans[k] = (self.n, self.n + n)
        self.n += n

    def done(self, total: int) -> _Pick:
        self.whole = self.whole and self.n == total
        return self

    def index(self, device) -> torch.Tensor | None:
        """The rows as one tensor on `device` (None: `whole`)."""
        if self.whole:
            return None
        if self._index is None:
            self._index = torch.cat([torch.arange(*p, device=device) if isinstance(p, tuple) else p for p in self.parts])
        return self._index

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.whole else x.index_select(1, self.index(x.device))

    def of(self, k: int, y: torch.Tensor) -> torch.Tensor:
        """Sequence k's rows of a product y (1, n, N), or (n, N) for decode rows."""
        start, end = self.spans[k]
        return y if start == 0 and end == y.shape[-2] else y.narrow(-2, start, end - start)

    def add_to(self, h: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        """h (1, N, D) plus update (1, n, D) or (n, D) on these rows, each soft row's update times its gate."""
        if self.soft:  # a soft-gated plan is its forward's only sequence (Tokens): its gate covers every row here
            update = update * self.soft[0].to(update.dtype)[None, :, None]
        if self.whole:
            return h + update
        return h.index_add(1, self.index(h.device), update if update.dim() == 3 else update[None])


def _product(weight, x: torch.Tensor, upcast: bool, tokens: Tokens) -> torch.Tensor:
    """Decode rows through the decode batch's kernels, x (1, n, K) or (n, K) -> (n, N) (two dimensions: a decode step
    is mostly the fixed cost of each tensor op, so no shape op it can spare); a forward's tokens through their own,
    x (1, n, K) -> (1, n, N)."""
    if tokens.rows:
        return weight.batch(x if x.dim() == 2 else x.view(-1, x.shape[-1]), upcast)
    return weight(x, upcast)


# -- attention -------------------------------------------------------------------------------------------------------
def attention(i: int, parts: LayerParts, h: torch.Tensor, x: torch.Tensor, gates: list[Gate], tokens: Tokens) -> torch.Tensor:
    """h plus the attention update of the tokens that run it (x: h normed); caches appended as each policy says."""
    if tokens.slots is not None:
        h = _slot_attention(i, parts, h, x, gates, tokens)
    else:
        h = _cache_attention(i, parts, h, x, gates, tokens)
    if "attention" in tokens.standins:
        h = _standins(i, h, x, gates, tokens, "attention")
    return h


def _cache_attention(i: int, parts: LayerParts, h: torch.Tensor, x: torch.Tensor, gates: list[Gate],
                     tokens: Tokens) -> torch.Tensor:
    a, seqs = parts.attn, tokens.seqs
    everyone = all(g is ALL for g in gates)
    if everyone:
        qkv = q_only = kv_only = running = tokens.every
        y = {"qkv": _product(a.qkv, x, a.upcast, tokens)}
    else:
        qkv, q_only, kv_only = _Pick(), _Pick(), _Pick()  # tokens that attend; (kv) their queries; (kv) all their keys
        for k, (s, g) in enumerate(zip(seqs, gates)):
            if s.keeps_kv and g.kind in ("some", "none"):
                if g.kind == "some" or s.caches is not None:  # no cache: a skipped token's keys go nowhere
                    q_only.add(k, s, g)
                    kv_only.add(k, s, ALL)
            else:
                qkv.add(k, s, g)
        y = {}
        for name, pick in (("qkv", qkv), ("q", q_only), ("kv", kv_only)):
            if pick.done(tokens.n).n:
                y[name] = _product(getattr(a, name), pick.gather(x), a.upcast, tokens)
        running = _Pick()
    heads = []
    for k, (s, g) in enumerate(zip(seqs, gates)):
        table, cache = s.tables[a.rope_key], s.caches[i] if s.caches is not None else None
        if not everyone and k in kv_only.spans:
            keys, values = split_kv(a, kv_only.of(k, y["kv"]), table)
            if g.kind == "none":
                cache.append(keys, values, s.positions)
                continue
            queries, q_pos, k_pos = split_q(a, q_only.of(k, y["q"]), _at(table, g)), s.positions[g.index], s.positions
        elif g.kind == "none":
            continue
        else:
            queries, keys, values = split_qkv(a, qkv.of(k, y["qkv"]), _at(table, g))
            q_pos = k_pos = s.positions[g.index] if g.kind == "some" else s.positions
        if cache is not None:
            keys, values, k_pos = cache.append(keys, values, k_pos)
        heads.append(attend_heads(a, queries, q_pos, keys, values, k_pos, later_keys=g.kind == "some"))
        if not everyone:
            running.add(k, s, g)
    if not heads:
        return h
    out = _product(a.o, heads[0] if len(heads) == 1 else torch.cat(heads, dim=1), a.upcast, tokens)
    if parts.attn_post_norm is not None:
        out = parts.attn_post_norm(out)
    return (running if everyone else running.done(tokens.n)).add_to(h, out)


def _at(table: tuple[torch.Tensor, torch.Tensor], gate: Gate) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary table (cos, sin), each (1, 1, T, hd), at the tokens a `some` gate runs."""
    return (table[0][:, :, gate.index], table[1][:, :, gate.index]) if gate.kind == "some" else table


class SlotRotary:
    """A room step's rotary table as its rows' heads take it: cos and signed sin (B, 1, hd), stacked (2, B, 1, hd), so
    the rows of a sub-layer cut both in one gather."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor):  # (1, 1, B, hd) each, `kernels.rope_tables` form
        self.both = torch.cat([cos, sin]).transpose(1, 2)  # (2, B, 1, hd)

    def of(self, index: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        both = self.both if index is None else self.both.index_select(1, index)
        return both[0], both[1]


def _slot_attention(i: int, parts: LayerParts, h: torch.Tensor, x: torch.Tensor, gates: list[Gate],
                    tokens: Tokens) -> torch.Tensor:
    """A room's rows: those that attend in one q|k|v product, one write of their keys and values into their slots and
    one attention call over the slots, each masked to its own length; under `kv` those that skip write theirs."""
    a, attend, keys_only = parts.attn, _Pick(), _Pick()
    for k, (s, g) in enumerate(zip(tokens.seqs, gates)):
        if g.kind == "all":
            attend.add(k, s, g)
        elif s.keeps_kv:
            keys_only.add(k, s, ALL)
    slots, positions, table, hd = tokens.slots, tokens.positions, tokens.rotary[a.rope_key], a.head_dim
    if keys_only.done(tokens.n).n:
        n, index = keys_only.n, keys_only.index(x.device)
        y = _product(a.kv, keys_only.gather(x), a.upcast, tokens)  # (n, 2 * kv_size)
        keys = rope(y[:, : a.kv_size].view(n, a.n_kv_heads, hd), table.of(index))
        slots.write(i, keys_only.which, index, keys, y[:, a.kv_size :].view(n, a.n_kv_heads, hd), _rows(positions, index))
    if not attend.done(tokens.n).n:
        return h
    n, index = attend.n, attend.index(x.device)
    y = _product(a.qkv, attend.gather(x), a.upcast, tokens)  # (n, q_size + 2 * kv_size)
    heads = a.n_heads + a.n_kv_heads
    qk = rope(y[:, : heads * hd].view(n, heads, hd), table.of(index))  # (n, Hq + Hkv, hd): queries and keys, one pass
    at, cols = slots.write(i, attend.which, index, qk[:, a.n_heads :], y[:, heads * hd :].view(n, a.n_kv_heads, hd),
                           _rows(positions, index))
    g = a.n_heads // a.n_kv_heads
    q = qk[:, : a.n_heads].view(n, a.n_kv_heads, g, hd)  # the query heads of each KV group, folded
    t = max(at) + 1  # each row's keys: its first at + 1 entries at this layer (its own just written)
    k, v = slots.keys_values(i, t)  # every row's (B, Hkv, t, hd): views
    # Only the rows that attend: a copy of their keys and values costs less than attending for every row.
    k, v = _rows(k, index), _rows(v, index)
    mask = None if cols is None or min(at) == t - 1 else slots.upto(t, cols).view(n, 1, 1, t)  # each row's own keys only
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=a.scaling)  # (n, Hkv, G, hd)
    out = _product(a.o, out.reshape(n, a.q_size), a.upcast, tokens)  # (n, D)
    if parts.attn_post_norm is not None:
        out = parts.attn_post_norm(out)
    return attend.add_to(h, out)


def _rows(t: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    return t if index is None else t.index_select(0, index)


# -- MLP -------------------------------------------------------------------------------------------------------------
def mlp(i: int, parts: LayerParts, h: torch.Tensor, gates: list[Gate], tokens: Tokens) -> torch.Tensor:
    """h plus the MLP update of the tokens that run it. `gates`: the attention's; a block's sequences keep theirs,
    the sequences routing the MLP decide here, on h normed."""
    seqs, routes, blocks = tokens.seqs, tokens.mlp_routed, tokens.blocks
    if not routes and len(blocks) == len(seqs) and all(g.kind == "none" for g in gates):
        return h  # every token skips its block
    x = parts.mlp_norm(h)
    mine = _gates(i, x, tokens, MLP) if routes else tokens.alls
    if blocks:
        mine = [gates[k] if s.target == "block" else g for k, (s, g) in enumerate(zip(seqs, mine))]
    if all(g is ALL for g in mine):
        pick = tokens.every
    else:
        pick = _Pick()
        for k, (s, g) in enumerate(zip(seqs, mine)):
            pick.add(k, s, g)
        pick.done(tokens.n)
    if pick.n:
        xs = pick.gather(x)
        if parts.gate_up is None:  # not a gated MLP (MoE): its own forward
            out = parts.mlp(xs)
        else:
            gate, up = _product(parts.gate_up, xs, parts.upcast, tokens).chunk(2, dim=-1)  # (1, n, I) or (n, I) each
            out = _product(parts.down, parts.mlp.act_fn(gate) * up, parts.upcast, tokens)  # (1, n, D) or (n, D)
        if parts.mlp_post_norm is not None:
            out = parts.mlp_post_norm(out)
        h = pick.add_to(h, out)
    if "mlp" in tokens.standins:
        h = _standins(i, h, x, mine, tokens, "mlp")
    return h
