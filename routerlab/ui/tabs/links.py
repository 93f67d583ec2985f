"""Links that open the app in a given state: the page's URL carries the settings.

    ?tab=compare&routers=attention-token&threshold=0.7&kv=drop&max_new_tokens=64&temperature=0&quality=on&prompt=...

Compare's prompt travels as `cprompt` (or `cdoc`) where it differs from Explore's. A shipped long document
(assets/documents) travels by name (`doc=tide-mill`), and a prompt longer than
LINK_PROMPT_CHARS not at all (the link says so): a URL of 9,000 encoded characters outgrows what servers and chat
apps pass on (uvicorn's h11 refuses a request head over 16 KB).

Owns `View` (what a link can set: the settings column, the prompt and the tab), `read_link` (a page's
query parameters -> the View to show and, for each bad or unknown value, a message naming it; a bad value
falls back to the default, never breaks the page), `link_query` (a View -> its relative link, `?...`,
which works wherever the app runs) and `router_key` (a dropdown label -> its short name in a link).
Those four are pure Python.

Every value a link carries is the visitor's: the messages show it through safe.code (inline code that no
character of the value can close), and the notes escape every name they show.

`open_link` / `view_link` / `link_note_done` are the page's handlers: the settings a page opened with (applied to the
components, the messages turned into the note above the settings), the link for what is on screen, and the note's
end once the visitor acts (layout.py wires them; `COPY_LINK_JS` makes the link absolute and copies it in the browser).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping
from urllib.parse import urlencode

import gradio as gr

from routerlab.core.base.config import KV_POLICIES
from routerlab.ui.figures import safe

LINK_PROMPT_CHARS = 2000  # the longest prompt a link carries as text
TABS = ("explore", "compare", "tradeoff", "train", "layers", "about")
FULL_KEY, UNTRAINED_KEY = "full", "untrained"
ON, OFF = ("on", "1", "true", "yes"), ("off", "0", "false", "no")
# Query parameters Gradio itself reads (`?view=api`, `?__theme=dark`): never reported as unknown.
GRADIO_KEYS = ("view", "lang")
# What a link's note asks the visitor to press, per tab; Trade-off, Layers and About have nothing to run first.
RUN_BUTTONS = {"explore": ("Generate", "to run it"), "compare": ("Compare", "to run it"), "train": ("Start training", "to train a router set")}


@dataclass(frozen=True)
class View:
    """What a link can set. `routers` is a dropdown label; `threshold` / `kv_policy` None: the set's own."""

    tab: str = "explore"
    prompt: str = ""
    routers: str = ""
    threshold: float | None = None
    kv_policy: str | None = None
    max_new_tokens: int = 96
    temperature: float = 0.0
    quality: bool = True
    compare_prompt: str | None = None  # Compare's prompt; None: the same as Explore's


FIELDS = ("tab", "prompt", "cprompt", "routers", "threshold", "kv", "max_new_tokens", "temperature", "quality")


def router_key(label: str, full: str, untrained: str) -> str:
    """A dropdown label's name in a link: 'attention-token (trained)' -> 'attention-token', the full model -> 'full'."""
    if label == full:
        return FULL_KEY
    if label == untrained:
        return UNTRAINED_KEY
    return label.removesuffix(" (trained)")


def _router_label(value: str, labels: list[str], full: str, untrained: str) -> str | None:
    by_key = {router_key(label, full, untrained): label for label in labels}
    value = value.strip()
    return value if value in labels else by_key.get(value.lower()) or by_key.get(value)


def _number(value: str, low: float, high: float) -> float | None:
    try:
        x = float(value)
    except ValueError:
        return None
    return x if math.isfinite(x) and low <= x <= high else None


def _parsers(labels: list[str], full: str, untrained: str, max_new_tokens: int, max_prompt_chars: int,
             documents: Mapping[str, str]) -> dict:
    """Query parameter -> (View field, parse: text -> value or None when bad, what it accepts)."""
    names = safe.text(", ".join(router_key(label, full, untrained) for label in labels))

    def choice(options):
        return lambda v: v.strip().lower() if v.strip().lower() in options else None

    def whole(v):
        x = _number(v, 1, max_new_tokens)
        return int(x) if x is not None and x == int(x) else None

    return {
        "tab": ("tab", choice(TABS), f"a tab ({', '.join(TABS)})"),
        "prompt": ("prompt", lambda v: v if v.strip() and len(v) <= max_prompt_chars else None, f"a prompt of 1 to {max_prompt_chars} characters"),
        "doc": ("prompt", lambda v: documents.get(v.strip().lower()), f"a long document on this server ({safe.text(', '.join(documents)) or 'none'})"),
        "cprompt": ("compare_prompt", lambda v: v if v.strip() and len(v) <= max_prompt_chars else None, f"a prompt of 1 to {max_prompt_chars} characters"),
        "cdoc": ("compare_prompt", lambda v: documents.get(v.strip().lower()), f"a long document on this server ({safe.text(', '.join(documents)) or 'none'})"),
        "routers": ("routers", lambda v: _router_label(v, labels, full, untrained), f"a router set on this server ({names})"),
        "threshold": ("threshold", lambda v: _number(v, 0.0, 1.0), "a number from 0 to 1"),
        "kv": ("kv_policy", choice(KV_POLICIES), f"a KV policy ({', '.join(KV_POLICIES)})"),
        "max_new_tokens": ("max_new_tokens", whole, f"a whole number from 1 to {max_new_tokens}"),
        "temperature": ("temperature", lambda v: _number(v, 0.0, 1.5), "a number from 0 to 1.5"),
        "quality": ("quality", lambda v: v.strip().lower() in ON if v.strip().lower() in ON + OFF else None, "on or off"),
    }


def _short(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "…"


def read_link(params: Mapping[str, str], default: View, labels: list[str], full: str, untrained: str,
              max_new_tokens: int, max_prompt_chars: int, documents: Mapping[str, str] | None = None) -> tuple[View, list[str], set[str]]:
    """The View a page opened with `params` shows, the messages for what it could not use, and which parameters it set.

    Starts from `default` and applies each known parameter whose value is valid; a bad value keeps the default and
    adds one message naming the parameter, the value and what it accepts; an unknown parameter adds a message too.
    The messages are Markdown for the page's note: the parameters and values in them are escaped (safe.code).
    `documents`: id -> prompt of the long documents a `doc=` parameter may name."""
    parsers = _parsers(labels, full, untrained, max_new_tokens, max_prompt_chars, documents or {})
    view, problems, given = default, [], set()
    for key, value in params.items():
        if key in GRADIO_KEYS or key.startswith("__"):
            continue
        if key not in parsers:
            problems.append(f"{safe.code(_short(key))} is not a setting a link can carry ({safe.text(', '.join(FIELDS + ('doc', 'cdoc')))})")
            continue
        field, parse, accepts = parsers[key]
        parsed = parse(str(value))
        if parsed is None:
            problems.append(f"{safe.code(key + '=' + _short(str(value)))} is not {accepts}")
            continue
        view = replace(view, **{field: parsed})
        given.add(key)
    return view, problems, given


def link_query(view: View, full: str, untrained: str, documents: Mapping[str, str] | None = None) -> str:
    """The relative link (`?tab=...&...`) that opens `view` wherever the app runs: every field, in FIELDS order.
    A prompt that is one of `documents` (id -> prompt) goes as its id; one over LINK_PROMPT_CHARS is left out; Compare's
    prompt only where it differs from Explore's."""
    def doc_of(prompt):
        return next((key for key, text in (documents or {}).items() if text == prompt), "")
    doc = doc_of(view.prompt)
    other = view.compare_prompt if view.compare_prompt not in (None, "", view.prompt) else ""
    cdoc = doc_of(other) if other else ""
    fields = {
        "tab": view.tab,
        "prompt": "" if doc or len(view.prompt) > LINK_PROMPT_CHARS else view.prompt,
        "doc": doc,
        "cprompt": "" if cdoc or len(other) > LINK_PROMPT_CHARS else other,
        "cdoc": cdoc,
        "routers": router_key(view.routers, full, untrained),
        "threshold": "" if view.threshold is None else f"{view.threshold:g}",
        "kv": view.kv_policy or "",
        "max_new_tokens": str(view.max_new_tokens),
        "temperature": f"{view.temperature:g}",
        "quality": "on" if view.quality else "off",
    }
    return "?" + urlencode({k: v for k, v in fields.items() if v != ""})


# The link box's value comes back from the server relative (`?...`); the browser makes it absolute, shows it in the
# address bar too, and copies it. The clipboard API needs a secure context (https or localhost): on a laptop served to
# a room over plain http, the link is selected in its box instead, for Ctrl+C.
COPY_LINK_JS = """
(query) => {
  if (!query || !query.startsWith('?')) return query;
  const url = window.location.origin + window.location.pathname + query;
  try { window.history.replaceState(null, '', url); } catch (err) {}
  const select = () => {
    const box = document.querySelector('#rl-link textarea, #rl-link input');
    if (box) { box.focus(); box.select(); }
  };
  if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(url).catch(select);
  else setTimeout(select, 50);
  return url;
}
"""


def _documents(res) -> dict[str, str]:
    """id -> prompt of the server's long documents (Resources.documents)."""
    return {d.id: d.prompt for d in getattr(res, "documents", ())}


def _defaults(res, view: View) -> View:
    """`view` with the threshold and KV policy its router set was calibrated for where the link left them out."""
    info = next((r for r in res.router_sets if r.label == view.routers and r.path is not None), None)
    meta = info.meta if info is not None else {}
    return replace(view,
                   threshold=float(meta.get("threshold", 0.5)) if view.threshold is None else view.threshold,
                   kv_policy=meta.get("kv_policy", "kv") if view.kv_policy is None else view.kv_policy)


def _describe(view: View, full: str) -> str:
    threshold = "" if view.routers == full else f", threshold {view.threshold:.2f}"
    return (f"**{view.tab.capitalize()}** tab, router set **{safe.text(view.routers)}**{threshold}, KV policy **{safe.text(view.kv_policy)}**, "
            f"{view.max_new_tokens} new tokens, temperature {view.temperature:g}, quality {'on' if view.quality else 'off'}")


def open_link(res, default: View, request: gr.Request | None, session=None):
    """The page loaded: apply the settings its URL carries. Returns, for layout's link outputs: tabs, tab state, prompt,
    Compare's prompt, router set, threshold, KV policy, max new tokens, temperature, quality, note, and the long-document
    menus of Explore and Compare (the document's title where a prompt is one, else empty). No settings in the URL:
    nothing changes."""
    from routerlab.ui.state.resources import FULL, UNTRAINED

    params = dict(request.query_params) if request is not None and request.query_params is not None else {}
    if not any(k not in GRADIO_KEYS and not k.startswith("__") for k in params):
        return (gr.skip(),) * 13
    limits = res.limits
    view, problems, _ = read_link(params, default, res.router_labels(), FULL, UNTRAINED, limits.max_new_tokens, limits.max_prompt_chars,
                                  _documents(res))
    view = _defaults(res, view)
    if problems:
        gr.Warning("This link has settings the app cannot use; they keep their defaults (see the note at the top).")
        note = "⚠ Opened a link, but " + "; ".join(problems) + ". Those settings keep their defaults. Now: " + _describe(view, FULL) + "."
    else:
        button, what = RUN_BUTTONS.get(view.tab, (None, ""))
        note = "✓ Opened a link: " + _describe(view, FULL) + "." + (f" Press **{button}** {what}." if button else "")
    if session is not None and view.threshold is not None:
        session.link_threshold = float(view.threshold)
    compare = view.compare_prompt or view.prompt
    titles = {d.prompt: d.title for d in getattr(res, "documents", ())}
    return (gr.Tabs(selected=view.tab), view.tab, view.prompt, compare, view.routers, view.threshold, view.kv_policy,
            view.max_new_tokens, view.temperature, view.quality, gr.Markdown(note, visible=True),
            titles.get(view.prompt), titles.get(compare))


def view_link(res, prompt, compare_prompt, threshold, routers, kv_policy, max_new_tokens, temperature, quality, tab, session=None):
    """The relative link for what is on screen (both tabs' prompts, the Compare tab's where it differs), and a note
    when part of it cannot travel (a router set trained or uploaded in this tab lives only here)."""
    from routerlab.ui.state.resources import FULL, UNTRAINED

    tab = tab if tab in TABS else "explore"
    prompt, compare_prompt = str(prompt or ""), str(compare_prompt or "")
    view = View(tab=tab, prompt=prompt, compare_prompt=compare_prompt if compare_prompt != prompt else None, routers=str(routers or FULL),
                threshold=float(threshold) if isinstance(threshold, (int, float)) else None, kv_policy=kv_policy or None,
                max_new_tokens=int(max_new_tokens) if isinstance(max_new_tokens, (int, float)) else 96,
                temperature=float(temperature) if isinstance(temperature, (int, float)) else 0.0, quality=bool(quality))
    documents = _documents(res)
    query = link_query(view, FULL, UNTRAINED, documents)
    long = [(name, p) for name, p in (("prompt", view.prompt), ("Compare prompt", view.compare_prompt or ""))
            if len(p) > LINK_PROMPT_CHARS and p not in documents.values()]
    if long:
        name, p = long[0]
        note = (f"⚠ The {name} ({len(p):,} characters) is too long to travel in a link (at most {LINK_PROMPT_CHARS:,}): "
                "the link opens these settings with the default prompt. Send the text along with the link.")
        return gr.Textbox(value=query, visible=True), gr.Markdown(note, visible=True)
    if view.routers not in res.router_labels():
        note = (f"⚠ **{safe.text(view.routers)}** was trained or uploaded in this tab and lives only here: whoever opens the link "
                "gets the default router set. Share its zip (Train tab) with the link.")
        return gr.Textbox(value=query, visible=True), gr.Markdown(note, visible=True)
    return gr.Textbox(value=query, visible=True), gr.skip()


def link_note_done():
    """The visitor acted (ran something, moved a setting): the note about what a link opened, or about a copied
    link, no longer describes the page, so it goes."""
    return gr.Markdown(value="", visible=False)
