"""The Gradio app: layout, event wiring and thin handlers over the engine and plots.py.

Knows nothing about tensors: handlers call `Engine.generate` and plotting functions, nothing else.
Nothing is loaded at import time; `app.py` loads the model and calls `build_demo(Resources(...))`.

Sharing rules (one model serves every visitor):
  - `Resources` is shared and read-mostly: engines, router sets, limits, the full-model speed.
  - `Session` (in a `gr.State`, one per browser tab or API client) holds that visitor's running
    `Control`s and last Trace. A slider event reaches the running generation only through it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import gradio as gr

from routerlab.ui import plots
from routerlab.core.config import GRANULARITIES, KV_POLICIES, KV_POLICY_HELP, GenerateConfig, RoutingConfig, default_layers
from routerlab.core.errors import RouterLabError
from routerlab.core.trace import Trace

from routerlab.core.paths import ASSETS

log = logging.getLogger(__name__)

ROUTERS_DIR = ASSETS / "routers"
BENCH_DIR = ASSETS / "bench"
PROMPTS_FILE = ASSETS / "prompts.json"
CSS_FILE = ASSETS / "css" / "app.css"
UNTRAINED = "attention-token (untrained)"
FULL = "full model (no routing)"

# Streaming frame rates. Every frame costs Python time in this process, and Python time here is
# GIL time the decoder thread waits for: keep frames few and cheap (see the measurements in README).
HEATMAP_INTERVAL = 0.25  # seconds between heatmap redraws while streaming (4 per second at most)
TEXT_INTERVAL = 0.15  # seconds between text updates while streaming
STATS_INTERVAL = 1.0  # seconds between stat-card updates while streaming (savings() walks every cell)
EXPORT_TTL = 3600  # seconds gradio keeps a served export (each run's heatmap HTML embeds plotly.js, ~5 MB); swept every 10 min
FALLBACK_PROMPTS = [
    "Explain in three sentences why the sky is blue.",
    "Write a short poem about a lighthouse keeper.",
    "List three tips for learning a new language.",
]


class NumberSlider(gr.Slider):
    """A Slider that answers a non-number from the API with a clear message (gr.Slider raises a bare
    TypeError on a string, None or a list, which a client sees only as "the app raised an exception")."""

    def preprocess(self, payload):
        if isinstance(payload, bool) or not isinstance(payload, (int, float)) or not math.isfinite(payload):
            raise gr.Error(f"{self.label}: {str(payload)[:40]!r} is not a number; use a value from {self.minimum} to {self.maximum}.")
        return super().preprocess(payload)

    def get_block_name(self) -> str:
        return "slider"  # the browser draws it with gr.Slider's own component


# -- shared, read-mostly resources --------------------------------------------------------------
def _env_int(name: str, default: int, low: int = 1) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return max(low, int(raw))
    except ValueError:
        log.warning("ignoring %s=%r: not a whole number", name, raw)
        return default


@dataclass(frozen=True)
class Limits:
    """Operator caps, from the environment (see README): what one visitor may ask of a shared server."""

    max_new_tokens: int = 256
    max_prompt_chars: int = 4000
    queue_size: int = 16
    concurrency: int = 2  # generations running at once (each Compare runs two models in turn)
    allowed_models: tuple[str, ...] = ()

    @classmethod
    def from_env(cls) -> "Limits":
        allowed = tuple(m.strip() for m in os.environ.get("ROUTERLAB_ALLOWED_MODELS", "").split(",") if m.strip())
        return cls(
            max_new_tokens=_env_int("ROUTERLAB_MAX_NEW_TOKENS", 256),
            max_prompt_chars=_env_int("ROUTERLAB_MAX_PROMPT_CHARS", 4000),
            queue_size=_env_int("ROUTERLAB_QUEUE_SIZE", 16),
            concurrency=_env_int("ROUTERLAB_CONCURRENCY", 2),
            allowed_models=allowed,
        )


@dataclass(frozen=True)
class RouterSetInfo:
    """One choice in the granularity dropdown: a shipped folder, or untrained zero routers."""

    label: str
    granularity: str
    path: Path | None = None  # None: RouterSet.zeros on the default layers
    meta: dict = field(default_factory=dict, compare=False, hash=False)


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


def load_prompts(path: Path = PROMPTS_FILE) -> list[str]:
    try:
        items = json.loads(path.read_text())
        prompts = [i["prompt"] if isinstance(i, dict) else str(i) for i in items]
        return [p for p in prompts if p.strip()] or FALLBACK_PROMPTS
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return FALLBACK_PROMPTS


BENCH_COLUMNS = ["method", "granularity", "kv_policy", "threshold", "speedup", "perplexity", "agreement", "skip_rate_all_layers"]


def load_bench(folder: Path = BENCH_DIR):
    """Benchmark CSVs in `folder` with method/speedup/perplexity columns, concatenated; None when absent.

    Keeps the columns the Trade-off tab shows, and the rows at a run's main context (its first
    row's `context_tokens`: the longer-prompt rows are another table); when several granularities are present, each tuned
    granularity gets its own curve ("tuned mlp-token", ...), as in `bench tradeoff`'s own figure.
    """
    import pandas as pd

    frames = []
    for csv in sorted(folder.glob("*.csv")) if folder.is_dir() else []:
        try:
            df = pd.read_csv(csv)
        except Exception as err:  # a broken results file must not take the app down
            log.warning("skipping %s: %s", csv, err)
            continue
        if {"method", "speedup", "perplexity"} <= set(df.columns):
            if "context_tokens" in df.columns and len(df):  # longer-prompt rows are a separate table
                df = df[df["context_tokens"] == df["context_tokens"].iloc[0]]
            frames.append(df)
    if not frames:
        return None
    df = pd.concat(frames, ignore_index=True)
    if "granularity" in df.columns:
        tuned = [g for g in df["granularity"].dropna().unique() if g != "full"]
        if len(tuned) > 1:
            main = tuned[0]
            df["method"] = [m if g in (main, "full") else f"tuned {g}" for m, g in zip(df["method"], df["granularity"])]
    return df[[c for c in BENCH_COLUMNS if c in df.columns]].round(4)


class Resources:
    """What every session shares: the engines (one per allowed model, loaded once), router sets, limits."""

    def __init__(self, engine, limits: Limits | None = None, router_sets: list[RouterSetInfo] | None = None,
                 prompts: list[str] | None = None, model_loader: Callable[[str], Any] | None = None,
                 status: str = ""):
        self.engine = engine
        self.default_model = engine.name
        self.limits = limits or Limits()
        self.router_sets = router_sets if router_sets is not None else available_router_sets()
        self.prompts = prompts or load_prompts()
        self.model_loader = model_loader  # name -> Engine, for operator-allowed models
        self.status = status or f"Model **{engine.name}** loaded · {engine.n_layers} layers."
        self.full_tokens_per_second: float | None = None
        self._engines = {engine.name: engine}
        self._routers: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    # -- models and routers ----------------------------------------------------------------
    @property
    def model_choices(self) -> list[str]:
        return [self.default_model] + [m for m in self.limits.allowed_models if m != self.default_model]

    def engine_for(self, name: str | None):
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

    def routers_for(self, engine, label: str):
        """The RouterSet for dropdown `label` on `engine` (None for the full model); built or loaded once."""
        if label in (None, "", FULL):
            return None
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
        from routerlab.core.router import RouterSet  # torch lives behind this import; ui.py itself never touches tensors

        if info.path is None:
            config = RoutingConfig.from_granularity(info.granularity, default_layers(engine.n_layers))
            return RouterSet.zeros(engine.model, config)
        from routerlab.tuning.checkpoint import load_routers

        return load_routers(info.path, engine.model)[0]

    def generate_config(self, max_new_tokens, temperature, threshold, kv_policy, seed=None) -> GenerateConfig:
        try:
            max_new = int(max_new_tokens)
        except (TypeError, ValueError):
            raise RouterLabError(f"max new tokens {max_new_tokens!r} is not a whole number.") from None
        return GenerateConfig(
            max_new_tokens=max_new,
            temperature=float(temperature or 0.0),
            threshold=float(threshold),
            kv_policy=kv_policy,
            seed=seed,
            max_new_tokens_cap=self.limits.max_new_tokens,
        )

    def check_prompt(self, prompt: str) -> str:
        if not isinstance(prompt, str) or not prompt.strip():
            raise RouterLabError("The prompt is empty.", "Type a question or pick an example.")
        if len(prompt) > self.limits.max_prompt_chars:
            raise RouterLabError(
                f"The prompt has {len(prompt)} characters; this server accepts up to {self.limits.max_prompt_chars}.",
                "Shorten it (the operator sets ROUTERLAB_MAX_PROMPT_CHARS).",
            )
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates arrive through raw JSON; the tokenizer raises a bare TypeError
            raise RouterLabError("The prompt contains characters that are not valid text (unpaired surrogates).",
                                 "Remove them and try again.") from None
        return prompt

    def measure_full_speed(self, max_new_tokens: int = 24) -> float:
        """Decode tokens/s of the full default model on this machine (the 'speedup' denominator)."""
        from routerlab.core.engine import Control

        prompt = self.prompts[0] if self.engine.tokenizer is not None else None
        control = Control(0.5)
        config = GenerateConfig(max_new_tokens=max_new_tokens, max_new_tokens_cap=max(max_new_tokens, self.limits.max_new_tokens))
        steps = self.engine.generate(prompt, None, config, control) if prompt else self.engine.generate_ids([1, 2, 3, 4], None, config, control)
        # Decode in a worker thread, as every app run does: on CPU, torch in the main thread can run
        # several times slower (measured 4 vs 15 tok/s on a busy 2-core box), which would inflate "vs full".
        decoder = Decoder([steps])
        decoder.done.wait()
        decoder.raise_error()
        self.full_tokens_per_second = control.trace.decode_tokens_per_second() or None
        return self.full_tokens_per_second or 0.0


# -- per-session state --------------------------------------------------------------------------
class Session:
    """One visitor's state, kept in a gr.State: never shared between sessions.

    `control` / `compare_control` are the live handles of a running Explore / Compare generation;
    `trace` is the last Explore run (for what-if views and export).
    """

    def __init__(self):
        self.control = None
        self.compare_control = None
        self.trace: Trace | None = None
        self.compare: tuple[Trace | None, Trace | None] = (None, None)
        self.running = False
        self.compare_running = False
        self.views: dict[str, Any] = {}  # what the page shows now (serialized once), repeated by streams
        self._dir: str | None = None

    def workdir(self) -> Path:
        if self._dir is None or not os.path.isdir(self._dir):
            self._dir = tempfile.mkdtemp(prefix="routerlab-")
        return Path(self._dir)

    def cleanup(self) -> None:
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)


def _delete_session(session: Session | None) -> None:
    if isinstance(session, Session):
        if session.control is not None:
            session.control.request_stop()
        if session.compare_control is not None:
            session.compare_control.request_stop()
        session.cleanup()


# -- handlers (thin: engine + plots, no tensors) ------------------------------------------------
def plot_data(fig):
    """A figure serialized once. A stream repeats it in frames that do not redraw it, instead of
    yielding gr.skip(): Gradio turns every skip into a component rebuild with a JSON-schema pass
    (milliseconds each, on the GIL the decoder thread needs); a repeated value costs a string compare."""
    from gradio.components.plot import PlotData

    return PlotData(type="plotly", plot=fig.to_json())


def _shown(session: Session, key: str, make: Callable[[], Any]) -> Any:
    if key not in session.views:
        session.views[key] = make()
    return session.views[key]


def _status(kind: str, text: str) -> str:
    # Plain symbols, not emoji: they render in every font, offline and in screenshots.
    icon = {"ok": "✓", "run": "▶", "warn": "⚠", "whatif": "◐", "stop": "■"}.get(kind, "")
    return f"{icon} {text}".strip()


def _warn(err: Exception) -> str:
    gr.Warning(str(err))
    return _status("warn", str(err))


def _export(session: Session, trace: Trace) -> tuple[str, str]:
    """Write the run's trace JSON and a standalone heatmap HTML page; return their paths."""
    folder = session.workdir()
    trace_path = folder / "routerlab-trace.json"
    trace_path.write_text(trace.to_json(indent=1))
    html_path = folder / "routerlab-heatmap.html"
    html_path.write_text(plots.figure_html(plots.heatmap(trace)))
    return str(trace_path), str(html_path)


def _done_status(trace: Trace, res: Resources, wall: float) -> str:
    m = trace.meta
    n = len(trace.generated_steps)
    reason = {"eos": "end of text", "max_new_tokens": "max new tokens reached", "stopped": "stopped by you"}.get(m.get("stop_reason"), m.get("stop_reason"))
    return _status(
        "stop" if m.get("stop_reason") == "stopped" else "ok",
        f"Done: {n} tokens in {wall:.1f} s ({reason}); decode {trace.decode_tokens_per_second():.1f} tok/s, "
        f"skip rate {trace.skip_rate():.0%}, granularity {m.get('granularity')}, kv policy {m.get('kv_policy_effective')}. "
        "Move the threshold slider to see a what-if view from the recorded scores.",
    )


def explore_run(res: Resources, prompt, threshold, router_label, kv_policy, max_new_tokens, temperature, model_name, session: Session) -> Iterator[tuple]:
    """Stream one generation: text, heatmap (throttled), stats, status; then figures and exports.

    Yields 9 values: text, heatmap, stats, status, trace file, heatmap html file, layer bar, score histogram, generate button.
    """
    from routerlab.core.engine import Control

    skip = gr.skip()
    session = session if isinstance(session, Session) else Session()
    try:
        res.check_prompt(prompt)
        engine = res.engine_for(model_name)
        routers = res.routers_for(engine, router_label)
        config = res.generate_config(max_new_tokens, temperature, threshold, kv_policy)
        control = Control(config.threshold)
        steps = engine.generate(prompt, routers, config, control)
    except RouterLabError as err:
        yield skip, skip, skip, _warn(err), skip, skip, skip, skip, gr.Button(interactive=True)
        return
    if session.control is not None:  # one Explore run per session: a new click ends the old one
        session.control.request_stop()
    session.control, session.trace, session.running = control, control.trace, True
    trace = control.trace
    live = routers is not None and routers.config.level == "token"
    note = "" if live else (" (full model: the threshold has no effect)" if routers is None else " (sequence level: decided once per prompt)")
    yield skip, skip, skip, _status("run", f"Prefilling the prompt on {engine.name}{note}…"), skip, skip, skip, skip, gr.Button(interactive=False)

    start = next_stats = time.perf_counter()
    decoder = Decoder([steps])
    # Every frame repeats the values it does not change (see plot_data): no gr.skip() while streaming.
    heat = _shown(session, "heat", lambda: plot_data(plots.empty_heatmap()))
    stats = _shown(session, "stats", lambda: plots.stats_html({}))
    bar = _shown(session, "bar", lambda: plot_data(plots.layer_skip_bar(None)))
    hist = _shown(session, "hist", lambda: plot_data(plots.score_histogram(None)))
    status = _status("run", f"Prefilling the prompt on {engine.name}{note}…")
    columns: dict = {}  # this run's heatmap columns, converted once each (plots._columns)
    try:
        for snap, draw_plot in decoder.frames([trace]):
            snap = snap[0]
            if decoder.done.is_set():
                break  # the final view below draws everything once
            if len(snap.steps) < snap.meta.get("prompt_tokens", 1 << 30):
                continue  # still prefilling
            if draw_plot:
                heat = session.views["heat"] = plot_data(plots.heatmap(snap, live=True, cache=columns))
                status = _status("run", f"Generating… {len(snap.generated_steps)} tokens, threshold {control.threshold:.2f}{note}")
                if time.perf_counter() >= next_stats:
                    next_stats = time.perf_counter() + STATS_INTERVAL
                    stats = session.views["stats"] = plots.stats_html(plots.live_stats(snap, res.full_tokens_per_second), running=True)
            yield plots.token_html(snap), heat, stats, status, None, None, bar, hist, "Generate"
        decoder.raise_error()
    except RouterLabError as err:
        yield skip, skip, skip, _warn(err), skip, skip, skip, skip, gr.Button(interactive=True)
        return
    except Exception as err:  # keep the page alive; the console has the traceback
        log.error("generation failed", exc_info=err)
        gr.Warning(f"Generation failed: {err}")
        yield skip, skip, skip, _status("warn", f"Generation failed: {type(err).__name__}: {err}"), skip, skip, skip, skip, gr.Button(interactive=True)
        return
    finally:
        control.request_stop()  # no-op after a normal end; ends the decoder when the stream is cancelled
        session.running = False
    yield (*_final_view(res, session, trace, time.perf_counter() - start),)


class Decoder:
    """Runs engine step iterators to the end in a worker thread, so drawing never pauses decoding.

    The engine appends every Step to its Control's Trace itself; the UI only reads consistent
    snapshots of those traces at its own pace (`frames`). Several iterators are advanced in turn,
    one step each, so runs that share the machine (Compare) are timed under the same load.
    """

    def __init__(self, iterators: list[Iterator]):
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._drain, args=(list(iterators),), name="routerlab-decode", daemon=True)
        self._thread.start()

    def _drain(self, live: list[Iterator]) -> None:
        try:
            while live:
                for it in list(live):
                    if next(it, None) is None:
                        live.remove(it)
        except BaseException as err:  # reported by raise_error() in the UI thread
            self.error = err
        finally:
            self.done.set()

    def frames(self, traces: list[Trace], text_every: float | None = None, plot_every: float | None = None) -> Iterator[tuple[list[Trace], bool]]:
        """Yield (snapshots, draw_plot) when a trace grew: at most every `text_every` s for text, and
        draw_plot=True at most every `plot_every` s when it grew since the last plot.

        The last frame, after decoding ended, always has draw_plot=True.
        """
        text_every = TEXT_INTERVAL if text_every is None else text_every
        plot_every = HEATMAP_INTERVAL if plot_every is None else plot_every
        next_text = next_plot = time.perf_counter()
        text_seen = plot_seen = 0
        while True:
            now = time.perf_counter()
            ahead = [t for t in (next_text, next_plot) if t > now]
            # sleep until the next frame may be due; poll gently while one is due but nothing new arrived
            finished = self.done.wait(min(ahead) - now if ahead else 0.02)  # never spin: the decoder needs the GIL
            now = time.perf_counter()
            snaps = [snapshot(t) for t in traces]
            size = sum(len(t.steps) for t in snaps)
            if finished:
                yield snaps, True
                return
            draw = size != plot_seen and now >= next_plot
            if not draw and (size == text_seen or now < next_text):
                continue
            text_seen, next_text = size, now + text_every
            if draw:
                plot_seen, next_plot = size, now + plot_every
            yield snaps, draw

    def raise_error(self) -> None:
        self._thread.join(timeout=5.0)
        if self.error is not None:
            raise self.error


def snapshot(trace: Trace) -> Trace:
    """A consistent view of a trace another thread is still appending to (steps are never mutated)."""
    return Trace(trace.n_layers, trace.steps[: len(trace.steps)], trace.meta)


def _final_view(res: Resources, session: Session, trace: Trace, wall: float) -> tuple:
    trace_file, html_file = _export(session, trace)
    views = session.views
    views["heat"] = plot_data(plots.heatmap(trace))
    views["stats"] = plots.stats_html(plots.live_stats(trace, res.full_tokens_per_second))
    views["bar"] = plot_data(plots.layer_skip_bar(trace))
    views["hist"] = plot_data(plots.score_histogram(trace))
    return (
        plots.token_html(trace),
        views["heat"],
        views["stats"],
        _done_status(trace, res, wall),
        gr.DownloadButton(value=trace_file, visible=True),
        gr.DownloadButton(value=html_file, visible=True),
        views["bar"],
        views["hist"],
        gr.Button(interactive=True),
    )


def stop_run(session: Session):
    """Ask this session's running generations to stop; returns the status line."""
    stopped = False
    for control in (getattr(session, "control", None), getattr(session, "compare_control", None)):
        if control is not None:
            control.request_stop()
            stopped = True
    return _status("stop", "Stopping…" if stopped else "Nothing is running.")


def show_last(res: Resources, session: Session):
    """After Stop (which also cancels the stream): show whatever the stopped run recorded."""
    trace = getattr(session, "trace", None)
    if isinstance(session, Session):
        session.running = False  # the cancelled stream may never reach its own `finally`
    if trace is None or not trace.steps:
        return (gr.skip(),) * 8 + (gr.Button(interactive=True),)
    view = list(_final_view(res, session, trace, 0.0))
    view[3] = _status("stop", f"Stopped after {len(trace.generated_steps)} tokens. Move the slider for a what-if view, or regenerate.")
    return tuple(view)


def threshold_moved(res: Resources, threshold, session: Session):
    """Slider moved: steer a running generation, or show the what-if view of the last run.

    Returns heatmap, text, stats, status, layer bar, score histogram.
    """
    skip = gr.skip()
    try:
        from routerlab.core.config import check_threshold

        value = check_threshold(threshold)
    except RouterLabError as err:
        return skip, skip, skip, _warn(err), skip, skip
    session = session if isinstance(session, Session) else None
    if session is None:
        return (skip,) * 6
    steered = []
    if session.running and session.control is not None:
        session.control.threshold = value
        steered.append("Explore")
    if session.compare_running and session.compare_control is not None:
        session.compare_control.threshold = value
        steered.append("Compare")
    if steered:
        return skip, skip, skip, _status("run", f"Threshold → {value:.2f} from the next token ({' and '.join(steered)} run)."), skip, skip
    trace = session.trace
    if trace is None or not trace.steps:
        return skip, skip, skip, _status("ok", f"Threshold {value:.2f}: it applies to the next generation."), skip, skip
    stats = plots.live_stats(trace, res.full_tokens_per_second, threshold=value)
    stats["tokens_per_second"] = trace.decode_tokens_per_second()
    recorded = trace.skip_rate()
    return (
        plots.heatmap(trace, threshold=value, what_if=True),
        plots.token_html(trace, threshold=value),
        plots.stats_html(stats),
        _status(
            "whatif",
            f"**What-if view** at threshold {value:.2f}: decisions re-made from the recorded scores, nothing re-run "
            f"(skip rate {trace.skip_rate(value):.0%} vs {recorded:.0%} recorded; tokens/s and text are the recorded run's). "
            "Press **Regenerate at this threshold** for the true run.",
        ),
        plots.layer_skip_bar(trace, threshold=value),
        plots.score_histogram(trace, threshold=value),
    )


def compare_run(res: Resources, prompt, threshold, router_label, kv_policy, max_new_tokens, temperature, model_name, session: Session):
    """The same prompt through the full model and the routed model, interleaved step by step.

    Yields full text, routed text, comparison HTML, routed heatmap, status.
    """
    from routerlab.core.engine import Control

    skip = gr.skip()
    session = session if isinstance(session, Session) else Session()
    try:
        res.check_prompt(prompt)
        engine = res.engine_for(model_name)
        label = router_label if router_label not in (None, "", FULL) else UNTRAINED
        routers = res.routers_for(engine, label)
        seed = 0 if float(temperature or 0) > 0 else None  # same samples for both when sampling
        config = res.generate_config(max_new_tokens, temperature, threshold, kv_policy, seed=seed)
        full_control, routed_control = Control(config.threshold), Control(config.threshold)
        full_steps = engine.generate(prompt, None, config, full_control)
        routed_steps = engine.generate(prompt, routers, config, routed_control)
    except RouterLabError as err:
        yield skip, skip, skip, skip, _warn(err)
        return
    if session.compare_control is not None:
        session.compare_control.request_stop()
    both = _StopBoth(full_control, routed_control)
    session.compare_control, session.compare_running = both, True
    full, routed = full_control.trace, routed_control.trace
    yield plots.token_html(None), plots.token_html(None), skip, skip, _status("run", "Prefilling both…")
    decoder = Decoder([full_steps, routed_steps])
    heat = _shown(session, "compare_heat", lambda: plot_data(plots.empty_heatmap("The routed run's heatmap appears here.")))
    columns: dict = {}
    try:
        for (f, r), draw_plot in decoder.frames([full, routed]):
            div = plots.first_divergence(f, r)
            finished = decoder.done.is_set()
            if draw_plot and r.steps:  # otherwise repeat the last one (see plot_data)
                heat = session.views["compare_heat"] = plot_data(plots.heatmap(r, live=not finished, cache=columns))
            yield (
                plots.token_html(f, diverge_at=div),
                plots.token_html(r, diverge_at=div),
                compare_html(f, r, div),
                heat,
                _status("ok", "Done. The red outline marks the first token where the two runs differ.") if finished else _status("run", "Generating both, one token each in turn…"),
            )
        decoder.raise_error()
    except RouterLabError as err:
        yield skip, skip, skip, skip, _warn(err)
    except Exception as err:
        log.error("compare failed", exc_info=err)
        yield skip, skip, skip, skip, _status("warn", f"Compare failed: {type(err).__name__}: {err}")
    finally:
        both.request_stop()  # ends the decoder if the stream was cancelled
        session.compare_running = False
        session.compare = (full, routed)


class _StopBoth:
    """The Compare run's Control as the session sees it: threshold goes to the routed run, Stop to both."""

    def __init__(self, full, routed):
        self.full, self.routed = full, routed

    @property
    def threshold(self) -> float:
        return self.routed.threshold

    @threshold.setter
    def threshold(self, value: float) -> None:
        self.routed.threshold = value

    def request_stop(self) -> None:
        self.full.request_stop()
        self.routed.request_stop()

    @property
    def stop_requested(self) -> bool:
        return self.routed.stop_requested or self.full.stop_requested


def compare_html(full: Trace | None, routed: Trace | None, diverge_at: int | None) -> str:
    if full is None or routed is None:
        return ""
    f_tps, r_tps = full.decode_tokens_per_second(), routed.decode_tokens_per_second()
    speed = f"{r_tps / f_tps:.2f}×" if f_tps and r_tps else "–"
    if diverge_at is None:
        same = min(len(full.generated_steps), len(routed.generated_steps))
        div = f"identical so far ({same} tokens)"
    else:
        tok = routed.generated_steps[diverge_at].text
        div = f"first difference at generated token {diverge_at + 1} (routed wrote “{plots.token_label(tok, 16)}”)"
    stats = {
        "full": (f"{f_tps:.1f} tok/s", f"{len(full.generated_steps)} tokens"),
        "routed": (f"{r_tps:.1f} tok/s", f"{len(routed.generated_steps)} tokens, skip rate {routed.skip_rate():.0%}"),
    }
    return (
        "<div class='rl-stats'>"
        f"<div class='rl-card'><div class='rl-card-v'>{stats['full'][0]}</div><div class='rl-card-l'>full model · {stats['full'][1]}</div></div>"
        f"<div class='rl-card'><div class='rl-card-v'>{stats['routed'][0]}</div><div class='rl-card-l'>routed · {stats['routed'][1]}</div></div>"
        f"<div class='rl-card'><div class='rl-card-v'>{speed}</div><div class='rl-card-l'>routed vs full (measured side by side)</div></div>"
        f"</div><div class='rl-foot'>{div}</div>"
    )


def router_set_chosen(res: Resources, label: str):
    """A shipped router set was chosen: start from its calibrated threshold and the KV policy it was trained for."""
    info = next((r for r in res.router_sets if r.label == label), None)
    if info is None or info.path is None:
        return gr.skip(), gr.skip(), gr.skip()
    threshold, policy = float(info.meta.get("threshold", 0.5)), info.meta.get("kv_policy", "kv")
    return (
        gr.Slider(value=threshold),
        gr.Radio(value=policy),
        _status("ok", f"Router set **{label}**: threshold set to its calibrated {threshold:.2f}; trained for the **{policy}** KV policy."),
    )


def tradeoff_pick(df, evt: gr.SelectData):
    """A row of the results table was clicked: set Explore's threshold to its threshold and go there."""
    try:
        row = evt.row_value if evt.row_value is not None else df.iloc[evt.index[0]].tolist()
        cols = list(df.columns)
        if "method" in cols and not str(row[cols.index("method")]).startswith(("tuned", "official")):
            return gr.skip(), gr.skip(), _status("warn", f"{row[cols.index('method')]} is a baseline: its threshold is not a router threshold. Pick a tuned row.")
        value = float(row[cols.index("threshold")])
        if not 0.0 <= value <= 1.0:  # NaN too: the full model's row has no threshold
            raise ValueError(value)
    except (ValueError, TypeError, IndexError, AttributeError, KeyError):
        return gr.skip(), gr.skip(), _status("warn", "That row has no threshold to use.")
    return gr.Slider(value=value), gr.Tabs(selected="explore"), _status("ok", f"Threshold set to {value:.2f} from the trade-off table.")


def tradeoff_sweep(res: Resources, prompt, router_label, kv_policy, model_name, progress=gr.Progress()):
    """A quick sweep when no benchmark results ship: tokens/s and agreement with the full model per threshold."""
    import pandas as pd

    from routerlab.core.engine import Control

    try:
        res.check_prompt(prompt)
        engine = res.engine_for(model_name)
        label = router_label if router_label not in (None, "", FULL) else UNTRAINED
        routers = res.routers_for(engine, label)
        config = res.generate_config(min(32, res.limits.max_new_tokens), 0.0, 0.5, kv_policy)
    except RouterLabError as err:
        return plots.tradeoff_curve(None), None, _warn(err)
    thresholds = [0.0, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    progress(0.0, desc="full model")
    full = engine.run(prompt, None, config)
    full_ids = [s.token_id for s in full.generated_steps]
    rows = [dict(method="full", threshold=None, speedup=1.0, agreement=1.0, skip_rate=0.0, kv_policy=kv_policy)]
    f_tps = full.decode_tokens_per_second() or 1.0
    for k, t in enumerate(thresholds):
        progress((k + 1) / (len(thresholds) + 1), desc=f"threshold {t:.2f}")
        trace = engine.run(prompt, routers, dataclasses.replace(config, threshold=t))
        ids = [s.token_id for s in trace.generated_steps]
        same = next((j for j, (a, b) in enumerate(zip(full_ids, ids)) if a != b), min(len(full_ids), len(ids)))
        rows.append(dict(method=label, threshold=t, speedup=trace.decode_tokens_per_second() / f_tps, agreement=same / max(1, len(full_ids)), skip_rate=trace.skip_rate(), kv_policy=kv_policy))
    df = pd.DataFrame(rows)
    return plots.tradeoff_curve(df, quality="agreement"), df.round(3), _status("ok", "Sweep done: agreement = share of the full model's greedy tokens reproduced before the first difference.")


# -- layout ---------------------------------------------------------------------------------------
ABOUT_MD_TEMPLATE = """
### What you are looking at
A **router** is one tiny linear layer in front of a sub-layer (here: attention). For every token it
reads the normalised hidden state and outputs a score `sigmoid(w · x)`. The sub-layer runs only if
**score ≥ threshold**; otherwise the token goes straight on through the residual connection.
In **Router-Tuning** only these routers are trained (about 1,000 instructions, one epoch), the base
model stays frozen. Fresh routers output 0.5 everywhere, so at threshold 0.5 nothing is skipped.

### Three ways to skip attention with a KV cache
{kv_policies}

### What is measured, and how
* **Heatmap**: one column per token (prompt, then generated), one row per layer. Warm colours: the layer ran, coloured by router score; greys: skipped; blank rows: layers without a router (they always run). Dashed blue lines: where you moved the threshold during the run.
* **tokens/s**: wall time of each decode step on this machine, measured in the engine (the UI's drawing is not included).
* **vs full model**: tokens/s divided by the full model's tokens/s measured on this machine at start-up (Compare measures both side by side).
* **attention FLOPs saved**: share of the attention work (projections + scores) not computed for routed layers, from the model's shapes and the recorded decisions.
* **KV cache saved**: keys/values never stored (only the *drop* policy saves memory).
* **What-if**: after a run, moving the slider re-decides every cell from the recorded scores (cells whose decision changes are tinted blue). Nothing is re-run: tokens after the first changed decision could have been different. Use *Regenerate at this threshold* for the true run.
* Exports: the trace as JSON (every token's scores and decisions), the heatmap as a standalone HTML page; the camera icon on any plot saves a PNG.
"""

ABOUT_MD = ABOUT_MD_TEMPLATE.replace("{kv_policies}", "\n".join(f"* **{name}**: {text}." for name, text in KV_POLICY_HELP.items()))

DIAGRAM = """
<svg viewBox="0 0 800 190" class="rl-diagram" role="img" aria-label="A router scores each token; attention runs only if the score clears the threshold">
 <defs><marker id="rl-arrow" markerWidth="8" markerHeight="8" refX="7" refY="4" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#374151"/></marker></defs>
 <g font-family="system-ui,sans-serif" font-size="13" fill="#111827" stroke-width="1.5">
  <rect x="10" y="90" width="80" height="36" rx="6" fill="#f3f4f6" stroke="#9ca3af"/><text x="50" y="113" text-anchor="middle">token h</text>
  <rect x="120" y="90" width="70" height="36" rx="6" fill="#f3f4f6" stroke="#9ca3af"/><text x="155" y="113" text-anchor="middle">norm</text>
  <rect x="220" y="90" width="120" height="36" rx="6" fill="#fde68a" stroke="#d97706"/><text x="280" y="113" text-anchor="middle">router σ(w·x)</text>
  <rect x="370" y="90" width="130" height="36" rx="18" fill="#fff" stroke="#374151"/><text x="435" y="113" text-anchor="middle">score ≥ threshold?</text>
  <rect x="540" y="90" width="100" height="36" rx="6" fill="#fecaca" stroke="#b23a48"/><text x="590" y="113" text-anchor="middle">attention</text>
  <circle cx="690" cy="108" r="16" fill="#fff" stroke="#374151"/><text x="690" y="113" text-anchor="middle">+</text>
  <rect x="725" y="90" width="65" height="36" rx="6" fill="#f3f4f6" stroke="#9ca3af"/><text x="757" y="113" text-anchor="middle">h′</text>
  <g stroke="#374151" fill="none">
   <path d="M90,108 H116" marker-end="url(#rl-arrow)"/>
   <path d="M190,108 H216" marker-end="url(#rl-arrow)"/>
   <path d="M340,108 H366" marker-end="url(#rl-arrow)"/>
   <path d="M500,108 H536" marker-end="url(#rl-arrow)"/>
   <path d="M640,108 H670" marker-end="url(#rl-arrow)"/>
   <path d="M706,108 H721" marker-end="url(#rl-arrow)"/>
   <path d="M50,90 V40 H690 V88" stroke="#9ca3af" marker-end="url(#rl-arrow)"/>
   <path d="M435,126 V165 H690 V128" stroke="#d97706" stroke-dasharray="5 4" marker-end="url(#rl-arrow)"/>
  </g>
  <text x="518" y="102" font-size="11" fill="#374151" text-anchor="middle">yes</text>
  <text x="370" y="34" font-size="11" fill="#6b7280">residual: h always passes on</text>
  <text x="445" y="160" font-size="11" fill="#92400e">no: skip (the KV policy decides what is still computed)</text>
 </g>
</svg>
"""


# In-browser what-if preview: re-split the final heatmap's recorded scores at the new threshold
# (a cell runs iff score >= threshold, as in Trace.executed_matrix) without waiting for the server,
# which then sends the full view (changed-cell tint, stats, text, layer plots). Installed on page
# load as plain DOM listeners on the threshold inputs: a Gradio `js=` listener on the slider would
# make the browser hold the slider's server event until a running stream ends (no live steering).
WHAT_IF_PREVIEW_JS = """
() => {
  const preview = (threshold) => {
    try {
      const gd = document.querySelector('#rl-heatmap .js-plotly-plot');
      const meta = gd && gd.layout && gd.layout.meta;
      if (!window.Plotly || !meta || meta.routerlab !== 'final' || !gd.data || gd.data.length < 2) return;
      const generate = document.querySelector('#rl-generate');
      if (generate && generate.disabled) return;  // a run is going: the slider steers it, no what-if
      if (meta.what_if !== undefined && Math.abs(meta.what_if - threshold) < 1e-9) return;  // the server's view is already here
      const unpack = (z) => {  // a 2-D array, or plotly's base64 typed-array spec
        if (Array.isArray(z)) return {rows: z.length, cols: z[0].length, get: (r, c) => (z[r][c] === null ? NaN : z[r][c])};
        const bytes = Uint8Array.from(atob(z.bdata), (ch) => ch.charCodeAt(0));
        const flat = z.dtype === 'f8' ? new Float64Array(bytes.buffer) : new Float32Array(bytes.buffer);
        const [rows, cols] = String(z.shape).split(',').map(Number);
        return {rows, cols, get: (r, c) => flat[r * cols + c]};
      };
      const a = unpack(gd.data[0].z), b = unpack(gd.data[1].z);  // ran, skipped: together every routed score
      const ran = [], skipped = [];
      for (let r = 0; r < a.rows; r++) {
        const rr = new Array(a.cols), sr = new Array(a.cols);
        for (let c = 0; c < a.cols; c++) {
          const v = Number.isNaN(a.get(r, c)) ? b.get(r, c) : a.get(r, c);
          rr[c] = !Number.isNaN(v) && v >= threshold ? v : null;
          sr[c] = !Number.isNaN(v) && v < threshold ? v : null;
        }
        ran.push(rr); skipped.push(sr);
      }
      // one redraw: new z for ran/skipped, the changed-cell tint (if any) hidden, the title
      const traces = gd.data.length > 2 ? [0, 1, 2] : [0, 1];
      const z = traces.length > 2 ? [ran, skipped, gd.data[2].z] : [ran, skipped];
      Plotly.update(gd, {z: z, visible: traces.map((i) => i < 2)},
        {'title.text': '<b>WHAT-IF</b> at threshold ' + Number(threshold).toFixed(2) + ', re-decided in your browser from the recorded scores (not a new run) …'}, traces);
    } catch (err) { console.warn('RouterLab what-if preview:', err); }
  };
  const onInput = (e) => {
    const el = e.target;
    if (!el || !el.closest || !el.closest('#rl-threshold')) return;
    if (e.type === 'input' && el.type !== 'range') return;  // typing a number: wait for Enter / blur
    if (e.type === 'keydown' && e.key !== 'Enter') return;
    const value = parseFloat(el.value);
    if (Number.isNaN(value) || value === last) return;
    if (e.type !== 'input') { last = value; preview(value); return; }  // a release or Enter: draw now
    pending = value;  // while dragging: only the latest value, once per frame
    requestAnimationFrame(() => { if (pending === null) return; last = pending; pending = null; preview(last); });
  };
  let pending = null, last = null;
  for (const kind of ['input', 'change', 'keydown']) document.addEventListener(kind, onInput, true);
  window.routerlabWhatIfPreview = preview;  // for tests and the curious
}
"""


def theme():
    # System fonts only: the app must look right offline (a workshop laptop without network).
    return gr.themes.Soft(
        primary_hue="orange",
        neutral_hue="stone",
        font=[gr.themes.Font(f) for f in ("Inter", "ui-sans-serif", "system-ui", "sans-serif")],
        font_mono=[gr.themes.Font(f) for f in ("ui-monospace", "SFMono-Regular", "Menlo", "monospace")],
    )


def launch_options() -> dict:
    """Keyword arguments for `demo.launch` that carry the look (Gradio 6 takes theme/css at launch)."""
    return dict(theme=theme(), css_paths=[str(CSS_FILE)] if CSS_FILE.is_file() else None, js=WHAT_IF_PREVIEW_JS)


def build_demo(res: Resources) -> gr.Blocks:
    """The whole app. Handlers are bound to `res`; per-visitor state lives in a gr.State(Session)."""
    limits = res.limits
    labels = res.router_labels()
    # Default: a shipped token-level set (the threshold steers it live), else any shipped set.
    shipped = [r for r in res.router_sets if r.path is not None]
    default_set = next((r for r in shipped if r.granularity.endswith("-token")), shipped[0] if shipped else None)
    default_routers = default_set.label if default_set else UNTRAINED
    start_threshold = float(default_set.meta.get("threshold", 0.5)) if default_set else 0.5
    start_policy = default_set.meta.get("kv_policy", "kv") if default_set else "kv"
    with gr.Blocks(title="RouterLab: see and steer dynamic depth", analytics_enabled=False, delete_cache=(600, EXPORT_TTL)) as demo:
        session = gr.State(Session(), delete_callback=_delete_session)
        gr.Markdown("# RouterLab\nWatch a language model skip attention layer by layer, and steer how much it skips.", elem_id="rl-title")
        status = gr.Markdown(res.status, elem_id="rl-status")
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=260, elem_id="rl-settings"):
                threshold = NumberSlider(0.0, 1.0, value=start_threshold, step=0.01, label="Threshold", info="a routed layer runs when its score ≥ threshold; move it during a run to steer, after a run for a what-if view", elem_id="rl-threshold")
                router_label = gr.Dropdown(labels, value=default_routers, label="Granularity (router set)", info="shipped router sets, untrained zero routers, or the full model", elem_id="rl-granularity")
                kv_policy = gr.Radio(list(KV_POLICIES), value=start_policy, label="KV policy", info="mask: no saving · kv: same output, less work · drop: most saving, different output (see About)", elem_id="rl-kv")
                max_new = NumberSlider(1, limits.max_new_tokens, value=min(96, limits.max_new_tokens), step=1, label="Max new tokens", elem_id="rl-max-new")
                temperature = NumberSlider(0.0, 1.5, value=0.0, step=0.05, label="Temperature", info="0 = greedy", elem_id="rl-temperature")
                model = gr.Dropdown(res.model_choices, value=res.default_model, label="Model", visible=len(res.model_choices) > 1, info="models the operator allows (ROUTERLAB_ALLOWED_MODELS)", elem_id="rl-model")
            with gr.Column(scale=4):
                with gr.Tabs(selected="explore", elem_id="rl-tabs") as tabs:
                    with gr.Tab("Explore", id="explore", elem_id="rl-tab-explore"):
                        prompt = gr.Textbox(value=res.prompts[0], label="Prompt", lines=3, max_length=limits.max_prompt_chars, elem_id="rl-prompt")
                        gr.Examples([[p] for p in res.prompts], inputs=[prompt], label="Example prompts")
                        with gr.Row():
                            go_btn = gr.Button("Generate", variant="primary", elem_id="rl-generate")
                            regen_btn = gr.Button("Regenerate at this threshold", elem_id="rl-regenerate")
                            stop_btn = gr.Button("Stop", variant="stop", elem_id="rl-stop")
                        text = gr.HTML(plots.token_html(None), elem_id="rl-text")
                        stats = gr.HTML(plots.stats_html({}), elem_id="rl-stats")
                        heat = gr.Plot(plots.empty_heatmap(), label="Layers × tokens", elem_id="rl-heatmap")
                        with gr.Row():
                            trace_dl = gr.DownloadButton("Download trace (JSON)", visible=False, size="sm", elem_id="rl-dl-trace")
                            html_dl = gr.DownloadButton("Download heatmap (HTML)", visible=False, size="sm", elem_id="rl-dl-html")
                        gr.Markdown("PNG: use the camera icon in the heatmap's toolbar.", elem_classes=["rl-muted"])
                    with gr.Tab("Compare", id="compare", elem_id="rl-tab-compare"):
                        gr.Markdown("The same prompt through the **full model** and the **routed model**, token by token, with the settings on the left (untrained routers if *full model* is selected).")
                        c_prompt = gr.Textbox(value=res.prompts[0], label="Prompt", lines=2, max_length=limits.max_prompt_chars, elem_id="rl-c-prompt")
                        with gr.Row():
                            c_btn = gr.Button("Compare", variant="primary", elem_id="rl-compare")
                            c_stop = gr.Button("Stop", variant="stop", elem_id="rl-c-stop")
                        c_stats = gr.HTML("", elem_id="rl-c-stats")
                        with gr.Row():
                            with gr.Column():
                                gr.Markdown("**Full model**")
                                c_full = gr.HTML(plots.token_html(None), elem_id="rl-c-full")
                            with gr.Column():
                                gr.Markdown("**Routed**")
                                c_routed = gr.HTML(plots.token_html(None), elem_id="rl-c-routed")
                        c_heat = gr.Plot(plots.empty_heatmap("The routed run's heatmap appears here."), label="Routed run: layers × tokens", elem_id="rl-c-heatmap")
                    with gr.Tab("Trade-off", id="tradeoff", elem_id="rl-tab-tradeoff"):
                        bench = load_bench()
                        gr.Markdown(
                            "Speed against quality for each method and threshold. Click a row of the table to use its threshold in Explore."
                            if bench is not None
                            else "No benchmark results ship with this build yet (`assets/bench/`). Run a quick sweep on the Explore prompt: "
                            "tokens/s and agreement with the full model's greedy output, per threshold."
                        )
                        t_plot = gr.Plot(plots.tradeoff_curve(bench), label="Speed vs quality", elem_id="rl-tradeoff")
                        t_table = gr.Dataframe(bench, interactive=False, elem_id="rl-t-table")
                        t_btn = gr.Button("Run a quick sweep (about a minute)", elem_id="rl-sweep")
                    with gr.Tab("Layers", id="layers", elem_id="rl-tab-layers"):
                        gr.Markdown("Per-layer view of the last Explore run (follows the what-if threshold after a run).")
                        l_bar = gr.Plot(plots.layer_skip_bar(None), label="Skip rate per layer", elem_id="rl-layer-bar")
                        l_hist = gr.Plot(plots.score_histogram(None), label="Router scores per layer", elem_id="rl-layer-hist")
                    with gr.Tab("About", id="about", elem_id="rl-tab-about"):
                        gr.HTML(DIAGRAM)
                        gr.Markdown(ABOUT_MD)

        run_inputs = [prompt, threshold, router_label, kv_policy, max_new, temperature, model, session]
        run_outputs = [text, heat, stats, status, trace_dl, html_dl, l_bar, l_hist, go_btn]

        def _explore(*args):
            yield from explore_run(res, *args)

        def _show_last(s):
            return show_last(res, s)

        def _moved(t, s):
            return threshold_moved(res, t, s)

        def _compare(*args):
            yield from compare_run(res, *args)

        def _sweep(p, r, k, m, progress=gr.Progress()):
            return tradeoff_sweep(res, p, r, k, m, progress)

        limit = max(1, limits.concurrency)
        gen_evt = go_btn.click(_explore, run_inputs, run_outputs, api_name="generate", concurrency_limit=limit, concurrency_id="gen", show_progress="minimal")
        prompt_evt = prompt.submit(_explore, run_inputs, run_outputs, api_name=False, concurrency_limit=limit, concurrency_id="gen", show_progress="minimal")
        regen_evt = regen_btn.click(_explore, run_inputs, run_outputs, api_name="regenerate", concurrency_limit=limit, concurrency_id="gen", show_progress="minimal")
        stop_btn.click(stop_run, [session], [status], api_name="stop", cancels=[gen_evt, prompt_evt, regen_evt], queue=False).then(
            _show_last, [session], run_outputs, api_name=False
        )
        threshold.change(
            _moved, [threshold, session], [heat, text, stats, status, l_bar, l_hist],
            api_name="set_threshold", trigger_mode="always_last", concurrency_limit=None, show_progress="hidden",
        )
        cmp_evt = c_btn.click(_compare, [c_prompt, threshold, router_label, kv_policy, max_new, temperature, model, session], [c_full, c_routed, c_stats, c_heat, status], api_name="compare", concurrency_limit=limit, concurrency_id="gen", show_progress="minimal")
        c_stop.click(stop_run, [session], [status], api_name="stop_compare", queue=False)
        router_label.input(lambda label: router_set_chosen(res, label), [router_label], [threshold, kv_policy, status], api_name=False)
        t_table.select(tradeoff_pick, [t_table], [threshold, tabs, status], api_name=False)
        t_btn.click(_sweep, [prompt, router_label, kv_policy, model], [t_plot, t_table, status], api_name="sweep", concurrency_limit=1, concurrency_id="gen")
    return demo
