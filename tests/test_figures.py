"""`python -m routerlab figures`: every slide figure as a 1920x1080 PNG and an SVG, none empty, fonts slide-sized,
and numbers.json with what a lesson quotes; bad options end with one clear line before anything slow runs."""

import json
import struct
import xml.etree.ElementTree as ET

import plotly.graph_objects as go
import pytest

from routerlab.__main__ import main
from routerlab.core.base.errors import RouterLabError
from routerlab.figures import FIGURES, parse_formats, parse_names, write_figures
from routerlab.slides import export

NEW_TOKENS = 16


@pytest.fixture(scope="module")
def written(embedded, tmp_path_factory):
    """The whole command once, at NEW_TOKENS new tokens per run, on the shared embedded model."""
    try:
        export.check()
    except RouterLabError as err:
        pytest.skip(f"PNG/SVG export unavailable here: {err}")
    out = tmp_path_factory.mktemp("figures")
    return out, write_figures(out, max_new_tokens=NEW_TOKENS, loaded=embedded)


def _png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path.name} is not a PNG"
    return struct.unpack(">II", head[16:24])


def test_every_figure_is_written_as_png_at_slide_size_and_as_svg(written):
    out, built = written
    for name in FIGURES:
        assert _png_size(out / f"{name}.png") == (1920, 1080), name
        svg = out / f"{name}.svg"
        root = ET.parse(svg).getroot()
        assert root.tag.endswith("svg") and root.get("width") == "1920" and root.get("height") == "1080", name
        assert svg.stat().st_size > 10_000 and sum(1 for _ in root.iter()) > 100, f"{name}.svg is nearly empty"
    assert {p.name for p in built.paths} == {f"{n}.{f}" for n in FIGURES for f in ("png", "svg")} | {"numbers.json", "room-sheet.md"}


def _values(trace) -> list:
    """The plotted values of a trace: z of a heatmap (flattened), else x and y."""
    if trace.type == "heatmap":
        return [v for row in trace.z for v in (row if hasattr(row, "__iter__") else [row]) if v is not None and v == v]
    return [v for v in (*(trace.x if trace.x is not None else ()), *(trace.y if trace.y is not None else ())) if v is not None]


def _font_sizes(obj, inside_font: bool = False):
    """Every font size set anywhere in a figure's dict (keys `font`, `tickfont`, `title_font`, ...)."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key == "size" and inside_font and isinstance(value, (int, float)):
                yield value
            else:
                yield from _font_sizes(value, "font" in key)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _font_sizes(value, inside_font)


def test_no_figure_is_empty_and_every_font_is_slide_sized(written):
    _, built = written
    assert set(built.figures) == set(FIGURES)
    for name, fig in built.figures.items():
        assert isinstance(fig, go.Figure) and fig.data, f"{name} has no traces"
        for trace in fig.data:
            assert _values(trace), f"{name}: trace {trace.name!r} plots nothing"
        layout = fig.layout
        assert (layout.width, layout.height) == (1920, 1080) and layout.font.size >= 20, name
        assert layout.title.font.size > layout.font.size and layout.title.text, name
        small = [s for s in _font_sizes(fig.to_dict()["layout"]) if s < 20] + [s for s in _font_sizes([t.to_plotly_json() for t in fig.data]) if s < 20]
        assert not small, f"{name}: fonts under 20 px: {small}"
    heat = built.figures["heatmap"]
    assert "quality cost" in {t.name for t in heat.data}, "the heatmap lost its quality strip"
    assert heat.layout.meta is None and heat.layout.hovermode is False


def test_numbers_hold_what_the_figures_show(written):
    out, built = written
    record = json.loads((out / "numbers.json").read_text())
    for key in ("command", "date", "machine", "model", "routers", "prompt", "max_new_tokens", "figures"):
        assert key in record, key
    assert record["command"].startswith("python -m routerlab figures --out ") and record["max_new_tokens"] == NEW_TOKENS
    assert {"cpu", "cores", "native_bf16", "vector_unit"} <= set(record["machine"])
    assert record["model"]["name"] and record["routers"]["granularity"] == "attention-token"
    figures = record["figures"]
    assert set(figures) == set(FIGURES)
    rows = figures["ladder"]["rows"]
    assert [r["threshold"] for r in rows] == [None, 0.3, 0.5, 0.7]
    for row in rows:
        assert {"skip_rate", "tokens_per_second", "mean_kl", "agreement", "speedup"} <= set(row) and row["tokens_per_second"] > 0
    assert all("first_difference_token" in r for r in rows[1:])
    policies = figures["kv"]["policies"]
    assert set(policies) == {"mask", "kv", "drop"}
    for p in policies.values():
        assert {"tokens_per_second", "attention_flops_saved", "kv_bytes_saved", "same_text_as_full"} <= set(p)
    assert policies["mask"]["attention_flops_saved"] == 0 and policies["mask"]["kv_bytes_saved"] == 0  # mask computes everything
    layers = figures["layers"]
    assert len(layers["prompts"]) == 6 and len(layers["per_layer"]) == 30 and all(len(v) == 6 for v in layers["per_layer"].values())
    heat = figures["heatmap"]
    assert heat["generated_tokens"] <= NEW_TOKENS and len(heat["kl_per_token"]) == heat["generated_tokens"]
    calibrated = next(r for r in rows if r["calibrated"])  # the heatmap's run is the ladder's calibrated rung: one run, one number
    assert calibrated["skip_rate"] == heat["skip_rate"] and calibrated["mean_kl"] == heat["mean_kl"]
    assert figures["tradeoff"]["series"] and all(s["skipped_percent"] for s in figures["tradeoff"]["series"])


def test_the_room_sheet_gives_this_machines_numbers_and_checks_every_claim(written):
    from routerlab.slides.claims import CLAIMS

    out, _ = written
    record = json.loads((out / "numbers.json").read_text())
    sheet = (out / "room-sheet.md").read_text()
    assert record["machine"]["cpu"] in sheet and record["command"] in sheet
    figures = record["figures"]
    assert f"**{100 * figures['heatmap']['skip_rate']:.1f}%**" in sheet  # exercise 1's skip rate, as this machine measured it
    for row in figures["ladder"]["rows"][1:]:  # each rung's row: its skip rate, first difference and speed ratio
        line = next(l for l in sheet.splitlines() if l.startswith(f"| {row['column']} |"))
        assert f"{100 * row['skip_rate']:.1f}%" in line and f"{row['speedup']:.2f}x" in line
        assert (f"token {row['first_difference_token']}" in line) if row["first_difference_token"] else "same text" in line
    assert figures["ladder"]["full_model_text"].strip() in sheet  # the answers word for word
    assert sheet.count("exercise ") >= len(CLAIMS) and "of %d hold" % len(CLAIMS) in sheet


def test_option_lists_keep_the_canonical_order():
    assert parse_names("kv, heatmap") == ("heatmap", "kv") and parse_names(None) == FIGURES
    assert parse_formats("SVG") == ("svg",)
    with pytest.raises(RouterLabError, match="names nothing"):
        parse_names(",")


@pytest.mark.parametrize("args, message", [
    (["--only", "nonsense"], "--only 'nonsense': unknown nonsense. Choose from heatmap, tradeoff, layers, ladder, kv"),
    (["--formats", "png,gif"], "--formats 'png,gif': unknown gif. Choose from png, svg"),
    (["--max-new-tokens", "0"], "max_new_tokens=0 is not allowed"),
])
def test_a_bad_option_ends_with_one_clear_line_before_anything_runs(args, message, tmp_path, capsys):
    out = tmp_path / "figures"
    assert main(["figures", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()
