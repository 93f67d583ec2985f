"""A real browser (Debian's headless Chromium, driven by Playwright) uses the app with the embedded model.

It generates, steers the threshold during the run, looks at the what-if view, switches tabs and
saves screenshots to assets/screenshots/ (the README shows them). Skips, with the reason, where
Chromium or the playwright package is missing; never downloads a browser (`playwright install`).
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

from routerlab import ui

CHROMIUM = os.environ.get("ROUTERLAB_CHROMIUM", "/usr/bin/chromium")
SHOTS = Path(__file__).resolve().parent.parent / "assets" / "screenshots"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def browser():
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set ROUTERLAB_CHROMIUM)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed (pip install playwright)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def app_url(embedded):
    from routerlab.engine import Engine

    engine = Engine(embedded.model, embedded.tokenizer, name=embedded.name)
    res = ui.Resources(engine, ui.Limits(max_new_tokens=256), status=f"Model **{engine.name}** loaded ({engine.n_layers} layers). Pick a prompt and press **Generate**.")
    demo = ui.build_demo(res)
    demo.queue(max_size=8)
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=_free_port(), prevent_thread_lock=True, quiet=True, **ui.launch_options())
    yield url
    demo.close()


def _set_slider(page, value: float) -> None:
    box = page.locator("#rl-threshold input[type=number]")
    box.fill(f"{value}")
    box.press("Enter")


def test_generate_steer_what_if_tabs_and_screenshots(browser, app_url):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.set_default_timeout(180_000)
    page.goto(app_url)
    page.get_by_role("button", name="Generate", exact=True).wait_for()

    # 1. a streamed run, steered while it runs
    page.locator("#rl-prompt textarea").fill("Write a short story about a lighthouse keeper who finds a message in a bottle.")
    page.locator("#rl-max-new input[type=number]").fill("120")
    page.locator("#rl-max-new input[type=number]").press("Enter")
    page.get_by_role("button", name="Generate", exact=True).click()
    page.wait_for_function("document.querySelectorAll('#rl-text .rl-text .rl-tok').length >= 12")
    page.locator("#rl-heatmap .js-plotly-plot").wait_for()
    _set_slider(page, 0.55)
    page.locator("#rl-status").get_by_text("threshold 0.55").wait_for()  # the run reports its new threshold
    page.wait_for_function("document.querySelectorAll('#rl-text .rl-text .rl-tok').length >= 40")
    page.screenshot(path=str(SHOTS / "explore-streaming.png"), full_page=True)
    page.get_by_text("Done:").wait_for()
    assert page.locator("#rl-heatmap .js-plotly-plot").count() == 1
    page.screenshot(path=str(SHOTS / "explore-done.png"), full_page=True)
    heat_title = page.locator("#rl-heatmap .gtitle").text_content()
    assert "Recorded run" in heat_title

    # 2. after the run: the slider shows a labelled what-if view from the recorded scores
    _set_slider(page, 0.45)
    page.locator("#rl-status strong", has_text="What-if view").wait_for()
    page.wait_for_function("document.querySelector('#rl-heatmap .gtitle') && document.querySelector('#rl-heatmap .gtitle').textContent.includes('WHAT-IF')")
    page.locator("#rl-heatmap").screenshot(path=str(SHOTS / "heatmap-what-if.png"))
    assert page.get_by_role("button", name="Regenerate at this threshold").is_visible()
    assert page.locator("#rl-dl-trace").is_visible() and page.locator("#rl-dl-html").is_visible()

    # 3. the other tabs
    page.get_by_role("tab", name="Layers").click()
    page.locator("#rl-layer-bar .js-plotly-plot").wait_for()
    page.screenshot(path=str(SHOTS / "layers.png"), full_page=True)

    page.get_by_role("tab", name="Compare").click()
    page.locator("#rl-c-prompt textarea").fill("What is the capital of France, and what is it famous for?")
    _set_slider(page, 0.6)
    page.locator("#rl-max-new input[type=number]").fill("40")
    page.locator("#rl-max-new input[type=number]").press("Enter")
    page.get_by_role("button", name="Compare", exact=True).click()
    page.get_by_text("The red outline marks").wait_for()
    page.screenshot(path=str(SHOTS / "compare.png"), full_page=True)
    assert "tok/s" in page.locator("#rl-c-stats").inner_text()

    page.get_by_role("tab", name="Trade-off").click()
    page.locator("#rl-tradeoff .js-plotly-plot").wait_for()
    page.screenshot(path=str(SHOTS / "tradeoff.png"), full_page=True)

    page.get_by_role("tab", name="About").click()
    page.get_by_text("Three ways to skip attention").wait_for()
    page.screenshot(path=str(SHOTS / "about.png"), full_page=True)
    page.close()
