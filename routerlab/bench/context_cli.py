"""`python -m routerlab bench context`: its options and its handler (the work is in bench/context.py, imported only
when the command runs, so the command line starts without loading torch)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from routerlab.core.base.errors import RouterLabError


def add_context_parser(bench) -> None:
    """Register `bench context` on the `bench` subparsers."""
    cx = bench.add_parser("context", help="where skipping pays: speedup against context length (full model vs the default "
                          "attention-token set at two thresholds under kv and drop, lockstep), the ideal, KL and agreement; "
                          "and the shipped sets on long documents vs short prompts")
    cx.add_argument("--model", default=None)
    cx.add_argument("--contexts", default=None, help="comma-separated prompt lengths in tokens (default 128,512,1024,2048,4096)")
    cx.add_argument("--quick", action="store_true", help="contexts 128 and 512, one long document and two short prompts for the sets")
    cx.add_argument("--new-tokens", type=int, default=64)
    cx.add_argument("--no-sets", action="store_true", help="leave out the shipped sets' long-document quality")
    cx.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    cx.add_argument("--json", action="store_true")
    cx.add_argument("--save", default=None, help="also write the JSON result here (make context: assets/bench/context.json)")
    cx.set_defaults(func=bench_context)


def bench_context(args) -> int:
    from routerlab.bench.context import CONTEXTS, QUICK_CONTEXTS, context_benchmark, format_context, save

    try:
        contexts = tuple(int(c) for c in args.contexts.split(",") if c.strip()) if args.contexts else (QUICK_CONTEXTS if args.quick else CONTEXTS)
    except ValueError:
        raise RouterLabError(f"--contexts {args.contexts!r} is not a list of whole numbers.", "For example --contexts 128,1024.") from None
    if not contexts or min(contexts) < 16 or args.new_tokens < 2:
        raise RouterLabError("--contexts must be whole numbers >= 16 and --new-tokens >= 2.")
    result = context_benchmark(args.model, contexts=contexts, new_tokens=args.new_tokens, sets=not args.no_sets,
                               quick=args.quick, threads=args.threads, log=lambda *a: print(*a, file=sys.stderr, flush=True))
    if args.save:
        save(result, Path(args.save))
    print(json.dumps(result, indent=1) if args.json else format_context(result))
    return 0
