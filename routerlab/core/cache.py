"""The KV cache of one request: one growable buffer per layer, with the positions it holds.

Positions are kept because layers' caches may have holes (the `drop` policy: a skipped token writes
nothing at that layer), so attention masks by position, not by index. Knows nothing about routers,
policies or the model beyond an attention sub-layer's shape.
"""

from __future__ import annotations

import torch

from routerlab.core.routed import AttentionParts


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

    def _grow(self, need: int) -> None:
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
        return 0 if self.k is None else 2 * self.k.numel() * self.k.element_size()
