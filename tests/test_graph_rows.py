"""core/graph/graph_rows.py: a room's rows decode through the step graph together as each decodes through it alone (the
embedded model, the shipped attention-token routers): the same tokens to the bit where MatMulNBits is row-invariant,
else the same until a near tie, with distributions and scores within the rounding of 8-bit activations."""

import pytest
import torch
from test_room import _alone, _in_room

from routerlab.core.base.config import GenerateConfig
from routerlab.core.decode.engine import Engine
from routerlab.core.graph.step_graph import DECODES

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def engine(embedded):
    engine = Engine.from_loaded(embedded, choose_kernels=False)
    engine.decode = "graph"
    return engine


@pytest.fixture(scope="module")
def routers(embedded):
    from routerlab.tuning.checkpoint import resolve_routers

    return resolve_routers(None, "attention-token", embedded.model)[0]


def _requests(tok, routers) -> list[tuple]:
    def ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    def cfg(**kw):
        return GenerateConfig(**{"max_new_tokens": 10, "ignore_eos": True, "chat": False, **kw})

    return [
        (ids("The sky is blue because"), None, cfg()),  # the full model
        (ids("Photosynthesis turns light into"), routers, cfg(threshold=0.5, kv_policy="kv")),
        (ids("A haiku about the sea:"), routers, cfg(threshold=0.8, kv_policy="kv")),  # skips more
        (ids("Water boils at"), routers, cfg(threshold=0.5, kv_policy="drop")),  # its routed layers hold entries of their own
        (ids("Once upon a time there was a small"), routers, cfg(threshold=0.6, kv_policy="kv", max_new_tokens=4)),  # ends early
        (ids("The capital of France is"), routers, cfg(threshold=0.5, temperature=0.9, seed=3)),  # sampled
    ]


def test_rows_through_the_graph_decode_as_they_do_alone(engine, routers, embedded, monkeypatch):
    """Where MatMulNBits gives a row the same bits alone as among others (nbits.rows_independent: AVX-512, AMX), a
    request decodes in a room exactly as alone: the same tokens from the same distributions. Elsewhere (AVX2) the
    parity that holds: until a token or a decision first differs, each step's distribution within the rounding of
    8-bit activations of the alone one's, and what differs first lies at a near tie (a greedy token's margin, a score
    beside its threshold)."""
    from routerlab.core.kernels.nbits import rows_independent

    requests = _requests(embedded.tokenizer, routers)
    drawn = _drawn_from(monkeypatch)
    alone = [_alone(engine, r) for r in requests]
    # packed prompts read the dense weights, a prompt alone the file's codes: each prompt read as alone
    shared, _ = _in_room(engine, requests, join_at={2: 3, 5: 1}, pack_prefill=False)
    exact, compared, skipped = rows_independent(), 0, 0
    for (_, _, config), a, s in zip(requests, alone, shared):
        assert a.meta.get("decode") == DECODES and s.meta.get("decode") == DECODES
        assert len(a.steps) == len(s.steps) and len(drawn[id(a)]) == len(drawn[id(s)]) == config.max_new_tokens
        if exact:
            assert [x.token_id for x in s.steps] == [x.token_id for x in a.steps]
            assert all(torch.equal(x, y) for x, y in zip(drawn[id(a)], drawn[id(s)]))
        n, flips = _agree_until_a_near_tie(a, s, drawn[id(a)], drawn[id(s)], config, SCORE_TOL if exact else ROUNDED_SCORE_TOL)
        compared += n
        skipped += flips
    assert skipped > 0  # some rows skipped attention while others ran it in the same step
    assert compared >= 10  # steps compared before any near tie: the comparison is not empty


SCORE_TOL = 1e-4
# Where rows are not bit-identical, a product's last bits can move a later 8-bit activation by a step: a router's score
# then moves by up to ~0.008 (seen between unaligned cache capacities, test_step_graph), a distribution's KL by up to
# ~0.013 (fp32 8-bit products against bf16 ones); near ties: a greedy margin of 0.25 (test_step_graph's bound).
ROUNDED_SCORE_TOL, KL_TOL, TIE = 0.02, 0.05, 0.25


def _drawn_from(monkeypatch) -> dict[int, list[torch.Tensor]]:
    """Each generation's next-token distributions as it samples them (alone or in a room), keyed by its trace's id."""
    from routerlab.core.decode.generation import Generation

    seen: dict[int, list[torch.Tensor]] = {}
    begin = Generation.begin

    def recording(gen):
        if gen.logits is not None and not gen.control.stop_requested:
            seen.setdefault(id(gen.trace), []).append(gen.logits[0, -1].float().clone())
        return begin(gen)

    monkeypatch.setattr(Generation, "begin", recording)
    return seen


def _agree_until_a_near_tie(a, s, logits_a, logits_s, config, score_tol: float) -> tuple[int, int]:
    """Walk a request's steps alone (a) and in the room (s) until the first token or decision that differs; every step
    before agrees within `score_tol` and KL_TOL, and what differs lies at a near tie. Returns (generated steps compared,
    routed cells the room's run skipped among the compared ones)."""
    prompt = sum(x.is_prompt for x in a.steps)
    compared = skipped = 0
    for j, (x, y) in enumerate(zip(a.steps, s.steps)):
        if not x.is_prompt:
            la, ls = torch.log_softmax(logits_a[j - prompt], -1), torch.log_softmax(logits_s[j - prompt], -1)
            assert float((la.exp() * (la - ls)).sum()) <= KL_TOL
            if x.token_id != y.token_id:  # drawn from nearly the same distribution: a greedy pick at a near tie
                assert config.temperature > 0.05 or float(la[x.token_id] - la[y.token_id]) <= TIE
                return compared, skipped
            compared += 1
        flipped = False
        for sa, sb, ea, eb in zip(x.scores, y.scores, x.executed, y.executed):
            assert (sa is None) == (sb is None)
            if sa is not None:
                assert abs(sa - sb) <= score_tol
                if ea != eb:
                    assert abs(sa - x.threshold) <= score_tol
                    flipped = True
                skipped += not eb
        if flipped:  # later steps read another cache: compared no further
            return compared, skipped
    return compared, skipped


def test_the_near_tie_walk_refuses_what_rounding_cannot_explain():
    """The AVX2 parity above is not vacuous: a token that differs where the alone run's margin is wide, a distribution
    far from the alone one's, or a decision that flips far from its threshold each fail it."""
    from types import SimpleNamespace

    from routerlab.core.records.trace import Step

    def step(token, score, prompt=False):
        return Step(0, token, "", prompt, [None, score], [None, score >= 0.5], 0.5, 0.0)

    def runs(tokens, scores):
        return SimpleNamespace(steps=[step(1, 0.3, True)] + [step(t, sc) for t, sc in zip(tokens, scores)])

    greedy = SimpleNamespace(temperature=0.0)
    near, wide = torch.tensor([2.0, 2.1, 0.0, -1.0]), torch.tensor([0.0, 5.0, -3.0, 0.0])
    a = runs([1, 1], [0.7, 0.6])  # (generated steps compared, cells skipped: the prompt's, then the room's)
    assert _agree_until_a_near_tie(a, runs([1, 0], [0.7, 0.6]), [wide, near], [wide, near], greedy, ROUNDED_SCORE_TOL) == (1, 1)
    edge = runs([1, 1], [0.7, 0.505])
    assert _agree_until_a_near_tie(edge, runs([1, 1], [0.7, 0.495]), [wide, wide], [wide, wide], greedy, ROUNDED_SCORE_TOL) == (2, 2)
    for other, logits, scores in (([1, 0], wide, [0.7, 0.6]), ([1, 1], near, [0.7, 0.6]), ([1, 1], wide, [0.7, 0.3])):
        with pytest.raises(AssertionError):
            _agree_until_a_near_tie(a, runs(other, scores), [wide, wide], [wide, logits], greedy, ROUNDED_SCORE_TOL)
