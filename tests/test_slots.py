"""The batch's slots (core/model/slots.py) under the batched step (core/ops/batch.py): each row's attention over its own keys
only, as alone, while rows' lengths differ per layer (drop's holes), rows leave from the middle, join late, and the
buffers grow and shrink mid-run.

Each test steps the same rows two ways from the test's thread: as one batch (the step seam, `Runtime.step`: the slots) and each alone
through the engine's one-token forward on caches of its own (the reference), feeding the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from routerlab.core.base.config import RoutingConfig
from routerlab.core.decode.engine import Engine
from routerlab.core.model import slots as slots_mod
from routerlab.core.model.cache import LayerCache, release
from routerlab.core.model.models import tiny_model
from routerlab.core.ops.forward import forward
from routerlab.core.routing.gates import Plan
from routerlab.core.routing.router import RouterSet

TOL = 1e-4  # fp32: n rows' products may round differently from one row's


@dataclass
class _Row:
    feed: tuple[int, int]
    caches: list
    plan: Plan


@pytest.fixture(scope="module")
def engine():
    return Engine(tiny_model("llama"))


def _routers(model, seed: int) -> RouterSet:
    rs = RouterSet.zeros(model, RoutingConfig.from_granularity("attention-token", [0, 1, 2, 3]))
    g = torch.Generator().manual_seed(seed)
    for r in rs.routers.values():
        r.proj.weight.data = torch.randn(r.proj.weight.shape, generator=g) * 3.0  # about half the cells skip at 0.5
    return rs


def _plans(engine) -> list[Plan]:
    """Rows whose caches get different lengths at each layer: drop at three thresholds, kv, the full model."""
    att = _routers(engine.model, 0)
    return [Plan(att, 0.5, "drop"), Plan(None), Plan(att, 0.3, "drop"), Plan(att, 0.5, "kv"), Plan(att, 0.7, "drop"),
            Plan(_routers(engine.model, 1), 0.5, "drop")]


@torch.inference_mode()
def _prefilled(engine, k: int, plan: Plan, prompt: int = 5) -> _Row:
    ids = [(11 * k + j) % 100 + 1 for j in range(prompt + k)]
    caches = engine.new_caches(64)
    forward(engine.anatomy, torch.tensor([ids]), torch.arange(len(ids)), caches, plan)
    return _Row((ids[-1], len(ids)), caches, plan)


def _pair(engine, k: int, plan: Plan, prompt: int = 5) -> tuple[_Row, _Row]:
    """The same prefilled row twice: one for the batch, one to step alone."""
    return _prefilled(engine, k, plan, prompt), _prefilled(engine, k, plan, prompt)


@torch.inference_mode()
def _step_both(engine, batch: list[_Row], alone: list[_Row], t: int) -> None:
    """One step of `batch` together and of each of `alone` by itself, the same token fed; the same logits, scores and
    lengths at every layer."""
    for j, (b, a) in enumerate(zip(batch, alone)):
        b.feed = a.feed = ((7 * j + 3 * t) % 100 + 1, a.feed[1] + (t > 0))
    logits, scores = engine.runtime.step(batch)
    for j, a in enumerate(alone):
        ref, ref_scores = forward(engine.anatomy, torch.tensor([[a.feed[0]]]), torch.tensor([a.feed[1]]), a.caches, a.plan)
        assert torch.allclose(logits[j].float(), ref[0, -1].float(), atol=TOL, rtol=0), f"row {j} at step {t}"
        assert [c.n for c in batch[j].caches] == [c.n for c in a.caches], f"row {j}'s lengths per layer at step {t}"
        for s, r in zip(scores[j], ref_scores[0].tolist()):
            assert (s != s and r != r) or abs(s - r) <= TOL


def _kv_same(batch: _Row, alone: _Row) -> None:
    """What the row's caches hold (read through its own LayerCaches) is what alone wrote."""
    for b, a in zip(batch.caches, alone.caches):
        assert b.n == a.n
        if not a.n:  # a layer every token so far skipped under drop: nothing stored
            continue
        assert torch.allclose(b.k[:, :, : b.n], a.k[:, :, : a.n], atol=TOL, rtol=0)
        assert torch.equal(b.pos[: b.n], a.pos[: a.n])


def test_rows_with_holes_attend_each_to_its_own_keys(engine):
    pairs = [_pair(engine, k, p) for k, p in enumerate(_plans(engine))]
    batch, alone = [p[0] for p in pairs], [p[1] for p in pairs]
    for t in range(8):
        _step_both(engine, batch, alone, t)
    lengths = [[c.n for c in r.caches] for r in batch]
    assert any(len({row[i] for row in lengths}) > 2 for i in range(len(lengths[0]))), "some layer's rows differ in length"
    assert any(len(set(row)) > 1 for row in lengths), "some row has holes: a shorter cache at a layer it skipped"
    store = batch[0].caches[0].store
    assert store is not None and all(r.caches[0].store is store for r in batch)
    assert sorted(r.caches[0].slot for r in batch) == list(range(len(batch)))
    for b, a in zip(batch, alone):
        _kv_same(b, a)


def test_a_middle_row_that_leaves_gives_its_slot_to_the_last(engine):
    pairs = [_pair(engine, k, p) for k, p in enumerate(_plans(engine)[:5])]
    batch, alone = [p[0] for p in pairs], [p[1] for p in pairs]
    for t in range(3):
        _step_both(engine, batch, alone, t)
    store = batch[0].caches[0].store
    last = next(r for r in batch if r.caches[0].slot == 4)
    gone = next(r for r in batch if r.caches[0].slot == 1)
    held = [c.nbytes for c in gone.caches]
    release(gone.caches)  # it ended (Generation.close): its slot is freed without copying it out
    assert [c.nbytes for c in gone.caches] == held and gone.caches[0].store is None
    assert len(store.rows) == 4 and last.caches[0].slot == 1 and store.rows[1] is last.caches
    j = batch.index(gone)
    del batch[j], alone[j]
    for t in range(3, 6):
        _step_both(engine, batch, alone, t)
    for b, a in zip(batch, alone):
        _kv_same(b, a)
    # a row that simply is not in the next step leaves with its data, and goes on alone on its own buffers
    out = batch.pop(0)
    twin = alone.pop(0)
    for t in range(6, 9):
        _step_both(engine, batch, alone, t)
        _step_both(engine, [out], [twin], t)  # a batch of one: the engine's own forward, on its own caches
    assert out.caches[0].store is None and len(store.rows) == len(batch)
    _kv_same(out, twin)


def test_rows_joining_late_and_buffers_growing_mid_run(engine, monkeypatch):
    monkeypatch.setattr(LayerCache, "CHUNK", 3)  # token capacity runs out every few steps
    monkeypatch.setattr(slots_mod, "ROWS", 2)  # and slots every few rows
    plans = _plans(engine)
    batch, alone = [], []
    caps, rooms = set(), set()
    for t in range(14):
        if t < 10:  # a newcomer each step: 2, 4, 8, 16 slots
            b, a = _pair(engine, t, plans[t % len(plans)], prompt=2 + t % 3)
            batch.append(b)
            alone.append(a)
        if t == 11:  # most leave (ended): the buffers shrink
            for r in batch[2:]:
                release(r.caches)
            batch, alone = batch[:2], alone[:2]
        if len(batch) > 1:
            _step_both(engine, batch, alone, t)
            store = batch[0].caches[0].store
            caps.add(tuple(store.cap))
            rooms.add(store.room)
    assert {2, 4, 8, 16} <= rooms, rooms
    assert len(caps) > 4, "token capacity grew several times"
    assert store.room == 4 and len(store.rows) == 2  # shrunk to twice the rows left
    for b, a in zip(batch, alone):
        _kv_same(b, a)


def test_a_row_moves_from_one_batch_to_another(engine):
    plans = _plans(engine)
    pairs = [_pair(engine, k, plans[k]) for k in range(4)]
    batch, alone = [p[0] for p in pairs], [p[1] for p in pairs]
    _step_both(engine, batch[:2], alone[:2], 0)
    _step_both(engine, batch[2:], alone[2:], 0)
    first, second = batch[0].caches[0].store, batch[2].caches[0].store
    assert first is not second
    mixed, ref = [batch[0], batch[2], batch[3]], [alone[0], alone[2], alone[3]]
    _step_both(engine, mixed, ref, 1)  # row 0 joins the second batch; row 1 stays where it was
    assert batch[0].caches[0].store is second and len(second.rows) == 3
    assert len(first.rows) == 1 and first.rows[0] is batch[1].caches
    for b, a in zip(mixed, ref):
        _kv_same(b, a)


def test_the_last_row_left_in_the_slots_goes_on_alone_in_its_slot(engine, monkeypatch):
    """A batch of one takes the engine's own forward on the row's caches: still views of its slot, which grow there
    (LayerCache.append asks the slots), and the row batches again from where it stands when another joins."""
    monkeypatch.setattr(LayerCache, "CHUNK", 2)
    plans = _plans(engine)
    pairs = [_pair(engine, k, plans[k]) for k in range(3)]
    batch, alone = [p[0] for p in pairs], [p[1] for p in pairs]
    _step_both(engine, batch, alone, 0)
    store = batch[0].caches[0].store
    for r in batch[1:]:
        release(r.caches)
    batch, alone = batch[:1], alone[:1]
    caps = []
    for t in range(1, 7):
        _step_both(engine, batch, alone, t)
        caps.append(list(store.cap))
    assert batch[0].caches[0].store is store and store.rows == [batch[0].caches]
    assert caps[0] != caps[-1], "its slot grew while it ran alone"
    late_b, late_a = _pair(engine, 5, plans[5])
    batch.append(late_b)
    alone.append(late_a)
    for t in range(7, 10):
        _step_both(engine, batch, alone, t)
    assert batch[1].caches[0].store is store
    for b, a in zip(batch, alone):
        _kv_same(b, a)


def test_fit_gives_every_layer_one_capacity_and_keeps_the_rows_data(engine):
    """The step graph binds every layer's buffers with one capacity (core/graph/graph_rows.py): `fit` evens the layers out
    and grows them all, each row's keys, values and positions kept."""
    rows = []
    for n in (3, 7):
        caches = engine.new_caches(64)
        with torch.inference_mode():
            forward(engine.anatomy, torch.arange(n).view(1, -1), torch.arange(n), caches, Plan(None))
        rows.append(caches)
    store = slots_mod.Slots.of(rows, torch.float32)
    assert store.dtype == torch.float32 and rows[0][0].k.dtype == torch.float32
    kept = [(c.k[0, :, : c.n].clone(), c.pos[: c.n].clone()) for c in rows[1]]
    store.grow(1, 300)  # one layer outgrows the others
    assert len(set(store.cap)) == 2
    cap = store.fit(10)
    assert set(store.cap) == {cap} and cap >= 300
    cap = store.fit(cap + 5)  # every layer grows
    assert set(store.cap) == {cap} and cap >= 300 + 5
    for c, (k, pos) in zip(rows[1], kept):
        assert torch.equal(c.k[0, :, : c.n], k) and torch.equal(c.pos[: c.n], pos) and c.k.shape[2] == cap
