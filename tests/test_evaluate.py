"""Evaluation on tiny models: full vs routed in one run, skip-rate bookkeeping, the two baselines, the CLI."""

from __future__ import annotations

import json

import pytest
import torch

from routerlab.__main__ import main
from routerlab.core.base.config import RoutingConfig
from routerlab.tuning.data import Example
from routerlab.tuning.evaluate import (RandomRouterSet, _Full, baseline_set, calibrate, evaluate_examples, kl_to_full,
                                layer_importance, static_order, static_routers, thresholds_for_skips)
from routerlab.core.model.models import tiny_model
from routerlab.core.model.anatomy import Anatomy
from routerlab.core.routing.router import RouterSet


@pytest.fixture(scope="module")
def setup():
    model = tiny_model("llama")
    g = torch.Generator().manual_seed(0)
    examples = [Example(tuple(torch.randint(0, 128, (24,), generator=g).tolist()), 8) for _ in range(4)]
    return Anatomy(model), examples


def test_no_routers_and_fresh_routers_match_the_full_model(setup):
    an, examples = setup
    full = evaluate_examples(an, examples, None)
    fresh = evaluate_examples(an, examples, RouterSet(RoutingConfig(layers=(1, 2)), 4, 64), 0.5)
    for r in (full, fresh):
        assert r["perplexity_routed"] == pytest.approx(r["perplexity_full"], rel=1e-5)
        assert r["agreement"] == 1.0 and r["skip_rate"] == 0.0 and r["tokens"] == 4 * 16
        assert r["kl_full"] == pytest.approx(0.0, abs=1e-6) and r["skip_rate_prompt"] == 0.0
    assert {"perplexity_full", "perplexity_routed", "agreement", "skip_rate", "skip_rate_all_layers", "tokens",
            "threshold", "granularity", "kv_policy", "kl_full", "skip_rate_prompt"} <= set(fresh)


def test_skipping_moves_the_distribution_and_prompt_cells_are_counted_apart(setup):
    an, examples = setup
    r = evaluate_examples(an, examples, RandomRouterSet(RoutingConfig(layers=(1, 2)), 4, 64, seed=5), 0.5)
    assert r["kl_full"] > 1e-4
    assert 0.25 < r["skip_rate_prompt"] < 0.75 and 0.3 < r["skip_rate"] < 0.7  # 8 prompt, 16 response tokens each


def _exact_kl(p_logits, q_logits):
    lp, lq = p_logits.log_softmax(-1).double(), q_logits.log_softmax(-1).double()
    return (lp.exp() * (lp - lq)).sum(-1)


def _full_of(p_logits, k):
    lp = p_logits.log_softmax(-1)
    top = lp.topk(k, dim=-1)
    return _Full(torch.zeros(len(lp)), lp.argmax(-1), top.values, top.indices)


def test_kl_is_exact_when_the_top_k_holds_the_vocabulary_and_a_close_lower_bound_otherwise():
    g = torch.Generator().manual_seed(0)
    p = 6 * torch.randn(6, 50, generator=g)  # peaked, as a language model: the top 10 hold most of the mass
    q = p + 0.5 * torch.randn(6, 50, generator=g)
    exact = _exact_kl(p, q)
    assert torch.allclose(kl_to_full(_full_of(p, 50), q.log_softmax(-1)), exact, atol=1e-5)
    part = kl_to_full(_full_of(p, 10), q.log_softmax(-1))
    assert (part <= exact + 1e-9).all() and torch.allclose(part, exact, rtol=0.2, atol=1e-3)
    assert kl_to_full(_full_of(p, 10), p.log_softmax(-1)).abs().max() < 1e-6  # same distribution: 0


def test_kv_policy_gives_the_mask_numbers(setup):
    an, examples = setup
    routers = RandomRouterSet(RoutingConfig(layers=(1, 2)), 4, 64, seed=3)
    kv = evaluate_examples(an, examples, routers, 0.4, "kv")
    routers = RandomRouterSet(RoutingConfig(layers=(1, 2)), 4, 64, seed=3)
    mask = evaluate_examples(an, examples, routers, 0.4, "mask")
    assert kv["perplexity_routed"] == pytest.approx(mask["perplexity_routed"], rel=1e-5)
    assert kv["skip_rate"] == mask["skip_rate"] > 0


def test_random_baseline_skips_at_the_asked_rate(setup):
    an, examples = setup
    routers, p, info = baseline_set("random", an, examples, "attention-token", 0.25, layers=(1, 2))
    assert p == pytest.approx(0.5)  # 0.25 of all 4 layers = half of the 2 routed layers
    r = evaluate_examples(an, examples, routers, p)
    assert 0.35 < r["skip_rate"] < 0.65 and r["skip_rate_all_layers"] == pytest.approx(r["skip_rate"] / 2)


def test_static_baseline_drops_the_least_changing_layers_entirely(setup):
    an, examples = setup
    importance = layer_importance(an, examples, "attention")
    order = static_order(importance)
    assert importance[order[0]] == max(importance)
    r = evaluate_examples(an, examples, static_routers(order, 1, "attention", 4, 64), 0.51)
    assert r["skip_rate"] == 1.0 and r["skip_rate_all_layers"] == 0.25 and r["routed_layers"] == [order[0]]


def test_calibrate_picks_the_most_skipping_point_within_budget():
    pts = [{"perplexity_increase": 0.01, "skip_rate_all_layers": 0.1}, {"perplexity_increase": 0.015, "skip_rate_all_layers": 0.2},
           {"perplexity_increase": 0.05, "skip_rate_all_layers": 0.3}]
    assert calibrate(pts, 0.02)["skip_rate_all_layers"] == 0.2 and calibrate(pts, 0.001) is None


def test_eval_cli_refuses_bad_input_with_one_line(tmp_path, capsys):
    assert main(["eval", "--data", str(tmp_path / "missing.jsonl")]) == 2
    assert main(["eval", "--threshold", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 2 and "Traceback" not in err


def test_thresholds_for_skips_land_near_the_asked_skip_rates(setup):
    an, examples = setup
    routers = RouterSet(RoutingConfig(layers=(1, 2)), 4, 64)
    g = torch.Generator().manual_seed(1)
    for r in routers.routers.values():
        r.proj.weight.data = torch.randn(r.proj.weight.shape, generator=g)
    thresholds = thresholds_for_skips(an, routers, examples, (0.1, 0.5, 0.9))
    assert thresholds == sorted(thresholds) and len(set(thresholds)) == 3
    rates = [evaluate_examples(an, examples, routers, t)["skip_rate"] for t in thresholds]
    for asked, got in zip((0.1, 0.5, 0.9), rates):
        assert abs(asked - got) < 0.2, (asked, got)  # scored at full depth; skipping shifts later scores a little


def test_sweep_scores_tuned_random_and_static_on_the_same_tokens_and_logs_kl(setup):
    from routerlab.tuning.evaluate import sweep

    an, examples = setup
    routers = RandomRouterSet(RoutingConfig(layers=(1, 2)), 4, 64, seed=3)  # any scores: a stand-in for tuned ones
    lines: list[str] = []
    out = sweep(an, examples, routers, [0.2, 0.6], random_p=[0.5], static_k=[1], log=lines.append)
    assert [len(out[k]) for k in ("tuned", "random", "static")] == [2, 1, 1]
    points = out["tuned"] + out["random"] + out["static"]
    assert len({p["perplexity_full"] for p in points}) == 1 and {p["tokens"] for p in points} == {64}
    assert out["tuned"][0]["skip_rate"] < out["tuned"][1]["skip_rate"]
    assert out["static"][0]["skip_rate_all_layers"] == pytest.approx(0.25)  # 1 of 4 layers, always
    assert len(lines) == 4 and all("KL " in line and "ppl " in line for line in lines)
    assert lines[0].startswith("tuned t=0.2000") and lines[2].startswith("random p=0.5000")
    assert lines[3].startswith(f"static k=1 {out['static'][0]['dropped_layers']}")


@pytest.mark.parametrize("granularity,policy", [("attention-token", "kv"), ("attention-token", "drop"), ("attention-sequence", "kv")])
def test_stepwise_forward_matches_the_teacher_forced_forward(granularity, policy):
    """One decode step per response token computes what one teacher-forced forward does (fp32, dense)."""
    from routerlab.core.base.config import RoutingConfig
    from routerlab.core.model.models import tiny_model
    from routerlab.core.model.anatomy import Anatomy
    from routerlab.core.routing.gates import Plan
    from routerlab.core.routing.router import RouterSet
    from routerlab.tuning.forward import stepwise_forward, student_forward

    model = tiny_model("llama")
    routers = RouterSet.zeros(model, RoutingConfig.from_granularity(granularity, (1, 2)))
    with torch.no_grad():
        for layer in (1, 2):
            routers.get(layer).proj.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(layer))
    anatomy, ids = Anatomy(model), torch.tensor([[(5 * i + 2) % 128 for i in range(14)]])
    with torch.no_grad():
        a_logits, a_scores = student_forward(anatomy, ids, 6, Plan(routers, 0.5, policy))
        b_logits, b_scores = stepwise_forward(anatomy, ids, 6, Plan(routers, 0.5, policy))
    assert a_logits.shape == b_logits.shape == (1, 8, 128)
    assert torch.allclose(a_logits, b_logits, atol=1e-4) and torch.allclose(a_scores, b_scores, atol=1e-5, equal_nan=True)
