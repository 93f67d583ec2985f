"""docs/results.md's "History of measurements": the runs behind the method's choices, from assets/bench/history.json.

history.json is committed by hand, not written by a benchmark: {"about": text, "entries": [entry, ...]}. An entry is
{"title", "day", "machine", "commands": [command, ...], "result_files": [path from the repository root, ...],
"figures": [statement or {"table": {"columns": [...], "rows": [[...], ...], "caption": optional}}, ...], "concluded"},
with "kept" (how far its output was kept: "one-off, not kept", ...) and "how" (how it was measured) where the record
says. A missing file or a malformed entry gives a line that says so, never a traceback. Reads JSON only.
"""

from __future__ import annotations

from pathlib import Path

from routerlab.bench.results.report_cells import READ_ERRORS, _read
from routerlab.core.base.paths import ROOT

HISTORY = "history.json"  # in the benchmark folder, beside the files the other sections read
TITLE = "History of measurements"
REQUIRED = ("title", "day", "machine", "commands", "result_files", "figures", "concluded")


def _text(entry: dict, key: str) -> str:
    value = entry[key]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"`{key}` must be a non-empty string")
    return " ".join(value.split())


def _strings(entry: dict, key: str) -> list[str]:
    value = entry[key]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError(f"`{key}` must be a list of non-empty strings")
    return value


def _row(cells: list) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def table_markdown(table: dict) -> list[str]:
    """A figure that is a table: its caption, then the table; every row must have one cell per column."""
    columns, rows = table["columns"], table["rows"]
    if not isinstance(columns, list) or not columns or not isinstance(rows, list) or not rows:
        raise ValueError("a table needs a list of columns and a list of rows")
    for n, row in enumerate(rows, 1):
        if not isinstance(row, list) or len(row) != len(columns):
            raise ValueError(f"row {n} of a table has {len(row) if isinstance(row, list) else 'no'} cells for {len(columns)} columns")
    caption = [" ".join(table["caption"].split()), ""] if table.get("caption") else []
    return [*caption, _row(columns), "|" + "---|" * len(columns), *(_row(r) for r in rows)]


def _file(path: str) -> str:
    """A result file as a link from docs/results.md (paths are the repository's); one that is not there says so."""
    exists = (ROOT / path).is_file()
    return f"[`{path}`](../{path})" if exists else f"`{path}` (not in the repository)"


def entry_markdown(entry: dict) -> list[str]:
    """One entry: its heading, when and where, the commands that rerun it, its result files, its figures, the conclusion."""
    if not isinstance(entry, dict):
        raise TypeError("an entry must be a JSON object")
    missing = [k for k in REQUIRED if k not in entry]
    if missing:
        raise KeyError(", ".join(missing))
    commands, files = _strings(entry, "commands"), _strings(entry, "result_files")
    figures = entry["figures"]
    if not isinstance(figures, list) or not figures:
        raise ValueError("`figures` must be a non-empty list")
    out = [f"### {_text(entry, 'title')}", "",
           f"- When: {_text(entry, 'day')}. Machine: {_text(entry, 'machine')}.",
           "- Rerun: " + ("; ".join(f"`{c}`" for c in commands) if commands else "no command recorded") + ".",
           f"- Result file{'s' if len(files) > 1 else ''}: " + (", ".join(_file(f) for f in files) if files else "none committed") + "."]
    if "kept" in entry:
        out.append(f"- Kept: {_text(entry, 'kept')}.")
    out.append("")
    if "how" in entry:
        out += [f"How: {_text(entry, 'how')}", ""]
    statements: list[str] = []
    for figure in figures:
        if isinstance(figure, str) and figure.strip():
            statements.append(f"- {' '.join(figure.split())}")
            continue
        if not isinstance(figure, dict) or not isinstance(figure.get("table"), dict):
            raise ValueError("a figure must be a statement or {\"table\": {...}}")
        out += [*statements, *([""] if statements else []), *table_markdown(figure["table"]), ""]
        statements = []
    out += [*statements, *([""] if statements else []), f"Concluded: {_text(entry, 'concluded')}", ""]
    return out


def history_markdown(folder: Path, label: str, command: str) -> list[str]:
    """The section: every entry of `folder`/history.json in its order. A missing or unreadable file gives one line, a
    malformed entry one line naming it and what is wrong; the other entries still render."""
    out = [f"## {TITLE}", ""]
    path = Path(folder) / HISTORY
    if not path.is_file():
        return out + [f"No history: there is no `{HISTORY}` in `{label}/`.", ""]
    try:
        data = _read(path)
        about, entries = _text(data, "about"), data["entries"]
        if not isinstance(entries, list):
            raise TypeError("`entries` must be a list")
    except (OSError, *READ_ERRORS) as err:
        return out + [f"`{HISTORY}` could not be read ({type(err).__name__}: {err}). Fix `{label}/{HISTORY}` and run "
                      f"`{command}` again.", ""]
    out += [f"From `{label}/{HISTORY}`, kept by hand (no benchmark writes it). {about}", ""]
    for n, entry in enumerate(entries, 1):
        try:
            out += entry_markdown(entry)
        except READ_ERRORS as err:
            title = entry.get("title") if isinstance(entry, dict) else None
            named = f" (\"{' '.join(str(title).split())}\")" if title else ""
            out += [f"Entry {n}{named} of `{HISTORY}` is malformed ({type(err).__name__}: {err}); an entry needs "
                    f"{', '.join(REQUIRED)}. Fix `{label}/{HISTORY}` and run `{command}` again.", ""]
    return out
