"""What every HTTP request to the app passes before Gradio sees it: a body cap, file fields that take uploads only,
the page's framing headers, and plotly.js served once for the page's own exports.

`PageGuard` is an ASGI middleware (`middleware(...)` is what `demo.launch` takes, via `app_kwargs`; see
layout.launch_options). For each request it:
  - refuses a body larger than `body_limit` (413, read and discarded, never held): its `Content-Length`, or the bytes
    a chunked body has sent so far. Gradio's upload route is left to its own caps and ui/state/uploads.py's guard;
  - refuses (400) a JSON body in which a file field (Gradio's `FileData`: `meta._type == "gradio.FileData"`) names a
    URL: Gradio would fetch it into its cache, with no size cap, outside the upload budget. A page only sends paths its
    own uploads returned;
  - adds `X-Frame-Options` and a `Content-Security-Policy: frame-ancestors` to every answer (the page may be framed
    only by itself and the origins the operator lists in `ROUTERLAB_ALLOWED_ORIGINS`), and `X-Content-Type-Options`;
  - answers `GET .../routerlab/plotly.min.js` with the plotly.js of the installed plotly package: the page builds its
    standalone heatmap file in the browser on the download click (layout.EXPORT_HEATMAP_JS), so the server keeps no
    ~5 MB page per run.
Knows nothing about the app's components or runs.
"""

from __future__ import annotations

import json
import logging
from functools import lru_cache

LOG = logging.getLogger(__name__)
MB = 2**20
PLOTLY_ROUTE = "/routerlab/plotly.min.js"
UPLOAD_ROUTE = "/gradio_api/upload"
FILE_DATA = "gradio.FileData"


def body_limit(training_max_chars: int) -> int:
    """The largest request body the app needs: a training text at its cap, 4 bytes a character in JSON, and 1 MB for
    the rest of the request (a prompt is at most 16,000 characters)."""
    return 4 * max(0, int(training_max_chars)) + MB


@lru_cache(maxsize=1)
def plotly_js() -> bytes:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().encode()


def url_in_file_field(value) -> str | None:
    """The first URL a `FileData` in `value` (a request's decoded JSON) names as its `path`, or None."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            meta = v.get("meta")
            path = v.get("path")
            if isinstance(meta, dict) and meta.get("_type") == FILE_DATA and isinstance(path, str) and "://" in path:
                return path
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return None


def frame_headers(allowed_origins: tuple[str, ...]) -> list[tuple[bytes, bytes]]:
    """The framing headers for a page that the listed origins may embed ("*": any page may)."""
    if "*" in allowed_origins:
        return [(b"x-content-type-options", b"nosniff")]
    ancestors = " ".join(["'self'", *(o for o in allowed_origins if o != "null")])
    headers = [(b"content-security-policy", f"frame-ancestors {ancestors}".encode()), (b"x-content-type-options", b"nosniff")]
    if len(ancestors.split()) == 1:  # X-Frame-Options can say only "this origin"; with others listed, the CSP says it
        headers.append((b"x-frame-options", b"SAMEORIGIN"))
    return headers


class PageGuard:
    """ASGI middleware: the body cap, uploads-only file fields, the framing headers and plotly.js (module docstring)."""

    def __init__(self, app, limit: int, allowed_origins: tuple[str, ...] = ()):
        self.app = app
        self.limit = limit
        self.headers = frame_headers(allowed_origins)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"].rstrip("/")
        if scope["method"] in ("GET", "HEAD") and path.endswith(PLOTLY_ROUTE):
            return await answer(send, 200, plotly_js(), b"text/javascript; charset=utf-8",
                                 self.headers + [(b"cache-control", b"public, max-age=86400")], head=scope["method"] == "HEAD")
        send = self._with_headers(send)
        if scope["method"] not in ("POST", "PUT", "PATCH") or path.endswith(UPLOAD_ROUTE):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        try:
            declared = int(headers.get("content-length", "0") or 0)
        except ValueError:
            return await _refuse(receive, send, 400, "Request refused: its Content-Length is not a number.")
        if declared > self.limit:
            return await _refuse(receive, send, 413, self._too_large(declared))
        body, more = [], True
        size = 0
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return await _refuse(receive, send, 413, self._too_large(size), drained=not message.get("more_body"))
            body.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(body)
        if "json" in headers.get("content-type", "") or body[:1] in (b"{", b"["):
            try:
                url = url_in_file_field(json.loads(body))
            except ValueError:
                url = None  # not JSON after all: Gradio answers it as it does
            if url is not None:
                LOG.warning("RouterLab: refused a file field that names a URL (%r)", url[:100])
                return await answer(send, 400, _detail("Request refused: a file field takes a file uploaded to this app "
                                                        "(its upload route's answer), not a URL. Upload the file, then send "
                                                        "the path the upload returned."), b"application/json")
        await self.app(scope, replay(body, receive), send)

    def _too_large(self, size: int) -> str:
        return (f"Request refused: its body is {size / MB:.1f} MB, more than the {self.limit / MB:.0f} MB this app "
                "takes (ROUTERLAB_TRAINING_MAX_CHARS sets it). Send less text, or upload it as a file.")

    def _with_headers(self, send):
        async def sending(message):
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", ())}
                extra = [(k, v) for k, v in self.headers if k not in names]
                if extra:
                    message = {**message, "headers": list(message.get("headers", ())) + extra}
            await send(message)
        return sending


def replay(body: bytes, receive):
    """A `receive` for the app behind a guard that read the request's `body`: the body once, then the client's own
    messages (its disconnect, when it comes)."""
    sent = False

    async def again():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return again


def _detail(text: str) -> bytes:
    return json.dumps({"detail": text}).encode()


DRAIN = 64 * MB  # a refused body is read (not kept) up to this, so the client reads the answer, not a reset


async def _refuse(receive, send, status: int, text: str, drained: bool = False) -> None:
    seen = 0
    while not drained and seen <= DRAIN:
        message = await receive()
        if message["type"] != "http.request":
            break
        seen += len(message.get("body", b""))
        drained = not message.get("more_body")
    await answer(send, status, _detail(text), b"application/json")


async def answer(send, status: int, body: bytes, kind: bytes, headers: list | None = None, head: bool = False) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": b"" if head else body})


def middleware(limit: int, allowed_origins: tuple[str, ...] = ()):
    """The guard as FastAPI takes it (`demo.launch(app_kwargs={"middleware": [middleware(...)]})`)."""
    from starlette.middleware import Middleware

    return Middleware(PageGuard, limit=limit, allowed_origins=allowed_origins)
