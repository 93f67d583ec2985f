"""RouterLab app: load the model once, build the Gradio demo, launch it.

    python app.py                      # embedded SmolLM2-135M-Instruct, offline, http://127.0.0.1:7860
    python app.py --host 0.0.0.0 --port 8080 --model ./my-model

Environment (all optional): GRADIO_SERVER_NAME / GRADIO_SERVER_PORT, ROUTERLAB_MODEL,
ROUTERLAB_ALLOWED_MODELS (comma-separated extra models visitors may pick), ROUTERLAB_MAX_NEW_TOKENS
(256), ROUTERLAB_MAX_PROMPT_CHARS (16000), ROUTERLAB_QUEUE_SIZE (64), ROUTERLAB_MAX_WAIT_S (120: a longer wait is
refused at once, said), ROUTERLAB_CONCURRENCY (32),
ROUTERLAB_ROOM (on|off: one batched decode loop for every visitor), ROUTERLAB_MAX_BATCH (32), ROUTERLAB_ROOM_CACHE_MB (2048),
ROUTERLAB_ENGINE (process|thread: the room's loop in an engine process of its own, which loads the model too, or in
this process beside the web server; a process that cannot start falls back to thread, said in the log),
ROUTERLAB_DEVICE (cpu, cuda or cuda:N; default cuda where torch sees one), ROUTERLAB_DTYPE (auto: bf16 where it pays on this machine, else float32; or float32, bfloat16),
ROUTERLAB_ROUTERS (extra router sets: folders or Hub repo ids), ROUTERLAB_TRAINING (on|off) and its caps, the upload
budget (ROUTERLAB_UPLOAD_SESSION_MB 40, ROUTERLAB_UPLOAD_TOTAL_MB 200, ..._FILES), ROUTERLAB_EXPORTS_MB (100: the runs'
traces kept for download), ROUTERLAB_TRUSTED_PROXIES (whose
X-Forwarded-For names a visitor) and ROUTERLAB_ALLOWED_ORIGINS (other sites' pages that may upload and frame the page), and Gradio's GRADIO_ROOT_PATH (the public URL: the app's root whatever Host a request
claims). docs/operators.md, "A public host", says what a public server should set.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from routerlab.core.base.device import ENV as DEVICE_ENV, choose_device
from routerlab.core.base.errors import RouterLabError
from routerlab.core.base.precision import check_dtype, env_dtype
from routerlab.core.model.models import check_quantize


def load_engine(spec: str | None, dtype: str = "auto", quantize: str = "auto"):
    from routerlab.core.decode.engine import Engine
    from routerlab.core.model.models import load_model

    loaded = load_model(spec, dtype=dtype, quantize=quantize)
    return Engine.from_loaded(loaded), loaded


def main(argv: list[str] | None = None) -> int:
    from routerlab import ui  # here, not at the top: the engine process imports this file again (spawn), and needs no UI

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
    parser.add_argument("--model", default=os.environ.get("ROUTERLAB_MODEL") or None, help="hub id or folder (default: the embedded model)")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: $ROUTERLAB_DEVICE, else cuda when available)")
    parser.add_argument("--dtype", default=None, help="auto, float32 or bfloat16 (default: $ROUTERLAB_DTYPE, else auto)")
    parser.add_argument("--quantize", default=None, help="weights a decode step reads: auto (the embedded model's own 4-bit "
                        "codes on a CPU), 16bit, int4 or int8 (requantised, weight-only; default: $ROUTERLAB_QUANTIZE, else auto)")
    parser.add_argument("--routers", default=os.environ.get("ROUTERLAB_ROUTERS") or None,
                        help="extra router sets for everyone's menu, listed first (a token-level one is chosen at start): folders or Hugging Face Hub "
                             "repo ids (OWNER/NAME), comma-separated (default: $ROUTERLAB_ROUTERS)")
    parser.add_argument("--no-warmup", action="store_true", help="skip measuring the per-layer costs at start-up (Explore then shows no estimated speedup)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # gradio's own start-up requests are noise

    print(f"RouterLab: loading {args.model or 'the embedded model (SmolLM2-135M-Instruct)'} … (first start converts it, ~1 min; later starts take seconds)", flush=True)
    start = time.perf_counter()
    try:
        if args.device:  # the engine process reads it too (it loads its own copy of the model)
            os.environ[DEVICE_ENV] = choose_device(args.device)
        dtype = check_dtype(args.dtype) if args.dtype else env_dtype()
        quantize = check_quantize(args.quantize or os.environ.get("ROUTERLAB_QUANTIZE"))
        engine, loaded = load_engine(args.model, dtype, quantize)
    except RouterLabError as err:
        print(f"RouterLab: cannot load the model. {err}", file=sys.stderr)
        return 1
    print(f"RouterLab: {engine.name} ready ({engine.n_layers} layers, {engine.precision}, from {loaded.source}) "
          f"in {time.perf_counter() - start:.1f} s", flush=True)
    print(f"RouterLab: decode reads {engine.weights}", flush=True)

    limits = ui.Limits.from_env()
    try:
        extra = ui.operator_router_sets(args.routers, engine.model)
    except RouterLabError as err:
        print(f"RouterLab: cannot load the router sets {args.routers!r}. {err}", file=sys.stderr)
        return 1
    res = ui.Resources(
        engine,
        limits,
        router_sets=extra + ui.available_router_sets() if extra else None,
        model_loader=lambda name: load_engine(name, dtype, quantize)[0],
        details=f"Model **{engine.name}** loaded ({engine.n_layers} layers, {loaded.source}; decode reads {engine.weights}).",
    )
    if not args.no_warmup:
        print("RouterLab: measuring per-layer costs on this machine (Explore's estimated speedup) …", flush=True)
        c = res.measure_costs()
        print(f"RouterLab: a decode step takes {c['step'] * 1e3:.1f} ms; one layer's attention {c['attention_full'] * 1e3:.2f} ms "
              f"(kv still pays {c['attention_kv_only'] * 1e3:.2f} ms), MLP {c['mlp'] * 1e3:.2f} ms", flush=True)

    demo = ui.build_demo(res)
    ui.enable_queue(demo, limits)
    if not limits.room:  # each generation decodes alone, in a worker thread of its own
        demo.launch(server_name=args.host, server_port=args.port, **ui.launch_options(limits))
        return 0
    from routerlab.core.serve.engine_process import EngineSpec
    from routerlab.core.serve.remote import open_room, serve_room

    def say(message: str) -> None:
        print(f"RouterLab: {message}", flush=True)

    spec = None  # ROUTERLAB_ENGINE=thread: the loop runs in this process's main thread
    if limits.room_process:  # the engine process builds the same engine: same model, dtype and weights
        spec = EngineSpec(kwargs={"model": args.model, "dtype": dtype, "quantize": quantize})
        say("starting the engine process: it loads the model too, and runs the room's decode loop where no web server thread interrupts it …")
    room = open_room(engine, spec, limits.max_batch, limits.room_cache_mb << 20, log=say)
    demo.launch(server_name=args.host, server_port=args.port, prevent_thread_lock=True, **ui.launch_options(limits))
    serve_room(room, engine, log=say)  # until Ctrl-C
    demo.close()
    return 0


def _exit(code: int) -> None:
    """End the process once `main` has closed the room and the server: the exit handlers run, then the process ends
    without the interpreter's teardown, which freed the model's tensors object by object and was most of a Ctrl-C's
    exit; the OS takes the memory back at once (`bench/load/public.sigint_test` times the whole exit)."""
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main() or 0)
