"""The one exception type RouterLab raises for bad input: a message that names the problem and the way out.

Knows nothing about models or the UI; the CLI and the app print `str(err)` instead of a traceback.
"""

import math

QUOTE_CHARS = 60  # the longest quote of a visitor's value a message carries (a 1 MB string is not echoed)


def quote(value) -> str:
    """`value` (the visitor's own input) as a message quotes it, as the client sent it: JSON's true/false/null/NaN/
    Infinity, a string in quotes (Python's repr: a control character shows as its escape), anything else as Python
    writes it; cut to QUOTE_CHARS characters (with …). Nothing is stripped: escaping for the page is the page's job."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    try:
        text = repr(value)
    except Exception:  # a value whose repr fails is still named
        text = f"<{type(value).__name__}>"
    return text if len(text) <= QUOTE_CHARS else text[: QUOTE_CHARS - 1] + "…"


class RouterLabError(ValueError):
    """Bad input or an unusable file. `str(err)` is a complete, user-facing sentence.

    `quoted`: the parts of the message that quote the visitor's own input (a file name, a zip member, a value) as
    they appear in it, which a message's reader must show as they are (the app cuts the server's paths out of
    the rest of a message, never out of these)."""

    def __init__(self, problem: str, fix: str | None = None, *, quoted: tuple[str, ...] = ()):
        self.problem = problem
        self.fix = fix
        self.quoted = tuple(q for q in quoted if q)
        super().__init__(problem if not fix else f"{problem} {fix}")
