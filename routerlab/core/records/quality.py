"""Per-token quality cost of a routed generation: how far each next-token distribution moved from the full model's.

Owns the KL definition that generation and evaluation share (`kl_top_k`: KL(full || routed), exact
over the full model's top-k tokens, the rest as one bucket) and `QualityMeter`, which the engine
feeds with every generated Step and the routed logits that token was sampled from. The meter runs
the same weights at full depth, teacher-forced on the run's own tokens, in chunks, with a KV cache
of its own, and writes `kl_full`, `full_top_token` and `full_top_text` onto the Steps it scores.
It never generates: the full model only reads the tokens the routed model wrote.

Knows nothing about the decode loop, routers, KV policies or how the full forward is computed: the
engine hands it a function that runs the full model on token ids at given positions with its own
cache. Knows nothing about training or the UI.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from routerlab.core.records.trace import Step

KL_TOP = 256  # full-depth log-probabilities kept per token for the KL; the rest is one bucket
# Tokens scored per full-depth forward. A chunk pays a fixed cost (every weight read once; on CPUs
# without bf16 units, bf16 weights converted to fp32 for a many-row product) plus a little per token,
# so bigger chunks are cheaper per token; 32 holds 32 x V routed logits (6 MB for a 49k vocabulary).
# Chosen by `bench quality` (docs/results.md, "What the quality meter costs"): scoring took 28.6% of decode time at 16, 20.8% at 32, 16.4% at 64.
CHUNK = 32
REFRESH_SECONDS = 2.0  # while streaming, buffered tokens wait at most this long to be scored...
# ...unless scoring would then take more than this share of the run's time: on a slow machine a
# refresh every 2 s scores chunks of a few tokens, each paying the chunk's fixed cost (measured
# 33-44% of decode time on a loaded 2-core VM). A time-triggered chunk then waits until decoding
# has run (1 - BUDGET) / BUDGET times as long as the last chunk took. Full chunks never wait.
BUDGET = 0.2
# A partial chunk due on time waits up to this share of the refresh longer when, at the pace its tokens
# arrived, the chunk would fill by then: one chunk's fixed cost instead of two. Near 16 tok/s a 32-token
# chunk fills in about 2 s, and without the grace a run decoding a little slower paid an extra, partial
# chunk (docs/results.md, "Streaming overhead, measured"). A token still waits at most (1 + FILL_GRACE) x the refresh.
FILL_GRACE = 0.25
# A pass reads at most about this many tokens the full model has not read: a long prompt (a document) is read ahead in
# passes of this size, one per call, before its first scored chunk. One full-depth forward over a 2,000-token document
# took seconds, and in a room every other visitor's next token waited for it (core/serve/room.py). The same size as a
# routed prefill's chunks (core/decode/generation.py, PREFILL_CHUNK).
READ_AHEAD = 512

# (ids, start, n) -> the full model's logits (n, V) at the last n of the positions start .. start+len(ids)-1,
# after appending ids to the full model's own cache.
FullForward = Callable[[list[int], int, int], torch.Tensor]


def kl_top_k(top_logp: torch.Tensor, top_ids: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """KL(full || routed) per row (R,), nats, float64 on the CPU.

    `top_logp`, `top_ids` (R, k): the full model's k largest log-probabilities and their token ids;
    `logp` (R, V): the routed log-probabilities. Exact over the top-k tokens; the remaining tokens
    count as one bucket, which can only under-count (log-sum inequality) and is exact when they hold
    no mass, e.g. V <= k.
    """
    lq = logp.gather(1, top_ids.to(logp.device)).float().cpu().double()  # (R, k)
    lp = top_logp.float().cpu().double()  # (R, k)
    head = (lp.exp() * (lp - lq)).sum(1)  # (R,)
    p_rest = (1.0 - lp.exp().sum(1)).clamp_min(0.0)  # below 1e-6 it is float32 rounding: no bucket
    q_rest = (1.0 - lq.exp().sum(1)).clamp_min(1e-300)
    tail = torch.where(p_rest > 1e-6, p_rest * (p_rest.clamp_min(1e-300).log() - q_rest.log()), torch.zeros_like(p_rest))
    return (head + tail).clamp_min(0.0)


class QualityMeter:
    """Scores one run's generated tokens against the full model, a chunk at a time.

    The engine calls `add(step, logits)` for every generated token (the routed logits (V,) it was
    sampled from), `pump()` between tokens and `flush()` when the run ends, however it ends. A chunk
    is scored when `chunk` tokens wait, or when the oldest waiting token has waited `refresh_seconds`
    (so a live view refreshes; None: never on time) and at least (1 - budget) / budget times the
    last chunk's scoring time (so refreshing costs at most about `budget` of the run; None: no such
    floor), unless the chunk would fill within FILL_GRACE of that wait, or at the flush. Only the waiting tokens' routed logits are held:
    memory is bounded by `chunk` x vocabulary, whatever the run's length. A long prompt is read ahead, `read_ahead`
    tokens a pass (READ_AHEAD), so no pass is much longer than a chunk's.

    With `full_forward=None` the routed model *is* the full model: every KL is 0 by definition, and
    no extra work is done.
    """

    def __init__(self, prompt: list[int], full_forward: FullForward | None, token_text: Callable[[int], str],
                 chunk: int = CHUNK, refresh_seconds: float | None = REFRESH_SECONDS, top: int = KL_TOP,
                 budget: float | None = BUDGET, clock: Callable[[], float] = time.perf_counter, read_ahead: int | None = None):
        self.ids = list(prompt)  # every token of the run so far, in position order
        self.fed = 0  # tokens the full model's cache holds: positions 0 .. fed-1
        self.full_forward, self.token_text = full_forward, token_text
        self.chunk, self.refresh_seconds, self.top = max(1, int(chunk)), refresh_seconds, top
        self.pending: list[tuple[Step, torch.Tensor]] = []
        self.since = 0.0  # when the oldest waiting token arrived
        self.seconds = 0.0  # wall time spent scoring (the cost of quality on)
        self.chunks = 0
        self.budget, self.clock = budget, clock
        self.read_ahead = max(1, int(READ_AHEAD if read_ahead is None else read_ahead))
        self.last_chunk_seconds = 0.0
        # True while a chunk is scored (a full-depth forward on the decoding thread), read by other
        # threads: a UI sharing the machine holds its redraws meanwhile (ui/state/stream.py).
        self.scoring = False
        # True while a room scores this meter's passes itself, packed with other rows' (core/serve/room.py): `pump` leaves
        # them to it. `flush` still scores everything.
        self.deferred = False

    def add(self, step: Step, logits: torch.Tensor) -> None:
        """A generated token: `step` (its position follows the last one) and the routed logits it was sampled from."""
        if step.position != len(self.ids):
            raise ValueError(f"tokens must arrive in order: position {step.position}, expected {len(self.ids)}")
        self.ids.append(step.token_id)
        if self.full_forward is None:
            step.kl_full = 0.0  # the full model against itself
            return
        if not self.pending:
            self.since = self.clock()
        # A copy, so an engine that reuses its logits buffer cannot change what is scored later.
        self.pending.append((step, logits.detach().reshape(-1).clone()))  # (V,)

    def refresh_wait(self) -> float | None:
        """Seconds the oldest waiting token waits before a partial chunk is scored (None: never on time)."""
        if self.refresh_seconds is None:
            return None
        if not self.budget:
            return self.refresh_seconds
        return max(self.refresh_seconds, self.last_chunk_seconds * (1.0 - self.budget) / self.budget)

    def unread(self) -> int:
        """Tokens the full model may read before the next scored one: all it has not read, except the position whose
        logits score the first waiting token (or the next generated one) and what follows."""
        limit = (self.pending[0][0].position if self.pending else len(self.ids)) - 1
        return max(0, limit - self.fed)

    def _reads_ahead(self) -> bool:
        """Whether the next pass only reads (a long prompt's next READ_AHEAD tokens) and scores nothing."""
        return self.full_forward is not None and self.unread() > self.read_ahead

    def due(self) -> bool:
        if len(self.pending) >= self.chunk or self._reads_ahead():
            return True
        wait = self.refresh_wait()
        if wait is None or not self.pending:
            return False
        waited, latest = self.clock() - self.since, wait * (1.0 + FILL_GRACE)
        if waited < wait:
            return False
        if waited >= latest:
            return True
        fill = (self.chunk - len(self.pending)) * waited / len(self.pending)  # seconds until full, at the pace so far
        return waited + fill > latest

    def pump(self) -> None:
        """Score the waiting tokens if a chunk is full or they have waited long enough (unless `deferred`)."""
        if not self.deferred and self.due():
            self.score()

    def flush(self) -> None:
        """Score every waiting token (the end of a run, however it ended), reading ahead first where a pass would be long."""
        while self.pending:
            self.score()

    def score(self) -> None:
        self.scoring = True
        try:
            self._score()
        finally:
            self.scoring = False

    @torch.inference_mode()
    def _score(self) -> None:
        t0 = self.clock()
        batch, feed = self._take()
        self._settle(batch, self.full_forward(*feed))
        self._charge(self.clock() - t0, scored=bool(batch))

    def next_pass(self) -> tuple[int, int]:
        """(tokens fed, logits asked for) of the pass `score` would run now; (0, 0) with nothing to do."""
        if self._reads_ahead():
            return self.read_ahead, 1
        if not self.pending:
            return 0, 0
        n = min(len(self.pending), self.chunk)
        return self.pending[n - 1][0].position - self.fed, n

    def _take(self) -> tuple[list[tuple[Step, torch.Tensor]], tuple[list[int], int, int]]:
        """The waiting tokens the next pass scores (at most a chunk), and what that pass feeds the full model:
        (ids it has not read, up to (not including) the last scored one; their first position; how many logits).
        Where the full model has more than `read_ahead` tokens to read first, the pass reads the next `read_ahead` of
        them and scores nothing: no tokens, and one logit (a pass asks for at least one) that nobody reads."""
        if self._reads_ahead():
            start, self.fed = self.fed, self.fed + self.read_ahead
            return [], (self.ids[start : self.fed], start, 1)
        batch, self.pending = self.pending[: self.chunk], self.pending[self.chunk:]
        if self.pending:
            self.since = self.clock()
        n, end = len(batch), batch[-1][0].position
        # The logits at positions end-n .. end-1 predict the n scored tokens.
        feed = (self.ids[self.fed:end], self.fed, n)
        self.fed = end
        return batch, feed

    @torch.inference_mode()
    def _settle(self, batch: list[tuple[Step, torch.Tensor]], logits: torch.Tensor) -> None:
        """Write the KL and the full model's top token onto the scored Steps, from the full model's `logits` (n, V)."""
        if not batch:  # a pass that only read ahead
            return
        steps = [s for s, _ in batch]
        full = torch.log_softmax(logits.float(), dim=-1)  # (n, V)
        routed = torch.log_softmax(torch.stack([r for _, r in batch]).to(full.device).float(), dim=-1)  # (n, V)
        top_logp, top_ids = full.topk(min(self.top, full.shape[-1]), dim=-1)  # (n, k)
        kl = kl_top_k(top_logp, top_ids, routed).tolist()
        # (2, n): one host copy; `max`'s index is argmax's (the first largest) at 0.6x its time on CPU (generation.sample)
        tops = torch.stack([full.max(-1).indices, routed.max(-1).indices]).cpu().tolist()
        for step, k, f, r in zip(steps, kl, *tops):
            if f != r:
                step.full_top_token, step.full_top_text = f, self.token_text(f)
            step.kl_full = k  # last: a reader on another thread that sees the KL sees the top token too

    def _charge(self, seconds: float, scored: bool = True) -> None:
        """A pass of this meter took `seconds` (its share, when it was packed with others'). A pass that only read ahead
        counts in the time, but is no chunk: it brings no new scores, and the refresh's budget is set by chunks."""
        self.seconds += seconds
        if scored:
            self.last_chunk_seconds = seconds
            self.chunks += 1


# (full_forward, ids, start, n) of several meters -> each one's logits (n, V), as its full_forward would give them
PackedForward = Callable[[list[tuple[FullForward, list[int], int, int]]], list[torch.Tensor]]


def score_together(meters: list[QualityMeter], packed: PackedForward, clock: Callable[[], float] = time.perf_counter) -> None:
    """One pass of each meter (as its `score` would run it), the full-depth forwards of them all in one `packed` call:
    rows of a room that fall due together (core/serve/room.py). A forward's cost is mostly reading every weight, so one over
    all their chunks costs far less than one each. Each meter is charged the time in proportion to the tokens it fed.
    Meters without a full forward, or with nothing to read or score, are left alone."""
    meters = [m for m in meters if m.full_forward is not None and m.next_pass()[0]]
    if not meters:
        return
    for m in meters:
        m.scoring = True
    try:
        t0 = clock()
        taken = [m._take() for m in meters]
        with torch.inference_mode():
            logits = packed([(m.full_forward, *feed) for m, (_, feed) in zip(meters, taken)])
        for m, (batch, _), out in zip(meters, taken, logits):
            m._settle(batch, out)
        seconds, fed = clock() - t0, sum(len(feed[0]) for _, feed in taken)
        for m, (batch, feed) in zip(meters, taken):
            m._charge(seconds * len(feed[0]) / fed, scored=bool(batch))
    finally:
        for m in meters:
            m.scoring = False
