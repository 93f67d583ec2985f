"""Markdown tables of a `bench tradeoff` result: the README's tables, printed from the committed JSON.

`python -m routerlab bench report` prints them from assets/bench/tradeoff.json; every run of
`bench tradeoff` also writes them to tradeoff.md next to the CSV. Knows nothing about models.
"""

from __future__ import annotations

import math


def _num(x, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{float(x):.{digits}f}"


def _pct(x, digits: int = 1, sign: bool = False) -> str:
    return "-" if x is None else f"{100 * float(x):{'+' if sign else ''}.{digits}f}%"


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


def markdown(result: dict) -> str:
    """All tables of one result (as written to tradeoff.json)."""
    parts = [f"# bench tradeoff: {result['model']}", "",
             f"{result['examples']} held-out examples ({result['tokens']} response tokens), {result['new_tokens']} new "
             f"tokens per timed run, {result['rounds']} rounds, {result.get('seconds', 0) / 60:.1f} minutes.", "",
             "## Every configuration", "", rows_table(result["rows"]), "",
             "## Granularity table", "", granularity_markdown(result["granularity_table"]), "",
             "## Longer prompts", "", context_markdown(result["context_scaling"]), "",
             "## Cost breakdown", "", costs_line(result["costs"]), ""]
    return "\n".join(parts)
