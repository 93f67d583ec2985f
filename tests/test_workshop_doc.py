"""The workshop lesson (docs/workshop.md) quotes numbers: each must be what its command wrote.

`python -m routerlab figures --out assets/workshop` writes numbers.json; `make room` writes assets/bench/room.json;
`make train-tab` writes assets/bench/train_tab.json. Rerun a command and this test names every number the lesson
must change. The lesson's figures are the files the figures command wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LESSON = (ROOT / "docs" / "workshop.md").read_text()
FIGURES = ROOT / "assets" / "workshop"


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _quoted() -> list[tuple[str, str]]:
    """(what, the text the lesson must contain)."""
    n = _json(FIGURES / "numbers.json")
    fig = n["figures"]
    heat, ladder, kv, layers = fig["heatmap"], fig["ladder"]["rows"], fig["kv"]["policies"], fig["layers"]
    rungs = {r["threshold"]: r for r in ladder if r["threshold"] is not None}
    full = next(r for r in ladder if r["threshold"] is None)
    quoted = [
        ("heatmap tokens", f"answer had {heat['generated_tokens']}\ntokens"),
        ("heatmap skip", f"**{_pct(heat['skip_rate'])}** of the routed attention runs"),
        ("heatmap KL", f"**{heat['mean_kl']:.3f}** nats per token"),
        ("heatmap agreement", f"**{heat['agreement']:.0%}** of the"),
        ("full model tokens", f"full model's answer had {full['generated_tokens']} tokens"),
        ("full model speed", f"full model's {full['tokens_per_second']:.1f} tokens/s"),
    ]
    for t, r in rungs.items():
        quoted += [
            (f"{t} skip", f"**{_pct(r['skip_rate'])}**"),
            (f"{t} KL", f"**{r['mean_kl']:.3f}**"),
            (f"{t} agreement", f"**{r['agreement']:.0%}**"),
            (f"{t} first difference", f"at **{t:.2f}** at {'generated ' if t == 0.3 else ''}token **{r['first_difference_token']}**"),
        ]
    quoted.append(("0.7 length", f"shorter one ({rungs[0.7]['generated_tokens']} tokens)"))
    for name in ("mask", "kv", "drop"):
        quoted.append((f"{name} speed", f"{name} {kv[name]['speedup']:.2f}x"))
    quoted += [
        ("kv work saved", f"**{_pct(kv['kv']['attention_flops_saved'])}** of the\nattention work saved"),
        ("drop work saved", f"**{_pct(kv['drop']['attention_flops_saved'])}** of the attention work"),
        ("drop cache saved", f"**{kv['drop']['kv_bytes_saved'] / 1024:.1f} KiB**"),
        ("drop cache share", f"(**{_pct(kv['drop']['kv_bytes_saved'] / kv['drop']['kv_bytes_full'])}** of what the run stored)"),
        ("drop first difference", f"at token {kv['drop']['first_difference_token']} (kv's at\ntoken {kv['kv']['first_difference_token']})"),
    ]
    pooled = {int(k): v for k, v in layers["all_prompts"].items() if v is not None}
    top = sorted(pooled, key=pooled.get, reverse=True)[:3]
    quoted += [(f"layer {k}", f"layer **{k}**") for k in top]
    quoted += [(f"layer {k} share", f"**{pooled[k]:.0%}**") for k in top]
    never = [k for k, v in sorted(pooled.items()) if v == 0.0]
    quoted.append(("never skipped", "layers " + ", ".join(map(str, never[:-1])) + f" and {never[-1]}\nwere never skipped"))
    rates = dict(zip(layers["prompts"], layers["skip_rate"]))
    quoted += [("poem", f"poem skipped **{_pct(rates['Poem'])}**"), ("recipe", f"**{_pct(rates['Recipe'])}**, the advice **{_pct(rates['Advice'])}**")]

    room = _json(ROOT / "assets" / "bench" / "room.json")
    levels, steps = room["modes"]["room"]["levels"], room["steps"]["sizes"]
    quoted += [
        ("8 students", f"**{levels['8']['visitor_tokens_per_s_p50']:.1f} tokens/s**"),
        ("8 first token", f"within **{levels['8']['time_to_first_token_s_p95']:.1f} s**"),
        ("16 students", f"got **{levels['16']['visitor_tokens_per_s_p50']:.1f} tokens/s** (first token within {levels['16']['time_to_first_token_s_p95']:.1f} s)"),
        ("32 students", f"served at **{levels['32']['visitor_tokens_per_s_p50']:.1f} tokens/s** each (first token within {levels['32']['time_to_first_token_s_p95']:.1f} s)"),
        ("step of 1", f"**{steps['1']['step_ms']:.1f} ms** for\none token"),
        ("step of 8", f"**{steps['8']['step_ms']:.1f} ms** for eight"),
    ]
    train = _json(ROOT / "assets" / "bench" / "train_tab.json")["check"]
    mine, rand = train["rows"]["mine at 0.5"], train["rows"]["random at my share"]
    quoted += [
        ("trained skip", f"skipped **{_pct(mine['skip_rate'])}** of the routed attention runs on {train['examples']} held-out prompts"),
        ("trained KL", f"mean KL of **{mine['kl_full']:.3f}**"),
        ("trained agreement", f"**{_pct(mine['agreement'])}** top-token agreement"),
        ("random", f"KL **{rand['kl_full']:.3f}**, agreement **{_pct(rand['agreement'])}**"),
    ]
    return quoted


def test_every_number_the_lesson_quotes_is_what_its_command_wrote():
    text = LESSON
    missing = [f"{what}: {want!r}" for what, want in _quoted() if want not in text]
    assert not missing, "docs/workshop.md does not say:\n" + "\n".join(missing)


def test_the_lesson_shows_every_figure_the_command_wrote():
    n = _json(FIGURES / "numbers.json")
    for name in sorted({Path(f).stem for f in n["files"]}):
        assert (FIGURES / f"{name}.png").is_file() and (FIGURES / f"{name}.svg").is_file(), name
        assert f"](../assets/workshop/{name}.png)" in LESSON, f"the lesson does not show {name}.png"


def test_the_about_tabs_lesson_links_are_the_lessons():
    import re

    from routerlab.ui.about import ABOUT_MD

    about = re.findall(r"\]\((\?[^)]+)\)", ABOUT_MD)
    assert len(about) == 3
    for query in about:
        assert "http://127.0.0.1:7860/" + query in LESSON, query
