"""Packed forwards (core/ops/packed.py): several sequences in one forward give each the logits, scores and cache its own
forward gives it: full depth (quality passes) on every tiny family, and routed prompts of mixed plans (float32). (Which kernel a product takes depends on its row count, so on
a low-bit model packed rows may round otherwise: the quality meters' test covers that, tests/test_quality_room.py.)"""

from __future__ import annotations

import pytest
import torch

from routerlab.core.decode.engine import Engine
from routerlab.core.model.models import TINY_FAMILIES, tiny_model
from routerlab.core.ops.forward import forward
from routerlab.core.ops.packed import Segment, forward_packed
from routerlab.core.routing.gates import Plan
from random_routers import random_routers

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




@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3", "qwen2_moe"])
def test_routed_prompts_read_packed_route_and_cache_as_each_alone(family):
    """Prefills of mixed plans (kv and drop with some tokens skipping, every target, sequence level, the full model,
    a one-token prompt) packed into one forward: each gets its own scores, logits and caches, as alone."""
    model = tiny_model(family)
    engine = Engine(model)
    plans = [(None, "kv"), ("attention-token", "kv"), ("attention-token", "drop"), ("mlp-token", "kv"),
             ("block-token", "drop"), ("block-token", "kv"), ("attention-sequence", "kv"), ("attention-token", "kv")]
    prompts = [[5, 17, 42, 9, 33, 71, 2], [88, 3, 19, 20, 21, 22, 23, 24], [61] * 12, [7, 8, 9, 10, 11], [1, 2, 3, 4, 5, 6],
               [44, 45, 46, 47], [100, 101, 102, 103, 104], [9]]

    def plan(k):
        granularity, policy = plans[k]
        return Plan(random_routers(model, granularity, k) if granularity else None, 0.5, policy)

    segs = [Segment(p, 0, engine.new_caches(32), 1, plan(k)) for k, p in enumerate(prompts)]
    got = forward_packed(engine.anatomy, segs)
    skipped = 0
    for k, (p, seg, logits) in enumerate(zip(prompts, segs, got)):
        caches, alone = engine.new_caches(32), plan(k)
        want, table = forward(engine.anatomy, torch.tensor([p]), torch.arange(len(p)), caches, alone)
        assert torch.allclose(want[0], logits, atol=1e-4, rtol=1e-4), plans[k]
        assert torch.allclose(table, seg.scores, atol=1e-5, equal_nan=True), plans[k]
        skipped += int((table[~table.isnan()] < 0.5).sum())
        for c, d in zip(caches, seg.caches):  # drop's holes and kv's full rows alike
            assert c.n == d.n
            if c.n:
                assert torch.equal(c.pos[: c.n], d.pos[: d.n]) and torch.allclose(c.k[:, :, : c.n], d.k[:, :, : d.n], atol=1e-5)
    assert skipped > 10  # the plans really skipped: the packed rows were gathered, not all run


def test_plans_a_packed_forward_cannot_take_are_refused():
    engine = Engine(tiny_model("llama"))
    soft = Plan(random_routers(engine.model, "attention-token", 0), 0.5, "mask")
    with pytest.raises(ValueError, match="hard gates"):
        forward_packed(engine.anatomy, [Segment([1, 2], 0, engine.new_caches(8), 1, soft)])


@pytest.mark.parametrize("granularity,policy", [(None, "kv"), ("attention-token", "kv"), ("attention-token", "drop"),
                                                ("block-token", "drop")])
def test_prompts_that_share_their_start_read_it_once_and_get_what_each_gets_alone(granularity, policy):
    """Three prompts with the same 10 first tokens (a chat template's system turn) and one without: the stretch is
    read once and copied, and each prompt's logits, scores and caches are what its own forward gives."""
    from routerlab.core.ops.packed import forward_shared, shared_stretches

    model = tiny_model("llama")
    engine = Engine(model)
    routers = random_routers(model, granularity, 7) if granularity else None
    system = [1, 50, 51, 52, 53, 54, 55, 56, 57, 2]
    prompts = [system + [60, 61, 62], system + [70, 71], system + [80, 81, 82, 83], [90, 91, 92, 93, 94, 95, 96, 97, 98, 99]]
    segs = [Segment(p, 0, engine.new_caches(32), 1, Plan(routers, 0.5, policy)) for p in prompts]
    assert shared_stretches(segs) == [(10, [0, 1, 2])]
    got = forward_shared(engine.anatomy, segs)
    for p, seg, logits in zip(prompts, segs, got):
        caches = engine.new_caches(32)
        want, table = forward(engine.anatomy, torch.tensor([p]), torch.arange(len(p)), caches, Plan(routers, 0.5, policy))
        assert torch.allclose(want[0], logits, atol=1e-4, rtol=1e-4)
        assert seg.scores.shape == table.shape and torch.allclose(table, seg.scores, atol=1e-5, equal_nan=True)
        for c, d in zip(caches, seg.caches):
            assert c.n == d.n
            if c.n:
                assert torch.equal(c.pos[: c.n], d.pos[: d.n]) and torch.allclose(c.v[:, :, : c.n], d.v[:, :, : d.n], atol=1e-5)


def test_no_stretch_is_shared_across_plans_thresholds_or_sequence_level_sets():
    from routerlab.core.ops.packed import shared_stretches

    model = tiny_model("llama")
    att, seq = random_routers(model, "attention-token", 0), random_routers(model, "attention-sequence", 1)
    ids = list(range(1, 15))
    segs = [Segment(ids, 0, [], 1, Plan(att, 0.5, "kv")), Segment(ids, 0, [], 1, Plan(att, 0.6, "kv")),
            Segment(ids, 0, [], 1, Plan(att, 0.5, "drop")), Segment(ids, 0, [], 1, Plan(None)),
            Segment(ids, 0, [], 1, Plan(seq, 0.5, "kv")), Segment(ids, 0, [], 1, Plan(seq, 0.5, "kv")),
            Segment(ids, 3, [], 1, Plan(None))]  # a later chunk: not a prompt's start
    assert shared_stretches(segs) == []
    segs.append(Segment(ids[:9] + [99], 0, [], 2, Plan(att, 0.5, "kv")))  # shares 9 with the first, keeps its last 2
    assert shared_stretches(segs) == [(8, [0, 7])]
