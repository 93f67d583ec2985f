"""The one escaping helper (ui/figures/safe.py): hostile text comes back with nothing a page could read as syntax, and reads the same.

What Chromium then shows (gr.Markdown, gr.HTML, toasts, plotly) is tested in test_browser_hostile.py.
"""

from __future__ import annotations

import html
import re

import pytest

from routerlab.ui.figures import safe

# Hostile payloads (a link, a zip's router.json and member names, a prompt, training text), and their cousins.
PAYLOADS = [
    "`<img src=/gradio_api/px>",
    "<a href=https://hostile.example>sign in</a>",
    "<form action=https://hostile.example><input name=p></form>",
    "<b style=position:fixed;inset:0>cover</b>",
    "<div style='position:fixed;inset:0;background:#fff'>Session expired - sign in again <a href=x>here</a></div>",
    "<img src=/gradio_api/hostile-px>/../x",
    "<img src=/gradio_api/hostile-px2><a id=hostile href=x>x</a>",
    "``code`` **bold** _it_ ~~strike~~ [link](http://hostile.example) ![img](/gradio_api/hostile-px3)",
    "www.hostile.example a@hostile.example http://hostile.example/path",
    "$$x^2$$ $y$ \\(z\\) \\[w\\]",
    "line one\n# heading\n\n    indented code\n- item\n1. item\n> quote\n---\n| a | b |\n|---|---|",
    "</script><script>alert(1)</script>",
    "' onmouseover='alert(1)' x='\" y=\"",
    "%{x} %{customdata[0]} {{value}} ${value}",
    "&lt;b&gt; &amp; &#60;b&#62; &#x3c;",
    "\\`\\*\\_ escaped markdown",
]
ALWAYS = set("<>&\"'`*_~[]\\$|{}#@\n\r\t")  # never left as they are (the '&' and '#' of the helper's own references aside)


@pytest.mark.parametrize("payload", PAYLOADS + ["- a list", "  12. a numbered list", "3) one more", "---", "=== a heading's line"])
def test_a_payload_keeps_no_character_a_page_reads_as_syntax(payload):
    shown = safe.text(payload)
    bare = re.sub(r"&#\d+;", "", shown)
    assert not set(bare) & ALWAYS, shown
    assert "://" not in bare and "www." not in bare.lower(), shown  # marked's autolinks
    assert not re.match(r"\s*([-+=]|\d+[.)](\s|$))", shown), shown  # a list, a rule or a heading's underline


@pytest.mark.parametrize("payload", PAYLOADS)
def test_a_payload_reads_the_same_once_unescaped(payload):
    """Browsers, marked and plotly turn the references back into the characters: the visitor's text shows as typed
    (line breaks as spaces)."""
    assert html.unescape(safe.text(payload)) == payload.replace("\r\n", " ").replace("\n", " ").replace("\t", " ")


def test_plain_text_stays_readable_and_anything_becomes_a_string():
    assert safe.text("Hello world, 100% sure; ok? (a/b.zip: 3 - 4 = -1!)") == "Hello world, 100% sure; ok? (a/b.zip: 3 - 4 = -1!)"
    assert safe.text(None) == ""
    assert safe.text(0.5) == "0.5" and safe.text("1. item") == "1&#46; item" and safe.text("-5 degrees") == "&#45;5 degrees"
    assert safe.text("see https://x.org, www.y.org or me@z.org") == "see https&#58;//x.org, www&#46;y.org or me&#64;z.org"
    assert html.unescape(safe.text(ValueError("bad <value>"))) == "bad <value>"
    assert safe.text("héllo · ⏎ ✓") == "héllo · ⏎ ✓"  # non-ASCII text is no syntax


def test_control_characters_and_lone_surrogates_are_replaced():
    shown = safe.text("a\x00b\x1bc\x7fd\ud800e\u2028f")
    assert shown == "a b c\ufffdd\ufffde f"
    shown.encode("utf-8")  # a lone surrogate would fail here (and in Gradio's JSON)


def test_code_is_an_element_no_value_can_close():
    shown = safe.code("`</code><img src=x>")
    assert shown.startswith("<code>") and shown.endswith("</code>")
    inner = shown[len("<code>"):-len("</code>")]
    assert "<" not in inner and "`" not in inner
    assert html.unescape(inner) == "`</code><img src=x>"
