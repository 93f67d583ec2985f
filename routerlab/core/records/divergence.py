"""Where a routed text leaves the full model's own answer, and whether it repeats itself: read off a finished or
streaming Trace, for a reader who needs more than a mean KL and an agreement share.

`departure(trace)`: the quality pass (core/records/quality.py) reads the routed text at full depth and writes, on each scored
token whose prediction the full model would have made differently, the full model's top-1 token there
(`Step.full_top_token`: set where the full model's top-1 differs from the routed model's top-1 at the same prefix).
Under greedy decoding the routed top-1 *is* the token written, so every token before the first such one is the full
model's own greedy continuation of the same prompt, and that token is where the text leaves it: the same token
Compare finds by running the full model beside it (up to ties and rounding between the two passes). After it, the full
model reads a text it did not write: agreement and KL then say how well it predicts that text (a loop is easy to
predict), not how close the text is to its answer. A sampled run (temperature > 0) has no greedy answer to leave.

`repetition(ids)`: the rule (REPEAT_*): some unit of 1..MAX_PERIOD tokens repeated back to back, so that each token of
a span of at least REPEAT_MIN_TOKENS tokens, and at least REPEAT_MIN_TIMES units, is the token one unit before it.
"a. a. a. a. a. a." is the unit ". a" many times; prose repeats words, never a dozen tokens in a row.

Plain data in and out; no UI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

from routerlab.core.base.config import GREEDY_BELOW  # below it a run decodes greedily
from routerlab.core.records.trace import Trace

MAX_PERIOD = 64  # the longest repeated unit looked for, in tokens (a sentence that loops)
REPEAT_MIN_TOKENS = 12  # the shortest repeated span flagged, in tokens
REPEAT_MIN_TIMES = 3  # ... and the fewest units in it


@dataclass(frozen=True)
class Departure:
    """Where a run's generated text leaves the full model's greedy continuation.

    `index`: 0-based among the generated tokens (None: not within the scored ones); `scored`: generated tokens scored so
    far (the search covers those); `wrote` / `instead`: the routed token's text and the full model's top-1 there;
    `greedy`: False for a sampled run, whose text has no greedy answer to compare (index is then None)."""

    index: int | None
    scored: int
    wrote: str = ""
    instead: str = ""
    greedy: bool = True


@dataclass(frozen=True)
class Repetition:
    """A span of the generated tokens made of one unit repeated: it starts at `start` (0-based), the unit is `period`
    tokens, the span `length` tokens (`length / period` units; it may end in part of one); `to_end`: it runs to the
    last token."""

    start: int
    period: int
    length: int
    to_end: bool

    @property
    def times(self) -> float:
        return self.length / self.period


def departure(trace: Trace) -> Departure:
    """The first scored generated token of `trace` that is not the full model's top-1 at its prefix (see the module)."""
    steps = trace.generated_steps
    scored = sum(1 for s in steps if s.kl_full is not None)
    temperature = trace.meta.get("temperature")
    if temperature is not None and float(temperature) >= GREEDY_BELOW:
        return Departure(None, scored, greedy=False)
    for j, step in enumerate(steps):
        if step.kl_full is None:  # scored in order, chunk by chunk: the rest is not scored yet
            break
        if step.full_top_token is not None and step.full_top_token != step.token_id:
            return Departure(j, scored, step.text, step.full_top_text or "")
    return Departure(None, scored)


def repetition(ids: Sequence[Hashable], max_period: int = MAX_PERIOD, min_tokens: int = REPEAT_MIN_TOKENS,
               min_times: int = REPEAT_MIN_TIMES) -> Repetition | None:
    """The earliest span of `ids` that is one unit repeated back to back (the module's rule), at its full length; the
    shortest unit where spans start together. None: no such span."""
    n, best = len(ids), None
    for p in range(1, min(max_period, n // max(2, min_times)) + 1):
        need = max(min_tokens, min_times * p)
        run = 0  # tokens i-run+1 .. i each equal the token p before them
        for i in range(p, n + 1):
            if i < n and ids[i] == ids[i - p]:
                run += 1
                continue
            length = run + p  # the span: the unit before the run, then the run
            if run and length >= need:
                start = i - length
                if best is None or start < best.start:
                    best = Repetition(start, p, length, to_end=i == n)
            run = 0
    return best
