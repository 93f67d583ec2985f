"""The upload flood: what strangers' uploads can do to the server's disk (as the fault phase runs it).

Owns `upload_flood_test`: ten 31 MB uploads in a row from one visitor, then one each from ten visitors (told apart by
`X-Forwarded-For`, as a proxy in front of a Space tells them apart), an upload sent from another site's page (`Origin:
http://evil.example`) and one from the app's own page; it measures how much the upload folder grew and checks that the
server still serves. Knows nothing about how the server was started, nor how the guard works (ui/state/uploads.py): only
its budget, which the server reports.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import urlsplit

MB = 2**20


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def _post(url: str, blob: bytes, visitor: str, origin: str | None = None, timeout: float = 120.0):
    import httpx

    headers = {"x-forwarded-for": visitor, **({"origin": origin} if origin else {})}
    data = f"{visitor} {time.time_ns()}\n".encode() + blob  # distinct contents: Gradio stores equal files once
    try:
        r = httpx.post(url.rstrip("/") + "/gradio_api/upload", files=[("files", ("flood.bin", data))], headers=headers, timeout=timeout)
    except httpx.HTTPError as err:
        return None, f"{type(err).__name__}: {err}"[:160]
    return r.status_code, r.text[:200]


def _burst(url: str, blob: bytes, visitors: list[str], folder: Path) -> dict:
    before, t0 = folder_bytes(folder), time.perf_counter()
    answers = [_post(url, blob, v) for v in visitors]
    codes = [c for c, _ in answers]
    refusals = sorted({text for c, text in answers if c != 200})
    return {"uploads": len(visitors), "accepted": codes.count(200), "codes": codes, "refusals": refusals[:3],
            "seconds": round(time.perf_counter() - t0, 2), "folder_growth_mb": round((folder_bytes(folder) - before) / MB, 1)}


def upload_flood_test(url: str, folder: Path, budget: dict, size: int = 31 * MB, n: int = 10, serving=None, log=print) -> dict:
    """The flood against a server with the upload `budget` ({"session_mb", "total_mb", ...}, as the server reports
    it) whose upload folder is `folder`. `serving()`: True when the app still answers (default: GET /config)."""
    import httpx

    blob = os.urandom(size)
    one = _burst(url, blob, ["10.50.0.1"] * n, folder)
    many = _burst(url, blob, [f"10.50.1.{k}" for k in range(n)], folder)
    own = "{0.scheme}://{0.netloc}".format(urlsplit(url))
    foreign_code, foreign_text = _post(url, b"x" * 1024, "10.50.2.1", origin="http://evil.example")
    own_code, own_text = _post(url, b"x" * 1024, "10.50.2.2", origin=own)
    serving = serving or (lambda: httpx.get(url.rstrip("/") + "/config", timeout=60).status_code == 200)
    out = {"budget": budget, "upload_mb": round(size / MB, 1), "one_visitor": one, "ten_visitors": many,
           "cross_origin": {"code": foreign_code, "answer": foreign_text}, "same_origin": {"code": own_code, "answer": own_text},
           "serving_after": bool(serving())}
    out["folder_growth_mb"] = round(one["folder_growth_mb"] + many["folder_growth_mb"], 1)
    out["ok"] = (one["folder_growth_mb"] <= budget["session_mb"] and out["folder_growth_mb"] <= budget["total_mb"]
                 and one["accepted"] >= 1 and foreign_code == 403 and own_code == 200 and out["serving_after"])
    if log:
        log(f"[faults] upload flood: one visitor {one['accepted']}/{n} accepted, folder +{one['folder_growth_mb']} MB "
            f"(budget {budget['session_mb']} MB); ten visitors {many['accepted']}/{n}, +{many['folder_growth_mb']} MB "
            f"(budget {budget['total_mb']} MB); cross-origin {foreign_code}, same-origin {own_code}; serving after: {out['serving_after']}")
    return out
