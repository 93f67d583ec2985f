"""A real browser (Debian's headless Chromium, driven by Playwright) uses the app with the embedded model.

It generates, steers the threshold during the run, looks at the what-if view, switches tabs and
saves screenshots to assets/screenshots/ (the README shows them). Skips, with the reason, where
Chromium or the playwright package is missing; never downloads a browser (`playwright install`).
The app runs in this process; the steered run is held (tests/holding.py) while the browser moves the
slider, so the move always lands mid-run however slow the browser or the server is.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest
from holding import Holding

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
def engine(embedded):
    from routerlab.core.decode.engine import Engine

    return Holding(Engine(embedded.model, embedded.tokenizer, name=embedded.name))


@pytest.fixture(scope="module")
def app(engine):
    """The app as `python app.py` serves it: per-layer costs measured at start-up (the estimated speedup)."""
    res = ui.Resources(engine, ui.Limits(max_new_tokens=256), details=f"Model **{engine.name}** loaded ({engine.n_layers} layers).")
    res.measure_costs()
    demo = ui.build_demo(res)
    demo.queue(max_size=8)
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=_free_port(), prevent_thread_lock=True, quiet=True, **ui.launch_options())
    yield url, res
    demo.close()


@pytest.fixture(scope="module")
def app_url(app):
    return app[0]


def _set_slider(page, value: float) -> None:
    box = page.locator("#rl-threshold input[type=number]")
    box.fill(f"{value}")
    box.press("Enter")


def test_generate_steer_what_if_tabs_and_screenshots(browser, app_url, engine):
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    try:
        _explore_tour(page, app_url, engine)
    except Exception:
        page.screenshot(path=str(Path(tempfile.gettempdir()) / "routerlab-browser-failure.png"), full_page=True)
        raise
    finally:
        page.close()


def _tokens_shown(n: int) -> str:
    return f"document.querySelectorAll('#rl-text .rl-text .rl-tok').length >= {n}"


def _strip_cells(n: int) -> str:
    return ("(() => { const gd = document.querySelector('#rl-heatmap .js-plotly-plot');"
            " const t = gd && gd.data && gd.data.find((d) => d.name === 'quality cost');"
            f" return !!t && t.x.length >= {n}; }})()")


PENDING_JS = """() => {
    const t = document.querySelector('#rl-heatmap .js-plotly-plot').data.find((d) => d.name === 'not measured yet');
    const z = t.z;
    if (Array.isArray(z)) return z.flat().filter((v) => v !== null && !Number.isNaN(v)).length;
    const bytes = Uint8Array.from(atob(z.bdata), (ch) => ch.charCodeAt(0));
    return Array.from(new Float32Array(bytes.buffer)).filter((v) => !Number.isNaN(v)).length;
}"""


def _explore_tour(page, app_url, engine):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.set_default_timeout(180_000)
    page.goto(app_url)
    page.get_by_role("button", name="Generate", exact=True).wait_for()

    # Gradio runs the Blocks' `js` once the app has mounted, which may be just after the button is drawn: wait for it
    # (a fixed read here failed once under a full test run's load), but not for ever.
    try:
        page.wait_for_function("typeof window.routerlabWhatIfPreview === 'function'", timeout=30_000)
    except Exception:
        raise AssertionError("the what-if preview script did not load within 30 s of the page") from None

    # 0. an example prompt clicked goes into the prompt box (ui/checked_inputs.ExamplePrompts), and back to the first
    examples = page.locator("#rl-examples button")
    first = page.locator("#rl-prompt textarea").input_value()
    examples.nth(1).click()
    page.wait_for_function(f"document.querySelector('#rl-prompt textarea')?.value !== {json.dumps(first)}")
    examples.nth(0).click()
    page.wait_for_function(f"document.querySelector('#rl-prompt textarea')?.value === {json.dumps(first)}")

    # 1. a streamed run with the shipped token-level routers (untrained ones where none ship), steered while it runs:
    # held after 12 tokens until the slider's move reached the server, then held at 40 for the streaming screenshot.
    page.locator("#rl-prompt textarea").fill("Write a short story about a lighthouse keeper who finds a message in a bottle.")
    page.locator("#rl-max-new input[type=number]").fill("200")
    page.locator("#rl-max-new input[type=number]").press("Enter")
    with engine.hold(after=12, max_new_tokens=200) as held:
        page.get_by_role("button", name="Generate", exact=True).click()
        held.wait()
        page.wait_for_function(_tokens_shown(12))
        page.wait_for_function(_strip_cells(12))  # a live frame drawn
        page.evaluate("document.querySelector('#rl-heatmap .js-plotly-plot').routerlabMark = 'first frame'")
        _set_slider(page, 0.55)
        page.locator("#rl-status", has_text="0.55").wait_for()  # the server's answer: the move applies from token 13
        assert held.control.threshold == 0.55
        held.release(until=40)
        held.wait()
        page.wait_for_function(_tokens_shown(40))
        page.wait_for_function(_strip_cells(40))  # the heatmap caught up: its quality strip under all 40 tokens
        assert page.evaluate(PENDING_JS) >= 1, "tokens whose KL is not measured yet show grey"
        assert page.evaluate("(() => { const gd = document.querySelector('#rl-heatmap .js-plotly-plot');"
                             " return [gd.routerlabMark, gd.layout.meta.routerlab]; })()") == ["first frame", "live"], \
            "live frames are drawn into the plot already there (no remount per frame)"
        page.screenshot(path=str(SHOTS / "explore-streaming.png"), full_page=True)
    page.locator("#rl-stats", has_text="stopped:").wait_for()  # the run's final view
    assert page.locator("#rl-heatmap .js-plotly-plot").count() == 1
    page.locator("#rl-heatmap .gtitle", has_text="Recorded run").wait_for()
    assert re.search(r"t→0\.55 · \d+ tok/s", page.locator("#rl-heatmap").text_content()), "the dashed line where the threshold moved, its stretch's speed"
    assert page.evaluate(PENDING_JS) == 0, "at the end every token's quality cost is measured"
    stats = page.locator("#rl-stats").inner_text()
    assert "mean KL" in stats and "agreement" in stats and "est. speedup" in stats
    # where the text leaves the full model's greedy answer (or that it never does), and the repetition flag
    assert "leaves the full model's answer" in stats and "repeats itself" in stats
    assert re.search(r"token \d+: “|not in \d+ tokens", stats), stats
    assert re.search(r"(^|\n)no(\n|$)|yes, from token \d+", stats), stats
    assert "own prefix" in page.locator("#rl-stats .rl-card", has_text="top-1 agreement").get_attribute("title")
    # the routed speed against the full model's, decoded side by side (ui/tabs/side_by_side.py), beside the estimate:
    # measured by itself after a run that had the server to itself (16 tokens each), again on the button (32 each)
    page.locator("#rl-vs-text", has_text="measured side by side on this machine now: 16 tokens each").wait_for()
    page.screenshot(path=str(SHOTS / "explore-done.png"), full_page=True)
    page.locator("#rl-vs-full").click()
    page.locator("#rl-vs-text", has_text="measured side by side on this machine now: 32 tokens each").wait_for()
    said = page.locator("#rl-vs-text").inner_text()
    assert re.search(r"\d\.\d\d× the full model's decode speed", said) and "Estimated from per-layer costs" in said, said

    # 2. after the run: the slider shows a labelled what-if view from the recorded scores
    _set_slider(page, 0.45)
    page.locator("#rl-status strong", has_text="What-if view").wait_for()
    page.wait_for_function("document.querySelector('#rl-heatmap .gtitle') && document.querySelector('#rl-heatmap .gtitle').textContent.includes('WHAT-IF')")
    page.locator("#rl-heatmap").screenshot(path=str(SHOTS / "heatmap-what-if.png"))
    assert page.get_by_role("button", name="Regenerate at this threshold").is_visible()
    assert page.locator("#rl-dl-trace").is_visible() and page.locator("#rl-dl-html").is_visible()
    # the downloads are this run's, served from Gradio's cache as they were written (session.workdir)
    with page.expect_download() as got:
        page.locator("#rl-dl-trace").click()
    saved = json.loads(Path(got.value.path()).read_text())
    assert any(not step["is_prompt"] for step in saved["steps"]) and saved["meta"]["kv_policy"]
    with page.expect_download() as got:  # made in the page from what it shows (ui/web/heatmap_export.py), plotly.js inside
        page.locator("#rl-dl-html").click()
    assert got.value.suggested_filename == "routerlab-heatmap.html"
    shown = page.evaluate("document.querySelector('#rl-heatmap .js-plotly-plot').data.length")
    with tempfile.TemporaryDirectory() as folder:
        exported = Path(folder) / "heatmap.html"
        got.value.save_as(exported)
        alone = page.context.browser.new_page()  # a page of its own, offline: nothing but the file itself may load
        alone.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:") else route.abort())
        alone.goto(exported.as_uri())
        alone.locator(".js-plotly-plot g.xtick text").first.wait_for()
        assert alone.evaluate("document.querySelector('.js-plotly-plot').data.length") == shown
        assert "WHAT-IF" in alone.locator(".gtitle").text_content()  # what the page showed when clicked
        alone.close()

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
    page.locator("#rl-status", has_text="red outline marks").wait_for()
    page.screenshot(path=str(SHOTS / "compare.png"), full_page=True)
    assert "tok/s" in page.locator("#rl-c-stats").inner_text()

    page.get_by_role("tab", name="Trade-off").click()
    page.locator("#rl-tradeoff .js-plotly-plot").wait_for()
    page.screenshot(path=str(SHOTS / "tradeoff.png"), full_page=True)

    page.get_by_role("tab", name="About").click()
    page.get_by_text("Three ways to skip attention").wait_for()
    page.screenshot(path=str(SHOTS / "about.png"), full_page=True)


def test_threshold_ladder_and_tradeoff_tab_screenshots(browser, app_url):
    """The Compare tab's threshold ladder (the full model and the default set at 0.3 / 0.5 / 0.7, one
    token each in turn) and the Trade-off tab's three figures; a click on a tuned row sets the threshold."""
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    try:
        _ladder_and_tradeoff(page, app_url)
    except Exception:
        page.screenshot(path=str(Path(tempfile.gettempdir()) / "routerlab-browser-failure.png"), full_page=True)
        raise
    finally:
        page.close()


def _ladder_and_tradeoff(page, app_url):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.set_default_timeout(300_000)
    page.goto(app_url)
    page.get_by_role("tab", name="Compare").click()
    page.locator("#rl-c-prompt textarea").fill("Write a short story about a lighthouse keeper who finds a message in a bottle.")
    page.locator("#rl-max-new input[type=number]").fill("64")
    page.locator("#rl-max-new input[type=number]").press("Enter")
    assert [float(page.locator(f"#rl-c-t{k} input").input_value()) for k in (1, 2, 3)] == [0.3, 0.5, 0.7]
    page.get_by_role("button", name="Compare", exact=True).click()
    page.locator("#rl-status", has_text="red outline marks").wait_for()
    table = page.locator("#rl-c-stats table.rl-ladder").inner_text()
    for label in ("full model", "threshold 0.30", "threshold 0.50", "threshold 0.70", "mean KL", "speedup vs full", "first difference"):
        assert label in table, label
    for k in range(4):
        assert page.locator(f"#rl-c-col{k} .rl-text .rl-tok").count() >= 20, f"column {k} has its text"
    page.screenshot(path=str(SHOTS / "compare-ladder.png"), full_page=True)

    page.get_by_role("tab", name="Trade-off").click()
    for plot in ("#rl-tradeoff", "#rl-t-speed", "#rl-t-time"):
        page.locator(f"{plot} .js-plotly-plot").wait_for()
    headers = page.locator("#rl-t-table thead").inner_text()
    assert "skipped (all layers)" in headers and "speedup (measured)" in headers and "perplexity rise" in headers
    page.screenshot(path=str(SHOTS / "tradeoff-tab.png"), full_page=True)
    page.locator("#rl-t-time").screenshot(path=str(SHOTS / "time-split.png"))
    cell = page.locator('#rl-t-table [data-testid="cell-0-3"]')  # the first row's threshold: a tuned row
    value = float(cell.inner_text())
    cell.click()
    page.locator("#rl-status", has_text="from the trade-off table").wait_for()
    assert abs(float(page.locator("#rl-threshold input[type=number]").input_value()) - value) <= 0.005


@pytest.fixture(scope="module")
def long_run_url(tmp_path_factory):
    """A 30-layer tiny random model with random routers (saved and loaded as a shipped set): 300 tokens in seconds."""
    import sys

    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from test_ui import char_tokenizer, random_routers  # noqa: E402

    from routerlab.core.base.config import RoutingConfig
    from routerlab.core.decode.engine import Engine
    from routerlab.core.model.models import tiny_model
    from routerlab.core.routing.router import RouterSet
    from routerlab.tuning.checkpoint import save_routers

    model = tiny_model("llama", num_hidden_layers=30, max_position_embeddings=1024)
    routers = RouterSet.zeros(model, RoutingConfig.from_granularity("attention-token", range(1, 29)))
    g = torch.Generator().manual_seed(0)
    for r in routers.routers.values():
        r.proj.weight.data = torch.randn(r.proj.weight.shape, generator=g) * 0.15
    folder = tmp_path_factory.mktemp("routers")
    save_routers(routers, folder / "random", model)
    engine = Engine(model, char_tokenizer(), name="tiny-30-layers")
    res = ui.Resources(engine, ui.Limits(max_new_tokens=300), router_sets=ui.available_router_sets(folder), prompts=["Hello"])
    demo = ui.build_demo(res)
    demo.queue()
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=_free_port(), prevent_thread_lock=True, quiet=True, **ui.launch_options())
    yield url
    demo.close()


COUNT_RAN_JS = """() => {
    const z = document.querySelector('#rl-heatmap .js-plotly-plot').data[0].z;
    if (Array.isArray(z)) return z.flat().filter((v) => v !== null && !Number.isNaN(v)).length;
    const bytes = Uint8Array.from(atob(z.bdata), (ch) => ch.charCodeAt(0));
    return Array.from(new Float32Array(bytes.buffer)).filter((v) => !Number.isNaN(v)).length;
}"""

WATCH_JS = """(target) => {
    window.__t0 = performance.now(); window.__server = null;
    const status = document.querySelector('#rl-status');
    new MutationObserver((m, o) => {
        if (status.textContent.includes('at threshold ' + target)) { window.__server = performance.now(); o.disconnect(); }
    }).observe(status, {subtree: true, childList: true, characterData: true});
}"""

PREVIEW_JS = """(value) => {
    const t0 = performance.now();
    window.routerlabWhatIfPreview(value);
    return performance.now() - t0;
}"""


TRAIN_TEXT = "\n\n".join(
    f"Note {k}: the keeper trims the lamp wick at dusk, winds the clockwork that turns the lens, and logs the passing "
    f"ships, the wind and the sea state in the station book before the night watch begins." for k in range(16))
CHECKPOINT_OR_END = """() => {
  const gd = document.querySelector('#rl-tr-curves .js-plotly-plot');
  const bar = document.querySelector('#rl-tr-progress .rl-train-progress');
  const ended = bar && ['done', 'stopped', 'failed', 'cancelled'].includes(bar.dataset.phase);
  return ended || !!(gd && gd.data && gd.data.some((t) => (t.name || '').startsWith('held-out'))); }"""
HEAT_Z = """() => { const gd = document.querySelector('#rl-heatmap .js-plotly-plot');
  return JSON.stringify([gd.data[0].z, gd.data[1].z]); }"""


def _generate(page, before_status: str):
    page.evaluate(WATCH_BUSY)
    page.get_by_role("button", name="Generate", exact=True).click()
    page.wait_for_function(DONE_AFTER_BUSY, arg=before_status)
    return page.evaluate(HEAT_Z)


def _pick_set(page, label_start: str):
    page.locator("#rl-granularity input").click()
    page.get_by_role("option", name=label_start).first.click()


def _open_train_tab(page, app_url: str) -> None:
    page.goto(app_url)
    page.get_by_role("button", name="Generate", exact=True).wait_for()
    page.get_by_role("tab", name="Train").click()


def test_train_tab_train_stop_menu_generate_download_upload(browser, app_url, tmp_path):
    """A short training on the built-in prompts (bad pasted text first): progress, curves and a held-out checkpoint
    appear, Stop keeps the set, it joins the menu and
    generates with skipped cells; its zip downloads, uploads back and decides identically; bad text and a bad
    upload each get a clear message. The mid-run screenshot is the README's picture of the Train tab."""
    page = browser.new_page(viewport={"width": 1440, "height": 1500})
    page.set_default_timeout(240_000)
    try:
        _open_train_tab(page, app_url)
        # bad pasted data: a message, the text stays
        page.get_by_label("my own text").check()
        page.locator("#rl-tr-text textarea").fill("Far too short.")
        page.locator("#rl-tr-start").click()
        page.wait_for_function("document.querySelector('#rl-status')?.innerText.includes('training needs at least')")
        assert page.locator("#rl-tr-text textarea").input_value() == "Far too short."
        page.locator("#rl-tr-text textarea").fill(TRAIN_TEXT)  # what a visitor pasted stays while the built-in data trains
        # a real training on the built-in prompts, stopped after its first held-out checkpoint (or seen to its end, if the
        # machine is so slow that its budget allows no checkpoint: nothing here waits for a number of steps)
        page.get_by_label("built-in prompts").check()
        page.locator("#rl-tr-minutes input[type=number]").fill("3")
        page.locator("#rl-tr-minutes input[type=number]").press("Enter")
        page.locator("#rl-tr-start").click()
        page.wait_for_function(CHECKPOINT_OR_END)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.evaluate("document.querySelector('#rl-tr-progress').scrollIntoView()")
        page.screenshot(path=str(SHOTS / "train.png"), full_page=False)
        if page.get_attribute("#rl-tr-progress .rl-train-progress", "data-phase") == "training":
            asked = time.perf_counter()
            page.locator("#rl-tr-stop").click()
            page.wait_for_function("!document.querySelector('#rl-tr-start').disabled")  # Stop, then its chained tick
            print(f"\nStart enabled again {time.perf_counter() - asked:.1f} s after Stop")
            page.wait_for_function("document.querySelector('#rl-tr-result')?.innerText.includes('uncalibrated')")
        else:  # it ended by itself: calibrated and compared
            page.wait_for_function("document.querySelector('#rl-tr-result')?.innerText.includes('mine at 0.5')")
        # the set generates in Explore, with skipped cells at a high threshold
        _pick_set(page, "mine: attention-token")
        page.get_by_role("tab", name="Explore").click()
        page.locator("#rl-max-new input[type=number]").fill("16")
        page.locator("#rl-max-new input[type=number]").press("Enter")
        page.locator("#rl-threshold input[type=number]").fill("0.8")
        page.locator("#rl-threshold input[type=number]").press("Enter")
        mine = _generate(page, page.inner_text("#rl-status"))
        assert any(v is not None for row in json.loads(mine)[1] for v in row), "no skipped cell"
        # download, upload back, same decisions
        page.get_by_role("tab", name="Train").click()
        with page.expect_download() as got:
            page.locator("#rl-tr-download").click()
        archive = tmp_path / got.value.suggested_filename
        got.value.save_as(archive)
        page.locator("#rl-tr-upload input[type=file]").set_input_files(str(archive))
        page.wait_for_function("document.querySelector('#rl-status')?.innerText.includes('Loaded uploaded')")
        _pick_set(page, "uploaded: attention-token")
        page.get_by_role("tab", name="Explore").click()
        page.locator("#rl-threshold input[type=number]").fill("0.8")
        page.locator("#rl-threshold input[type=number]").press("Enter")
        assert _generate(page, page.inner_text("#rl-status")) == mine
        # a bad upload
        page.get_by_role("tab", name="Train").click()
        bad = tmp_path / "bad.zip"
        bad.write_bytes(b"PK not a zip at all")
        page.locator("#rl-tr-upload input[type=file]").set_input_files(str(bad))
        page.wait_for_function("document.querySelector('#rl-status')?.innerText.includes('not a readable zip')")
        assert "not a readable zip" in page.locator("#rl-tr-upload-note").inner_text()  # also beside the upload box
    except Exception:
        page.screenshot(path=str(Path(tempfile.gettempdir()) / "routerlab-browser-train-failure.png"), full_page=True)
        raise
    finally:
        page.close()


def test_what_if_redraw_latency_for_300_tokens(browser, long_run_url, capsys):
    """What-if redraw of a finished 300-token, 30-layer run: the in-browser preview, then the server's full view.

    Timings are printed, not asserted; the preview must agree with the server's decisions.
    """
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.set_default_timeout(120_000)
    page.goto(long_run_url)
    page.locator("#rl-max-new input[type=number]").fill("290")
    page.locator("#rl-max-new input[type=number]").press("Enter")
    page.get_by_role("button", name="Generate", exact=True).click()
    page.locator("#rl-status", has_text="Done:").wait_for()
    assert page.locator("#rl-heatmap .xtick").count() > 20
    box = page.locator("#rl-threshold input[type=number]")
    server, direct = [], []
    for value in (0.62, 0.38, 0.55, 0.47, 0.66):
        # the in-browser preview on its own (what a slider drag shows), checked against the server's view below
        direct.append(page.evaluate(PREVIEW_JS, value))
        assert "in your browser" in page.locator("#rl-heatmap .gtitle").text_content()
        previewed = page.evaluate(COUNT_RAN_JS)
        box.fill(f"{value}")
        page.evaluate(WATCH_JS, f"{value:.2f}")
        box.press("Enter")
        page.wait_for_function("window.__server !== null")
        page.wait_for_function("document.querySelector('#rl-heatmap .gtitle')?.textContent.includes('not a new run):')")
        server.append(page.evaluate("window.__server - window.__t0"))
        assert page.evaluate(COUNT_RAN_JS) == previewed, "the browser preview and the server disagree"
    page.close()
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    with capsys.disabled():
        print(f"\n[browser] what-if at ~300 tokens x 30 layers: in-browser preview (compute + draw) median {median(direct):.0f} ms "
              f"{[round(t) for t in direct]}; Enter -> the server's full view (tint, stats, text) median {median(server):.0f} ms "
              f"{[round(t) for t in server]}")


# Every trace of a plotly figure as plain arrays (binary arrays decoded), for comparing what two figures draw.
FIGURE_DATA_JS = """(fig) => {
    const gd = fig || document.querySelector('#rl-heatmap .js-plotly-plot');
    const types = {f8: Float64Array, f4: Float32Array, i4: Int32Array, u4: Uint32Array, i2: Int16Array, u2: Uint16Array,
                   i1: Int8Array, u1: Uint8Array};
    const plain = (v) => {
        if (v && v.bdata !== undefined) {
            const bytes = Uint8Array.from(atob(v.bdata), (ch) => ch.charCodeAt(0));
            return Array.from(new types[v.dtype](bytes.buffer)).map((x) => Number.isNaN(x) ? 'NaN' : x);
        }
        if (Array.isArray(v) || ArrayBuffer.isView(v)) return Array.from(v, (x) => plain(x));
        return (typeof v === 'number' && Number.isNaN(v)) ? 'NaN' : (v === undefined ? null : v);
    };
    return gd.data.map((t) => ({name: t.name || '', type: t.type, x: plain(t.x), y: plain(t.y), z: plain(t.z),
                                text: plain(t.text), customdata: plain(t.customdata)}));
}"""
SHOWN_AS_JS = """(html) => { const div = document.createElement('div'); div.style.position = 'absolute';
    div.className = 'gradio-container'; div.innerHTML = html; document.body.appendChild(div);
    const text = div.innerText; div.remove(); return text; }"""


def _press_generate(page, prompt: str, max_new: int) -> None:
    """Type a prompt and the max new tokens, watch the Generate button (DONE_AFTER_BUSY), and press it."""
    page.locator("#rl-prompt textarea").fill(prompt)
    page.locator("#rl-max-new input[type=number]").fill(str(max_new))
    page.locator("#rl-max-new input[type=number]").press("Enter")
    page.evaluate(WATCH_BUSY)
    page.get_by_role("button", name="Generate", exact=True).click()


def test_a_long_documents_final_view_shows_what_its_trace_says(browser, long_run_url):
    """A document of 700 tokens (read ahead in chunks, quality measured) and 120 new tokens, streamed: at the run's
    end the page's text, heatmap (decisions, quality strip and its colours), and stats are the final view built from
    the run's own downloaded trace, value for value: the streamed frames left nothing of theirs behind."""
    from routerlab.core.records.trace import Trace
    from routerlab.ui.figures import plots

    document = " ".join(f"Line {k}: the tide table for the harbour says high water at {k % 12 + 1} o'clock." for k in range(12))[:700]
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.set_default_timeout(120_000)
    try:
        page.goto(long_run_url)
        _press_generate(page, document, 120)
        page.wait_for_function(DONE_AFTER_BUSY, arg="")
        page.locator("#rl-heatmap .gtitle", has_text="Recorded run").wait_for()
        with page.expect_download() as got:
            page.locator("#rl-dl-trace").click()
        trace = Trace.from_json(Path(got.value.path()).read_text())
        assert len(trace.prompt_steps) >= 512 and len(trace.generated_steps) == 120
        assert all(s.kl_full is not None for s in trace.generated_steps), "every token's quality cost measured"

        expected = json.loads(plots.heatmap_json(trace))
        shown = page.evaluate(FIGURE_DATA_JS)
        assert [t["name"] for t in shown] == [t.get("name", "") for t in expected["data"]]
        drawn = page.evaluate(f"() => ({FIGURE_DATA_JS})({{data: {json.dumps(expected['data'])}}})")
        for got_trace, want in zip(shown, drawn):
            assert got_trace == want, f"the page's {want['name'] or want['type']} differs from the trace's"
        assert page.locator("#rl-text").inner_text() == page.evaluate(SHOWN_AS_JS, plots.token_html(trace))
        stats = page.evaluate(SHOWN_AS_JS, plots.stats_html(plots.live_stats(trace)))
        assert page.locator("#rl-stats").inner_text() == stats
        assert "mean KL" in stats and f"{len(trace.generated_steps)} generated + {len(trace.prompt_steps)} prompt tokens" in stats
        # the run had the server to itself: its speed against the full model's, measured side by side at once
        page.locator("#rl-vs-text", has_text="measured side by side").wait_for()
        assert re.search(r"\d\.\d\d× the full model's decode speed", page.locator("#rl-vs-text").inner_text())
    finally:
        page.close()


OVERHEAD_PROMPT = "Write a long story about a dragon who learns to read. Describe every chapter in detail."
OVERHEAD_TOKENS = 96
# A run is over when the status says Done: after the Generate button was seen busy. Comparing the status with
# the one before is not enough: two runs of the same tokens can end with the very same status line.
WATCH_BUSY = """() => { window.__rlBusy = false; const b = document.querySelector('#rl-generate');
  new MutationObserver(() => { if (b.disabled) window.__rlBusy = true; }).observe(b, {attributes: true}); }"""
DONE_AFTER_BUSY = """(before) => { const s = document.querySelector('#rl-status').innerText;
  return (s !== before || window.__rlBusy) && s.includes('Done:') && !document.querySelector('#rl-generate').disabled; }"""
OVERHEAD_ROUNDS = int(os.environ.get("ROUTERLAB_OVERHEAD_ROUNDS", "8"))  # more rounds: a tighter median, a longer run
IN_RUN_TOKENS, IN_RUN_RUNS = 192, 4
WINDOW_S, EDGE_S = 1.5, 0.25  # within-run windows: frames through / held back in turns; steps this near an edge are left out


# The reports below measure and print (never assert): minutes of a test run for numbers that docs/results.md quotes
# (History of measurements). They run with `make browser-reports` (ROUTERLAB_BROWSER_REPORTS=1), not in every
# `make test` (conftest.py).


@pytest.mark.report
def test_report_streaming_overhead_in_the_browser(browser, app, engine, capsys, monkeypatch):
    """Decode tokens/s of a run streamed to a real browser against the same run without streaming, with the
    quality switch off and on; printed, never asserted (machines are noisy). docs/results.md ("Streaming
    overhead, measured", in its History of measurements) has the method and the numbers measured. Two measures:

    - between runs: the same prompt, router set, threshold and KV policy (read from the page), greedy,
      streamed to the browser or direct (engine.run in a worker thread, as the app decodes); each of
      OVERHEAD_ROUNDS rounds runs all four (direct / browser x quality off / on) in a rotating order,
      and a ratio is the median of per-round ratios. The engine times every decode step itself.
    - within a run: one streamed run whose frames are let through for WINDOW_S seconds, then held back
      for WINDOW_S (the page then gets nothing, as in a direct run), and so on; the median decode step
      in streaming windows against the median in quiet ones (steps near a window's edge left out).
      Slow spells of a shared machine fall on both kinds of window alike.
    """
    import statistics
    import threading
    import time

    from routerlab.core.decode.generation import Generation
    from routerlab.ui.state import stream

    url, res = app
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.set_default_timeout(300_000)
    page.goto(url)
    page.get_by_role("button", name="Generate", exact=True).wait_for()
    page.locator("#rl-prompt textarea").fill(OVERHEAD_PROMPT)
    threshold = float(page.locator("#rl-threshold input[type=number]").input_value())
    label = page.locator("#rl-granularity input").input_value()
    policy = page.locator("#rl-kv input:checked").input_value()
    routers = res.routers_for(engine, label)

    def set_tokens(n: int) -> None:
        page.locator("#rl-max-new input[type=number]").fill(str(n))
        page.locator("#rl-max-new input[type=number]").press("Enter")

    def direct(quality: bool):
        config = res.generate_config(OVERHEAD_TOKENS, 0.0, threshold, policy, quality=quality)
        runs = []
        worker = threading.Thread(target=lambda: runs.append(engine.run(OVERHEAD_PROMPT, routers, config)))
        worker.start()
        worker.join()
        return runs[0]

    def streamed(quality: bool):
        page.locator("#rl-quality input[type=checkbox]").set_checked(quality)
        before = page.locator("#rl-status").inner_text()
        with engine.hold(after=10**9, prompt=OVERHEAD_PROMPT, quality=quality) as run:  # never held: it only hands us the run's trace
            page.evaluate(WATCH_BUSY)
            page.get_by_role("button", name="Generate", exact=True).click()
            run.wait_ended(timeout=300)
        page.wait_for_function(DONE_AFTER_BUSY, arg=before)
        return run.trace

    conditions = [("direct", False), ("browser", False), ("direct", True), ("browser", True)]
    rates: dict[tuple[str, bool], list[float]] = {c: [] for c in conditions}
    chunks: dict[str, list[tuple[int, float]]] = {"direct": [], "browser": []}  # quality on: (chunks scored, seconds scoring)
    in_run: dict[bool, list[tuple[float, float]]] = {False: [], True: []}  # (median step streaming, median step quiet)
    try:
        set_tokens(OVERHEAD_TOKENS)
        for r in range(OVERHEAD_ROUNDS):
            for where, quality in conditions[r % 4:] + conditions[: r % 4]:  # the order rotates every round
                trace = direct(quality) if where == "direct" else streamed(quality)
                rates[where, quality].append(trace.decode_tokens_per_second())
                if quality:
                    chunks[where].append((trace.meta.get("quality_chunks", 0), trace.meta.get("quality_seconds", 0.0)))

        # within a run: frames through in even windows, held back in odd ones; each step stamped when recorded
        stamps: dict[int, float] = {}
        record, frames, t0 = Generation._record, stream.Decoder.frames, time.perf_counter()

        def stamped(*args):
            step = record(*args)
            stamps[id(step)] = time.perf_counter()
            return step

        def gated(self, *args, **kwargs):
            for frame in frames(self, *args, **kwargs):
                if self.done.is_set() or int((time.perf_counter() - t0) / WINDOW_S) % 2 == 0:
                    yield frame

        monkeypatch.setattr(Generation, "_record", stamped)
        monkeypatch.setattr(stream.Decoder, "frames", gated)
        set_tokens(IN_RUN_TOKENS)
        for _ in range(IN_RUN_RUNS):
            for quality in (False, True):
                trace = streamed(quality)
                kinds: dict[int, list[float]] = {0: [], 1: []}
                for step in trace.generated_steps:
                    end = stamps.get(id(step), 0.0) - t0
                    start = end - step.seconds
                    phase = int(start / WINDOW_S)
                    if step.seconds > 0 and int(end / WINDOW_S) == phase and min(start - phase * WINDOW_S, (phase + 1) * WINDOW_S - end) > EDGE_S:
                        kinds[phase % 2].append(step.seconds)
                if kinds[0] and kinds[1]:
                    in_run[quality].append((statistics.median(kinds[0]), statistics.median(kinds[1])))
    finally:
        page.close()
    med = statistics.median

    def ratio(a, b) -> float:  # the median of per-round ratios: a slow spell falls on both runs of a round
        return med(x / y for x, y in zip(rates[a], rates[b]))

    with capsys.disabled():
        print(f"\n[browser] streaming overhead, {engine.name}, {label} at {threshold:.2f} ({policy}), torch threads {_threads()}:")
        print(f"  between runs ({OVERHEAD_TOKENS} new tokens, {OVERHEAD_ROUNDS} rounds in rotating order), decode tok/s medians [per round]:")
        for q in (False, True):
            print(f"    quality {'on ' if q else 'off'}: direct {med(rates['direct', q]):.2f} {[round(x, 2) for x in rates['direct', q]]}  "
                  f"browser {med(rates['browser', q]):.2f} {[round(x, 2) for x in rates['browser', q]]}  "
                  f"streaming overhead {1 - ratio(('browser', q), ('direct', q)):+.1%}")
        print(f"    quality on costs (1 - on/off): direct {1 - ratio(('direct', True), ('direct', False)):+.1%}, "
              f"browser {1 - ratio(('browser', True), ('browser', False)):+.1%}")
        for where, runs in chunks.items():  # the quality pass's chunks (full, or partial when a token waited 2 s)
            print(f"    quality on, {where}: chunks scored per run {[n for n, _ in runs]}, seconds per chunk "
                  f"median {med(t / n for n, t in runs if n):.2f} {[round(t / n, 2) for n, t in runs if n]}")
        print(f"  within a run ({IN_RUN_TOKENS} new tokens, frames let through / held back in turns of {WINDOW_S} s), "
              "median decode step streaming vs quiet [per run]:")
        for q in (False, True):
            pairs = in_run[q]
            if pairs:
                print(f"    quality {'on ' if q else 'off'}: streaming overhead {med(1 - b / a for a, b in pairs):+.1%} "
                      f"{[f'{1000 * a:.0f} vs {1000 * b:.0f} ms' for a, b in pairs]}")


CPU_TOKENS = 192


def _chromium_seconds() -> float:
    """CPU seconds (user + system) used so far by every Chromium process on this machine (from /proc)."""
    import glob

    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for folder in glob.glob("/proc/[0-9]*"):
        try:
            with open(f"{folder}/comm") as f:
                if "chrom" not in f.read():
                    continue
            with open(f"{folder}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue  # a process that ended meanwhile
    return total


@pytest.mark.report
def test_report_where_the_page_time_goes(browser, app, engine, capsys, monkeypatch):
    """Printed, never asserted: the browser side of docs/results.md ("Streaming overhead, measured: where the
    page's time goes").

    - Chromium's CPU, as a share of one core, over 10 s with the app's page open and idle, and with about:blank;
    - the same over a streamed run of CPU_TOKENS tokens (quality off), all frames vs none until the end;
    - main-thread time per heatmap frame (Chrome DevTools `Performance.getMetrics`), six frames of one run
      replayed as the page draws live frames (Plotly.react into the plot already there, layout.LIVE_HEATMAP_JS),
      against the same frames drawn as gr.Plot draws every new figure (a remount: a fresh plot, then
      Plots.resize), and against frames with the final figure's colour-bar numbers and token labels.
    """
    import json
    import time

    from routerlab.ui.figures import plots
    from routerlab.ui.state import stream

    if not Path("/proc/self/stat").exists():
        pytest.skip("no /proc: Chromium's CPU time cannot be read here")
    url, res = app

    def idle_share(page, target: str) -> float:
        page.goto(target)
        time.sleep(3.0)
        c0 = _chromium_seconds()
        time.sleep(10.0)
        return (_chromium_seconds() - c0) / 10.0

    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.set_default_timeout(300_000)
    try:
        blank, idle = idle_share(page, "about:blank"), idle_share(page, url)
        page.get_by_role("button", name="Generate", exact=True).wait_for()
        page.locator("#rl-prompt textarea").fill(OVERHEAD_PROMPT)
        page.locator("#rl-max-new input[type=number]").fill(str(CPU_TOKENS))
        page.locator("#rl-max-new input[type=number]").press("Enter")
        page.locator("#rl-quality input[type=checkbox]").set_checked(False)
        frames, runs = stream.Decoder.frames, {}
        only_the_end = lambda self, *a, **k: (f for f in frames(self, *a, **k) if self.done.is_set())  # noqa: E731
        for name, kind in (("all frames", frames), ("no frames until the end", only_the_end)) * 2:
            monkeypatch.setattr(stream.Decoder, "frames", kind)
            before = page.locator("#rl-status").inner_text()
            with engine.hold(after=10**9, prompt=OVERHEAD_PROMPT) as run:  # never held: it tells when decoding ended
                c0, t0 = _chromium_seconds(), time.perf_counter()
                page.evaluate(WATCH_BUSY)
                page.get_by_role("button", name="Generate", exact=True).click()
                run.wait_ended(timeout=300)
            page.wait_for_function(DONE_AFTER_BUSY, arg=before)
            runs.setdefault(name, []).append((_chromium_seconds() - c0) / (time.perf_counter() - t0))
        monkeypatch.setattr(stream.Decoder, "frames", frames)

        # the replay: one run cut at six lengths, each drawn into a plot on the app's page as Gradio draws a frame
        routers = res.routers_for(engine, page.locator("#rl-granularity input").input_value())
        full = engine.run(OVERHEAD_PROMPT, routers, res.generate_config(CPU_TOKENS, 0.0, 0.5, "kv"))
        start = full.meta.get("prompt_tokens", 0)
        cuts = [type(full)(full.n_layers, full.steps[: start + k], full.meta) for k in (32, 64, 96, 128, 160, CPU_TOKENS)]
        cdp = page.context.new_cdp_session(page)
        cdp.send("Performance.enable")
        page.evaluate("() => { const d = document.createElement('div'); d.id = 'rl-replay'; d.style.width = '1300px';"
                      " document.querySelector('#rl-heatmap').parentElement.prepend(d); }")
        # drawn as the page draws a live frame (Plotly.react into the plot already there), or as gr.Plot draws each
        # new figure (Gradio 6's Plot remounts: a fresh div, Plotly.react into it, then Plots.resize)
        react = """async (figures) => { const gd = document.getElementById('rl-replay'); Plotly.purge(gd);
            for (const f of figures) { const e = JSON.parse(f); e.layout.autosize = true;
              await Plotly.react(gd, e.data, e.layout, {responsive: true}); await new Promise((r) => setTimeout(r, 250)); } }"""
        remount = """async (figures) => { for (const f of figures) { const old = document.getElementById('rl-replay');
              const gd = document.createElement('div'); gd.id = 'rl-replay'; gd.style.width = '1300px'; old.replaceWith(gd);
              const e = JSON.parse(f); e.layout.autosize = true;
              await Plotly.react(gd, e.data, e.layout, {responsive: true}); Plotly.Plots.resize(gd);
              await new Promise((r) => setTimeout(r, 250)); } }"""
        per_frame = {}
        for name, live, draw in (("live frame, drawn into the plot there", True, react),
                                 ("live frame, as gr.Plot draws a new figure (remount)", True, remount),
                                 ("with the final figure's numbers and labels, drawn into the plot there", False, react)) * 3:
            figures = [plots.heatmap_json(t, live=live) for t in cuts]
            m0 = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
            page.evaluate(draw, figures)
            m1 = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
            per_frame.setdefault(name, []).append(1e3 * (m1["TaskDuration"] - m0["TaskDuration"]) / len(figures))
    finally:
        page.close()
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    with capsys.disabled():
        print(f"\n[browser] Chromium CPU, share of one core: about:blank idle {blank:.1%}; the app's page idle {idle:.1%}")
        for name, shares in runs.items():
            print(f"  streaming {CPU_TOKENS} tokens (quality off), {name}: {' / '.join(f'{x:.1%}' for x in shares)}")
        for name, ms in per_frame.items():
            print(f"  heatmap frame replay ({engine.name}, 6 frames up to {CPU_TOKENS} tokens), {name}: "
                  f"main thread {med(ms):.0f} ms per frame {[round(x) for x in ms]}")


def _threads() -> int:
    import torch

    return torch.get_num_threads()


@pytest.mark.report
def test_report_train_tab_in_the_browser(browser, app_url, capsys):
    """The Train tab's default job (built-in prompts, attention-token, 3 minutes), started and watched in Chromium on
    the same machine as the server: how many steps it gets, and its held-out table. Printed, never asserted;
    docs/experiments.md ("With the browser on the same 2-core machine") compares it with `make train-tab` (the job alone)."""
    page = browser.new_page(viewport={"width": 1440, "height": 1400})
    page.set_default_timeout(400_000)
    try:
        _open_train_tab(page, app_url)
        started = time.perf_counter()
        page.locator("#rl-tr-start").click()
        page.wait_for_function("document.querySelector('#rl-tr-result')?.innerText.includes('mine at 0.5')")
        result = page.inner_text("#rl-tr-result")
    finally:
        page.close()
    with capsys.disabled():
        print(f"\n[browser] the Train tab's default job watched in Chromium on this machine ({os.cpu_count()} CPUs), "
              f"{time.perf_counter() - started:.0f} s:\n{result}")


@pytest.fixture(scope="module", params=["thread", "process", "graph"])
def room_app(embedded, request):
    """The app with its room (core/serve/room.py); the room's loop is started by the test, once every page has asked. `process`:
    the room in an engine process of its own (core/serve/remote.py, as app.py serves it), stepped by the test's thread;
    `graph`: the rows decode through the step graph (core/graph/graph_rows.py), as where it measured faster at start-up."""
    from routerlab.core.decode.engine import Engine
    from routerlab.core.serve.engine_process import EngineSpec
    from routerlab.core.serve.remote import RemoteRoom
    from routerlab.core.serve.room import Room

    graph = request.param == "graph"  # the graph multiplies the file's own codes: the engine reads them, as the app's
    engine = Engine(embedded.model, embedded.tokenizer, name=embedded.name, lowbit=embedded.lowbit if graph else None)
    if graph:
        engine.decode = "graph"
    if request.param == "process":
        room = engine.room = RemoteRoom(EngineSpec(kwargs={"model": None}), stepped=True, log=lambda m: None)
    else:
        room = engine.room = Room(engine)
    res = ui.Resources(engine, ui.Limits(max_new_tokens=256))
    demo = ui.build_demo(res)
    demo.queue(max_size=16, default_concurrency_limit=8)
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=_free_port(), prevent_thread_lock=True, quiet=True, **ui.launch_options())
    yield url, room
    demo.close()
    room.close()
    engine.room = None


def _start_loop(room) -> threading.Thread:
    """The room's loop in a thread: an in-process room's own, or one that steps an engine process's room."""
    from routerlab.core.serve.remote import RemoteRoom

    if not isinstance(room, RemoteRoom):
        return room.start()

    def steps():
        try:
            while True:
                if not any(room.step().values()):
                    time.sleep(0.05)  # idle: nothing to step
        except Exception:  # the room closed at the fixture's end
            pass

    thread = threading.Thread(target=steps, name="routerlab-remote-steps", daemon=True)
    thread.start()
    return thread


def test_several_pages_generate_at_once_in_one_room(browser, room_app):
    """Three visitors press Generate; their runs wait in the room until all three have asked, then decode in shared
    steps: each page streams its own text and heatmap, and its status says its speed was measured while sharing.
    Saves the three pages side by side (assets/screenshots/room.png)."""
    from PIL import Image

    url, room = room_app
    pages = [browser.new_page(viewport={"width": 900, "height": 1000}) for _ in range(3)]
    prompts = [p["prompt"] for p in json.loads((Path(__file__).resolve().parent.parent / "assets" / "prompts.json").read_text())[:3]]
    try:
        for page, prompt in zip(pages, prompts):
            page.goto(url)
            _press_generate(page, prompt, 60)
        deadline = time.time() + 60
        while room.busy["waiting"] < 3:  # every page's request is in the room before its loop starts
            assert time.time() < deadline, f"the pages' requests did not reach the room: {room.busy}"
            time.sleep(0.05)
        thread = _start_loop(room)
        for page in pages:
            page.wait_for_function(DONE_AFTER_BUSY, arg="", timeout=120_000)
        for page, prompt in zip(pages, prompts):
            status = page.locator("#rl-status").inner_text()
            assert "Done:" in status and "Measured while sharing" in status, status
            assert page.locator("#rl-text .rl-tok").count() > 0
        shots = []
        for k, page in enumerate(pages):
            path = Path(tempfile.gettempdir()) / f"routerlab-room-{k}.png"
            page.screenshot(path=str(path), clip={"x": 0, "y": 0, "width": 900, "height": 1000})
            shots.append(Image.open(path))
        sheet = Image.new("RGB", (sum(s.width for s in shots), max(s.height for s in shots)), "white")
        x = 0
        for s in shots:
            sheet.paste(s, (x, 0))
            x += s.width
        SHOTS.mkdir(parents=True, exist_ok=True)
        sheet.save(SHOTS / "room.png")
        assert room.largest >= 2 and thread.is_alive()
        if getattr(room, "engine", None) is not None and room.engine.decode == "graph":  # the pages' rows took the graph
            assert room.engine.runtime.graphs
    finally:
        for page in pages:
            page.close()
