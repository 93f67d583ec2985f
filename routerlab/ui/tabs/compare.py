"""The Compare tab's handlers: a threshold ladder, the full model and up to three thresholds side by side.

Owns `compare_run` (the full model and one run per threshold of the chosen router set, advanced one
token each in turn by one Decoder, so their speeds are measured under the same load; the per-token
quality pass on, so each column has its mean KL from the full model), `ladder_thresholds` (what the
threshold inputs mean), `decode_speed` (a column's decode tok/s, the quality pass's time taken out), `lockstep_speeds`
(the columns' speeds as the ladder compares them: round by round, so a slow spell of the machine moves no ratio; the
sweep and Explore's side-by-side measurement use it too, with `lockstep_traces`),
`_Ladder` (the Control the session holds: Stop ends every column) and the HTML of the ladder
(`ladder_html`, `column_html`). Full model + one threshold is the old full-vs-routed view.
Knows nothing about the layout, the Explore tab or tensors.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import statistics

import gradio as gr

from routerlab.core.base.errors import RouterLabError, quote
from routerlab.core.records.divergence import repetition
from routerlab.core.records.trace import Trace
from routerlab.ui.figures import plots, safe
from routerlab.ui.state import fields
from routerlab.ui.state.resources import FULL, UNTRAINED, Resources
from routerlab.ui.state.session import Session, _shown, _status, _warn, plot_data, without_paths
from routerlab.ui.state.stream import Decoder, prefill_progress

log = logging.getLogger(__name__)

LADDER = (0.3, 0.5, 0.7)  # the thresholds a ladder starts with (calibrated sets: 0.5 = the set's default)
RUNGS = len(LADDER)  # at most this many thresholds next to the full model
HEAT_EMPTY = "The heatmap of the highest threshold's run appears here."


def ladder_thresholds(values) -> list[float]:
    """The thresholds a ladder runs, ascending, each once; blanks (None, "") are dropped.

    `values` is one threshold, a list of them (the tab's inputs, blanks included) or a string
    such as "0.3, 0.5, 0.7" (API callers; also as one of the list's items: `/compare`'s
    threshold_1): each number is checked by its box's field (fields.RUNGS: "Threshold 1", ...), so true, NaN or
    "half" is refused naming the box. Raises a RouterLabError for a bad value, for none and for more than RUNGS.
    """
    if not isinstance(values, (list, tuple)):
        values = [values]
    chosen = set()
    for k, value in enumerate(values):
        field = fields.RUNGS[min(k, len(fields.RUNGS) - 1)]
        for v in _numbers(value, field) if isinstance(value, str) else [value]:
            if (t := field.check(v)) is not None:
                chosen.add(t)
    chosen = sorted(chosen)
    if not chosen:
        raise RouterLabError("No threshold to compare with the full model.", "Enter one to three thresholds between 0 and 1, e.g. 0.3, 0.5 and 0.7.")
    if len(chosen) > RUNGS:
        raise RouterLabError(f"{len(chosen)} thresholds: the ladder has room for {RUNGS}.", f"Keep at most {RUNGS}, e.g. 0.3, 0.5 and 0.7.")
    return chosen


_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")  # a written number; not "nan", "inf" or "1_0"


def _numbers(text: str, field) -> list[float]:
    """The numbers of a threshold string ("0.3, 0.5 0.7"), each a plain decimal; a word is refused, naming the box."""
    words = text.replace(",", " ").split()
    for word in words:
        if not _DECIMAL.fullmatch(word):
            said = quote(word)
            raise fields.FieldError(field.label, f"{said} is not a number.",
                                    'Use a number from 0 to 1, or the ladder in one string, e.g. "0.3, 0.5, 0.7".', said)
    return [float(w) for w in words]


def compare_run(res: Resources, prompt, thresholds, router_label, kv_policy, max_new_tokens, temperature, model_name, session: Session):
    """The same prompt through the full model and the chosen router set at each threshold, one token each in turn.

    Yields RUNGS + 4 values: the full model's column, one column per threshold (a placeholder where
    fewer were given), the ladder table, the heatmap of the highest threshold's run, status.
    """
    from routerlab.core.decode.engine import Control

    skip = gr.skip()
    blank = (skip,) * (RUNGS + 3)
    session = session if isinstance(session, Session) else Session()
    try:
        res.check_prompt(prompt)
        ladder = ladder_thresholds(thresholds)
        engine = res.engine_for(model_name)
        label = router_label if router_label not in (None, "", FULL) else UNTRAINED
        routers = res.routers_for(engine, label, session.router_sets)
        config = res.generate_config(max_new_tokens, temperature, ladder[0], kv_policy)  # each setting checked (fields.py)
        seed = 0 if config.temperature > 0 else None  # the same samples in every column when sampling
        # shared=False: with the room, the columns decode alone, in lockstep, so their speeds compare like with like
        config = dataclasses.replace(config, seed=seed, quality=True, shared=False)
        configs = [config] + [dataclasses.replace(config, threshold=t) for t in ladder]
        controls = [Control(c.threshold) for c in configs]
        runs = [engine.generate(prompt, None if k == 0 else routers, c, ctl) for k, (c, ctl) in enumerate(zip(configs, controls))]
    except RouterLabError as err:
        yield *blank, _warn(err)
        return
    if session.compare_control is not None:
        session.compare_control.request_stop()
    # The slider does not steer a ladder (each column keeps its threshold): only Explore's run is steered.
    session.compare_control = everything = _Ladder(controls)
    traces = [c.trace for c in controls]
    yield *(column_html(None, None, t) for t in _padded([None, *ladder])), skip, skip, _status("run", f"Prefilling {len(traces)} runs…")
    decoder = Decoder(runs)
    heat = _shown(session, "compare_heat", lambda: plot_data(plots.empty_heatmap(HEAT_EMPTY)))
    cache: dict = {}
    try:
        for snaps, draw_plot in decoder.frames(traces, reading=controls):
            full, rungs = snaps[0], snaps[1:]
            finished = decoder.done.is_set()
            if draw_plot and rungs[-1].steps:  # otherwise repeat the last one (see plot_data)
                title = f"Threshold {ladder[-1]:.2f} (the ladder's highest): which layers each token skipped"
                heat = session.views["compare_heat"] = plot_data(plots.heatmap(rungs[-1], live=not finished, cache=cache, title=None if not finished else title))
            columns = [column_html(full, None, None)] + [column_html(r, full, t) for r, t in zip(rungs, ladder)]
            yield (
                *_padded(columns, column_html(None, None, None)),
                ladder_html(full, rungs, running=not finished),
                heat,
                _status("run", f"{reading.capitalize()}…") if not finished and (reading := prefill_progress(controls))
                else _status("run", f"Generating {len(snaps)} runs, one token each in turn…") if not finished
                else _status("stop", "Stopped: every column ended where it was.") if everything.stopped
                else _status("ok", "Done. A red outline marks each column's first token that differs from the full model."),
            )
        decoder.raise_error()
    except RouterLabError as err:
        yield *blank, _warn(err)
    except Exception as err:
        log.error("compare failed", exc_info=err)
        yield *blank, _status("warn", f"Compare failed: {type(err).__name__}: {safe.text(without_paths(str(err)))}")
    finally:
        everything.request_stop()  # ends the decoder if the stream was cancelled
        session.compare = tuple(traces)


def _padded(items: list, fill=None) -> list:
    """The full model's column and RUNGS threshold columns: fewer thresholds leave placeholders."""
    return list(items) + [fill] * (RUNGS + 1 - len(items))


class _Ladder:
    """A ladder's runs as the session sees them: Stop ends every column.

    `stop_requested` is set once anyone asked (the room's reader also asks each run to stop when it ends by itself,
    and compare_run when its stream closes); `stopped` says whether a Stop really cut a column short, which is what
    the ladder's last status line reports.
    """

    def __init__(self, controls):
        self.controls = list(controls)

    def request_stop(self) -> None:
        for control in self.controls:
            control.request_stop()

    @property
    def stop_requested(self) -> bool:
        return any(c.stop_requested for c in self.controls)

    @property
    def stopped(self) -> bool:
        return any(c.trace is not None and c.trace.meta.get("stop_reason") == "stopped" for c in self.controls)


# -- what a ladder shows -----------------------------------------------------------------------------
def decode_speed(trace: Trace, tokens: int | None = None) -> float:
    """Decode tokens/s of a run over its first `tokens` generated tokens (None: all), without the time its
    per-token quality pass took (`Trace.decode_speed`, which Explore's figure is too).

    A ladder's columns decode in lockstep, one token each in turn, so their k-th tokens are decoded in the same
    round: compared over the tokens both decoded (`shared_tokens`), they are timed over the same rounds and the same
    context lengths, not a column's late tokens alone against another's early ones."""
    return trace.decode_speed(tokens)


def step_seconds(trace: Trace, tokens: int | None = None) -> list[float]:
    """Each of a run's first `tokens` generated steps (None: all), its decode seconds without its quality pass's share;
    NaN for a step with no forward (the last token is never fed back) or without a record of its quality pass."""
    steps = trace.generated_steps if tokens is None else trace.generated_steps[:tokens]
    by_step = trace.meta.get("quality_seconds_by_step")
    if by_step is None and trace.meta.get("quality_seconds_in_steps"):
        return [math.nan] * len(steps)  # an old trace: its quality time is known only for the whole run
    out = []
    for k, step in enumerate(steps):
        quality = by_step[k] if by_step is not None and k < len(by_step) else 0.0
        out.append(step.seconds - quality if step.seconds > 0 and step.seconds - quality > 0 else math.nan)
    return out


def lockstep_speeds(traces: list[Trace], tokens: int | None = None) -> list[float | None]:
    """Decode tok/s of runs that decoded in lockstep (the first is the reference, e.g. the full model), as their ratios
    are measured: round by round. In round k every run decoded its k-th token, one after another, so each run's
    speedup over the reference is the median over the rounds of (the reference's k-th step / the run's k-th step), each
    without its quality pass. A slow spell of the machine (a browser redrawing, another visitor, a training job on the
    same cores) slows the runs of the rounds it falls in alike, or one run's step now and then: the median moves with
    neither, where a sum over the steps did (a Compare ladder on a long document gave 0.42x-1.92x for the same column).
    The reference's own tok/s is 1 / its median step; each run's is that times its speedup. None: nothing to time."""
    if not traces:
        return []
    ref = step_seconds(traces[0], tokens)
    mine = [s for s in ref if math.isfinite(s)]
    if not mine:
        return [None] * len(traces)
    base = 1.0 / statistics.median(mine)
    out: list[float | None] = [base]
    for trace in traces[1:]:
        ratios = [a / b for a, b in zip(ref, step_seconds(trace, tokens)) if math.isfinite(a) and math.isfinite(b)]
        out.append(base * statistics.median(ratios) if ratios else None)
    return out


def lockstep_traces(engine, prompt: str, runs: list[tuple], progress=None) -> list:
    """Traces of `runs` ((routers, config) each) on `prompt`, decoded one token each in turn on this thread, who goes
    first rotating every round, so each run's k-th token is decoded in the same round as every other's."""
    from routerlab.core.decode.engine import Control
    from routerlab.core.serve.lockstep import lockstep

    controls = [Control(config.threshold) for _, config in runs]
    total = max(config.max_new_tokens for _, config in runs)
    lockstep([engine.generate(prompt, routers, config, control) for (routers, config), control in zip(runs, controls)],
             None if progress is None else lambda rounds: progress(min(1.0, rounds / max(1, total))))
    return [control.trace for control in controls]


def shared_tokens(traces: list[Trace | None]) -> int | None:
    """How many generated tokens every column of a ladder decoded: the rounds they all ran (None: no column yet)."""
    counts = [len(t.generated_steps) for t in traces if t is not None]
    return min(counts) if counts else None


def _kl(trace: Trace) -> str:
    kl = trace.mean_kl()
    return "…" if kl is None else f"{kl:.3f}"


def _divergence(full: Trace, trace: Trace) -> str:
    j = plots.first_divergence(full, trace)
    if j is None:
        same = min(len(full.generated_steps), len(trace.generated_steps))
        return f"none in {same} tokens" if same else "–"
    wrote, instead = trace.generated_steps[j].text, full.generated_steps[j].text
    return f"token {j + 1}: “{plots.token_label(wrote, 12)}” for “{plots.token_label(instead, 12)}”"


def ladder_rows(full: Trace | None, rungs: list[Trace]) -> list[dict]:
    """One row per column: its numbers, measured in the same lockstep run (plain data, for tests and the table).

    Each column's speed is timed against the full model over the rounds the two both decoded (`timed_tokens`): a column
    whose text ended early shortens its own comparison, not the others' (whose column headers say the same)."""
    if full is None:
        return []
    f_tps, *speeds = lockstep_speeds([full, *rungs])  # each ratio over the rounds it shares with the full model
    rows = [dict(column="full model", threshold=None, skip_rate=0.0, mean_kl=0.0, agreement=1.0, tokens_per_second=f_tps,
                 speedup=1.0 if f_tps else None, first_divergence=None, timed_tokens=len(full.generated_steps))]
    for trace, tps in zip(rungs, speeds):
        rows.append(dict(
            column=f"threshold {trace.meta.get('threshold_start', 0):.2f}", threshold=trace.meta.get("threshold_start"), skip_rate=trace.skip_rate(),
            mean_kl=trace.mean_kl(), agreement=trace.agreement(), tokens_per_second=tps,
            speedup=tps / f_tps if tps and f_tps else None, first_divergence=plots.first_divergence(full, trace),
            timed_tokens=shared_tokens([full, trace]),
        ))
    return rows


def _timed_note(rows: list[dict]) -> str:
    """Over how many tokens each column's speed was timed, in words: '64 generated tokens' or, when a column's text
    ended first, '64 generated tokens (threshold 0.70: 15, where its text ended)'."""
    counts = [r["timed_tokens"] for r in rows[1:]]
    most = max(counts, default=rows[0]["timed_tokens"] if rows else 0)
    short = [f"{r['column']}: {r['timed_tokens']}" for r in rows[1:] if r["timed_tokens"] < most]
    return f"{most} generated tokens" + (f" ({'; '.join(short)}, where its text ended)" if short else "")


def ladder_html(full: Trace | None, rungs: list[Trace], running: bool = False) -> str:
    """The ladder as one table: a column per run, a row per number (plain HTML, everything escaped)."""
    if full is None:
        return ""
    rows = ladder_rows(full, rungs)
    head = "".join(f"<th>{safe.text(r['column'])}</th>" for r in rows)

    def line(label: str, hint: str, cells: list[str]) -> str:
        return f"<tr><th title='{safe.text(hint)}'>{safe.text(label)}</th>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"

    body = [
        line("skipped", "skipped / routed sub-layer runs over the generated tokens", [f"{r['skip_rate']:.0%}" for r in rows]),
        line("mean KL from the full model", "mean KL(full || this run) of the next-token distributions, nats per generated token (… = not scored yet)",
             ["0 (itself)"] + [_kl(t) for t in rungs]),
        line("top token as the full model", "share of generated tokens whose most likely next token is the full model's",
             ["100%"] + ["…" if r["agreement"] is None else f"{r['agreement']:.0%}" for r in rows[1:]]),
        line("decode tok/s", "measured in this run: the full model's median step, each column's from its median ratio to it round by round, over the tokens both decoded; its time does not count the quality pass that measures KL", [f"{r['tokens_per_second']:.1f}" if r["tokens_per_second"] else "–" for r in rows]),
        line("speedup vs full", "the median over the rounds of the full model's step over this column's, measured side by side in lockstep",
             ["1.00× (reference)"] + [f"<b>{r['speedup']:.2f}×</b>" if r["speedup"] else "–" for r in rows[1:]]),
        line("first difference", "the first generated token that is not the full model's (red outline in the text)",
             ["–"] + [_divergence(full, t) for t in rungs]),  # token_label escapes the tokens
    ]
    note = ("Still generating: the numbers move until every run ends." if running else
            f"{len(rows)} runs measured in lockstep (one token each in turn on this machine); each column's speed is timed "
            f"against the full model over the first {_timed_note(rows)}, which the two decoded in the same rounds, so they "
            f"compare like for like; a speedup is the median of its rounds' ratios, so a moment the machine was busy with "
            f"something else moves none.")
    return (f"<table class='rl-ladder'><thead><tr><th></th>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
            f"<div class='rl-foot'>{safe.text(note)} Router set {safe.text(rungs[0].meta.get('granularity') if rungs else '?')}, "
            f"kv policy {safe.text(full.meta.get('kv_policy', '?'))}.</div>")


def column_html(trace: Trace | None, full: Trace | None, threshold: float | None) -> str:
    """One column of the ladder: a title line, then the text (the first token that differs outlined in red).

    `full` is None for the full model's own column; `trace` None gives the column before its run starts
    (or a placeholder when `threshold` is None too, for a ladder with fewer thresholds).
    """
    if trace is None:
        if threshold is None and full is None:
            return "<div class='rl-col-h rl-muted'>(no threshold)</div>"
        title = "Full model" if threshold is None else f"Threshold {threshold:.2f}"
        return f"<div class='rl-col-h'>{title}</div>{plots.token_html(None)}"
    if full is None:
        tps = lockstep_speeds([trace])[0]  # its median step, as the ladder's table times it
        head = f"<b>Full model</b>" + (f" · {tps:.1f} tok/s" if tps else "") + _loop_flag(trace)
        return f"<div class='rl-col-h'>{head}</div>{plots.token_html(trace)}"
    div = plots.first_divergence(full, trace)
    f_tps, tps = lockstep_speeds([full, trace], shared_tokens([full, trace]))
    speed = f" · {tps / f_tps:.2f}×" if f_tps and tps else ""
    head = f"<b>Threshold {threshold:.2f}</b> · skipped {trace.skip_rate():.0%} · KL {_kl(trace)}{speed}{_loop_flag(trace)}"
    return f"<div class='rl-col-h'>{head}</div>{plots.token_html(trace, diverge_at=div)}"


def _loop_flag(trace: Trace) -> str:
    """ · repeats itself from token k" where the column's text loops (the rule Explore's card uses), else ""."""
    loop = repetition([s.token_id for s in trace.generated_steps])
    if loop is None:
        return ""
    return f" · <span class='rl-loop' title='the same {loop.period}-token unit back to back'>repeats itself from token {loop.start + 1}</span>"
