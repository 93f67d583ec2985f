"""One request's decode as a state machine: prefill, then begin / end around each token's forward.

The prefill reads a long prompt in chunks (`prefill_chunks`), so Stop works during it and its progress is on the
run's Control (`prompt_read` of `prompt_tokens`), where a UI in another thread reads it.

`Generation` holds what a request owns (its caches, Plan, sampler, quality meter, trace) and does everything of a
decode step except the forward itself: `begin` scores a due quality chunk, honours Stop, samples the next token,
handles end of text and the last token, and says what to feed (`feed`); `end` records the forward's scores and
logits. The step between them is the one seam's (core/decode/runtime.py, `Runtime.step`), for a request alone (a
room of one, `Engine.alone`) or as a row of a shared batch (core/serve/room.py), with the same tokens and records
either way.
Knows nothing about threads, batches or the UI.
"""

from __future__ import annotations

import math
import time
from typing import Iterator

import torch

from routerlab.core.model.cache import release
from routerlab.core.base.config import GREEDY_BELOW, GenerateConfig  # noqa: F401 (GREEDY_BELOW: re-exported)
from routerlab.core.ops.layer import hard
from routerlab.core.ops.packed import Segment
from routerlab.core.records.trace import Step, Trace
from routerlab.core.routing.gates import Plan
from routerlab.core.routing.router import RouterSet


# Prompt tokens per prefill forward: a long prompt is read in chunks, so Stop is honoured and progress shown between
# them. Each forward pays a fixed cost (on a CPU without bf16 units every weight is converted to fp32 for a many-row
# product, weights.linear): on a loaded 2-core AVX2 VM a 2,044-token prompt read in 256-token chunks took 2.5-4x the
# one forward's time, in 512-token chunks 1.3-1.6x (/tmp/pf.py-style side-by-side runs, noisy: others shared the cores).
PREFILL_CHUNK = 512
# Where bf16 products are native (this CPU's bf16 units, or a GPU) no weight is converted, and a chunk's fixed cost is
# its attention over the earlier chunks (a mask per layer, the masked kernel): on a 2-core Xeon with AMX a 2,048-token
# prompt took 1.66 s in 512-token chunks, 1.16 s in one forward, 1.32 s in transformers' `generate` (medians of 7
# alternating rounds). There a generation alone reads up to this many tokens a forward; a room reads a long prompt
# PREFILL_CHUNK tokens a step (room.py), since every row of that step waits for the chunk.
PREFILL_CHUNK_NATIVE_BF16 = 2048


def prefill_chunk(engine) -> int:
    """Prompt tokens per prefill forward of a generation alone on `engine` (see PREFILL_CHUNK_NATIVE_BF16)."""
    native = engine.dtype == torch.bfloat16 and not engine.anatomy.upcast
    return max(PREFILL_CHUNK, PREFILL_CHUNK_NATIVE_BF16) if native else PREFILL_CHUNK


def sample(logits: torch.Tensor, config: GenerateConfig, generator: torch.Generator | None) -> int:
    if config.temperature < GREEDY_BELOW:
        # `max`'s index, not `argmax`: the same first largest (ties, NaN alike), in the logits' own dtype; torch's CPU
        # argmax over 49,152 logits took 65 us in fp32 (157 in bf16) where max takes 38, plus 14 for a fp32 copy
        # (2-core Xeon, 2026-12-06), and a room samples every row of a step. numpy's argmax (the first largest, NaN
        # alike) takes 4-5 us in fp32 where torch's max takes 46 (AMD EPYC): fp32 logits on the CPU go through it.
        row = logits[0, -1]
        if row.dtype == torch.float32 and row.device.type == "cpu":
            return int(row.numpy().argmax())
        return int(row.max(0).indices)
    logits = logits[0, -1].float()  # (V,)
    # the largest logit subtracted first: the scaled values stay <= 0, so a small temperature cannot overflow them
    probs = torch.softmax((logits - logits.max()) / config.temperature, dim=-1)
    if config.top_p < 1.0:
        sorted_p, idx = probs.sort(descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < config.top_p
        probs = torch.zeros_like(probs).scatter(0, idx[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


class Generation:
    """A request's decode state. Call `prefill` once, then `begin`; while `feed` is set, run that token through the
    model (the request's `caches` and `plan`) and pass its logits and scores to `end`, then `begin` again."""

    def __init__(self, engine, ids: list[int], routers: RouterSet | None, config: GenerateConfig, control, trace: Trace):
        self.engine, self.ids, self.config, self.control, self.trace = engine, ids, config, control, trace
        self.plan = Plan(routers, control.threshold, config.kv_policy)
        self.sequence = self.plan.level == "sequence"  # decided once at prefill, with the threshold in force then
        self.sampler = torch.Generator(engine.device).manual_seed(config.seed) if config.seed is not None else None
        self.caches = engine.new_caches(len(ids) + config.max_new_tokens)
        self.meter = control.meter = engine.quality_meter(ids, routers, config)
        self.generated: list[int] = []
        self.logits: torch.Tensor | None = None  # (1, 1, V): the distribution the next token is drawn from
        self.feed: tuple[int, int] | None = None  # (token, position) the next forward computes
        self.done = False
        self.runtime = None  # (the engine's choice, the step graph it decodes through or None), set at its first step
        self.positions = 0  # positions the forwards have put through the model (each one a cache entry per layer at full depth)
        self._t0 = 0.0
        self._quality = 0.0  # seconds the quality pass took inside the current step
        self._piece = ""
        self._prompt_steps: list[Step] = []

    def prefill(self) -> list[Step]:
        """Read the prompt: its Steps, all at once at the end. Stop honoured between chunks (then only the chunks read
        have Steps, and `begin` ends the run as stopped)."""
        for _ in self.prefill_chunks():
            pass
        return self._prompt_steps

    def prefill_chunks(self, chunk: int | None = None) -> Iterator[int]:
        """Read the prompt `chunk` tokens at a time (default: `prefill_chunk`; chunks of equal size, through the same caches), yielding
        the tokens read after each; `control.prompt_read` of `control.prompt_tokens` says the same to other threads.
        The same numbers as one forward over the prompt, to float rounding: each chunk's queries attend to the cache
        the earlier chunks wrote, as the whole prompt's later tokens do to its earlier ones. A sequence-level set
        reads the prompt in one forward: it decides each layer once, from the whole prompt's mean."""
        ids, control, total = self.ids, self.control, len(self.ids)
        control.prompt_tokens, control.prompt_read = total, 0
        self.trace.meta.update(prompt_tokens=total, stop_reason="max_new_tokens")
        chunks = 1 if self.sequence else max(1, math.ceil(total / (chunk or prefill_chunk(self.engine))))
        bounds = [round(k * total / chunks) for k in range(chunks + 1)]  # equal chunks: no short last one
        rows: list = []
        t0 = time.perf_counter()
        for start, end in zip(bounds, bounds[1:]):
            if start and control.stop_requested:
                break
            self.logits, scores = self.engine.forward_tokens(ids[start:end], start, self.caches, self.plan)
            rows.extend(scores)
            self.positions = control.prompt_read = end
            yield end
        self._read(rows, time.perf_counter() - t0)

    @property
    def prompt_steps(self) -> list[Step]:
        """The prompt's Steps, once `prefill_chunks` has read it (to its end or to a Stop)."""
        return self._prompt_steps

    def packed_prefill(self) -> Segment | None:
        """The prompt as a segment of a packed forward (core/ops/packed.py), where one forward reads it (at most one
        chunk, any level) and its plan packs; None: read it with `prefill`. After the forward, `prefilled`."""
        if len(self.ids) > PREFILL_CHUNK or not hard(self.plan):
            return None
        self.control.prompt_tokens, self.control.prompt_read = len(self.ids), 0
        self.trace.meta.update(prompt_tokens=len(self.ids), stop_reason="max_new_tokens")
        return Segment(self.ids, 0, self.caches, 1, self.plan)

    def prefilled(self, segment: Segment, logits: torch.Tensor, seconds: float) -> list[Step]:
        """The packed forward read the prompt: its last logits (1, V), the segment's scores, its share of the time."""
        self.logits = logits.view(1, 1, -1)
        self.positions = self.control.prompt_read = len(self.ids)
        self._read(segment.scores.cpu().tolist(), seconds)
        return self._prompt_steps

    def _read(self, rows: list, seconds: float) -> None:
        """The prompt's Steps, from its score rows and the seconds reading it took."""
        ids, total = self.ids, len(self.ids)
        self.trace.meta["prefill_seconds"] = seconds
        if self.positions < total:
            self.trace.meta["prefill_stopped_at"] = self.positions
        text = self.engine.token_text
        self._prompt_steps = [self._record(p, tid, text(tid), True, row, seconds / len(rows))
                              for p, (tid, row) in enumerate(zip(ids, rows))]

    def begin(self) -> list[Step]:
        """Everything before the next forward. Sets `feed` when a token must run through the model; else the run is
        `done` and the Steps returned (the last token, if any) are its last."""
        self.feed = None
        self._t0 = time.perf_counter()
        meter = self.meter
        self._quality = 0.0
        if meter is not None:
            before = meter.seconds
            meter.pump()  # a full chunk is scored here, so its time counts in this token's seconds
            self._quality = meter.seconds - before
            self.trace.meta["quality_seconds_in_steps"] = meter.seconds  # that share of the steps' seconds (the final flush is in none)
        if self.control.stop_requested:
            return self._finish("stopped")
        token = sample(self.logits, self.config, self.sampler)
        if token in self.engine.eos_ids and not self.config.ignore_eos:
            return self._finish("eos")
        self.generated.append(token)
        self._piece = self.engine.piece(self.generated)
        position = len(self.ids) + len(self.generated) - 1
        if len(self.generated) == self.config.max_new_tokens:  # the last token is never fed back: no scores for it
            step = self._record(position, token, self._piece, False, [math.nan] * self.engine.n_layers, 0.0)
            self._quality_of_step(0.0)
            if meter is not None:
                meter.add(step, self.logits)  # its distribution is known: it was sampled from it
            return [step, *self._finish(None)]
        if not self.sequence:
            self.plan.threshold = self.control.threshold  # a live slider takes effect here, between tokens
        self.feed = (token, position)
        return []

    def end(self, logits: torch.Tensor, scores: list[float]) -> Step:
        """The forward of `feed` gave `logits` (1, 1, V) and `scores` (L floats, NaN where unrouted)."""
        token, position = self.feed
        self.positions += 1
        step = self._record(position, token, self._piece, False, scores, time.perf_counter() - self._t0)
        self._quality_of_step(self._quality)
        if self.meter is not None:
            self.meter.add(step, self.logits)  # the routed distribution this token was drawn from
        self.logits = logits
        return step

    def flush(self) -> None:
        """The run ended (also a consumer that stopped reading): the last tokens (eos, stop, max_new_tokens) are scored too."""
        if self.meter is not None:
            self.meter.flush()

    def close(self) -> None:
        """However the run ended (an error too): record what quality and the caches cost."""
        meta = self.trace.meta
        if self.meter is not None:
            meta.update(quality_seconds=self.meter.seconds, quality_chunks=self.meter.chunks)
        meta["kv_bytes_held"] = sum(c.nbytes for c in self.caches)
        # What the full model would hold for the same positions: the last token, never fed back, is in neither (counting
        # it here made every run, kv and mask too, look as if it saved one position's KV at every layer).
        meta["kv_bytes_full"] = self.positions * self.engine.n_layers * int(meta["costs"]["kv_bytes"])
        release(self.caches)  # a batch's slot freed at once, for the next row (core/model/slots.py)
        self.done = True

    def _quality_of_step(self, seconds: float) -> None:
        """Per generated step, the quality pass's share of its seconds: a speed over some of the steps takes out
        exactly theirs (ui.tabs.compare.decode_speed over the steps every column of a ladder ran)."""
        if self.meter is not None:
            self.trace.meta.setdefault("quality_seconds_by_step", []).append(seconds)

    def _finish(self, reason: str | None) -> list[Step]:
        if reason is not None:
            self.trace.meta["stop_reason"] = reason
        self.done = True
        return []

    def _record(self, position, token_id, text, is_prompt, row, seconds) -> Step:
        clean = [None if math.isnan(s) else s for s in row]
        threshold = self.plan.threshold
        step = Step(position, token_id, text, is_prompt, clean, [None if s is None else s >= threshold for s in clean], threshold, seconds)
        self.trace.steps.append(step)
        return step
