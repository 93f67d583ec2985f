"""Several sequences' full-depth forwards as one: their tokens packed side by side on one axis, so each weight is read
once for all of them, while each sequence appends to and attends over its own KV cache only.

What it is for: the quality meters of a room's rows (core/quality.py) each score a chunk of their run at full depth,
and rows that started together fall due together. One forward over 32 tokens pays most of its cost in reading (on
CPUs without bf16 units, converting) every weight, so eight chunks packed cost about what three do one by one.

Computes what `engine.forward` computes with no routers (`Plan(None)`): every sub-layer for every token, layer by
layer the same operations, products over the packed rows. Knows nothing about routers, quality, rooms or the UI.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from routerlab.core.cache import LayerCache
from routerlab.core.routed import Anatomy


@dataclass
class Segment:
    """One sequence of a packed forward: `ids` at positions start .. start + len(ids) - 1, appended to `caches`
    (one per layer); its logits are wanted at its last `n` positions."""

    ids: list[int]
    start: int
    caches: list[LayerCache]
    n: int = 1


@torch.inference_mode()
def forward_packed(an: Anatomy, segments: list[Segment]) -> list[torch.Tensor]:
    """Each segment's logits (n, V) at its last n positions, in the order given."""
    from routerlab.core.engine import attend_heads, run_mlp, split_qkv

    device = an.embed.weight.device
    bounds, lo = [], 0
    for s in segments:
        if not s.ids or not 0 < s.n <= len(s.ids):
            raise ValueError(f"a segment needs tokens and 1..{len(s.ids)} logits, not {s.n}")
        bounds.append((lo, lo + len(s.ids)))
        lo += len(s.ids)
    h = an.embed(torch.tensor([[t for s in segments for t in s.ids]], device=device))  # (1, N, D)
    positions = [torch.arange(s.start, s.start + len(s.ids), device=device) for s in segments]
    tables = [an.rope(h, p) for p in positions]  # per segment: its own positions (and dynamic kinds' lengths)
    for i, parts in enumerate(an.layers):
        a = parts.attn
        y = a.qkv(parts.attn_norm(h), a.upcast)  # (1, N, q_size + 2 * kv_size): one product for every segment
        heads = []
        for s, (lo, hi), pos, table in zip(segments, bounds, positions, tables):
            q, k, v = split_qkv(a, y[:, lo:hi], table[a.rope_key])
            k, v, k_pos = s.caches[i].append(k, v, pos)
            heads.append(attend_heads(a, q, pos, k, v, k_pos))  # (1, T, q_size)
        out = a.o(torch.cat(heads, dim=1), a.upcast)
        if parts.attn_post_norm is not None:
            out = parts.attn_post_norm(out)
        h = h + out
        out = run_mlp(parts, parts.mlp_norm(h))
        if parts.mlp_post_norm is not None:
            out = parts.mlp_post_norm(out)
        h = h + out
    wanted = torch.cat([torch.arange(hi - s.n, hi) for s, (_, hi) in zip(segments, bounds)]).to(device)
    logits = an.logits(h[:, wanted])[0]  # (sum n, V): the head only where asked
    return list(logits.split([s.n for s in segments]))
