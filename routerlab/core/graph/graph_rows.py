"""A room's rows through the step graph (core/graph/step_graph.py): every row's next token in one onnxruntime run, each row
with its own position, cache, threshold and decisions, as core/ops/batch.py's `_step` does with torch's ops.

The rows' caches sit in fp32 slots (core/model/slots.py, the graph's buffer type) while they step together: the graph reads
and writes slots 0..B-1 of every layer's buffers in place (one capacity for every layer), each row masked to its own
keys (under `drop`, each routed layer's own: a row's entries there are the tokens that ran it, first to last, as in
the engine's caches; the graph writes the next one and says in that layer's mask whether it counts). A row's numbers
do not depend on the other rows' decisions (a sub-layer that some rows skip runs for all of them and adds nothing to
the ones that skip), so a request decodes in a batch as alone through the graph: to the bit where MatMulNBits gives a
row the same bits among others (AVX-512, AMX), within the rounding of 8-bit activations where its one-row kernel sums
in another order (AVX2; docs/method.md, "Which parity holds where"). Knows nothing about sampling, traces, threads or the UI.
"""

from __future__ import annotations

import math

import torch

from routerlab.core.graph import graph_forms
from routerlab.core.graph.step_graph import ALIGN, CACHE, DECODES, bind, copied
from routerlab.core.model.slots import Slots


def graph_ok(row) -> bool:
    """The row feeds position n and its caches hold every position 0..n-1 at every layer (a full prefill, the full
    model, `kv` or `mask`), but at a routed layer under `drop`, which holds at most n (the tokens that ran it): what
    the graph's masks and rotary assume."""
    caches, (_, position) = row.caches, row.feed
    plan = row.plan
    if plan.routers is None or plan.policy != "drop":  # every layer holds every position: the first and last say so
        return caches[0].n == position == caches[-1].n
    own = set(plan.routers.config.layers)
    return all(c.n <= position if i in own else c.n == position for i, c in enumerate(caches))


class _Bound:
    """One room's binding to a graph: buffers for B rows and a capacity (each step's tokens, positions, cache entries,
    mask, thresholds; the logits and router logits out), written in place each step and bound again only when B or
    the capacity changes, and the slots' cache buffers, bound again only when the slots replace them (rows join,
    leave or outgrow them). Holds every tensor bound: onnxruntime reads and writes their memory by address."""

    def __init__(self, graph):
        self.graph, self.bindings = graph, [session.io_binding() for session in graph.sessions]  # one a form (graph_forms)
        self.shape: tuple = ()  # (B, capacity) the step buffers have
        self.caches: tuple = ()  # (B, the slots' buffers) bound

    def step_buffers(self, b: int, cap: int) -> None:
        if self.shape == (b, cap):
            return
        g, heads = self.graph, self.graph.kv_shape[0]
        self.h = torch.empty(b, g.h.shape[-1])
        self.position = torch.empty(b, 1, dtype=torch.int64)
        zeros = torch.zeros(b, heads, dtype=torch.int64)
        self.slot = torch.stack([torch.arange(b)[:, None].expand(b, heads), torch.arange(heads)[None].expand(b, heads),
                                 zeros, zeros], -1).contiguous()  # (B, Hkv, 4): row, head, 0, entry
        self.mask = torch.empty(b, 1, 1, 1, cap)
        self.logits = torch.empty(b, g.outs[0].shape[-1])
        self.raw = torch.full((g.layers, b), math.nan)  # routed layers' raw logits, a row of b per layer
        self.sample = self.raw.numpy()  # a numpy view of them (graph_forms.History)
        self.threshold = torch.empty(b, 1)
        self.steps = torch.arange(cap)[None]
        for name in ("h", "position", "slot", "mask") + (("threshold",) if g.routed else ()):
            self._bind(name, getattr(self, name))
        self.own = {}  # a routed layer under `drop`: its own entries (slot, mslot at each row's next one; mask)
        for i in g.dropped:
            own = self.own[i] = (self.slot.clone(), torch.zeros(b, 1, 5, dtype=torch.int64), torch.empty(b, 1, 1, 1, cap))
            own[1][:, 0, 0] = torch.arange(b)
            for name, t in zip(("slot", "mslot", "mask"), own):
                self._bind(f"l{i}.{name}", t)
            self._bind(f"l{i}.mask.out", own[2], output=True)
        self._bind("logits", self.logits, output=True)
        for i in g.routed:
            self._bind(f"l{i}.score", self.raw[i].view(b, 1), output=True)
        self.shape = (b, cap)
        self.history = graph_forms.History(g.layers, b)  # the rows' last steps' router logits (the form's choice)

    def cache_buffers(self, slots: Slots, b: int) -> None:
        if self.caches and self.caches[0] == b and all(x is y for x, y in zip(self.caches[1:], (*slots.k, *slots.v))):
            return
        for i in range(self.graph.layers):
            for kind, buffers in (("keys", slots.k), ("values", slots.v)):
                self._bind(f"l{i}.{kind}", buffers[i][:b].unsqueeze(2))  # (B, Hkv, 1, capacity, hd), as the graph reads it
                self._bind(f"l{i}.{kind}.out", buffers[i][:b].unsqueeze(2), output=True)
        self.caches = (b, *slots.k, *slots.v)  # the buffers themselves: held while bound

    def _bind(self, name: str, t: torch.Tensor, output: bool = False) -> None:
        for binding in self.bindings:
            bind(binding, name, t, output)


@torch.inference_mode()
def step(graph, rows: list) -> tuple[torch.Tensor, list[list[float]]]:
    """Each row's next-token logits (B, V) fp32 and router scores (B lists of L floats, NaN where unrouted), in the
    callers' order. Every row takes `graph` (its router set's, or the full model's for rows without one)."""
    # the rows' caches in slots 0..B-1, as many slots as rows at first (fp32: 8 slots of a 2,000-token prompt are 0.7 GB)
    slots = Slots.of([r.caches for r in rows], CACHE, first=len(rows))
    where = [r.caches[0].slot for r in rows]
    rows = sorted(rows, key=lambda r: r.caches[0].slot)
    b = len(rows)
    at = torch.tensor([r.feed[1] for r in rows])  # each row's position: where its new key goes (but under `drop`)
    cap = slots.fit(int(at.max()) + 1, ALIGN)
    bound = _binding(graph, slots)
    bound.step_buffers(b, cap)
    bound.cache_buffers(slots, b)
    bound.h.copy_(graph.embed.weight[torch.tensor([r.feed[0] for r in rows])])  # each token's embedding, in fp32
    bound.position.copy_(at.view(b, 1))
    bound.slot[..., 3] = at[:, None]
    bound.mask.fill_(0.0).view(b, cap).masked_fill_(bound.steps > at[:, None], -math.inf)  # each row's own keys
    entries = {i: torch.tensor([r.caches[i].n for r in rows]) for i in graph.dropped}  # each row's next entry there
    for i, (slot, mslot, mask) in bound.own.items():
        slot[..., 3] = entries[i][:, None]
        mslot[..., 4] = entries[i][:, None]
        mask.fill_(0.0).view(b, cap).masked_fill_(bound.steps >= entries[i][:, None], -math.inf)  # the graph writes entry n_i
    if graph.routed:
        raw = tuple(graph.raw_threshold(r.plan.threshold) for r in rows)
        bound.threshold.copy_(torch.tensor(raw).view(b, 1))
    form = graph_forms.BRANCH
    if graph.plain is not None:  # under `kv`: the form that pays for these rows now (the same numbers either way)
        form = bound.history.choose(graph.costs, raw, sum(r.feed[1] for r in rows) // b)
    graph.sessions[form].run_with_iobinding(bound.bindings[form])
    if graph.plain is not None:
        bound.history.after(bound.sample)
    rows_at = torch.arange(b)
    for i, pos in enumerate(slots.pos):
        if i in bound.own:  # under `drop`: the rows whose token ran layer i (0 where the graph wrote their entry)
            ran = bound.own[i][2].view(b, cap)[rows_at, entries[i]] == 0
            pos[rows_at[ran], entries[i][ran]] = at[ran]
            for r, counts in zip(rows, ran.tolist()):
                r.caches[i].n += counts
        else:
            pos[rows_at, at] = at
            for r in rows:
                r.caches[i].n += 1
    for r in rows:
        trace = getattr(r, "trace", None)  # a Generation's: its meta says which path decoded it
        if trace is not None:
            trace.meta.setdefault("decode", DECODES)
    logits, table = copied(bound.logits), _scores(graph, bound.raw, b)  # the buffers are the next step's too
    if where != sorted(where):  # back to the callers' order
        order = torch.tensor(where)
        logits, table = logits[order], [table[s] for s in where]
    return logits, table


def _binding(graph, slots: Slots) -> _Bound:
    """The graph's binding for these slots (one per slots a graph serves, kept while the slots live)."""
    import weakref

    bound = graph.bindings.get(id(slots))
    if bound is None or bound[0]() is not slots:
        graph.bindings = {k: v for k, v in graph.bindings.items() if v[0]() is not None}
        bound = graph.bindings[id(slots)] = (weakref.ref(slots), _Bound(graph))
    return bound[1]


def _scores(graph, raw: torch.Tensor, b: int) -> list[list[float]]:
    """Each row's calibrated scores, one float per layer, NaN where a layer is not routed (StepGraph.score_row)."""
    table = [[math.nan] * graph.layers for _ in range(b)]
    if graph.routed:
        values = raw[graph.routed].double().tolist()  # (routed, B)
        for i, row in zip(graph.routed, values):
            for j, x in enumerate(row):
                table[j][i] = graph.score(x)
    return table
