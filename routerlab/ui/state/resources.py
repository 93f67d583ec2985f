"""What every session shares on one server: the engines, router sets, prompts and operator limits.

Owns `Limits` (caps from the environment), `RouterSetInfo` and the scan of shipped router sets
(with `expected_skips`: a calibrated set's measured skip rates along the slider, read from its router.json),
the example prompts and the long documents (core/base/documents.py), the dropdown labels `UNTRAINED` / `FULL`, and `Resources` (engines loaded
once, routers built once, prompt and config checks, the per-layer costs measured at start-up).
Knows nothing about Gradio components, sessions, tabs or plots; tensors stay behind the lazy
imports of `routerlab.core` / `routerlab.tuning` (routers, checkpoints).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import statistics
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from routerlab.core.base.config import GenerateConfig, RoutingConfig, default_layers
from routerlab.core.base.documents import load_documents
from routerlab.core.base.errors import RouterLabError, quote
from routerlab.core.base.paths import ASSETS
from routerlab.ui.state import fields

log = logging.getLogger(__name__)

ROUTERS_DIR = ASSETS / "routers"
PROMPTS_FILE = ASSETS / "prompts.json"
UNTRAINED = "attention-token (untrained)"
FULL = "full model (no routing)"
FALLBACK_PROMPTS = [
    "Explain in three sentences why the sky is blue.",
    "Write a short poem about a lighthouse keeper.",
    "List three tips for learning a new language.",
]


def _env_int(name: str, default: int, low: int = 1) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return max(low, int(raw))
    except ValueError:
        log.warning("ignoring %s=%r: not a whole number", name, raw)
        return default


def _env_engine() -> bool:
    """ROUTERLAB_ENGINE: `process` (the default) or `thread`; anything else is said in the log and taken as the default."""
    raw = os.environ.get("ROUTERLAB_ENGINE", "process").strip().lower() or "process"
    if raw not in ("process", "thread"):
        log.warning("ignoring ROUTERLAB_ENGINE=%r: use process or thread", raw)
        return True
    return raw == "process"


@dataclass(frozen=True)
class Limits:
    """Operator caps, from the environment (see README): what one visitor may ask of a shared server."""

    max_new_tokens: int = 256
    max_prompt_chars: int = 16000  # the shipped long documents (assets/documents) are 7,000-9,100 characters with their tasks
    queue_size: int = 64
    max_wait_s: int = 120  # a generation that would wait longer than this in the line is refused at once, with the wait said
    concurrency: int = 32  # generations in flight at once (with the room, they share its decode steps)
    allowed_models: tuple[str, ...] = ()
    training: bool = True  # the Train tab (ROUTERLAB_TRAINING=on|off)
    training_minutes: float = 10.0  # the longest training a visitor may ask for
    training_max_chars: int = 1_000_000  # the most text a visitor may train on
    training_queue: int = 4  # trainings that may wait behind the running one; a visitor beyond is told at once
    training_nice: int = 10  # how much lower the training worker's scheduling priority is than generation's (0: the same)
    max_upload_mb: int = 32  # the largest file Gradio accepts (a router set is ~100 KB, 32 MB at most unpacked; text 4 bytes a character)
    session_sets: int = 8  # router sets one tab keeps (trained or uploaded); a new one drops the oldest
    room: bool = True  # one decode loop for every visitor, a batched step (core/serve/room.py); off: each generation decodes alone
    max_batch: int = 32  # the most rows in one step of the room
    room_cache_mb: int = 2048  # the most KV cache the room's rows may hold (as their longest runs would fill them)
    room_process: bool = True  # the room's loop in an engine process of its own (core/serve/remote.py); False: in the web server's process

    @classmethod
    def from_env(cls) -> "Limits":
        allowed = tuple(m.strip() for m in os.environ.get("ROUTERLAB_ALLOWED_MODELS", "").split(",") if m.strip())
        return cls(
            max_new_tokens=_env_int("ROUTERLAB_MAX_NEW_TOKENS", 256),
            max_prompt_chars=_env_int("ROUTERLAB_MAX_PROMPT_CHARS", 16000),
            queue_size=_env_int("ROUTERLAB_QUEUE_SIZE", 64),
            max_wait_s=_env_int("ROUTERLAB_MAX_WAIT_S", 120),
            concurrency=_env_int("ROUTERLAB_CONCURRENCY", 32),
            allowed_models=allowed,
            training=os.environ.get("ROUTERLAB_TRAINING", "on").strip().lower() not in ("off", "0", "false", "no"),
            training_minutes=float(_env_int("ROUTERLAB_TRAINING_MINUTES", 10)),
            training_max_chars=_env_int("ROUTERLAB_TRAINING_MAX_CHARS", 1_000_000),
            training_queue=_env_int("ROUTERLAB_TRAINING_QUEUE", 4),
            training_nice=min(19, _env_int("ROUTERLAB_TRAINING_NICE", 10, low=0)),
            max_upload_mb=_env_int("ROUTERLAB_MAX_UPLOAD_MB", 32),
            session_sets=_env_int("ROUTERLAB_SESSION_SETS", 8),
            room=os.environ.get("ROUTERLAB_ROOM", "on").strip().lower() not in ("off", "0", "false", "no"),
            max_batch=_env_int("ROUTERLAB_MAX_BATCH", 32),
            room_cache_mb=_env_int("ROUTERLAB_ROOM_CACHE_MB", 2048),
            room_process=_env_engine(),
        )


@dataclass(frozen=True)
class RouterSetInfo:
    """One choice in the granularity dropdown: a shipped folder, or untrained zero routers."""

    label: str
    granularity: str
    path: Path | None = None  # None: RouterSet.zeros on the default layers
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def expected_skips(self) -> str:
        return expected_skips(self.meta)


SLIDER_MARKS = (0.3, 0.5, 0.7)


def expected_skips(meta: dict, marks: tuple[float, ...] = SLIDER_MARKS) -> str:
    """A calibrated set's measured skip rates along the slider, from its router.json (`python -m routerlab
    calibrate` stores them): 'attention-token: 0.30 ≈ 1% · 0.50 ≈ 8% · 0.70 ≈ 30% skipped (held-out prompts)'.
    Empty for a set without a calibration or without those points."""
    block = meta.get("calibration") if isinstance(meta, dict) else None
    points = block.get("points") if isinstance(block, dict) else None
    heldout = points.get("heldout") if isinstance(points, dict) else None
    found = {}
    for p in heldout if isinstance(heldout, list) else []:
        t, rate = (p.get("threshold"), p.get("skip_rate")) if isinstance(p, dict) else (None, None)
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (t, rate)):
            found[round(float(t), 2)] = float(rate)
    if not all(m in found for m in marks):
        return ""
    rates = " · ".join(f"{m:.2f} ≈ {found[m]:.0%}" if found[m] >= 0.1 else f"{m:.2f} ≈ {found[m]:.1%}" for m in marks)
    return f"{meta.get('granularity', 'this set')}: {rates} skipped (held-out prompts)"


def available_router_sets(root: Path = ROUTERS_DIR) -> list[RouterSetInfo]:
    """Router sets shipped under `root` (each subfolder with router.json + routers.safetensors), then the untrained one.

    A folder whose router.json does not validate is skipped with a warning, never offered.
    """
    from routerlab.tuning.checkpoint import read_config  # validates the JSON; weights are only read when chosen

    found: list[RouterSetInfo] = []
    if root.is_dir():
        for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if not ((folder / "router.json").is_file() and (folder / "routers.safetensors").is_file()):
                continue
            try:
                meta = read_config(folder)
            except RouterLabError as err:
                log.warning("skipping router set %s: %s", folder, err)
                continue
            name = "trained" if folder.name == meta["granularity"] else folder.name
            found.append(RouterSetInfo(label=f"{meta['granularity']} ({name})", granularity=meta["granularity"], path=folder, meta=meta))
    found.append(RouterSetInfo(label=UNTRAINED, granularity="attention-token"))
    return found


def operator_router_sets(specs: str | None, model) -> list[RouterSetInfo]:
    """Router sets the operator adds to everyone's menu (`--routers` / ROUTERLAB_ROUTERS): comma-separated folders or
    Hugging Face Hub repo ids (OWNER/NAME), each loaded and checked against `model` now, so a bad one stops the start."""
    from routerlab.tuning.checkpoint import load_routers, routers_folder

    found = []
    for spec in (s.strip() for s in (specs or "").split(",") if s.strip()):
        folder = routers_folder(spec)
        config = load_routers(folder, model)[1]  # validates weights and base model, not only the JSON
        found.append(RouterSetInfo(label=f"{config['granularity']} ({spec})", granularity=config["granularity"], path=folder, meta=config))
    return found


def load_prompts(path: Path = PROMPTS_FILE) -> list[str]:
    try:
        items = json.loads(path.read_text())
        prompts = [i["prompt"] if isinstance(i, dict) else str(i) for i in items]
        return [p for p in prompts if p.strip()] or FALLBACK_PROMPTS
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return FALLBACK_PROMPTS


def _named(value, label: str) -> None:
    """A menu's value is a name (or None: the default); a number, a list or an object is refused, naming the menu."""
    if value is not None and not isinstance(value, str):
        raise fields.FieldError(label, f"{quote(value)} is not one of the choices.", "Pick one from the list.", quote(value))


READ_TIMED_TOKENS = 256  # a prompt this long or longer times the server's reading speed


class Resources:
    """What every session shares: the engines (one per allowed model, loaded once), router sets, limits."""

    def __init__(self, engine, limits: Limits | None = None, router_sets: list[RouterSetInfo] | None = None,
                 prompts: list[str] | None = None, model_loader: Callable[[str], Any] | None = None,
                 status: str = "", documents: list | None = None, details: str = ""):
        self.engine = engine
        self.default_model = engine.name
        self.limits = limits or Limits()
        self.router_sets = router_sets if router_sets is not None else available_router_sets()
        self.prompts = prompts or load_prompts()
        # core.base.documents.Document: the long-document choice in Explore and Compare, those that fit this server's limit
        docs = load_documents() if documents is None else documents
        self.documents = [d for d in docs if len(d.prompt) <= self.limits.max_prompt_chars]
        self.model_loader = model_loader  # name -> Engine, for operator-allowed models
        # the page's first line says what to do; what the engine is and how it decodes is one click away (`details`)
        self.status = status or ("Pick an example prompt (or a long document) and press **Generate**: the heatmap shows, token by "
                                 "token, which layers each token skipped. Move the threshold to skip more or less, even mid-run.")
        self.details = details or f"Model **{engine.name}** loaded · {engine.n_layers} layers."
        self.costs: dict[str, dict[str, float]] = {}  # engine name -> core.decode.costs.cost_breakdown, measured at start-up
        self._reading: collections.deque = collections.deque(maxlen=8)  # (tokens, seconds) of recent long prompts read
        self._engines = {engine.name: engine}
        self._routers: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()
        self.trainer = None  # tuning.runner.TrainingRunner: one training at a time (None: training is off)
        if self.limits.training:
            from routerlab.tuning.runner import TrainingRunner

            self.trainer = TrainingRunner(self.limits.training_nice)

    # -- models and routers ----------------------------------------------------------------
    @property
    def model_choices(self) -> list[str]:
        return [self.default_model] + [m for m in self.limits.allowed_models if m != self.default_model]

    def engine_for(self, name: str | None):
        _named(name, "Model")
        name = name or self.default_model
        if name in self._engines:
            return self._engines[name]
        if name not in self.limits.allowed_models or self.model_loader is None:
            raise RouterLabError(f"Model {name!r} is not available on this server.", "The operator lists allowed models in ROUTERLAB_ALLOWED_MODELS.")
        with self._lock:  # one load per model, whoever asks first
            if name not in self._engines:
                log.info("loading allowed model %s ...", name)
                self._engines[name] = self.model_loader(name)
        return self._engines[name]

    def router_labels(self) -> list[str]:
        return [FULL] + [r.label for r in self.router_sets]

    def routers_for(self, engine, label: str, own: dict | None = None):
        """The RouterSet for dropdown `label` on `engine` (None for the full model); built or loaded once.
        `own`: a session's trained or uploaded sets (label -> (RouterSetInfo, RouterSet)), made for the default model."""
        _named(label, "Granularity (router set)")
        if label in (None, "", FULL):
            return None
        if own and label in own:
            if engine is not self.engine:
                raise RouterLabError(f"{label} was made for {self.default_model}, not {engine.name}.", f"Pick {self.default_model} as the model.")
            return own[label][1]
        info = next((r for r in self.router_sets if r.label == label), None)
        if info is None:
            raise RouterLabError(f"Unknown router set {label!r}.", "Pick one from the granularity list.")
        key = (engine.name, label)
        with self._lock:
            if key not in self._routers:
                self._routers[key] = self._build_routers(engine, info)
            return self._routers[key]

    @staticmethod
    def _build_routers(engine, info: RouterSetInfo):
        from routerlab.core.routing.router import RouterSet  # torch lives behind this import; the UI itself never touches tensors

        if info.path is None:
            config = RoutingConfig.from_granularity(info.granularity, default_layers(engine.n_layers))
            return RouterSet.zeros(engine.model, config)
        from routerlab.tuning.checkpoint import load_routers

        return load_routers(info.path, engine.model)[0]

    def note_reading(self, trace) -> None:
        """A finished run's prompt reading, when long enough to time (a document's): what `reading_rate` says."""
        tokens, seconds = len(trace.prompt_steps), float(trace.meta.get("prefill_seconds") or 0.0)
        if tokens >= READ_TIMED_TOKENS and seconds > 0 and "prefill_stopped_at" not in trace.meta:
            self._reading.append((tokens, seconds))

    def reading_rate(self) -> float | None:
        """Prompt tokens a second this server read its recent long prompts at (the median), None before any."""
        rates = [t / s for t, s in list(self._reading)]
        return statistics.median(rates) if rates else None

    def generate_config(self, max_new_tokens, temperature, threshold, kv_policy, seed=None, quality=False) -> GenerateConfig:
        """A generation request from a visitor's settings, each checked by its field (fields.py: the page's
        components check the same); `quality` None: the switch's default (on)."""
        return GenerateConfig(
            max_new_tokens=fields.MAX_NEW_TOKENS.within(maximum=self.limits.max_new_tokens).check(max_new_tokens),
            temperature=fields.TEMPERATURE.check(temperature),
            threshold=fields.THRESHOLD.check(threshold),
            kv_policy=fields.KV_POLICY.check(kv_policy),
            seed=seed,
            quality=fields.MEASURE_QUALITY.check(quality),
            max_new_tokens_cap=self.limits.max_new_tokens,
        )

    def check_prompt(self, prompt) -> str:
        prompt = fields.PROMPT.within(self.limits.max_prompt_chars).check(prompt)
        if not prompt.strip():
            raise RouterLabError("The prompt is empty.", "Type a question or pick an example.")
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates arrive through raw JSON; the tokenizer raises a bare TypeError
            raise RouterLabError("The prompt contains characters that are not valid text (unpaired surrogates).",
                                 "Remove them and try again.") from None
        return prompt

    def document_prompt(self, title: str | None) -> str:
        """The prompt (text + task) of the long document titled `title`."""
        found = next((d for d in self.documents if d.title == title), None)
        if found is None:
            raise RouterLabError(f"No long document is called {title!r} on this server.", "Pick one from the list.")
        return found.prompt

    def costs_for(self, engine_name: str | None) -> dict[str, float] | None:
        """The measured per-layer costs of an engine (None until `measure_costs` ran for it)."""
        return self.costs.get(engine_name or self.default_model)

    def measure_costs(self, contexts: tuple[int, int] = (128, 1024), repeat: int = 10) -> dict[str, float]:
        """Seconds per decode token of each piece of the default model's step on this machine
        (core.decode.costs.cost_line: cost_breakdown at two contexts, so attention's growth with the cache is known),
        what Explore's estimated speedup is made of: each decoded token costed at its own context. Some seconds
        at start-up (app.py; --no-warmup skips it and shows no estimate)."""
        from routerlab.core.decode.costs import cost_line

        engine = self.engine
        if engine.tokenizer is not None:
            ids = engine.encode(self.prompts[0], GenerateConfig())
        else:
            ids = [1, 2, 3, 4]
        out: dict[str, Any] = {}

        def measure():  # in a worker thread, as every app run decodes: on CPU torch in the main thread can run slower
            try:
                out["costs"] = cost_line(engine, ids, contexts, repeat=repeat)
            except BaseException as err:  # reported below, in the caller's thread
                out["error"] = err

        worker = threading.Thread(target=measure, name="routerlab-costs", daemon=True)
        worker.start()
        worker.join()
        if "error" in out:
            raise out["error"]
        costs = out["costs"]
        self.costs[engine.name] = costs
        return costs
