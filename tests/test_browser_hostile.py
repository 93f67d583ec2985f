"""Hostile text in a real browser (Debian's headless Chromium, driven by Playwright): nothing a visitor, a link, a file or
the model writes becomes an element of the page.

One page, one app (a tiny model whose every token is an HTML payload, so the model itself writes hostile text): a link
with hostile values in several parameters at once, a generation from a prompt made of payloads (text, heatmap ticks
and hover, stats), a Compare ladder (columns, first differences), two crafted router-set zips (a router.json whose
granularity is a styled full-page <div>, a member named `<img src=...>/../x`) and pasted training text whose JSON
keys are HTML. After each step no element from a payload may exist (an id, img, link, form or fixed cover), the toasts
hold text only, and at the end the browser has made no request to a payload's URL; the exported heatmap page is
then opened and checked the same way. Skips, with the reason, where Chromium or the playwright package is missing.
"""

from __future__ import annotations

import json
import tempfile
import zipfile
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import pytest
from test_browser import _free_port, browser  # noqa: F401 (browser: the module-scoped Chromium fixture)
from test_ui import RANDOM, random_routers

from routerlab import ui

SEP = "¦"  # the hostile tokenizer's word separator (no payload holds it)
PAYLOADS = [  # each a single token of the tiny model's vocabulary ("hostile" becomes "hostile<id>": ids stay unique)
    "<img src=/gradio_api/hostile-px2><a id=hostile href=x>x</a>",
    "<b id=hostile style=position:fixed;inset:0>cover</b>",
    "<form id=hostile action=/hostile><button>go</button></form>",
    "`<img src=/gradio_api/hostile-px>`",
    "**bold** [link](/hostile) www.hostile.example me@hostile.example",
    "</span></div><img src=/gradio_api/hostile-px3>",
    "' onmouseover='x' id='hostile",
    "%{x}<br><span id=hostile style=color:red>red</span>",
]
LINK = {  # several hostile parameters at once
    "quality": "`<img src=/gradio_api/hostile-q>",
    "kv": "<a id=hostile-kv href=/hostile-kv>kv</a>",
    "tab": "<form id=hostile-tab action=/hostile-tab><button>go</button></form>",
    "routers": "<b id=hostile-routers style=position:fixed;inset:0>cover</b>",
    "threshold": "``</code><img src=/gradio_api/hostile-threshold>",
    "<img src=/gradio_api/hostile-key>": "1",
    "max_new_tokens": "10",
}
COVER = "<div id=hostile-cover style='position:fixed;inset:0;background:#fff;z-index:9999'>Session expired - sign in again <a href=/hostile-signin>here</a></div>"
MEMBER = "<img src=/gradio_api/hostile-member>/../x"
TRAIN_JSONL = "\n".join(json.dumps({"<img src=/gradio_api/hostile-train>": f"<b id=hostile-train{k} style=position:fixed;inset:0>x</b>"})
                        for k in range(12))

FOREIGN_JS = """() => {
  const found = [];
  const add = (sel) => document.querySelectorAll(sel).forEach((e) => found.push(e.outerHTML.slice(0, 160)));
  add('[id*=hostile], img[src*=hostile], a[href*=hostile], form, iframe, object, embed, svg a');
  add('[style*="position:fixed"], [style*="position: fixed"], [style*="inset:0"], [style*="inset: 0"]');
  // the app's Markdown (status, link note, training result) holds only what its own Markdown makes
  document.querySelectorAll('#rl-status .md *, #rl-link-note .md *, #rl-tr-result .md *').forEach((e) => {
    if (!['P', 'STRONG', 'EM', 'CODE', 'BR', 'TABLE', 'THEAD', 'TBODY', 'TR', 'TH', 'TD'].includes(e.tagName)) found.push(e.outerHTML.slice(0, 160)); });
  // the model's text: one span per token, a <br> per line break
  document.querySelectorAll('#rl-text .rl-text *, [id^=rl-c-col] .rl-text *').forEach((e) => {
    if (!['SPAN', 'BR'].includes(e.tagName)) found.push(e.outerHTML.slice(0, 160)); });
  document.querySelectorAll('[data-testid=toast-text]').forEach((e) => { if (e.children.length) found.push('toast: ' + e.innerHTML.slice(0, 160)); });
  return found;
}"""


def hostile_tokenizer():
    """128 words, each an HTML payload (the tiny model's vocabulary size), split on SEP: every token the model writes is hostile."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {PAYLOADS[i % len(PAYLOADS)].replace("hostile", f"hostile{i}"): i for i in range(128)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token=next(iter(vocab))))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(SEP), behavior="removed")
    tk.decoder = decoders.Fuse()
    words = list(vocab)
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token=words[0], eos_token=words[-1]), words


@pytest.fixture(scope="module")
def hostile_app(tmp_path_factory):
    """The app around a tiny llama whose words are payloads, with a random router set; and two crafted zips."""
    from routerlab.core.decode.engine import Engine
    from routerlab.core.model.models import tiny_model
    from routerlab.tuning.checkpoint import save_routers

    model = tiny_model("llama")
    tokenizer, words = hostile_tokenizer()
    engine = Engine(model, tokenizer, name="tiny-hostile")
    sets = [ui.RouterSetInfo(label=RANDOM, granularity="attention-token"), *ui.available_router_sets(Path("/nonexistent"))]
    res = ui.Resources(engine, ui.Limits(max_new_tokens=16, max_prompt_chars=2000), router_sets=sets, prompts=["Hello"])
    res._routers[(engine.name, RANDOM)] = random_routers(model)

    folder = tmp_path_factory.mktemp("zips")
    saved = save_routers(random_routers(model), folder / "set", model)
    config = json.loads((saved / "router.json").read_text())
    with zipfile.ZipFile(folder / "granularity.zip", "w") as z:  # names a styled full-page cover as its granularity
        z.writestr("set/router.json", json.dumps(dict(config, granularity=COVER)))
        z.write(saved / "routers.safetensors", "set/routers.safetensors")
    with zipfile.ZipFile(folder / "member.zip", "w") as z:  # a member whose name is an <img> (and leaves the folder)
        z.writestr(MEMBER, "x")

    demo = ui.build_demo(res)
    demo.queue(max_size=8)
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=_free_port(), prevent_thread_lock=True, quiet=True, **ui.launch_options())
    yield url, words, folder
    demo.close()


def _no_foreign(page, step: str) -> None:
    found = page.evaluate(FOREIGN_JS)
    assert not found, f"after {step}: elements from a payload: {found}"


def _after(page, selector: str, act) -> str:
    """Do `act`, wait until `selector`'s text changed, and return the new text."""
    before = page.locator(selector).inner_text()
    act()
    page.wait_for_function("([sel, before]) => document.querySelector(sel).innerText !== before", arg=[selector, before])
    return page.locator(selector).inner_text()


def test_no_payload_becomes_an_element(browser, hostile_app):
    url, words, zips = hostile_app
    page = browser.new_page(viewport={"width": 1280, "height": 1000}, accept_downloads=True)
    page.set_default_timeout(120_000)
    requests: list[str] = []
    # a payload's URL in a request's path (the page's own query, which Gradio's API calls repeat, carries them all)
    page.on("request", lambda r: requests.append(r.url) if "hostile" in urlsplit(r.url).path else None)
    try:
        _hostile_tour(page, url, words, zips)
        assert not requests, f"the browser fetched a payload's URL: {requests}"
    except Exception:
        page.screenshot(path=str(Path(tempfile.gettempdir()) / "routerlab-browser-hostile-failure.png"), full_page=True)
        raise
    finally:
        page.close()


def _hostile_tour(page, url: str, words: list[str], zips: Path) -> None:
    # 1. a link with hostile values in several parameters, and a prompt made of payloads (a valid value: it is applied)
    prompt = SEP.join(words[:len(PAYLOADS)])
    page.goto(url + "?" + urlencode({**LINK, "prompt": prompt}))
    note = page.locator("#rl-link-note")
    note.wait_for()
    text = note.inner_text()
    for value in ("`<img src=/gradio_api/hostile-q>", "<a id=hostile-kv href=/hostile-kv>kv</a>", "<img src=/gradio_api/hostile-key>"):
        assert value in text, (value, text)  # shown as the visitor wrote it
    assert page.locator("#rl-prompt textarea").input_value() == prompt
    _no_foreign(page, "opening the link")

    # 2. Explore: the model writes payloads (text, heatmap ticks and hover, stats); the heatmap page is exported
    page.get_by_role("button", name="Generate", exact=True).click()
    page.locator("#rl-status", has_text="Done:").wait_for()
    assert "<img src=/gradio_api/hostile" in page.locator("#rl-text").inner_text(), "the model's text is shown as text"
    page.locator("#rl-heatmap .js-plotly-plot").scroll_into_view_if_needed()
    boxes = [d.bounding_box() for d in page.locator("#rl-heatmap .nsewdrag").all()]
    box = max(boxes, key=lambda b: b["height"])  # the layers x tokens plot (not the quality strip under it)
    page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.3)
    page.mouse.move(box["x"] + box["width"] * 0.7, box["y"] + box["height"] * 0.45, steps=5)  # a hover label: a generated token, a routed layer
    page.locator("#rl-heatmap .hovertext").first.wait_for()
    _no_foreign(page, "generating")
    with page.expect_download() as got:
        page.locator("#rl-dl-html").click()
    exported = zips / "heatmap.html"
    got.value.save_as(exported)

    # 3. Compare: every column's text and the ladder's first differences (token labels)
    page.get_by_role("tab", name="Compare").click()
    page.get_by_role("button", name="Compare", exact=True).click()
    page.locator("#rl-c-stats", has_text="measured in lockstep").wait_for()
    _no_foreign(page, "comparing")

    # 4. Train: two crafted zips, then pasted training text whose JSON keys are HTML
    page.get_by_role("tab", name="Train").click()
    status = _after(page, "#rl-status .md", lambda: page.locator("#rl-tr-upload input[type=file]").set_input_files(str(zips / "granularity.zip")))
    assert status.startswith("⚠") and "Session expired - sign in again" in status, status
    _no_foreign(page, "uploading a zip whose granularity is a cover")
    status = _after(page, "#rl-status .md", lambda: page.locator("#rl-tr-upload input[type=file]").set_input_files(str(zips / "member.zip")))
    assert status.startswith("⚠") and f"('{MEMBER}')" in status, status  # the member's own name, whole, as text
    _no_foreign(page, "uploading a zip with an <img> member")
    page.get_by_label("my own text").check()
    page.locator("#rl-tr-text textarea").fill(TRAIN_JSONL)
    status = _after(page, "#rl-status .md", lambda: page.locator("#rl-tr-start").click())
    assert status.startswith("⚠") and "<img src=/gradio_api/hostile-train>" in status, status  # the visitor's key, whole, shown as text
    _no_foreign(page, "pasting training text")

    # 5. the exported heatmap, a page of its own
    page.goto(exported.as_uri())
    page.locator(".js-plotly-plot g.xtick text").first.wait_for()
    _no_foreign(page, "opening the exported heatmap")
