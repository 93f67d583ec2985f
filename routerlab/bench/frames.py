"""What Gradio itself costs the web process per streamed frame, with its own postprocessing and with frames made ready
by the handler (ui/state/served.py), side by side.

    python -m routerlab.bench.frames [--frames 300] [--rounds 2]

A Gradio app with Explore's ten outputs (three HTML, three plots, a Markdown status, two download buttons, a button)
streams `--frames` frames of fixed content to one gradio client; the server runs in a process of its own and its CPU
is read before and after. The two servers take turns, `--rounds` times; the report gives each round's milliseconds of
server CPU per frame and the median ratio. Only Gradio's handling is measured (the frames' content is built once), so
the figure is what binding Explore's events `postprocess=False` saves per frame. Knows nothing about the model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

READY = "ROUTERLAB-FRAMES-READY"


def _serve(postprocess: bool, port: int) -> None:
    import gradio as gr
    from gradio.components.plot import PlotData

    from routerlab.ui.state import served

    text = "<span class='rl-tok'>a token</span>" * 200  # a streamed text of about 200 tokens
    plot = PlotData(type="plotly", plot=json.dumps({"data": [{"z": [[0.5] * 200] * 30, "type": "heatmap"}], "layout": {}}))

    with gr.Blocks() as demo:
        frames = gr.Number(value=10)
        outputs = [gr.HTML(), gr.Plot(), gr.HTML(), gr.Markdown(), gr.DownloadButton(visible=False), gr.DownloadButton(visible=False),
                   gr.Plot(), gr.Plot(), gr.Button(), gr.HTML()]

        def run(n):
            for k in range(int(n)):
                values = (text, plot, "<div>stats</div>", f"Generating… {k} tokens", None, None, plot, plot, "Generate", "")
                yield values if postprocess else served.ready(outputs, values)

        gr.Button("go").click(run, [frames], outputs, api_name="run", postprocess=postprocess)
    demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    print(READY, flush=True)
    while True:
        time.sleep(3600)


def _cpu_seconds(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def _one(postprocess: bool, frames: int) -> float:
    """Milliseconds of the server's CPU per frame."""
    from gradio_client import Client

    from routerlab.bench.load.server import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "routerlab.bench.frames", "--serve", str(int(postprocess)), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        while True:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError("the frames server did not start")
            if line.startswith(READY):
                break
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        try:
            client.predict(5, api_name="/run")  # warm-up: first calls pay one-time set-up
            before = _cpu_seconds(proc.pid)
            client.predict(frames, api_name="/run")
            return 1e3 * (_cpu_seconds(proc.pid) - before) / frames
        finally:
            client.close()
    finally:
        proc.kill()
        proc.wait()


def frames_bench(frames: int = 300, rounds: int = 2) -> dict:
    by_gradio, ready = [], []
    for _ in range(rounds):
        by_gradio.append(_one(True, frames))
        ready.append(_one(False, frames))
    ratios = [r / g for g, r in zip(by_gradio, ready)]
    return {"frames": frames, "rounds": rounds, "outputs": 10,
            "ms_per_frame_gradio_postprocess": [round(x, 2) for x in by_gradio],
            "ms_per_frame_ready": [round(x, 2) for x in ready],
            "ready_vs_gradio_median": round(statistics.median(ratios), 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m routerlab.bench.frames", description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=300)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--serve", type=int, choices=(0, 1), help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve is not None:
        _serve(bool(args.serve), args.port)
        return 0
    print(json.dumps(frames_bench(args.frames, args.rounds), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
