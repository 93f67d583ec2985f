"""The stream driver: decode in a worker thread, hand the UI consistent snapshots at its own pace.

Owns `Decoder` (runs engine step iterators to the end in a daemon thread) and `snapshot`, and the
frame rates of text and heatmap updates. Knows nothing about Gradio, sessions, plots or tensors:
it only advances iterators and copies the step list of a `Trace`.
"""

from __future__ import annotations

import threading
import time
from typing import Iterator

from routerlab.core.trace import Trace

# Streaming frame rates. Every frame costs Python time in this process, and Python time here is
# GIL time the decoder thread waits for; in the browser each heatmap frame is a plotly redraw, CPU a
# laptop's decoder also needs (docs/method.md, "Streaming overhead"): keep frames few and cheap.
HEATMAP_INTERVAL = 2.0  # seconds between heatmap (and quality strip) redraws while streaming (a redraw: ~0.15 s of browser main thread)
TEXT_INTERVAL = 0.5  # seconds between text updates while streaming


class Decoder:
    """Runs engine step iterators to the end in a worker thread, so drawing never pauses decoding.

    The engine appends every Step to its Control's Trace itself; the UI only reads consistent
    snapshots of those traces at its own pace (`frames`). Several iterators are advanced in turn,
    one step each, the first one rotating every round, so runs that share the machine (Compare)
    are timed under the same load.
    """

    def __init__(self, iterators: list[Iterator]):
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._drain, args=(list(iterators),), name="routerlab-decode", daemon=True)
        self._thread.start()

    def _drain(self, live: list[Iterator]) -> None:
        try:
            turn = 0
            while live:
                k = turn % len(live)  # who goes first rotates, so no run always follows the same one
                for it in live[k:] + live[:k]:
                    if next(it, None) is None:
                        live.remove(it)
                turn += 1
        except BaseException as err:  # reported by raise_error() in the UI thread
            self.error = err
        finally:
            self.done.set()

    def frames(self, traces: list[Trace], text_every: float | None = None, plot_every: float | None = None) -> Iterator[tuple[list[Trace], bool]]:
        """Yield (snapshots, draw_plot) when a trace grew: at most every `text_every` s for text, and
        draw_plot=True at most every `plot_every` s when it grew since the last plot.

        The last frame, after decoding ended, always has draw_plot=True.
        """
        text_every = TEXT_INTERVAL if text_every is None else text_every
        plot_every = HEATMAP_INTERVAL if plot_every is None else plot_every
        next_text = next_plot = time.perf_counter()
        text_seen = plot_seen = 0
        while True:
            now = time.perf_counter()
            ahead = [t for t in (next_text, next_plot) if t > now]
            # sleep until the next frame may be due; poll gently while one is due but nothing new arrived
            finished = self.done.wait(min(ahead) - now if ahead else 0.02)  # never spin: the decoder needs the GIL
            now = time.perf_counter()
            snaps = [snapshot(t) for t in traces]
            size = sum(len(t.steps) for t in snaps)
            if finished:
                yield snaps, True
                return
            draw = size != plot_seen and now >= next_plot
            if not draw and (size == text_seen or now < next_text):
                continue
            text_seen, next_text = size, now + text_every
            if draw:
                plot_seen, next_plot = size, now + plot_every
            yield snaps, draw

    def raise_error(self) -> None:
        self._thread.join(timeout=5.0)
        if self.error is not None:
            raise self.error


def snapshot(trace: Trace) -> Trace:
    """A consistent view of a trace another thread is still appending to: the steps so far (a step's
    `kl_full` and full-model top token may still be filled in later by the quality pass; nothing else
    of a step changes once appended)."""
    return Trace(trace.n_layers, trace.steps[: len(trace.steps)], trace.meta)
