"""Per-token quality cost: KL to the full model and its top token, on tiny random models."""

from __future__ import annotations

import json

import pytest
import torch

from routerlab.core.base.config import GenerateConfig, RoutingConfig
from routerlab.core.base.errors import RouterLabError
from routerlab.core.decode.engine import Control, Engine
from routerlab.core.model.models import tiny_model
from routerlab.core.records.quality import QualityMeter, kl_top_k
from routerlab.core.records.trace import Step, Trace
from routerlab.core.routing.router import RouterSet
from routerlab.tuning.data import Example
from routerlab.tuning.evaluate import evaluate_examples, full_depth, kl_to_full

PROMPT = [5, 17, 42, 9, 33, 71, 2, 88]
NEW = 20


@pytest.fixture(scope="module")
def engine():
    return Engine(tiny_model("llama"))


def routers(model, scale=None, seed=0):
    """Zero routers (never skip at 0.5), or random ones with weights of `scale` (some tokens skip)."""
    rs = RouterSet.zeros(model, RoutingConfig.from_granularity("attention-token", [1, 2]))
    if scale is not None:
        g = torch.Generator().manual_seed(seed)
        for r in rs.routers.values():
            r.proj.weight.data = torch.randn(r.proj.weight.shape, generator=g) * scale
    return rs


def generate(engine, rs, threshold=0.5, new=NEW, control=None, **kw):
    config = GenerateConfig(max_new_tokens=new, threshold=threshold, ignore_eos=True, **{"quality": True, **kw})
    control = control or Control(threshold)
    for _ in engine.generate_ids(PROMPT, rs, config, control):
        pass
    return control.trace


def test_never_skipping_routers_cost_nothing(engine):
    trace = generate(engine, routers(engine.model))
    gen = trace.generated_steps
    assert len(gen) == NEW and trace.skip_rate() == 0.0
    assert all(s.kl_full == pytest.approx(0.0, abs=1e-6) for s in gen)
    assert all(s.full_top_token is None and s.full_top_text is None for s in gen)
    assert trace.mean_kl() == pytest.approx(0.0, abs=1e-6) and trace.agreement() == 1.0


def test_skipping_routers_move_the_distribution_and_every_generated_token_is_scored(engine):
    trace = generate(engine, routers(engine.model), threshold=1.0)  # skips every routed attention
    gen = trace.generated_steps
    assert trace.skip_rate() == 1.0
    assert all(s.kl_full is not None and s.kl_full > 0 for s in gen)  # the last one (never fed back) too
    assert trace.mean_kl() > 1e-3
    assert all(s.kl_full is None and s.full_top_token is None for s in trace.prompt_steps)
    assert trace.meta["quality"] is True and trace.meta["quality_chunks"] >= 1


def test_the_full_model_costs_nothing_without_an_extra_pass(engine):
    trace = generate(engine, None)
    assert all(s.kl_full == 0.0 and s.full_top_token is None for s in trace.generated_steps)
    assert trace.meta["quality_chunks"] == 0 and trace.agreement() == 1.0


@pytest.mark.parametrize("threshold,scale", [(1.0, None), (0.5, 3.0)])
def test_kl_equals_evaluate_on_the_same_tokens(engine, threshold, scale):
    rs = routers(engine.model, scale)
    trace = generate(engine, rs, threshold=threshold)
    assert 0 < trace.skip_rate() <= 1
    ex = Example(tuple(PROMPT + [s.token_id for s in trace.generated_steps]), len(PROMPT))
    ref = evaluate_examples(engine.anatomy, [ex], rs, threshold, "kv")
    assert trace.mean_kl() == pytest.approx(ref["kl_full"], rel=1e-4, abs=1e-6)
    assert trace.agreement() == pytest.approx(ref["agreement"])
    # token by token: the routed logits evaluate scores are the ones each token was sampled from
    from routerlab.core.routing.gates import Plan
    from routerlab.tuning.forward import student_forward

    ids = torch.tensor([ex.ids])
    logits, _ = student_forward(engine.anatomy, ids, ex.start, Plan(rs, threshold, "kv"))
    per_token = kl_to_full(full_depth(engine.anatomy, [ex])[0], torch.log_softmax(logits[0].float(), -1))
    got = torch.tensor([s.kl_full for s in trace.generated_steps], dtype=torch.float64)
    torch.testing.assert_close(got, per_token, rtol=1e-4, atol=1e-6)


def test_full_top_token_is_set_exactly_where_the_top_tokens_differ(engine):
    rs = routers(engine.model)
    trace = generate(engine, rs, threshold=1.0)
    ex = Example(tuple(PROMPT + [s.token_id for s in trace.generated_steps]), len(PROMPT))
    full = full_depth(engine.anatomy, [ex])[0].argmax.tolist()
    routed = [s.token_id for s in trace.generated_steps]  # greedy: the sampled token is the routed top token
    differ = [f != r for f, r in zip(full, routed)]
    assert any(differ) and not all(differ)  # both cases occur on this seed
    for step, f, d in zip(trace.generated_steps, full, differ):
        assert step.full_top_token == (f if d else None)
        assert (step.full_top_text is not None) == d
        if d:
            assert step.full_top_text == engine.token_text(f)
    assert trace.agreement() == pytest.approx(1 - sum(differ) / len(differ))


def test_quality_off_leaves_every_field_null(engine):
    trace = generate(engine, routers(engine.model), threshold=1.0, quality=False)
    assert all(s.kl_full is None and s.full_top_token is None and s.full_top_text is None for s in trace.steps)
    assert trace.mean_kl() is None and trace.agreement() is None
    assert trace.meta["quality"] is False and "quality_chunks" not in trace.meta


def test_chunk_boundaries_do_not_change_the_numbers(engine):
    rs = routers(engine.model, 3.0)
    runs = [generate(engine, rs, quality_chunk=c, quality_refresh=None) for c in (1, 5, NEW + 10)]
    assert [r.meta["quality_chunks"] for r in runs] == [NEW, 4, 1]
    ref = runs[0].generated_steps
    for run in runs[1:]:
        for a, b in zip(ref, run.generated_steps):
            assert a.token_id == b.token_id and a.full_top_token == b.full_top_token
            assert a.kl_full == pytest.approx(b.kl_full, rel=1e-4, abs=1e-6)


def test_early_stop_still_scores_the_tokens_generated(engine):
    rs = routers(engine.model)
    control = Control(1.0)
    config = GenerateConfig(max_new_tokens=NEW, threshold=1.0, ignore_eos=True, quality=True, quality_chunk=16)
    seen = 0
    for step in engine.generate_ids(PROMPT, rs, config, control):
        seen += not step.is_prompt
        if seen == 7:
            control.request_stop()
    trace = control.trace
    assert trace.meta["stop_reason"] == "stopped" and len(trace.generated_steps) == 7
    assert all(s.kl_full is not None and s.kl_full > 0 for s in trace.generated_steps)
    full = generate(engine, rs, threshold=1.0)  # the same tokens, scored in a run that went on
    for a, b in zip(trace.generated_steps, full.generated_steps):
        assert a.kl_full == pytest.approx(b.kl_full, rel=1e-4, abs=1e-6)


def test_a_consumer_that_stops_iterating_still_gets_its_tokens_scored(engine):
    config = GenerateConfig(max_new_tokens=NEW, threshold=1.0, ignore_eos=True, quality=True)
    control = Control(1.0)
    it = engine.generate_ids(PROMPT, routers(engine.model), config, control)
    for step in it:
        if not step.is_prompt and step.position == len(PROMPT) + 3:
            break
    it.close()
    assert [s.kl_full is not None for s in control.trace.generated_steps] == [True] * 4


def test_buffered_tokens_wait_at_most_the_refresh_interval():
    steps = [Step(p, 1, "x", False, [None], [None], 0.5, 0.0) for p in (3, 4)]
    calls = []

    def full_forward(ids, start, n):
        calls.append((list(ids), start, n))
        return torch.zeros(n, 8)  # (n, V): uniform

    never = QualityMeter([7, 8, 9], full_forward, str, chunk=16, refresh_seconds=None)
    never.add(Step(3, 1, "x", False, [None], [None], 0.5, 0.0), torch.zeros(8))
    never.pump()
    assert calls == [] and len(never.pending) == 1  # without a refresh only a full chunk (or the flush) scores
    meter = QualityMeter([7, 8, 9], full_forward, str, chunk=16, refresh_seconds=0.0, budget=None)
    meter.add(steps[0], torch.zeros(8))
    meter.pump()  # nothing is full, but the token has waited long enough
    meter.add(steps[1], torch.zeros(8))
    meter.pump()
    assert calls == [([7, 8, 9], 0, 1), ([1], 3, 1)]  # the full model reads each token once, in order
    assert [s.kl_full for s in steps] == [pytest.approx(0.0, abs=1e-9)] * 2


def test_a_chunk_about_to_fill_waits_a_little_past_the_refresh_but_no_longer():
    """Due on time with 7 of 8 tokens, arrived at 2/7 s each: the chunk fills by 2.29 s, within the 2.5 s grace,
    so it waits for the full chunk; with 2 of 8 it would take 6 s more, so it is scored at 2 s; and at 2.5 s a
    partial chunk is scored whatever the pace."""
    now = [0.0]
    calls = []

    def full_forward(ids, start, n):
        calls.append(n)
        return torch.zeros(n, 8)

    def meter_with(k: int, at: float) -> QualityMeter:
        meter = QualityMeter([7, 8, 9], full_forward, str, chunk=8, refresh_seconds=2.0, budget=None, clock=lambda: now[0])
        now[0] = 0.0
        for p in range(3, 3 + k):
            meter.add(Step(p, 1, "x", False, [None], [None], 0.5, 0.0), torch.zeros(8))
        now[0] = at
        return meter

    assert not meter_with(7, 1.9).due()  # not waited long enough
    assert not meter_with(7, 2.0).due()  # about to fill: it waits for the whole chunk
    assert meter_with(2, 2.0).due()  # far from full: scored on time
    assert meter_with(7, 2.5).due()  # the grace is over: scored, full or not
    meter = meter_with(7, 2.2)
    meter.add(Step(10, 1, "x", False, [None], [None], 0.5, 0.0), torch.zeros(8))
    meter.pump()
    assert calls == [8], "the chunk it waited for is scored as one"


def test_the_meter_says_it_is_scoring_only_during_its_full_depth_forward():
    seen = []

    def full_forward(ids, start, n):
        seen.append(meter.scoring)
        raise RuntimeError("the forward failed")

    meter = QualityMeter([1, 2, 3], full_forward, str, chunk=2, refresh_seconds=None)
    for pos, tok in ((3, 4), (4, 5)):
        meter.add(Step(pos, tok, "x", False, [0.5], [True], 0.5, 0.01), torch.zeros(8))
    assert meter.scoring is False
    with pytest.raises(RuntimeError):
        meter.pump()
    assert seen == [True] and meter.scoring is False  # cleared even when the pass fails


def test_a_slow_chunk_lengthens_the_refresh_to_keep_scoring_within_budget():
    """A chunk that took 1 s makes the next time-triggered one wait 4 s (budget 0.2), not 2; a full chunk never waits."""
    now = [0.0]

    def full_forward(ids, start, n):
        now[0] += 1.0  # scoring takes one second
        return torch.zeros(n, 8)

    meter = QualityMeter([7, 8, 9], full_forward, str, chunk=3, refresh_seconds=2.0, budget=0.2, clock=lambda: now[0])
    steps = [Step(p, 1, "x", False, [None], [None], 0.5, 0.0) for p in range(3, 9)]
    meter.add(steps[0], torch.zeros(8))
    now[0] = 2.0
    assert meter.due()  # nothing scored yet: the plain 2 s refresh
    meter.pump()
    assert meter.chunks == 1 and meter.refresh_wait() == pytest.approx(4.0)
    meter.add(steps[1], torch.zeros(8))  # at t = 3
    now[0] = 5.5
    assert not meter.due()  # 2.5 s waited: past the refresh, within the budget's floor
    now[0] = 7.0
    assert meter.due()
    meter.pump()
    for s in steps[2:5]:
        meter.add(s, torch.zeros(8))
    assert meter.due()  # a full chunk is scored at once, whatever the budget
    assert QualityMeter([1], full_forward, str, refresh_seconds=None).refresh_wait() is None


def test_kl_top_k_is_exact_over_a_small_vocabulary():
    g = torch.Generator().manual_seed(0)
    p, q = torch.randn(3, 10, generator=g).log_softmax(-1), torch.randn(3, 10, generator=g).log_softmax(-1)
    top = p.topk(10, dim=-1)
    exact = (p.double().exp() * (p.double() - q.double())).sum(-1)
    torch.testing.assert_close(kl_top_k(top.values, top.indices, q), exact)


def test_quality_chunk_must_be_a_positive_whole_number_and_refresh_non_negative_seconds():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(RouterLabError):
            GenerateConfig(quality_chunk=bad)
    for bad in (-1.0, "2"):
        with pytest.raises(RouterLabError):
            GenerateConfig(quality_refresh=bad)
    assert GenerateConfig(quality_refresh=None).quality_refresh is None


def test_trace_json_round_trips_the_quality_fields_and_old_files_load():
    steps = [Step(0, 1, "a", True, [None, 0.9], [None, True], 0.5, 0.01),
             Step(1, 2, "b", False, [None, 0.4], [None, False], 0.5, 0.02, 0.25, 7, "c"),
             Step(2, 3, "d", False, [None, 0.6], [None, True], 0.5, 0.02, 0.01)]
    trace = Trace(2, steps, {"quality": True})
    back = Trace.from_json(trace.to_json())
    assert back == trace and back.mean_kl() == pytest.approx(0.13) and back.agreement() == 0.5
    old = json.loads(trace.to_json())
    old["version"] = 1
    for s in old["steps"]:
        for key in ("kl_full", "full_top_token", "full_top_text"):
            del s[key]
    loaded = Trace.from_dict(old)
    assert all(s.kl_full is None and s.full_top_token is None for s in loaded.steps)
    assert loaded.mean_kl() is None and loaded.agreement() is None


def test_bench_quality_times_whole_runs_on_the_same_tokens(engine):
    from routerlab.bench.quality import timed_run

    defaults = {"threshold": 1.0, "kv_policy": "kv"}
    off, on = (timed_run(engine, PROMPT, routers(engine.model), defaults, 12, c) for c in (None, 4))
    assert off["mean_kl"] is None and on["mean_kl"] > 0 and off["quality_chunks"] == 0 and on["quality_chunks"] == 3
    assert off["text"] == on["text"] and off["tokens"] == on["tokens"] == 12
    assert on["quality_seconds"] > 0 and off["decode_seconds"] > 0 and on["decode_seconds"] > 0


def test_generate_json_has_per_token_quality_and_no_quality_turns_it_off(embedded, capsys):
    from routerlab.__main__ import main

    args = ["generate", "--prompt", "Name a colour.", "--max-new-tokens", "5", "--threshold", "0.6", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    generated = [t for t in out["tokens"] if not t["is_prompt"]]
    assert out["quality"] is True and generated
    assert all(t["kl_full"] is not None and t["kl_full"] >= 0 for t in generated)
    assert all(t["kl_full"] is None and t["full_top_token"] is None for t in out["tokens"] if t["is_prompt"])
    for t in generated:
        assert (t["full_top_token"] is None) == (t["full_top_text"] is None)
    assert out["mean_kl"] == pytest.approx(sum(t["kl_full"] for t in generated) / len(generated))
    assert out["agreement"] == pytest.approx(sum(t["full_top_token"] is None for t in generated) / len(generated))
    assert main([*args, "--no-quality"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert off["quality"] is False and off["mean_kl"] is None and off["agreement"] is None
    assert all(t["kl_full"] is None and t["full_top_token"] is None and t["full_top_text"] is None for t in off["tokens"])
    assert off["text"] == out["text"]  # measuring never changes what is generated


def test_the_control_says_what_the_quality_pass_does(engine):
    control = Control(0.5)
    assert (control.measuring, control.scoring, control.quality_chunks) == (False, False, 0)  # not started
    generate(engine, routers(engine.model), new=NEW, control=control, quality_chunk=8)
    assert control.measuring and not control.scoring and control.quality_chunks == 3  # 20 tokens: 8 + 8 + 4
    off = Control(0.5)
    generate(engine, routers(engine.model), control=off, quality=False)
    assert (off.measuring, off.quality_chunks) == (False, 0)
    full = Control(0.5)
    generate(engine, None, control=full)  # the full model: KL 0 without a pass
    assert (full.measuring, full.quality_chunks) == (False, 0)


def test_a_long_prompt_is_read_ahead_a_part_a_pass_and_scores_nothing_until_it_is_read():
    calls = []

    def full_forward(ids, start, n):
        calls.append((list(ids), start, n))
        return torch.zeros(n, 8)

    meter = QualityMeter(list(range(10)), full_forward, str, chunk=16, refresh_seconds=None, read_ahead=3)
    assert meter.due() and meter.next_pass() == (3, 1)  # 9 tokens to read before the first scored one's position
    meter.pump()
    meter.pump()
    assert calls == [([0, 1, 2], 0, 1), ([3, 4, 5], 3, 1)] and meter.chunks == 0 and meter.seconds >= 0
    assert not meter.due() and meter.next_pass() == (0, 0)  # 3 left: the scoring pass reads them
    step = Step(10, 1, "x", False, [None], [None], 0.5, 0.0)
    meter.add(step, torch.zeros(8))
    meter.flush()
    assert calls[-1] == ([6, 7, 8, 9], 6, 1) and meter.chunks == 1 and step.kl_full == pytest.approx(0.0, abs=1e-9)


def test_reading_a_prompt_ahead_does_not_change_the_numbers(engine, monkeypatch):
    from routerlab.core.records import quality

    rs = routers(engine.model, 3.0)
    whole = generate(engine, rs, quality_refresh=None)
    monkeypatch.setattr(quality, "READ_AHEAD", 3)  # the 8-token prompt: read in passes of 3 before the first chunk
    ahead = generate(engine, rs, quality_refresh=None)
    assert ahead.meta["quality_chunks"] == whole.meta["quality_chunks"]  # the reads are no chunks
    for a, b in zip(whole.generated_steps, ahead.generated_steps):
        assert a.token_id == b.token_id and a.full_top_token == b.full_top_token
        assert a.kl_full == pytest.approx(b.kl_full, rel=1e-4, abs=1e-6)
