"""Where a routed text leaves the full model's answer (read off the quality pass's marks) and the repetition flag
(core/records/divergence.py): on hand-built traces, a looping text and the shipped long documents' prose."""

from __future__ import annotations

import re

from routerlab.core.records.divergence import REPEAT_MIN_TOKENS, departure, repetition
from routerlab.core.records.trace import Step, Trace


def words(text: str) -> list[str]:
    """A word-piece split like a BPE tokenizer's: a word with its leading space, each punctuation mark alone."""
    return re.findall(r" ?\w+| ?[^\w\s]|\s+", text)


def _trace(tokens: list[int], tops: dict[int, int], scored: int | None = None, temperature=0.0) -> Trace:
    """A run whose generated tokens are `tokens`; the quality pass scored the first `scored` (all) and marked the full
    model's top-1 where it differs from the routed model's at generated index k: tops[k]."""
    prompt = [Step(0, 9, "Q", True, [None], [None], 0.5, 0.1)]
    gen = []
    for k, t in enumerate(tokens):
        step = Step(k + 1, t, f"<{t}>", False, [None], [None], 0.5, 0.1)
        if scored is None or k < scored:
            step.kl_full = 0.3 if k in tops else 0.01
            if k in tops:
                step.full_top_token, step.full_top_text = tops[k], f"<{tops[k]}>"
        gen.append(step)
    return Trace(1, prompt + gen, {"temperature": temperature})


def test_departure_is_the_first_scored_token_that_is_not_the_full_models_top_1():
    d = departure(_trace([5, 6, 7, 8, 9], {1: 4, 3: 2}))
    assert (d.index, d.scored, d.wrote, d.instead, d.greedy) == (1, 5, "<6>", "<4>", True)
    assert departure(_trace([5, 6, 7], {})).index is None and departure(_trace([5, 6, 7], {})).scored == 3
    # not scored yet (a streaming run): the search covers only the scored tokens
    d = departure(_trace([5, 6, 7, 8], {2: 1}, scored=2))
    assert d.index is None and d.scored == 2
    # a mark that names the token written is no departure (the routed top-1 was not the token: never under greedy)
    assert departure(_trace([5, 6, 7], {0: 5, 2: 1})).index == 2
    # a sampled run has no greedy answer to leave
    d = departure(_trace([5, 6, 7], {0: 1}, temperature=0.8))
    assert d.index is None and d.greedy is False and d.scored == 3
    assert departure(Trace(1, [], {})).scored == 0


def test_a_looping_text_is_flagged_where_its_loop_starts():
    text = "The text above the windmillers" + " a." * 20
    tokens = words(text)
    loop = repetition(tokens)
    assert loop is not None and loop.period == 2 and loop.to_end
    assert "".join(tokens[loop.start : loop.start + loop.period]) in (" a.", ". a")
    assert loop.start == 5 and loop.length == len(tokens) - 5  # " a" "." from the 6th token to the end
    chars = repetition(list("a. a. a. a. a. a. "))  # characters: the unit "a. " six times
    assert chars is not None and chars.period == 3 and chars.start == 0 and chars.times == 6
    run = repetition([1, 2, 3] + [7] * 12)
    assert (run.start, run.period, run.length) == (3, 1, 12)


def test_short_repeats_and_prose_are_not_flagged():
    assert repetition(words(" a." * 3)) is None  # 6 tokens: under REPEAT_MIN_TOKENS
    assert repetition([7] * (REPEAT_MIN_TOKENS - 1)) is None and repetition([7] * REPEAT_MIN_TOKENS) is not None
    assert repetition(list(range(40)) * 2) is None and repetition(list(range(70)) * 3) is None  # twice; a unit over MAX_PERIOD
    assert repetition(words("I said no, no, no, no and left. Then I came back and said yes.")) is None
    from routerlab.core.base.documents import load_documents

    docs = load_documents()
    assert docs
    for doc in docs:  # the shipped long documents: real prose, thousands of tokens each
        assert repetition(words(doc.text)) is None, doc.title
