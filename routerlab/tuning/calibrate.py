"""Threshold calibration: fit one router set's score map so that a 0-1 threshold spans its useful range.

Trained routers' scores crowd around 0.5 (the attention-token set skips nothing at 0.47 and breaks
the text at 0.52), so a 0-1 slider would spend 95% of its travel on nothing. A `Calibration`
(`routerlab/core/routing/router.py`) maps each raw logit z to `sigmoid(a * z + b)`, a > 0, the same for
every layer of the set: no ordering and no decision changes, only where a threshold falls.

The fit rule (`fit_calibration`), on the raw full-depth scores of the fit prompts' routed response
cells (`evaluate.response_scores`):
  0.5  <- the set's shipped default threshold: 0.5 then means "the set's default". A set shipped
          with threshold 0 (nothing fitted its perplexity budget at training, so it never skips)
          or skipping under `floor` of the cells there has no such point: 0.5 goes to the raw
          threshold that skips `floor` (1%) of the cells instead.
  0.7  <- the raw threshold that skips `multiple` (4) times the rate at 0.5: where text starts to
          break. Symmetric in logit space, 0.3 then skips almost nothing.
The command (`run_calibrate`, `python -m routerlab calibrate`) fits it, measures the skip rates
(with real skipping, through the engine) and the quality cost at 0.1..0.9 on the fit prompts and
on held-out prompts that neither training nor the fit saw, and writes the map, the calibrated
default 0.5 and those measured points into router.json.

Knows nothing about the UI; how a calibration is stored and validated lives in `checkpoint.py`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from routerlab.core.base.errors import RouterLabError
from routerlab.core.base.paths import ASSETS
from routerlab.core.routing.router import IDENTITY, Calibration, logit

DEFAULT = 0.5  # the calibrated threshold of the set's default
HIGH = 0.7  # the calibrated threshold of `multiple` times the default's skip rate
MULTIPLE = 4.0
FLOOR = 0.01
LIMIT = 32  # prompts to fit on, and held-out prompts to check on (each measured at every slider position)
SLIDER = tuple(round(0.1 * i, 1) for i in range(1, 10))
FIT_DATA, FIT_SPLIT = ASSETS / "data" / "selfdistill.jsonl", "heldout"  # the prompts `train` chose the default on
CHECK_DATA, CHECK_SPLIT = ASSETS / "data" / "selfdistill_extra.jsonl", "heldout"  # seen by no shipped set
POINT_KEYS = ("skip_rate", "skip_rate_all_layers", "perplexity_increase", "kl_full", "agreement")


@dataclass(frozen=True)
class Fit:
    """A fitted calibration and the two raw anchors it was fitted through."""

    calibration: Calibration
    raw_default: float  # the shipped (uncalibrated) default threshold
    raw_anchor: float  # the raw threshold that maps to DEFAULT (raw_default unless the floor applied)
    raw_high: float  # the raw threshold that maps to HIGH
    default_rate: float  # share of the fit cells the raw default skips
    anchor_rate: float  # ... the raw anchor skips
    high_rate: float  # ... the raw high anchor skips
    floor_applied: bool


def skip_fraction(scores: torch.Tensor, threshold: float) -> float:
    """Share of the sorted `scores` below `threshold` (the cells a threshold skips: score < threshold)."""
    return int(torch.searchsorted(scores, torch.tensor([threshold], dtype=scores.dtype), right=False)) / len(scores)


def quantile(scores: torch.Tensor, rate: float) -> float:
    """The threshold under which about `rate` of the sorted `scores` fall."""
    return float(scores[min(len(scores) - 1, max(0, int(rate * len(scores))))])


def fit_calibration(scores: torch.Tensor, raw_default: float, multiple: float = MULTIPLE, floor: float = FLOOR) -> Fit:
    """Fit `sigmoid(a * z + b)` through (raw anchor -> 0.5) and (raw high -> 0.7); see the module docstring.

    `scores`: the raw (uncalibrated) scores of the fit cells, sorted ascending.
    """
    if not multiple > 1 or not 0 < floor < 1:
        raise RouterLabError(f"--multiple {multiple} and --floor {floor} cannot place 0.7 above 0.5.",
                             "Use a multiple above 1 and a floor between 0 and 1, e.g. --multiple 4 --floor 0.01.")
    scores = scores.double()
    default_rate = skip_fraction(scores, raw_default) if raw_default > 0 else 0.0
    floor_applied = default_rate < floor
    anchor = quantile(scores, floor) if floor_applied else raw_default
    anchor_rate = skip_fraction(scores, anchor)
    high_rate = min(0.95, multiple * max(anchor_rate, floor))
    high = quantile(scores, high_rate)
    if not 0.0 < anchor < high < 1.0:
        raise RouterLabError(f"These routers' scores are too concentrated to fit a calibration (raw {anchor:.6f} would "
                             f"skip {anchor_rate:.1%} and raw {high:.6f} {high_rate:.1%}).",
                             "Fit on more prompts, or choose another --multiple.")
    scale = (logit(HIGH) - logit(DEFAULT)) / (logit(high) - logit(anchor))
    shift = logit(DEFAULT) - scale * logit(anchor)
    return Fit(Calibration(scale, shift), raw_default, anchor, high, default_rate, anchor_rate,
               skip_fraction(scores, high), floor_applied)


def raw_default_of(config: dict) -> float:
    """The set's uncalibrated default threshold: as stored before any calibration, else as recorded by it."""
    from routerlab.tuning.checkpoint import calibration_of

    block = config.get("calibration")
    if isinstance(block, dict) and isinstance(block.get("raw_default"), (int, float)):
        return float(block["raw_default"])
    return calibration_of(config).raw_threshold(config["threshold"])


def measure(anatomy, routers, examples, thresholds=SLIDER, kv_policy: str = "kv", log=print, label: str = "") -> list[dict]:
    """Skip rates and quality cost at each (calibrated) threshold, real skipping through the engine."""
    from routerlab.tuning.evaluate import evaluate_examples, full_depth

    full = full_depth(anatomy, examples)
    points = []
    for t in thresholds:
        r = evaluate_examples(anatomy, examples, routers, t, kv_policy, full)
        points.append({"threshold": t, **{k: round(r[k], 5) for k in POINT_KEYS}})
        log(f"  {label} t={t:.2f}: skip {r['skip_rate']:6.1%} of routed cells, ppl {r['perplexity_increase']:+7.1%}, "
            f"KL {r['kl_full']:.4f}")
    return points


def table(points: dict[str, list[dict]], fit: Fit) -> str:
    """The terminal table: one row per slider position, the raw threshold it stands for, fit and held-out."""
    head = f"{'threshold':>9} {'raw':>9} |" + "|".join(f" {name + ' skip':>14} {'ppl':>7} {'KL':>7} " for name in points)
    lines = [head, "-" * len(head)]
    for i, t in enumerate(SLIDER):
        cells = [f" {p[i]['skip_rate']:>14.1%} {p[i]['perplexity_increase']:>+7.1%} {p[i]['kl_full']:>7.4f} "
                 for p in points.values()]
        lines.append(f"{t:>9.2f} {fit.calibration.raw_threshold(t):>9.5f} |" + "|".join(cells))
    return "\n".join(lines)


def _data_name(path: Path) -> str:
    path = Path(path)
    try:
        return str(path.resolve().relative_to(ASSETS.parent.resolve()))
    except ValueError:
        return str(path)


def command_of(args) -> str:
    """The command line that reproduces this fit."""
    parts = ["python -m routerlab calibrate", f"--routers {args.routers}"]
    for flag, value, default in (("--data", args.data, None), ("--split", args.split, FIT_SPLIT), ("--limit", args.limit, LIMIT),
                                 ("--check-data", args.check_data, None), ("--check-split", args.check_split, CHECK_SPLIT),
                                 ("--check-limit", args.check_limit, LIMIT), ("--multiple", args.multiple, MULTIPLE),
                                 ("--floor", args.floor, FLOOR), ("--dtype", getattr(args, "dtype", "auto"), "auto"),
                                 ("--long", getattr(args, "long", 0), 0)):
        if value is not None and value != default:
            parts.append(f"{flag} {value}")
    return " ".join(parts)


def run_calibrate(args) -> dict:
    """`python -m routerlab calibrate`: fit, measure, write router.json (unless --dry-run). A JSON-able dict."""
    from routerlab.core.model.models import load_model
    from routerlab.core.model.anatomy import Anatomy
    from routerlab.tuning.checkpoint import load_routers, read_config, write_calibration
    from routerlab.tuning.data import examples_of, load_records
    from routerlab.tuning.evaluate import response_scores

    log = getattr(args, "log", None) or (lambda m: print(m, flush=True))
    folder = Path(args.routers)
    config = read_config(folder)  # a bad folder fails before the model loads
    fit_data, check_data = Path(args.data or FIT_DATA), Path(args.check_data or CHECK_DATA)
    fit_records = load_records(fit_data, args.split)
    check_records = load_records(check_data, args.check_split)
    key = lambda r: tuple((m["role"], m["content"]) for m in r.messages) or (("", r.response),)  # noqa: E731
    overlap = {key(r) for r in fit_records} & {key(r) for r in check_records}
    if overlap:
        raise RouterLabError(f"{len(overlap)} prompts are both in the fit data and in the held-out check.",
                             "Check on prompts the fit never saw (e.g. the held-out split of selfdistill_extra.jsonl).")
    t0 = time.perf_counter()
    loaded = load_model(args.model, device=args.device, dtype=getattr(args, "dtype", "auto"))
    routers, config = load_routers(folder, loaded.model)
    anatomy = Anatomy(loaded.model)
    long = getattr(args, "long", 0) or 0  # a set trained on long inputs (`train --long`) is fitted and checked on them
    fit_ex = examples_of(fit_records, loaded.tokenizer, long)[: args.limit]
    check_ex = examples_of(check_records, loaded.tokenizer, long)[: args.check_limit]
    if not fit_ex or not check_ex:
        raise RouterLabError("No fit or no held-out examples to calibrate with.", "Check --data, --check-data and their splits.")
    raw_default = raw_default_of(config)
    routers.calibration = IDENTITY  # the fit reads the raw scores
    scores = response_scores(anatomy, routers, fit_ex)
    fit = fit_calibration(scores, raw_default, args.multiple, args.floor)
    c = fit.calibration
    log(f"{routers.granularity}: calibrated score = sigmoid({c.scale:.4f} * logit {'+-'[c.shift < 0]} {abs(c.shift):.4f}), fitted on "
        f"{len(fit_ex)} prompts ({len(scores)} routed response cells, full-depth scores)")
    anchor = "the shipped default" if not fit.floor_applied else (
        f"the floor: the shipped default {raw_default:.4f} skips {fit.default_rate:.1%} < {args.floor:.0%}")
    log(f"  {DEFAULT} <- raw {fit.raw_anchor:.6f} ({anchor}; skips {fit.anchor_rate:.1%} of the fit cells)")
    log(f"  {HIGH} <- raw {fit.raw_high:.6f} ({args.multiple:g}x: skips {fit.high_rate:.1%} of the fit cells)")
    routers.calibration = c  # from here on, every score and threshold is calibrated: the engine's own path
    policy = config["kv_policy"]
    points = {"fit": measure(anatomy, routers, fit_ex, SLIDER, policy, log, "fit"),
              "heldout": measure(anatomy, routers, check_ex, SLIDER, policy, log, "held-out")}
    text = table(points, fit)
    log(text)
    block = {
        "scale": c.scale, "shift": c.shift,  # unrounded: the map that was measured is the map stored
        "raw_default": raw_default,
        "rule": (f"{DEFAULT} = the shipped default" + (f" (under {args.floor:.0%} skipped there: the raw threshold skipping "
                                                      f"{args.floor:.0%})" if fit.floor_applied else "")
                 + f"; {HIGH} = {args.multiple:g}x its skip rate, on the fit prompts' full-depth scores"),
        "anchors": {str(DEFAULT): {"raw": round(fit.raw_anchor, 6), "skip_rate": round(fit.anchor_rate, 5)},
                    str(HIGH): {"raw": round(fit.raw_high, 6), "skip_rate": round(fit.high_rate, 5)}},
        "fitted_on": {"data": _data_name(fit_data), "split": args.split, "examples": len(fit_ex), "cells": len(scores),
                      **({"long_inputs": long} if long else {})},
        "checked_on": {"data": _data_name(check_data), "split": args.check_split, "examples": len(check_ex)},
        "dtype": str(next(loaded.model.parameters()).dtype).removeprefix("torch."),
        "points": points,
        "seconds": round(time.perf_counter() - t0, 1),
        "command": command_of(args),
    }
    if not args.dry_run:
        write_calibration(folder, block, DEFAULT)
        log(f"wrote the calibration and the default threshold {DEFAULT} into {folder / 'router.json'}")
    return {"routers": str(folder), "granularity": routers.granularity, "calibration": block, "_text": text,
            "written": not args.dry_run}
