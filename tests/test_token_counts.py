"""Every token count reaches the low-bit products: 1 to FEW_ROWS + 1 tokens through each forward that can take
the low-bit path (a prefill, a cached chunk, the quality meter's passes, evaluation, Compare's lockstep), on the
tiny models with int4 and int8 copies and on the real embedded model's default path (the file's Q4_1 codes).

What this guards: torch's int4 kernel refuses a strided input, the fused RMSNorm (routed.RMSNorm) returns one, and
only inputs of 2 to FEW_ROWS rows both take the low-bit path and are strided (one row always counts as
contiguous; more than FEW_ROWS rows take the dense weight). The quality meter's full-depth passes are such
chunks, of a size set by timing: one generation in twelve failed in the app before `weights.kernel_input`.
"""

from __future__ import annotations

import functools

import pytest
import torch

from routerlab.core.base.config import GenerateConfig, RoutingConfig
from routerlab.core.decode.engine import Control, Engine
from routerlab.core.kernels.weights import FEW_ROWS, Codes, Weight, quantize_int4, quantize_int8
from routerlab.core.model.models import TINY_FAMILIES, tiny_model
from routerlab.core.ops.forward import forward
from routerlab.core.routing.gates import Plan
from routerlab.core.routing.router import RouterSet
from routerlab.tuning.data import Example
from routerlab.tuning.evaluate import evaluate_examples

COUNTS = list(range(1, FEW_ROWS + 2))  # 1 .. FEW_ROWS + 1: every low-bit row count and the first dense one
POLICIES = ("mask", "kv", "drop")
PREFIX = [3, 9, 27, 81, 115, 89]  # tokens a cache holds before a chunk


# -- the kernels ---------------------------------------------------------------------------------------
def _lows(k: int = 64, n: int = 48):
    torch.manual_seed(0)
    dense = torch.randn(n, k)
    q8_halves = Codes(torch.randint(0, 16, (n, 2 * k), dtype=torch.uint8), torch.rand(n, 2 * k // 32) * 0.01 + 1e-3,
                      torch.randn(n, 2 * k // 32) * 0.02, 32, tiles=2)
    return {"int4": quantize_int4(dense).pack(), "int4 tiled (Q8_0)": q8_halves.pack(), "int8": quantize_int8(dense)}


def _layouts(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The same (n, K) values in the layouts a caller may pass: contiguous or not, fp32 or bf16."""
    n, k = x.shape
    wide = torch.cat([x, -x], dim=-1)  # (n, 2K): what the fused RMSNorm slices
    return {
        "contiguous fp32": x,
        "slice of a wider fp32 row": wide[:, :k],
        "slice of a wider bf16 row": wide.bfloat16()[:, :k],
        "transposed": x.t().contiguous().t(),
        "every other column": torch.stack([x, x], dim=-1).flatten(1)[:, ::2],
    }


@pytest.mark.parametrize("kind", ["int4", "int4 tiled (Q8_0)", "int8"])
@pytest.mark.parametrize("n", COUNTS)
def test_low_bit_kernels_take_every_layout_and_give_the_contiguous_result(kind, n):
    low = _lows()[kind]
    x = torch.randn(n, 64)
    expected = low.mm(x.bfloat16().contiguous())
    for name, same in _layouts(x).items():
        assert torch.equal(low.mm(same), expected), name


@pytest.mark.parametrize("n", COUNTS)
def test_a_weight_takes_strided_rows_of_every_count(n):
    torch.manual_seed(1)
    dense = torch.randn(32, 64)
    w = Weight(dense, torch.randn(32), quantize_int4(dense).pack())
    x = torch.randn(1, n, 64)
    strided = torch.cat([x, -x], dim=-1)[..., :64]  # (1, n, 64), not contiguous
    assert not strided.is_contiguous() or n == 1
    assert torch.equal(w(strided), w(x))


# -- the tiny models: every forward that can reach a low-bit product ------------------------------------
@functools.lru_cache(maxsize=None)
def _engine(family: str, fmt: str) -> Engine:
    """A tiny model with low-bit copies whose dense weights are the ones the copies stand for: the dense path
    (more than FEW_ROWS rows) and the low-bit one differ only by the kernels' bf16 rounding."""
    model = tiny_model(family)
    for w in _weights(Engine(model)):
        w.dense.copy_(quantize_int4(w.dense).dequantize() if fmt == "int4" else _int8_weight(w.dense))
    from routerlab.core.kernels.weights import LowBitPlan

    return Engine(model, lowbit=LowBitPlan(fmt))


def _int8_weight(w: torch.Tensor) -> torch.Tensor:
    q = quantize_int8(w)
    return q.codes.float() * q.scales.float()[:, None]


def _weights(engine: Engine) -> list[Weight]:
    """Every linear map of the engine's anatomy (layers and head), found by type: no family's module paths here."""
    found = [engine.anatomy.head]
    for layer in engine.anatomy.layers:
        for holder in (layer, layer.attn):
            found += [v for v in vars(holder).values() if isinstance(v, Weight)]
    return found


@functools.lru_cache(maxsize=None)
def _routers(family: str, granularity: str = "attention-token") -> RouterSet:
    """Random routers on layers 1-2 that skip some cells at 0.5."""
    model = _engine(family, "int4").model
    rs = RouterSet.zeros(model, RoutingConfig.from_granularity(granularity, [1, 2]))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for r in rs.routers.values():
            r.proj.weight.copy_(torch.randn(r.proj.weight.shape, generator=g) * 0.5)
    return rs


def _chunk_logits(engine: Engine, chunk: list[int], plan: Plan, one_at_a_time: bool) -> torch.Tensor:
    """Logits (T, V) at each position of `chunk`, read after PREFIX with a cache: in one forward or token by token."""
    with torch.inference_mode():
        caches = engine.new_caches(len(PREFIX) + len(chunk))
        forward(engine.anatomy, torch.tensor([PREFIX]), torch.arange(len(PREFIX)), caches, plan)
        start = len(PREFIX)
        if not one_at_a_time:
            ids, positions = torch.tensor([chunk]), torch.arange(start, start + len(chunk))
            return forward(engine.anatomy, ids, positions, caches, plan, logits_at=slice(0, None))[0][0].float()
        rows = [forward(engine.anatomy, torch.tensor([[t]]), torch.tensor([start + j]), caches, plan)[0][0, -1].float()
                for j, t in enumerate(chunk)]
        return torch.stack(rows)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.isfinite(a).all()) and bool((a - b).abs().max() <= 0.05 * b.abs().max())


@pytest.mark.parametrize("fmt", ["int4", "int8"])
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_every_token_count_through_a_cached_chunk_matches_one_token_at_a_time(family, fmt):
    engine = _engine(family, fmt)
    for n in COUNTS:
        chunk = [(11 * j + 5) % 128 for j in range(n)]
        together = _chunk_logits(engine, chunk, Plan(None), one_at_a_time=False)
        assert _close(together, _chunk_logits(engine, chunk, Plan(None), one_at_a_time=True)), n


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_every_token_count_prefills_with_and_without_a_cache_and_routers_of_each_policy(family):
    engine, rs = _engine(family, "int4"), _routers(family)
    with torch.inference_mode():
        for n in COUNTS:
            ids, positions = torch.tensor([[(7 * j + 2) % 128 for j in range(n)]]), torch.arange(n)
            plain, _ = forward(engine.anatomy, ids, positions, None, Plan(None))
            cached, _ = forward(engine.anatomy, ids, positions, engine.new_caches(n), Plan(None))
            assert _close(cached.float(), plain.float()), n
            for policy in POLICIES:
                for cache in (None, engine.new_caches(n)):
                    logits, scores = forward(engine.anatomy, ids, positions, cache, Plan(rs, 0.5, policy))
                    assert torch.isfinite(logits).all() and scores.shape == (n, engine.n_layers), (n, policy)
                routed = _chunk_logits(engine, ids[0].tolist(), Plan(rs, 0.5, policy), one_at_a_time=False)
                assert torch.isfinite(routed).all(), (n, policy)


@pytest.mark.parametrize("fmt", ["int4", "int8"])
@pytest.mark.parametrize("chunk", COUNTS)
def test_the_quality_meter_scores_every_token_at_every_chunk_size(fmt, chunk):
    engine, rs = _engine("llama", fmt), _routers("llama")
    for policy in POLICIES:
        config = GenerateConfig(max_new_tokens=2 * chunk + 1, ignore_eos=True, quality=True, quality_chunk=chunk,
                                quality_refresh=None, kv_policy=policy)
        control = Control(0.5)
        steps = list(engine.generate_ids(PREFIX, rs, config, control))
        generated = [s for s in steps if not s.is_prompt]
        assert len(generated) == 2 * chunk + 1 and all(s.kl_full is not None for s in generated), (chunk, policy)


@pytest.mark.parametrize("stepwise", [False, True])
def test_evaluation_takes_prompts_and_responses_of_every_count(stepwise):
    engine, rs = _engine("llama", "int4"), _routers("llama")
    examples = [Example(tuple((13 * j + p) % 128 for j in range(p + r)), p) for p in COUNTS for r in COUNTS]
    result = evaluate_examples(engine.anatomy, examples, rs, 0.5, "kv", stepwise=stepwise)
    assert result["tokens"] == len(COUNTS) * sum(COUNTS) and result["kl_full"] >= 0.0


def test_compare_lockstep_with_quality_finishes_every_column():
    """Compare's ladder: the full model and three thresholds decoded in lockstep, each column metered."""
    from routerlab.ui.state.stream import Decoder

    engine, rs = _engine("llama", "int4"), _routers("llama")
    controls = [Control(t) for t in (0.5, 0.3, 0.5, 0.7)]
    runs = []
    for k, (control, chunk) in enumerate(zip(controls, COUNTS)):
        config = GenerateConfig(max_new_tokens=9, threshold=control.threshold, ignore_eos=True, quality=True, quality_chunk=chunk,
                                quality_refresh=None)
        runs.append(engine.generate_ids(PREFIX, None if k == 0 else rs, config, control))
    decoder = Decoder(runs)
    for _ in decoder.frames([c.trace for c in controls], runs=controls):
        pass
    decoder.raise_error()
    for control in controls:
        assert len(control.trace.generated_steps) == 9 and all(s.kl_full is not None for s in control.trace.generated_steps)


# -- the real embedded model in its default path -------------------------------------------------------
@pytest.fixture(scope="module")
def real(embedded):
    from routerlab.tuning.checkpoint import load_routers

    engine = Engine.from_loaded(embedded)
    assert engine.anatomy.lowbit is not None, "the default path keeps the file's 4-bit codes"
    return engine, load_routers("assets/routers/attention-token", engine.model)[0]


def test_the_embedded_model_takes_every_token_count_in_every_forward(real):
    engine, rs = real
    plans = [Plan(None)] + [Plan(rs, 0.5, policy) for policy in POLICIES]
    with torch.inference_mode():
        for n in COUNTS:
            ids, positions = torch.tensor([[(97 * j + 11) % 4000 for j in range(n)]]), torch.arange(n)
            for plan in plans:
                for cache in (None, engine.new_caches(n)):
                    logits, _ = forward(engine.anatomy, ids, positions, cache, plan)
                    assert torch.isfinite(logits).all(), (n, plan.policy)
                assert torch.isfinite(_chunk_logits(engine, ids[0].tolist(), plan, one_at_a_time=False)).all()


@pytest.mark.parametrize("chunk", COUNTS)
def test_the_embedded_model_scores_quality_at_every_chunk_size(real, chunk):
    engine, rs = real
    config = GenerateConfig(max_new_tokens=2 * chunk + 1, ignore_eos=True, quality=True, quality_chunk=chunk, quality_refresh=None)
    control = Control(0.5)
    steps = list(engine.generate("Why is the sky blue?", rs, config, control))
    generated = [s for s in steps if not s.is_prompt]
    assert len(generated) == 2 * chunk + 1 and all(s.kl_full is not None and s.kl_full >= 0 for s in generated)
