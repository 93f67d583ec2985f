"""A long prompt is read in chunks (core/decode/generation.py): the same numbers as one forward, Stop between chunks, progress
on the run's Control. Driven step by step from the test's thread: nothing here depends on how fast threads run."""

import pytest
import torch

from routerlab.core.base.config import GenerateConfig, RoutingConfig
from routerlab.core.decode import generation
from routerlab.core.decode.engine import Control, Engine
from routerlab.core.decode.generation import Generation
from routerlab.core.model.models import TINY_FAMILIES, tiny_model
from routerlab.core.records.trace import Trace
from routerlab.core.routing.router import RouterSet

PROMPT = [(7 * j + 3) % 128 for j in range(70)]  # 70 tokens: 5 chunks of 14 at a chunk size of 16


def routers(model, granularity, seed=0):
    rs = RouterSet.zeros(model, RoutingConfig.from_granularity(granularity, [1, 2]))
    g = torch.Generator().manual_seed(seed)
    for r in rs.routers.values():  # random weights: about half the tokens skip at 0.5
        r.proj.weight.data = torch.randn(r.proj.weight.shape, generator=g) * 3.0
    return rs


def new_run(engine, rs, config):
    control = Control(config.threshold)
    trace = Trace(engine.n_layers, meta=engine.trace_meta(rs, config))
    control.trace = trace
    return Generation(engine, list(PROMPT), rs, config, control, trace), control


def decode(engine, gen):
    """The run to its end, one token at a time (Engine._steps): the prompt's Steps, then the generated ones."""
    return list(engine._steps(gen))


@pytest.mark.parametrize("family", TINY_FAMILIES)
@pytest.mark.parametrize("granularity, policy", [(None, "kv"), ("attention-token", "kv"), ("attention-token", "drop"),
                                                 ("mlp-token", "kv"), ("block-token", "drop"), ("attention-token", "mask")])
def test_chunked_prefill_gives_what_one_forward_gives(family, granularity, policy, monkeypatch):
    model = tiny_model(family)
    engine = Engine(model)
    rs = routers(model, granularity) if granularity else None
    config = GenerateConfig(max_new_tokens=12, kv_policy=policy, chat=False)
    runs = {}
    for chunk in (16, 10**6):
        monkeypatch.setattr(generation, "PREFILL_CHUNK", chunk)
        gen, control = new_run(engine, rs, config)
        reads = list(gen.prefill_chunks())
        logits = gen.logits.clone()
        runs[chunk] = (reads, logits, gen._prompt_steps, None, gen, control)
    (reads, logits, steps, _, gen, control), (one_reads, one_logits, one_steps, *_) = runs[16], runs[10**6]
    assert reads == [14, 28, 42, 56, 70] and one_reads == [70]
    assert control.prompt_tokens == 70 and control.prompt_read == 70
    torch.testing.assert_close(logits, one_logits, atol=1e-4, rtol=1e-4)
    assert len(steps) == len(one_steps) == 70
    for a, b in zip(steps, one_steps):
        assert [s is None for s in a.scores] == [s is None for s in b.scores]
        assert all(abs(x - y) < 1e-4 for x, y in zip(a.scores, b.scores) if x is not None)
        assert a.executed == b.executed or any(x is not None and abs(x - 0.5) < 1e-4 for x in a.scores)


@pytest.mark.parametrize("granularity, policy", [("attention-token", "kv"), ("attention-token", "drop"), ("block-token", "drop")])
def test_chunked_prefill_decodes_the_same_tokens(granularity, policy, monkeypatch):
    model = tiny_model("llama")
    engine = Engine(model)
    rs = routers(model, granularity)
    config = GenerateConfig(max_new_tokens=16, kv_policy=policy, chat=False)
    tokens = {}
    for chunk in (16, 10**6):
        monkeypatch.setattr(generation, "PREFILL_CHUNK", chunk)
        gen, control = new_run(engine, rs, config)
        steps = decode(engine, gen)
        tokens[chunk] = [s.token_id for s in steps if not s.is_prompt], control.trace.executed_matrix()
    assert tokens[16] == tokens[10**6]


def test_stop_between_chunks_ends_the_prefill_and_the_run(monkeypatch):
    monkeypatch.setattr(generation, "PREFILL_CHUNK", 16)
    model = tiny_model("llama")
    engine = Engine(model)
    gen, control = new_run(engine, routers(model, "attention-token"), GenerateConfig(max_new_tokens=8, chat=False))
    chunks = gen.prefill_chunks()
    assert next(chunks) == 14 and control.prompt_read == 14
    assert next(chunks) == 28
    control.request_stop()  # Stop pressed while the prompt is read: no more chunk runs
    assert list(chunks) == [] and control.prompt_read == 28
    meta = control.trace.meta
    assert meta["prompt_tokens"] == 70 and meta["prefill_stopped_at"] == 28 and len(gen._prompt_steps) == 28
    assert gen.begin() == [] and gen.done and meta["stop_reason"] == "stopped" and gen.generated == []


def test_a_sequence_level_set_reads_the_prompt_in_one_forward(monkeypatch):
    """It decides each layer once from the whole prompt's mean: chunks would decide from the first chunk's."""
    monkeypatch.setattr(generation, "PREFILL_CHUNK", 16)
    model = tiny_model("llama")
    gen, control = new_run(Engine(model), routers(model, "attention-sequence"), GenerateConfig(max_new_tokens=4, chat=False))
    assert list(gen.prefill_chunks()) == [70] and control.prompt_read == 70


def test_generate_reports_the_prefill_progress_on_its_control(monkeypatch):
    monkeypatch.setattr(generation, "PREFILL_CHUNK", 16)
    engine = Engine(tiny_model("llama"))
    control = Control()
    steps = engine.generate_ids(list(PROMPT), None, GenerateConfig(max_new_tokens=3), control)
    assert control.prompt_read == 0
    first = next(steps)  # the prompt's Steps come once it is read
    assert first.is_prompt and control.prompt_tokens == control.prompt_read == 70
    assert sum(1 for s in steps) == 69 + 3


def test_a_generation_alone_reads_longer_chunks_where_bf16_is_native_and_a_room_keeps_its_own():
    from types import SimpleNamespace

    def engine(dtype, upcast):
        return SimpleNamespace(dtype=dtype, anatomy=SimpleNamespace(upcast=upcast))

    assert generation.prefill_chunk(engine(torch.bfloat16, False)) == generation.PREFILL_CHUNK_NATIVE_BF16  # bf16 units
    assert generation.prefill_chunk(engine(torch.bfloat16, True)) == generation.PREFILL_CHUNK  # bf16 emulated: upcast
    assert generation.prefill_chunk(engine(torch.float32, False)) == generation.PREFILL_CHUNK
    model = tiny_model("llama")
    gen, control = new_run(Engine(model), None, GenerateConfig(max_new_tokens=2, chat=False))
    assert list(gen.prefill_chunks(16)) == [14, 28, 42, 56, 70]  # the room's chunk, given
