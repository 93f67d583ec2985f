"""The room in an engine process of its own (core/serve/remote.py, core/serve/engine_process.py, core/serve/wire.py).

The engine process builds the same tiny model as the test (`tiny_engine`, seeded). Most tests run it stepped: its
loop takes one step per `RemoteRoom.step` call from the test's thread, and moved sliders and Stops are sent before
each step, so what a run sees does not depend on how fast any thread or process runs. Waits that remain (a message
on its way) are waits for a condition with a generous guard, never timing asserts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

from routerlab.core.base.config import GenerateConfig, RoutingConfig
from routerlab.core.base.errors import RouterLabError
from routerlab.core.decode.engine import Control
from routerlab.core.records.trace import Trace
from routerlab.core.routing.router import Calibration, RouterSet
from routerlab.core.serve.engine_process import EngineSpec, tiny_engine
from routerlab.core.serve.remote import RemoteRoom
from routerlab.core.serve.room import Room

SPEC = EngineSpec("routerlab.core.serve.engine_process:tiny_engine", {"seed": 0})
SCORE_TOL = 1e-4  # as tests/test_room.py: rows of a batch against rows of another batch (float32)
KL_TOL = 1e-4
ROOT = Path(__file__).resolve().parent.parent


def _routers(model, granularity: str, seed: int, standin_rank: int = 0) -> RouterSet:
    """A visitor's set: random weights no file holds (so it must travel by value)."""
    rs = RouterSet(RoutingConfig.from_granularity(granularity, [1, 2]), model.config.num_hidden_layers, model.config.hidden_size, standin_rank)
    g = torch.Generator().manual_seed(seed)
    for p in rs.parameters():
        p.data = torch.randn(p.shape, generator=g) * (3.0 if p.shape[0] == 1 else 0.05)
    return rs


def _requests(model) -> list[tuple]:
    def cfg(**kw):
        return GenerateConfig(**{"max_new_tokens": 10, "ignore_eos": True, **kw})

    att = _routers(model, "attention-token", 0)
    calibrated = _routers(model, "attention-token", 5, standin_rank=4)
    calibrated.calibration = Calibration(1.5, 0.3)
    return [
        ([5, 17, 42, 9], None, cfg()),
        ([5, 17, 42, 9, 33, 71, 2], att, cfg(threshold=0.5)),
        ([88, 3, 19], att, cfg(threshold=0.3, kv_policy="drop")),
        ([44, 45], _routers(model, "mlp-token", 1), cfg()),
        ([9, 8, 7, 6, 5], att, cfg(temperature=0.9, seed=4)),
        ([61, 62, 63], calibrated, cfg(threshold=0.5)),  # stand-ins and a calibration cross too
        ([31, 32, 33, 34], att, cfg(quality=True, quality_chunk=3, quality_refresh=None)),  # patches arrive later
        ([21, 22, 23], att, cfg(max_new_tokens=4, shared=False)),  # a solo run (Compare's columns)
    ]


def _until(condition, what: str, guard: float = 120.0) -> None:
    end = time.time() + guard
    while not condition():
        assert time.time() < end, f"{what} did not happen within {guard:.0f} s"
        time.sleep(0.01)


def _drive(room, engine, requests) -> list[Trace]:
    """Submit every request, step the room until it is idle (stepped mode), then read every run to its end."""
    controls = [Control(c.threshold) for _, _, c in requests]
    readers = [engine.generate_ids(ids, routers, config, control) for (ids, routers, config), control in zip(requests, controls)]
    while any(room.step().values()):
        pass
    for reader in readers:
        list(reader)
    return [c.trace for c in controls]


def _in_process(engine, requests) -> list[Trace]:
    room = engine.room = Room(engine)
    try:
        controls = [Control(c.threshold) for _, _, c in requests]
        readers = [engine.generate_ids(ids, r, c, ctl) for (ids, r, c), ctl in zip(requests, controls)]
        while any(room.busy.values()):
            room.step()
        for reader in readers:
            list(reader)
        return [c.trace for c in controls]
    finally:
        engine.room = None


def _same(a: Trace, b: Trace) -> None:
    assert [s.token_id for s in b.steps] == [s.token_id for s in a.steps]
    assert [s.text for s in b.steps] == [s.text for s in a.steps]
    for x, y in zip(a.steps, b.steps):
        assert [s is None for s in x.scores] == [s is None for s in y.scores]
        assert all(abs(p - q) <= SCORE_TOL for p, q in zip(x.scores, y.scores) if p is not None)
        assert (x.kl_full is None) == (y.kl_full is None)
        if x.kl_full is not None:
            assert abs(x.kl_full - y.kl_full) <= KL_TOL and x.full_top_token == y.full_top_token
    assert b.meta["stop_reason"] == a.meta["stop_reason"]


@pytest.fixture(scope="module")
def stepped():
    engine = tiny_engine(seed=0)
    room = RemoteRoom(SPEC, stepped=True, log=lambda m: None)
    engine.room = room
    yield engine, room
    engine.room = None
    process = room._process
    room.close()
    assert process is not None and not process.is_alive()


def test_runs_through_the_engine_process_equal_the_in_process_room(stepped):
    engine, room = stepped
    requests = _requests(engine.model)
    remote = _drive(room, engine, requests)
    engine.room = None
    try:
        local = _in_process(engine, requests)
    finally:
        engine.room = room
    for a, b in zip(local, remote):
        _same(a, b)
    quality = remote[6]
    assert quality.generated_steps and all(s.kl_full is not None for s in quality.generated_steps)  # patched after streaming
    assert quality.meta["quality_chunks"] >= 3
    assert len(quality.meta["quality_seconds_by_step"]) == len(local[6].meta["quality_seconds_by_step"])
    assert remote[1].meta["room"]["shared_steps"] > 0 and room.largest >= 6 and room.steps > 0
    assert remote[1].meta["kv_bytes_held"] == local[1].meta["kv_bytes_held"]


def test_the_web_control_says_what_the_engine_control_said(stepped):
    engine, room = stepped
    config = GenerateConfig(max_new_tokens=9, ignore_eos=True, quality=True, quality_chunk=3, quality_refresh=None)
    control = Control(0.5)
    reader = engine.generate_ids([4, 5, 6], _routers(engine.model, "attention-token", 0), config, control)
    other = engine.generate_ids([7, 8], None, GenerateConfig(max_new_tokens=9, ignore_eos=True), Control(0.5))
    room.step(4)
    _until(lambda: control.sharing == 2, "the sharing count's arrival")
    assert control.measuring and not control.scoring
    while any(room.step().values()):
        pass
    list(reader), list(other)
    assert control.quality_chunks == control.trace.meta["quality_chunks"] >= 3
    assert control.sharing == 0  # the row left the room
    assert control.prompt_tokens == control.prompt_read == 3  # how far the prompt was read (a long one's progress)


def test_a_moved_threshold_and_stop_reach_the_row(stepped):
    engine, room = stepped
    routers = _routers(engine.model, "attention-token", 0)
    control = Control(0.5)
    reader = engine.generate_ids([5, 17, 42, 9], routers, GenerateConfig(max_new_tokens=60, ignore_eos=True), control)
    room.step(4)
    control.threshold = 1.0  # from the next token on
    room.step(3)
    control.request_stop()
    while any(room.step().values()):
        pass
    steps = list(reader)
    generated = [s for s in steps if not s.is_prompt]
    thresholds = [s.threshold for s in generated]
    assert 0.5 in thresholds and 1.0 in thresholds and thresholds == sorted(thresholds)
    assert control.trace.meta["stop_reason"] == "stopped" and len(generated) < 60

    # a reader that stops reading (a closed tab) stops its row too
    control = Control(0.5)
    reader = engine.generate_ids([1, 2, 3], None, GenerateConfig(max_new_tokens=60, ignore_eos=True), control)
    room.step(3)
    next(reader), next(reader)
    reader.close()
    while any(room.step().values()):
        pass
    _until(lambda: control.trace.meta.get("stop_reason") == "stopped", "the stopped run's end")
    assert len(control.trace.generated_steps) < 60


def test_an_error_in_the_engine_process_arrives_as_the_same_error(stepped):
    engine, room = stepped
    wrong = RouterSet(RoutingConfig.from_granularity("attention-token", [1]), 3, engine.anatomy.hidden_size)
    config = GenerateConfig(max_new_tokens=4)
    reader = room.submit([1, 2, 3], wrong, config, Control(0.5), Trace(engine.n_layers))  # past the web side's own check
    with pytest.raises(RouterLabError) as err:
        engine._check([1, 2, 3], wrong, config)
    with pytest.raises(RouterLabError) as remote:
        list(reader)
    assert (remote.value.problem, remote.value.fix) == (err.value.problem, err.value.fix)


def test_a_killed_engine_process_fails_its_readers_clearly_and_a_fresh_one_serves_the_next(stepped):
    engine, room = stepped
    config = GenerateConfig(max_new_tokens=60, ignore_eos=True)
    request = ([5, 17, 42, 9], _routers(engine.model, "attention-token", 0), config)
    engine.room = None
    try:
        expected = [s.token_id for s in engine.generate_ids(*request)]
    finally:
        engine.room = room
    reader = engine.generate_ids(*request, Control(0.5))
    room.step(3)
    next(reader)
    old = room.pid
    os.kill(old, signal.SIGKILL)
    with pytest.raises(RouterLabError) as err:
        list(reader)
    assert "engine process stopped unexpectedly" in str(err.value) and "Press Generate again" in str(err.value)
    control = Control(0.5)
    again = engine.generate_ids(*request, control)  # waits in this process while the fresh engine process loads
    _until(lambda: room.restarts == 1, "the restart", guard=300)
    assert room.pid != old
    while any(room.step().values()):
        pass
    assert [s.token_id for s in again] == expected


def test_a_free_running_engine_process_serves_readers_in_threads_and_close_ends_it():
    """As the app runs it: the loop in the engine process's main thread, readers in threads of this one."""
    engine = tiny_engine(seed=0)
    model = engine.model
    requests = _requests(model)[:3]
    expected = [[s.token_id for s in engine.generate_ids(*r)] for r in requests]
    room = engine.room = RemoteRoom(SPEC, log=lambda m: None)
    process = room._process
    try:
        got: dict[int, list[int]] = {}

        def read(k):
            got[k] = [s.token_id for s in engine.generate_ids(*requests[k])]

        threads = [threading.Thread(target=read, args=(k,)) for k in range(len(requests))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert [got.get(k) for k in range(len(requests))] == expected
        assert room.where in ("main", "worker")
    finally:
        engine.room = None
        room.close()
    assert not process.is_alive() and process.exitcode == 0
    with pytest.raises(RuntimeError):
        room.submit([1], None, GenerateConfig(), Control(0.5), Trace(engine.n_layers))


def test_the_engine_process_ends_when_the_web_process_dies(tmp_path):
    script = tmp_path / "web.py"
    script.write_text(textwrap.dedent(f"""
        import time
        from routerlab.core.serve.engine_process import EngineSpec
        from routerlab.core.serve.remote import RemoteRoom
        if __name__ == "__main__":
            room = RemoteRoom(EngineSpec("routerlab.core.serve.engine_process:tiny_engine", {{"seed": 0}}), log=lambda m: None)
            print(room.pid, flush=True)
            time.sleep(600)
    """))
    web = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=str(ROOT),
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        child = int(web.stdout.readline())
        assert psutil.pid_exists(child)
        web.kill()
        web.wait(30)

        def gone() -> bool:
            try:
                return psutil.Process(child).status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        _until(gone, "the engine process's end after its web process was killed", guard=60)
    finally:
        web.kill()


def test_an_engine_process_that_cannot_start_falls_back_to_this_process_and_says_so():
    from routerlab.core.serve.remote import open_room

    engine = tiny_engine(seed=0)
    said: list[str] = []
    room = open_room(engine, EngineSpec("routerlab.core.serve.engine_process:no_such_factory"), log=said.append)
    try:
        assert isinstance(room, Room) and engine.room is room
        assert any("did not start" in m and "no_such_factory" in m and "in this process instead" in m for m in said), said
    finally:
        engine.room = None
        room.close()


def test_the_sender_waits_longer_for_a_crowd_up_to_a_cap():
    """Each send wakes the web process's threads: with more requests in flight the sender gathers longer."""
    from routerlab.core.serve import engine_process as ep

    assert ep.coalesce_seconds(0) == ep.coalesce_seconds(ep.ROWS_PER_COALESCE) == ep.COALESCE_S
    assert ep.coalesce_seconds(2 * ep.ROWS_PER_COALESCE) == 2 * ep.COALESCE_S
    assert ep.coalesce_seconds(1000) == ep.COALESCE_MAX_S
