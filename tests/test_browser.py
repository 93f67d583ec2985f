"""A real browser (Debian's headless Chromium, driven by Playwright) uses the app with the embedded model.

It generates, steers the threshold during the run, looks at the what-if view, switches tabs and
saves screenshots to assets/screenshots/ (the README shows them). Skips, with the reason, where
Chromium or the playwright package is missing; never downloads a browser (`playwright install`).
The app runs in this process; the steered run is held (tests/holding.py) while the browser moves the
slider, so the move always lands mid-run however slow the browser or the server is.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
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
    from routerlab.core.engine import Engine

    return Holding(Engine(embedded.model, embedded.tokenizer, name=embedded.name))


@pytest.fixture(scope="module")
def app_url(engine):
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


def _explore_tour(page, app_url, engine):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.set_default_timeout(180_000)
    page.goto(app_url)
    page.get_by_role("button", name="Generate", exact=True).wait_for()

    assert page.evaluate("typeof window.routerlabWhatIfPreview") == "function", "the what-if preview script did not load"

    # 1. a streamed run with the shipped token-level routers (untrained ones where none ship), steered while it runs:
    # held after 12 tokens until the slider's move reached the server, then held at 40 for the streaming screenshot.
    page.locator("#rl-prompt textarea").fill("Write a short story about a lighthouse keeper who finds a message in a bottle.")
    page.locator("#rl-max-new input[type=number]").fill("200")
    page.locator("#rl-max-new input[type=number]").press("Enter")
    with engine.hold(after=12, max_new_tokens=200) as held:
        page.get_by_role("button", name="Generate", exact=True).click()
        held.wait()
        page.wait_for_function(_tokens_shown(12))
        page.locator("#rl-heatmap .js-plotly-plot").wait_for()
        _set_slider(page, 0.55)
        page.locator("#rl-status", has_text="0.55").wait_for()  # the server's answer: the move applies from token 13
        assert held.control.threshold == 0.55
        held.release(until=40)
        held.wait()
        page.wait_for_function(_tokens_shown(40))
        page.screenshot(path=str(SHOTS / "explore-streaming.png"), full_page=True)
    page.locator("#rl-stats", has_text="stopped:").wait_for()  # the run's final view
    assert page.locator("#rl-heatmap .js-plotly-plot").count() == 1
    page.locator("#rl-heatmap .gtitle", has_text="Recorded run").wait_for()
    assert "t→0.55" in page.locator("#rl-heatmap").text_content(), "the dashed line where the threshold moved"
    page.screenshot(path=str(SHOTS / "explore-done.png"), full_page=True)

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

    from routerlab.tuning.checkpoint import save_routers
    from routerlab.core.config import RoutingConfig
    from routerlab.core.engine import Engine
    from routerlab.core.models import tiny_model
    from routerlab.core.router import RouterSet

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
        page.wait_for_function("document.querySelector('#rl-heatmap .gtitle').textContent.includes('not a new run):')")
        server.append(page.evaluate("window.__server - window.__t0"))
        assert page.evaluate(COUNT_RAN_JS) == previewed, "the browser preview and the server disagree"
    page.close()
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    with capsys.disabled():
        print(f"\n[browser] what-if at ~300 tokens x 30 layers: in-browser preview (compute + draw) median {median(direct):.0f} ms "
              f"{[round(t) for t in direct]}; Enter -> the server's full view (tint, stats, text) median {median(server):.0f} ms "
              f"{[round(t) for t in server]}")
