"""Packed full-depth forwards (core/packed.py): several sequences in one forward give each the logits and the cache
its own forward gives it, on every tiny family (float32). (Which kernel a product takes depends on its row count, so on
a low-bit model packed rows may round otherwise: the quality meters' test covers that, tests/test_quality_room.py.)"""

from __future__ import annotations

import pytest
import torch

from routerlab.core.engine import Engine, forward
from routerlab.core.gates import Plan
from routerlab.core.models import TINY_FAMILIES, tiny_model
from routerlab.core.packed import Segment, forward_packed

# (prompt, chunks fed after it): sequences of other lengths, some fed twice, as quality meters feed them
RUNS = [([5, 17, 42, 9, 33, 71, 2], [[8, 9, 10], [11]]), ([88, 3], [[19, 20, 21, 22, 23]]), ([61] * 12, [[62, 63]])]


def _alone(engine, ids_chunks, n):
    caches, out, start = engine.new_caches(64), [], 0
    for chunk in ids_chunks:
        logits, _ = forward(engine.anatomy, torch.tensor([chunk]), torch.arange(start, start + len(chunk)), caches,
                            Plan(None), logits_at=slice(len(chunk) - min(n, len(chunk)), None))
        out.append(logits[0])
        start += len(chunk)
    return out, caches


def _packed(engine, n):
    caches = [engine.new_caches(64) for _ in RUNS]
    starts, outs = [0] * len(RUNS), [[] for _ in RUNS]
    for round_ in range(max(1 + len(c) for _, c in RUNS)):
        segs, who = [], []
        for r, (prompt, chunks) in enumerate(RUNS):
            feeds = [prompt, *chunks]
            if round_ < len(feeds):
                ids = feeds[round_]
                segs.append(Segment(ids, starts[r], caches[r], min(n, len(ids))))
                who.append(r)
                starts[r] += len(ids)
        for r, logits in zip(who, forward_packed(engine.anatomy, segs)):
            outs[r].append(logits)
    return outs, caches


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_packed_sequences_get_what_each_gets_alone(family):
    engine = Engine(tiny_model(family, max_position_embeddings=64) if family == "gemma3" else tiny_model(family))
    outs, caches = _packed(engine, n=3)
    for (prompt, chunks), got, cache in zip(RUNS, outs, caches):
        want, want_cache = _alone(engine, [prompt, *chunks], n=3)
        for a, b in zip(want, got):
            assert a.shape == b.shape and torch.allclose(a, b, atol=1e-4, rtol=1e-4)
        for c, d in zip(want_cache, cache):
            assert c.n == d.n and torch.allclose(c.k[:, :, : c.n], d.k[:, :, : d.n], atol=1e-5)
            assert torch.equal(c.pos[: c.n], d.pos[: d.n])


def test_a_segment_asking_for_more_logits_than_tokens_is_refused():
    engine = Engine(tiny_model("llama"))
    with pytest.raises(ValueError, match="logits"):
        forward_packed(engine.anatomy, [Segment([1, 2], 0, engine.new_caches(8), n=3)])
