"""The workshop lesson (docs/workshop.md): what it states as fact holds on every machine we ran, and every number
it quotes is what its command wrote.

`python -m routerlab figures --out assets/workshop` writes numbers.json and room-sheet.md; the same runs on other
kernel paths (another CPU, one thread) are kept in assets/workshop/machines/. Each of the lesson's claims
(slides/claims.py) is in its text and holds on every one of those records. `make room` writes
assets/bench/room.json and `make train-tab` assets/bench/train_tab.json: the lesson quotes those, machine named.
Rerun a command and this test names every claim or number the lesson must change.
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
    """(what, the text the lesson must contain): the numbers it quotes from a named machine's `make room` and
    `make train-tab` (the figures' numbers are the room sheet's: the lesson states claims, checked below)."""
    quoted = []
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
    text = " ".join(LESSON.split())
    missing = [f"{what}: {want!r}" for what, want in _quoted() if " ".join(want.split()) not in text]
    assert not missing, "docs/workshop.md does not say:\n" + "\n".join(missing)


def _runs() -> list[Path]:
    return [FIGURES / "numbers.json", *sorted((FIGURES / "machines").glob("*.json"))]


def test_the_lesson_states_every_claim_and_each_holds_on_every_kernel_path_we_ran():
    from routerlab.slides.claims import CLAIMS, check

    flat = " ".join(LESSON.split()).lower()
    missing = [c.says for c in CLAIMS if " ".join(c.says.split()).lower() not in flat]
    assert not missing, "docs/workshop.md does not state:\n" + "\n".join(missing)
    runs = _runs()
    machines = {(r["machine"]["cpu"], r["machine"]["vector_unit"], r["machine"]["torch_threads"]) for r in map(_json, runs)}
    assert len({m[:2] for m in machines}) >= 2 and len(machines) >= 3, f"claims checked on too few kernel paths: {machines}"
    failed = [f"{path.relative_to(ROOT)}: exercise {c.exercise}, {c.says!r} (measured: {measured})"
              for path in runs for c, ok, measured in check(_json(path)) if not ok]
    assert not failed, "claims that do not hold:\n" + "\n".join(failed)


def test_the_shipped_room_sheet_is_the_shipped_runs():
    from routerlab.slides.numbers import rounded
    from routerlab.slides.sheet import room_sheet

    sheet = (FIGURES / "room-sheet.md").read_text()
    assert sheet == room_sheet(rounded(_json(FIGURES / "numbers.json"))), "rerun `make figures` (room-sheet.md is stale)"
    assert "](../assets/workshop/room-sheet.md)" in LESSON


def test_the_lesson_shows_every_figure_the_command_wrote():
    n = _json(FIGURES / "numbers.json")
    for name in sorted({Path(f).stem for f in n["files"]}):
        assert (FIGURES / f"{name}.png").is_file() and (FIGURES / f"{name}.svg").is_file(), name
        assert f"](../assets/workshop/{name}.png)" in LESSON, f"the lesson does not show {name}.png"


def test_the_about_tabs_lesson_links_are_the_lessons():
    import re

    from routerlab.ui.tabs.about import ABOUT_MD

    about = re.findall(r"\]\((\?[^)]+)\)", ABOUT_MD)
    assert len(about) == 3
    for query in about:
        assert "http://127.0.0.1:7860/" + query in LESSON, query
