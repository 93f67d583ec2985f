"""core/graph/step_graph.py: the whole decode step as one onnxruntime graph computes the engine's step on the file's codes
(within the rounding of fp32 activations and 8-bit products against bf16 ones), takes over the engine's prefill cache,
and says why where it cannot run."""

import pytest
import torch

from routerlab.core.decode.engine import Engine
from routerlab.core.ops.forward import forward
from routerlab.core.routing.gates import Plan

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def engine(embedded):
    return Engine.from_loaded(embedded, choose_kernels=False)


def test_the_graph_decodes_the_engines_logits_and_tokens_after_its_prefill(engine, embedded):
    from routerlab.core.graph.step_graph import StepGraph

    tok = embedded.tokenizer
    ids = tok("Explain in three sentences why the sky is blue.", add_special_tokens=False)["input_ids"]
    fed = tok(" Sunlight is made of many colours, and the air scatters the short blue waves far more than the red",
              add_special_tokens=False)["input_ids"]
    graph = StepGraph(engine.anatomy, 256)
    caches = engine.new_caches(len(ids) + len(fed) + 1)
    with torch.inference_mode():
        forward(engine.anatomy, torch.tensor([ids]), torch.arange(len(ids)), caches, Plan(None))
        graph.load(caches, len(fed))
        clear, kl, last = 0, [], None
        for k, token in enumerate(fed):  # teacher-forced: both read the same tokens
            position = len(ids) + k
            out = graph.step(token)
            if last is not None:  # the last step's logits, not copied, outlive this step (a request samples from them)
                assert torch.equal(*last)
            ours = out.clone()
            last = (out, ours)
            theirs, _ = forward(engine.anatomy, torch.tensor([[token]]), torch.tensor([position]), caches, Plan(None), top=position)
            theirs = theirs[0, -1].float()
            p = torch.log_softmax(theirs, -1)
            kl.append(float((p.exp() * (p - torch.log_softmax(ours, -1))).sum()))
            top2 = theirs.topk(2).values
            if top2[0] - top2[1] > 0.25:  # not a near tie: the same greedy token
                clear += 1
                assert int(ours.argmax()) == int(theirs.argmax())
    # fp32 activations with 8-bit products against bf16 ones: KL 0.0001-0.013 a token here (the int4 engine against
    # the dense bf16 model: 0.0001-0.007); a graph that missed the prefill's cache: 0.15-6.7
    assert max(kl) < 0.05 and sum(kl) / len(kl) < 0.02
    assert clear >= len(fed) // 2 and graph.n == len(ids) + len(fed)
    # the graph's cache holds what it wrote: a key of the first fed token, at its layer 0, is the engine's (rounding)
    k_graph, k_engine = graph.caches[0][0][0, :, len(ids)], caches[0].k[0, :, len(ids)].float()
    assert float((k_graph - k_engine).norm() / k_engine.norm()) < 0.03


def test_a_wrong_cache_or_a_full_graph_is_refused_with_a_reason(engine, embedded):
    from routerlab.core.graph.step_graph import StepGraph

    graph = StepGraph(engine.anatomy, 16)
    caches = engine.new_caches(16)
    with torch.inference_mode():
        forward(engine.anatomy, torch.tensor([list(range(100, 110))]), torch.arange(10), caches, Plan(None))
    with pytest.raises(ValueError, match="10 tokens and 7 new ones do not fit a step graph of 16"):
        graph.load(caches, 7)
    graph.load(caches, 3)
    for _ in range(3):
        graph.step(5)
    with pytest.raises(ValueError, match="holds 13 tokens for this request"):
        graph.step(5)


def test_a_requests_numbers_do_not_depend_on_the_capacity_it_was_given(engine, embedded):
    """The same tokens through buffers of 16 and 64 entries (10 prompt tokens and 5 or 40 new ones): the same logits
    to the bit. (Unaligned capacities, 15 and 50, moved attention's last bits, which 8-bit products then amplify: a
    router's score differed by up to 0.008 between a request alone and in a room.)"""
    from routerlab.core.graph.step_graph import StepGraph

    graph = StepGraph(engine.anatomy, 64)
    caches = engine.new_caches(16)
    with torch.inference_mode():
        forward(engine.anatomy, torch.tensor([list(range(100, 110))]), torch.arange(10), caches, Plan(None))
    runs = []
    for new in (5, 40):
        graph.load(caches, new)
        runs.append(torch.stack([graph.step(t).clone() for t in (7, 300, 4000, 12, 9)]))
        assert graph.mask.shape[-1] == (16 if new == 5 else 64)
    assert torch.equal(runs[0], runs[1])


def test_the_queries_scaling_as_a_node_gives_what_it_gives_folded_into_their_codes(engine, monkeypatch):
    """head_dim 64 scales queries by 1/8, folded into their codes' scales; a head_dim whose scaling is not a power of
    two gets one Mul a layer instead: the same logits here (both exact at 1/8)."""
    from routerlab.core.graph import step_graph

    caches = engine.new_caches(16)
    with torch.inference_mode():
        forward(engine.anatomy, torch.tensor([list(range(100, 110))]), torch.arange(10), caches, Plan(None))
    runs = []
    for folds in (True, False):
        monkeypatch.setattr(step_graph, "_folds", lambda scaling, folds=folds: folds)
        graph = step_graph.StepGraph(engine.anatomy, 32)
        graph.load(caches, 3)
        runs.append(torch.stack([graph.step(t).clone() for t in (7, 300, 4000)]))
    assert torch.equal(runs[0], runs[1])


def test_models_without_file_codes_or_of_another_family_say_why():
    from routerlab.core.graph.step_graph import StepGraph, why_not
    from routerlab.core.model.models import tiny_model

    plain = Engine(tiny_model("llama"))  # random weights, no GGUF file: no codes to multiply
    assert "no file codes" in why_not(plain.anatomy)
    with pytest.raises(ValueError, match="no step graph for this model: no file codes"):
        StepGraph(plain.anatomy, 8)


@pytest.fixture(scope="module")
def routers(embedded):
    from routerlab.tuning.checkpoint import resolve_routers

    return resolve_routers(None, "attention-token", embedded.model)[0]


def _graph_logits(engine, graph, ids, fed, plan, threshold):
    """Teacher-forced logits of `fed` through the graph after the engine's prefill of `ids` under `plan`, with each
    step's router scores."""
    caches = engine.new_caches(len(ids) + 1)
    with torch.inference_mode():
        forward(engine.anatomy, torch.tensor([ids]), torch.arange(len(ids)), caches, plan)
        graph.load(caches, len(fed), threshold)
        out = []
        for token in fed:
            out.append((graph.step(token).clone(), graph.scores()))
    return out


def _engine_logits(engine, ids, fed, plan, caches: bool = False):
    held = engine.new_caches(len(ids) + len(fed) + 1)
    out = []
    with torch.inference_mode():
        forward(engine.anatomy, torch.tensor([ids]), torch.arange(len(ids)), held, plan)
        for k, token in enumerate(fed):
            position = len(ids) + k
            logits, scores = forward(engine.anatomy, torch.tensor([[token]]), torch.tensor([position]), held, plan, top=position)
            out.append((logits[0, -1].float(), scores[0]))
    return (out, held) if caches else out


def test_routers_in_the_graph_decide_as_the_engine_and_never_skipping_is_the_full_graph(engine, embedded, routers):
    from routerlab.core.graph.step_graph import StepGraph

    tok = embedded.tokenizer
    ids = tok("Write a short poem about a lighthouse keeper.", add_special_tokens=False)["input_ids"]
    fed = tok(" The keeper climbs the winding stair each night to light the lamp for ships", add_special_tokens=False)["input_ids"]
    full, routed = StepGraph(engine.anatomy, 128), StepGraph(engine.anatomy, 128, routers=routers)
    plain = _graph_logits(engine, full, ids, fed, Plan(None), 0.5)
    never = _graph_logits(engine, routed, ids, fed, Plan(routers, 0.0, "kv"), 0.0)
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(plain, never))  # threshold 0: the full model's numbers
    theirs = _engine_logits(engine, ids, fed, Plan(routers, 0.0, "kv"))
    for (_, ours), (_, scores) in zip(never, theirs):  # the same scores, up to fp32 against bf16 router inputs
        assert sorted(ours) == list(routers.config.layers)
        # a token's largest difference 0.005-0.029 on this text (AMD EPYC AVX-512: one-row attention products),
        # 0.005-0.020 with attention in groups of G rows
        assert max(abs(ours[i] - float(scores[i])) for i in ours) < 0.04
    # threshold 0.7 (about a third of the routed cells skip): where the graph and the engine make the same decisions
    # at every layer, the same numbers up to the rounding of fp32 activations and 8-bit products against bf16
    ours, theirs = _graph_logits(engine, routed, ids, fed, Plan(routers, 0.7, "kv"), 0.7), _engine_logits(engine, ids, fed, Plan(routers, 0.7, "kv"))
    agreed, skipped, moved = [], 0, []
    for (a, ours_scores), (b, scores), (c, _) in zip(ours, theirs, plain):
        decisions = [(ours_scores[i] >= 0.7, float(scores[i]) >= 0.7) for i in ours_scores]
        skipped += sum(not mine for mine, _ in decisions)
        if all(mine == its for mine, its in decisions):
            agreed.append(_kl(b, a))
        moved.append(_kl(c, a))
    assert skipped > len(fed) * 26 // 10 and len(agreed) >= len(fed) // 2
    assert sum(agreed) / len(agreed) < 0.03
    assert sum(moved) / len(moved) > 3 * sum(agreed) / len(agreed)  # skipping really changed the numbers


def test_mask_computes_every_rows_attention_and_gives_kvs_numbers(engine, embedded, routers):
    """`mask` (the reference: compute, then zero a skipped token's update) routes inside the graph too, with no `If`:
    the same logits and scores as `kv`, to the bit, where about a third of the routed cells skip."""
    from routerlab.core.graph.step_graph import StepGraph

    tok = embedded.tokenizer
    ids = tok("Write a short poem about a lighthouse keeper.", add_special_tokens=False)["input_ids"]
    fed = tok(" The keeper climbs the winding stair each night", add_special_tokens=False)["input_ids"]
    kv, mask = StepGraph(engine.anatomy, 64, routers=routers), StepGraph(engine.anatomy, 64, routers=routers, policy="mask")
    assert not any(n.op_type == "If" for n in _nodes(engine, routers, "mask")) and any(n.op_type == "If" for n in _nodes(engine, routers, "kv"))
    prefill = Plan(routers, 0.7, "kv")  # the same prompt's caches (torch's `mask` prefill rounds its own way)
    ours, theirs = _graph_logits(engine, mask, ids, fed, prefill, 0.7), _graph_logits(engine, kv, ids, fed, prefill, 0.7)
    assert sum(s < 0.7 for _, scores in ours for s in scores.values()) > len(fed) * 2
    assert all(torch.equal(a, b) and sa == sb for (a, sa), (b, sb) in zip(ours, theirs))


def test_drop_writes_only_the_keys_of_tokens_that_ran_and_decides_as_the_engine(engine, embedded, routers):
    """`drop` inside the graph: never skipping, the full graph's numbers to the bit; every routed cell skipping, `kv`'s
    (nobody reads a skipped token's key there either); at 0.7 (about a third of the routed cells skip) the engine's
    decisions and logits (up to fp32 against bf16) while they agree; and, given back, each routed layer holds the
    positions of the tokens that ran it, as the engine's own `drop` decode leaves them."""
    from routerlab.core.graph.step_graph import StepGraph

    tok = embedded.tokenizer
    ids = tok("Write a short poem about a lighthouse keeper.", add_special_tokens=False)["input_ids"]
    fed = tok(" The keeper climbs the winding stair each night", add_special_tokens=False)["input_ids"]
    full, drop = StepGraph(engine.anatomy, 64), StepGraph(engine.anatomy, 64, routers=routers, policy="drop")
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(_graph_logits(engine, full, ids, fed, Plan(None), 0.5),
                                                           _graph_logits(engine, drop, ids, fed, Plan(routers, 0.0, "drop"), 0.0)))
    for threshold in (0.7, 1.0):
        plan = Plan(routers, threshold, "drop")
        caches = engine.new_caches(len(ids) + len(fed) + 1)
        with torch.inference_mode():
            forward(engine.anatomy, torch.tensor([ids]), torch.arange(len(ids)), caches, plan)
            drop.load(caches, len(fed), threshold, tokens=len(ids))
            twin = drop.twin()  # another request at the same time: entries of its own
            again = engine.new_caches(len(ids) + len(fed) + 1)
            forward(engine.anatomy, torch.tensor([ids]), torch.arange(len(ids)), again, plan)
            twin.load(again, len(fed), threshold, tokens=len(ids))
            ours, its = [], []
            for token in fed:  # the two requests' steps interleaved
                ours.append((drop.step(token).clone(), drop.scores()))
                its.append(twin.step(token).clone())
            drop.store(caches)
        assert all(torch.equal(a, b) for (a, _), b in zip(ours, its))
        theirs, engine_caches = _engine_logits(engine, ids, fed, plan, caches=True)
        agreed = 0
        for (a, ours_scores), (b, scores) in zip(ours, theirs):
            if any((ours_scores[i] >= threshold) != (float(scores[i]) >= threshold) for i in ours_scores):
                break
            # every attention in 26 layers off (1.0) amplifies fp32 against bf16 to a KL of 0.67 at one token, under kv too
            assert _kl(b, a) < 0.1 or threshold == 1.0
            agreed += 1
        assert agreed >= len(fed) // 2
        skipped = sum(s < threshold for _, scores in ours[:agreed] for s in scores.values())
        assert skipped > agreed * 5
        if threshold == 1.0:
            kv = StepGraph(engine.anatomy, 64, routers=routers)
            assert all(torch.equal(a, b) for (a, _), (b, _) in zip(ours, _graph_logits(engine, kv, ids, fed, Plan(routers, 1.0, "kv"), 1.0)))
        for i, (mine, its) in enumerate(zip(caches, engine_caches)):
            held = [int(p) for p in mine.pos[: mine.n]] if mine.n else []
            if i not in routers.config.layers:
                assert held == list(range(len(ids) + len(fed)))
                continue
            ran = [len(ids) + k for k, (_, scores) in enumerate(ours) if scores[i] >= threshold]
            assert held[len(held) - len(ran):] == ran  # the tokens that ran it, in order, and no other
            if agreed == len(fed):
                assert held == ([int(p) for p in its.pos[: its.n]] if its.n else [])


def _nodes(engine, routers, policy):
    import onnx

    from routerlab.core.graph.step_graph import build

    return onnx.load_from_string(build(engine.anatomy, 16, routers, policy)).graph.node


def _kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    p = torch.log_softmax(p_logits, -1)
    return float((p.exp() * (p - torch.log_softmax(q_logits, -1))).sum())


def test_routing_it_cannot_do_is_refused_with_a_reason(engine, embedded):
    from routerlab.core.base.config import RoutingConfig
    from routerlab.core.graph.step_graph import StepGraph, routing_why_not
    from routerlab.core.routing.router import RouterSet

    mlp = RouterSet.zeros(embedded.model, RoutingConfig.from_granularity("mlp-token", (2, 3)))
    assert "mlp-token routers" in routing_why_not(mlp)
    attention = RouterSet.zeros(embedded.model, RoutingConfig.from_granularity("attention-token", (2, 3)))
    assert routing_why_not(attention) is None and routing_why_not(attention, "drop") is None
    sequence = RouterSet.zeros(embedded.model, RoutingConfig.from_granularity("attention-sequence", (2, 3)))
    assert "attention-sequence routers" in routing_why_not(sequence)
    with pytest.raises(ValueError, match="mlp-token routers"):
        StepGraph(engine.anatomy, 16, routers=mlp)


def test_an_engine_set_to_decode_through_the_graph_streams_steps_as_torchs_path_does(embedded, routers):
    """`Engine.decode = "graph"`: a request alone decodes through the graph (its trace says so), its Steps carry the
    routers' scores and decisions, a live threshold takes effect between tokens, and the request's caches hold every
    row it wrote at the end; under `drop` its routed layers hold the tokens that ran them; what the graph cannot take
    (a token's MLP routed) decodes through torch's ops, said why."""
    from routerlab.core.base.config import GenerateConfig
    from routerlab.core.decode.engine import Control

    engine = Engine.from_loaded(embedded, choose_kernels=False)
    engine.decode = "graph"
    control = Control(0.5)
    config = GenerateConfig(max_new_tokens=16, threshold=0.5, kv_policy="kv", quality=False, ignore_eos=True)
    seen = []
    for step in engine.generate("Write a short poem about a lighthouse keeper.", routers, config, control):
        if not step.is_prompt:
            seen.append(step)
            if len(seen) == 6:
                control.threshold = 0.99  # the slider moved: nearly every routed attention skips from here
    meta = control.trace.meta
    assert meta["decode"].startswith("the step graph") and len(seen) == 16
    routed = set(routers.config.layers)
    for step in seen[:-1]:  # the last token is never fed back: no scores
        assert {i for i, s in enumerate(step.scores) if s is not None} == routed
        assert all(step.executed[i] == (step.scores[i] >= step.threshold) for i in routed)
    assert seen[3].threshold == 0.5 and seen[8].threshold == 0.99
    assert sum(not seen[8].executed[i] for i in routed) > len(routed) // 2
    assert meta["kv_bytes_held"] == meta["kv_bytes_full"]  # kv: every fed row at every layer, given back to the caches
    control = Control(0.7)
    drop = GenerateConfig(max_new_tokens=12, threshold=0.7, kv_policy="drop", quality=False, ignore_eos=True)
    seen = [s for s in engine.generate("Write a short poem about a lighthouse keeper.", routers, drop, control) if not s.is_prompt]
    meta = control.trace.meta
    assert meta["decode"].startswith("the step graph") and meta["kv_bytes_held"] < meta["kv_bytes_full"]
    ran = sum(s.executed[i] for s in seen[:-1] for i in routed)
    assert 0 < ran < len(seen[:-1]) * len(routed)  # some routed cells skipped: they hold no key
    from routerlab.core.base.config import RoutingConfig
    from routerlab.core.routing.router import RouterSet

    mlp = RouterSet.zeros(embedded.model, RoutingConfig.from_granularity("mlp-token", (2, 3)))
    control = Control(0.5)
    assert len([s for s in engine.generate("Hello", mlp, GenerateConfig(max_new_tokens=2, quality=False), control) if not s.is_prompt]) >= 1
    assert control.trace.meta["decode"] == "torch ops (not the step graph: mlp-token routers (the graph routes attention, token by token))"


def test_bench_step_graph_reports_the_graph_the_engine_and_the_routers_side_by_side(tmp_path, embedded, monkeypatch):
    """`python -m routerlab.bench.step_graph` in a short form: every figure it saves is there and of the right kind."""
    import json

    from routerlab.bench import step_graph as bench

    monkeypatch.setattr("routerlab.core.model.models.load_model", lambda *a, **k: embedded)
    out = tmp_path / "step-graph.json"
    assert bench.main(["--contexts", "24", "--new-tokens", "4", "--rounds", "1", "--no-peers", "--save", str(out)]) == 0
    r = json.loads(out.read_text())
    entry = r["contexts"]["24"]
    assert entry["tokens_per_second"]["graph"] > 0 and entry["tokens_per_second"]["llama_cpp"] is None
    assert 0 <= entry["first_tokens_the_same"] <= 4 and entry["graph_vs_engine"] > 0
    assert set(r["routing"]["prompts"]) == {"first example", "24-token passage"}
    for p in r["routing"]["prompts"].values():
        assert p["never_skip_vs_full"] > 0 and 0 <= p["skipped_at_default"] <= 1
        assert p["default_drop_vs_full"] > 0 and 0 <= p["skipped_at_default_drop"] <= 1
