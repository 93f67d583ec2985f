"""Router-Tuning: train only the routers (and their skip stand-ins, if any) of a frozen base model, on accelerate.

One step: for each example, the teacher (same model, no routers, no_grad) gives the full-depth
logits; the student runs the engine's training forward (`Plan(ste=True)`: every sub-layer runs,
its update is multiplied by the hard 0/1 gate with a straight-through gradient to the router,
which is the `mask` semantics and therefore the `kv` numbers). Loss on the response tokens:

    lm_weight * CE(student, data)  +  kd_weight * KL(teacher || student)
    + budget_weight * relu(executed fraction - target)

With stand-ins (`adapters` = their rank) a skipped cell adds its stand-in's update instead of
nothing: the layer computes g * sublayer(x) + (1 - g) * standin(x), the same hard gate, the same
straight-through gradient, now reaching the stand-ins too; they learn with their own learning rate.

The executed fraction is the mean hard gate over routed (token, layer) cells; its gradient flows
through the scores (STE). The target ramps from 1.0 down to `target` over the first `ramp`
fraction of steps, so routers first learn which cells matter, then learn to give them up.

The same command runs on one CPU, one GPU or several processes (`accelerate launch`): data is
sharded by accelerate, router gradients are averaged across processes by hand (the routers are
not called as one module, so DDP's forward hooks do not apply; they are 17k numbers).

Knows nothing about the UI; data comes from data.py, checkpoints go through checkpoint.py.
"""

from __future__ import annotations

import json
import os
import math
import random
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch.nn import functional as F

from routerlab.core.base.config import DECAYS, RoutingConfig, check_threshold, default_layers
from routerlab.core.base.errors import RouterLabError
from routerlab.core.routing.router import RouterSet
from routerlab.tuning.forward import student_forward, teacher_logits

KV_POLICY = "kv"  # training's hard gate has mask semantics == kv numbers; inference defaults to it
INITS = ("zeros", "probe")  # where routers start: zero (the paper), or fitted to their sub-layers' update sizes (router_init.py)


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Validated on construction."""

    granularity: str = "attention-token"
    layers: tuple[int, ...] | None = None  # None: config.default_layers(n_layers)
    steps: int = 300
    batch_size: int = 4  # examples per optimizer step (per process)
    lr: float = 3e-3
    lm_weight: float = 0.0
    kd_weight: float = 1.0
    target: float = 0.75  # executed fraction the budget term aims for
    budget_weight: float = 1.0
    ramp: float = 0.3  # fraction of steps over which the target ramps down from 1.0
    warmup: float = 0.1  # fraction of steps over which the learning rate ramps up from 0
    decay: str = "constant"  # after warmup: "constant", or "cosine" down to 0 at the last step
    max_tokens: int = 384
    seed: int = 0
    threshold: float = 0.5  # gate used while training (the shipped threshold is calibrated later)
    adapters: int = 0  # rank of a skip stand-in per routed layer (0: plain skipping, Router-Tuning)
    adapter_lr: float = 3e-3
    adapter_fit: int = 0  # Adam steps fitting each stand-in to its sub-layer's update first (standin_fit.py); 0: none
    init: str = "zeros"  # routers start at zero (the paper), or "probe": fitted to their sub-layers' update sizes (router_init.py)

    def __post_init__(self):
        RoutingConfig.from_granularity(self.granularity)
        check_threshold(self.threshold)
        for name in ("steps", "batch_size", "max_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise RouterLabError(f"{name}={getattr(self, name)!r} must be a whole number >= 1.")
        if not 0.0 < self.target <= 1.0:
            raise RouterLabError(f"target={self.target!r} is outside (0, 1].", "It is the executed fraction, e.g. 0.8.")
        for name in ("ramp", "warmup"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise RouterLabError(f"{name}={getattr(self, name)!r} is outside [0, 1].")
        if self.decay not in DECAYS:
            raise RouterLabError(f"decay={self.decay!r} is not known.", f"Choose one of: {', '.join(DECAYS)}.")
        if isinstance(self.adapter_fit, bool) or not isinstance(self.adapter_fit, int) or self.adapter_fit < 0:
            raise RouterLabError(f"adapter_fit={self.adapter_fit!r} must be a whole number >= 0.", "It is a number of fit steps, e.g. 200.")
        if self.adapter_fit and not self.adapters:
            raise RouterLabError("adapter_fit needs stand-ins.", "Pass --adapters RANK too, or leave --adapter-fit out.")
        if isinstance(self.adapters, bool) or not isinstance(self.adapters, int) or self.adapters < 0:
            raise RouterLabError(f"adapters={self.adapters!r} must be a whole number >= 0.", "It is the stand-ins' rank, e.g. 32 (0: none).")
        if not self.lr > 0 or not self.adapter_lr > 0 or min(self.lm_weight, self.kd_weight, self.budget_weight) < 0:
            raise RouterLabError("lr must be > 0 and loss weights >= 0.")
        if self.init not in INITS:
            raise RouterLabError(f"init={self.init!r} is not known.", f"Choose one of: {', '.join(INITS)}.")
        if self.lm_weight == 0 and self.kd_weight == 0:
            raise RouterLabError("Both the LM and the distillation weights are 0: nothing to learn from.")

    def target_at(self, step: int) -> float:
        """Executed-fraction target at `step` (0-based): 1.0 ramping linearly to `target`."""
        ramp_steps = self.ramp * self.steps
        if ramp_steps <= 0 or step >= ramp_steps:
            return self.target
        return 1.0 - (1.0 - self.target) * step / ramp_steps

    def lr_at(self, step: int) -> float:
        """Learning rate at `step` (0-based): linear warmup, then constant or a cosine decay.

        Adam's first updates are sign-like (full size, whatever the gradient's size); the warmup
        keeps them small while its moment estimates settle. (Zero-initialised routers sit exactly
        on the 0.5 gate, so the very first update still flips many cells, whatever its size; see
        `--gate`.) With batches of a few examples the gradient is noisy: a decay to 0 lets the
        routers settle instead of ending wherever the last noisy steps left them.
        """
        warm = self.warmup * self.steps
        if warm >= 1 and step + 1 < warm:
            return self.lr * (step + 1) / warm
        if self.decay == "cosine":
            begin = max(0.0, warm - 1)
            frac = (step - begin) / max(1.0, self.steps - begin)  # 0 at the peak, near 1 at the last step
            return self.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, max(0.0, frac))))
        return self.lr


# -- one example's losses ----------------------------------------------------------------------
def gate_values(plan, scores: torch.Tensor, routers: RouterSet, start: int) -> torch.Tensor:
    """STE gates (value: hard 0/1, gradient: through the scores) of the response cells, flat."""
    if plan.level == "sequence":
        return torch.stack([float(run) + s - s.detach() for s, run in (plan.sequence[i] for i in routers.config.layers)])
    raise AssertionError("token level gates are rebuilt from the routers")  # pragma: no cover


def example_losses(anatomy, routers: RouterSet, ids: torch.Tensor, start: int, cfg: TrainConfig, target: float,
                   teacher_logits: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Losses of one example (1, T) whose response starts at `start`. Differentiable w.r.t. routers."""
    from routerlab.core.routing.gates import Plan

    plan = Plan(routers, cfg.threshold, KV_POLICY, ste=True)
    gates: list[torch.Tensor] = []
    if plan.level == "token":
        # Collect the STE gates the engine builds: wrap each router to record its scores.
        logits, scores = _forward_recording(anatomy, routers, ids, start, plan, gates)
        exec_frac = torch.cat([g[start:] for g in gates]).mean()
    else:
        logits, scores = student_forward(anatomy, ids, start, plan)
        exec_frac = gate_values(plan, scores, routers, start).mean()
    logits = logits[0].float()  # (R, V) predictions of the response tokens
    labels = ids[0, start:]
    out = {"exec": exec_frac}
    total = torch.zeros((), device=ids.device)
    logp = F.log_softmax(logits, dim=-1)  # (R, V), shared by both losses
    out["lm"] = F.nll_loss(logp, labels)  # logged even at weight 0: the curve shows how the data's tokens fare
    if cfg.lm_weight > 0:
        total = total + cfg.lm_weight * out["lm"]
    if cfg.kd_weight > 0 and teacher_logits is not None:
        t = F.log_softmax(teacher_logits.float(), dim=-1)
        out["kd"] = F.kl_div(logp, t, log_target=True, reduction="batchmean")
        total = total + cfg.kd_weight * out["kd"]
    out["budget"] = torch.relu(exec_frac - target)
    out["loss"] = total + cfg.budget_weight * out["budget"]
    out["skip"] = 1.0 - exec_frac.detach()
    out["layer_exec"] = torch.stack([g[start:].detach().mean() for g in gates]) if gates else \
        torch.stack([float(plan.sequence[i][1]) * torch.ones((), device=ids.device) for i in routers.config.layers])
    return out


class _Recorder(torch.nn.Module):
    """A router stand-in that returns the real router's scores and keeps the STE gate it implies."""

    def __init__(self, router, threshold: float, sink: list):
        super().__init__()
        self.router, self.threshold, self.sink = router, threshold, sink

    def logits(self, x):
        return self.router.logits(x)

    def forward(self, x):
        s = self.router(x)  # (1, T)
        self.sink.append((s[0] >= self.threshold).to(s.dtype) + s[0] - s[0].detach())  # the engine's own gate
        return s


class _RecordingSet:
    """Duck-typed RouterSet whose routers record their gates (per call, never stored on modules)."""

    def __init__(self, routers: RouterSet, threshold: float, sink: list):
        self.config = routers.config
        self.n_layers, self.hidden_size = routers.n_layers, routers.hidden_size
        self.standin_rank = routers.standin_rank  # torch's layer adds a skipped cell's stand-in where this is > 0
        self._r = {i: _Recorder(routers.get(i), threshold, sink) for i in routers.config.layers}
        self._standins = routers

    def get(self, layer: int):
        return self._r.get(layer)

    def standin(self, layer: int):
        return self._standins.standin(layer)

    @property
    def granularity(self):
        return self.config.granularity


def _forward_recording(anatomy, routers, ids, start, plan, sink):
    from routerlab.core.routing.gates import Plan

    rec = Plan(_RecordingSet(routers, plan.threshold, sink), plan.threshold, plan.policy, ste=True)
    return student_forward(anatomy, ids, start, rec)


# -- the loop ----------------------------------------------------------------------------------
@dataclass
class TrainResult:
    routers: RouterSet
    report: dict
    log: list[dict] = field(default_factory=list)


def router_parameters_only(model: torch.nn.Module, routers: RouterSet, optimizer: torch.optim.Optimizer) -> None:
    """Assert that the optimizer holds exactly the router (and stand-in) parameters and the base is frozen."""
    opt = {id(p) for g in optimizer.param_groups for p in g["params"]}
    mine = {id(p) for p in routers.parameters()}
    base = {id(p) for p in model.parameters()}
    assert opt == mine, "the optimizer must hold exactly the router and stand-in parameters"
    assert not (opt & base), "a base parameter is in the optimizer"
    assert not any(p.requires_grad for p in model.parameters()), "the base model must be frozen"


def planned_steps(cap: int, done: int, step_seconds: float, seconds: float | None) -> int:
    """How many steps fit a time budget of `seconds`, `done` steps in at `step_seconds` each: at least one more
    than `done`, never more than `cap`."""
    if seconds is None or step_seconds <= 0:
        return cap
    return min(cap, max(done + 1, int(seconds / step_seconds)))


PLAN_STEPS = 4  # a time budget is turned into a number of steps from the first steps' mean time; then it is fixed


def train_routers(model: torch.nn.Module, examples: list, cfg: TrainConfig, *, accelerator=None,
                  log_path: str | Path | None = None, progress: bool = True, data_name: str = "",
                  seconds: float | None = None, on_step=None, should_stop=None, on_example=None,
                  first_examples: int | None = None) -> TrainResult:
    """Train fresh routers for `model` on tokenized `examples` (data.Example). Returns routers + report.

    `seconds`: a time budget. `cfg.steps` is then a cap: after each of the first PLAN_STEPS steps the number of
    steps is set to what the budget allows at their mean time (the target ramp and learning-rate schedule follow
    the new count), and the loop also ends when the budget is spent (time spent in `on_step` counts).
    `on_step(row, routers)`: called after every optimizer step with the logged row (plus `layer_skip`, each routed
    layer's skip share in that step, and `steps_planned`) and the routers being trained. `should_stop()`: checked before every step
    and between its examples; True ends training with the routers as the last whole step left them (a step in flight is
    dropped, report["stopped"]). `on_example(step, example, batch)`: after each example of a step (1-based), so a
    watcher can say where a long step is (the first is the longest, more so on busy cores). `first_examples`: the first
    step reads only that many examples (its gradient their mean), so a watcher's curves start within seconds; a time
    budget is then planned from the time per example, the same whatever the first step's size.
    """
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm

    from routerlab.core.model.anatomy import Anatomy

    accelerator = accelerator or Accelerator(cpu=not torch.cuda.is_available())
    set_seed(cfg.seed)
    model.requires_grad_(False)
    model.eval()
    model.to(accelerator.device)
    anatomy = Anatomy(model)
    n = anatomy.n_layers
    layers = tuple(cfg.layers) if cfg.layers is not None else default_layers(n)
    routers = RouterSet(RoutingConfig.from_granularity(cfg.granularity, layers), n, anatomy.hidden_size,
                        standin_rank=cfg.adapters).to(accelerator.device)
    groups = [{"params": list(routers.routers.parameters()), "lr": cfg.lr, "scale": 1.0}]
    if cfg.adapters:
        groups.append({"params": list(routers.standins.parameters()), "lr": cfg.adapter_lr, "scale": cfg.adapter_lr / cfg.lr})
    optimizer = torch.optim.Adam(groups, lr=cfg.lr)
    router_parameters_only(model, routers, optimizer)
    if not examples:
        raise RouterLabError("No training examples.", "Check the data file.")

    probe = None
    if cfg.init == "probe":  # a head start: each router fitted to its sub-layer's update sizes at full depth
        from routerlab.tuning.head_start.router_init import probe_init

        probe = probe_init(anatomy, routers, examples, skip=1.0 - cfg.target)
        if seconds is not None:  # the fit is part of training: it comes out of the time budget
            seconds = max(1.0, seconds - probe["seconds"])
        if progress and accelerator.is_local_main_process:
            print(f"probe init: {probe['tokens']} tokens, {probe['seconds']} s", flush=True)
    fit = None
    if cfg.adapter_fit:  # a head start: each stand-in fitted to its sub-layer's update at full depth
        from routerlab.tuning.head_start.standin_fit import fit_standins

        fit = fit_standins(anatomy, routers, examples, steps=cfg.adapter_fit,
                           log=lambda m: progress and accelerator.is_local_main_process and print(m, flush=True))
    # Shard the examples across processes (each process sees a disjoint, shuffled slice).
    order = list(range(len(examples)))
    rank, world = accelerator.process_index, accelerator.num_processes
    if seconds is not None and world > 1:
        raise RouterLabError("A time budget needs a single process (each would plan its own number of steps).",
                             "Pass --steps instead of --minutes with `accelerate launch`.")
    rng = random.Random(cfg.seed)
    log_rows: list[dict] = []
    log_file = open(log_path, "w") if (log_path and accelerator.is_main_process) else None
    bar = tqdm(total=cfg.steps, desc=f"router-tuning {cfg.granularity}", disable=not (progress and accelerator.is_local_main_process))
    layer_exec_sum = torch.zeros(len(layers), device=accelerator.device)
    layer_exec_n = 0
    start_time = time.perf_counter()
    cursor, shard = 0, []
    step, stopped, train_seconds, cap, read = 0, False, 0.0, cfg.steps, 0
    while step < cfg.steps:
        if should_stop is not None and should_stop():
            stopped = True
            break
        if seconds is not None and step > 0 and time.perf_counter() - start_time >= seconds:
            break
        step_start = time.perf_counter()
        target = cfg.target_at(step)
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr_at(step) * group["scale"]  # stand-ins follow the same schedule at their own rate
        optimizer.zero_grad(set_to_none=True)
        sums = {"loss": 0.0, "lm": 0.0, "kd": 0.0, "budget": 0.0, "skip": 0.0}
        step_exec = torch.zeros(len(layers), device=accelerator.device)
        batch = min(first_examples, cfg.batch_size) if first_examples and step == 0 else cfg.batch_size
        for micro in range(batch):
            if micro and should_stop is not None and should_stop():  # Stop lands within one example's forward and backward
                stopped = True
                break
            if cursor >= len(shard):
                rng.shuffle(order)
                shard, cursor = order[rank::world] or order, 0
            ex = examples[shard[cursor]]
            cursor += 1
            ids = torch.tensor([ex.ids], device=accelerator.device)
            teacher = teacher_logits(anatomy, ids, ex.start) if cfg.kd_weight > 0 else None
            out = example_losses(anatomy, routers, ids, ex.start, cfg, target, teacher)
            accelerator.backward(out["loss"] / batch)
            for k in sums:
                if k in out:
                    sums[k] += float(out[k].detach()) / batch
            step_exec += out["layer_exec"] / batch
            if on_example is not None:
                on_example(step + 1, micro + 1, batch)
        if stopped:  # the step in flight is dropped: the routers stay as the last whole step left them
            optimizer.zero_grad(set_to_none=True)
            break
        layer_exec_n += batch
        layer_exec_sum += step_exec * batch
        read += batch
        if world > 1:  # average router gradients over processes (17k numbers)
            for p in routers.parameters():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                p.grad = accelerator.reduce(p.grad, reduction="mean")
        optimizer.step()
        stats = {k: float(accelerator.reduce(torch.tensor(v, device=accelerator.device), reduction="mean")) for k, v in sums.items()}
        row = {"step": step + 1, "target": round(target, 4), "seconds": round(time.perf_counter() - start_time, 2),
               **{k: round(v, 5) for k, v in stats.items()}}
        row["layer_skip"] = [round(1.0 - float(e), 4) for e in step_exec]
        log_rows.append(row)
        if log_file:
            log_file.write(json.dumps(row) + "\n")
            log_file.flush()
        bar.update(1)
        bar.set_postfix(loss=f"{stats['loss']:.4f}", skip=f"{stats['skip']:.1%}")
        step += 1
        train_seconds += time.perf_counter() - step_start
        if seconds is not None and step <= PLAN_STEPS:
            cfg = replace(cfg, steps=planned_steps(cap, step, train_seconds / read * cfg.batch_size, seconds))
            bar.total = cfg.steps
        if on_step is not None:
            on_step(dict(row, steps_planned=cfg.steps), routers)
    bar.close()
    if log_file:
        log_file.close()
    seconds = time.perf_counter() - start_time
    layer_exec = (layer_exec_sum / max(1, layer_exec_n)).tolist()
    tail = log_rows[-max(1, len(log_rows) // 10):]
    report = {
        "granularity": cfg.granularity,
        "layers": list(layers),
        "kv_policy": KV_POLICY,
        "data": data_name,
        "examples": len(examples),
        "response_tokens": sum(e.n_response for e in examples),
        "steps": len(log_rows),
        "stopped": stopped,
        "processes": world,
        "device": str(accelerator.device),
        "seconds": round(seconds, 1),
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
        "loss_first": log_rows[0]["loss"] if log_rows else None,
        "loss_last": sum(r["loss"] for r in tail) / len(tail) if tail else None,
        "kd_last": sum(r["kd"] for r in tail) / len(tail) if tail else None,
        "skip_rate_last": sum(r["skip"] for r in tail) / len(tail) if tail else None,
        "skip_rate_per_layer_training": {str(i): round(1.0 - e, 4) for i, e in zip(layers, layer_exec)},
    }
    report["standin_rank"] = cfg.adapters
    if probe is not None:
        report["probe_init"] = probe
        report["seconds"] = round(report["seconds"] + probe["seconds"], 1)
    if fit is not None:
        report["standin_fit"] = fit
        report["seconds"] = round(seconds + fit["seconds"], 1)  # the fit is part of training
    return TrainResult(routers, report, log_rows)


# -- the curve plot ------------------------------------------------------------------------------
def plot_curves(log_rows: list[dict], path: str | Path, title: str = "Router-Tuning") -> Path:
    """Plotly HTML of loss, distillation and skip rate per step (PNG needs kaleido, which we do not require)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    steps = [r["step"] for r in log_rows]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("losses", "skip rate (routed cells, training gate)"))
    for key in ("loss", "kd", "lm", "budget"):
        if any(r.get(key) for r in log_rows):
            fig.add_trace(go.Scatter(x=steps, y=[r.get(key) for r in log_rows], name=key, mode="lines"), row=1, col=1)
    fig.add_trace(go.Scatter(x=steps, y=[r["skip"] for r in log_rows], name="skip rate", mode="lines"), row=1, col=2)
    fig.add_trace(go.Scatter(x=steps, y=[1 - r["target"] for r in log_rows], name="skip target", mode="lines",
                             line={"dash": "dash"}), row=1, col=2)
    fig.update_layout(title=title, template="plotly_white", height=420, width=1000)
    fig.update_xaxes(title_text="step")
    path = Path(path)
    fig.write_html(str(path), include_plotlyjs="cdn")
    return path


# -- the command: data, training, calibration, checkpoint -------------------------------------------
def parse_layers(text: str | None) -> tuple[int, ...] | None:
    """'1-28' or '4,5,6' or '1-3,7' -> layer indices; None stays None (the default layers)."""
    if text is None:
        return None
    out: list[int] = []
    try:
        for part in str(text).split(","):
            part = part.strip()
            if "-" in part:
                a, b = part.split("-")
                out.extend(range(int(a), int(b) + 1))
            elif part:
                out.append(int(part))
    except ValueError:
        raise RouterLabError(f"--layers {text!r} is not a list of layers.", "Use e.g. '1-28' or '4,5,6'.") from None
    if not out:
        raise RouterLabError(f"--layers {text!r} names no layer.", "Use e.g. '1-28' or '4,5,6'.")
    return tuple(out)


def calibrate_threshold(anatomy, routers: RouterSet, examples, max_increase: float, iterations: int = 6,
                        log=lambda *_: None) -> tuple[float, list[dict]]:
    """The threshold that skips most while held-out perplexity rises at most `max_increase`.

    Skip rate grows with the threshold, so bisect over the quantile of the routers' own scores.
    """
    from routerlab.tuning.evaluate import evaluate_examples, full_depth, response_scores

    full = full_depth(anatomy, examples)
    scores = response_scores(anatomy, routers, examples)
    lo, hi, best, points = 0.0, 0.7, 0.0, []
    for _ in range(iterations):
        q = (lo + hi) / 2
        t = float(scores[min(len(scores) - 1, int(q * len(scores)))])
        r = evaluate_examples(anatomy, examples, routers, t, KV_POLICY, full)
        points.append(r)
        log(f"calibrate: threshold {t:.4f} skip {r['skip_rate_all_layers']:.1%} of all, perplexity {r['perplexity_increase']:+.2%}")
        if r["perplexity_increase"] <= max_increase:
            lo, best = q, max(best, t)
        else:
            hi = q
    return best, points


def run_training(args) -> dict | None:
    """`python -m routerlab train`: data -> routers -> calibrated threshold -> checkpoint folder."""
    from accelerate import Accelerator

    from routerlab.core.model.models import load_model
    from routerlab.core.model.anatomy import Anatomy
    from routerlab.tuning.checkpoint import save_routers
    from routerlab.tuning.data import DEFAULT, build_default, examples_of, load_records

    overrides = {k: getattr(args, k) for k in ("steps", "batch_size", "lr", "lm_weight", "kd_weight", "target",
                                               "budget_weight", "ramp", "warmup", "decay", "seed", "adapters", "adapter_lr", "adapter_fit", "init") if getattr(args, k, None) is not None}
    if getattr(args, "gate", None) is not None:
        overrides["threshold"] = args.gate
    cfg = TrainConfig(granularity=args.granularity, layers=parse_layers(args.layers), **overrides)
    threshold = None if str(args.threshold) == "auto" else check_threshold(args.threshold)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    loaded = load_model(args.model, device=str(accelerator.device), dtype=getattr(args, "dtype", "float32"))
    if args.data is None and not DEFAULT.is_file():
        if accelerator.is_main_process:
            build_default(loaded)
        accelerator.wait_for_everyone()
    records = load_records(args.data)
    long = getattr(args, "long", 0) or 0

    def encoded(split: list) -> list:
        return examples_of(split, loaded.tokenizer, long, cfg.max_tokens, cfg.seed)

    train = encoded([r for r in records if r.split == "train"])
    heldout_records = [r for r in records if r.split == "heldout"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log_path = out.parent / f".{out.name}.train_log.jsonl"
    result = train_routers(loaded.model, train, cfg, accelerator=accelerator, log_path=log_path,
                           progress=not args.no_progress, data_name=str(args.data or DEFAULT.name))
    # Every rank leaves the process group before it exits: a gloo worker thread still holding the last collective's
    # tensors at interpreter shutdown aborts the process (SIGABRT; tests/test_train.py, the two-process test).
    accelerator.wait_for_everyone()
    accelerator.end_training()
    if not accelerator.is_main_process:
        return None
    report = result.report
    t0 = time.perf_counter()
    routers = result.routers
    anatomy = Anatomy(loaded.model)
    if threshold is None:
        if heldout_records:
            calib = encoded(heldout_records)[: args.calib_examples]
            threshold, points = calibrate_threshold(anatomy, routers, calib, args.max_ppl_increase,
                                                    log=lambda m: print(m, flush=True))
            report["calibration"] = {"examples": len(calib), "max_ppl_increase": args.max_ppl_increase,
                                     "seconds": round(time.perf_counter() - t0, 1),
                                     "points": [{k: p[k] for k in ("threshold", "skip_rate", "skip_rate_all_layers",
                                                                   "perplexity_increase", "agreement")} for p in points]}
        else:
            threshold = cfg.threshold
    report["threshold"] = threshold
    if long:
        report["long_inputs"] = {"tokens": long, "loss_from": long // 2}
    summary = {k: report[k] for k in ("data", "examples", "steps", "seconds", "processes", "loss_first", "loss_last",
                                      "skip_rate_last", "config", "long_inputs") if k in report}
    summary["calibration"] = {k: v for k, v in report.get("calibration", {}).items() if k != "points"}
    save_routers(routers, out, loaded.model, threshold=threshold, kv_policy=KV_POLICY, summary=summary)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    os.replace(log_path, out / "train_log.jsonl")
    plot_curves(result.log, out / "curves.html", title=f"Router-Tuning {cfg.granularity}, {loaded.name}")
    report["out"] = str(out)
    return report
