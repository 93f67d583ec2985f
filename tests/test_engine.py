"""The engine against plain transformers, on tiny random models of every supported family."""

import threading

import pytest
import torch
from torch import nn

from routerlab.core.base.config import GenerateConfig, RoutingConfig
from routerlab.core.base.errors import RouterLabError
from routerlab.core.decode.engine import Control, Engine
from routerlab.core.model.models import TINY_FAMILIES, tiny_model
from routerlab.core.ops.forward import forward
from routerlab.core.routing.gates import Plan
from routerlab.core.routing.router import RouterSet

GRANULARITIES = ["attention-token", "mlp-token", "block-token", "attention-sequence"]
POLICIES = ["mask", "kv", "drop"]
ROUTED = [1, 2]


def routers(model, granularity, seed=None):
    rs = RouterSet.zeros(model, RoutingConfig.from_granularity(granularity, ROUTED))
    if seed is not None:  # random weights: roughly half the tokens skip at threshold 0.5
        g = torch.Generator().manual_seed(seed)
        for r in rs.routers.values():
            r.proj.weight.data = torch.randn(r.proj.weight.shape, generator=g) * 3.0
    return rs


def run(engine, ids, plan, prefill=8):
    """Prefill `prefill` tokens, then decode the rest one at a time; logits for every position."""
    caches = engine.new_caches(ids.shape[1])
    with torch.no_grad():
        logits, _ = forward(engine.anatomy, ids[:, :prefill], torch.arange(prefill), caches, plan, logits_at=slice(None))
        out = [logits]
        for t in range(prefill, ids.shape[1]):
            step, _ = forward(engine.anatomy, ids[:, t : t + 1], torch.tensor([t]), caches, plan)
            out.append(step)
    return torch.cat(out, dim=1)


class NoAttention(nn.Module):
    def forward(self, hidden_states, *args, **kwargs):
        return torch.zeros_like(hidden_states), None


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_never_skip_matches_base_logits(family):
    model = tiny_model(family)
    engine = Engine(model)
    ids = torch.randint(0, 128, (1, 14), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits
    for granularity in GRANULARITIES:
        for policy in POLICIES:
            got = run(engine, ids, Plan(routers(model, granularity), 0.5, policy))
            torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4, msg=f"{granularity} {policy}")


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_kv_policy_gives_mask_outputs_with_partial_skipping(family):
    model = tiny_model(family)
    engine = Engine(model)
    ids = torch.randint(0, 128, (1, 14), generator=torch.Generator().manual_seed(2))
    for granularity in ["attention-token", "block-token"]:
        rs = routers(model, granularity, seed=3)
        masked = run(engine, ids, Plan(rs, 0.5, "mask"))
        kv = run(engine, ids, Plan(rs, 0.5, "kv"))
        torch.testing.assert_close(kv, masked, atol=1e-4, rtol=1e-4)
        drop = run(engine, ids, Plan(rs, 0.5, "drop"))
        assert (drop - masked).abs().max() > 1e-3, "drop should change the numbers when tokens skip"


@pytest.mark.parametrize("family", TINY_FAMILIES)
@pytest.mark.parametrize("policy", POLICIES)
def test_always_skipping_attention_equals_attention_removed(family, policy):
    model = tiny_model(family)
    engine = Engine(model)
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(4))
    got = run(engine, ids, Plan(routers(model, "attention-token"), 0.51, policy))  # zero routers score 0.5
    for i in ROUTED:
        model.model.layers[i].self_attn = NoAttention()
    with torch.no_grad():
        ref = model(ids).logits
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_sequence_level_drop_equals_mask():
    model = tiny_model("llama")
    engine = Engine(model)
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(5))
    for seed in range(4):
        rs = routers(model, "attention-sequence", seed=seed)
        torch.testing.assert_close(run(engine, ids, Plan(rs, 0.5, "drop")), run(engine, ids, Plan(rs, 0.5, "mask")))


@pytest.mark.parametrize("policy", ["drop", "kv"])
def test_skipped_attention_computes_no_query(policy, monkeypatch):
    """Skipped layers never project queries (drop: nothing at all; kv: only keys and values), in the prefill and in
    every decode step (both through torch's one layer)."""
    import routerlab.core.ops.layer as layer

    model = tiny_model("llama")
    engine = Engine(model)
    layer_of = {id(p.attn): i for i, p in enumerate(engine.anatomy.layers)}
    queries, kv_only = [], []
    for name, sink in (("split_q", queries), ("split_qkv", queries), ("split_kv", kv_only)):
        real = getattr(layer, name)
        monkeypatch.setattr(layer, name, lambda a, *args, real=real, sink=sink: sink.append(layer_of[id(a)]) or real(a, *args))
    config = GenerateConfig(max_new_tokens=5, threshold=0.51, kv_policy=policy)
    list(engine.generate_ids([1, 2, 3], routers(model, "attention-token"), config))
    assert len(queries) == 2 * 5, "layers 0 and 3 run their queries at the prefill and at each of 4 decode steps"
    assert set(queries) == {0, 3}, "layers 1 and 2 were skipped and must never run their query projection"
    assert set(kv_only) == ({1, 2} if policy == "kv" else set())
    assert len(kv_only) == (2 * 5 if policy == "kv" else 0)


def test_generate_records_one_step_per_token():
    model = tiny_model("llama")
    engine = Engine(model)
    control = Control(0.5)
    steps = list(engine.generate_ids([5, 6, 7], routers(model, "attention-token", seed=0), GenerateConfig(max_new_tokens=6), control))
    assert [s.is_prompt for s in steps] == [True] * 3 + [False] * 6
    assert [s.position for s in steps] == list(range(9))
    assert steps[1].scores[0] is None and steps[1].scores[1] is not None
    assert control.trace.steps == steps and control.trace.meta["stop_reason"] == "max_new_tokens"


def test_live_threshold_change_applies_to_later_tokens():
    model = tiny_model("llama")
    engine = Engine(model)
    control = Control(0.0)
    rs = routers(model, "attention-token", seed=0)
    seen = []
    for step in engine.generate_ids([5, 6, 7], rs, GenerateConfig(max_new_tokens=10, threshold=0.0), control):
        seen.append(step)
        if len(seen) == 6:
            control.threshold = 1.0
    generated = [s for s in seen if not s.is_prompt and s.scores[1] is not None]
    assert all(s.executed[1] for s in generated if s.threshold == 0.0)
    assert not any(s.executed[1] for s in generated if s.threshold == 1.0)
    assert {s.threshold for s in generated} == {0.0, 1.0}


def test_stop_request_ends_generation():
    model = tiny_model("llama")
    engine = Engine(model)
    control = Control()
    n = 0
    for step in engine.generate_ids([1, 2], None, GenerateConfig(max_new_tokens=50), control):
        n += not step.is_prompt
        if n == 3:
            control.request_stop()
    assert n == 3 and control.trace.meta["stop_reason"] == "stopped"


def test_concurrent_generations_keep_their_own_thresholds():
    model = tiny_model("llama")
    engine = Engine(model)
    rs = routers(model, "attention-token", seed=0)
    alone, together = {}, {}

    def work(t, into):
        control = Control(t)
        list(engine.generate_ids([3, 4, 5], rs, GenerateConfig(max_new_tokens=30, threshold=t), control))
        into[t] = control.trace

    for t in (0.2, 0.8):
        work(t, alone)
    threads = [threading.Thread(target=work, args=(t, together)) for t in alone]
    [th.start() for th in threads]
    [th.join() for th in threads]
    for t in alone:
        assert [s.token_id for s in together[t].steps] == [s.token_id for s in alone[t].steps]
        assert together[t].executed_matrix() == alone[t].executed_matrix()
        assert all(s.threshold == t for s in together[t].steps)
    assert alone[0.2].skip_rate() < alone[0.8].skip_rate()


def test_sampling_is_reproducible_with_a_seed():
    engine = Engine(tiny_model("llama"))
    cfg = GenerateConfig(max_new_tokens=12, temperature=1.0, top_p=0.9, seed=7)
    a = [s.token_id for s in engine.generate_ids([1, 2], None, cfg)]
    b = [s.token_id for s in engine.generate_ids([1, 2], None, cfg)]
    assert a == b


@pytest.mark.parametrize("temperature", [1e-45, 5e-324, 1e-30, 1e-6])
def test_a_tiny_temperature_decodes_greedily(temperature):
    """1e-45 used to end in `probability tensor contains either inf, nan`: logits over a denormal overflowed."""
    engine = Engine(tiny_model("llama"))
    greedy = [s.token_id for s in engine.generate_ids([1, 2], None, GenerateConfig(max_new_tokens=8))]
    tiny = [s.token_id for s in engine.generate_ids([1, 2], None, GenerateConfig(max_new_tokens=8, temperature=temperature, seed=3))]
    assert tiny == greedy


def test_a_small_temperature_samples_without_overflow():
    """Above the greedy cut, large logits over a small temperature still give a finite distribution (max subtracted)."""
    from routerlab.core.base.config import GREEDY_BELOW
    from routerlab.core.decode.generation import sample

    logits = torch.tensor([[[3e4, -3e4, 2.9e4, 0.0]]])
    config = GenerateConfig(temperature=GREEDY_BELOW * 2, seed=0)
    assert sample(logits, config, torch.Generator().manual_seed(0)) == 0


def test_greedy_takes_the_first_largest_logit_in_the_logits_own_dtype():
    """Greedy sampling is argmax's answer (the first of tied largest logits; a NaN wins, as with argmax), read in
    bf16 or fp32 without a copy."""
    from routerlab.core.decode.generation import sample

    config = GenerateConfig(temperature=0.0)
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        for _ in range(50):
            logits = torch.randint(0, 4, (1, 2, 300), generator=g).to(dtype)  # many ties
            assert sample(logits, config, None) == int(logits[0, -1].argmax())
        logits = torch.zeros(1, 1, 40, dtype=dtype)
        logits[0, 0, [7, 30]] = float("nan")
        assert sample(logits, config, None) == int(logits[0, -1].argmax()) == 7


@pytest.mark.parametrize(
    "config, ids, message",
    [
        (dict(max_new_tokens=300), [1] * 10, "exceeds the model's context"),
        (dict(), [], "prompt is empty"),
    ],
)
def test_bad_requests_get_clear_errors(config, ids, message):
    engine = Engine(tiny_model("llama"))
    with pytest.raises(RouterLabError, match=message):
        engine.generate_ids(ids, None, GenerateConfig(**config))


def test_routers_for_another_model_are_refused():
    engine = Engine(tiny_model("llama"))
    other = RouterSet.zeros(tiny_model("llama", num_hidden_layers=6), RoutingConfig.from_granularity("attention-token", [1]))
    with pytest.raises(RouterLabError, match="made for a model with 6 layers"):
        engine.generate_ids([1, 2], other, GenerateConfig())


def test_drop_really_holds_less_kv_memory_than_kv():
    model = tiny_model("llama")
    engine = Engine(model)
    held = {}
    for policy in ("kv", "drop"):
        control = Control(0.51)
        list(engine.generate_ids(list(range(1, 20)), routers(model, "attention-token"), GenerateConfig(max_new_tokens=8, threshold=0.51, kv_policy=policy), control))
        held[policy] = control.trace.meta["kv_bytes_held"]
    assert held["drop"] == held["kv"] // 2  # layers 1 and 2 of 4 store nothing


@pytest.mark.parametrize("policy", ["mask", "kv", "drop"])
def test_kv_saved_is_what_the_full_model_would_hold_less_what_was_held(policy):
    """kv and mask keep every position's KV, so they save nothing; the full model saves nothing; only drop saves. (The
    last token, never fed back, was counted as held by the full model: every run 'saved' one position at every layer.)"""
    model = tiny_model("llama")
    engine = Engine(model)
    saved = {}
    for name, rs in (("full", None), ("routed", routers(model, "attention-token"))):
        control = Control(0.51)
        list(engine.generate_ids(list(range(1, 20)), rs, GenerateConfig(max_new_tokens=8, threshold=0.51, kv_policy=policy, ignore_eos=True), control))
        meta = control.trace.meta
        assert meta["kv_bytes_full"] == (19 + 7) * engine.n_layers * int(meta["costs"]["kv_bytes"])  # 8 tokens, the 8th never fed
        saved[name] = meta["kv_bytes_full"] - meta["kv_bytes_held"]
    assert saved["full"] == 0
    if policy == "drop":
        assert saved["routed"] > 0
    else:
        assert saved["routed"] == 0


@pytest.mark.parametrize("granularity", ["attention-token", "mlp-token"])
def test_decode_scores_match_the_batched_scores(granularity):
    """A decode step scores on the host (Router.score_one); it must agree with the tensor path."""
    model = tiny_model("llama")
    engine = Engine(model)
    rs = routers(model, granularity, seed=4)
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, batched = forward(engine.anatomy, ids, torch.arange(12), None, Plan(rs, 0.0, "kv"), logits_at=slice(None))
        caches = engine.new_caches(12)
        forward(engine.anatomy, ids[:, :6], torch.arange(6), caches, Plan(rs, 0.0, "kv"))
        for t in range(6, 12):
            _, step = forward(engine.anatomy, ids[:, t : t + 1], torch.tensor([t]), caches, Plan(rs, 0.0, "kv"))
            torch.testing.assert_close(step[0], batched[t], equal_nan=True, atol=1e-5, rtol=1e-5)
    assert not torch.isnan(batched[:, ROUTED]).any() and torch.isnan(batched[:, 0]).all()


def test_logits_only_where_asked():
    """The head runs on the positions `logits_at` picks (the response predictions), else the last one."""
    from routerlab.tuning.forward import response_slice

    model = tiny_model("llama")
    engine = Engine(model)
    plan = Plan(routers(model, "attention-token", seed=3), 0.5, "kv")
    ids = torch.randint(0, 128, (1, 10), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        every, _ = forward(engine.anatomy, ids, torch.arange(10), None, plan, logits_at=slice(None))
        response, _ = forward(engine.anatomy, ids, torch.arange(10), None, plan, logits_at=response_slice(4))
        last, _ = forward(engine.anatomy, ids, torch.arange(10), None, plan)
    assert every.shape[1] == 10 and response.shape[1] == 6 and last.shape[1] == 1  # predicts ids[4:], 6 tokens
    torch.testing.assert_close(response, every[:, 3:9])
    torch.testing.assert_close(last, every[:, -1:])


def test_host_sigmoid_is_stable_at_the_extremes():
    from routerlab.core.routing.router import sigmoid

    assert sigmoid(0.0) == 0.5 and sigmoid(-1e4) == 0.0 and sigmoid(1e4) == 1.0
    assert abs(sigmoid(2.0) - float(torch.sigmoid(torch.tensor(2.0, dtype=torch.float64)))) < 1e-15


# -- bf16: the same parity claims, at the tolerance bf16 rounding allows ----------------------------
BF16 = dict(atol=6e-2, rtol=6e-2)  # logits of O(1) after 4 layers of bf16 rounding; fp32 tests use 1e-4


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3", "mixtral"])
def test_never_skip_matches_base_logits_in_bf16(family):
    model = tiny_model(family).to(torch.bfloat16)
    engine = Engine(model)
    ids = torch.randint(0, 128, (1, 14), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits.float()
    for granularity in GRANULARITIES:
        for policy in POLICIES:
            got = run(engine, ids, Plan(routers(model, granularity), 0.5, policy)).float()
            torch.testing.assert_close(got, ref, **BF16, msg=f"{granularity} {policy}")


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_kv_policy_gives_mask_outputs_in_bf16(family):
    model = tiny_model(family).to(torch.bfloat16)
    engine = Engine(model)
    ids = torch.randint(0, 128, (1, 14), generator=torch.Generator().manual_seed(2))
    for granularity in ["attention-token", "block-token"]:
        rs = routers(model, granularity, seed=3)
        masked = run(engine, ids, Plan(rs, 0.5, "mask")).float()
        kv = run(engine, ids, Plan(rs, 0.5, "kv")).float()
        torch.testing.assert_close(kv, masked, **BF16)


def test_routers_stay_float32_on_a_bf16_model():
    model = tiny_model("llama").to(torch.bfloat16)
    rs = routers(model, "attention-token", seed=3)
    engine = Engine(model)
    steps = list(engine.generate_ids([1, 2, 3, 4], rs, GenerateConfig(max_new_tokens=4)))
    assert all(p.dtype == torch.float32 for p in rs.parameters())
    assert all(isinstance(s, float) for st in steps for s in st.scores if s is not None)


def test_fused_weights_are_views_and_the_hf_forward_is_unchanged():
    model = tiny_model("qwen2")  # q/k/v with biases
    ids = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        before = model(ids).logits
    engine = Engine(model)
    attn, parts = model.model.layers[0].self_attn, engine.anatomy.layers[0]
    assert attn.q_proj.weight.data_ptr() == parts.attn.qkv.dense.data_ptr(), "no second copy of the weights"
    assert attn.k_proj.bias.data_ptr() == parts.attn.qkv.bias[parts.attn.q_size:].data_ptr()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before, atol=0, rtol=0)


def test_kv_equals_mask_when_a_single_token_of_a_long_forward_runs():
    """One running token among many (layer 1 here): its query must not see the later tokens' keys,
    which `kv` keeps. (A one-query attention used to take the decode path, with no causal mask.)"""
    from routerlab.tuning.forward import student_forward

    model = tiny_model("llama")
    engine = Engine(model)
    ids = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(9))
    rs = routers(model, "attention-token")
    g = torch.Generator().manual_seed(10)
    for r in rs.routers.values():
        r.proj.weight.data = torch.randn(r.proj.weight.shape, generator=g) * 3.0
    with torch.no_grad():
        kv, scores = student_forward(engine.anatomy, ids, 6, Plan(rs, 0.5, "kv"))
        masked, _ = student_forward(engine.anatomy, ids, 6, Plan(rs, 0.5, "mask"))
    assert int((scores[:, 1] >= 0.5).sum()) == 1 and int(scores[:, 1].argmax()) < 15  # the case this test is about
    torch.testing.assert_close(kv, masked, atol=1e-4, rtol=1e-4)
