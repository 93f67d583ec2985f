"""`python -m routerlab.bench.slider`: what moving the slider buys, as the command line gives it. Each run is its own
`python -m routerlab generate --json --no-quality` process (the start-up's choice of decode path, the graph's forms
measured at its build, as a user's command would), the runs alternating in rounds; medians of their decode tokens/s and
each setting's ratio to the full model's, with the decode path every run named.

Settings: the first example prompt (the app's, under the chat template) with the full model and the shipped
attention-token set at 0.5 under `kv`; a long document (a shipped document cut to about 1,800 tokens with its task)
with the full model and the set at 0.7 under `kv` and `drop`. Knows nothing about the UI beyond its example prompts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

FIRST = [("full", ["--granularity", "full"]), ("kv 0.5", ["--threshold", "0.5", "--kv-policy", "kv"])]
LONG = [("full", ["--granularity", "full"]), ("kv 0.7", ["--threshold", "0.7", "--kv-policy", "kv"]),
        ("drop 0.7", ["--threshold", "0.7", "--kv-policy", "drop"])]


def prompts(long_tokens: int) -> dict[str, str]:
    from routerlab.core.base.documents import cut_to_tokens, load_documents
    from routerlab.core.model.models import load_model
    from routerlab.ui.state.resources import load_prompts

    documents = load_documents()
    tok = load_model(device="cpu").tokenizer

    def encode(text: str) -> list[int]:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    return {"first example": load_prompts()[0], "long document": cut_to_tokens(documents[:1], long_tokens, encode, documents[0].task)}


def generate(prompt: str, args: list[str], new_tokens: int) -> dict:
    cmd = [sys.executable, "-m", "routerlab", "generate", "--json", "--no-quality", "--max-new-tokens", str(new_tokens),
           "--prompt", prompt, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench slider: {' '.join(args)} failed: {done.stderr.strip()[-500:]}")
    out = json.loads(done.stdout)
    return {"tokens_per_second": out["decode_tokens_per_second"], "decode": out["decode"], "skip_rate": out["skip_rate"],
            "prompt_tokens": sum(t["is_prompt"] for t in out["tokens"])}


def run(rounds: int, new_tokens: int, long_tokens: int, log=print) -> dict:
    from routerlab.core.base.precision import machine_kind

    texts = prompts(long_tokens)
    result = {"machine_kind": machine_kind(), "rounds": rounds, "new_tokens": new_tokens, "prompts": {}}
    for label, settings in (("first example", FIRST), ("long document", LONG)):
        runs: dict[str, list[dict]] = {name: [] for name, _ in settings}
        for r in range(rounds):
            for name, args in settings if r % 2 == 0 else settings[::-1]:
                runs[name].append(generate(texts[label], args, new_tokens))
        med = {name: statistics.median(x["tokens_per_second"] for x in rs) for name, rs in runs.items()}
        entry = {"prompt_tokens": runs["full"][0]["prompt_tokens"], "tokens_per_second": med,
                 "vs_full": {name: med[name] / med["full"] for name in med},
                 "skip_rate": {name: statistics.median(x["skip_rate"] for x in rs) for name, rs in runs.items()},
                 "decode": {name: sorted({x["decode"] for x in rs}) for name, rs in runs.items()}}
        result["prompts"][label] = entry
        parts = [f"{name} {med[name]:.1f} tok/s ({entry['vs_full'][name]:.3f}x, {entry['skip_rate'][name]:.1%} skipped)" for name in med]
        log(f"{label} ({entry['prompt_tokens']} tokens): " + ", ".join(parts))
        log(f"  decoded by: " + "; ".join(f"{name}: {' / '.join(d)}" for name, d in entry["decode"].items()))
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m routerlab.bench.slider", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (medians)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--long-tokens", type=int, default=1800, help="the long document's prompt, in tokens")
    p.add_argument("--save", default=None, help="write the JSON result here")
    args = p.parse_args(argv)
    result = run(args.rounds, args.new_tokens, args.long_tokens)
    if args.save:
        with open(args.save, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
