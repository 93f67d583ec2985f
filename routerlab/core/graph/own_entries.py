"""A routed layer's own cache entries under `drop` for a request alone through the step graph (core/graph/step_graph.py):
the tokens that ran the layer, first to last, and the mask and slots that point the graph at the next entry. Knows
nothing about models or sessions: torch tensors and numpy views of them.
"""

from __future__ import annotations

import math

import torch


class OwnEntries:
    """A routed layer's own entries under `drop` for a request alone: its first `n` entries hold the tokens that ran
    it (`ran`: the positions of those added since `load`); `mask` 0 there, -inf elsewhere (the graph writes entry n
    each step: 0 where the token ran the layer); `slot` and `mslot` point at entry n."""

    def __init__(self, heads: int, capacity: int, n: int):
        with torch.inference_mode(False):
            self.mask = torch.full((1, 1, 1, 1, capacity), -math.inf)
            self.mask[..., :n] = 0
            self.slot = torch.tensor([[[0, h, 0, 0] for h in range(heads)]], dtype=torch.int64)
            self.mslot = torch.zeros(1, 1, 5, dtype=torch.int64)
        # numpy views of the same memory: read and written each step for every such layer, a few hundred
        # nanoseconds each where torch's indexing takes microseconds
        self.entries, self.at, self.mat = self.mask.numpy().reshape(-1), self.slot.numpy()[0, :, 3], self.mslot.numpy().reshape(-1)
        self.n, self.first, self.ran = n, n, []
        self.point()

    def point(self) -> None:
        self.at[:] = self.n
        self.mat[4] = self.n

    def count(self, position: int) -> None:
        """After a step at `position`: the entry the graph wrote counts where the token ran the layer."""
        if self.entries[self.n] == 0:
            self.ran.append(position)
            self.n += 1
            self.point()
