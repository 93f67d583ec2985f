"""core/step_graph.py: the whole decode step as one onnxruntime graph computes the engine's step on the file's codes
(within the rounding of fp32 activations and 8-bit products against bf16 ones), takes over the engine's prefill cache,
and says why where it cannot run."""

import pytest
import torch

from routerlab.core.engine import Engine, Plan, forward

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def engine(embedded):
    return Engine.from_loaded(embedded, choose_kernels=False)


def test_the_graph_decodes_the_engines_logits_and_tokens_after_its_prefill(engine, embedded):
    from routerlab.core.step_graph import StepGraph

    tok = embedded.tokenizer
    ids = tok("Explain in three sentences why the sky is blue.", add_special_tokens=False)["input_ids"]
    fed = tok(" Sunlight is made of many colours, and the air scatters the short blue waves far more than the red",
              add_special_tokens=False)["input_ids"]
    graph = StepGraph(engine.anatomy, 256)
    caches = engine.new_caches(len(ids) + len(fed) + 1)
    with torch.inference_mode():
        forward(engine.anatomy, torch.tensor([ids]), torch.arange(len(ids)), caches, Plan(None))
        graph.load(caches, len(fed))
        clear, kl = 0, []
        for k, token in enumerate(fed):  # teacher-forced: both read the same tokens
            position = len(ids) + k
            ours = graph.step(token).clone()
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
    from routerlab.core.step_graph import StepGraph

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


def test_models_without_file_codes_or_of_another_family_say_why():
    from routerlab.core.models import tiny_model
    from routerlab.core.step_graph import StepGraph, why_not

    plain = Engine(tiny_model("llama"))  # random weights, no GGUF file: no codes to multiply
    assert "no file codes" in why_not(plain.anatomy)
    with pytest.raises(ValueError, match="no step graph for this model: no file codes"):
        StepGraph(plain.anatomy, 8)
