"""The engine: one loaded model serving every request, each with its own routing, with real skipping.

`Engine.generate` / `generate_ids` take a prompt, a router set, a GenerateConfig and a Control and yield one Step per
token: through the room's loop where one serves (core/serve/room.py), else alone (`alone`: a Generation's prefill,
then each token's step as a room of one through the one step seam, `runtime.step`, core/decode/runtime.py, which
chooses the step graph or torch's layer as decode_paths measured at start-up). The engine also owns what requests
share: the anatomy (`anatomy.Anatomy`, the model's own weights), the kernels chosen for its products, the runtimes
(`runtime`, with the step graphs built per router set), the quality meters' full-depth passes (`full_passes`).

The routing of each request (routers, threshold, KV policy) travels in a per-request `Plan`, never as state on shared
modules: one model serves many generations at once. KV policies for a skipped attention (see config.KV_POLICY_HELP):
  mask  compute, then zero the update (reference semantics, saves nothing)
  kv    compute only the skipped token's keys/values (same numbers as mask)
  drop  the skipped token writes nothing at that layer; each layer's cache keeps its own positions

Knows nothing about checkpoints, training loops or the UI.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Iterator

import torch
from torch import nn

from routerlab.core.base.config import GenerateConfig, check_kv_policy, check_threshold
from routerlab.core.base.device import prepare
from routerlab.core.base.errors import RouterLabError
from routerlab.core.decode import decode_paths
from routerlab.core.decode.runtime import Runtime
from routerlab.core.kernels import low_paths
from routerlab.core.model.cache import LayerCache
from routerlab.core.routing.gates import ALL, NONE, Gate, Plan, Scores, decide, score_table  # noqa: F401 (Plan, NONE: re-exported)
from routerlab.core.decode.generation import Generation, sample  # noqa: F401 (sample: re-exported)
from routerlab.core.ops.forward import FullDepth, forward
from routerlab.core.base.precision import describe, dtype_name
from routerlab.core.kernels.weights import LowBitPlan
from routerlab.core.model.anatomy import Anatomy, LayerParts
from routerlab.core.ops.packed import Segment, forward_shared
from routerlab.core.records.quality import QualityMeter
from routerlab.core.records.trace import Step, Trace
from routerlab.core.routing.router import RouterSet

log = logging.getLogger(__name__)


# -- per-request state ---------------------------------------------------------------------------
class Control:
    """A handle on one running generation: move its threshold live, or ask it to stop.

    Written by another thread (a UI slider), read by the engine between steps. The other way, it
    says what the run's quality pass is doing (`measuring`, `scoring`, `quality_chunks`), so that a
    UI drawing on the same machine can keep its redraws off the pass's full-depth forwards.
    """

    def __init__(self, threshold: float = 0.5):
        self._threshold = check_threshold(threshold)
        self._stop = threading.Event()
        self.trace: Trace | None = None
        self.meter: QualityMeter | None = None  # the run's quality meter, once the run starts (quality on)
        self.sharing = 0  # rows in the room's last step this run took part in (0: not in a shared batch)
        # The prefill's progress (core/decode/generation.py reads a long prompt in chunks): prompt tokens read of the prompt's.
        self.prompt_tokens = 0
        self.prompt_read = 0

    @property
    def threshold(self) -> float:
        return self._threshold

    @threshold.setter
    def threshold(self, value: float) -> None:
        self._threshold = check_threshold(value)

    def request_stop(self) -> None:
        self._stop.set()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    @property
    def measuring(self) -> bool:
        """The run scores its tokens with full-depth passes (quality on, with routers)."""
        return self.meter is not None and self.meter.full_forward is not None

    @property
    def scoring(self) -> bool:
        """A full-depth quality pass is running now, on the decoding thread."""
        return self.meter is not None and self.meter.scoring

    @property
    def quality_chunks(self) -> int:
        """Quality passes finished so far: each one wrote new tokens' `kl_full`."""
        return 0 if self.meter is None else self.meter.chunks


# -- the engine --------------------------------------------------------------------------------
class Engine:
    """One loaded model, shared by every request. `generate` yields Steps; requests share nothing."""

    def __init__(self, model: nn.Module, tokenizer=None, name: str = "", lowbit: LowBitPlan | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "_name_or_path", "") or model.config.model_type
        start = time.perf_counter()
        self.anatomy = Anatomy(model, lowbit)
        if self.anatomy.lowbit is not None:
            log.info("packed the decode weights (%s) in %.1f s", self.anatomy.lowbit.label, time.perf_counter() - start)
        self.n_layers = self.anatomy.n_layers
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        prepare(self.device)  # e.g. CUDA's attention kernels chosen for a decode loop (core/base/device.py)
        self.precision = describe(self.dtype, str(self.device))  # e.g. "bfloat16 weights, long inputs computed in float32 ..."
        self.max_context = int(getattr(self.anatomy.config, "max_position_embeddings", 0) or 1 << 30)
        self.eos_ids = self._eos_ids()
        self.room = None  # a core.serve.room.Room serving this engine: generate_ids then hands requests to its loop
        self.kernels: dict = {}  # what low_paths.tune measured and chose (from_loaded)
        self.runtime = Runtime(self.anatomy, self.max_context)  # the one step seam, and the runtime each row takes
        self.decode_choice: dict = {}  # what decode_paths.choose measured and chose (from_loaded)

    @classmethod
    def from_loaded(cls, loaded, choose_kernels: bool = True) -> Engine:
        """The engine of a models.LoadedModel, with the low-bit weights it was loaded with, each kind of map
        multiplying one row with the kernel measured fastest on this machine (core/kernels/low_paths.py; `choose_kernels`
        False: torch's int4 kernel throughout, for benchmarks that compare kernels themselves)."""
        engine = cls(loaded.model, loaded.tokenizer, loaded.name, getattr(loaded, "lowbit", None))
        if choose_kernels:
            engine.kernels = low_paths.tune(engine.anatomy)
            engine.decode_choice = decode_paths.choose(engine)
        return engine

    @property
    def decode(self) -> str:
        """The start-up choice (core/decode/runtime.py): "graph", rows a step graph takes decode through it; "torch"."""
        return self.runtime.decode

    @decode.setter
    def decode(self, value: str) -> None:
        self.runtime.decode = value

    @property
    def weights(self) -> str:
        """Which weights a decode step reads, and through which kernels: e.g. "the file's own Q4_1 + Q8_0 codes
        (int4 kernel; the head through onnxruntime's MatMulNBits); 16-bit weights for prefill", and, where the step
        graph decodes, "; each decode step one onnxruntime graph on the same codes (where a request's routing allows)"."""
        lowbit = self.anatomy.lowbit
        if lowbit is None:
            return f"{dtype_name(self.dtype)} weights"
        label = low_paths.weights_label(lowbit.label, self.anatomy)
        if self.decode == "graph":
            label += "; each decode step one onnxruntime graph on the same codes (where a request's routing allows)"
        return label

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.tokenizer):
            eos = getattr(source, "eos_token_id", None)
            ids.update(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
        return ids

    # -- text <-> ids ----------------------------------------------------------------------
    def encode(self, prompt: str, config: GenerateConfig) -> list[int]:
        if not isinstance(prompt, str) or not prompt.strip():
            raise RouterLabError("The prompt is empty.", "Type a question or pick an example.")
        if self.tokenizer is None:
            raise RouterLabError("This model has no tokenizer.", "Pass token ids to generate_ids instead.")
        tok = self.tokenizer
        if config.chat and getattr(tok, "chat_template", None):
            messages = [{"role": "system", "content": config.system_prompt}] if config.system_prompt else []
            messages.append({"role": "user", "content": prompt})
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return list(tok(text, add_special_tokens=False)["input_ids"])
        return list(tok(prompt)["input_ids"])

    def token_text(self, token_id: int) -> str:
        """One token as the text it adds (the quality meter names the full model's top token with it)."""
        if self.tokenizer is None:
            return f"<{token_id}>"
        return self.tokenizer.convert_tokens_to_string([self.tokenizer.convert_ids_to_tokens(token_id)])

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer is not None else "".join(f"<{i}>" for i in ids)

    # -- the loop ----------------------------------------------------------------------------
    def new_caches(self, capacity: int) -> list[LayerCache]:
        return [LayerCache(p.attn, capacity, self.dtype, self.device) for p in self.anatomy.layers]

    @torch.inference_mode()
    def forward_tokens(self, ids: list[int], start: int, caches: list[LayerCache], plan: Plan) -> tuple[torch.Tensor, list]:
        """torch's forward over `ids` at positions start.. with `caches` under `plan`: (logits of the last position,
        the score table as host lists). A Generation's prefill chunks and torch's decode steps take it."""
        t = torch.tensor([ids], device=self.device)
        positions = torch.arange(start, start + len(ids), device=self.device)
        logits, scores = forward(self.anatomy, t, positions, caches, plan, top=start + len(ids) - 1,
                                 scores_on="cpu" if len(ids) == 1 else None)  # a prefill's: one copy below
        return logits, scores.cpu().tolist()  # the one host copy of this step's scores

    def trace_meta(self, routers: RouterSet | None, config: GenerateConfig) -> dict:
        level = routers.config.level if routers is not None else None
        effective = "drop" if (level == "sequence" and config.kv_policy == "kv") else config.kv_policy
        return {
            "model": self.name,
            "granularity": routers.granularity if routers is not None else "full",
            "target": routers.config.target if routers is not None else None,
            "level": level,
            "routed_layers": list(routers.config.layers) if routers is not None else [],
            "standin_rank": getattr(routers, "standin_rank", 0),  # skipped cells ran a stand-in
            "hidden_size": self.anatomy.hidden_size,
            "kv_policy": config.kv_policy,
            "kv_policy_effective": effective,
            "dtype": dtype_name(self.dtype),
            "precision": self.precision,
            "weights": self.weights,
            "threshold_start": config.threshold,
            "temperature": config.temperature,  # 0: greedy (core/records/divergence.py: where the text leaves the full model's answer)
            "quality": config.quality,
            "costs": self.costs(routers),
        }

    def costs(self, routers: RouterSet | None) -> dict[str, float]:
        """Per-token FLOPs of one layer's pieces (Anatomy.costs), plus a stand-in's when the set has them."""
        costs = self.anatomy.costs(torch.finfo(self.dtype).bits // 8)
        rank = getattr(routers, "standin_rank", 0)
        if rank:
            costs["standin"] = 4.0 * self.anatomy.hidden_size * rank
        return costs

    def generate(self, prompt: str, routers: RouterSet | None, config: GenerateConfig, control: Control | None = None) -> Iterator[Step]:
        """Stream the prompt's Steps (after prefill), then one Step per generated token."""
        return self.generate_ids(self.encode(prompt, config), routers, config, control)

    def generate_ids(self, ids: list[int], routers: RouterSet | None, config: GenerateConfig,
                     control: Control | None = None) -> Iterator[Step]:
        control = control or Control(config.threshold)
        trace = self.new_trace(ids, routers, config, control)
        if self.room is not None:
            return self.room.submit(ids, routers, config, control, trace)
        return self.alone(ids, routers, config, control, trace)

    def new_trace(self, ids: list[int], routers: RouterSet | None, config: GenerateConfig, control: Control) -> Trace:
        """Check a request (a RouterLabError names what is wrong) and give its run a Trace (also `control.trace`): what
        `generate_ids` does before it runs, for a caller that hands the request to the room itself (`Room.submit`)."""
        self._check(ids, routers, config)
        trace = control.trace = Trace(self.n_layers, meta=self.trace_meta(routers, config))
        return trace

    def _check(self, ids: list[int], routers: RouterSet | None, config: GenerateConfig) -> None:
        if not ids:
            raise RouterLabError("The prompt is empty.", "Type a question or pick an example.")
        if len(ids) + config.max_new_tokens > self.max_context:
            raise RouterLabError(
                f"The prompt ({len(ids)} tokens) plus {config.max_new_tokens} new tokens exceeds the model's "
                f"context of {self.max_context} tokens.", "Shorten the prompt or ask for fewer new tokens.")
        if routers is not None and (routers.n_layers, routers.hidden_size) != (self.n_layers, self.anatomy.hidden_size):
            raise RouterLabError(
                f"These routers were made for a model with {routers.n_layers} layers and hidden size "
                f"{routers.hidden_size}, not {self.n_layers} and {self.anatomy.hidden_size}.",
                "Load routers trained for this model, or train new ones with `python -m routerlab train`.")
        check_kv_policy(config.kv_policy)

    def alone(self, ids, routers, config, control, trace) -> Iterator[Step]:
        """A request decoded by itself on the calling thread, its own forward a token (a room's solo runs: Compare's
        columns, whose speeds are compared, take it too)."""
        gen = Generation(self, ids, routers, config, control, trace)
        try:
            yield from self._steps(gen)
            gen.flush()
        except GeneratorExit:  # the consumer stopped iterating: still score what it was given
            gen.flush()
            raise
        finally:
            gen.close()

    def _steps(self, gen: Generation) -> Iterator[Step]:
        """The request alone: a room of one, each token's step through the one seam (`runtime.step`)."""
        self.runtime.prepare(gen)  # a router set's first request builds its step graph before its prompt is read
        yield from gen.prefill()
        while True:
            yield from gen.begin()
            if gen.feed is None:
                return
            logits, scores = self.runtime.step([gen])
            yield gen.end(logits[0].view(1, 1, -1), scores[0])

    def piece(self, generated: list[int]) -> str:
        """Text the last token adds, decoded with a few tokens of context (multi-byte characters, spaces)."""
        window = generated[-8:]
        before, after = self._decode(window[:-1]), self._decode(window)
        return after[len(before):] if after.startswith(before) else self._decode([generated[-1]])

    def quality_meter(self, ids: list[int], routers: RouterSet | None, config: GenerateConfig) -> QualityMeter | None:
        """The per-token quality meter of one run, or None when quality is off. With no routers the
        run is the full model: KL 0 by definition, no extra pass."""
        if not config.quality:
            return None
        if routers is None:
            return QualityMeter(ids, None, self.token_text)
        full_forward = FullDepth(self.anatomy, self.new_caches(len(ids) + config.max_new_tokens))  # its own cache
        return QualityMeter(ids, full_forward, self.token_text, chunk=config.quality_chunk,
                            refresh_seconds=config.quality_refresh)

    @staticmethod
    def packable(full_forward) -> bool:
        """Whether a quality meter's full forward can join a packed pass (`full_passes`): this engine's own."""
        return isinstance(full_forward, FullDepth)

    def full_passes(self, calls: list[tuple], share: bool = True) -> list[torch.Tensor]:
        """quality.PackedForward: several meters' full-depth passes (each `packable`) in one forward (core/ops/packed.py),
        the start their first passes share read once (`share`)."""
        return forward_shared(self.anatomy, [Segment(ids, start, f.caches, n) for f, ids, start, n in calls], share)

    def run(self, prompt: str, routers: RouterSet | None, config: GenerateConfig) -> Trace:
        """Generate to the end and return the Trace."""
        control = Control(config.threshold)
        for _ in self.generate(prompt, routers, config, control):
            pass
        return control.trace
