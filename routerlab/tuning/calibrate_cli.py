"""`python -m routerlab calibrate`: its options and its handler (the fit is in tuning/calibrate.py, imported only when
the command runs, so the command line starts without loading torch)."""

from __future__ import annotations

import json
import sys
from typing import Callable

from routerlab.core.base.errors import RouterLabError
from routerlab.tuning.data import SPLITS


def add_calibrate_parser(sub, add_dtype: Callable) -> None:
    """Register `calibrate` on the command's subparsers; `add_dtype` adds the shared --dtype option."""
    c = sub.add_parser("calibrate", help="fit a router set's threshold scale (0.5 = its default, 0.7 = where text starts "
                       "to break) and write it into its router.json")
    c.add_argument("--routers", required=True, help="router checkpoint folder, e.g. assets/routers/attention-token")
    c.add_argument("--model", default=None, help="hub id or local folder (default: the embedded SmolLM2-135M-Instruct)")
    c.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    add_dtype(c)
    c.add_argument("--data", default=None, help="fit prompts, JSONL (default assets/data/selfdistill.jsonl, the prompts "
                   "`train` chose the default threshold on)")
    c.add_argument("--split", choices=SPLITS, default="heldout", help="split of --data to fit on (default heldout)")
    c.add_argument("--limit", type=int, default=32, help="fit examples (default 32)")
    c.add_argument("--check-data", default=None, help="held-out prompts to check on, never fitted "
                   "(default assets/data/selfdistill_extra.jsonl)")
    c.add_argument("--check-split", choices=SPLITS, default="heldout", help="split of --check-data (default heldout)")
    c.add_argument("--check-limit", type=int, default=32, help="held-out examples (default 32)")
    c.add_argument("--multiple", type=float, default=4.0, help="0.7 skips this many times the default's share (default 4)")
    c.add_argument("--floor", type=float, default=0.01, help="a default that skips less than this share of the cells "
                   "(threshold 0: never) puts 0.5 where this share is skipped instead (default 0.01)")
    c.add_argument("--long", type=int, default=0, metavar="TOKENS", help="fit and check on long inputs: the examples "
                   "joined into chats of about TOKENS tokens, as `train --long` makes them (default 0: each alone)")
    c.add_argument("--dry-run", action="store_true", help="fit and print, write nothing")
    c.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    c.set_defaults(func=calibrate_command)


def calibrate_command(args) -> int:
    from routerlab.tuning.calibrate import run_calibrate

    if args.limit < 1 or args.check_limit < 1:
        raise RouterLabError("--limit and --check-limit must be >= 1.")
    if args.json:
        args.log = lambda m: print(m, file=sys.stderr, flush=True)
    result = run_calibrate(args)  # logs the fit and the table as it goes
    result.pop("_text")
    if args.json:
        print(json.dumps(result))
    return 0
