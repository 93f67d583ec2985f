"""A router set to take away and bring back: its extras (report, curves, model card), a zip, and a safe upload.

`write_extras` adds to a checkpoint folder what a trained set carries besides its weights: `report.json`,
`train_log.jsonl`, `curves.png` (drawn with Pillow, which Gradio already needs) and a `README.md` model card
with the Hugging Face Hub's YAML front matter, so the folder can be pushed to the Hub as is. `zip_folder`
packs it. `read_upload` takes a visitor's zip (or loose files) back: member by member into a fresh temporary
folder, refusing absolute paths, `..`, links, too many members, a member over its own cap (MEMBER_BYTES: a
router.json of megabytes would be kept in memory with the set) or all over MAX_BYTES, and a member that cannot be
read (a header that lies, a bad checksum); then the folder is validated like any checkpoint
(checkpoint.load_routers). Its messages name files, never the server's folders. Nothing is executed or
unpickled: safetensors and JSON only.
"""

from __future__ import annotations

import json
import shutil
import stat
import tempfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from routerlab.core.base.errors import RouterLabError, quote
from routerlab.tuning.checkpoint import CONFIG, WEIGHTS

MEMBERS = (CONFIG, WEIGHTS, "report.json", "README.md", "curves.png", "train_log.jsonl")
MAX_MEMBERS = 32
MAX_BYTES = 32 * 2**20  # uncompressed, all members together (a router set is ~100 KB; with stand-ins a few MB)
# Each member's own cap, uncompressed, 10-100x what the app writes: router.json ~6 KB (parsed, and kept with the set
# in memory), report.json ~3 KB, a 10,000-step train_log.jsonl ~7 MB, curves.png ~50 KB; the weights may take all.
MEMBER_BYTES = {CONFIG: 64 * 2**10, "report.json": 1 * 2**20, "README.md": 512 * 2**10, "curves.png": 4 * 2**20,
                "train_log.jsonl": 8 * 2**20, WEIGHTS: MAX_BYTES}


# -- taking a set away ----------------------------------------------------------------------------
def write_extras(folder: Path, report: dict, log_rows: list[dict], model_name: str) -> None:
    folder = Path(folder)
    (folder / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (folder / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log_rows))
    if log_rows:
        curves_png(log_rows, folder / "curves.png", f"Router-Tuning {report.get('granularity', '')}, {model_name}")
    (folder / "README.md").write_text(model_card(report, model_name))


def model_card(report: dict, model_name: str) -> str:
    """README.md with Hub front matter: base model, library, tags, training settings, held-out figures."""
    s = report.get("settings", {})
    rows = report.get("heldout", {}).get("rows", {})
    from routerlab.core.model.models import EMBEDDED_HUB_ID, EMBEDDED_NAME

    base = EMBEDDED_HUB_ID if model_name == EMBEDDED_NAME else model_name
    front = ["---", f"base_model: {base}", "library_name: routerlab", "tags:", "- router-tuning", "- dynamic-depth",
             "- layer-skipping", f"- {report.get('granularity', '')}", "---", ""]
    table = ["| | threshold | skipped (routed cells) | skipped (all layers) | perplexity rise | KL to full |",
             "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        table.append(f"| {name} | {r['threshold']} | {r['skip_rate']:.1%} | {r['skip_rate_all_layers']:.1%} | "
                     f"{r['perplexity_increase']:+.2%} | {r['kl_full']:.4f} |")
    body = [
        f"# Router-Tuning routers for {model_name}: {report.get('granularity', '')}", "",
        f"Tiny per-layer routers ({len(report.get('layers', []))} routed layers, one linear score each) trained with "
        "RouterLab on a frozen base model: only the routers learned. Load with "
        "`python -m routerlab generate --routers <this folder or OWNER/NAME>` or the app's Train tab (upload).", "",
        "## Training", "",
        f"- data: {report.get('data', '')}",
        f"- steps: {report.get('steps')} in {report.get('seconds')} s ({'stopped early' if report.get('stopped') else 'time budget'})",
        f"- skip target {s.get('skip', 0):.0%} of routed cells, learning rate {s.get('lr')}, distillation weight "
        f"{s.get('kd_weight')}, LM weight {s.get('lm_weight')}, batch {s.get('batch_size')}, up to {s.get('max_tokens')} tokens",
        f"- routed layers: {report.get('layers')}", "",
    ]
    if report.get("calibrated") is False:  # stopped before (or while) it was calibrated and compared: kept as it was
        body += ["## Not calibrated, not compared", "",
                 "Training was stopped before the set was calibrated and measured on its held-out slice. Threshold 0.5 is "
                 "the training gate on the raw scores; higher skips more. `kv` KV policy.", ""]
    else:
        body += [f"## On the held-out slice ({report.get('heldout', {}).get('examples', 0)} examples, never trained on)", "",
                 *table, "",
                 "Threshold 0.5 is the training gate (calibrated scale); higher skips more. `kv` KV policy.", ""]
    return "\n".join(front + body)


def curves_png(rows: list[dict], path: Path, title: str) -> Path:
    """Two panels (losses; skip share and its target) per step, as a PNG."""
    from PIL import Image, ImageDraw

    w, h, pad = 1000, 420, 50
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    d.text((pad, 12), title, fill="black")
    steps = [r["step"] for r in rows]
    panels = [("losses", [("kd", "#d9480f"), ("lm", "#1c7ed6"), ("budget", "#6c757d")]),
              ("skip share (training gate)", [("skip", "#2b8a3e"), ("skip target", "#868e96")])]
    series = {k: [r.get(k) for r in rows] for k in ("kd", "lm", "budget", "skip")}
    series["skip target"] = [1 - r["target"] for r in rows]
    pw = (w - 3 * pad) // 2
    for n, (name, keys) in enumerate(panels):
        x0, y0, x1, y1 = pad + n * (pw + pad), 60, pad + n * (pw + pad) + pw, h - pad
        d.rectangle([x0, y0, x1, y1], outline="#adb5bd")
        d.text((x0, y0 - 16), name, fill="black")
        values = [v for k, _ in keys for v in series[k] if isinstance(v, (int, float))]
        if not values:
            continue
        lo, hi = min(0.0, min(values)), max(values) or 1.0
        d.text((x0 + 4, y0 + 4), f"{hi:.3g}", fill="#495057")
        d.text((x0 + 4, y1 - 14), f"{lo:.3g}", fill="#495057")
        d.text((x1 - 30, y1 + 6), f"step {steps[-1]}", fill="#495057")
        for k, (key, color) in enumerate(keys):
            pts = [(x0 + (x1 - x0) * (s - steps[0]) / max(1, steps[-1] - steps[0]), y1 - (y1 - y0) * (v - lo) / (hi - lo or 1))
                   for s, v in zip(steps, series[key]) if isinstance(v, (int, float))]
            if len(pts) > 1:
                d.line(pts, fill=color, width=2)
            d.text((x1 - 90, y0 + 6 + 14 * k), key, fill=color)
    img.save(path)
    return Path(path)


def zip_folder(folder: Path, out: Path) -> Path:
    """The set's files (MEMBERS that exist) in a zip under one folder named like `out`'s stem."""
    out = Path(out)
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name in MEMBERS:
            if (Path(folder) / name).is_file():
                z.write(Path(folder) / name, f"{out.stem}/{name}")
    return out


# -- bringing one back -----------------------------------------------------------------------------
def _member_name(info: zipfile.ZipInfo) -> str | None:
    """The file name a zip member lands as (a known checkpoint file at the top or under one folder), or None to skip it.
    Refuses what could write outside the folder or is not a plain file."""
    name = info.filename
    said = quote(name)  # the member's own name, as the visitor's zip holds it (the page escapes it)
    if name.startswith(("/", "\\")) or ":" in name.split("/")[0] or "\\" in name:
        raise RouterLabError(f"The zip holds an absolute or Windows path ({said}).", "Zip the router set's files themselves.", quoted=(said,))
    parts = PurePosixPath(name).parts
    if ".." in parts:
        raise RouterLabError(f"The zip holds a path that leaves its folder ({said}).", "Zip the router set's files themselves.", quoted=(said,))
    if stat.S_ISLNK(info.external_attr >> 16):
        raise RouterLabError(f"The zip holds a link ({said}); only plain files are read.", "Zip the files, not links to them.", quoted=(said,))
    if info.is_dir() or len(parts) > 2:
        return None
    return parts[-1] if parts[-1] in MEMBERS else None


def unpack_zip(path: Path, dest: Path) -> Path:
    """The known checkpoint files of zip `path`, read member by member into `dest` (capped)."""
    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        raise RouterLabError(f"{Path(path).name} is not a readable zip file.", "Upload the zip the app's Download button made.") from None
    with z:
        infos = z.infolist()
        if len(infos) > MAX_MEMBERS:
            raise RouterLabError(f"The zip holds {len(infos)} entries; a router set has at most {len(MEMBERS)} files.",
                                 "Zip only the router set's folder.")
        total = 0
        for info in infos:
            name = _member_name(info)
            if name is None:
                continue
            if (dest / name).exists():
                raise RouterLabError(f"The zip holds {name} twice.", "Zip one router set at a time.")
            _member_fits(name, info.file_size)
            total += info.file_size
            if total > MAX_BYTES:
                raise RouterLabError(f"The zip unpacks to more than {MAX_BYTES // 2**20} MB.", "A router set is far smaller: zip only its files.")
            try:
                with z.open(info) as src, open(dest / name, "wb") as out:
                    left, size = MAX_BYTES - (total - info.file_size), 0
                    while chunk := src.read(1 << 16):  # the declared size can lie: count what comes out
                        left, size = left - len(chunk), size + len(chunk)
                        _member_fits(name, size)
                        if left < 0:
                            raise RouterLabError(f"The zip unpacks to more than {MAX_BYTES // 2**20} MB.", "A router set is far smaller.")
                        out.write(chunk)
            except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as err:
                # a header that lies about a size or offset, a bad checksum, an unknown compression, a password
                raise RouterLabError(f"{Path(path).name} is damaged: its {name} cannot be read ({_reason(err)}).",
                                     "Upload the zip the app's Download button made, or zip the set's files again.") from None
    return dest


def _member_fits(name: str, size: int) -> None:
    cap = MEMBER_BYTES.get(name, MAX_BYTES)
    if size > cap:
        raise RouterLabError(f"The upload's {name} is larger than {_size(cap)}; a router set's {name} is far smaller.",
                             "Upload the set the app's Download button made (or `python -m routerlab train` wrote).")


def _size(n: int) -> str:
    return f"{n // 2**20} MB" if n >= 2**20 else f"{n // 2**10} KB"


def _reason(err: Exception) -> str:
    """An exception's message, short and without paths (zipfile's name members, never the server's folders)."""
    text = str(err).split(":")[0].strip()[:80]
    return text or type(err).__name__


def read_upload(paths: list[str | Path], model, root: Path) -> tuple[Path, object, dict]:
    """A visitor's upload (one zip, or the set's loose files) as a validated checkpoint folder under `root`.

    Returns (folder, routers, config); a RouterLabError that says what to fix otherwise (the folder is removed)."""
    from routerlab.tuning.checkpoint import load_routers

    paths = [Path(p) for p in paths or []]
    if not paths:
        raise RouterLabError("Nothing was uploaded.", "Choose a router-set zip, or its router.json and routers.safetensors.")
    dest = Path(tempfile.mkdtemp(prefix="upload-", dir=root))
    try:
        if len(paths) == 1 and paths[0].suffix.lower() == ".zip":
            unpack_zip(paths[0], dest)
        else:
            if sum(p.stat().st_size for p in paths) > MAX_BYTES:
                raise RouterLabError(f"The files are larger than {MAX_BYTES // 2**20} MB together.", "A router set is far smaller.")
            for p in paths:
                if p.name in MEMBERS:
                    _member_fits(p.name, p.stat().st_size)
                    shutil.copyfile(p, dest / p.name)
        missing = [n for n in (CONFIG, WEIGHTS) if not (dest / n).is_file()]
        if missing:
            raise RouterLabError(f"The upload has no {' and no '.join(missing)}.",
                                 f"A router set needs {CONFIG} and {WEIGHTS} (the app's Download gives both in one zip).")
        try:
            routers, config = load_routers(dest, model)
        except RecursionError:  # json.loads recurses once per level of nesting
            raise RouterLabError(f"The upload's {CONFIG} is nested too deeply to be a router config.",
                                 "Upload the set the app's Download button made.") from None
        except RouterLabError as err:  # checkpoint's messages name the folder: a visitor sees file names only
            raise RouterLabError(_no_folder(err.problem, dest), err.fix and _no_folder(err.fix, dest)) from None
        return dest, routers, config
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def _no_folder(text: str, folder: Path) -> str:
    return text.replace(f"{folder}/", "").replace(str(folder), "the upload")
