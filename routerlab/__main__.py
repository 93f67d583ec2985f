"""Command line: `python -m routerlab generate | train | eval | calibrate | figures | bench speed | bench tradeoff | bench context`.

Parses arguments, calls the library, prints text or one JSON object. Bad input: `error: ...` (exit 2), no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from routerlab.bench.context_cli import add_context_parser
from routerlab.core.base.config import DECAYS, GRANULARITIES, KV_POLICIES
from routerlab.core.base.errors import RouterLabError
from routerlab.core.base.precision import CHOICES as DTYPE_CHOICES
from routerlab.core.kernels.weights import FORMATS as WEIGHT_FORMATS
from routerlab.figures import add_command as add_figures_command
from routerlab.tuning.calibrate_cli import add_calibrate_parser
from routerlab.tuning.data import SPLITS


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="hub id or local folder (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--routers", default=None, help="router checkpoint folder (default: shipped routers for --granularity)")
    p.add_argument("--granularity", default="attention-token", help=f"one of {', '.join(GRANULARITIES)}")
    _add_device(p)
    _add_dtype(p)
    _add_quantize(p)
    p.add_argument("--trust-remote-code", action="store_true", help="allow a hub model's own code (off by default)")


def _add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: $ROUTERLAB_DEVICE, else cuda when available)")


def _add_quantize(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quantize", default="auto", choices=("auto", *WEIGHT_FORMATS),
                   help="weights a decode step reads (prefill keeps 16-bit ones): auto = the embedded model's own 4-bit "
                        "codes on a CPU, 16-bit elsewhere; int4 / int8 requantise another model's weights (weight-only); "
                        "16bit = none")


def _add_dtype(p: argparse.ArgumentParser, default: str = "auto", why: str = "") -> None:
    p.add_argument("--dtype", default=default, choices=DTYPE_CHOICES,
                   help=f"model precision (default {default}{': ' + why if why else ''}); auto = bf16 where it pays on "
                        "this device (see docs/method.md), else float32")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m routerlab", description="See and steer dynamic depth in language models.")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate with routers and print the text (or a JSON trace)")
    _add_model_args(g)
    g.add_argument("--prompt", required=True)
    g.add_argument("--threshold", type=float, default=None, help="skip threshold in [0, 1] (default: the routers' own; 0.5 for a calibrated set)")
    g.add_argument("--kv-policy", default=None, help=f"one of {', '.join(KV_POLICIES)} (default: what the routers were trained for)")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--no-chat", action="store_true", help="feed the prompt as plain text, without the chat template")
    g.add_argument("--json", action="store_true", help="print one JSON object with the text and the per-token trace")
    g.add_argument("--no-quality", action="store_true", help="skip the per-token quality cost (KL to the full model, "
                   "its top token): a full-depth pass over the generated tokens, which slows decoding")
    g.add_argument("--decode", choices=("auto", "torch", "graph"), default="auto",
                   help="auto: the path measured fastest at start-up, as the app takes it (printed); graph: the whole step "
                   "as one onnxruntime graph (the embedded model on a CPU; the full model or attention-token routers "
                   "under kv, mask or drop; docs/method.md); torch: torch's ops")
    g.set_defaults(func=_generate)

    bench = sub.add_parser("bench", help="measured benchmarks").add_subparsers(dest="bench", required=True)
    s = bench.add_parser("speed", help="decode tokens/s: transformers generate vs the engine, KV policies side by side")
    s.add_argument("--model", default=None)
    _add_device(s)
    _add_dtype(s)
    _add_quantize(s)
    s.add_argument("--prompt-tokens", type=int, default=512)
    s.add_argument("--new-tokens", type=int, default=128)
    s.add_argument("--long-context", type=int, default=2048, help="also decode at this many tokens of context (0: skip)")
    s.add_argument("--ttft-tokens", type=int, default=2048, help="prompt length of the time-to-first-token figures (0: skip)")
    s.add_argument("--no-peers", action="store_true", help="leave llama.cpp out even when llama-cpp-python imports")
    s.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    s.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    s.add_argument("--json", action="store_true")
    s.add_argument("--save", default=None, help="also write the JSON result to this file (make bench: assets/bench/speed.json)")
    s.set_defaults(func=_bench_speed)
    kn = bench.add_parser("kernels", help="which product each kind of linear map is fastest with on this CPU (int4, "
                          "bf16, fp32, FBGEMM's dynamic int8), at 1, 8 and 32 rows, with each one's error")
    kn.add_argument("--rounds", type=int, default=5, help="alternating rounds; medians are reported")
    kn.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    kn.add_argument("--save", default=None, help="also write the JSON result here (e.g. assets/bench/kernels-avx512.json)")
    kn.set_defaults(func=lambda args: __import__("routerlab.bench.products.kernels", fromlist=["main"]).main(args))
    q = bench.add_parser("quality", help="decode tokens/s with the per-token quality cost on vs off, side by side")
    q.add_argument("--model", default=None)
    _add_dtype(q)
    q.add_argument("--granularity", default="attention-token", help="shipped routers to run (default attention-token)")
    q.add_argument("--prompt", default=None, help="default: a fixed story prompt, chat template")
    q.add_argument("--new-tokens", type=int, default=128)
    q.add_argument("--chunks", default="16,32,64", help="comma-separated quality chunk sizes to time against off "
                   "(scored in full chunks; one more row streams as the app does, the default chunk plus a 2 s refresh)")
    q.add_argument("--rounds", type=int, default=5, help="rounds of whole runs, order rotating; medians are reported")
    q.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=_bench_quality)
    o = bench.add_parser("tradeoff", help="threshold sweep: speed vs quality of tuned routers, baselines, granularities")
    o.add_argument("--model", default=None)
    _add_dtype(o)
    o.add_argument("--routers", default=None, help="one checkpoint folder for the main curve (default: shipped attention-token)")
    o.add_argument("--granularities", default=None, help="comma-separated shipped granularities for the table (default: all shipped)")
    o.add_argument("--data", default=None, help="JSONL (default: the built-in held-out split)")
    o.add_argument("--limit", type=int, default=40, help="held-out examples for perplexity")
    o.add_argument("--thresholds", default=None, help="comma-separated, for the main curve (default: where its routers skip 2%%..30%% of routed cells)")
    _add_quantize(o)
    o.add_argument("--new-tokens", type=int, default=48, help="tokens generated per timed run")
    o.add_argument("--prompts", type=int, default=2, help="held-out prompts timed per configuration and round")
    o.add_argument("--rounds", type=int, default=2)
    o.add_argument("--contexts", default="256,1024,2048", help="prompt lengths for the context-scaling rows")
    o.add_argument("--out", default=None, help="output folder (default assets/bench)")
    o.add_argument("--json", action="store_true")
    o.set_defaults(func=_bench_tradeoff)

    pr = bench.add_parser("precision", help="the same routers with the base in float32 and bfloat16: perplexity, "
                          "KL, and the share of routing decisions bf16 flips")
    pr.add_argument("--model", default=None)
    pr.add_argument("--data", default="assets/data/selfdistill_extra.jsonl", help="JSONL (default: the 720-prompt extra set)")
    pr.add_argument("--split", default="heldout")
    pr.add_argument("--limit", type=int, default=None)
    pr.add_argument("--granularity", default="attention-token")
    pr.add_argument("--routers", default=None, help="router folder (default: the shipped set of --granularity)")
    _add_quantize(pr)
    pr.add_argument("--save", default=None, help="also write the JSON result here (assets/bench/precision.json)")
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(func=_bench_precision)

    si = bench.add_parser("standins", help="router sets with and without skip stand-ins at equal skip rates: KL, "
                          "perplexity, decode time saved, training time")
    si.add_argument("--sets", default="", help="comma-separated router folders, optionally name=folder")
    si.add_argument("--model", default=None)
    _add_dtype(si, "float32", "the shipped routers were trained and evaluated on a float32 base")
    si.add_argument("--data", default="sampled=assets/data/sampled_extra_heldout.jsonl,greedy=assets/data/selfdistill_extra.jsonl",
                    help="comma-separated name=JSONL held-out files (their heldout split; default: the 151 fresh prompts "
                         "answered by sampling, then greedily)")
    si.add_argument("--rates", default="0.05,0.1,0.2,0.3", help="shares of all the target's cells to skip")
    si.add_argument("--limit", type=int, default=None, help="use only the first N examples of each file")
    si.add_argument("--costs", default=None, help="take the decode-step cost model from this `bench speed` JSON "
                    "(its cost_seconds; e.g. assets/bench/speed.json, measured on a quiet machine) instead of measuring "
                    "it here; with --recost, only redo the rows' step figures of --save's file with it")
    si.add_argument("--recost", action="store_true", help="evaluate nothing: recompute the step figures of --save's rows "
                    "from --costs (and the stand-ins' cost timed again)")
    si.add_argument("--save", default=None, help="also write the JSON result here (assets/bench/standins.json); rows "
                    "of sets or data files this run does not measure are kept, so the table can be built in parts")
    si.add_argument("--json", action="store_true")
    si.set_defaults(func=_bench_standins)
    add_context_parser(bench)
    rp = bench.add_parser("report", help="write docs/results.md from every file in assets/bench/ and print the "
                          "trade-off tables (with --out: only print the tables of that tradeoff run)")
    rp.add_argument("--out", default=None, help="a bench tradeoff output folder whose tables to print (default assets/bench)")
    rp.add_argument("--results", default=None, help="the document to write or check (default docs/results.md; with "
                    "--out, none unless given)")
    rp.add_argument("--check", action="store_true", help="write nothing: fail if the document differs from what "
                    "the benchmark files give")
    rp.set_defaults(func=_bench_report)
    ld = bench.add_parser("load", add_help=False, prefix_chars="\0",  # no options here: every argument, --help too, is passed on
                          help="load, fault, bad-input and loader-fuzz tests of the app over HTTP (see `bench load --help`)")
    ld.add_argument("args", nargs="*")
    ld.set_defaults(func=_bench_load)

    d = sub.add_parser("data", help="the built-in self-distilled data").add_subparsers(dest="data", required=True)
    b = d.add_parser("build", help="answer assets/data/prompts.jsonl with the full-depth embedded model (resumable)")
    b.add_argument("--prompts", default=None, help="JSONL of {category, prompt} rows (default assets/data/prompts.jsonl)")
    b.add_argument("--out", default=None, help="answers to write (default assets/data/selfdistill.jsonl)")
    b.add_argument("--max-new-tokens", type=int, default=100)
    b.add_argument("--limit", type=int, default=None, help="answer only the first N prompts")
    b.add_argument("--batch-size", type=int, default=16)
    b.add_argument("--split", choices=SPLITS, default="all", help="answer only the prompts of this split (by hash)")
    b.add_argument("--temperature", type=float, default=0.0,
                   help="0 (default): greedy answers; 1: sampled from the full model as it is (no top-k/top-p)")
    b.add_argument("--seed", type=int, default=0, help="seed of the sampling")
    _add_dtype(b, "float32", "the shipped data was answered in float32")
    b.set_defaults(func=_data_build)

    t = sub.add_parser("train", help="Router-Tuning: train routers only (accelerate; `accelerate launch` for several processes)")
    t.add_argument("--model", default=None, help="hub id or local folder (default: the embedded SmolLM2-135M-Instruct)")
    t.add_argument("--data", default=None, help="JSONL (messages / instruction+output / text) or a hub dataset (default: built-in)")
    t.add_argument("--granularity", default="attention-token", help=f"one of {', '.join(GRANULARITIES)}")
    t.add_argument("--layers", default=None, help="routed layers, e.g. '1-28' or '4,5,6' (default: all but first and last)")
    t.add_argument("--out", required=True, help="checkpoint folder to write (router.json, routers.safetensors, report, plots)")
    t.add_argument("--steps", type=int, default=None)
    t.add_argument("--batch-size", type=int, default=None)
    t.add_argument("--lr", type=float, default=None)
    t.add_argument("--lm-weight", type=float, default=None)
    t.add_argument("--kd-weight", type=float, default=None, help="distillation to the full-depth model (0 turns it off)")
    t.add_argument("--target", type=float, default=None, help="executed fraction of routed cells the budget aims for")
    t.add_argument("--budget-weight", type=float, default=None)
    t.add_argument("--ramp", type=float, default=None, help="fraction of steps over which the skip target ramps in")
    t.add_argument("--warmup", type=float, default=None, help="fraction of steps over which the learning rate ramps up")
    t.add_argument("--seed", type=int, default=None)
    t.add_argument("--decay", choices=DECAYS, default=None,
                   help="learning rate after warmup: constant (default) or a cosine decay to 0 over the remaining steps")
    t.add_argument("--gate", type=float, default=None,
                   help="threshold of the hard gate while training (default 0.5; below 0.5, fresh zero routers start "
                        "clear of it instead of on it)")
    t.add_argument("--adapters", type=int, default=None, metavar="RANK",
                   help="train a skip stand-in of this rank per routed layer with the routers: a skipped cell adds "
                        "up(silu(down(x))) instead of nothing (default 0: plain skipping)")
    t.add_argument("--adapter-lr", type=float, default=None, help="the stand-ins' learning rate (default 3e-3, as the routers')")
    t.add_argument("--adapter-fit", type=int, default=None, metavar="STEPS",
                   help="first fit each stand-in to its sub-layer's update at full depth, this many Adam steps (default 0)")
    t.add_argument("--init", choices=("zeros", "probe"), default=None,
                   help="where the routers start: zeros (default, the paper) or probe (fitted to their sub-layers' update sizes)")
    t.add_argument("--long", type=int, default=0, metavar="TOKENS",
                   help="train (and calibrate) on long inputs: the data's examples joined into chats of about TOKENS "
                        "tokens, the loss on their second half (default 0: each example alone)")
    t.add_argument("--threshold", default="auto", help="default threshold to ship: a number, or 'auto' (calibrated on held-out)")
    t.add_argument("--max-ppl-increase", type=float, default=0.02, help="calibration: largest held-out perplexity rise allowed")
    t.add_argument("--calib-examples", type=int, default=32, help="held-out examples used to calibrate the threshold")
    _add_dtype(t, "float32", "the shipped routers were trained on a float32 base; routers always train in float32")
    t.add_argument("--no-progress", action="store_true")
    t.set_defaults(func=_train)

    j = sub.add_parser("train-job", help="the Train tab's training from the command line (same job, same defaults)")
    j.add_argument("--out", required=True, help="checkpoint folder to write (router.json, routers.safetensors, report, curves, README.md)")
    j.add_argument("--granularity", default="attention-token", help=f"one of {', '.join(GRANULARITIES)}")
    j.add_argument("--minutes", type=float, default=3.0, help="time budget of the whole job (default 3, as the tab)")
    j.add_argument("--skip", type=float, default=0.15, help="skip target, share of routed cells (default 0.15, as the tab)")
    j.add_argument("--lr", type=float, default=None, help="learning rate (default as the tab's Advanced: 1e-2)")
    j.add_argument("--batch-size", type=int, default=None, help="examples per step (default 4)")
    j.add_argument("--decay", choices=DECAYS, default=None, help="learning rate after warmup (default constant)")
    j.add_argument("--kd-weight", type=float, default=None, help="distillation weight (default 1; 0: no teacher forward)")
    j.add_argument("--lm-weight", type=float, default=None, help="LM-loss weight (default 0, as the tab: distillation alone)")
    j.add_argument("--seed", type=int, default=None)
    j.add_argument("--max-steps", type=int, default=None, help="most training steps (default 400: the time budget decides)")
    j.add_argument("--init", choices=("zeros", "probe"), default=None, help="where the routers start (default probe, as the tab)")
    j.add_argument("--data", default=None, help="your text: .txt (paragraphs) or .jsonl (as the tab reads it); default: the built-in data")
    j.add_argument("--check-data", default=None, help="afterwards, compare with the shipped set and random skipping on this JSONL too")
    j.add_argument("--check-split", default="heldout", help="split of --check-data (default heldout)")
    _add_dtype(j, "auto", "the app's precision")
    _add_device(j)
    j.set_defaults(func=_train_job)

    e = sub.add_parser("eval", help="perplexity, agreement and skip rate: routed vs full depth (and baselines)")
    _add_model_args(e)
    e.add_argument("--data", default=None, help="JSONL or hub dataset (default: the built-in held-out split)")
    e.add_argument("--split", default=None, help="train / heldout / all (default: heldout for built-in data, all otherwise)")
    e.add_argument("--threshold", type=float, default=None, help="default: the routers' own")
    e.add_argument("--kv-policy", default=None, help=f"one of {', '.join(KV_POLICIES)} (default: what the routers were trained for)")
    e.add_argument("--baseline", default=None, choices=("random", "static"), help="evaluate a baseline at a matched skip rate")
    e.add_argument("--skip-rate", type=float, default=None, help="baseline skip rate over all layers (default: the routers')")
    e.add_argument("--sweep", default=None, help="comma-separated thresholds: print the curve for tuned, random, static")
    e.add_argument("--limit", type=int, default=None, help="use only the first N examples")
    e.add_argument("--long", type=int, default=0, metavar="TOKENS", help="evaluate on long inputs: the examples joined "
                   "into chats of about TOKENS tokens, scored on their second half, as `train --long` makes them")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--plot", default=None, help="with --sweep: write the curve as plotly HTML here")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=_eval)

    add_calibrate_parser(sub, _add_dtype)  # routerlab/tuning/calibrate_cli.py owns its options
    add_figures_command(sub)  # the workshop's slide figures: routerlab/figures.py owns its options
    return parser


def _data_build(args) -> int:
    import logging

    from routerlab.tuning.data import DEFAULT, PROMPTS, build_default, read_prompts

    prompts = Path(args.prompts) if args.prompts else PROMPTS
    read_prompts(prompts)  # a missing or malformed prompts file fails here, before the model loads
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    path = build_default(prompts=prompts, out=Path(args.out) if args.out else DEFAULT, max_new_tokens=args.max_new_tokens,
                         limit=args.limit, batch_size=args.batch_size, split=args.split, temperature=args.temperature,
                         seed=args.seed, dtype=args.dtype)
    print(path)
    return 0


def _train(args) -> int:
    from routerlab.tuning.train import run_training

    report = run_training(args)
    if report is not None:
        print(json.dumps({k: report[k] for k in ("out", "seconds", "threshold", "heldout") if k in report}, indent=1))
    return 0


def _machine() -> str:
    import torch

    from routerlab.bench.speed import cpu_model
    from routerlab.core.base.precision import cpu_has_native_bf16, cpu_vector_unit

    bf16 = ", native bf16" if cpu_has_native_bf16() else ""
    return f"{cpu_model()}, {torch.get_num_threads()} threads, {cpu_vector_unit()}{bf16}"


def _train_job(args) -> int:
    from routerlab.core.model.models import load_model
    from routerlab.core.model.anatomy import Anatomy
    from routerlab.tuning.checkpoint import shipped_routers
    from routerlab.tuning.data import encode_all, load_records
    from routerlab.tuning.job import JobSettings, TrainJob, compare
    from routerlab.tuning.user_data import parse_user_data

    advanced = {k: getattr(args, k) for k in ("lr", "batch_size", "decay", "seed", "kd_weight", "lm_weight", "init", "max_steps")
                if getattr(args, k) is not None}
    settings = JobSettings(granularity=args.granularity, minutes=args.minutes, skip=args.skip, **advanced)
    data = parse_user_data(path=args.data) if args.data else None
    check = load_records(args.check_data, args.check_split) if args.check_data else None  # a bad file fails before training
    loaded = load_model(dtype=args.dtype, device=args.device)
    shipped = shipped_routers().get(settings.granularity)
    job = TrainJob(loaded.model, loaded.tokenizer, settings, Path(args.out), data=data, shipped=shipped)
    started, first = time.perf_counter(), []  # first: seconds from the job's start to the Train tab's first curve point
    job.watch(lambda changes: "rows" in changes and not first and first.append(time.perf_counter() - started))
    job.run()
    snap = job.snapshot()
    if snap["phase"] not in ("done", "stopped"):
        raise RouterLabError(snap["message"])
    result = snap["result"]
    out = {"out": args.out, "steps": result["steps"], "seconds": result["seconds"], "elapsed": round(snap["elapsed"], 1),
           "dtype": str(next(loaded.model.parameters()).dtype).removeprefix("torch."), "machine": _machine(),
           "heldout_slice": result["heldout"], "first_point_s": round(first[0], 1) if first else None}
    if check is not None:
        examples = encode_all(check, loaded.tokenizer)
        out["check"] = {"data": args.check_data, "split": args.check_split, "examples": len(examples),
                        "rows": compare(Anatomy(loaded.model), examples, job.routers, loaded.model, shipped, settings.seed)}
        (Path(args.out) / "check.json").write_text(json.dumps(out["check"], indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


def _eval(args) -> int:
    from routerlab.tuning.evaluate import run_eval

    result = run_eval(args)
    print(json.dumps(result) if args.json else result.pop("_text", json.dumps(result, indent=1)))
    return 0


def _generate(args) -> int:
    from routerlab.core.base.config import GenerateConfig, RoutingConfig
    from routerlab.core.decode import decode_paths
    from routerlab.core.decode.engine import Control, Engine
    from routerlab.core.model.models import load_model
    from routerlab.tuning.checkpoint import resolve_routers

    if not args.prompt.strip():  # fail before spending seconds on loading
        raise RouterLabError("The prompt is empty.", "Pass some text with --prompt.")
    if args.granularity != "full":
        RoutingConfig.from_granularity(args.granularity)
    GenerateConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                           threshold=0.5 if args.threshold is None else args.threshold, kv_policy=args.kv_policy or "kv")
    loaded = load_model(args.model, device=args.device, trust_remote_code=args.trust_remote_code, dtype=args.dtype,
                        quantize=args.quantize)
    routers, defaults = resolve_routers(args.routers, args.granularity, loaded.model)
    config = GenerateConfig(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        threshold=defaults["threshold"] if args.threshold is None else args.threshold,
        kv_policy=args.kv_policy or defaults["kv_policy"],
        chat=not args.no_chat,
        seed=args.seed,
        quality=not args.no_quality,
        quality_refresh=None,  # no live view here: score in full chunks (cheapest) and at the end
    )
    engine = Engine.from_loaded(loaded)
    if args.decode != "auto":
        engine.decode_choice = decode_paths.forced(engine, args.decode)
    stream = not args.json
    if stream:
        print(decode_paths.describe(engine.decode_choice), file=sys.stderr)
    control = Control(config.threshold)
    for step in engine.generate(args.prompt, routers, config, control):
        if stream and not step.is_prompt:
            print(step.text, end="", flush=True)
    trace = control.trace
    if stream:
        print()
        mean_kl, agreement = trace.mean_kl(), trace.agreement()
        quality = ("quality off" if mean_kl is None else
                   f"mean KL to full {mean_kl:.4f} nats, top-1 agreement with full {agreement:.1%}")
        print(f"[{len(trace.generated_steps)} tokens, skip rate {trace.skip_rate():.1%}, "
              f"{trace.decode_tokens_per_second():.1f} tokens/s, {quality}, {trace.meta['granularity']}, "
              f"kv policy {config.kv_policy}, threshold {config.threshold}"
              f"{', decoded by ' + trace.meta['decode'] if 'decode' in trace.meta else ''}]", file=sys.stderr)
        return 0
    out = {
        "text": trace.text,
        "model": trace.meta["model"],
        "granularity": trace.meta["granularity"],
        "kv_policy": config.kv_policy,
        "threshold": config.threshold,
        "routers": defaults.get("source"),
        "skip_rate": trace.skip_rate(),
        "decode_tokens_per_second": trace.decode_tokens_per_second(),
        "prefill_seconds": trace.meta["prefill_seconds"],
        "stop_reason": trace.meta["stop_reason"],
        "decode": trace.meta.get("decode", "torch ops"),  # the path this run's steps took
        "decode_choice": engine.decode_choice,  # what the start-up measured and chose, or what --decode forced
        "quality": config.quality,
        "mean_kl": trace.mean_kl(),  # over generated tokens, nats; null with --no-quality
        "agreement": trace.agreement(),  # top-1 agreement with the full model; null with --no-quality
        "tokens": [
            {"position": s.position, "id": s.token_id, "text": s.text, "is_prompt": s.is_prompt,
             "scores": s.scores, "executed": s.executed, "threshold": s.threshold, "seconds": s.seconds,
             "kl_full": s.kl_full, "full_top_token": s.full_top_token, "full_top_text": s.full_top_text}
            for s in trace.steps
        ],
    }
    print(json.dumps(out))
    return 0


def _bench_speed(args) -> int:
    from routerlab.bench.speed import speed_benchmark, format_speed

    if args.prompt_tokens < 1 or args.new_tokens < 2 or args.rounds < 1:
        raise RouterLabError("--prompt-tokens and --rounds must be >= 1, --new-tokens >= 2.")
    result = speed_benchmark(args.model, device=args.device, prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens,
                             rounds=args.rounds, threads=args.threads, dtype=args.dtype, quantize=args.quantize,
                             long_context=args.long_context, ttft_tokens=args.ttft_tokens, peers=not args.no_peers,
                             log=lambda *a: print(*a, file=sys.stderr))
    if args.save:
        Path(args.save).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1) if args.json else format_speed(result))
    return 0


def _bench_quality(args) -> int:
    from routerlab.bench.quality import format_quality, quality_benchmark

    try:
        chunks = tuple(int(c) for c in args.chunks.split(",") if c.strip())
    except ValueError:
        raise RouterLabError(f"--chunks {args.chunks!r} is not a list of whole numbers.", "For example --chunks 8,16.") from None
    if not chunks or min(chunks) < 1 or args.new_tokens < 2 or args.rounds < 1:
        raise RouterLabError("--chunks must be whole numbers >= 1, --new-tokens >= 2, --rounds >= 1.")
    result = quality_benchmark(args.model, granularity=args.granularity, prompt=args.prompt, new_tokens=args.new_tokens,
                               chunks=chunks, rounds=args.rounds, threads=args.threads, dtype=args.dtype)
    print(json.dumps(result, indent=1) if args.json else format_quality(result))
    return 0


def _bench_standins(args) -> int:
    from routerlab.bench.standins import format_standins, merge, parse_sets, recost, standins_benchmark
    from routerlab.core.model.models import load_model
    from routerlab.tuning.checkpoint import load_routers
    from routerlab.tuning.data import encode_all, load_records

    try:
        rates = tuple(float(r) for r in args.rates.split(",") if r.strip())
    except ValueError:
        raise RouterLabError(f"--rates {args.rates!r} is not a list of numbers.", "For example --rates 0.05,0.1.") from None
    if not rates or not all(0 < r < 1 for r in rates):
        raise RouterLabError(f"--rates {args.rates!r}: every share must be between 0 and 1.", "For example --rates 0.05,0.1.")
    costs = None
    if args.costs:
        try:
            costs = json.loads(Path(args.costs).read_text())["cost_seconds"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise RouterLabError(f"--costs {args.costs}: no cost_seconds in it ({err}).", "Give a `bench speed --save` file, "
                                 "e.g. assets/bench/speed.json.") from None
    if args.recost:
        if not (costs and args.save and Path(args.save).is_file()):
            raise RouterLabError("--recost needs --costs and an existing --save file.", "Run the table first, then --recost.")
        old = json.loads(Path(args.save).read_text())
        text = load_model(args.model, dtype=args.dtype).model.config.get_text_config()
        result = recost(old, costs, text.num_hidden_layers, text.hidden_size, args.costs)
        Path(args.save).write_text(json.dumps(result, indent=1) + "\n")
        print(format_standins(result))
        return 0
    folders = parse_sets(args.sets)
    files = [part.partition("=")[::2] if "=" in part else (Path(part).stem, part) for part in args.data.split(",") if part.strip()]
    records = {name: load_records(path, "heldout") for name, path in files}  # bad data fails before the model loads
    loaded = load_model(args.model, dtype=args.dtype)
    sets = [(name, folder, load_routers(folder, loaded.model)[0]) for name, folder in folders]
    datasets = {name: encode_all(recs, loaded.tokenizer)[: args.limit] for name, recs in records.items()}
    result = standins_benchmark(loaded, sets, datasets, rates=rates, costs=costs,
                                log=lambda m: print(m, file=sys.stderr, flush=True))
    if args.save:  # rows of sets or files this run did not measure are kept
        old = json.loads(Path(args.save).read_text()) if Path(args.save).is_file() else None
        result = merge(old, result)
        Path(args.save).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1) if args.json else format_standins(result))
    return 0


def _bench_precision(args) -> int:
    from routerlab.bench.products.precision import format_precision, precision_report

    result = precision_report(args.model, args.data, args.split, args.limit, args.granularity, args.routers,
                              quantize=args.quantize, log=lambda m: print(m, file=sys.stderr, flush=True))
    if args.save:
        Path(args.save).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1) if args.json else format_precision(result))
    return 0


def _bench_tradeoff(args) -> int:
    from pathlib import Path

    from routerlab.bench.tradeoff import OUT, run_tradeoff, write_outputs
    from routerlab.core.base.config import check_threshold
    from routerlab.core.model.models import load_model
    from routerlab.tuning.checkpoint import load_routers, shipped_routers
    from routerlab.tuning.data import encode_all, load_records

    try:
        thresholds = tuple(check_threshold(float(t)) for t in args.thresholds.split(",")) if args.thresholds else None
        contexts = tuple(int(c) for c in args.contexts.split(",") if c.strip())
    except ValueError:
        raise RouterLabError("--thresholds and --contexts take comma-separated numbers.", "For example --thresholds 0.4,0.5,0.6.") from None
    records = load_records(args.data, "heldout" if args.data is None else "all")
    loaded = load_model(args.model, dtype=args.dtype, quantize=args.quantize)
    shipped = shipped_routers()
    wanted = args.granularities.split(",") if args.granularities else list(shipped)
    missing = [g for g in wanted if g not in shipped]
    if missing:
        raise RouterLabError(f"No shipped routers for {', '.join(missing)}.", f"Shipped: {', '.join(shipped) or 'none'}.")
    sets = {}
    if args.routers:
        rs, cfg = load_routers(args.routers, loaded.model)
        sets[rs.granularity] = (rs, cfg["threshold"])
    for g in sorted(wanted, key=lambda g: g != "attention-token"):
        if g not in sets:
            rs, cfg = load_routers(shipped[g], loaded.model)
            sets[g] = (rs, cfg["threshold"])
    if not sets:
        raise RouterLabError("No routers to sweep.", "Train some with `python -m routerlab train` or pass --routers.")
    examples = encode_all(records, loaded.tokenizer)[: args.limit]
    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731
    if args.prompts < 1 or args.rounds < 1 or args.new_tokens < 1:
        raise RouterLabError("--prompts, --rounds and --new-tokens must be >= 1.")
    prompts_ids = [list(ex.ids[: ex.start]) for ex in examples[: args.prompts]]
    result = run_tradeoff(loaded, sets, examples, thresholds=thresholds, prompts_ids=prompts_ids,
                          new_tokens=args.new_tokens, rounds=args.rounds,
                          contexts=contexts, log=log)
    paths = write_outputs(result, Path(args.out) if args.out else OUT, log=log)
    if args.json:
        print(json.dumps({"paths": {k: str(v) for k, v in paths.items()}, **result}, default=str))
    else:
        print("\n".join(f"{k}: {v}" for k, v in paths.items()))
    return 0


def _bench_report(args) -> int:
    from routerlab.bench.results.report import BENCH, RESULTS, markdown, results_markdown

    folder = Path(args.out) if args.out else BENCH
    document = Path(args.results) if args.results else (None if args.out else RESULTS)
    if args.check:
        if document is None:
            raise RouterLabError("--check compares a document, and --out alone names none.", "Add --results PATH.")
        if not document.is_file() or document.read_text(encoding="utf-8") != results_markdown(folder):
            state = "does not exist" if not document.is_file() else f"is out of date with {folder}"
            raise RouterLabError(f"{document} {state}.", "Run `python -m routerlab bench report` and commit it "
                                 "(never edit it by hand).")
        print(f"{document} is up to date with {folder}.")
        return 0
    if document is not None:
        document.parent.mkdir(parents=True, exist_ok=True)
        document.write_text(results_markdown(folder), encoding="utf-8")
        print(f"wrote {document}", file=sys.stderr)
        if not (folder / "tradeoff.json").exists():
            return 0  # the document says the sweep was not measured; there are no tables to print
    path = folder / "tradeoff.json"
    try:
        result = json.loads(path.read_text())
        print(markdown(result))
    except FileNotFoundError:
        raise RouterLabError(f"No trade-off results at {path}.", "Run `python -m routerlab bench tradeoff` first.") from None
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise RouterLabError(f"{path} is not a complete bench tradeoff result ({err}).", "Run `bench tradeoff` again.") from None
    return 0


def _bench_load(args) -> int:
    from routerlab.bench.load.cli import main as load_main

    return load_main(args.args)  # the harness's own argparse: same arguments as `python -m routerlab.bench.load`


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except RouterLabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
