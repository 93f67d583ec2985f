"""PNG and SVG files of plotly figures at slide size, through kaleido and a Chromium.

Owns the slide's pixel size (`WIDTH` x `HEIGHT`, PNG at scale 1: 1920 x 1080), `check` (kaleido and a
browser present and able to draw: asked once, before any slow work, with a browser of its own) and `write`
(every figure in every format, with one browser for all of them: kaleido's sync server). Knows nothing about models or what the figures show.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import warnings
from pathlib import Path

from routerlab.core.base.errors import RouterLabError

WIDTH, HEIGHT = 1920, 1080  # layout pixels = PNG pixels (scale 1); the SVG's own size
FORMATS = ("png", "svg")
INSTALL = "Install them with `make dev chromium` (kaleido from requirements-dev.txt, Debian's chromium)."


def _browser() -> str | None:
    return (os.environ.get("BROWSER_PATH") or shutil.which("chromium") or shutil.which("chromium-browser")
            or shutil.which("google-chrome"))


@contextlib.contextmanager
def _server():
    """One Chromium for every figure drawn inside (kaleido's sync server), closed on the way out."""
    import kaleido

    kaleido.start_sync_server(silence_warnings=True)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The kopts argument is ignored")
            yield
    finally:
        kaleido.stop_sync_server(silence_warnings=True)


def check() -> None:
    """Raise a RouterLabError naming what to install unless kaleido can draw a PNG here (a few seconds)."""
    missing = [name for name in ("kaleido", "plotly") if importlib.util.find_spec(name) is None]
    if missing:
        raise RouterLabError(f"Writing PNG and SVG needs kaleido and plotly ({', '.join(missing)} not installed).", INSTALL)
    import plotly.graph_objects as go
    import plotly.io as pio

    browser = _browser()
    if browser:
        os.environ.setdefault("BROWSER_PATH", browser)  # Debian's chromium, where kaleido does not look by itself
    try:  # one-shot, not the server: a server whose browser fails to start leaves its caller waiting forever
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pio.to_image(go.Figure(go.Scatter(x=[0, 1], y=[0, 1])), format="png", width=32, height=32)
    except Exception as err:  # kaleido raises many types when no browser can start
        where = browser or "no chromium, chromium-browser or google-chrome on PATH"
        raise RouterLabError(f"kaleido could not draw a PNG with a Chromium ({where}: {type(err).__name__}).", INSTALL) from None


def write(figures: dict, out: Path, formats: tuple[str, ...] = FORMATS) -> list[Path]:
    """`out/<name>.<format>` for every figure and format, at WIDTH x HEIGHT; the paths written."""
    import plotly.io as pio

    pairs = [(fig, out / f"{name}.{fmt}") for name, fig in figures.items() for fmt in formats]
    if pairs:
        with _server():
            pio.write_images([f for f, _ in pairs], [p for _, p in pairs], width=WIDTH, height=HEIGHT, scale=1)
    return [p for _, p in pairs]
