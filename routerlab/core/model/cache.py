"""The KV cache of one request: one growable buffer per layer, with the positions it holds.

Positions are kept because layers' caches may have holes (the `drop` policy: a skipped token writes
nothing at that layer), so attention masks by position, not by index. A request decoding as a row of a
batch keeps its buffers in a slot of the batch's `Slots` (core/model/slots.py) instead of its own: the same
LayerCache, its `k`, `v` and `pos` then views of that slot, so every reader of a request's caches works
either way. Knows nothing about routers, policies or the model beyond an attention sub-layer's shape.
"""

from __future__ import annotations

import torch

from routerlab.core.model.anatomy import AttentionParts


class LayerCache:
    """Keys, values and their positions for one layer. Grows in chunks, so under `drop` a layer
    that stores fewer tokens really holds less memory."""

    CHUNK = 128

    def __init__(self, a: AttentionParts, capacity: int, dtype: torch.dtype, device: torch.device):
        self.shape = (1, a.n_kv_heads, a.head_dim)
        self.dtype, self.device = dtype, device
        self.limit = capacity  # the most tokens this request can store
        self.k = self.v = self.pos = None
        self.n = 0
        self.store = None  # the Slots whose slot holds this layer's buffers, while the request is a row of a batch
        self.layer = self.slot = 0  # where in `store`: set by Slots

    def _grow(self, need: int) -> None:
        if self.store is not None:  # in a slot: the batch's buffers grow for every row (and are bound here again)
            self.store.grow(self.layer, need)
            return
        if self.n and self.k is None:
            raise RuntimeError("this cache was released when its request ended")
        cap = min(self.limit, max(need + self.CHUNK, 2 * (self.pos.shape[0] if self.pos is not None else 0)))
        b, h, d = self.shape
        k = torch.empty(b, h, cap, d, dtype=self.dtype, device=self.device)
        v, pos = torch.empty_like(k), torch.empty(cap, dtype=torch.long, device=self.device)
        if self.n:
            k[:, :, : self.n], v[:, :, : self.n], pos[: self.n] = self.k[:, :, : self.n], self.v[:, :, : self.n], self.pos[: self.n]
        self.k, self.v, self.pos = k, v, pos

    def append(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = k.shape[2]
        if self.pos is None or self.n + t > self.pos.shape[0]:
            self._grow(self.n + t)
        self.k[:, :, self.n : self.n + t] = k  # (1, Hkv, t, hd)
        self.v[:, :, self.n : self.n + t] = v
        self.pos[self.n : self.n + t] = pos
        self.n += t
        return self.k[:, :, : self.n], self.v[:, :, : self.n], self.pos[: self.n]

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values stored (not the chunk slack)."""
        b, h, d = self.shape
        return 2 * self.n * h * d * torch.finfo(self.dtype).bits // 8

    @property
    def allocated_bytes(self) -> int:
        """Bytes its buffers take (in a batch's slot: the slot's share at this layer)."""
        return 0 if self.k is None else 2 * self.k.numel() * self.k.element_size()


def release(caches: list[LayerCache]) -> None:
    """A request ended: its buffers are given up (a batch's slot without copying it out); `n` and `nbytes` still
    say what each layer held."""
    if caches and caches[0].store is not None:
        caches[0].store.leave(caches, keep=False)
    for c in caches:
        c.k = c.v = c.pos = None
