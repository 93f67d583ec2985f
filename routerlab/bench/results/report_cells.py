"""Table cells and file reading shared by the renderers of docs/results.md (routerlab.bench.results.report and its parts)."""

from __future__ import annotations

import json
import math
from pathlib import Path

READ_ERRORS = (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError, AttributeError, IndexError)


def _num(x, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{float(x):.{digits}f}"


def _pct(x, digits: int = 1, sign: bool = False) -> str:
    return "-" if x is None else f"{100 * float(x):{'+' if sign else ''}.{digits}f}%"


def _cell(x) -> str:
    """A recorded value as a table cell: booleans as yes/no, floats rounded to 3 places, lists joined."""
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return "-" if math.isnan(x) else f"{round(x, 3):,}"
    if x is None:
        return "-"
    if isinstance(x, (list, tuple)):
        if len(x) > 12 and all(isinstance(v, (int, float)) for v in x):
            return f"{len(x)} values, {_cell(min(x))} to {_cell(max(x))}"
        return ", ".join(_cell(v) for v in x) if x else "none"
    if isinstance(x, dict):
        return ", ".join(f"{k} {_cell(v)}" for k, v in x.items()) if x else "none"
    return str(x).replace("|", "\\|").replace("\n", " ")


def _read(path: Path) -> dict:
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data
