"""One visitor's state and the small helpers every tab's handlers share.

Owns `Session` (kept in a gr.State, never shared: running Controls, last traces, what the page
shows now, a temp folder for exports) and its delete callback, the status-line helpers
(`_status`, `_warn`, `without_paths`), `plot_data` / `_shown` (figures serialized once and repeated by streams)
and `_export` (trace JSON + heatmap HTML files). Knows nothing about engines, Resources,
tabs or tensors.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import gradio as gr

from routerlab.core.trace import Trace
from routerlab.ui import plots


class Session:
    """One visitor's state, kept in a gr.State: never shared between sessions.

    `control` / `compare_control` are the live handles of a running Explore / Compare generation;
    `trace` is the last Explore run (for what-if views and export).
    """

    def __init__(self):
        self.control = None
        self.compare_control = None
        self.trace: Trace | None = None
        self.compare: tuple[Trace | None, ...] = (None, None)  # the last Compare: the full model's trace, then one per threshold
        self.running = False
        self.views: dict[str, Any] = {}  # what the page shows now (serialized once), repeated by streams
        self.job = None  # the Train tab's running tuning.job.TrainJob, if any
        self.job_drawn: tuple | None = None  # (steps, checkpoints) its figures last showed: unchanged ones are not sent again
        self.router_sets: dict[str, tuple[Any, Any]] = {}  # label -> (RouterSetInfo, RouterSet): sets trained or uploaded here
        self.link_threshold: float | None = None  # the threshold a link just set: the link's note says it, the slider's echo does not
        self._dir: str | None = None

    def workdir(self) -> Path:
        if self._dir is None or not os.path.isdir(self._dir):
            self._dir = tempfile.mkdtemp(prefix="routerlab-")
        return Path(self._dir)

    def cleanup(self) -> None:
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)


def _delete_session(session: Session | None) -> None:
    if isinstance(session, Session):
        if session.control is not None:
            session.control.request_stop()
        if session.compare_control is not None:
            session.compare_control.request_stop()
        if session.job is not None:  # a visitor who closes the tab stops their training
            session.job.stop()
        session.cleanup()


def plot_data(fig):
    """A figure serialized once. A stream repeats it in frames that do not redraw it, instead of
    yielding gr.skip(): Gradio turns every skip into a component rebuild with a JSON-schema pass
    (milliseconds each, on the GIL the decoder thread needs); a repeated value costs a string compare."""
    from gradio.components.plot import PlotData

    return PlotData(type="plotly", plot=fig.to_json())


def _shown(session: Session, key: str, make: Callable[[], Any]) -> Any:
    if key not in session.views:
        session.views[key] = make()
    return session.views[key]


def _status(kind: str, text: str) -> str:
    # Plain symbols, not emoji: they render in every font, offline and in screenshots.
    icon = {"ok": "✓", "run": "▶", "warn": "⚠", "whatif": "◐", "stop": "■"}.get(kind, "")
    return f"{icon} {text}".strip()


# An absolute path inside a message (a folder then a name; not a URL's "//" nor a relative "a/b"): the server's own
# layout (temp folders, the checkout), which a visitor has no use for and should not see.
_SERVER_PATH = re.compile(r"(?<![\w.:/~])(?:/[^\s/'\"`:;,()<>\[\]]+)+/([^\s/'\"`:;,()<>\[\]]+)")


def without_paths(text: str) -> str:
    """`text` with every absolute path cut to its last name: '/tmp/routerlab-x1/broken/routers.safetensors is corrupted'
    -> 'routers.safetensors is corrupted'."""
    return _SERVER_PATH.sub(r"\1", text)


def _warn(err: Exception) -> str:
    text = without_paths(str(err))
    gr.Warning(text)
    return _status("warn", text)


def _export(session: Session, trace: Trace) -> tuple[str, str]:
    """Write the run's trace JSON and a standalone heatmap HTML page; return their paths."""
    folder = session.workdir()
    trace_path = folder / "routerlab-trace.json"
    trace_path.write_text(trace.to_json(indent=1))
    html_path = folder / "routerlab-heatmap.html"
    html_path.write_text(plots.figure_html(plots.heatmap(trace)))
    return str(trace_path), str(html_path)
