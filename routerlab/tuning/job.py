"""One training from the Train tab: data -> routers (the CLI's own loop) -> calibrated, compared, saved set.

A `TrainJob` runs in a worker thread (`runner.py` runs one at a time per server) and keeps a snapshot
of its progress that the page polls: the phase, each step's logged row (losses, skip share, each routed
layer's skip share), held-out checkpoints (skip share and KL to the full model on the held-out slice, a
few times during training), and at the end the comparison on that slice with the shipped set of the same
granularity and with random skipping at the same share. The time budget covers the whole job: prompts without
answers are answered first in at most ANSWER_SHARE of it (each cut to what training reads, the held-out slice's
share first; what is answered by then is trained on, too few ends the job with a message), training gets what is
left after a reserve for the evaluations, measured from the first full-depth pass. `stop()` ends answering at the
next token, training at its next example (the step in flight is dropped; what the whole steps learned is kept) and
the calibration and comparison at their next held-out example: a set stopped in any phase after its first step is
saved as it is, uncalibrated (0.5 = the training gate) and not compared, and the message says so. `abandon()` (the
visitor's tab closed) also skips the saving, and deletes the job's folder. `wait()` waits for the end.

The finished set is written like any checkpoint (checkpoint.save_routers) into the job's folder; its
calibration puts 0.5 at the training gate (what it was trained to skip) and 0.7 at 4x that skip share,
as `calibrate` does for the shipped sets. Knows nothing about Gradio.
"""

from __future__ import annotations

import math
import shutil
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

from routerlab.core.base.config import GRANULARITIES, RoutingConfig, default_layers
from routerlab.core.base.errors import RouterLabError

PHASES = ("queued", "data", "answering", "training", "evaluating", "done", "stopped", "failed", "cancelled")
FINAL = ("done", "stopped", "failed", "cancelled")
EVAL_PASSES = 10  # the end's calibration and comparison cost up to this many full-depth passes over the held-out slice
ANSWER_SHARE = 0.4  # the most of the time budget the full model spends answering prompts that came without answers
# The first step reads this many examples, not a whole batch: the page's curves get their first point within seconds of
# Start (a whole first step, the slowest of all, left them empty for most of the first minute on busy cores).
FIRST_STEP_EXAMPLES = 2
ANSWER_BATCH = 8  # prompts answered together: one batch of `generate`, in the order _answer chose (held-out ones in each)


class _Stopped(Exception):
    """Stop (or a closed tab) before there was anything to keep."""


class _Watched(list):
    """Examples whose walk checks Stop per example. For train_routers: its probe fit (router_init) walks them at full
    depth before the first step without checking Stop, so walking them checks it while no step has been taken yet
    (`started`). For the held-out checkpoints, the calibration and the comparison: always (`started` None)."""

    def __init__(self, examples, check, started=None):
        super().__init__(examples)
        self._check, self._started = check, started

    def __iter__(self):
        for example in super().__iter__():
            if self._started is None or not self._started():
                self._check()
            yield example


@dataclass(frozen=True)
class JobSettings:
    """What a visitor chose (validated): what to route, how much to skip, how long, and the advanced knobs."""

    granularity: str = "attention-token"
    skip: float = 0.15  # share of routed cells the budget term aims to skip (TrainConfig.target = 1 - skip)
    minutes: float = 3.0  # the whole job: data, training, evaluation
    lr: float = 1e-2  # above the command line's 3e-3: a 3-minute run has ~45 steps (docs/experiments.md, "Three minutes")
    kd_weight: float = 1.0
    lm_weight: float = 0.0  # distillation alone: lower KL to the full model in 3 minutes than with the LM loss (docs/experiments.md)
    max_steps: int = 400
    batch_size: int = 4
    max_tokens: int = 256
    heldout: int = 12  # held-out examples evaluated (the slice is never trained on)
    checkpoints: int = 2  # held-out evaluations during training (plus the final one)
    decay: str = "constant"  # learning rate after warmup (TrainConfig.decay)
    answer_tokens: int = 96  # longest answer the full model writes for a prompt without one
    seed: int = 0
    init: str = "probe"  # where the routers start (TrainConfig.init): a fit of update sizes beat zeros in 3 minutes (docs/experiments.md)

    def __post_init__(self):
        for name, value in (("Skip target", self.skip), ("Time budget", self.minutes), ("Learning rate", self.lr),
                            ("Distillation weight", self.kd_weight), ("LM-loss weight", self.lm_weight), ("Steps", self.max_steps)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise RouterLabError(f"{name} must be a finite number, not {str(value)[:40]!r}.",
                                     "Leave the default, or type an ordinary number.")
        if self.granularity not in GRANULARITIES:
            raise RouterLabError(f"Unknown granularity {self.granularity!r}.", f"Choose one of: {', '.join(GRANULARITIES)}.")
        if not 0.01 <= self.skip <= 0.9:
            raise RouterLabError(f"Skip target {self.skip:.0%} is outside 1%-90%.", "Choose a share of routed cells, e.g. 15%.")
        if not 0.25 <= self.minutes <= 60:
            raise RouterLabError(f"Time budget {self.minutes} min is outside 0.25-60.", "Choose a few minutes, e.g. 3.")
        if not 1e-5 <= self.lr <= 1.0:
            raise RouterLabError(f"Learning rate {self.lr} is outside 1e-5..1.", "The shipped sets used 3e-3.")
        if min(self.kd_weight, self.lm_weight) < 0 or self.kd_weight + self.lm_weight == 0:
            raise RouterLabError("The loss weights must be >= 0 and not both 0.",
                                 "The default is distillation 1, LM loss 0; to train without distillation, give the LM loss a weight.")
        if not 1 <= self.max_steps <= 10_000:
            raise RouterLabError(f"Steps {self.max_steps} is outside 1-10,000.", "The time budget usually decides; 400 is a cap.")

    @property
    def label(self) -> str:
        return f"mine: {self.granularity}, {self.minutes:g} min"


def routed_layers(granularity: str, n_layers: int, shipped: dict | None) -> tuple[int, ...]:
    """The shipped set's layers for this granularity when there is one (same model), else the default layers."""
    if shipped and shipped.get("base_model", {}).get("n_layers") == n_layers:
        return tuple(shipped["layers"])
    return default_layers(n_layers)


class TrainJob:
    """One visitor's training. Thread-safe `snapshot()`; `run()` is called once, in a worker thread."""

    def __init__(self, model, tokenizer, settings: JobSettings, folder: Path, data=None, shipped: Path | None = None,
                 owner: str = ""):
        self.model, self.tokenizer, self.settings, self.folder = model, tokenizer, settings, Path(folder)
        self.data, self.shipped, self.owner = data, shipped, owner  # data: user_data.UserData, or None (built-in)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._abandoned = threading.Event()
        self._over = threading.Event()  # the job has ended (any final phase)
        self._then = None  # what abandon() asked to run once the job has ended
        self._watchers: list = []  # watch(): called with each state change, in the job's thread
        self._notes: list[str] = []  # what the data phase left out or cut, said again in the final message
        self._state = {"phase": "queued", "message": "Waiting for its turn.", "rows": [], "checkpoints": [], "layers": [],
                       "steps_planned": None, "weights": {}, "started": None, "elapsed": 0.0, "answered": 0, "to_answer": 0,
                       "answer_until": None, "trainable": None, "result": None, "error": None, "example": None}
        self.routers = None

    # -- what the page reads -------------------------------------------------------------------
    def snapshot(self) -> dict:
        with self._lock:
            s = dict(self._state, rows=list(self._state["rows"]), checkpoints=list(self._state["checkpoints"]))
        if s["started"] is not None and s["phase"] not in FINAL:
            s["elapsed"] = time.perf_counter() - s["started"]
        return s

    def watch(self, fn) -> None:
        """Call `fn(changes)` (a dict of the state keys that changed, e.g. phase, rows) after each change of the state,
        in the job's own thread: e.g. a test landing Stop in a given phase."""
        self._watchers.append(fn)

    def _set(self, **changes) -> None:
        with self._lock:
            self._state.update(changes)
        for fn in list(self._watchers):
            fn(changes)

    @property
    def phase(self) -> str:
        return self._state["phase"]

    def stop(self) -> None:
        """End answering at the next token, training at the next step (what was learned is kept), or cancel a job still waiting."""
        self._stop.set()
        with self._lock:
            if self._state["phase"] == "queued":
                self._state.update(phase="cancelled", message="Cancelled before it started.")
                self._over.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` seconds for the job to end (or be cancelled); whether it has."""
        return self._over.wait(timeout)

    def abandon(self, then=None) -> None:
        """Nobody will read the result (the visitor's tab closed): stop as `stop()` does, skip the evaluation and the
        saving, delete the job's folder, then call `then()` (also at once when the job is not running)."""
        self._then = then
        self._abandoned.set()
        self.stop()
        if self.phase in ("queued", *FINAL):
            self._ended()

    def _ended(self) -> None:
        if self._abandoned.is_set():
            shutil.rmtree(self.folder, ignore_errors=True)
            if self._then is not None:
                self._then()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # -- the work --------------------------------------------------------------------------------
    def run(self) -> None:
        if self.stopping:
            self._set(phase="cancelled", message="Cancelled before it started.")
            self._over.set()
            return
        self._set(phase="data", message="Reading the data; the full model scores the held-out slice …", started=time.perf_counter())
        try:
            self._run()
        except _Stopped:
            self._set(phase="stopped", message=f"Stopped while {self._state['phase'] if self._state['phase'] != 'data' else 'reading the data'}"
                      ": nothing was trained yet.")
        except RouterLabError as err:
            self._set(phase="failed", message=self._plain(str(err)), error=self._plain(str(err)))
        except Exception as err:  # reported to the visitor; the server keeps going
            traceback.print_exc()
            self._set(phase="failed", message=self._plain(f"Training failed: {type(err).__name__}: {err}"), error=self._plain(repr(err)))
        finally:
            with self._lock:
                if self._state["started"] is not None:
                    self._state["elapsed"] = time.perf_counter() - self._state["started"]
            self._ended()
            self._over.set()

    def _plain(self, text: str) -> str:
        """`text` without the server's folders (a visitor sees file names only)."""
        return text.replace(f"{self.folder.parent}/", "").replace(str(self.folder.parent), "the job's folder")

    def _check(self) -> None:
        """Between the pieces of work that do not check the stop flag themselves."""
        if self.stopping:
            raise _Stopped()

    def _remaining(self) -> float:
        return self.settings.minutes * 60 - (time.perf_counter() - self._state["started"])

    def _run(self) -> None:
        from routerlab.core.model.anatomy import Anatomy
        from routerlab.tuning.checkpoint import read_config
        from routerlab.tuning.data import encode_all
        from routerlab.tuning.evaluate import full_depth
        from routerlab.tuning.train import PLAN_STEPS, TrainConfig, train_routers

        st, tok = self.settings, self.tokenizer
        train_records, heldout_records = self._records()
        self._check()
        train = encode_all(train_records, tok, st.max_tokens)
        heldout = encode_all(heldout_records, tok, st.max_tokens)[: st.heldout]
        self._check()
        anatomy = Anatomy(self.model)
        shipped_config = read_config(self.shipped) if self.shipped else None
        layers = routed_layers(st.granularity, anatomy.n_layers, shipped_config)
        t0, full = time.perf_counter(), []
        for example in heldout:  # one at a time, as full_depth does: Stop is checked between them
            self._check()
            full += full_depth(anatomy, [example])
        one_pass = time.perf_counter() - t0
        self._check()
        cfg = TrainConfig(granularity=st.granularity, layers=layers, steps=st.max_steps, batch_size=st.batch_size, lr=st.lr,
                          lm_weight=st.lm_weight, kd_weight=st.kd_weight, target=1.0 - st.skip, ramp=0.4, warmup=0.1, decay=st.decay,
                          max_tokens=st.max_tokens, seed=st.seed, init=st.init)
        n_params = sum(p.numel() for p in self.model.parameters())
        routed = RoutingConfig.from_granularity(st.granularity, layers)
        trainable = len(routed.layers) * anatomy.hidden_size
        reserve = one_pass * (EVAL_PASSES + st.checkpoints)  # the checkpoints, then the calibration and the comparison
        budget = max(5.0, self._remaining() - reserve)
        self._set(phase="training", layers=list(layers), trainable={"routers": trainable, "model": n_params},
                  weights={"kd": st.kd_weight, "lm": st.lm_weight},
                  message=f"Training {len(layers)} routers on {len(train)} examples ({len(heldout)} held out) …")
        marks: set[int] = set()

        def on_step(row, routers):
            self._set(rows=self._state["rows"] + [row], steps_planned=row["steps_planned"])
            if row["step"] <= PLAN_STEPS:  # the number of steps is still being planned
                return
            planned = row["steps_planned"]
            due = {max(PLAN_STEPS + 1, round(planned * (k + 1) / (st.checkpoints + 1))) for k in range(st.checkpoints)}
            if row["step"] in due and row["step"] not in marks and not self.stopping:
                marks.add(row["step"])
                self._checkpoint(anatomy, routers, heldout, full, row["step"])

        watched = _Watched(train, self._check, lambda: bool(self._state["rows"]))
        def on_example(step, example, batch):
            with self._lock:  # read by the page's progress line (snapshot), no watcher call: several a second
                self._state["example"] = (step, example, batch)

        result = train_routers(self.model, watched, cfg, progress=False, seconds=budget, on_step=on_step,
                               should_stop=self._stop.is_set, data_name=self._data_name(), on_example=on_example,
                               first_examples=FIRST_STEP_EXAMPLES)
        if self._abandoned.is_set():
            raise _Stopped()
        self.routers = result.routers
        if self.stopping:  # stopped during the steps: kept as it is, without the evaluation's seconds
            self._keep(result)
            return
        self._finish(anatomy, result, heldout, full)

    def _records(self):
        from routerlab.tuning.data import DEFAULT, load_records

        if self.data is None:
            return load_records(DEFAULT, "train"), load_records(DEFAULT, "heldout")
        train, heldout = list(self.data.train), list(self.data.heldout)
        if self.data.to_answer:
            self._answer(train, heldout)
        return [r for r in train if r.response], [r for r in heldout if r.response]

    def _answer(self, train: list, heldout: list) -> None:
        """The full model writes the missing responses (in place), within ANSWER_SHARE of the budget.

        Each prompt is cut to what training reads (max_tokens, less room for the answer). Held-out prompts beyond the
        slice's size are not answered (never used); the others go one held-out to four training prompts, so that a
        budget that runs out still leaves both. Too few answered: a RouterLabError that says so."""
        from dataclasses import replace

        from routerlab.tuning.data import answer_prompts, cut_prompt
        from routerlab.tuning.user_data import MIN_EXAMPLES

        st, tok = self.settings, self.tokenizer
        window = min(st.max_tokens, int(getattr(getattr(self.model, "config", None), "max_position_embeddings", None) or st.max_tokens))
        answer_tokens = min(st.answer_tokens, window // 2)
        limit = window - answer_tokens  # prompt + answer fit what training reads
        need = max(0, st.heldout - sum(1 for r in heldout if r.response))
        todo_h = [("h", k) for k, r in enumerate(heldout) if not r.response][:need]
        todo_t = [("t", k) for k, r in enumerate(train) if not r.response]
        order = []
        while todo_h or todo_t:
            order += todo_h[:1] + todo_t[:4]
            todo_h, todo_t = todo_h[1:], todo_t[4:]
        prompts, cut, dropped = [], 0, 0
        for n, (side, k) in enumerate(order):
            if n % 32 == 0:
                self._check()
            record = (heldout if side == "h" else train)[k]
            fitted = cut_prompt(record.messages, tok, limit)
            if fitted is None:
                dropped += 1
                continue
            cut += fitted[1]
            prompts.append((side, k, fitted[0]))
        if cut:
            self._notes.append(f"{cut} prompt{'s' if cut != 1 else ''} longer than {limit} tokens {'were' if cut != 1 else 'was'} cut to fit.")
        if dropped:
            self._notes.append(f"{dropped} prompt{'s' if dropped != 1 else ''} could not be cut to {limit} tokens and {'were' if dropped != 1 else 'was'} left out.")
        share = ANSWER_SHARE * st.minutes * 60
        deadline = self._state["started"] + share
        self._set(phase="answering", to_answer=len(prompts), answer_until=share,
                  message=f"The full model answers up to {len(prompts)} prompts first (at most {share:.0f} s of the budget) …")
        should_stop = lambda: self.stopping or time.perf_counter() >= deadline  # noqa: E731
        answered = 0
        for c in range(0, len(prompts), ANSWER_BATCH):
            chunk = prompts[c : c + ANSWER_BATCH]
            for k, answer, _, _ in answer_prompts(self.model, tok, [list(m) for _, _, m in chunk], max_new_tokens=answer_tokens,
                                                  batch_size=ANSWER_BATCH, should_stop=should_stop):
                side, i, messages = chunk[k]
                records = heldout if side == "h" else train
                if answer:
                    records[i] = replace(records[i], messages=messages, response=answer)
                    answered += 1
                self._set(answered=answered)
            if should_stop():
                break
        self._check()
        got_t, got_h = sum(1 for r in train if r.response), sum(1 for r in heldout if r.response)
        late = answered < len(prompts) and time.perf_counter() >= deadline
        said = (f"The full model answered {answered} of your {self.data.to_answer} prompts"
                + (f" in the {share:.0f} s of the time budget set aside for answering" if late else ""))
        if got_t < MIN_EXAMPLES - 1 or got_h < 1:
            raise RouterLabError(
                f"{said}: {got_t} to train on and {got_h} held out, too few (training needs at least {MIN_EXAMPLES - 1} and 1).",
                "Choose a longer time budget, give fewer or shorter prompts, or give them with their answers "
                "(JSONL with \"output\", or an assistant turn).")
        if late:
            self._notes.append(f"{said}; the rest were left out.")

    def _data_name(self) -> str:
        return "built-in self-distilled prompts" if self.data is None else self.data.describe()

    def _checkpoint(self, anatomy, routers, heldout, full, step: int) -> None:
        from routerlab.tuning.evaluate import evaluate_examples

        try:  # the training gate, raw scores; Stop skips the point (training ends at its next check)
            r = evaluate_examples(anatomy, _Watched(heldout, self._check), routers, 0.5, "kv", full)
        except _Stopped:
            return
        point = {"step": step, "skip_rate": round(r["skip_rate"], 4), "kl_full": round(r["kl_full"], 5),
                 "perplexity_increase": round(r["perplexity_increase"], 5)}
        self._set(checkpoints=self._state["checkpoints"] + [point])

    def _finish(self, anatomy, result, heldout, full) -> None:
        from routerlab.core.routing.router import IDENTITY
        from routerlab.tuning.calibrate import DEFAULT, fit_calibration
        from routerlab.tuning.checkpoint import save_routers
        from routerlab.tuning.evaluate import response_scores

        st, routers = self.settings, result.routers
        stopped = result.report.get("stopped", False)
        self._set(phase="evaluating", message="Calibrating on the held-out slice and comparing …")
        fit = None
        watched = _Watched(heldout, self._check)  # Stop ends the calibration and the comparison at the next example
        try:
            try:
                fit = fit_calibration(response_scores(anatomy, routers, watched), 0.5)
                routers.calibration = fit.calibration
            except RouterLabError:
                pass  # scores too concentrated (e.g. stopped at once): the raw scale stays, 0.5 is still the training gate
            if self._abandoned.is_set():  # the tab closed: nobody will read the comparison
                raise _Stopped()
            rows = compare(anatomy, watched, routers, self.model, self.shipped, st.seed, full)
        except _Stopped:
            if self._abandoned.is_set():
                raise
            routers.calibration = IDENTITY  # stopped while calibrating or comparing: kept as it is
            self._keep(result)
            return
        mine = rows["mine at 0.5"]
        report = dict(result.report, settings=asdict(st), heldout={"examples": len(heldout), "rows": rows},
                      checkpoints=self._state["checkpoints"], label=st.label)
        info = {"rule": "0.5 = the training gate (what the set was trained to skip); 0.7 = 4x its skip share, on the held-out slice",
                "raw_default": 0.5} if fit is not None else None
        summary = {k: report[k] for k in ("data", "examples", "steps", "seconds", "stopped", "config")}
        if self._abandoned.is_set():  # the tab closed while it was evaluated: nobody will load or download it
            raise _Stopped()
        save_routers(routers, self.folder, self.model, threshold=DEFAULT if fit else 0.5, kv_policy="kv", summary=summary,
                     calibration_info=info)
        from routerlab.tuning.bundle import write_extras

        write_extras(self.folder, report, result.log, self.model_name())
        phase = "stopped" if stopped else "done"
        notes = "".join(f" {n}" for n in self._notes)
        self._set(phase=phase, result=report, message=("Stopped: the routers as they were are kept. " if stopped else "Done. ")
                  + f"At 0.5 it skips {mine['skip_rate']:.1%} of routed cells on the held-out slice, perplexity {mine['perplexity_increase']:+.1%}."
                  + notes)

    def _keep(self, result) -> None:
        """Stop came after the first step: save the routers as they are, uncalibrated (0.5 = the training gate) and not
        compared on the held-out slice, and say so. The saving and its files take well under a second."""
        from routerlab.tuning.bundle import write_extras
        from routerlab.tuning.checkpoint import save_routers

        st = self.settings
        report = dict(result.report, stopped=True, calibrated=False, settings=asdict(st), checkpoints=self._state["checkpoints"],
                      label=st.label)
        summary = {k: report[k] for k in ("data", "examples", "steps", "seconds", "stopped", "config")}
        save_routers(result.routers, self.folder, self.model, threshold=0.5, kv_policy="kv", summary=summary)
        write_extras(self.folder, report, result.log, self.model_name())
        notes = "".join(f" {n}" for n in self._notes)
        self._set(phase="stopped", result=report,
                  message=f"Stopped at step {report['steps']}: the routers are kept as they were, uncalibrated (0.5 is the "
                          "training gate, not a calibrated default) and not compared on the held-out slice." + notes)

    def model_name(self) -> str:
        from routerlab.core.model.models import model_identity

        return str(model_identity(self.model).get("name", "model"))


def compare(anatomy, examples, routers, model, shipped: Path | None, seed: int = 0, full=None) -> dict[str, dict]:
    """On `examples`: a calibrated set at 0.5; the shipped set of its granularity at its default (when it loads on this
    model) and this set skipping at least as much; random skipping at this set's share. {name: threshold, skip shares, perplexity rise, KL, agreement}."""
    from routerlab.tuning.calibrate import DEFAULT
    from routerlab.tuning.checkpoint import load_routers
    from routerlab.tuning.evaluate import baseline_set, evaluate_examples, full_depth

    keys = ("skip_rate", "skip_rate_all_layers", "perplexity_increase", "kl_full", "agreement")
    pick = lambda r, t: {"threshold": round(float(t), 4), **{k: round(r[k], 5) for k in keys}}  # noqa: E731
    full = full if full is not None else full_depth(anatomy, examples)
    mine = evaluate_examples(anatomy, examples, routers, DEFAULT, "kv", full)
    rows = {"mine at 0.5": pick(mine, DEFAULT)}
    try:
        theirs, config = load_routers(shipped, model) if shipped is not None else (None, None)
    except RouterLabError:  # the shipped sets are for the embedded model; another base has nothing to compare with
        theirs = None
    if theirs is not None:
        s = evaluate_examples(anatomy, examples, theirs, float(config["threshold"]), config["kv_policy"], full)
        rows["shipped at its default"] = pick(s, config["threshold"])
        if s["skip_rate"] > 0:
            rows["mine at the shipped share"] = pick(*_at_share(anatomy, examples, routers, s["skip_rate"], full))
    rand, p, _ = baseline_set("random", anatomy, examples, routers.granularity, mine["skip_rate_all_layers"], routers.config.layers, seed)
    rows["random at my share"] = pick(evaluate_examples(anatomy, examples, rand, p, "kv", full), p)
    return rows


def _at_share(anatomy, examples, routers, share: float, full, tries: int = 4):
    """(result, threshold) of `routers` skipping at least `share` of their routed cells, as close as `tries` evaluations get.

    The first threshold is the quantile of the full-depth scores; a routed run skips a little less or more than that
    (skipping moves later layers' inputs), so the quantile is corrected by the realised share and tried again (1% past
    it after a try that fell short, so that a near miss is not repeated)."""
    from routerlab.tuning.evaluate import evaluate_examples, response_scores, score_quantile

    scores = response_scores(anatomy, routers, examples)
    q, best = share, None
    for _ in range(tries):
        t = score_quantile(scores, min(0.99, q))
        r = evaluate_examples(anatomy, examples, routers, t, "kv", full)
        if r["skip_rate"] >= share and (best is None or r["skip_rate"] < best[0]["skip_rate"]):
            best = (r, t)
        if share <= r["skip_rate"] <= share * 1.03:
            break
        q *= share / max(r["skip_rate"], 1e-6) * (1.01 if r["skip_rate"] < share else 1.0)
    return best if best is not None else (r, t)
