"""ui.state.served.ready gives a frame's values exactly as Gradio's own postprocessing would send them, so Explore's events
can be bound postprocess=False without the page seeing any difference."""

from __future__ import annotations

import gradio as gr
import pytest
from gradio.components.plot import PlotData

from routerlab.ui.state import served


def _gradio_would_send(component, value):
    out = component.postprocess(value)
    return out.model_dump() if hasattr(out, "model_dump") else out


def test_plain_values_are_postprocessed_by_their_own_components(tmp_path):
    path = tmp_path / "routerlab-trace.json"
    path.write_text("{}")
    with gr.Blocks():
        outputs = [gr.HTML(), gr.Plot(), gr.Markdown(), gr.DownloadButton(), gr.Button()]
    plot = PlotData(type="plotly", plot='{"data": []}')
    values = ["<b>x</b>", plot, "  **Done**\n", str(path), "Generate"]
    got = served.ready(outputs, values)
    assert list(got) == [_gradio_would_send(c, v) for c, v in zip(outputs, values)]
    assert got[1] == {"type": "plotly", "plot": '{"data": []}'} and got[2] == "**Done**"
    assert got[3]["path"] == str(path) and got[3]["meta"] == {"_type": "gradio.FileData"}  # a file the page can fetch


def test_updates_keep_their_properties_and_get_their_value_postprocessed(tmp_path):
    path = tmp_path / "routerlab-heatmap.html"
    path.write_text("<html></html>")
    with gr.Blocks():
        button, download, html = gr.Button(), gr.DownloadButton(visible=False), gr.HTML()
    got = served.ready([button, download, html, html],
                       [gr.Button(interactive=False), gr.update(value=str(path), visible=True), gr.skip(), None])
    assert got[0] == {"interactive": False, "__type__": "update"}
    assert got[1]["__type__"] == "update" and got[1]["visible"] is True and got[1]["value"]["path"] == str(path)
    assert got[2] == gr.skip() and got[3] is None


def test_a_frame_of_the_wrong_length_is_refused():
    with gr.Blocks():
        outputs = [gr.HTML(), gr.HTML()]
    with pytest.raises(ValueError, match="1 values for 2 outputs"):
        served.ready(outputs, ["only one"])


def test_the_frames_bench_measures_both_ways():
    from routerlab.bench.frames import frames_bench

    report = frames_bench(frames=40, rounds=1)  # enough frames for the CPU clock (10 ms ticks) to move
    assert len(report["ms_per_frame_gradio_postprocess"]) == len(report["ms_per_frame_ready"]) == 1
    assert report["ms_per_frame_gradio_postprocess"][0] > 0 and report["ms_per_frame_ready"][0] > 0
