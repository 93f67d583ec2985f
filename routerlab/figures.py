"""`python -m routerlab figures`: a teacher's slide figures, PNG at 1920 x 1080 and SVG, numbers.json with
every number they show, from the shipped results and fresh greedy runs of the example prompts, and room-sheet.md:
what the room will see on this machine, exercise by exercise, with whether each of the lesson's claims holds here
(slides/sheet.py, slides/claims.py).

Figures (FIGURES): `heatmap` (the first example with the shipped attention-token set at its calibrated threshold,
the app's heatmap with its quality strip), `tradeoff` (the Trade-off tab's first figure, from assets/bench/),
`layers` (skip rate per layer over the six examples), `ladder` (the Compare tab's threshold ladder on the first
example) and `kv` (the three KV policies at the calibrated threshold on the first example).

Owns its command line (`add_command`: the subcommand's options and handler), the option parsers (`parse_names`, `parse_formats`), `build` (the runs and the figures as plotly objects,
with their numbers: what the tests check) and `write_figures` (the files). The runs live in slides/runs.py, the
numbers in slides/numbers.py, the drawing in slides/draw.py, PNG and SVG in slides/export.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable

from routerlab.core.base.errors import RouterLabError
from routerlab.core.base.paths import ASSETS
from routerlab.slides.export import FORMATS, HEIGHT, WIDTH

FIGURES = ("heatmap", "tradeoff", "layers", "ladder", "kv")
GRANULARITY = "attention-token"
MAX_NEW_TOKENS = 96  # as the app's slider starts
PROMPTS = ASSETS / "prompts.json"


def _parse_list(text: str | None, allowed: tuple[str, ...], option: str) -> tuple[str, ...]:
    """A comma-separated option as a tuple in `allowed`'s order; None or blank means all of them."""
    if text is None or not str(text).strip():
        return allowed
    chosen = {part.strip().lower() for part in str(text).split(",") if part.strip()}
    if not chosen:
        raise RouterLabError(f"{option} {text!r} names nothing.", f"Choose from {', '.join(allowed)}, comma-separated.")
    unknown = sorted(chosen - set(allowed))
    if unknown:
        raise RouterLabError(f"{option} {text!r}: unknown {', '.join(unknown)}.", f"Choose from {', '.join(allowed)}, comma-separated.")
    return tuple(name for name in allowed if name in chosen)


def parse_names(text: str | None) -> tuple[str, ...]:
    return _parse_list(text, FIGURES, "--only")


def parse_formats(text: str | None) -> tuple[str, ...]:
    return _parse_list(text, FORMATS, "--formats")


def examples(path: Path = PROMPTS) -> list[tuple[str, str]]:
    """(title, prompt) of every example prompt."""
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
        pairs = [(str(i.get("title") or i["prompt"][:20]), str(i["prompt"])) for i in items]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise RouterLabError(f"{path} is not a list of {{title, prompt}} examples ({err}).", "Restore it from the repository.") from None
    if not pairs:
        raise RouterLabError(f"{path} has no example prompts.", "Restore it from the repository.")
    return pairs


@dataclass
class Built:
    figures: dict = field(default_factory=dict)  # name -> plotly Figure
    numbers: dict = field(default_factory=dict)  # name -> what that figure shows
    about: dict = field(default_factory=dict)  # the model, routers and prompt behind the runs
    paths: list = field(default_factory=list)  # the files written (write_figures), numbers.json last


def _quote(prompt: str) -> str:
    import html

    return f"“{html.escape(prompt)}”"


def build(names: tuple[str, ...] = FIGURES, max_new_tokens: int = MAX_NEW_TOKENS, loaded=None,
          log: Callable[[str], None] = lambda m: None) -> Built:
    """The figures `names` and their numbers; `loaded` a models.LoadedModel (default: the embedded model)."""
    from routerlab.slides import draw, numbers

    built = Built()
    if "tradeoff" in names:
        _tradeoff(built)
    if not set(names) - {"tradeoff"}:
        return built
    from routerlab.core.decode.engine import Engine
    from routerlab.core.model.models import load_model
    from routerlab.slides import runs
    from routerlab.tuning.checkpoint import resolve_routers
    from routerlab.ui.tabs.compare import LADDER

    pairs = examples()
    log("loading the embedded model")
    loaded = loaded or load_model()
    routers, defaults = resolve_routers(None, GRANULARITY, loaded.model)
    if "config" not in defaults:
        raise RouterLabError(f"No shipped {GRANULARITY} routers for {loaded.name}: {defaults['source']}.",
                             f"The figures use assets/routers/{GRANULARITY} with the embedded model; restore that folder.")
    threshold, policy = defaults["threshold"], defaults["kv_policy"]
    engine = Engine.from_loaded(loaded)
    first = pairs[0][1]
    main, layer_jobs = runs.plan(names, [p for _, p in pairs], threshold, policy, LADDER)
    log(f"decoding {len(main)} runs of the first example in lockstep, then {len(layer_jobs)} for the layer map")
    traces = runs.lockstep(engine, routers, main, max_new_tokens)
    traces.update(runs.lockstep(engine, routers, layer_jobs, max_new_tokens))
    built.about = {"model": {"name": engine.name, "dtype": str(engine.dtype).removeprefix("torch."), "precision": engine.precision,
                             "weights": engine.weights, "device": str(engine.device)},
                   "routers": {"granularity": GRANULARITY, "source": _relative(defaults["source"]), "threshold": threshold, "kv_policy": policy},
                   "prompt": first, "ladder": list(LADDER)}
    where = f"{engine.name} · {GRANULARITY} routers"
    speed_note = ("Speeds: the runs decoded side by side, one token each in turn, each timed against the full model over the tokens both decoded, "
                  f"the quality pass's time taken out (as the Compare tab)<br>Machine: {_machine_line()} · {built.about['model']['dtype']} model")
    full = traces.get(runs.Job(first, None, policy))
    if "heatmap" in names:
        trace = traces[runs.Job(first, threshold, policy)]
        built.numbers["heatmap"] = n = numbers.heatmap(trace)
        built.figures["heatmap"] = draw.heatmap(trace, f"Which layers each token skipped: {_quote(first)}", (
            f"{where} at the calibrated threshold {threshold:.2f}, kv policy {policy} · greedy, {n['generated_tokens']} new tokens<br>"
            f"skipped {n['skip_rate']:.1%} of the routed attention runs · mean KL from the full model {n['mean_kl']:.3f} nats per token · "
            f"top token as the full model's {n['agreement']:.0%}<br>"
            "warm cell: ran (colour = router score) · grey: skipped · blank: no router · bottom strip: each token's KL from the full model"))
    if "layers" in names:
        built.numbers["layers"] = n = numbers.layers([t for t, _ in pairs], [traces[j] for j in layer_jobs])
        built.figures["layers"] = draw.layers(n, "Where the routers skip: attention skipped per layer", (
            f"{where} at the calibrated threshold {threshold:.2f}, kv policy {policy} · greedy, up to {max_new_tokens} new tokens<br>"
            f"share of each layer's attention runs skipped while answering the {len(pairs)} example prompts (blank: no router)"))
    if "ladder" in names:
        rungs = [traces[runs.Job(first, t, policy)] for t in LADDER]
        built.numbers["ladder"] = n = numbers.ladder(full, rungs, threshold)
        built.figures["ladder"] = draw.ladder(n, "The threshold ladder: skip more, move further from the full model", (
            f"{_quote(first)}<br>{where}, kv policy {policy} · greedy, up to {max_new_tokens} new tokens"), speed_note)
    if "kv" in names:
        from routerlab.core.base.config import KV_POLICIES

        built.numbers["kv"] = n = numbers.kv(full, {p: traces[runs.Job(first, threshold, p)] for p in KV_POLICIES})
        built.figures["kv"] = draw.kv(n, f"Three KV policies at the calibrated threshold {threshold:.2f}: what skipping saves", (
            f"{_quote(first)} · {where} · greedy, up to {max_new_tokens} new tokens<br>mask: computes everything, zeroes the "
            "skipped update · kv: a skipped token computes only its keys and values · drop: it stores nothing"), speed_note)
    return built


def _tradeoff(built: Built) -> None:
    from routerlab.slides import draw, numbers
    from routerlab.tuning.checkpoint import read_config, shipped_routers
    from routerlab.ui.tabs.tradeoff_tab import BENCH_DIR, load_results, tradeoff_figures

    calibrations = {g: read_config(folder).get("calibration") for g, folder in shipped_routers().items()}
    results = load_results(BENCH_DIR, calibrations=calibrations)  # as the Trade-off tab loads them
    fig = tradeoff_figures(results)[0]  # the tab's first figure
    built.numbers["tradeoff"] = numbers.tradeoff(fig, results, _relative(BENCH_DIR))
    model = (results.get("speed") or results.get("heldout") or {}).get("model", "the shipped model")
    built.figures["tradeoff"] = draw.tradeoff(fig, "What skipping costs", (
        f"{model}, shipped benchmark results ({_relative(BENCH_DIR)}) · at the same share skipped, tuned routers move the output "
        "far less<br>than random or static skipping · left: KL from the full model, right: perplexity rise (log scale) · lower is better"))


def _relative(path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ASSETS.parent))
    except ValueError:
        return str(path)


def _machine_line() -> str:
    from routerlab.slides.numbers import machine

    m = machine()
    return f"{m['cpu']}, {m['cores']} cores, {m['vector_unit']}{', native bf16' if m['native_bf16'] else ''}"


def command_line(out, names: tuple[str, ...], formats: tuple[str, ...], max_new_tokens: int) -> str:
    parts = ["python -m routerlab figures", f"--out {out}", f"--max-new-tokens {max_new_tokens}"]
    if names != FIGURES:
        parts.append(f"--only {','.join(names)}")
    if formats != FORMATS:
        parts.append(f"--formats {','.join(formats)}")
    return " ".join(parts)


def write_figures(out: str | Path, names: tuple[str, ...] = FIGURES, formats: tuple[str, ...] = FORMATS,
                  max_new_tokens: int = MAX_NEW_TOKENS, loaded=None, log: Callable[[str], None] = lambda m: None) -> Built:
    """`out/<figure>.<format>` for every figure and format, `out/numbers.json` and (with any figure but tradeoff)
    `out/room-sheet.md`; what was built, with the paths written.

    Bad options and a missing kaleido or Chromium fail first, before the model loads or anything decodes.
    """
    from routerlab.core.base.config import GenerateConfig
    from routerlab.slides import export
    from routerlab.slides.numbers import machine, rounded

    names, formats = parse_names(",".join(names)), parse_formats(",".join(formats))
    GenerateConfig(max_new_tokens=max_new_tokens)  # a bad count fails here, with the config's own message
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise RouterLabError(f"--out {out} is a file.", "Give a folder (it is created when missing).")
    if formats:
        log("checking kaleido and a Chromium")
        export.check()
    started, load = datetime.now().astimezone(), os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    built = build(names, max_new_tokens, loaded, log)
    out.mkdir(parents=True, exist_ok=True)
    log(f"writing {len(built.figures) * len(formats)} files to {out}")
    paths = export.write(built.figures, out, formats)
    record = {
        "command": command_line(out, names, formats, max_new_tokens), "date": started.isoformat(timespec="seconds"),
        "machine": dict(machine(), load_average_1min_at_start=load), **built.about, "max_new_tokens": max_new_tokens, "temperature": 0.0,
        "size_px": {"width": WIDTH, "height": HEIGHT, "scale": 1}, "files": [p.name for p in paths],
        "figures": built.numbers,
    }
    path = out / "numbers.json"
    path.write_text(json.dumps(rounded(record), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    built.paths = [*paths, path]
    if set(names) - {"tradeoff"}:  # the sheet is about the fresh runs
        from routerlab.slides import claims, sheet

        sheet_path = out / sheet.NAME
        sheet_path.write_text(sheet.room_sheet(rounded(record)), encoding="utf-8")
        built.paths.append(sheet_path)
        failed = [c.says.replace("**", "") for c, ok, _ in claims.check(rounded(record)) if not ok]
        log(f"the lesson's claims on this machine: {len(claims.CLAIMS) - len(failed)} of {len(claims.CLAIMS)} hold"
            + "".join(f"\n  does not hold here: {s}" for s in failed))
    return built


def add_command(sub) -> None:
    """`python -m routerlab figures`: the subparser on __main__'s subcommands, with its handler."""
    fg = sub.add_parser("figures", help="a teacher's slide figures (PNG 1920x1080 and SVG) and numbers.json with every "
                        "number they show, from the shipped results and fresh greedy runs of the example prompts")
    fg.add_argument("--out", required=True, help="folder to write: <figure>.png, <figure>.svg, numbers.json, room-sheet.md")
    fg.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS, help=f"new tokens per run (default {MAX_NEW_TOKENS}, as the app)")
    fg.add_argument("--only", default=None, help=f"comma-separated figures to write (default all): {', '.join(FIGURES)}")
    fg.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated: {', '.join(FORMATS)} (default all)")
    fg.set_defaults(func=_run)


def _run(args) -> int:
    import sys

    names, formats = parse_names(args.only), parse_formats(args.formats)  # bad options fail before any slow work
    built = write_figures(args.out, names, formats, args.max_new_tokens, log=lambda m: print(m, file=sys.stderr, flush=True))
    print("\n".join(str(p) for p in built.paths))
    return 0
