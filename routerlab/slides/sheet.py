"""The teacher's "what your room will see" sheet: one page of Markdown from a `figures` run's numbers.json record.

docs/workshop.md states only what holds on every machine (slides/claims.py); the exact numbers of the day are this
sheet's, from the teacher's own machine: each exercise's skip rates, KLs, agreements, first differences and side-by-side
speeds, the answers word for word, and whether each of the lesson's claims holds here. Knows nothing about models,
plotly or files: `room_sheet(record) -> str`.
"""

from __future__ import annotations

import re

from routerlab.slides import claims

NAME = "room-sheet.md"


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _num(x, fmt: str = "{:.3f}") -> str:
    return "–" if x is None else fmt.format(x)


def _fence(text: str) -> str:
    """A model's answer as a fenced block: shown literally by any Markdown viewer and readable in a text editor.
    The fence is longer than any run of backticks in the text, so the text cannot close it."""
    longest = max((len(run) for run in re.findall(r"`+", text or "")), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{(text or '').strip() or '(nothing)'}\n{fence}"


def _code(value) -> str:
    """A short value (a token) as inline code in a table cell: backticks and pipes cannot end the span or the cell."""
    value = str(value).replace("\n", "\\n").replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", value)), default=0)
    ticks = "`" * (longest + 1)
    return f"{ticks} {value} {ticks}"


def _first(row: dict) -> str:
    token = row.get("first_difference_token")
    if token is None:
        return "same text" if row.get("same_text_as_full") else "–"
    return f"token {token}: {_code(repr(row.get('wrote')))} for {_code(repr(row.get('full_model_wrote')))}"


def _machine(m: dict) -> str:
    return (f"{m.get('cpu')}, {m.get('cores')} cores, {m.get('torch_threads')} torch threads, {m.get('vector_unit')}"
            f"{', native bf16' if m.get('native_bf16') else ''}")


def room_sheet(record: dict) -> str:
    f = record.get("figures", {})
    lines = [
        "# What your room will see",
        "",
        f"Written by `{record.get('command')}` on {record.get('date')}, on **{_machine(record.get('machine', {}))}** "
        f"(1-minute load average at the start: {_num(record.get('machine', {}).get('load_average_1min_at_start'), '{:.2f}')}). "
        f"Model: {record.get('model', {}).get('name')}, {record.get('model', {}).get('precision')}. Router set: "
        f"{record.get('routers', {}).get('granularity')} at its calibrated threshold "
        f"{_num(record.get('routers', {}).get('threshold'), '{:.2f}')}, kv policy {record.get('routers', {}).get('kv_policy')}; "
        f"greedy, up to {record.get('max_new_tokens')} new tokens; prompt: “{record.get('prompt')}”.",
        "",
        "Greedy decoding repeats itself on this machine, so the room sees these numbers when it runs the lesson's links "
        "on this server. Another processor takes other kernels, and a router score close to the threshold can flip there: "
        "routed answers may then part at another token. The lesson (docs/workshop.md) states only what held on every "
        "machine we ran; the last section says whether each of its claims holds here.",
    ]
    if "heatmap" in f:
        h = f["heatmap"]
        lines += ["", "## Exercise 1: the first example at the calibrated threshold", "",
                  f"- {h['generated_tokens']} new tokens; **{_pct(h['skip_rate'])}** of the routed attention runs skipped",
                  f"- mean KL from the full model **{_num(h['mean_kl'])}** nats per token; top token as the full model's "
                  f"**{_pct(h['agreement'])}**; decoding {_num(h.get('decode_tokens_per_second'), '{:.1f}')} tokens/s"]
    if "ladder" in f:
        lines += ["", "## Exercises 2 and 5: the threshold ladder (decoded side by side, one token each in turn)", "",
                  "| column | new tokens | skipped | mean KL | agreement | first difference | tokens/s | x full |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in f["ladder"]["rows"]:
            lines.append(f"| {r['column']} | {r['generated_tokens']} | {_pct(r['skip_rate'])} | {_num(r['mean_kl'])} | "
                         f"{_pct(r['agreement'])} | {_first(r) if r['threshold'] is not None else '(the reference)'} | "
                         f"{_num(r.get('tokens_per_second'), '{:.1f}')} | {_num(r.get('speedup'), '{:.2f}x')} |")
    if "layers" in f:
        pooled = {int(k): v for k, v in f["layers"]["all_prompts"].items() if v is not None}
        top = sorted(pooled, key=pooled.get, reverse=True)[:3]
        never = [i for i, v in sorted(pooled.items()) if v == 0.0]
        lines += ["", "## Exercise 3: which layers skip (the six example prompts)", "",
                  "- most skipped: " + ", ".join(f"layer {i} **{_pct(pooled[i])}**" for i in top),
                  "- never skipped: " + (", ".join(f"layer {i}" for i in never) or "none"),
                  "- per prompt: " + ", ".join(f"{p} {_pct(r)}" for p, r in zip(f["layers"]["prompts"], f["layers"]["skip_rate"]))]
    if "kv" in f:
        kv = f["kv"]
        lines += ["", "## Exercise 4: three KV policies (decoded side by side with the full model)", "",
                  "| policy | new tokens | skipped | attention work saved | cache saved | first difference | tokens/s | x full |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, p in kv["policies"].items():
            lines.append(f"| {name} | {p['generated_tokens']} | {_pct(p['skip_rate'])} | {_pct(p['attention_flops_saved'])} | "
                         f"{p['kv_bytes_saved'] / 1024:.1f} KiB | {_first(p)} | {_num(p.get('tokens_per_second'), '{:.1f}')} | "
                         f"{_num(p.get('speedup'), '{:.2f}x')} |")
        lines.append(f"\nThe full model: {_num(kv['full'].get('tokens_per_second'), '{:.1f}')} tokens/s, "
                     f"{kv['full'].get('generated_tokens')} new tokens.")
    if "ladder" in f:
        lines += ["", "## The answers, word for word", "", "**The full model:**", "", _fence(f["ladder"].get("full_model_text", ""))]
        for r in f["ladder"]["rows"]:
            if r["threshold"] is not None and "text" in r:
                lines += ["", f"**{r['column']}** ({_first(r)}):", "", _fence(r["text"])]
    checked = claims.check(record)
    held = sum(ok for _, ok, _ in checked)
    lines += ["", f"## The lesson's claims on this machine: {held} of {len(checked)} hold", ""]
    for claim, ok, measured in checked:
        lines.append(f"- {'✓' if ok else '✗ **does not hold here**:'} exercise {claim.exercise}, “{claim.says.replace('**', '')}” "
                     f"(here: {measured})")
    if held < len(checked):
        lines += ["", "Where a claim does not hold here, tell the room what this sheet shows instead."]
    return "\n".join(lines) + "\n"
