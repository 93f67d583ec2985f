"""The room (core/serve/room.py, core/ops/batch.py): many generations in one batched step, each row routed as if alone.

Every test runs the same requests alone (`Engine.generate_ids` without a room) and as rows of one room, stepped
from the test's own thread (`Room.step`): nothing depends on how fast a thread runs. Rows are mixed on purpose:
other router sets, thresholds, KV policies, prompt lengths, sampling with a seed, rows that end early or join late.
"""

from __future__ import annotations

import math
import threading

import pytest
import torch

from routerlab.core.base.config import GenerateConfig
from routerlab.core.decode.engine import Control, Engine
from routerlab.core.kernels.weights import LowBitPlan
from routerlab.core.model.models import TINY_FAMILIES, tiny_model
from routerlab.core.serve.room import Room
from random_routers import random_routers

SCORE_TOL = 1e-4  # a row's scores in the batch against alone (float32; products of n rows may round differently)




def _requests(model) -> list[tuple]:
    """(prompt ids, routers, config): one of each kind a room meets."""
    def cfg(**kw):
        return GenerateConfig(**{"max_new_tokens": 12, "ignore_eos": True, **kw})

    att = random_routers(model, "attention-token", 0)
    return [
        ([5, 17, 42, 9], None, cfg()),  # the full model
        ([5, 17, 42, 9, 33, 71, 2], att, cfg(threshold=0.5, kv_policy="kv")),
        ([88, 3, 19], att, cfg(threshold=0.3, kv_policy="drop")),
        ([7, 7, 8, 9, 10, 11, 12, 13, 14], att, cfg(threshold=0.6, kv_policy="mask")),  # not batched: its own forward, same step
        ([44, 45], random_routers(model, "mlp-token", 1), cfg(threshold=0.5)),
        ([61, 62, 63, 64, 65], random_routers(model, "block-token", 2), cfg(threshold=0.5, kv_policy="drop")),
        ([100, 101, 102, 103], random_routers(model, "attention-sequence", 3), cfg(threshold=0.5)),
        ([9, 8, 7, 6, 5], att, cfg(temperature=0.9, seed=4)),  # sampling with a seed
        ([21, 22, 23], att, cfg(max_new_tokens=4)),  # ends while the others run
        ([31, 32, 33, 34], att, cfg(quality=True, quality_chunk=3, quality_refresh=None)),  # its meter's passes between steps
    ]


def _alone(engine, request):
    ids, routers, config = request
    control = Control(config.threshold)
    list(engine.generate_ids(ids, routers, config, control))
    return control.trace


def _in_room(engine, requests, join_at: dict[int, int] | None = None, max_batch: int = 32, pack_prefill: bool = True):
    """Run the requests as rows of one room, stepped here; request k joins after `join_at[k]` steps (default 0). Every
    request waiting joins at the next step (no prefill budget): the batches, hence their rounding, never depend on timing."""
    join_at = join_at or {}
    room = engine.room = Room(engine, max_batch=max_batch)
    room.prefill_budget_s = math.inf
    room.pack_prefill = pack_prefill
    try:
        controls, readers, steps = {}, {}, 0
        while True:
            for k, (ids, routers, config) in enumerate(requests):
                if k not in controls and join_at.get(k, 0) <= steps:
                    controls[k] = Control(config.threshold)
                    readers[k] = engine.generate_ids(ids, routers, config, controls[k])
            busy = room.busy
            if len(controls) == len(requests) and not any(busy.values()):
                break
            room.step()
            steps += 1
        for reader in readers.values():
            list(reader)  # every Step is already queued: reading never waits
        return [controls[k].trace for k in range(len(requests))], room
    finally:
        engine.room = None


def _same_run(alone, shared, threshold_of):
    """Same tokens; scores within SCORE_TOL; a decision that differs lies within SCORE_TOL of its threshold."""
    assert [s.token_id for s in shared.steps] == [s.token_id for s in alone.steps]
    worst = 0.0
    for a, b in zip(alone.steps, shared.steps):
        for sa, sb, ea, eb in zip(a.scores, b.scores, a.executed, b.executed):
            assert (sa is None) == (sb is None)
            if sa is None:
                continue
            worst = max(worst, abs(sa - sb))
            assert abs(sa - sb) <= SCORE_TOL
            if ea != eb:
                assert abs(sa - threshold_of(a)) <= SCORE_TOL
    assert shared.meta["stop_reason"] == alone.meta["stop_reason"]
    return worst


@pytest.mark.parametrize("lowbit", [None, "int4"])
def test_mixed_rows_decode_as_they_do_alone(lowbit):
    model = tiny_model("llama")
    engine = Engine(model, lowbit=LowBitPlan(lowbit) if lowbit else None)
    requests = _requests(model)
    alone = [_alone(engine, r) for r in requests]
    # Packed prompts (more than weights.FEW_ROWS tokens in one product) read the dense weights where a short prompt alone
    # reads the low-bit copy: on this tiny model a requantisation far coarser than rounding, so the int4 case reads
    # its prompts one by one (the float32 case packs them).
    shared, room = _in_room(engine, requests, join_at={4: 3, 7: 6}, pack_prefill=lowbit is None)  # two rows join mid-run
    assert room.largest >= 8
    for a, s in zip(alone, shared):
        _same_run(a, s, lambda step: step.threshold)
    quality = shared[-1].generated_steps
    assert all(s.kl_full is not None for s in quality) and shared[-1].meta["quality_chunks"] >= 4
    assert shared[1].meta["room"]["shared_steps"] > 0 and shared[1].meta["room"]["largest_batch"] == room.largest
    if lowbit is None:  # the rows there at the start read their prompts in one packed forward; `mask` and late ones alone
        assert room.packed["prefills"] == 1 and room.packed["prompts"] == 7
    spent = room.spent  # where the loop's time went: every phase these rows had is counted
    assert spent["prefill"] > 0 and spent["forward"] > 0 and spent["quality"] > 0 and spent["idle"] == 0
    spent = room.time_spent()
    assert spent["steps"] == room.steps and room.steps < spent["rows"] <= room.steps * room.largest
    assert room.spent["quality"] >= shared[-1].meta["quality_seconds"]  # also the pass at its row's end


class _CountingEngine(Engine):
    """An Engine that counts its packed quality passes and the meters in each."""

    packs: list[int]

    def full_passes(self, calls, share=True):
        self.packs.append(len(calls))
        self.at.append(self.room.steps if self.room is not None else None)
        return super().full_passes(calls, share)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_quality_passes_due_together_are_packed_and_score_as_alone(family):
    """Rows that fall due together score in one packed forward (also their last tokens, as they end), and every
    token's KL and the full model's top token are what the row's meter finds alone."""
    model = tiny_model(family)
    engine = _CountingEngine(model)
    engine.packs, engine.at = [], []
    att = random_routers(model, "attention-token", 0)
    requests = [(ids, None if k == 3 else att, GenerateConfig(
        max_new_tokens=7 + k, ignore_eos=True, threshold=0.5, quality=True, quality_chunk=3, quality_refresh=None))
        for k, ids in enumerate([[5, 17, 42, 9], [88, 3, 19], [7, 8, 9, 10, 11, 12], [44, 45], [61, 62, 63]])]
    alone = [_alone(engine, r) for r in requests]
    assert engine.packs == []  # alone: one pass at a time
    shared, _ = _in_room(engine, requests)
    assert engine.packs and max(engine.packs) == 4  # the four routed rows' passes together (the full model needs none)
    for a, s in zip(alone, shared):
        assert [x.token_id for x in s.steps] == [x.token_id for x in a.steps]
        for x, y in zip(a.generated_steps, s.generated_steps):
            assert y.kl_full is not None and abs(x.kl_full - y.kl_full) <= 1e-4 and x.full_top_token == y.full_top_token
    assert all(t.meta["quality_seconds"] > 0 for t, (_, r, _) in zip(shared, requests) if r is not None)


def test_a_crowds_quality_passes_spread_over_steps_one_pack_a_step(monkeypatch):
    """Four rows fall due together, two fit a pack: two score at that step, the other two at the next (they decode
    meanwhile and score nothing alone), and every KL is still what the meter finds alone."""
    from routerlab.core.serve import room as room_module

    monkeypatch.setattr(room_module, "PACK_LOGITS", 6)  # two chunks of 3
    model = tiny_model("llama")
    engine = _CountingEngine(model)
    engine.packs, engine.at = [], []
    att = random_routers(model, "attention-token", 0)
    config = GenerateConfig(max_new_tokens=8, ignore_eos=True, threshold=0.5, quality=True, quality_chunk=3, quality_refresh=None)
    requests = [(ids, att, config) for ids in ([5, 17, 42, 9], [88, 3, 19], [7, 8, 9, 10], [44, 45, 46])]
    alone = [_alone(engine, r) for r in requests]
    shared, _ = _in_room(engine, requests)
    assert engine.packs[:2] == [2, 2] and engine.at[0] < engine.at[1]  # the second pair one step later
    for a, s in zip(alone, shared):
        assert [x.token_id for x in s.steps] == [x.token_id for x in a.steps]
        for x, y in zip(a.generated_steps, s.generated_steps):
            assert y.kl_full is not None and abs(x.kl_full - y.kl_full) <= 1e-4


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_every_family_decodes_in_a_room_as_alone(family):
    """Families the batched layers do not cover (per-head norms, sandwich norms, sliding windows, MoE) run their
    rows through the engine's own forward in the same step: the same tokens either way."""
    model = tiny_model(family)
    engine = Engine(model)
    requests = _requests(model)[:3]
    shared, _ = _in_room(engine, requests)
    for request, s in zip(requests, shared):
        _same_run(_alone(engine, request), s, lambda step: step.threshold)


def test_a_batch_of_one_is_the_one_token_step_exactly():
    model = tiny_model("llama")
    engine = Engine(model, lowbit=LowBitPlan("int4"))
    request = _requests(model)[1]
    alone = _alone(engine, request)
    (shared,), _ = _in_room(engine, [request])
    assert [s.scores for s in shared.steps] == [s.scores for s in alone.steps]
    assert [s.token_id for s in shared.steps] == [s.token_id for s in alone.steps]


def test_a_threshold_moved_between_steps_applies_to_that_row_only():
    model = tiny_model("llama")
    engine = Engine(model)
    att = random_routers(model, "attention-token", 0)
    config = GenerateConfig(max_new_tokens=10, ignore_eos=True, threshold=0.5)
    room = engine.room = Room(engine)
    try:
        a, b = Control(0.5), Control(0.5)
        ra, rb = engine.generate_ids([1, 2, 3], att, config, a), engine.generate_ids([1, 2, 3], att, config, b)
        for _ in range(4):
            room.step()
        a.threshold = 0.9
        while any(room.busy.values()):
            room.step()
        list(ra), list(rb)
    finally:
        engine.room = None
    assert {s.threshold for s in a.trace.generated_steps[-4:]} == {0.9}
    assert {s.threshold for s in b.trace.steps} == {0.5}
    assert all(e is None or e == (s >= st.threshold) for st in a.trace.steps for s, e in zip(st.scores, st.executed) if s is not None)


def test_stop_and_a_reader_that_leaves_free_their_rows():
    model = tiny_model("llama")
    engine = Engine(model)
    config = GenerateConfig(max_new_tokens=50, ignore_eos=True)
    room = engine.room = Room(engine)
    try:
        a, b, c = Control(0.5), Control(0.5), Control(0.5)
        readers = [engine.generate_ids([1, 2, 3], None, config, ctl) for ctl in (a, b, c)]
        for _ in range(5):
            room.step()
        a.request_stop()
        next(readers[1])
        readers[1].close()  # a closed tab: Gradio closes the stream's generator it was reading
        for _ in range(3):
            room.step()
        assert room.busy == {"rows": 1, "solo": 0, "waiting": 0}
        assert a.trace.meta["stop_reason"] == "stopped" and b.trace.meta["stop_reason"] == "stopped"
        c.request_stop()
        room.step()
        list(readers[0]), list(readers[2])
    finally:
        engine.room = None
    assert len(c.trace.generated_steps) < 50


def test_the_batch_cap_makes_newcomers_wait_and_solo_runs_decode_alone():
    model = tiny_model("llama")
    engine = Engine(model)
    requests = _requests(model)[:4]
    shared, room = _in_room(engine, requests, max_batch=2)
    assert room.largest == 2
    for request, s in zip(requests, shared):
        _same_run(_alone(engine, request), s, lambda step: step.threshold)
    import dataclasses

    solo = [(ids, rs, dataclasses.replace(c, shared=False)) for ids, rs, c in requests[:2]]
    traces, room = _in_room(engine, solo)
    assert room.steps == 0 and all("room" not in t.meta for t in traces)  # no batched step: each its own forward
    for request, t in zip(solo, traces):
        _same_run(_alone(engine, request), t, lambda step: step.threshold)


def test_a_row_that_fails_ends_alone_with_its_error():
    model = tiny_model("llama")
    engine = Engine(model)
    config = GenerateConfig(max_new_tokens=8, ignore_eos=True, quality=True, quality_chunk=2, quality_refresh=None)
    att = random_routers(model, "attention-token", 0)
    room = engine.room = Room(engine)
    try:
        bad, good = Control(0.5), Control(0.5)
        rb = engine.generate_ids([1, 2, 3], att, config, bad)
        rg = engine.generate_ids([4, 5, 6], att, config, good)
        room.step(), room.step()

        def broken(*args):
            raise RuntimeError("a broken quality pass")

        bad.meter.full_forward = broken
        while any(room.busy.values()):
            room.step()
        with pytest.raises(RuntimeError, match="broken quality pass"):
            list(rb)
        assert len([s for s in rg if not s.is_prompt]) == 8
    finally:
        engine.room = None


@pytest.mark.parametrize("gather", [(0.0, 0.0), (0.05, 0.2)])  # a served room's loop lets a crowd gather first
def test_the_room_runs_in_a_thread_of_its_own_and_closes(gather):
    model = tiny_model("llama")
    engine = Engine(model)
    room = engine.room = Room(engine)
    room.gather = gather
    thread = room.start()
    try:
        controls = [Control(0.5) for _ in range(3)]
        results = [None] * 3

        def visitor(k):
            results[k] = list(engine.generate_ids([k + 1, 2, 3], None, GenerateConfig(max_new_tokens=6, ignore_eos=True), controls[k]))

        threads = [threading.Thread(target=visitor, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert all(r is not None and len([s for s in r if not s.is_prompt]) == 6 for r in results)
        assert room.thread_name == "routerlab-room"
    finally:
        room.close()
        thread.join(10)
        engine.room = None
    assert not thread.is_alive() and math.isfinite(room.steps)


def test_a_served_room_gathers_a_crowd_then_reads_it_in_one_prefill_and_never_holds_a_solo_run():
    """`Room.gather`: newcomers wait while others keep arriving (less than the gap apart), the most from the first of
    them; solo runs join at once. The hold's arithmetic is checked at given instants; stepping never depends on timing."""
    import dataclasses

    model = tiny_model("llama")
    engine = Engine(model)
    room = engine.room = Room(engine)
    room.prefill_budget_s = math.inf
    config = GenerateConfig(max_new_tokens=3, ignore_eos=True)
    try:
        room.gather = (3600.0, 7200.0)  # still gathering at every step below
        readers = [engine.generate_ids([k + 1, 2, 3], None, config, Control(0.5)) for k in range(3)]
        solo = engine.generate_ids([9, 8], None, dataclasses.replace(config, shared=False), Control(0.5))
        room.step()
        assert room.busy == {"rows": 0, "solo": 1, "waiting": 3} and room.steps == 0  # the solo run decodes, the crowd waits

        room.gather = (0.1, 0.6)
        first, last = room._waiting[0].arrived, room._last_arrival
        assert room._held_for(last) == pytest.approx(0.1)  # no one has arrived for the gap yet
        assert room._held_for(last + 0.1) == 0.0
        room._last_arrival = first + 0.55  # a trickle: someone arrived just now, but the first has waited nearly the most
        assert room._held_for(first + 0.58) == pytest.approx(0.02)
        assert room._held_for(first + 0.6) == 0.0

        room.gather = (0.0, 0.0)  # off, as tests and the benches run it: the three join together
        while any(room.busy.values()):
            room.step()
        assert room.packed["prefills"] == 1 and room.packed["prompts"] == 3 and room.largest == 3
        assert all(len([s for s in r if not s.is_prompt]) == 3 for r in (*readers, solo))
    finally:
        engine.room = None


MAX_GAP = 1.5  # logits: the alone run's own gap between the two tokens where a bf16 room row departs from it


def test_the_embedded_model_in_a_room_writes_what_it_writes_alone(embedded, capsys):
    """The page's six example prompts, greedy, as rows of one room against each alone, on the embedded model's default
    path (bf16, the file's 4-bit codes). In bf16 a batch rounds differently from one row (products of n rows; attention
    over rows of other lengths, whose padding regroups the softmax's sums): logits move by a few tenths, so where two
    tokens are nearly tied greedy decoding may take the other, and the rest of that run follows another text. So: most
    runs are identical, and where a run departs from its run alone, it does so at a near-tie of the alone run's own
    distribution (a rounding, not a wrong computation; the float32 tests above require the same tokens everywhere).
    How often, and how far from a tie, depends on the machine's kernels: on a 2-core AVX-512 EPYC 3-4 of the 6 runs were
    identical, departing at gaps of at most 0.5; on a 2-core Xeon with AMX 2 of 6, at gaps of 0.125 (one bf16 step of
    these logits), 0.125, 0.125 and 1.125. So: some run is identical, and every departure is at a gap of a few bf16
    steps at most (MAX_GAP): a near-tie, where a rounding decides, not a wrong computation."""
    engine = Engine.from_loaded(embedded)
    requests, _, same, margins, room = examples_alone_and_in_a_room(engine, 32)
    with capsys.disabled():
        print(f"\n[room] embedded model, {len(requests)} example prompts in one room (largest batch {room.largest}): "
              f"runs identical to alone: {same} of {len(requests)}; where one departs, the alone run's logit gap between "
              f"the two tokens: {[round(m, 3) for m in margins]}")
    assert room.largest == len(requests) and same >= 1
    assert all(m <= MAX_GAP for m in margins)


def examples_alone_and_in_a_room(engine, new_tokens: int) -> tuple[list, list, int, list[float], Room]:
    """The page's example prompts, greedy with the shipped attention-token routers, alone and as rows of one room:
    the requests, the tokens each wrote alone, how many runs are identical, and where a run departs from its run alone, the alone run's own logit
    gap between the two tokens (its argmax checked to be the token it wrote)."""
    from routerlab.tuning.checkpoint import load_routers
    from routerlab.ui.state.resources import ROUTERS_DIR, load_prompts

    routers = load_routers(ROUTERS_DIR / "attention-token", engine.model)[0]
    config = GenerateConfig(max_new_tokens=new_tokens, ignore_eos=True)
    requests = [(engine.encode(p, config), routers, config) for p in load_prompts()]
    alone = [[s.token_id for s in _alone(engine, r).generated_steps] for r in requests]
    shared, room = _in_room(engine, requests)
    together = [[s.token_id for s in t.generated_steps] for t in shared]
    margins = []
    for (ids, r, c), x, y in zip(requests, alone, together):
        k = next((j for j, (a, b) in enumerate(zip(x, y)) if a != b), None)
        if k is not None:  # the alone run's own logits where the two first differ: how far apart were the two tokens?
            row = _alone_logits(engine, ids, r, c)[k]
            assert int(row.argmax()) == x[k]
            margins.append(float(row[x[k]] - row[y[k]]))
    return requests, alone, sum(x == y for x, y in zip(alone, together)), margins, room


def _alone_logits(engine, ids, routers, config) -> list[torch.Tensor]:
    """The distributions a generation alone samples its tokens from, in order (as Engine._steps decodes it)."""
    from routerlab.core.decode.generation import Generation
    from routerlab.core.records.trace import Trace

    control = Control(config.threshold)
    gen = Generation(engine, ids, routers, config, control, Trace(engine.n_layers, meta=engine.trace_meta(routers, config)))
    out = []
    with torch.inference_mode():
        gen.prefill()
        while True:
            out.append(gen.logits[0, -1].float())
            gen.begin()
            if gen.feed is None:
                return out
            logits, scores = engine.forward_tokens([gen.feed[0]], gen.feed[1], gen.caches, gen.plan)
            gen.end(logits, scores[0])


def test_a_long_prompt_is_read_a_chunk_a_step_while_the_others_decode(monkeypatch):
    """A prompt longer than one prefill chunk joins a running room: its chunks are read one per step, the running row
    gets a token at each of those steps, and both write what they write alone. A Stop while it reads ends it there."""
    from routerlab.core.decode import generation

    monkeypatch.setattr(generation, "PREFILL_CHUNK", 8)
    model = tiny_model("llama")
    engine = Engine(model)
    att = random_routers(model, "attention-token", 0)
    short = ([5, 17, 42, 9], att, GenerateConfig(max_new_tokens=10, ignore_eos=True, threshold=0.5))
    long = (list(range(3, 35)), att, GenerateConfig(max_new_tokens=4, ignore_eos=True, threshold=0.5))  # 32 tokens: 4 chunks
    alone = [_alone(engine, r) for r in (short, long)]
    room = engine.room = Room(engine)
    try:
        c_short, c_long = Control(0.5), Control(0.5)
        r_short = engine.generate_ids(*short, c_short)
        room.step(), room.step()
        r_long = engine.generate_ids(*long, c_long)
        grew, read = [], []
        for _ in range(4):  # the long prompt's four chunks, one per step
            before = len(c_short.trace.generated_steps)
            room.step()
            grew.append(len(c_short.trace.generated_steps) - before)
            read.append(c_long.prompt_read)
            assert room.busy["rows"] == 2
        assert grew == [1, 1, 1, 1] and read == [8, 16, 24, 32] and not c_long.trace.generated_steps
        while any(room.busy.values()):
            room.step()
        for a, s in zip(alone, (c_short.trace, c_long.trace)):
            _same_run(a, s, lambda step: step.threshold)
        list(r_short), list(r_long)

        stopped = Control(0.5)
        reader = engine.generate_ids(*long, stopped)
        room.step()
        stopped.request_stop()
        while any(room.busy.values()):
            room.step()
        list(reader)
        assert stopped.trace.meta["stop_reason"] == "stopped" and stopped.trace.meta["prefill_stopped_at"] == 8
    finally:
        engine.room = None


def test_a_rows_quality_pass_due_alone_in_a_shared_room_is_scored_then_and_a_long_prompt_is_read_ahead(monkeypatch):
    """In a shared room a row's meter leaves its passes to the room: one that falls due while no other row's does is
    scored at that step all the same (not only when its row ends), and a long prompt's full-depth reading comes a part
    a step (quality.READ_AHEAD) while the other row gains a token at each. The KLs are what the meter finds alone."""
    from routerlab.core.records import quality

    monkeypatch.setattr(quality, "READ_AHEAD", 4)
    model = tiny_model("llama")
    engine = Engine(model)
    att = random_routers(model, "attention-token", 0)
    measured = (list(range(5, 19)), att, GenerateConfig(max_new_tokens=10, ignore_eos=True, threshold=0.5, quality=True,
                                                       quality_chunk=3, quality_refresh=None))
    other = ([88, 3, 19], att, GenerateConfig(max_new_tokens=10, ignore_eos=True, threshold=0.5))
    alone = _alone(engine, measured)
    room = engine.room = Room(engine, max_batch=8)
    room.prefill_budget_s = math.inf
    try:
        controls = [Control(0.5), Control(0.5)]
        readers = [engine.generate_ids(ids, r, c, ctl) for (ids, r, c), ctl in zip((measured, other), controls)]
        fed, others = [0], []
        while any(room.busy.values()) or not others:
            room.step()
            meter = next((e.gen.meter for e in room._rows if e.gen.meter), None)
            fed.append(meter.fed if meter is not None else fed[-1])
            others.append(len(controls[1].trace.generated_steps))
            if len(controls[0].trace.generated_steps) == 7:  # mid-run: its first two chunks are scored already
                assert all(s.kl_full is not None for s in controls[0].trace.generated_steps[:6])
        for reader in readers:
            list(reader)
    finally:
        engine.room = None
    reads = [b - a for a, b in zip(fed, fed[1:])]
    assert reads[:3] == [4, 4, 4] and max(reads) == 4  # 13 tokens to read first: 4 a step, then passes of a chunk
    assert all(b - a == 1 for a, b in zip(others[:6], others[1:7]))  # the other row gains a token every step meanwhile
    shared = controls[0].trace
    for x, y in zip(alone.generated_steps, shared.generated_steps):
        assert x.token_id == y.token_id and abs(x.kl_full - y.kl_full) <= 1e-4


def test_solo_runs_take_turns_going_first():
    """Solo runs (a Compare ladder's columns, the quick sweep's runs) each take one step a room step; who goes first
    rotates, as in a lockstep, so no run always follows the batched forward."""
    model = tiny_model("llama")
    engine = Engine(model)
    room = Room(engine, max_batch=8)
    order = []

    def run(name, n=3):
        for _ in range(n):
            order.append(name)
            yield name

    from routerlab.core.serve.room import _Entry

    for name in "abc":
        room._solos.append(_Entry(args=(None, None, None, None, None), solo=run(name)))
    for _ in range(3):
        room.step()
    assert order == list("abc") + list("bca") + list("cab")


def test_an_empty_room_reads_a_long_prompt_in_a_generation_alones_chunks(monkeypatch):
    """With nobody else in the loop no step waits for a chunk: an empty room reads a long prompt as a generation alone
    does (generation.prefill_chunk: longer where bf16 is native); with others there, PREFILL_CHUNK tokens a step."""
    from routerlab.core.decode import generation

    monkeypatch.setattr(generation, "PREFILL_CHUNK", 8)
    monkeypatch.setattr(generation, "prefill_chunk", lambda engine: 32)
    engine = Engine(tiny_model("llama"))
    long = (list(range(3, 35)), None, GenerateConfig(max_new_tokens=2, ignore_eos=True))  # 32 tokens
    short = ([5, 17, 42, 9], None, GenerateConfig(max_new_tokens=8, ignore_eos=True))
    room = engine.room = Room(engine)
    try:
        alone = Control(0.5)
        reader = engine.generate_ids(*long, alone)
        room.step()
        assert alone.prompt_read == 32  # one chunk
        while any(room.busy.values()):
            room.step()
        list(reader)
        c_short, crowded = Control(0.5), Control(0.5)
        readers = [engine.generate_ids(*short, c_short)]
        room.step()
        readers.append(engine.generate_ids(*long, crowded))
        room.step()
        assert crowded.prompt_read == 8  # the room's chunk: the short row steps meanwhile
        while any(room.busy.values()):
            room.step()
        for r in readers:
            list(r)
    finally:
        engine.room = None


def test_a_sink_receives_every_step_then_the_end_from_the_loop_itself():
    """Room.submit with a sink (the engine process's way): the loop puts the Steps there, as a reader would read them,
    then END."""
    from routerlab.core.serve.room import END

    model = tiny_model("llama")
    engine = Engine(model)
    requests = _requests(model)[:3]
    alone = [_alone(engine, r) for r in requests]
    room = engine.room = Room(engine)
    room.prefill_budget_s = math.inf

    class Sink(list):
        put = list.append

    sinks = [Sink() for _ in requests]
    try:
        for (ids, routers, config), sink in zip(requests, sinks):
            control = Control(config.threshold)
            assert room.submit(ids, routers, config, control, engine.new_trace(ids, routers, config, control), sink=sink) is None
        while any(room.busy.values()):
            room.step()
    finally:
        engine.room = None
    for a, sink in zip(alone, sinks):
        assert sink[-1] is END and not any(x is END for x in sink[:-1])
        assert [s.token_id for s in sink[:-1]] == [s.token_id for s in a.steps]
