"""Links that open the app in a state, in a real browser (Debian's headless Chromium, driven by Playwright).

Every link in the workshop lesson (docs/workshop.md) opens with its settings applied, one bad link opens the
defaults with a note naming each bad value, and "Copy link to this view" round-trips what is on screen. Skips,
with the reason, where Chromium or the playwright package is missing; never downloads a browser.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest
from test_browser import SHOTS, _free_port, browser  # noqa: F401 (browser: the module-scoped Chromium fixture)

from routerlab import ui
from routerlab.ui.state.resources import FULL, UNTRAINED
from routerlab.ui.tabs.links import _documents, View, _defaults, read_link

LESSON = Path(__file__).resolve().parent.parent / "docs" / "workshop.md"
LESSON_HOST = "http://127.0.0.1:7860/"
TAB_NAMES = {"explore": "Explore", "compare": "Compare", "tradeoff": "Trade-off", "train": "Train", "layers": "Layers", "about": "About"}


def lesson_links() -> list[str]:
    """The query of every app link in the lesson (`http://127.0.0.1:7860/?...`), in order, once each."""
    found = re.findall(re.escape(LESSON_HOST) + r"(\?[^)\s`\"'<>]+)", LESSON.read_text())
    return list(dict.fromkeys(found))


@pytest.fixture(scope="module")
def app(embedded):
    from routerlab.core.decode.engine import Engine

    engine = Engine(embedded.model, embedded.tokenizer, name=embedded.name)
    res = ui.Resources(engine, ui.Limits(max_new_tokens=256), status="Pick a prompt and press **Generate**.")
    demo = ui.build_demo(res)
    demo.queue(max_size=8)
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=_free_port(), prevent_thread_lock=True, quiet=True, **ui.launch_options())
    yield url, res
    demo.close()


@pytest.fixture(scope="module")
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, permissions=["clipboard-read", "clipboard-write"])
    p = context.new_page()
    p.set_default_timeout(60_000)
    yield p
    context.close()


def _open(page, url: str) -> str:
    page.goto(url)
    page.locator("#rl-link-note").wait_for()
    return page.locator("#rl-link-note").inner_text()


def _on_screen(page) -> View:
    tab = page.locator("#rl-tabs [role=tab][aria-selected=true]").inner_text().strip()
    explore = page.locator("#rl-prompt textarea").input_value()
    compare_box = page.locator("#rl-c-prompt textarea")  # drawn once its tab has been shown
    compare = compare_box.input_value() if compare_box.count() else explore
    return View(
        tab={v: k for k, v in TAB_NAMES.items()}[tab],
        prompt=explore,
        compare_prompt=compare if compare != explore else None,
        routers=page.locator("#rl-granularity input").input_value(),
        threshold=float(page.locator("#rl-threshold input[type=number]").input_value()),
        kv_policy=page.locator("#rl-kv input:checked").input_value(),
        max_new_tokens=int(float(page.locator("#rl-max-new input[type=number]").input_value())),
        temperature=float(page.locator("#rl-temperature input[type=number]").input_value()),
        quality=page.locator("#rl-quality input").is_checked(),
    )


def _expected(res, query: str) -> tuple[View, list[str]]:
    default = View(prompt=res.prompts[0], routers="attention-token (trained)", max_new_tokens=96)
    view, problems, _ = read_link(dict(parse_qsl(query.lstrip("?"))), default, res.router_labels(), FULL, UNTRAINED,
                                  res.limits.max_new_tokens, res.limits.max_prompt_chars, _documents(res))
    return _defaults(res, view), problems


def test_the_lesson_has_a_link_for_every_exercise():
    text = LESSON.read_text()
    exercises = re.findall(r"^## Exercise \d", text, flags=re.M)
    assert 5 <= len(exercises) <= 8, exercises
    for block in re.split(r"^## ", text, flags=re.M):
        if block.startswith("Exercise"):
            assert LESSON_HOST + "?" in block, f"no app link in: {block.splitlines()[0]}"


def test_every_lesson_link_opens_its_settings(app, page):
    url, res = app
    links = lesson_links()
    assert len(links) >= 7, links
    for query in links:
        want, problems = _expected(res, query)
        assert problems == [], (query, problems)
        note = _open(page, url + query)
        assert note.startswith("✓ Opened a link"), (query, note)
        assert _on_screen(page) == want, query


def test_a_bad_link_names_each_bad_value_and_opens_the_defaults(app, page):
    url, res = app
    note = _open(page, url + "?threshold=abc&kv=fast&tab=settings&colour=red")
    for named in ("threshold=abc", "kv=fast", "tab=settings", "colour", "keep their defaults"):
        assert named in note, (named, note)
    want, _ = _expected(res, "")
    assert _on_screen(page) == want
    page.get_by_role("button", name="Generate", exact=True).wait_for()  # the page works


def test_copy_link_round_trips_what_is_on_screen(app, page):
    url, res = app
    _open(page, url + "?routers=mlp-token&kv=drop&prompt=What+is+a+router%3F&quality=off")
    box = page.locator("#rl-threshold input[type=number]")
    box.fill("0.62")
    box.press("Enter")
    page.locator("#rl-temperature input[type=number]").fill("0.4")
    page.locator("#rl-temperature input[type=number]").press("Enter")
    page.get_by_role("tab", name="Layers").click()
    shown = _on_screen(page)
    assert (shown.threshold, shown.temperature, shown.tab, shown.kv_policy) == (0.62, 0.4, "layers", "drop")
    page.locator("#rl-copy-link").click()
    link_box = page.locator("#rl-link textarea, #rl-link input").first
    page.wait_for_function("() => { const b = document.querySelector('#rl-link textarea, #rl-link input');"
                           " return !!b && b.value.startsWith('http'); }")
    link = link_box.input_value()
    assert urlsplit(link).netloc == urlsplit(url).netloc and page.url == link
    assert page.evaluate("navigator.clipboard.readText()") == link
    note = _open(page, link)
    assert note.startswith("✓ Opened a link"), note
    assert _on_screen(page) == shown
    _open(page, link.replace("tab=layers", "tab=explore"))  # the screenshot docs/workshop.md shows: a link opened, then copied
    assert "mlp-token: 0.30" in page.locator("#rl-threshold").inner_text()  # the slider's help is the linked set's
    page.locator("#rl-copy-link").click()
    page.wait_for_function("() => (document.querySelector('#rl-link textarea, #rl-link input') || {}).value?.startsWith('http')")
    page.screenshot(path=str(SHOTS / "link.png"), full_page=True)


def test_the_link_note_goes_once_the_visitor_acts(app, page):
    """A note saying "threshold 0.70 ... Press Generate" is stale once the visitor moves the threshold or generates."""
    url, _ = app
    note = page.locator("#rl-link-note")
    assert "threshold 0.70" in _open(page, url + "?threshold=0.7&max_new_tokens=2")
    box = page.locator("#rl-threshold input[type=number]")
    box.fill("0.5")
    box.press("Enter")
    note.wait_for(state="hidden")
    _open(page, url + "?threshold=0.7&max_new_tokens=2")
    page.get_by_role("button", name="Generate", exact=True).click()
    note.wait_for(state="hidden")
    assert "Press Start training" in _open(page, url + "?tab=train").replace("**", "")



def test_a_typed_threshold_survives_a_router_set_and_a_link_carries_both_prompts_and_the_document(app, page):
    """The visitor types 0.62, then picks another router set: 0.62 stays (the status names the set's own). Compare gets
    a long document, Explore keeps its prompt: the copied link reopens both, the threshold, and the document's name
    in Compare's menu."""
    url, res = app
    page.goto(url)
    page.get_by_role("button", name="Generate", exact=True).wait_for()
    box = page.locator("#rl-threshold input[type=number]")
    box.fill("0.62")
    box.press("Enter")
    page.locator("#rl-granularity input").click()
    page.get_by_role("option", name="mlp-token").first.click()
    page.locator("#rl-status", has_text="stays").wait_for()
    assert "your threshold 0.62 stays" in page.locator("#rl-status").inner_text()
    assert float(box.input_value()) == 0.62
    page.get_by_role("tab", name="Compare").click()
    doc = res.documents[0]
    page.locator("#rl-c-doc input").click()
    page.get_by_role("option", name=doc.title).first.click()
    page.wait_for_function("() => (document.querySelector('#rl-c-prompt textarea') || {}).value?.length > 2000")
    explore = page.locator("#rl-prompt textarea").input_value()
    page.locator("#rl-copy-link").click()
    page.wait_for_function("() => (document.querySelector('#rl-link textarea, #rl-link input') || {}).value?.startsWith('http')")
    link = page.locator("#rl-link textarea, #rl-link input").first.input_value()
    assert f"cdoc={doc.id}" in link and "threshold=0.62" in link
    note = _open(page, link)
    assert note.startswith("✓ Opened a link"), note
    shown = _on_screen(page)
    assert (shown.compare_prompt, shown.threshold, shown.tab) == (doc.prompt, 0.62, "compare")
    page.get_by_role("tab", name="Explore").click()
    assert page.locator("#rl-prompt textarea").input_value() == explore and page.locator("#rl-doc input").input_value() == ""
    page.get_by_role("tab", name="Compare").click()
    assert page.locator("#rl-c-doc input").input_value() == doc.title
    assert page.locator("#rl-compare").is_visible() and page.locator("#rl-compare").bounding_box()["y"] < 900  # in view
