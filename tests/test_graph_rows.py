"""core/graph_rows.py: a room's rows decode through the step graph together as each decodes through it alone (the
embedded model, the shipped attention-token routers): the same tokens, scores within the rounding of products of more
rows, and rows the graph cannot take decode through torch's ops in the same step."""

import pytest
from test_room import _alone, _in_room

from routerlab.core.config import GenerateConfig
from routerlab.core.engine import Engine
from routerlab.core.step_graph import DECODES

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

SCORE_TOL = 1e-4


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


def test_rows_through_the_graph_decode_as_they_do_alone(engine, routers, embedded):
    requests = _requests(embedded.tokenizer, routers)
    alone = [_alone(engine, r) for r in requests]
    # packed prompts read the dense weights, a prompt alone the file's codes: each prompt read as alone
    shared, _ = _in_room(engine, requests, join_at={2: 3, 5: 1}, pack_prefill=False)
    skipped = 0
    for (_, _, config), a, s in zip(requests, alone, shared):
        assert [x.token_id for x in s.steps] == [x.token_id for x in a.steps]
        for x, y in zip(a.steps, s.steps):
            for sa, sb, ea, eb in zip(x.scores, y.scores, x.executed, y.executed):
                assert (sa is None) == (sb is None)
                if sa is not None:
                    assert abs(sa - sb) <= SCORE_TOL
                    assert ea == eb or abs(sa - config.threshold) <= SCORE_TOL
                    skipped += not eb
        assert a.meta.get("decode") == DECODES and s.meta.get("decode") == DECODES
    assert skipped > 0  # some rows skipped attention while others ran it in the same step
