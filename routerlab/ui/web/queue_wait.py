"""A visitor who would wait longer than the operator allows is told so at once, not held in the queue for minutes.

Generations (Explore's Generate and Regenerate, Compare) share one line of Gradio's queue (`concurrency_id="gen"`), at
most `ROUTERLAB_CONCURRENCY` running. Past that, a request waits in the line, silently, for as long as the ones
ahead take. `WaitGuard`, an ASGI middleware in front of Gradio's `queue/join` route, estimates a newcomer's wait
the way Gradio's own estimates do (`Queue.broadcast_estimations`): the requests ahead, each taking the line's mean time
so far, `concurrency` at a time. Past `ROUTERLAB_MAX_WAIT_S` it answers as Gradio answers a failed validation (422,
one entry per input): the page shows the message at the prompt box, `gradio_client` raises it. A request that would
start at once is never refused; before a first generation has ended there is no estimate and nothing is refused.
It is not an event `validator`: Gradio runs those through the inputs' preprocessing and the worker threads, so a bad
prompt became a bare HTTP 400 and, with every thread busy, joining waited for one.

`register(demo, WaitCap(...))` names the line of a Blocks; the guard finds the Blocks of each request (`scope["app"]`).
Reads Gradio's queue (`demo._queue`: its line per concurrency id and its mean process times), attributes Gradio keeps
for its estimates, read here and never written. Knows nothing about runs or models.
"""

from __future__ import annotations

import inspect
import json
import statistics
import weakref

import gradio as gr

from routerlab.ui.web.http_guard import answer, replay

LINE = "gen"
JOIN = "/gradio_api/queue/join"
_CAPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def register(demo: gr.Blocks, cap: "WaitCap") -> None:
    _CAPS[demo] = cap


class WaitCap:
    def __init__(self, demo: gr.Blocks, max_wait_s: float, line: str = LINE):
        self.demo = demo
        self.max_wait_s = max_wait_s
        self.line = line

    def ahead(self) -> tuple[int, int, int | None]:
        """(requests waiting in the line, running, the line's concurrency limit)."""
        queue = getattr(self.demo, "_queue", None)
        line = getattr(queue, "event_queue_per_concurrency_id", {}).get(self.line) if queue is not None else None
        if line is None:
            return 0, 0, None
        return len(line.queue), line.current_concurrency, line.concurrency_limit

    def mean_seconds(self) -> float | None:
        """The line's mean generation time so far (Gradio's own per-function means), None before any has ended."""
        queue = getattr(self.demo, "_queue", None)
        times = [t for fn, t in getattr(queue, "process_time_per_fn", {}).items()
                 if getattr(fn, "concurrency_id", None) == self.line and t.count]
        return statistics.fmean(t.avg_time for t in times) if times else None

    def expected_wait(self) -> float | None:
        """Seconds a request joining now waits before it starts; 0 when a slot is free; None: no estimate yet."""
        waiting, running, limit = self.ahead()
        if limit is None or (running < limit and not waiting):
            return 0.0
        mean = self.mean_seconds()
        if mean is None:
            return None
        return (waiting + 1) * mean / limit

    def refusal(self) -> str | None:
        """What a request joining the line now is told, or None: it may join."""
        wait = self.expected_wait()
        if wait is None or wait <= self.max_wait_s:
            return None
        waiting, _, _ = self.ahead()
        return (f"This server is busy: {waiting} request{'s' if waiting != 1 else ''} waiting and every slot taken, about "
                f"{_duration(wait)} before yours would start (this server makes no one wait more than {_duration(self.max_wait_s)}). "
                "Try again in a minute, or ask for fewer new tokens.")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def validation_answer(fn, message: str) -> bytes:
    """Gradio's answer to a failed validation (`Queue.push`'s "validator_error"): one entry per input of `fn`, the
    first (the prompt box) carrying `message`."""
    names = list(getattr(fn, "input_parameter_names", None) or [])
    if not names and getattr(fn, "fn", None) is not None:
        names = list(inspect.signature(fn.fn).parameters)
    n = len(getattr(fn, "inputs", ()) or ()) or 1
    entries = [{"__type__": "validate", "is_valid": k != 0, "message": message if k == 0 else "",
                "parameter_name": names[k] if k < len(names) else f"parameter_{k}"} for k in range(n)]
    return json.dumps({"detail": entries}).encode()


class WaitGuard:
    """ASGI middleware: a request joining a registered line is refused when its wait would pass the cap."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].rstrip("/").endswith(JOIN):
            return await self.app(scope, receive, send)
        blocks = _blocks(scope)
        cap = _CAPS.get(blocks) if blocks is not None else None
        if cap is None:
            return await self.app(scope, receive, send)
        body, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return
            body.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(body)
        fn = _fn_of(blocks, body)
        said = cap.refusal() if fn is not None and getattr(fn, "concurrency_id", None) == cap.line else None
        if said is not None:
            return await answer(send, 422, validation_answer(fn, said), b"application/json")
        await self.app(scope, replay(body, receive), send)


def _blocks(scope):
    app = scope.get("app")
    try:
        return app.get_blocks() if app is not None and hasattr(app, "get_blocks") else None
    except Exception:  # no Blocks mounted yet
        return None


def _fn_of(blocks, body: bytes):
    try:
        index = json.loads(body).get("fn_index")
    except (ValueError, AttributeError):
        return None
    fns = getattr(blocks, "fns", {})
    return fns.get(index) if isinstance(fns, dict) and isinstance(index, int) else None


def middleware():
    """The guard as FastAPI takes it (`demo.launch(app_kwargs={"middleware": [middleware()]})`)."""
    from starlette.middleware import Middleware

    return Middleware(WaitGuard)
