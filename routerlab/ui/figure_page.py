"""A figure as a standalone HTML page that works offline: plotly.js (about 4.6 MB) embedded, then the figure.

Every finished run exports its heatmap this way, and a room's visitors finish together. `fig.to_html(include_plotlyjs=
True)` rebuilt the whole 4.8 MB page as one string each time (reading plotly.js from its package, joining, encoding
on write: about 70 ms of the web server's CPU per run on a 2-core AVX2 machine, while the next visitors waited for
their final view). Here the part every page shares, the head and plotly.js, is made once as bytes; a page is that
part plus the figure's own `<div>` and script (plotly's `to_html` without plotly.js, so its escaping is plotly's),
written as bytes. A figure already serialized (`plots.heatmap_json`: the final view builds that JSON for the page anyway)
is written as it is (`write_json_page`), with no Figure built and no second serialization. Knows nothing about traces or
Gradio.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import plotly.graph_objects as go

CONFIG = {"displaylogo": False}
_END = b"\n</body>\n</html>\n"


@lru_cache(maxsize=1)
def _head() -> bytes:
    """The page up to and including plotly.js: the same for every page."""
    from plotly.offline import get_plotlyjs

    return ("<!doctype html>\n<html>\n<head>\n    <meta charset=\"utf-8\" />\n"
            "    <style>html, body {height: 100%; margin: 0;}</style>\n</head>\n<body>\n"
            "<script>window.PlotlyConfig = {MathJaxConfig: 'local'};</script>\n"
            f"<script>{get_plotlyjs()}</script>\n").encode()


def _figure(fig: go.Figure) -> bytes:
    return fig.to_html(include_plotlyjs=False, full_html=False, config=CONFIG).encode()


def _figure_of_json(figure_json: str) -> bytes:
    """The `<div>` and script of a figure given as plotly JSON ({"data": ..., "layout": ...}). Every "<", ">" and "&"
    in it is written as a JSON escape, so text the model wrote (a token "</script>") cannot end the script."""
    safe = figure_json.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    config = json.dumps({**CONFIG, "responsive": True})
    return ('<div style="height:100%; width:100%;">\n<div id="routerlab-figure" class="plotly-graph-div" style="height:100%; width:100%;"></div>\n'
            "<script>\nwindow.PLOTLYENV = window.PLOTLYENV || {};\n"
            f"const figure = {safe};\n"
            f'Plotly.newPlot("routerlab-figure", figure.data, figure.layout, {config});\n'
            "</script>\n</div>").encode()


def write_json_page(figure_json: str, path: str | Path) -> None:
    """`write_page` of a figure given as plotly JSON."""
    body = _figure_of_json(figure_json)
    with open(path, "wb") as f:
        f.write(_head())
        f.write(body)
        f.write(_END)


def page(fig: go.Figure) -> str:
    """The whole page as text."""
    return (_head() + _figure(fig) + _END).decode()


def write_page(fig: go.Figure, path: str | Path) -> None:
    """Write the page to `path` without building it as one string."""
    body = _figure(fig)  # before opening: a figure that fails to serialize leaves no half-written file
    with open(path, "wb") as f:
        f.write(_head())
        f.write(body)
        f.write(_END)
