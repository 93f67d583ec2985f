"""Markdown of the committed benchmark files: the trade-off tables and docs/results.md.

`markdown(result)` renders the tables of one `bench tradeoff` result (every run of `bench tradeoff`
writes them to tradeoff.md next to its CSV). `results_markdown(folder)` renders docs/results.md from
every file in assets/bench/ (speed, trade-off, held-out evaluations, load/faults), then the history of
measurements from assets/bench/history.json (report_history.py); `python -m routerlab bench report` writes it
and `--check` compares it. Reads JSON only: knows nothing about models, and
nothing here measures anything.
"""

from __future__ import annotations

import math
from pathlib import Path

from routerlab.bench.results.report_cells import READ_ERRORS, _cell, _num, _pct, _read
from routerlab.bench.results.report_history import history_markdown
from routerlab.bench.results.report_kinds import speed_kinds_markdown
from routerlab.core.base.paths import ASSETS, ROOT

BENCH = ASSETS / "bench"  # the committed benchmark files
RESULTS = ROOT / "docs" / "results.md"  # the document rendered from them


def _of_ideal(r: dict) -> str:
    return f"{100 * r['speedup'] / r['ideal_speedup']:.0f}%" if r["ideal_speedup"] else "-"


def rows_table(rows: list[dict]) -> str:
    head = ("| method | granularity | policy | threshold | skipped (all layers) | perplexity | vs full | agreement "
            "| measured speedup | ideal speedup | of ideal | KV bytes saved |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['method']} | {r['granularity']} | {r['kv_policy']} | {_num(r['threshold'], 4)} "
                     f"| {_pct(r['skip_rate_all_layers'])} | {_num(r['perplexity'])} | {_pct(r['perplexity_increase'], sign=True)} "
                     f"| {_pct(r['agreement'])} | {_num(r['speedup'])} | {_num(r['ideal_speedup'])} | {_of_ideal(r)} "
                     f"| {int(r['kv_bytes_saved']):,} |")
    return "\n".join(lines)


def granularity_markdown(table: list[dict], limits=("2%", "5%", "10%")) -> str:
    lines = ["| granularity | " + " | ".join(f"best speedup within {k} (ideal, skipped, perplexity)" for k in limits) + " |",
             "|---" * (len(limits) + 1) + "|"]
    for t in table:
        cells = []
        for k in limits:
            if t.get(f"speedup@{k}") is None:
                cells.append("nothing skips within this budget")
            else:
                cells.append(f"{t[f'speedup@{k}']:.3f} (ideal {t[f'ideal@{k}']:.3f}, {_pct(t[f'skip@{k}'])}, "
                             f"{_pct(t[f'perplexity_increase@{k}'], sign=True)})")
        lines.append(f"| {t['granularity']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def context_markdown(rows: list[dict]) -> str:
    lines = ["| context tokens | method | threshold | skipped (all layers) | vs full perplexity | agreement "
             "| measured speedup | ideal speedup | of ideal | full tokens/s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['context_tokens']} | {r['method']} | {_num(r['threshold'], 4)} | {_pct(r['skip_rate_all_layers'])} "
                     f"| {_pct(r['perplexity_increase'], sign=True)} | {_pct(r['agreement'])} | {_num(r['speedup'])} "
                     f"| {_num(r['ideal_speedup'])} | {_of_ideal(r)} | {r['tokens_per_second_full']:.2f} |")
    return "\n".join(lines)


def costs_line(costs: dict) -> str:
    ms = {k: 1e3 * v for k, v in costs.items()}
    return ("Cost per decode step (ms): step {step:.1f}; per layer: attention {attention_full:.2f} (keys/values alone "
            "{attention_kv_only:.2f}), MLP {mlp:.2f}; LM head {head:.1f}; routing (routers on every layer, skipping "
            "nothing) {routing:.1f}; everything else {overhead:.1f}.").format(**{k: ms.get(k, math.nan) for k in (
                "step", "attention_full", "attention_kv_only", "mlp", "head", "routing", "overhead")})


def tradeoff_parts(result: dict, level: int = 2) -> list[str]:
    """The tables of one result under headings of `level` (markdown lines, blank lines between)."""
    h = "#" * level
    return [f"{h} Every configuration", "", rows_table(result["rows"]), "",
            f"{h} Granularity table", "", granularity_markdown(result["granularity_table"]), "",
            f"{h} Longer prompts", "", context_markdown(result["context_scaling"]), "",
            f"{h} Cost breakdown", "", costs_line(result["costs"]), ""]


def tradeoff_conditions(result: dict) -> str:
    weights = f" Precision: {result['precision']}; decode reads {result['weights']}." if result.get("weights") else ""
    return (f"{result['examples']} held-out examples ({result['tokens']} response tokens), {result['new_tokens']} new "
            f"tokens per timed run, {result['rounds']} rounds, {result.get('seconds', 0) / 60:.1f} minutes.{weights}")


def markdown(result: dict) -> str:
    """All tables of one result (as written to tradeoff.json)."""
    parts = [f"# bench tradeoff: {result['model']}", "", tradeoff_conditions(result), "", *tradeoff_parts(result)]
    return "\n".join(parts)


# ---- docs/results.md: every committed benchmark file, one section each ----------------------------------

COMMAND = "python -m routerlab bench report"
# file -> (section title, the command that writes the file)
SOURCES = {
    "speed.json": ("Decode speed", "make bench"),
    "context.json": ("Where skipping pays: speedup against context length", "make context"),
    "precision.json": ("Precision: float32 against bfloat16", "make precision"),
    "tradeoff.json": ("Speed vs quality: the trade-off sweep", "make tradeoff"),
    "heldout_extra.json": ("Held-out evaluation: extra prompts, greedy answers", "make heldout-extra"),
    "heldout_sampled.json": ("Held-out evaluation: extra prompts, sampled answers", "make heldout-sampled"),
    "long_documents_attention-token.json": ("Long held-out text: the documents' own text, the default set", "make long-eval"),
    "long_documents_attention-token-long.json": ("Long held-out text: the documents' own text, the set trained on long inputs", "make long-eval"),
    "long_chats_attention-token.json": ("Long held-out text: chats of held-out prompts, the default set", "make long-eval"),
    "long_chats_attention-token-long.json": ("Long held-out text: chats of held-out prompts, the set trained on long inputs", "make long-eval"),
    "standins.json": ("Skip stand-ins: router-only against router + stand-in at equal skip rates", "make standins-table"),
    "load.json": ("Load, faults and bad input", "python -m routerlab bench load"),
    "soak.json": ("Every generation completes: the soak at the page's defaults", "make soak"),
    "room.json": ("A room at once: the shared decode loop against each generation alone", "make room"),
    "train_tab.json": ("Router-Tuning in three minutes: the Train tab's job", "make train-tab"),
    "train_tab_seed1.json": ("Router-Tuning in three minutes: the same job again, seed 1", "make train-tab-repeat"),
    "load_training.json": ("Generating while a visitor trains", "python -m routerlab.bench.load --phases training --fuzz-cases 0 --out assets/bench/load_training.json"),
    "load_training_nice0.json": ("Generating while a visitor trains, the training at normal priority",
                                 "ROUTERLAB_TRAINING_NICE=0 python -m routerlab.bench.load --phases training --fuzz-cases 0 --out assets/bench/load_training_nice0.json"),
}
FIGURES = {  # figures a section links to, when they are in the folder
    "tradeoff.json": ("tradeoff.png", "tradeoff.html", "layer_skip.png", "layer_skip.html", "tradeoff.csv", "tradeoff.md"),
    "heldout_extra.json": ("heldout_extra.html",),
    "heldout_sampled.json": ("heldout_sampled.html",),
}
def _label(folder: Path) -> str:
    """How the document names `folder`: relative to the repository when inside it (so the text is the same anywhere)."""
    try:
        return Path(folder).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return Path(folder).as_posix()


def _link(folder: Path, name: str) -> str:
    """A link from docs/results.md to a file of `folder`."""
    label = _label(folder)
    return f"[{name}]({'../' + label if not label.startswith('/') else label}/{name})"


def _short_path(p) -> str:
    """A recorded path without the machine's checkout prefix (`/work/x/assets/routers/y` -> `assets/routers/y`)."""
    text = str(p)
    return text[text.index("assets/"):] if "assets/" in text else text


def _name(key: str) -> str:
    return key.replace("_", " ")


def _kv_table(d: dict, skip: tuple = ()) -> str:
    """Every recorded value of `d` as a two-column table; nested dicts flatten to `outer: inner` rows."""
    lines = ["| measure | value |", "|---|---|"]

    def add(prefix: str, x: dict) -> None:
        for k, v in x.items():
            if k in skip:
                continue
            if isinstance(v, dict) and v:
                add(f"{prefix}{_name(k)}: ", v)
            elif isinstance(v, list) and v and isinstance(v[0], dict):
                lines.append(f"| {prefix}{_name(k)} | {len(v)} entries |")
            else:
                lines.append(f"| {prefix}{_name(k)} | {_cell(v)} |")

    add("", d)
    return "\n".join(lines)


def _matrix(rows: dict[str, dict]) -> str:
    """Dicts of the same kind side by side: one column each (the faults: stop, cancel, disconnect)."""
    keys = list(dict.fromkeys(k for r in rows.values() for k in r))
    lines = ["| measure | " + " | ".join(rows) + " |", "|---" * (len(rows) + 1) + "|"]
    lines += [f"| {_name(k)} | " + " | ".join(_cell(r.get(k)) for r in rows.values()) + " |" for k in keys]
    return "\n".join(lines)


def _peer_rows(r: dict) -> list[str]:
    """The reference rows of a speed result: the engine's 16-bit path, transformers, llama.cpp (rates, bytes)."""
    tps, b = r["tokens_per_second"], r.get("bytes_per_step", {})

    def mb(key: str) -> str:
        return f"{b[key] / 1e6:.0f}" if key in b else "-"

    rows = [f"| transformers `generate` ({r.get('dtype', 'bare model')}) | {tps['generate']:.2f} | {mb('generate')} | "
            f"{_num(r['engine_vs_generate'])}x | - | - |"]
    if "engine_16bit" in tps:
        rows.insert(0, f"| engine, 16-bit weights, no routers | {tps['engine_16bit']:.2f} | {mb('engine_16bit')} | "
                       f"{_num(r['engine_vs_16bit_engine'])}x | - | - |")
    if tps.get("llama_cpp") is not None:
        rows.append(f"| llama.cpp {r.get('llama_cpp_version') or ''} on the same GGUF | {tps['llama_cpp']:.2f} | {mb('llama_cpp')} | "
                    f"{_num(r['engine_vs_llama_cpp'])}x | - | - |")
    return rows


def speed_markdown(r: dict) -> list[str]:
    tps, speedup, ideal = r["tokens_per_second"], r["speedup"], r["ideal_speedup"]
    routed, deep = r["routed_layers"], r["skipped_layers"]
    b = r.get("bytes_per_step", {})
    lines = [f"{r['model']} on {r['device']} ({r.get('cpu_model', 'CPU')}, {r['threads']} threads, vector unit {r.get('cpu', '?')}), "
             f"prompt of {r['prompt_tokens']} tokens, {r['new_tokens']} new tokens, {r['rounds']} interleaved rounds. Tokens/s are "
             "medians; each ratio is the median of per-round ratios (the engine's rows decode in lockstep with the engine "
             "without routers; transformers and llama.cpp run between its rounds).", "",
             f"Weights a decode step reads: {r.get('weights', r.get('precision', 'not recorded'))}. Precision: {r.get('precision', 'not recorded')}.", "",
             "| configuration | tokens/s | MB read a step | default path vs it / speedup | ideal speedup | of ideal |",
             "|---|---|---|---|---|---|",
             f"| **engine, no routers (default path)** | {tps['engine']:.2f} | {b['engine'] / 1e6:.0f} | 1.000 (baseline) | - | - |"
             if "engine" in b else f"| engine, no routers | {tps['engine']:.2f} | - | 1.000 (baseline) | - | - |",
             *_peer_rows(r),
             f"| engine, routers on layers {routed[0]}-{routed[-1]}, never skipping | {tps['engine_never_skip']:.2f} | - "
             f"| {_num(r['routing'])} (the cost of routing) | 1.000 | - |"]
    for p in ("mask", "kv", "drop"):
        if f"deep_off_{p}" in tps:
            lines.append(f"| engine, attention off on layers {deep[0]}-{deep[-1]}, KV policy {p} | {tps['deep_off_' + p]:.2f} | - "
                         f"| {_num(speedup[p])} | {_num(ideal[p])} | {100 * speedup[p] / ideal[p]:.0f}% |")
    lines.append("")
    if "decode_weight_bytes" in r:
        lines.append(f"- Memory-bandwidth bound of the default path: {r['decode_weight_bytes'] / 1e6:.0f} MB of weights per decode step at "
                     f"{r['read_bandwidth_bytes_per_second'] / 1e9:.1f} GB/s read (best of 5 sums over 1 GiB, all threads, same run) "
                     f"= {r['bandwidth_bound_tokens_per_second']:.1f} tokens/s; the engine reaches {r['fraction_of_bandwidth_bound']:.2f} of it.")
    lc = r.get("long_context")
    if lc:
        t = lc["tokens_per_second"]
        peer = f", llama.cpp {t['llama_cpp']:.2f} (engine {_num(lc['engine_vs_llama_cpp'])}x)" if t.get("llama_cpp") else ""
        sixteen = f", the engine's 16-bit path {t['engine_16bit']:.2f}" if t.get("engine_16bit") else ""
        lines.append(f"- At {lc['context_tokens']} tokens of context: the engine decodes {t['engine']:.2f} tokens/s{sixteen}{peer}.")
    if r.get("ttft_seconds"):
        f = r["ttft_seconds"]
        peer = f", llama.cpp {f['llama_cpp']:.2f} s" if f.get("llama_cpp") is not None else ""
        lines.append(f"- Time to first token at a {f['prompt_tokens']}-token prompt: engine {f['engine']:.2f} s, "
                     f"transformers `generate` {f['generate']:.2f} s{peer}.")
    lines += ["", costs_line(r["cost_seconds"]), ""]
    return lines


def precision_markdown(r: dict) -> list[str]:
    a, b = r["float32"], r["bfloat16"]
    lines = [f"The shipped {r['granularity']} routers at their default threshold on {r['examples']} {r['split']} examples of "
             f"`{_short_path(r['data'])}` ({a['tokens']} response tokens), with the base in float32 and in bfloat16 "
             "(the same weights, rounded). Each precision is compared with its own full model.", "",
             "| base | full perplexity | routed perplexity | rise | KL | agreement | skipped (all layers) |",
             "|---|---|---|---|---|---|---|"]
    for name, x in (("float32", a), ("bfloat16: " + b["precision"], b)):
        lines.append(f"| {name} | {x['perplexity_full']:.4f} | {x['perplexity_routed']:.4f} | "
                     f"{_pct(x['perplexity_increase'], sign=True)} | {x['kl_full']:.4f} | {_pct(x['agreement'])} | "
                     f"{_pct(x['skip_rate_all_layers'])} |")
    lines += ["", f"bf16 against fp32: full-model perplexity {_pct(r['perplexity_full_bf16_vs_fp32'], sign=True)}, routed "
              f"{_pct(r['perplexity_routed_bf16_vs_fp32'], sign=True)}. Routing decisions bf16 flips: "
              f"{_pct(r['decisions_flipped_full'])} of {r['routed_cells']} routed cells scored at full depth, "
              f"{_pct(r['decisions_flipped_routed'])} as the routed model runs.", ""]
    d = r.get("default")
    if d:
        lines += [f"The default path ({d['weights']}), every response token scored as its own decode step, against the "
                  f"float32 model: full-model perplexity {d['perplexity_full']:.4f} ({_pct(d['perplexity_full_vs_fp32'], sign=True)}), "
                  f"KL from float32 {d['kl_from_fp32']:.4f}, top-1 agreement {_pct(d['agreement_with_fp32'])}; routed perplexity "
                  f"{d['perplexity_routed']:.4f} ({_pct(d['perplexity_increase'], sign=True)} over its own full model, KL "
                  f"{d['kl_full']:.4f}), skipping {_pct(d['skip_rate_all_layers'])} of all layers; routing decisions it flips "
                  f"against float32, as routed: {_pct(d['decisions_flipped_routed'])}.", ""]
    return lines


def tradeoff_markdown(r: dict) -> list[str]:
    return [f"{r['model']}: {tradeoff_conditions(r)}", "", *tradeoff_parts(r, level=3)]


def _setting(row: dict, kind: str) -> str:
    if kind == "random":
        return f"p = {row.get('p', row['threshold']):.3f}"
    if kind == "static":
        dropped = row.get("dropped_layers") or row.get("routed_layers") or []
        return f"k = {row.get('k', len(dropped))} (drops layer{'s' if len(dropped) != 1 else ''} {', '.join(map(str, dropped))})"
    return f"threshold {_num(row['threshold'], 4)}"


def _long(r: dict) -> str:
    """How an evaluation on long inputs (`eval --long N`) cut its text, or nothing."""
    n = r.get("long_inputs")
    return f", joined and cut into inputs of {n:,} tokens, each scored on its second half" if n else ""


def heldout_markdown(r: dict) -> list[str]:
    curve = r["curve"]
    first = next(row for kind in ("tuned", "random", "static") for row in curve.get(kind, []))
    lines = [f"{r['model']}, routers `{_short_path(r.get('routers'))}` ({r.get('granularity', first.get('granularity'))}, "
             f"KV policy {r.get('kv_policy', first.get('kv_policy'))}), data `{_short_path(r.get('data'))}` "
             f"({r.get('split', 'all')} split{_long(r)}): {first['examples']} examples, {first['tokens']:,} response tokens. "
             f"Full depth: perplexity {_num(first['perplexity_full'], 4)}.", "",
             "Tuned rows are the routers at each threshold; random rows skip each routed cell with probability p, "
             "matched to a tuned row's skip rate; static rows drop the k least important layers outright.", "",
             "| method | setting | skipped (routed layers) | skipped (all layers) | skipped (prompt) | perplexity | vs full "
             "| agreement | KL from full |", "|---|---|---|---|---|---|---|---|---|"]
    for kind in ("tuned", "random", "static"):
        rows = curve.get(kind, [])
        if kind == "tuned":
            rows = sorted(rows, key=lambda row: row["threshold"])
        for row in rows:
            routed = "-" if kind == "static" else _pct(row.get("skip_rate"))
            prompt = "-" if kind == "static" else _pct(row.get("skip_rate_prompt"))
            lines.append(f"| {kind} | {_setting(row, kind)} | {routed} | {_pct(row['skip_rate_all_layers'])} | {prompt} "
                         f"| {_num(row['perplexity_routed'], 4)} | {_pct(row['perplexity_increase'], sign=True)} "
                         f"| {_pct(row['agreement'])} | {_num(row.get('kl_full'), 4)} |")
    return lines + [""]


def load_markdown(r: dict) -> list[str]:
    failures = r.get("failures") or []
    lines = [("**Passed**: every check held." if r.get("passed") and not failures else
              "**Failed**: " + ("; ".join(_cell(f) for f in failures) or "see the values below") + "."), ""]
    if r.get("server"):
        lines += [f"Server: {_cell(_server_mode(r['server']))}.", ""]
    if isinstance(r.get("load"), dict):
        lines += ["### Load", "", _kv_table(r["load"]), ""]
    faults = r.get("faults")
    if isinstance(faults, dict):
        same = {k: v for k, v in faults.items() if k in ("stop", "cancel", "disconnect") and isinstance(v, dict)}
        lines += ["### Faults", ""]
        if same:
            lines += [_matrix(same), ""]
        lines += [_kv_table({k: v for k, v in faults.items() if k not in same}), ""]
    bad = r.get("bad_input")
    if isinstance(bad, dict):
        lines += ["### Bad input", "", _kv_table(bad, skip=("rows",)), ""]
        if bad.get("rows"):
            lines += ["| case | endpoint | outcome | clear | seconds | message |", "|---|---|---|---|---|---|"]
            lines += [f"| {_cell(x.get('case'))} | {_cell(x.get('endpoint'))} | {_cell(x.get('outcome'))} "
                      f"| {_cell(x.get('clear'))} | {_cell(x.get('seconds'))} | {_cell(x.get('message'))} |"
                      for x in bad["rows"]]
            lines.append("")
    for key in ("queue", "fuzz", "safe_loading"):
        if isinstance(r.get(key), dict):
            lines += [f"### {_name(key).capitalize()}", "", _kv_table(r[key]), ""]
    done = {"command", "started", "server_env", "machine", "server", "load", "faults", "bad_input", "queue", "fuzz",
            "safe_loading", "failures", "passed"}
    rest = {k: v for k, v in r.items() if k not in done}
    if rest:
        lines += ["### Other recorded values", "", _kv_table(rest), ""]
    return lines


def standins_markdown(r: dict) -> list[str]:
    from routerlab.bench.standins import format_standins

    return format_standins(r).split("\n")[2:] + ["", "Skipped: the measured share of all the target's cells (every layer, "
            "response tokens) at the threshold chosen for the target share. Step saved: the decode-step time those cells "
            "save per token in the measured cost model, each stand-in's own cost taken off; ideal: the speedup that gives.", ""]


def train_tab_markdown(r: dict) -> list[str]:
    out = [f"{r['steps']} steps ({r['seconds']} s of training, {r['elapsed']} s in all), base in {r['dtype']}.", ""]
    for key, what in (("check", lambda c: f"On `{_short_path(c['data'])}` ({c['split']}, {c['examples']} examples)"),
                      ("heldout_slice", lambda c: f"On the job's own held-out slice ({c['examples']} examples)")):
        if key in r:
            out += [f"{what(r[key])}:", "", _matrix({k: _threshold_or_p(k, v) for k, v in r[key]["rows"].items()}), ""]
    return out


def _threshold_or_p(name: str, row: dict) -> dict:
    """A job's comparison row with its threshold, or for random skipping (no router, no threshold) the skip probability
    the job recorded in the same field: a row each, so neither is read as the other."""
    rest = {k: v for k, v in row.items() if k != "threshold"}
    if name.startswith("random"):
        return {"threshold": None, "skip_probability": row.get("threshold"), **rest}
    return {"threshold": row.get("threshold"), "skip_probability": None, **rest}


def load_training_markdown(r: dict) -> list[str]:
    t = r["training"]
    out = [f"{t['sessions']} visitors share {t['generations']} generations of {t['max_new_tokens']} tokens, first alone, then "
           f"while one visitor trains (`/train`, {t['training_minutes']} min budget, training priority nice +{t['training_nice']}; "
           f"still training at the end: {t['training_was_running']}). Errors: {t['errors']}; decisions off their session's "
           f"threshold: {t['decision_errors']}. Decode step with a training running: {t['decode_step_slowdown']}x the median "
           f"alone; throughput {t['throughput_ratio']}x.", "", _matrix({"alone": t["alone"], "while training": t["with_training"]}), ""]
    return out


def soak_markdown(r: dict) -> list[str]:
    s = r["soak"]
    c = s["settings"]
    out = [f"{s['generations']} generations as visitors make them at the page's defaults ({c['router_set']}, threshold "
           f"{c['threshold']}, KV policy {c['kv_policy']}, temperature {c['temperature']}, Measure quality "
           f"{'on' if c['measure_quality'] else 'off'}), {s['new_tokens'][0]}-{s['new_tokens'][1]} new tokens a run, the page's "
           f"example prompts in turn; a run counts as failed unless its status says `✓` and its decisions follow its threshold. "
           f"**Failed: {s['errors']}.**", ""]
    rows = {f"{k} at a time": {f: v for f, v in r.items() if f not in ("sessions", "error_messages", "server_after")}
            for k, r in s["levels"].items()}
    return out + [_matrix(rows), ""]


def room_markdown(r: dict) -> list[str]:
    room, alone = r["modes"]["room"], r["modes"]["alone"]
    loop = room.get("loop") or {}
    out = [f"Every visitor starts one generation of {r['new_tokens']} new tokens at the same moment (the page's example prompts "
           f"and defaults: {room['settings']['router_set']}, threshold {room['settings']['threshold']}, quality on). **room**: one "
           f"decode loop (in the {loop.get('where')} thread, batches of up to {loop.get('max_batch')}); **alone**: each generation "
           f"in a worker thread of its own, with the caps it had ({', '.join(f'{k}={v}' for k, v in alone['server_env'].items())}).", ""]
    rows = {}
    for n in r["levels"]:
        for mode, m in (("room", room), ("alone", alone)):
            row = m["levels"].get(str(n))
            if row:
                rows[f"{n} {mode}"] = {k: v for k, v in row.items() if k not in ("sessions", "failures", "loop", "rounds")}
    if r.get("rounds", 1) > 1:
        out += [f"Each level ran {r['rounds']} times, one after another; each figure is the median of its rounds (errors: "
                "their sum; served: the fewest).", ""]
    out += [_matrix(rows), ""]
    if r.get("served_vs_loop"):
        out += [f"Served against the room's loop alone at as many rows (`{r['loop_alone']['command']}`, a process of its own, "
                "its CPU per token over every thread), per level: aggregate and server CPU per served "
                "token (web and engine processes) against the loop's, each process's CPU per token, and the harness's "
                "clients' share of the machine:", "", _matrix(r["served_vs_loop"]), ""]
    split = {f"{n} room": room["levels"][str(n)]["loop"] for n in r["levels"] if room["levels"].get(str(n), {}).get("loop")}
    if split:
        out += ["Where the room's loop spent each level's time (`Room.time_spent`, shares of its seconds; `idle`: nothing "
                "to decode, e.g. before the requests arrive and while the last pages are drawn), the mean rows of a batched "
                "step, and the packed forwards (prefills of several prompts; quality passes of several rows):", "", _matrix(split), ""]
    out += ["Ratios (room): " + "; ".join(f"{n} at once: aggregate {v['aggregate_vs_one_session']}x one session, "
            f"slowest visitor (p5) {v['visitor_p5_vs_one_session']}x, {v['aggregate_vs_alone_path']}x the alone path"
            for n, v in r["ratios"].items()), ""]
    if room.get("one_visitor_vs_cli"):
        v = room["one_visitor_vs_cli"]
        out += [f"One visitor alone in the app against `{_cli_command(v)}` on the same prompt, alternating: "
                f"app {v['app_tokens_per_s']} tokens/s, command line {v['cli_tokens_per_s']}: **{v['app_vs_cli']}x** (the median over rounds).", ""]
    if room.get("eight_sessions"):
        out += ["Eight at once, with the room: does skipping pay when rows share a step?", "",
                _matrix({k: {f: v for f, v in row.items() if f not in ("sessions", "failures")} for k, row in room["eight_sessions"].items()}), ""]
    if r.get("steps"):
        out += [f"The batched step itself, in the benchmark's main thread ({r['steps']['routers']} at {r['steps']['threshold']}):", "",
                _matrix({f"{n} rows": v for n, v in r["steps"]["sizes"].items()}), ""]
    return out


def context_curve_markdown(r: dict) -> list[str]:
    """`bench context`: the curve (per context, each run's speedup, ideal, skip rate, KL, agreement), then the sets."""
    lines = [f"Command: `{r['command']}`. Prompts: the long documents (assets/documents) joined and cut to about each "
             f"context, then \"{r['task']}\"; {r['new_tokens']} new tokens, greedy, end of text ignored. Every run's k-th "
             "token decoded in the same round as the others' (lockstep), quality scored only after the last timed step; speedup: the median over rounds of "
             "the full model's step time over the run's in the same round. Ideal: the step less exactly the measured cost "
             f"of the skipped cells (costs measured at {r['costs']['context']:.0f} and {r['costs']['long_context']:.0f} cached "
             "tokens, a line between). KL and agreement: the quality meter, scoring each run's tokens after its last timed step.", "",
             "| context (tokens) | full model tok/s | threshold | kv policy | skipped | speedup | ideal | of ideal | mean KL | top-1 agreement |",
             "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for p in r["points"]:
        for x in p["runs"]:
            lines.append(f"| {p['context']} | {p['full_tokens_per_second']:.1f} | {x['threshold']:.2f} | {x['kv_policy']} | "
                         f"{_pct(x['skip_rate'])} | {x['speedup']:.2f}x | {x['ideal_speedup']:.2f}x | "
                         f"{100 * x['speedup'] / x['ideal_speedup']:.0f}% | {x['mean_kl']:.3f} | {_pct(x['agreement'])} |")
    lines.append("")
    if r.get("sets"):
        lines += [f"Shipped sets on long held-out documents against the short example prompts, each set at its own threshold "
                  f"and KV policy, teacher-forced on the full model's greedy answer ({r['sets_answer_tokens']} tokens; "
                  "`tuning.evaluate.evaluate_examples`). No set was trained or calibrated on these documents. Skip rates "
                  "count the answer's routed cells (prompt: the prompt's).", "",
                  "| set | threshold | kv | long: KL | long: agreement | long: skipped | long: prompt skipped | short: KL | "
                  "short: agreement | short: skipped | short: prompt skipped |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for s in r["sets"]:
            lo, sh = s["long"], s["short"]
            lines.append(f"| {s['set']} | {s['threshold']:.2f} | {s['kv_policy']} | {lo['kl_full']:.3f} | {_pct(lo['agreement'])} | "
                         f"{_pct(lo['skip_rate'])} | {_pct(lo['skip_rate_prompt'])} | {sh['kl_full']:.3f} | {_pct(sh['agreement'])} | "
                         f"{_pct(sh['skip_rate'])} | {_pct(sh['skip_rate_prompt'])} |")
        long_ = r["sets"][0]["long"]
        lines += ["", f"Long: {long_['examples']} documents, {long_['prompt_tokens']:,} prompt tokens; short: "
                  f"{r['sets'][0]['short']['examples']} example prompts, {r['sets'][0]['short']['prompt_tokens']:,} prompt tokens.", ""]
    return lines


RENDERERS = {"context.json": context_curve_markdown, "room.json": room_markdown, "soak.json": soak_markdown, "speed.json": speed_markdown, "train_tab.json": train_tab_markdown, "train_tab_seed1.json": train_tab_markdown, "load_training.json": load_training_markdown,
             "load_training_nice0.json": load_training_markdown, "standins.json": standins_markdown, "precision.json": precision_markdown, "tradeoff.json": tradeoff_markdown, "heldout_extra.json": heldout_markdown,
             "heldout_sampled.json": heldout_markdown, "load.json": load_markdown,
             **{name: heldout_markdown for name in SOURCES if name.startswith("long_")}}


def _cli_command(v: dict) -> str:
    """The command line `make room` ran against the app, as a reader types it. Older records kept only the arguments
    after the interpreter (`-m routerlab generate --prompt Explain in three ...`, the prompt unquoted): rebuilt here."""
    import shlex

    command = str(v["cli_command"])
    if command.startswith("-m "):
        prompt = str(v.get("prompt", ""))
        command = "python " + command.replace(f"--prompt {prompt} ", f"--prompt {shlex.quote(prompt)} ", 1)
    return command


def _server_mode(server) -> str:
    """How the load test ran its server. `python -m routerlab.loadtest` was the harness's old name for the same command
    (docs/operators.md): shown under the name that runs now."""
    mode = str(server.get("mode", server) if isinstance(server, dict) else server)
    return mode.replace("python -m routerlab.loadtest", "python -m routerlab.bench.load")


def conditions(name: str, r: dict) -> str | None:
    """One line: the machine and settings a file records (None when it records none)."""
    if name == "speed.json":
        return (f"{r['model']} on {r['device']}, {r['threads']} threads; prompt {r['prompt_tokens']} tokens, "
                f"{r['new_tokens']} new tokens, {r['rounds']} rounds.")
    if name == "context.json":
        return (f"{r['model']} on {r['device']}, {r['threads']} threads; {r['routers']} routers, {r['new_tokens']} new tokens "
                f"per run, lockstep{' (--quick)' if r.get('quick') else ''}; {r['seconds']:.0f} s"
                + (f"; load average {r['loadavg_before']:.2f} before / {r['loadavg_after']:.2f} after" if r.get("loadavg_before") is not None else "") + ".")
    if name == "precision.json":
        return f"{r['model']}, {r['granularity']} routers, {r['examples']} {r['split']} examples of `{_short_path(r['data'])}`."
    if name == "tradeoff.json":
        return f"{r['model']}; {tradeoff_conditions(r)}"
    if name.startswith(("heldout", "long_")):
        return (f"{r['model']}, routers `{_short_path(r.get('routers'))}`, data `{_short_path(r.get('data'))}` "
                f"({r.get('split', 'all')} split{_long(r)}).")
    if name == "standins.json":
        ranks = ", ".join(f"rank {k} {1e6 * v:.0f} us" for k, v in r["standin_seconds"].items()) or "none"
        return (f"{r['model']} ({r['dtype']}), decode step {1e3 * r['costs']['step']:.1f} ms in the cost model "
                f"({_short_path(r.get('costs_source', 'measured in the run'))}); a stand-in per skipped cell: {ranks}.")
    if name.startswith("train_tab"):
        return f"the Train tab's default job (`train-job`), {r['dtype']} base, {r.get('machine', 'machine not recorded')}."
    if name.startswith("load") or name in ("soak.json", "room.json"):
        m = r.get("machine") or {}
        parts = [f"started {r['started']}" if r.get("started") else None,
                 f"{m['cpus']} CPUs" if m.get("cpus") else None,
                 m.get("cpu"),
                 "load average " + " / ".join(f"{_cell(m[k][0])} {k.split('_')[-1]}" for k in ("loadavg_before", "loadavg_after")
                                              if m.get(k)) if m.get("loadavg_before") else None,
                 "server settings " + ", ".join(f"{k}={v}" for k, v in r["server_env"].items()) if r.get("server_env") else None]
        return "; ".join(p for p in parts if p) + "." if any(parts) else None
    return None


def results_markdown(folder: Path = BENCH) -> str:
    """docs/results.md rendered from the benchmark files in `folder`. Deterministic: the same files give the same
    text. A missing file gives a "not measured" line, an unreadable one a line naming the error; neither raises."""
    folder = Path(folder)
    label = _label(folder)
    read: dict[str, dict | str] = {}
    for name in SOURCES:
        path = folder / name
        if path.is_file():
            try:
                read[name] = _read(path)
            except (OSError, *READ_ERRORS) as err:
                read[name] = f"could not be read ({type(err).__name__}: {err})"
    out = ["# RouterLab: measured results", "",
           f"<!-- Generated by `{COMMAND}` from {label}/. Do not edit by hand. -->", "",
           f"This file is generated by `{COMMAND}` from the committed benchmark files in `{label}/`; "
           "**do not edit it by hand**. To update it, rerun the command a section names (it rewrites that file), "
           f"then `{COMMAND}`, and commit both. `{COMMAND} --check` and `tests/test_report.py` fail while this file "
           f"differs from what `{label}/` gives.", "",
           "## Machine and conditions", "", "As each file records them (the files record nothing more about the machine):", ""]
    for name in SOURCES:
        data = read.get(name)
        if isinstance(data, dict):
            try:
                line = conditions(name, data)
            except READ_ERRORS as err:
                line = f"not recorded ({type(err).__name__}: {err})"
            out.append(f"- `{name}`: {line or 'no conditions recorded.'}")
        else:
            out.append(f"- `{name}`: {data or 'not measured.'}")
    out.append("")
    for name, (title, command) in SOURCES.items():
        out += [f"## {title}", "", f"From `{label}/{name}`, written by `{command}`.", ""]
        data = read.get(name)
        if data is None:
            out += [f"Not measured: there is no `{name}` in `{label}/`. Run `{command}` to measure it.", ""]
            continue
        if isinstance(data, str):
            out += [f"`{name}` {data}. Run `{command}` again.", ""]
            continue
        try:
            section = RENDERERS[name](data)
        except READ_ERRORS as err:
            section = [f"`{name}` is incomplete ({type(err).__name__}: {err}). Run `{command}` again.", ""]
        out += section
        if name == "speed.json":
            out += speed_kinds_markdown(folder)
        figures = [f for f in FIGURES.get(name, ()) if (folder / f).is_file()]
        if figures:
            out += ["Files: " + ", ".join(_link(folder, f) for f in figures) + ".", ""]
    out += history_markdown(folder, label, COMMAND)
    return "\n".join(out).rstrip("\n") + "\n"
