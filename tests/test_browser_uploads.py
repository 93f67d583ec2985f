"""Uploads in a real browser (Debian's headless Chromium, driven by Playwright) through the upload guard
(routerlab/ui/state/uploads.py): the app's own page uploads as before; a page of another origin that posts to the app's
upload route through the visitor's browser stores nothing. Skips where Chromium or playwright is missing.
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr
from test_browser import _free_port, browser  # noqa: F401 (browser: the module-scoped Chromium fixture)

from routerlab.ui.state import uploads
from routerlab.ui.state.uploads import UploadBudget

FOREIGN_POST = """async (target) => {
  const form = new FormData();
  form.append('files', new Blob(['x'.repeat(100000)]), 'flood.bin');
  try { return (await fetch(target, {method: 'POST', body: form})).status; } catch (err) { return String(err); }
}"""


def test_the_apps_own_page_uploads_and_another_origins_page_stores_nothing(browser, tmp_path, monkeypatch):
    folder = tmp_path / "gradio"
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(folder))
    with gr.Blocks() as demo:
        box = gr.File(elem_id="box")
        size = gr.Textbox(elem_id="size")
        box.upload(lambda f: str(Path(f).stat().st_size), box, size)
    port = _free_port()
    budget = UploadBudget(session_bytes=1 << 20, total_bytes=4 << 20)
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                app_kwargs={"middleware": [uploads.middleware(budget)]})
    page = browser.new_page()
    try:
        page.set_default_timeout(60_000)
        page.goto(f"http://127.0.0.1:{port}/")
        sample = tmp_path / "sample.txt"
        sample.write_bytes(b"y" * 5000)
        page.locator("#box input[type=file]").set_input_files(str(sample))
        # `?.`: a predicate that throws ends the wait at once, and the textbox is re-rendered while the answer arrives
        # (a loaded run found no textarea there for a moment)
        page.wait_for_function("document.querySelector('#size textarea')?.value === '5000'")
        stored = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        # another origin: the same server reached as localhost is a different site to the browser (Origin: http://localhost:PORT)
        page.goto(f"http://localhost:{port}/")
        status = page.evaluate(FOREIGN_POST, f"http://127.0.0.1:{port}/gradio_api/upload")
        assert status in (403, "TypeError: Failed to fetch"), status  # the answer may be unreadable to it; nothing is stored
        assert sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) == stored
        assert page.evaluate(FOREIGN_POST, f"http://localhost:{port}/gradio_api/upload") == 200  # its own origin
    finally:
        page.close()
        demo.close()
