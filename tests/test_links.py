"""Links that open the app in a state (ui/tabs/links.py): every setting read and written, bad values named, round trips."""

from __future__ import annotations

import html
import re
from urllib.parse import parse_qsl

import pytest

from routerlab.ui.tabs.links import FIELDS, LINK_PROMPT_CHARS, TABS, View, link_query, read_link, router_key

FULL, UNTRAINED = "full model (no routing)", "attention-token (untrained)"
LABELS = [FULL, "attention-token (trained)", "mlp-token (trained)", "block-token (my-set)", UNTRAINED]
DEFAULT = View(prompt="Explain the sky.", routers="attention-token (trained)")


def _read(query: str):
    return read_link(dict(parse_qsl(query.lstrip("?"), keep_blank_values=True)), DEFAULT, LABELS, FULL, UNTRAINED, 256, 4000)


def _shown(message: str) -> str:
    """A message as the note reads (its Markdown's escapes undone), with the inline code it sets marked by backticks."""
    return html.unescape(re.sub(r"</?code>", "`", message))


def test_every_setting_a_link_carries_is_applied():
    view, problems, given = _read("?tab=Compare&prompt=Hi%20there&cprompt=Compare%20me&routers=mlp-token&threshold=0.7&kv=drop"
                                  "&max_new_tokens=40&temperature=0.3&quality=off")
    assert problems == []
    assert given == set(FIELDS)
    assert view == View(tab="compare", prompt="Hi there", routers="mlp-token (trained)", threshold=0.7, kv_policy="drop",
                        max_new_tokens=40, temperature=0.3, quality=False, compare_prompt="Compare me")


@pytest.mark.parametrize("value, label", [("full", FULL), ("untrained", UNTRAINED), ("attention-token", "attention-token (trained)"),
                                          ("block-token (my-set)", "block-token (my-set)"), ("MLP-TOKEN", "mlp-token (trained)")])
def test_router_sets_by_short_name_or_label(value, label):
    view, problems, _ = _read(f"?routers={value}")
    assert problems == [] and view.routers == label


@pytest.mark.parametrize("query, named", [
    ("?threshold=abc", "`threshold=abc` is not a number from 0 to 1"),
    ("?threshold=1.5", "`threshold=1.5` is not a number"),
    ("?threshold=nan", "`threshold=nan`"),
    ("?kv=fast", "`kv=fast` is not a KV policy (mask, kv, drop)"),
    ("?tab=settings", "`tab=settings` is not a tab"),
    ("?routers=mlp-sequence", "`routers=mlp-sequence` is not a router set on this server (full, attention-token, mlp-token"),
    ("?max_new_tokens=1000", "`max_new_tokens=1000` is not a whole number from 1 to 256"),
    ("?max_new_tokens=2.5", "`max_new_tokens=2.5`"),
    ("?temperature=-1", "`temperature=-1` is not a number from 0 to 1.5"),
    ("?quality=maybe", "`quality=maybe` is not on or off"),
    ("?prompt=", "`prompt=` is not a prompt of 1 to 4000 characters"),
    ("?colour=red", "`colour` is not a setting a link can carry (tab, prompt"),
])
def test_a_bad_value_is_named_and_keeps_the_default(query, named):
    view, problems, given = _read(query)
    assert len(problems) == 1 and _shown(problems[0]).startswith(named), problems
    assert view == DEFAULT and given == set()


def test_good_values_survive_bad_ones_and_gradio_keys_are_not_reported():
    view, problems, _ = _read("?threshold=0.3&kv=nope&__theme=dark&view=api")
    assert view.threshold == 0.3 and view.kv_policy is None
    assert len(problems) == 1 and "kv=nope" in _shown(problems[0])


def test_a_long_value_is_shortened_in_the_message():
    _, problems, _ = _read("?tab=" + "x" * 500)
    assert len(_shown(problems[0])) < 120 and "…" in problems[0]


@pytest.mark.parametrize("query", [
    "?quality=%60%3Cimg%20src%3D%2Fgradio_api%2Fpx%3E",  # a backtick closed the old `code span`: a real <img>
    "?%60%3Ca%20href%3Dx%3Elink%3C%2Fa%3E=1&tab=%3Cform%20action%3Dx%3E",
    "?kv=%3Cb%20style%3Dposition%3Afixed%3Binset%3A0%3Ecover%3C%2Fb%3E&routers=%60%60%3C%2Fcode%3E%3Cimg%20src%3Dx%3E",
])
def test_a_hostile_value_comes_back_as_text(query):
    """The messages are Markdown: the visitor's part of each is inline code that nothing in it can close or leave."""
    _, problems, _ = _read(query)
    assert problems
    for message in problems:
        values = re.findall(r"<code>(.*?)</code>", message)
        assert len(values) == 1 and not set(values[0]) & set("<>`*_[]()"), message
        assert "<" not in re.sub(r"</?code>", "", message) and "`" not in message, message


@pytest.mark.parametrize("tab", TABS)
def test_link_query_round_trips(tab):
    view = View(tab=tab, prompt="Write a poem & a story? 100% = yes", routers="block-token (my-set)", threshold=0.42,
                kv_policy="mask", max_new_tokens=17, temperature=1.25, quality=False, compare_prompt="Compare this: a & b")
    again, problems, _ = _read(link_query(view, FULL, UNTRAINED))
    assert problems == [] and again == view


def test_link_query_names_routers_short_and_leaves_out_what_is_unset():
    query = link_query(View(prompt="hi", routers=FULL), FULL, UNTRAINED)
    assert query.startswith("?tab=explore&prompt=hi&routers=full&") and "threshold" not in query and "kv=" not in query
    assert router_key("attention-token (trained)", FULL, UNTRAINED) == "attention-token"


DOCS = {"tide-mill": "A long text about a mill.\n\nSummarise the text above in three sentences."}


def test_a_long_document_travels_by_name_and_opens_its_prompt():
    query = link_query(View(prompt=DOCS["tide-mill"], routers=FULL), FULL, UNTRAINED, DOCS)
    assert "doc=tide-mill" in query and "prompt=" not in query
    view, problems, given = read_link(dict(parse_qsl(query.lstrip("?"))), DEFAULT, LABELS, FULL, UNTRAINED, 256, 16000, DOCS)
    assert problems == [] and view.prompt == DOCS["tide-mill"] and "doc" in given


def test_a_prompt_too_long_for_a_link_is_left_out_and_an_unknown_document_is_named():
    query = link_query(View(prompt="word " * (LINK_PROMPT_CHARS // 4), routers=FULL), FULL, UNTRAINED, DOCS)
    assert "prompt=" not in query and "doc=" not in query and query.startswith("?tab=explore&routers=full")
    view, problems, _ = read_link({"doc": "moby-dick"}, DEFAULT, LABELS, FULL, UNTRAINED, 256, 16000, DOCS)
    assert view == DEFAULT and len(problems) == 1 and _shown(problems[0]).startswith("`doc=moby-dick` is not a long document on this server (tide-mill)")


def test_both_prompts_travel_and_a_document_in_either_by_name():
    """Explore's and Compare's prompts each travel (Compare's only where it differs); a document by its name."""
    same = link_query(View(prompt="hi", compare_prompt="hi", routers=FULL), FULL, UNTRAINED)
    assert "cprompt" not in same
    query = link_query(View(prompt="hi", compare_prompt=DOCS["tide-mill"], routers=FULL), FULL, UNTRAINED, DOCS)
    assert "prompt=hi" in query and "cdoc=tide-mill" in query and "cprompt" not in query
    view, problems, given = read_link(dict(parse_qsl(query.lstrip("?"))), DEFAULT, LABELS, FULL, UNTRAINED, 256, 16000, DOCS)
    assert problems == [] and view.prompt == "hi" and view.compare_prompt == DOCS["tide-mill"] and {"prompt", "cdoc"} <= given
