"""Text from outside the app, made safe to show: the one escaping helper every tab uses.

Owns `text` (any value -> a string that shows literally wherever the app puts it: gr.Markdown, which runs marked
and keeps <img>, <a>, <form> and styled elements; gr.HTML, which keeps everything; a toast (gr.Warning / gr.Info /
gr.Error), which renders HTML; an HTML attribute; plotly's titles, labels and hover text, which read <a href>, <b>,
<span style> and <br>) and `code` (the same, set as inline code: what a Markdown backtick span did, without the
backtick a value could close).

Knows nothing about Gradio, plotly or what the text is. Escaped, as numeric character references (`<` -> `&#60;`),
which browsers, marked and plotly all turn back into the character itself:
  - always: `&<>"'` (HTML), the backtick, `*_~` (emphasis), `[]` (links, images), `\\` (Markdown's escapes), `$`
    (Gradio's LaTeX), `|` (table cells), `#` (headings), `{}` (plotly's `%{...}`), `@` (e-mail autolinks);
  - where they would start syntax: the `:` of `://` and the `.` of `www.` (GFM autolinks), and a leading `-`, `+`, `=`
    or number's `1.` / `1)` (lists, rules, headings' underlines) at the start of the value.
Everything else stays readable (numbers, file names, sentences). Line breaks become spaces (a line could start any
block syntax), other control characters spaces or U+FFFD, unpaired surrogates U+FFFD. What marked, Gradio and
plotly make of the result in Chromium is tested with hostile payloads in tests/test_browser_hostile.py.

Escape where a value is put into the page, once: the app's own Markdown (**bold**, its tables) around it keeps
working, and a value escaped twice shows its `&#60;`.
"""

from __future__ import annotations

import re

ALWAYS = "&<>\"'`*_~[]\\$|{}#@"
_BREAKS = re.compile(r"\r\n|[\r\n\u2028\u2029\x0b\x0c\x85]")
_IN_CONTEXT = re.compile(r":(?=/)|(?<=[wW])\.")  # https:// ftp:// and www. (marked's autolinks, case-insensitive)
# at the start of the value: "- x", "+ x", "---", "===" (lists, rules, headings' underlines), "1. x", "1) x" (numbered lists)
_LINE_START = re.compile(r"^(\s*)([-+=])|^(\s*\d{1,9})([.)])(?=\s|$)")
_TABLE = {ord(c): f"&#{ord(c)};" for c in ALWAYS}
_TABLE.update({c: " " for c in range(0x20)})  # tabs and the control characters a line break leaves behind
_TABLE.update({0x7F: "\ufffd", **{c: "\ufffd" for c in range(0x80, 0xA0)}})
_TABLE.update({c: "\ufffd" for c in range(0xD800, 0xE000)})  # unpaired surrogates: not text, and not encodable as UTF-8


def _ref(match: re.Match) -> str:
    return f"&#{ord(match.group(0))};"


def _marker(match: re.Match) -> str:
    before, marker = (match.group(1), match.group(2)) if match.group(2) else (match.group(3), match.group(4))
    return f"{before}&#{ord(marker)};"


def text(value) -> str:
    """`value` (any object; None -> "") as a string that shows literally in Markdown, HTML, an attribute or a plotly label."""
    if value is None:
        return ""
    # the table first: run after the two rules, it would escape the '&' and '#' of the references they write
    shown = _IN_CONTEXT.sub(_ref, _BREAKS.sub(" ", str(value)).translate(_TABLE))
    return _LINE_START.sub(_marker, shown, count=1)


def code(value) -> str:
    """`value` as inline code, in Markdown or HTML: a `<code>` element around `text(value)`."""
    return f"<code>{text(value)}</code>"
