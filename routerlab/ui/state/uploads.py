"""Uploads bounded on disk: a budget per visitor and per server, and no uploads from another site's page.

Gradio stores whatever is POSTed to `.../gradio_api/upload` in its upload folder (`GRADIO_TEMP_DIR`) and keeps it up
to an hour; anyone may post, and a browser posts for any page it has open (a multipart form needs no CORS preflight).
`UploadGuard` is an ASGI middleware in front of that one route (`middleware(budget)` is what `demo.launch` takes, via
`app_kwargs`; see layout.launch_options). For each upload it:
  - refuses it (403) when its `Origin` header is present and is not the page's own origin (the `Host` it was sent to,
    the public URL in `GRADIO_ROOT_PATH`, the Space's `SPACE_HOST`, or one listed in `ROUTERLAB_ALLOWED_ORIGINS`);
  - makes room by deleting the visitor's own oldest uploads when the visitor is over their budget, then other
    visitors' uploads older than `KEEP_S` (5 s) when the server is over its budget, and refuses it (413 or 429, a readable
    body) when room cannot be made;
  - records the stored files (the route's JSON answer lists them) by visitor, to count and evict them later.
`discard(paths)` deletes uploads the app has read (a router set is read at once); the next upload forgets them.

A visitor is the client's address: the socket's peer, or, when the peer is a proxy the operator trusts
(`ROUTERLAB_TRUSTED_PROXIES`; on a Hugging Face Space, its own proxy in the private ranges), the last
`X-Forwarded-For` hop the trusted proxies did not add (the address the first of them saw). Gradio's browser client sends
no session hash with an upload (only a random `upload_id`), so the address is what is reliably there; a client that
forges the header, reaching the server directly, is still one visitor: its own share, never the others'. Knows nothing about what an upload holds, nor of Gradio beyond the route's
path and its answer.
"""

from __future__ import annotations

import dataclasses
import functools
import html
import ipaddress
import json
import logging
import os
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit


LOG = logging.getLogger(__name__)
ROUTE = "/gradio_api/upload"
# Another visitor's upload younger than this is never evicted (the app reads a router set within a second); older ones
# are, oldest first, before anyone is refused: a training text waiting for Start may go (Start then says to upload it
# again), where a minute's protection let a crowd's uploads lock everyone out for that minute.
KEEP_S = 5.0
MB = 2**20


@dataclasses.dataclass(frozen=True)
class UploadBudget:
    """What uploads may hold on disk at once (bytes, files), per visitor and for the whole server, and the origins
    besides the page's own that may upload. The defaults suit a free Hugging Face Space (see docs/operators.md)."""

    session_bytes: int = 40 * MB  # one upload at the 32 MB file cap, plus a router set or two
    session_files: int = 16  # a router set is 1-4 files; a training text 1
    total_bytes: int = 200 * MB  # five visitors' largest files at once; a small share of a Space's disk
    total_files: int = 256
    allowed_origins: tuple[str, ...] = ()  # "scheme://host[:port]", or "*" for any (embedding)
    trusted_proxies: tuple[str, ...] = ()  # addresses or networks ("10.0.0.0/8") whose X-Forwarded-For is believed

    @classmethod
    def from_env(cls) -> UploadBudget:
        from routerlab.ui.state.resources import _env_int as env_int  # the caps' one reading of a whole number

        d = cls()
        origins = [o.strip() for o in os.environ.get("ROUTERLAB_ALLOWED_ORIGINS", "").split(",") if o.strip()]
        return cls(session_bytes=env_int("ROUTERLAB_UPLOAD_SESSION_MB", d.session_bytes // MB) * MB,
                   session_files=env_int("ROUTERLAB_UPLOAD_SESSION_FILES", d.session_files),
                   total_bytes=env_int("ROUTERLAB_UPLOAD_TOTAL_MB", d.total_bytes // MB) * MB,
                   total_files=env_int("ROUTERLAB_UPLOAD_TOTAL_FILES", d.total_files),
                   allowed_origins=tuple(_origin(o) if o not in ("*", "null") else o for o in origins),
                   trusted_proxies=trusted_proxies())

    def describe(self) -> dict:
        return {"session_mb": round(self.session_bytes / MB, 2), "session_files": self.session_files,
                "total_mb": round(self.total_bytes / MB, 2), "total_files": self.total_files,
                "allowed_origins": list(self.allowed_origins), "trusted_proxies": list(self.trusted_proxies)}


PRIVATE = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "127.0.0.0/8", "fc00::/7", "::1/128")


def trusted_proxies() -> tuple[str, ...]:
    """The proxies whose `X-Forwarded-For` names the visitor: `ROUTERLAB_TRUSTED_PROXIES` (comma-separated addresses or
    networks; "none" for none), else on a Hugging Face Space (`SPACE_HOST` set: its proxy reaches the app from inside
    the private ranges) the private ranges, else none. A malformed entry is left out, with a warning."""
    raw = os.environ.get("ROUTERLAB_TRUSTED_PROXIES")
    if raw is None:
        return PRIVATE if os.environ.get("SPACE_HOST") else ()
    kept = []
    for entry in (e.strip() for e in raw.split(",")):
        if not entry or entry.lower() == "none":
            continue
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            LOG.warning("ROUTERLAB_TRUSTED_PROXIES: %r is not an address or a network; left out", entry)
            continue
        kept.append(entry)
    return tuple(kept)


def upload_folder() -> Path:
    """Gradio's upload folder, as its server computes it (`gradio.utils.get_upload_folder`)."""
    from gradio.utils import get_upload_folder

    return Path(get_upload_folder()).resolve()


def discard(paths, folder: Path | None = None) -> int:
    """Delete uploads the app has read: only files inside Gradio's upload folder (a path from elsewhere is left
    alone), and their folder when it is left empty. Returns how many were deleted; never raises."""
    folder = folder or upload_folder()
    gone = 0
    for p in paths or ():
        try:
            path = Path(p).resolve()
            if folder in path.parents and path.is_file():
                path.unlink()
                gone += 1
                if path.parent != folder:
                    path.parent.rmdir()  # OSError when another file is still there
        except (OSError, TypeError, ValueError):
            continue
    return gone


def _origin(url: str) -> str:
    """`scheme://host[:port]`, lower case, without a default port."""
    parts = urlsplit(url.strip())
    host = _host(parts.netloc)
    return f"{parts.scheme.lower()}://{host}" if parts.scheme and host else url.strip().lower()


def _host(netloc: str) -> str:
    netloc = netloc.strip().lower().rsplit("@", 1)[-1]
    for port in (":80", ":443"):
        if netloc.endswith(port):
            return netloc[: -len(port)]
    return netloc


def own_origins(budget: UploadBudget) -> set[str]:
    """Origins the operator configured as the app's own (beyond the `Host` of each request)."""
    own = set(budget.allowed_origins)
    root = os.environ.get("GRADIO_ROOT_PATH", "")
    if root.startswith(("http://", "https://")):
        own.add(_origin(root))
    if os.environ.get("SPACE_HOST"):  # a Hugging Face Space's own public host (its page's origin)
        own.add(_origin("https://" + os.environ["SPACE_HOST"]))
    return own


@dataclasses.dataclass
class _File:
    path: Path
    size: int
    visitor: str
    at: float


class Ledger:
    """The uploads on disk by visitor, oldest first, with the bytes of uploads still arriving (reserved). Thread-safe."""

    def __init__(self, budget: UploadBudget, folder: Path):
        self.budget = budget
        self.folder = folder
        self.files: list[_File] = []
        self.reserved: dict[int, tuple[str, int]] = {}  # request id -> (visitor, bytes)
        self.lock = threading.Lock()

    def _prune(self) -> None:
        self.files = [f for f in self.files if f.path.exists()]  # read and discarded, or swept by Gradio

    def _use(self, visitor: str | None = None) -> tuple[int, int]:
        files = [f for f in self.files if visitor is None or f.visitor == visitor]
        held = sum(b for v, b in self.reserved.values() if visitor is None or v == visitor)
        return sum(f.size for f in files) + held, len(files) + sum(1 for v, _ in self.reserved.values() if visitor is None or v == visitor)

    def _evict(self, victims) -> None:
        for f in list(victims):
            discard([f.path], self.folder)
            self.files.remove(f)

    def _fits(self, visitor: str | None, size: int, files: int) -> bool:
        used, count = self._use(visitor)
        limit_b, limit_f = (self.budget.session_bytes, self.budget.session_files) if visitor else (self.budget.total_bytes, self.budget.total_files)
        return used + size <= limit_b and count + files <= limit_f

    def _make_room(self, visitor: str | None, size: int, files: int, now: float, keep_s: float) -> bool:
        """Evict oldest first (a visitor's own: any age; for the server: anyone's older than keep_s) until it fits."""
        for f in [f for f in self.files if (f.visitor == visitor if visitor else now - f.at >= keep_s)]:
            if self._fits(visitor, size, files):
                break
            self._evict([f])
        return self._fits(visitor, size, files)

    def reserve(self, rid: int, visitor: str, size: int, keep_s: float = KEEP_S) -> str | None:
        """Room for an upload of `size` bytes, or why not ("session" or "server")."""
        with self.lock:
            self._prune()
            now = time.time()
            if not self._make_room(visitor, size, 1, now, keep_s):
                return "session"
            if not self._make_room(None, size, 1, now, keep_s):
                return "server"
            self.reserved[rid] = (visitor, size)
            return None

    def settle(self, rid: int, visitor: str, paths: list[Path], keep_s: float = KEEP_S) -> bool:
        """The upload arrived as `paths`: count them instead of the reservation; False (and the files deleted) when
        they alone are more files than the budget allows."""
        with self.lock:
            self.reserved.pop(rid, None)
            known = {f.path for f in self.files}
            new = [p for p in paths if p not in known and p.is_file()]
            now = time.time()
            for p in new:
                self.files.append(_File(p, p.stat().st_size, visitor, now))
            added = [f for f in self.files if f.path in set(new)]
            room = self._make_room_keeping(visitor, added, now, keep_s)
            if not room:
                self._evict(added)
            return room

    def _make_room_keeping(self, visitor: str, added: list[_File], now: float, keep_s: float) -> bool:
        """Evict older files (not `added`) until the counts fit again, as reserve does."""
        older = [f for f in self.files if f not in added]
        for scope, limit in ((visitor, self.budget.session_files), (None, self.budget.total_files)):
            pool = [f for f in older if (f.visitor == visitor if scope else now - f.at >= keep_s)]
            while self._use(scope)[1] > limit and pool:
                victim = pool.pop(0)
                older.remove(victim)
                self._evict([victim])
            if self._use(scope)[1] > limit:
                return False
        return True

    def release(self, rid: int) -> None:
        with self.lock:
            self.reserved.pop(rid, None)


def visitor_of(scope, trusted: tuple[str, ...] = ()) -> str:
    """The visitor an upload counts against: the socket's peer; where the peer is a `trusted` proxy, the last
    X-Forwarded-For hop that is not one too (what the first trusted proxy saw). A header from anyone else is ignored."""
    client = scope.get("client")
    peer = client[0] if client else "unknown"
    networks = _networks(trusted)
    if not _within(peer, networks):
        return peer
    hops: list[str] = []
    for name, value in scope.get("headers", ()):
        if name == b"x-forwarded-for":
            hops += [h.strip() for h in value.decode("latin-1").split(",") if h.strip()]
    for hop in reversed(hops):
        if not _within(hop, networks):
            return hop[:64]
    return hops[0][:64] if hops else peer


def visitor_of_request(request, trusted: tuple[str, ...] | None = None) -> str | None:
    """`visitor_of` for a handler's `gr.Request` (None without one: a direct call); `trusted`: the environment's."""
    client = getattr(request, "client", None) if request is not None else None
    if client is None:
        return None
    headers = getattr(request, "headers", None) or {}
    forwarded = headers.get("x-forwarded-for") if hasattr(headers, "get") else None
    scope = {"client": (getattr(client, "host", None) or "unknown", 0),
             "headers": [(b"x-forwarded-for", forwarded.encode("latin-1", "replace"))] if forwarded else []}
    return visitor_of(scope, trusted_proxies() if trusted is None else trusted)


@functools.lru_cache(maxsize=8)
def _networks(trusted: tuple[str, ...]) -> tuple:
    return tuple(ipaddress.ip_network(t, strict=False) for t in trusted)


def _within(address: str, networks: tuple) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return False
    return any(ip.version == n.version and ip in n for n in networks)


class UploadGuard:
    """ASGI middleware: the origin check and the disk budget in front of Gradio's upload route (module docstring)."""

    def __init__(self, app, budget: UploadBudget | None = None, keep_s: float = KEEP_S):
        self.app = app
        self.budget = budget or UploadBudget.from_env()
        self.ledger = Ledger(self.budget, upload_folder())
        self.keep_s = keep_s
        self._next = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].rstrip("/").endswith(ROUTE):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())}
        refusal = self._foreign(headers)
        if refusal:
            return await _refuse(receive, send, 403, refusal)
        try:
            size = int(headers.get("content-length", ""))
        except ValueError:
            return await _refuse(receive, send, 411, "Upload refused: the request must say its length (Content-Length).")
        visitor = visitor_of(scope, self.budget.trusted_proxies)
        if size > self.budget.session_bytes:
            return await _refuse(receive, send, 413, f"Upload refused: it is {_size(size)}, and one visitor may keep at most "
                                            f"{_size(self.budget.session_bytes)} of uploads on this server. Upload a smaller file.")
        self._next += 1
        rid = self._next
        why = self.ledger.reserve(rid, visitor, size, self.keep_s)
        if why == "session":
            return await _refuse(receive, send, 429, f"Upload refused: your uploads still arriving fill your share of this server's "
                                            f"upload space ({_size(self.budget.session_bytes)}). Wait for them, then try again.")
        if why == "server":
            return await _refuse(receive, send, 429, f"Upload refused: this server's upload space ({_size(self.budget.total_bytes)}) "
                                            f"is full of other visitors' uploads of the last few seconds. Try again in a moment.", {"retry-after": "10"})
        await self._forward(scope, receive, send, rid, visitor)

    async def _forward(self, scope, receive, send, rid: int, visitor: str):
        start, body = None, []

        async def keep(message):  # the answer is a short JSON list of paths: held until the files are counted
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                body.append(message.get("body", b""))
        try:
            await self.app(scope, receive, keep)
        except BaseException:
            self.ledger.release(rid)
            raise
        if start is None or start["status"] != 200:
            self.ledger.release(rid)  # refused by Gradio (a file over ROUTERLAB_MAX_UPLOAD_MB: 413), nothing stored
        else:
            paths = _stored(b"".join(body))  # settled: the files counted instead of the reservation
            if not self.ledger.settle(rid, visitor, paths, self.keep_s):
                return await _answer(send, 413, f"Upload refused: it holds {len(paths)} files, more than the "
                                                f"{self.budget.session_files} one visitor may keep on this server.")
        if start is None:
            return await _answer(send, 500, "Upload failed.")
        await send(start)
        await send({"type": "http.response.body", "body": b"".join(body)})

    def _foreign(self, headers: dict) -> str | None:
        """Why an upload's Origin is refused, or None (no Origin: not a browser's cross-site request)."""
        origin = headers.get("origin")
        if origin is None or "*" in self.budget.allowed_origins:
            return None
        seen = _origin(origin)
        if seen in own_origins(self.budget) or (seen != "null" and _host(urlsplit(seen).netloc) == _host(headers.get("host", ""))):
            return None
        LOG.warning("RouterLab: refused an upload from the page at %r (this app's host: %r); to embed the app there, "
                    "list that origin in ROUTERLAB_ALLOWED_ORIGINS", origin[:100], headers.get("host", "")[:100])
        return (f"Upload refused: it was sent from another site's page ({html.escape(origin[:100])}), not from this app's. "
                "An operator who embeds the app there lists that origin in ROUTERLAB_ALLOWED_ORIGINS; behind a proxy that "
                "rewrites Host, set GRADIO_ROOT_PATH to the app's public URL.")


def _size(n: int) -> str:
    return f"{n / MB:.0f} MB" if n >= 10 * MB else f"{n / MB:.1f} MB" if n >= MB else f"{max(1, round(n / 1024))} KB"


def _stored(body: bytes) -> list[Path]:
    """The paths Gradio's upload route answered with (a JSON list of strings)."""
    try:
        data = json.loads(body)
    except ValueError:
        return []
    return [Path(p).resolve() for p in data if isinstance(p, str)] if isinstance(data, list) else []


DRAIN = 64 * MB  # a refused upload's body is read (not stored) up to this, so the client reads the answer, not a reset


async def _refuse(receive, send, status: int, text: str, extra: dict | None = None) -> None:
    """Answer `status` with `text` after reading the request's body (discarded): a client still sending gets the
    answer instead of a closed connection."""
    seen = 0
    while seen <= DRAIN:
        message = await receive()
        if message["type"] != "http.request":
            return
        seen += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    await _answer(send, status, text, extra)


async def _answer(send, status: int, text: str, extra: dict | None = None) -> None:
    headers = [(b"content-type", b"text/plain; charset=utf-8")] + [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
    body = text.encode()
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def middleware(budget: UploadBudget | None = None, keep_s: float = KEEP_S):
    """The guard as FastAPI takes it (`demo.launch(app_kwargs={"middleware": [middleware()]})`)."""
    from starlette.middleware import Middleware

    return Middleware(UploadGuard, budget=budget or UploadBudget.from_env(), keep_s=keep_s)
