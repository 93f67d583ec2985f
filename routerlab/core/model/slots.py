"""The KV caches of a decode batch's rows in shared buffers, one slot per row, so a layer's attention over every row
is one call and its appends one indexed write.

Per layer: keys and values (slots, Hkv, tokens, hd) and positions (slots, tokens). Slot s holds one row's caches
(its `LayerCache`s, whose `k`, `v` and `pos` become views of slot s: the engine's own forward, the room's byte
accounting and `Generation.close` read them as before). Each row keeps its own length at each layer (`LayerCache.n`),
so `drop`'s holes stay: a row that skips a layer writes nothing there and its length at that layer stays shorter.
Rotary is applied before keys are stored and a decode step's query is the latest position, so a row's keys at a
layer are its first `n` entries in any order, and a mask by length is all its attention needs.

The rows of a step are always slots 0..B-1 (`Slots.of`): a row that leaves gives its slot to the last one (one
row's copy), a row that joins takes the next slot (its caches copied in, once). Buffers grow by chunks of tokens per
layer and by doubling slots, copying when they do (rarely), and shrink when most rows have left: nothing is
allocated for rows or tokens not yet seen. Knows nothing about routers, policies or sampling.
"""

from __future__ import annotations

from collections import Counter

import torch

from routerlab.core.model.cache import LayerCache

ROWS = 8  # slots allocated at first; doubled when a row finds none free


class Slots:
    def __init__(self, like: list[LayerCache], dtype: torch.dtype | None = None, first: int | None = None):
        self.shapes = [c.shape for c in like]  # (1, Hkv, hd) per layer
        self.dtype, self.device = dtype or like[0].dtype, like[0].device
        n = len(like)
        self.k: list[torch.Tensor | None] = [None] * n  # (slots, Hkv, cap, hd) per layer
        self.v: list[torch.Tensor | None] = [None] * n
        self.pos: list[torch.Tensor | None] = [None] * n  # (slots, cap)
        self.cap = [0] * n  # tokens per slot, per layer
        self.room, self.first = 0, first or ROWS  # slots allocated; how many at first
        self.rows: list[list[LayerCache]] = []  # slot -> that row's caches
        self._steps = torch.arange(0, device=self.device)  # 0, 1, 2, ...: masks by length

    # -- membership ------------------------------------------------------------------------------------
    @staticmethod
    def of(rows: list[list[LayerCache]], dtype: torch.dtype | None = None, first: int | None = None) -> Slots:
        """The slots holding exactly these rows' caches, as slots 0..B-1: those most of them are in already (else new
        ones); rows those slots held that are not among them leave with their data, rows not in them join. `dtype`:
        slots whose buffers hold that type (the step graph's fp32), else the caches' own; `first`: slots new ones
        allocate at first (default ROWS)."""
        dtype = dtype or rows[0][0].dtype
        held = Counter(id(c[0].store) for c in rows if c[0].store is not None and c[0].store.dtype == dtype)
        store = None
        if held:
            best = held.most_common(1)[0][0]
            store = next(c[0].store for c in rows if id(c[0].store) == best)
        store = store or Slots(rows[0], dtype, first)
        store.sync(rows)
        return store

    def sync(self, rows: list[list[LayerCache]]) -> None:
        wanted = {id(c) for c in rows}
        for caches in [r for r in self.rows if id(r) not in wanted]:
            self.leave(caches, keep=True)
        for caches in rows:
            if caches[0].store is not self:
                self.join(caches)

    @torch.inference_mode()
    def join(self, caches: list[LayerCache]) -> None:
        """A row's caches move into the next free slot (their data copied in)."""
        if caches[0].store is not None:
            caches[0].store.leave(caches, keep=True)
        s = len(self.rows)
        caps = [cap if c.n <= cap else c.n + LayerCache.CHUNK for c, cap in zip(caches, self.cap)]
        if s == self.room or caps != self.cap:
            self._resize(max(self.first, 2 * self.room) if s == self.room else self.room, caps)
        self.rows.append(caches)
        for i, c in enumerate(caches):
            if c.n:
                self.k[i][s, :, : c.n] = c.k[0, :, : c.n]
                self.v[i][s, :, : c.n] = c.v[0, :, : c.n]
                self.pos[i][s, : c.n] = c.pos[: c.n]
            c.store, c.layer = self, i
        self._bind(s)

    @torch.inference_mode()  # the buffers are inference tensors; a row may end outside a step
    def leave(self, caches: list[LayerCache], keep: bool) -> None:
        """A row's caches leave their slot: with their data copied out (`keep`: the request goes on elsewhere) or
        not (it ended). The last slot's row moves into the hole."""
        s = caches[0].slot
        assert self.rows[s] is caches, "these caches are not in this slot"
        for c in caches:
            if keep and c.n:
                c.k, c.v, c.pos = c.k[:, :, : c.n].clone(), c.v[:, :, : c.n].clone(), c.pos[: c.n].clone()
            else:
                c.k = c.v = c.pos = None
            c.store = None
        last = self.rows.pop()
        if last is not caches:
            self.rows[s] = last
            for i, c in enumerate(last):
                self.k[i][s, :, : c.n] = self.k[i][c.slot, :, : c.n]
                self.v[i][s, :, : c.n] = self.v[i][c.slot, :, : c.n]
                self.pos[i][s, : c.n] = self.pos[i][c.slot, : c.n]
            self._bind(s)
        if self.room > self.first and len(self.rows) <= self.room // 4:  # most rows gone: give the memory back
            caps = [max((r[i].n for r in self.rows), default=0) + LayerCache.CHUNK for i in range(len(self.cap))]
            self._resize(max(self.first, 2 * len(self.rows)), caps)

    # -- buffers ---------------------------------------------------------------------------------------
    @torch.inference_mode()
    def grow(self, layer: int, need: int) -> None:
        """Room for `need` tokens in every slot at `layer`."""
        if need > self.cap[layer]:
            caps = list(self.cap)
            caps[layer] = need + LayerCache.CHUNK
            self._resize(self.room, caps)

    @torch.inference_mode()
    def fit(self, need: int, align: int = 1) -> int:
        """Room for `need` tokens in every slot at every layer, every layer the same capacity, a multiple of `align`
        (the step graph's buffers share one): that capacity. Grows by a quarter at least, so a long context copies its
        buffers a few times, not every CHUNK tokens."""
        cap = max(self.cap)
        if need > cap or min(self.cap) < cap or cap % align:
            grown = max(cap, need + LayerCache.CHUNK, cap + cap // 4) if need > cap else cap
            self._resize(self.room, [-(-grown // align) * align] * len(self.cap))
        return self.cap[0]

    def _resize(self, room: int, caps: list[int]) -> None:
        """Buffers of `room` slots and `caps` tokens per layer; the rows' data copied over. Zero-filled: attention
        reads (masked, with weight 0) entries beyond a row's length, which must be finite."""
        b = len(self.rows)
        changed = []
        for i, ((_, h, d), cap) in enumerate(zip(self.shapes, caps)):
            if room == self.room and cap == self.cap[i]:
                continue
            k = torch.zeros(room, h, cap, d, dtype=self.dtype, device=self.device)
            v, pos = torch.zeros_like(k), torch.zeros(room, cap, dtype=torch.long, device=self.device)
            if self.k[i] is not None and b:
                t = min(cap, self.cap[i])
                k[:b, :, :t], v[:b, :, :t], pos[:b, :t] = self.k[i][:b, :, :t], self.v[i][:b, :, :t], self.pos[i][:b, :t]
            self.k[i], self.v[i], self.pos[i] = k, v, pos
            changed.append(i)
        self.room, self.cap = room, list(caps)
        for s in range(b):
            self._bind(s, changed)

    def _bind(self, s: int, layers=None) -> None:
        """Slot s's caches see slot s of the buffers."""
        caches = self.rows[s]
        for i in range(len(caches)) if layers is None else layers:
            c = caches[i]
            c.k, c.v, c.pos, c.slot = self.k[i][s : s + 1], self.v[i][s : s + 1], self.pos[i][s], s

    # -- a batched step's reads and writes -------------------------------------------------------------
    def write(self, layer: int, which: list[int], index: torch.Tensor | None, k: torch.Tensor, v: torch.Tensor,
              pos: torch.Tensor) -> tuple[list[int], torch.Tensor | None]:
        """Rows `which` (slots; `index` the same as a tensor, None for every row in order) append one key and value
        each at `layer`, each at its own length: one indexed write. k, v (n, Hkv, hd); pos (n,). Returns where each
        wrote, as a list and (unless they all wrote at the same place) as a tensor."""
        caches = [self.rows[s][layer] for s in which]
        at = [c.n for c in caches]
        end = max(at) + 1
        if end > self.cap[layer]:
            self.grow(layer, end)
        cols = None
        if min(at) == end - 1 and index is None:  # every row, one column
            b = len(which)
            self.k[layer][:b, :, end - 1] = k
            self.v[layer][:b, :, end - 1] = v
            self.pos[layer][:b, end - 1] = pos
        else:
            rows = index if index is not None else torch.tensor(which, device=self.device)
            cols = torch.tensor(at, device=self.device)
            self.k[layer][rows, :, cols] = k
            self.v[layer][rows, :, cols] = v
            self.pos[layer][rows, cols] = pos
        for c in caches:
            c.n += 1
        return at, cols

    def upto(self, t: int, cols: torch.Tensor) -> torch.Tensor:
        """(n, t): True at the entries up to and including `cols` (n,) of each row."""
        if self._steps.shape[0] < t:
            self._steps = torch.arange(max(t, 2 * self._steps.shape[0]), device=self.device)
        return self._steps[None, :t] <= cols[:, None]

    def keys_values(self, layer: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row's first t keys and values at `layer`: views (B, Hkv, t, hd), no copy."""
        b = len(self.rows)
        return self.k[layer][:b, :, :t], self.v[layer][:b, :, :t]
