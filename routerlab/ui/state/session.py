"""One visitor's state and the small helpers every tab's handlers share.

Owns `Session` (kept in a gr.State, never shared: running Controls, last traces, what the page
shows now, a temp folder for exports) and its end: `keep_session` (the page's load event) files each tab's Session
under its Gradio session hash, and `close_tab` (the unload event, fired as soon as the tab's heartbeat connection
drops: closed, reloaded, or offline) ends it at once: its runs stop, its training is abandoned, its sets and temp
folder are freed. Gradio's own delete callback (an hour after a tab closes) ends it too, for sessions the page
never loaded (API clients). Also the status-line helpers
(`_status`, `_warn`, `without_paths`), `plot_data` / `_shown` (figures serialized once and repeated by streams)
and `_export` (trace JSON + heatmap HTML files). Knows nothing about engines, Resources,
tabs or tensors.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

import gradio as gr

from routerlab.core.records.trace import Trace
from routerlab.ui.figures import safe
from routerlab.ui.state import exports
from routerlab.ui.state.uploads import upload_folder

log = logging.getLogger(__name__)


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
        self.threshold_auto: float | None = None  # the threshold the app last set (a set's calibration); None: the page's first
        self.sets_made = 0  # sets trained here so far: names each job's folder (sets may be dropped, so not len(router_sets))
        self.hash: str | None = None  # Gradio's session hash, once the page has loaded (keep_session)
        self._dir: str | None = None

    def workdir(self) -> Path:
        """The visitor's folder for exports, inside Gradio's own file cache: a file already there is served as it is,
        where one elsewhere is hashed and copied into the cache on every output that names it (a heatmap page is
        ~5 MB: at 32 visitors that copying was 8% of the web process's CPU, profiled with py-spy)."""
        if self._dir is None or not os.path.isdir(self._dir):
            cache = upload_folder()
            cache.mkdir(parents=True, exist_ok=True)
            self._dir = tempfile.mkdtemp(prefix="routerlab-", dir=cache)
        return Path(self._dir)

    def cleanup(self) -> None:
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    def end(self) -> None:
        """The visitor left: stop their runs, abandon their training (it ends at its next token or step, saves
        nothing and deletes its folder), drop their sets and traces, delete the temp folder. Safe to call twice."""
        for control in (self.control, self.compare_control):
            if control is not None:
                control.request_stop()
        job, self.job = self.job, None
        if job is not None:
            job.abandon(then=self.cleanup)  # the folder again once the job has ended: it may have been writing
        self.router_sets.clear()
        self.trace, self.compare, self.views = None, (None, None), {}
        self.cleanup()


_OPEN: dict[str, Session] = {}  # session hash -> the Session of each open tab (filed on page load)
_OPEN_LOCK = threading.Lock()


def keep_session(session: Session | None, request: gr.Request | None = None) -> None:
    """The page's load event: file this tab's Session under its session hash, for close_tab."""
    key = getattr(request, "session_hash", None)
    if isinstance(session, Session) and key:
        session.hash = key
        with _OPEN_LOCK:
            _OPEN[key] = session


def close_tab(request: gr.Request | None = None) -> None:
    """The unload event (the tab closed or reloaded): end its Session now, not when Gradio deletes its state."""
    key = getattr(request, "session_hash", None)
    with _OPEN_LOCK:
        session = _OPEN.pop(key, None) if key else None
    if session is not None:
        log.info("a tab closed: its session ends%s", " and its training stops" if session.job is not None else "")
        session.end()


def open_sessions() -> int:
    """How many tabs' Sessions are filed (for tests and the load harness)."""
    with _OPEN_LOCK:
        return len(_OPEN)


def _delete_session(session: Session | None) -> None:
    """Gradio's delete callback for the session state (an hour after the tab closed, or at shutdown)."""
    if isinstance(session, Session):
        with _OPEN_LOCK:
            if session.hash is not None and _OPEN.get(session.hash) is session:
                del _OPEN[session.hash]
        session.end()


def plot_data(fig):
    """A figure (or its JSON, already serialized) as gr.Plot's value, serialized once. A stream repeats it in frames that do not redraw it, instead of
    yielding gr.skip(): Gradio turns every skip into a component rebuild with a JSON-schema pass
    (milliseconds each, on the GIL the decoder thread needs); a repeated value costs a string compare."""
    from gradio.components.plot import PlotData

    return PlotData(type="plotly", plot=fig if isinstance(fig, str) else fig.to_json())


def _shown(session: Session, key: str, make: Callable[[], Any]) -> Any:
    if key not in session.views:
        session.views[key] = make()
    return session.views[key]


def _status(kind: str, text: str) -> str:
    # `text` is the status line's Markdown: whatever in it came from outside the app went through safe.text.
    # Plain symbols, not emoji: they render in every font, offline and in screenshots.
    icon = {"ok": "✓", "run": "▶", "warn": "⚠", "whatif": "◐", "stop": "■"}.get(kind, "")
    return f"{icon} {text}".strip()


# An absolute path inside a message (a folder then a name; not a URL's "//" nor a relative "a/b"): the server's own
# layout (temp folders, the checkout), which a visitor has no use for and should not see.
_SERVER_PATH = re.compile(r"(?<![\w.:/~])(?:/[^\s/'\"`:;,()<>\[\]]+)+/([^\s/'\"`:;,()<>\[\]]+)")


def without_paths(text: str, keep: tuple[str, ...] = ()) -> str:
    """`text` with every absolute path cut to its last name: '/tmp/routerlab-x1/broken/routers.safetensors is corrupted'
    -> 'routers.safetensors is corrupted'; except inside the parts `keep` names (the visitor's own input, quoted:
    a zip member '/tmp/router.json' is shown as the visitor sent it)."""
    keep = sorted({k for k in keep if k}, key=len, reverse=True)
    if not keep:
        return _SERVER_PATH.sub(r"\1", text)
    parts, last = [], 0
    for quote in re.finditer("|".join(map(re.escape, keep)), text):
        parts += [_SERVER_PATH.sub(r"\1", text[last:quote.start()]), quote.group(0)]
        last = quote.end()
    return "".join(parts) + _SERVER_PATH.sub(r"\1", text[last:])


def _warn(err: Exception) -> str:
    # The message names what the visitor sent (a file name, a zip member, a JSON value): the toast renders HTML and
    # the status line Markdown, so it is escaped for both (safe.py); the server's own paths are cut to their names.
    message = safe.text(without_paths(str(err), getattr(err, "quoted", ())))
    gr.Warning(message)
    return _status("warn", message)


def _export(session: Session, trace: Trace) -> str:
    """Write the run's trace JSON; return its path. Each run's file goes in a folder of its own: files are served as
    they are from Gradio's cache, so a new run's must not take an old run's address, and an earlier run's stays
    readable (an API client may fetch it later) until the exports' bounds evict it (ui/state/exports.py: a session's last
    few runs, a budget in all), Gradio's sweep of served files (layout.EXPORT_TTL) or the visitor's session ends.
    The heatmap's page is made in the browser (ui/web/heatmap_export.py)."""
    folder = Path(tempfile.mkdtemp(prefix="run-", dir=session.workdir()))
    trace_path = folder / "routerlab-trace.json"
    trace_path.write_text(trace.to_json(one_step_per_line=True))
    exports.ledger().add(folder, session)
    return str(trace_path)
