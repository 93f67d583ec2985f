"""`python -m routerlab.bench.step_graph`: the whole decode step as one onnxruntime graph (core/graph/step_graph.py) against
the engine's step and llama.cpp on the same GGUF, side by side in one run.

For each context length: the engine prefills the prompt; the graph takes over that prefill's KV cache and decodes
greedily; the engine decodes from its own copy of the same prefill; llama.cpp (when `make bench-peers` built it)
decodes the same ids in its child process. Rounds alternate the order; medians are reported, with how many of the
first greedy tokens the graph and the engine share (the graph's activations are fp32 with 8-bit products, the engine's
bf16: a near tie may go either way). Then the shipped attention-token routers inside the graph (`routing`): never
skipping (what routing costs) and at their default threshold, against the full graph, on the app's first example
prompt and the passage; under `kv` each step takes the form that pays (core/graph/graph_forms.py), whose measured costs
are printed and saved too, beside the same runs with an `If` at every step (the form alone before). Knows nothing about the UI beyond its example prompts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def _engine_decode(engine, ids: list[int], n: int) -> tuple[float, list[int]]:
    """The engine's greedy decode of `n` tokens after a prefill of `ids`: seconds a token (decode only), the tokens."""
    from routerlab.core.ops.forward import forward
    from routerlab.core.routing.gates import Plan

    an = engine.anatomy
    caches = engine.new_caches(len(ids) + n + 1)
    with torch.inference_mode():
        logits, _ = forward(an, torch.tensor([ids]), torch.arange(len(ids)), caches, Plan(None))
        token, position, out = int(logits[0, -1].max(0).indices), len(ids), []
        start = time.perf_counter()
        for _ in range(n):
            out.append(token)
            logits, _ = forward(an, torch.tensor([[token]]), torch.tensor([position]), caches, Plan(None), top=position, scores_on="cpu")
            token, position = int(logits[0, -1].max(0).indices), position + 1
        return (time.perf_counter() - start) / n, out


def _prefilled(engine, graph, ids: list[int], n: int, routers=None, threshold: float = 0.5) -> int:
    """The engine's prefill of `ids` (under the routers and the graph's KV policy where given), its caches loaded into
    `graph` with room for `n` tokens; the first greedy token."""
    from routerlab.core.ops.forward import forward
    from routerlab.core.routing.gates import Plan

    caches = engine.new_caches(len(ids) + 1)
    plan = Plan(routers, threshold, graph.policy) if routers is not None else Plan(None)
    logits, _ = forward(engine.anatomy, torch.tensor([ids]), torch.arange(len(ids)), caches, plan)
    graph.load(caches, n, threshold, tokens=len(ids))
    return int(logits[0, -1].max(0).indices)


def _graph_decode(engine, graph, ids: list[int], n: int, routers=None, threshold: float = 0.5) -> tuple[float, list[int], float]:
    """The same through the step graph: the engine's prefill (under the routers and the graph's KV policy where
    given), its caches loaded, then `n` greedy steps; seconds a token, the tokens, and the share of routed cells
    skipped."""
    with torch.inference_mode():
        token, out, scores = _prefilled(engine, graph, ids, n, routers, threshold), [], []
        start = time.perf_counter()
        for _ in range(n):
            out.append(token)
            token = int(graph.step(token).max(0).indices)
            if graph.routed:
                scores.append(graph.logits_of_routers[graph.routed].clone())  # read after the clock stops
        seconds = (time.perf_counter() - start) / n
    skipped = float((torch.stack(scores) < graph.threshold).float().mean()) if scores else 0.0
    return seconds, out, skipped


def routing(engine, loaded, prompts: dict[str, list[int]], new_tokens: int, rounds: int, log=print) -> dict:
    """The shipped attention-token routers inside the graph against the full graph: never skipping (threshold 0: the
    cost of routing) and at the set's default threshold under `kv`, and at the default threshold under `drop` (a
    skipped token's keys and values neither computed nor kept), per prompt. Each round prefills every run alike, then
    steps them in turn, token by token (which goes first rotating), so a busy moment falls on all of them; a run's rate
    is its round's mean step, medians over rounds. (Whole decodes in alternating rounds moved the same ratio by up to
    5% between runs on a 2-core EPYC.)"""
    from routerlab.core.graph import graph_forms
    from routerlab.core.graph.step_graph import StepGraph
    from routerlab.tuning.checkpoint import resolve_routers

    routers, defaults = resolve_routers(None, "attention-token", loaded.model)
    threshold = float(defaults["threshold"])
    longest = max(len(ids) for ids in prompts.values()) + new_tokens + 1
    full, routed = StepGraph(engine.anatomy, longest), StepGraph(engine.anatomy, longest, routers=routers)
    dropped = StepGraph(engine.anatomy, longest, routers=routers, policy="drop")
    out = {"routers": "attention-token (shipped)", "threshold": threshold, "prompts": {}, "interleaved": "steps",
           "forms": {"branches_ms": routed.costs.branches_ms, "saved_ms": list(routed.costs.saved_ms), "contexts": list(routed.costs.contexts)}}
    log(f"routers in the graph under kv, measured at its build (core/graph/graph_forms.py): {routed.costs.describe()}")
    with_if = [routed.twin(), routed.twin()]  # the form with an If around every routed attention, at every step
    for g in with_if:
        g.form = graph_forms.BRANCH
    runs = {"full": (full, None, 0.0), "never_skip": (routed, routers, 0.0), "default": (routed.twin(), routers, threshold),
            "default_drop": (dropped, routers, threshold), "never_skip_if": (with_if[0], routers, 0.0),
            "default_if": (with_if[1], routers, threshold)}
    names = list(runs)
    for label, ids in prompts.items():
        rates: dict[str, list[float]] = {k: [] for k in runs}
        cells: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(rounds):
            with torch.inference_mode():
                token = {name: _prefilled(engine, graph, ids, new_tokens, rs, t) for name, (graph, rs, t) in runs.items()}
                seconds = {name: 0.0 for name in runs}
                for k in range(new_tokens):
                    for name in names[k % len(names):] + names[: k % len(names)]:
                        graph = runs[name][0]
                        start = time.perf_counter()
                        token[name] = int(graph.step(token[name]).max(0).indices)
                        seconds[name] += time.perf_counter() - start
                        if graph.routed:  # read after the clock stops
                            cells[name].append(float((graph.logits_of_routers[graph.routed] < graph.threshold[0, 0]).float().mean()))
            for name in runs:
                rates[name].append(new_tokens / seconds[name])
        med = {k: statistics.median(v) for k, v in rates.items()}
        skipped = {k: statistics.mean(v) if v else 0.0 for k, v in cells.items()}
        entry = {"prompt_tokens": len(ids), "tokens_per_second": med, "never_skip_vs_full": med["never_skip"] / med["full"],
                 "default_vs_full": med["default"] / med["full"], "skipped_at_default": skipped["default"],
                 "default_drop_vs_full": med["default_drop"] / med["full"], "skipped_at_default_drop": skipped["default_drop"],
                 "never_skip_if_vs_full": med["never_skip_if"] / med["full"], "default_if_vs_full": med["default_if"] / med["full"]}
        out["prompts"][label] = entry
        log(f"routers in the graph, {label} ({len(ids)} tokens): full {med['full']:.1f} tok/s, never skip {med['never_skip']:.1f} "
            f"({entry['never_skip_vs_full']:.3f}x), threshold {threshold} {med['default']:.1f} ({entry['default_vs_full']:.3f}x, "
            f"{entry['skipped_at_default']:.1%} of routed cells skipped), under drop {med['default_drop']:.1f} "
            f"({entry['default_drop_vs_full']:.3f}x, {entry['skipped_at_default_drop']:.1%} skipped); with an If at every step: "
            f"never skip {entry['never_skip_if_vs_full']:.3f}x, threshold {threshold} {entry['default_if_vs_full']:.3f}x")
    return out


def run(contexts: list[int], new_tokens: int, rounds: int, peers: bool = True, log=print) -> dict:
    from routerlab.bench.speed import _llama_cpp, bench_prompt, cpu_model
    from routerlab.core.base.precision import cpu_matrix_flags, machine_kind
    from routerlab.core.decode.engine import Engine
    from routerlab.core.graph.step_graph import StepGraph, why_not
    from routerlab.core.model.models import load_model

    loaded = load_model(device="cpu")
    engine = Engine.from_loaded(loaded)
    reason = why_not(engine.anatomy)
    if reason is not None:
        raise SystemExit(f"bench step_graph: {reason}")
    capacity = max(contexts) + new_tokens + 1
    start = time.perf_counter()
    graph = StepGraph(engine.anatomy, capacity)
    built = time.perf_counter() - start
    peer = _llama_cpp(loaded, capacity + 8, log) if peers else None
    result = {"model": loaded.name, "cpu_model": cpu_model(), "machine_kind": machine_kind(), "cpu_flags": cpu_matrix_flags(),
              "threads": torch.get_num_threads(), "new_tokens": new_tokens, "rounds": rounds, "graph_seconds_to_build": round(built, 2),
              "engine_weights": engine.weights, "contexts": {}}
    for context in contexts:
        ids = bench_prompt(loaded.tokenizer, context)
        warm = min(8, new_tokens)
        _engine_decode(engine, ids[:64], warm), _graph_decode(engine, graph, ids[:64], warm)  # warm-up
        rates: dict[str, list[float]] = {"graph": [], "engine": [], "llama_cpp": []}
        same = None
        for r in range(rounds):
            order = ("graph", "engine", "llama_cpp") if r % 2 == 0 else ("llama_cpp", "engine", "graph")
            tokens = {}
            for name in order:
                if name == "llama_cpp":
                    rate = peer.decode_rate(ids, new_tokens) if peer is not None else None
                    if rate is not None:
                        rates[name].append(rate)
                    continue
                seconds, tokens[name] = (_graph_decode(engine, graph, ids, new_tokens)[:2] if name == "graph" else _engine_decode(engine, ids, new_tokens))
                rates[name].append(1.0 / seconds)
            if same is None:
                same = next((i for i, (a, b) in enumerate(zip(tokens["graph"], tokens["engine"])) if a != b), new_tokens)
        med = {k: statistics.median(v) if v else None for k, v in rates.items()}
        entry = {"tokens_per_second": med, "rounds_tokens_per_second": rates, "first_tokens_the_same": same,
                 "graph_vs_engine": med["graph"] / med["engine"]}
        if med["llama_cpp"]:
            entry["graph_vs_llama_cpp"] = med["graph"] / med["llama_cpp"]
            entry["engine_vs_llama_cpp"] = med["engine"] / med["llama_cpp"]
        result["contexts"][str(context)] = entry
        peer_text = (f", llama.cpp {med['llama_cpp']:.1f}: graph {entry['graph_vs_llama_cpp']:.3f}x, engine "
                     f"{entry['engine_vs_llama_cpp']:.3f}x llama.cpp" if med["llama_cpp"] else " (no llama.cpp)")
        log(f"{context} tokens of context: step graph {med['graph']:.1f} tok/s, engine {med['engine']:.1f}{peer_text}; "
            f"graph {entry['graph_vs_engine']:.2f}x the engine; first {same} of {new_tokens} greedy tokens the same")
    if peer is not None:
        peer.close()
    from routerlab.ui.state.resources import load_prompts

    first = loaded.tokenizer.apply_chat_template([{"role": "user", "content": load_prompts()[0]}], add_generation_prompt=True, tokenize=True)
    first = list(first["input_ids"] if hasattr(first, "keys") else first)
    result["routing"] = routing(engine, loaded, {"first example": first, f"{min(contexts)}-token passage": bench_prompt(loaded.tokenizer, min(contexts))},
                                64, rounds, log)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m routerlab.bench.step_graph", description=__doc__.split("\n\n")[0])
    p.add_argument("--contexts", default="512,2048", help="comma-separated prompt lengths in tokens")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=6, help="alternating rounds (medians)")
    p.add_argument("--no-peers", action="store_true", help="skip llama.cpp")
    p.add_argument("--save", default=None, help="write the JSON result here")
    args = p.parse_args(argv)
    try:
        contexts = [int(c) for c in args.contexts.split(",") if c.strip()]
    except ValueError:
        p.error(f"--contexts takes whole numbers separated by commas, e.g. 512,2048, not {args.contexts!r}")
    if not contexts or min(contexts) < 1:
        p.error("--contexts needs at least one length of 1 token or more")
    if args.new_tokens < 1 or args.rounds < 1:
        p.error("--new-tokens and --rounds take whole numbers of 1 or more")
    result = run(contexts, args.new_tokens, args.rounds, peers=not args.no_peers)
    print(f"machine: {result['cpu_model']} ({result['machine_kind']}: {' '.join(result['cpu_flags'])}), {result['threads']} threads; "
          f"graph built in {result['graph_seconds_to_build']:.1f} s")
    if args.save:
        with open(args.save, "w") as f:
            json.dump(result, f, indent=1)
        print(f"saved {args.save}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
