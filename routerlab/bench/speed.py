"""`bench speed`: decode tokens/s of transformers' generate and of the engine, measured side by side.

Machines here are noisy, so only numbers measured next to each other are compared: the engine's
configurations generate in lockstep with the engine's full model (one token each in turn,
`measure_speed`, also used by `bench tradeoff`), transformers' generate runs between those
rounds, and the report gives medians of per-round figures and ratios. The ideal speedup of a
skipping run comes from the measured cost of exactly the work it skips (`cost_breakdown`:
measured inside whole decode steps, in the same process, at the same context; it lives in
core/decode/costs.py, which the app also uses, and is re-exported here).

Knows nothing about the UI or training.
"""

from __future__ import annotations

import math
import statistics

import torch
from torch.nn import functional as F
from transformers import StoppingCriteria, StoppingCriteriaList

from routerlab.core.base.config import GenerateConfig, RoutingConfig, default_layers
from routerlab.core.base.device import is_cuda, now
from routerlab.core.decode import decode_paths
from routerlab.core.kernels import low_paths
from routerlab.core.decode.costs import cost_breakdown, ideal_speedup, seconds_per_call  # noqa: F401 (re-exported: the cost model lives in core)
from routerlab.core.base.precision import cpu_matrix_flags, cpu_vector_unit, dtype_name, machine_kind
from routerlab.core.decode.engine import Control, Engine
from routerlab.core.model.models import load_model
from routerlab.core.ops.forward import forward
from routerlab.core.routing.gates import Plan
from routerlab.core.routing.router import RouterSet
from routerlab.core.serve.lockstep import in_turn

# A fixed English passage, repeated to any length: deterministic prompts without a data file.
PASSAGE = (
    "The history of computing is a story of layers. Early machines were wired by hand for each problem; "
    "stored programs turned wiring into data, and compilers turned programs into text that people could "
    "read. Operating systems hid the hardware, networks hid the distance between machines, and libraries "
    "hid the details of each task behind a name. Every layer made the next one possible, and every layer "
    "cost something: time, memory, or the attention of the people who had to understand it. "
)


def bench_prompt(tokenizer, n_tokens: int, vocab_size: int = 128) -> list[int]:
    """`n_tokens` of the passage (token ids `i % vocab_size` when there is no tokenizer: tiny test models)."""
    if tokenizer is None:
        return [(7 * i + 3) % vocab_size for i in range(n_tokens)]
    ids: list[int] = []
    while len(ids) < n_tokens:
        ids += tokenizer(PASSAGE, add_special_tokens=False)["input_ids"]
    return ids[:n_tokens]


class _Clock(StoppingCriteria):
    """Called by generate after each new token: a timestamp per token, no stopping."""

    def __init__(self):
        self.times: list[float] = []

    def __call__(self, input_ids, scores, **kwargs):
        self.times.append(now(input_ids.device))
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def generate_rate(model, ids: list[int], new_tokens: int) -> float:
    """Decode tokens/s of transformers' own generate on the bare model (prefill excluded)."""
    clock = _Clock()
    x = torch.tensor([ids], device=model.device)
    with torch.inference_mode():
        model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       do_sample=False, stopping_criteria=StoppingCriteriaList([clock]), pad_token_id=0)
    return (len(clock.times) - 1) / (clock.times[-1] - clock.times[0])


# -- engine speed: real generations, every configuration in lockstep with the full model -----------
def _start(engine: Engine, ids: list[int], routers, threshold: float, policy: str, new_tokens: int, other: Engine | None = None):
    engine = other or engine  # a configuration may run on another engine (the same model in another dtype)
    config = GenerateConfig(max_new_tokens=new_tokens, threshold=threshold, kv_policy=policy, ignore_eos=True,
                            max_new_tokens_cap=max(4096, new_tokens))
    control = Control(threshold)
    return engine.generate_ids(ids, routers, config, control), control


def _summary(engine: Engine, control: Control) -> dict:
    trace = control.trace
    gen = [s for s in trace.generated_steps if s.seconds > 0]
    routed = [e for s in gen for e in s.executed]
    return {
        "seconds": sum(s.seconds for s in gen),
        "tokens": len(gen),
        "skip_all": sum(e is False for e in routed) / (len(gen) * engine.n_layers),
        "kv_saved": trace.meta["kv_bytes_full"] - trace.meta["kv_bytes_held"],
        "ttft": trace.meta["prefill_seconds"],
    }


def _lockstep(engine: Engine, ids: list[int], configs: dict[str, tuple], new_tokens: int, turn: int) -> dict[str, dict]:
    """Generate with every configuration at once, one token each in turn (the order rotates every
    token), so a slow spell of a noisy machine falls on all of them alike."""
    running = {name: _start(engine, ids, *cfg[:3], new_tokens, *cfg[3:]) for name, cfg in configs.items()}
    names = list(running)
    live = set(names)
    tick = turn
    while live:
        for name in in_turn(names, tick):
            if name in live:
                step = next(running[name][0], None)
                while step is not None and step.is_prompt:  # the prompt's steps come out of one prefill
                    step = next(running[name][0], None)
                if step is None:
                    live.discard(name)
        tick += 1
    return {name: _summary(configs[name][3] if len(configs[name]) > 3 else engine, control)
            for name, (_, control) in running.items()}


def measure_speed(engine: Engine, prompts: list[list[int]], configs: dict[str, tuple], new_tokens: int,
                  rounds: int, log=print) -> dict[str, dict]:
    """configs: name -> (routers, threshold, policy[, engine]). Returns medians of per-round figures and ratios.

    In each round and prompt all configurations and the full model decode in lockstep; a speedup
    is the full model's decode time over the configuration's, for the same tokens of the same run."""
    names = ["full"] + [n for n in configs if n != "full"]
    configs = {"full": (None, 0.5, "kv"), **{n: configs[n] for n in names[1:]}}
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(rounds):
        for j, ids in enumerate(prompts):
            for name, summary in _lockstep(engine, ids, configs, new_tokens, r * len(prompts) + j).items():
                runs[name].append(summary)
        log(f"speed round {r + 1}/{rounds} done")
    full = runs["full"]

    def tps(x: dict) -> float:
        return x["tokens"] / x["seconds"]

    out = {}
    for name in names:
        rs = runs[name]
        out[name] = {
            "tokens_per_second": statistics.median(tps(x) for x in rs),
            "tokens_per_second_full": statistics.median(tps(x) for x in full),
            "speedup": statistics.median(tps(x) / tps(f) for x, f in zip(rs, full)),
            "skip_rate_all_layers_measured": statistics.mean(x["skip_all"] for x in rs),
            "kv_bytes_saved": statistics.mean(x["kv_saved"] for x in rs),
            "ttft_seconds": statistics.median(x["ttft"] for x in rs),
        }
    return out


def read_bandwidth(gib: float = 1.0, repeats: int = 5, device="cpu") -> float:
    """Bytes/s `device` reads (host RAM on a CPU, the GPU's own memory on a GPU), measured the way a torch user would:
    the best of a few sums over a tensor of `gib` GiB (all threads), the GPU's queue drained before each clock read.
    A decode step cannot be faster than its weights' bytes over this."""
    x = torch.ones(int(gib * (1 << 30)) // 4, dtype=torch.float32, device=device)
    x.sum()  # first touch
    best = math.inf
    for _ in range(repeats):
        t0 = now(device)
        x.sum()
        best = min(best, now(device) - t0)
    del x
    return gib * (1 << 30) / best


def decode_weight_bytes(model) -> int:
    """Bytes of weights one decode step reads: every parameter once (shared storage counted once),
    except an input embedding table that is not also the LM head (a step reads one row of it)."""
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight.data_ptr() == embed.data_ptr()
    seen, total = set(), 0
    for p in model.parameters():
        key = p.untyped_storage().data_ptr()
        if key in seen or (p is embed and not tied):
            continue
        seen.add(key)
        total += p.untyped_storage().nbytes()
    return total


def ttft(engine: Engine, model, ids: list[int], rounds: int, peer=None) -> dict[str, float | None]:
    """Seconds from prompt to first token: the engine's prefill, transformers' generate of one token and
    the peer's (llama.cpp), alternating, medians."""
    config = GenerateConfig(max_new_tokens=1, ignore_eos=True, max_new_tokens_cap=max(4096, len(ids) + 1))
    x = torch.tensor([ids], device=model.device)
    engine_s, generate_s, peer_s = [], [], []
    for _ in range(rounds):
        control = Control(0.5)
        for _step in engine.generate_ids(ids, None, config, control):
            pass
        engine_s.append(control.trace.meta["prefill_seconds"])
        t0 = now(x.device)
        with torch.inference_mode():
            model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=1, do_sample=False, pad_token_id=0)
        generate_s.append(now(x.device) - t0)
        if peer is not None:
            first = peer.ttft(ids)
            if first is not None:
                peer_s.append(first)
    return {"engine": statistics.median(engine_s), "generate": statistics.median(generate_s),
            "llama_cpp": statistics.median(peer_s) if peer_s else None, "prompt_tokens": len(ids)}


def kernel_floor(engine: Engine, context: int, repeat: int = 16) -> dict[str, float]:
    """Seconds a decode step spends in its unavoidable kernels alone, at `context` cached tokens: every layer's
    weight products (`products`), every layer's attention over its cache (`attention`) and the LM head (`head`),
    called back to back with nothing between them: no norms, rotary, cache writes or routing, none of the other
    ops' dispatch. What the engine's step cannot go below with these kernels on this machine."""
    an = engine.anatomy
    caches = engine.new_caches(context)
    with torch.inference_mode():
        forward(an, torch.zeros(1, context, dtype=torch.long, device=engine.device),
                torch.arange(context, device=engine.device), caches, Plan(None))
        x = torch.randn(1, an.hidden_size, dtype=engine.dtype, device=engine.device)
        plain = [p for p in an.layers if p.gate_up is not None]
        inner = [torch.randn(1, p.down.dense.shape[1], dtype=engine.dtype, device=engine.device) for p in plain]
        queries = [torch.randn(1, p.attn.n_kv_heads, p.attn.n_heads // p.attn.n_kv_heads, p.attn.head_dim,
                               dtype=engine.dtype, device=engine.device) for p in an.layers]

        def products():
            for p, xi in zip(plain, inner):
                p.attn.qkv.one(x), p.attn.o.one(x), p.gate_up.one(x), p.down.one(xi)

        def attention():
            for p, q, c in zip(an.layers, queries, caches):
                F.scaled_dot_product_attention(q, c.k[:, :, : c.n], c.v[:, :, : c.n], scale=p.attn.scaling)

        times = {name: seconds_per_call(fn, repeat, engine.device) for name, fn in
                 (("products", products), ("attention", attention), ("head", lambda: an.head.one(x)))}
    times["total"] = sum(times.values())
    return times


class _Survivor:
    """A peer in its child process whose crash ends its figures, not the benchmark: after a PeerCrashed every call
    returns None, and `error` says what happened (the signal), for the result and the report."""

    def __init__(self, peer, log):
        self.peer, self.log, self.error = peer, log, None
        self.version, self.path = peer.version, peer.path

    def _call(self, method: str, *args):
        from routerlab.bench.peers import PeerCrashed

        if self.error is not None:
            return None
        try:
            return getattr(self.peer, method)(*args)
        except PeerCrashed as err:
            self.error = str(err)
            self.log(f"{err}; the benchmark goes on without it")
            return None

    def decode_rate(self, ids, new_tokens):
        return self._call("decode_rate", ids, new_tokens)

    def ttft(self, ids):
        return self._call("ttft", ids)

    def close(self) -> None:
        self.peer.close()


def _llama_cpp(loaded, context: int, log):
    """llama.cpp on the embedded model's GGUF in a child process, or None (another model, llama-cpp-python not
    installed, or it failed to start: said in the log)."""
    from routerlab.bench.peers import InChild, LlamaCpp, PeerCrashed, llama_cpp_available
    from routerlab.core.model.models import EMBEDDED_NAME, embedded_gguf_path

    if loaded.name != EMBEDDED_NAME:
        return None
    if not llama_cpp_available():
        log("llama-cpp-python is not installed (`make bench-peers` builds it): no llama.cpp figures")
        return None
    try:
        return _Survivor(InChild(LlamaCpp, embedded_gguf_path(fetch=False), context, torch.get_num_threads()), log)
    except PeerCrashed as err:
        log(f"{err}: no llama.cpp figures")
        return None


def speed_benchmark(model_spec: str | None = None, *, prompt_tokens: int = 512, new_tokens: int = 128, rounds: int = 3,
                    threads: int | None = None, loaded=None, dtype: str = "auto", quantize: str = "auto",
                    long_context: int = 2048, ttft_tokens: int = 2048, ttft_rounds: int = 3, peers: bool = True,
                    device: str | None = None, log=print) -> dict:
    """The whole story in one run, on one machine: the engine's default path against its own 16-bit path
    (lockstep), transformers' generate in the same dtype and llama.cpp on the same GGUF (between the
    engine's rounds), at `prompt_tokens` and at `long_context` tokens of context; the bytes each reads per
    step and the memory-bandwidth bound; time to first token; the skip configurations against their
    ideal speedups."""
    if threads:
        torch.set_num_threads(threads)
    loaded = loaded or load_model(model_spec, device=device, dtype=dtype, quantize=quantize)
    model, tok = loaded.model, loaded.tokenizer
    engine = Engine.from_loaded(loaded)
    sixteen = Engine(model, tok, loaded.name) if engine.anatomy.lowbit is not None else None  # the same model, dense weights
    n = engine.n_layers
    ids = bench_prompt(tok, prompt_tokens)
    long_ids = bench_prompt(tok, long_context) if long_context else None
    peer = _llama_cpp(loaded, max(prompt_tokens, long_context, ttft_tokens) + new_tokens + 8, log) if peers else None
    never = RouterSet.zeros(model, RoutingConfig.from_granularity("attention-token", default_layers(n)))
    deep = tuple(range(n // 2, n))  # the deeper half of all layers
    forced = RouterSet.zeros(model, RoutingConfig.from_granularity("attention-token", deep))
    configs = {  # zero routers score 0.5: threshold 0 never skips, threshold 1 always skips
        "engine_never_skip": (never, 0.0, "kv"),
        **{f"deep_off_{p}": (forced, 1.0, p) for p in ("mask", "kv", "drop")},
    }
    dense_only = {"engine_16bit": (None, 0.5, "kv", sixteen)} if sixteen is not None else {}
    configs.update(dense_only)
    measure_speed(engine, [ids[:64]], configs, 4, 1, log=lambda *_: None)  # warm-up
    generate, peer_rates, engine_runs, long_runs, long_peer, floors = [], [], [], [], [], []
    for r in range(rounds):  # generate and llama.cpp cannot run in lockstep: they run between the engine's rounds
        generate.append(generate_rate(model, ids, new_tokens))
        if peer is not None and (rate := peer.decode_rate(ids, new_tokens)) is not None:
            peer_rates.append(rate)
        engine_runs.append(measure_speed(engine, [ids], configs, new_tokens, 1, log=lambda *_: None))
        floors.append(kernel_floor(engine, prompt_tokens + new_tokens // 2))
        if long_ids:
            long_runs.append(measure_speed(engine, [long_ids], dense_only, new_tokens, 1, log=lambda *_: None))
            if peer is not None and (rate := peer.decode_rate(long_ids, new_tokens)) is not None:
                long_peer.append(rate)
        log(f"speed round {r + 1}/{rounds} done")
    costs = cost_breakdown(engine, ids, prompt_tokens + new_tokens // 2)
    bandwidth = read_bandwidth(device=engine.device)
    first = ttft(engine, model, bench_prompt(tok, ttft_tokens), ttft_rounds, peer) if ttft_tokens else None
    if peer is not None:
        peer.close()

    def med(name: str, key: str, runs=engine_runs) -> float:
        return statistics.median(run[name][key] for run in runs)

    def ratio(runs: list[dict], others: list[float]) -> float | None:
        return statistics.median(run["full"]["tokens_per_second"] / o for run, o in zip(runs, others)) if others else None

    rates = {"generate": statistics.median(generate), "engine": med("full", "tokens_per_second"),
             "llama_cpp": statistics.median(peer_rates) if peer_rates else None,
             **{name: med(name, "tokens_per_second") for name in configs}}
    step_bytes = {"engine": engine.anatomy.decode_weight_bytes(), "engine_16bit": decode_weight_bytes(model),
                  "generate": decode_weight_bytes(model)}
    if peer_rates:
        from routerlab.bench.peers import gguf_weight_bytes

        step_bytes["llama_cpp"] = gguf_weight_bytes(peer.path)
    result = {
        "model": loaded.name,
        "device": str(engine.device),
        "dtype": dtype_name(engine.dtype),
        "precision": engine.precision,
        "weights": engine.weights,
        "kernels": engine.kernels,  # low_paths.tune: each kind's one-row product, measured at start-up
        "decode": engine.decode_choice,  # decode_paths.choose: torch's ops or the step graph, measured at start-up
        "cpu": cpu_vector_unit(),
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_matrix_flags(),
        "machine_kind": machine_kind(),
        "threads": torch.get_num_threads(),
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "rounds": rounds,
        "llama_cpp_version": peer.version if peer is not None else None,
        "llama_cpp_error": peer.error if peer is not None else None,  # a crash of its process, with the signal
        "routed_layers": list(default_layers(n)),
        "skipped_layers": list(deep),
        "tokens_per_second": rates,
        "engine_vs_generate": ratio(engine_runs, generate),
        "engine_vs_llama_cpp": ratio(engine_runs, peer_rates),
        "engine_vs_16bit_engine": 1.0 / med("engine_16bit", "speedup") if sixteen is not None else 1.0,
        "read_bandwidth_bytes_per_second": bandwidth,
        "bytes_per_step": step_bytes,
        "decode_weight_bytes": step_bytes["engine"],
        "bandwidth_bound_tokens_per_second": bandwidth / step_bytes["engine"],
        "fraction_of_bandwidth_bound": rates["engine"] * step_bytes["engine"] / bandwidth,
        "ttft_seconds": first,
        "routing": med("engine_never_skip", "speedup"),
        "speedup": {p: med(f"deep_off_{p}", "speedup") for p in ("mask", "kv", "drop")},
        "ideal_speedup": {p: ideal_speedup(costs, len(deep), p) for p in ("mask", "kv", "drop")},
        "cost_seconds": costs,
        "kernel_floor_seconds": {k: statistics.median(f[k] for f in floors) for k in floors[0]},
        # llama.cpp's tokens/s against a step made of nothing but its products and attention (each round's pair)
        "kernel_floor_vs_llama_cpp": statistics.median(1.0 / (f["total"] * o) for f, o in zip(floors, peer_rates)) if peer_rates else None,
    }
    if long_runs:
        result["long_context"] = {
            "context_tokens": long_context,
            "tokens_per_second": {"engine": med("full", "tokens_per_second", long_runs),
                                  "engine_16bit": med("engine_16bit", "tokens_per_second", long_runs) if sixteen is not None else None,
                                  "llama_cpp": statistics.median(long_peer) if long_peer else None},
            "engine_vs_llama_cpp": ratio(long_runs, long_peer),
        }
    if is_cuda(engine.device):  # the host's waits for the GPU per decoded token (docs/method.md, "Routing on a GPU")
        from routerlab.bench.gpu.syncs import decode_syncs

        result["syncs_per_token"] = {"full": decode_syncs(engine, ids, None, 32),
                                     "never_skip": decode_syncs(engine, ids, never, 32)}  # one more per routed layer
    result["drop_speedup"] = result["speedup"]["drop"]
    result["fraction_of_ideal"] = {p: result["speedup"][p] / result["ideal_speedup"][p] for p in result["speedup"]}
    return result


def cpu_model() -> str:
    """The processor's name as the OS reports it (benchmark notes say which machine they ran on)."""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8", errors="replace"):
            if line.lower().startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _rate(x: float | None) -> str:
    return f"{x:7.2f}" if x is not None else "    n/a"


def format_speed(r: dict) -> str:
    tps = r["tokens_per_second"]
    b = r["bytes_per_step"]
    lines = [
        f"bench speed: {r['model']} on {r['device']} ({r.get('cpu_model', '?')}, {r['threads']} threads, {r.get('cpu', '?')}"
        f"{'; machine kind ' + r['machine_kind'] + ': ' + ' '.join(r.get('cpu_flags') or []) if r.get('machine_kind') else ''}), "
        f"{r['precision']}; prompt {r['prompt_tokens']} tokens, {r['new_tokens']} new tokens, {r['rounds']} rounds (medians)",
        f"  weights at decode: {r['weights']}",
        *([f"  {low_paths.describe(r['kernels'])}"] if r.get("kernels") else []),
        *([f"  {decode_paths.describe(r['decode'])}"] if r.get("decode") else []),
        f"  engine, no routers (default path)       {tps['engine']:7.2f} tok/s   reads {b['engine'] / 1e6:5.0f} MB a step",
    ]
    if "engine_16bit" in tps:
        lines.append(f"  engine, 16-bit weights (reference)      {tps['engine_16bit']:7.2f} tok/s   reads {b['engine_16bit'] / 1e6:5.0f} MB"
                     f"   engine_vs_16bit_engine {r['engine_vs_16bit_engine']:.3f}")
    lines.append(f"  transformers generate ({r['dtype']})          {tps['generate']:7.2f} tok/s   reads {b['generate'] / 1e6:5.0f} MB"
                 f"   engine_vs_generate {r['engine_vs_generate']:.3f}")
    if r.get("engine_vs_llama_cpp") is not None:
        lines.append(f"  llama.cpp {r.get('llama_cpp_version', '?'):<8} on the same GGUF       {tps['llama_cpp']:7.2f} tok/s   "
                     f"reads {b['llama_cpp'] / 1e6:5.0f} MB   engine_vs_llama_cpp {r['engine_vs_llama_cpp']:.3f}")
    elif r.get("llama_cpp_error"):
        lines.append(f"  llama.cpp: {r['llama_cpp_error']} (the rest of the benchmark ran without it; `make bench-peers` rebuilds it)")
    else:
        lines.append("  llama.cpp: not measured (llama-cpp-python not installed: `make bench-peers`; or not the embedded model)")
    lines.append(f"  memory-bandwidth bound of the engine     {r['bandwidth_bound_tokens_per_second']:7.2f} tok/s   "
                 f"({r['read_bandwidth_bytes_per_second'] / 1e9:.1f} GB/s read); fraction reached {r['fraction_of_bandwidth_bound']:.2f}")
    if r.get("long_context"):
        lc = r["long_context"]
        t = lc["tokens_per_second"]
        vs = f"   engine_vs_llama_cpp {lc['engine_vs_llama_cpp']:.3f}" if lc.get("engine_vs_llama_cpp") is not None else ""
        lines.append(f"  at {lc['context_tokens']} tokens of context: engine {_rate(t['engine'])}, 16-bit {_rate(t['engine_16bit'])}, "
                     f"llama.cpp {_rate(t['llama_cpp'])} tok/s{vs}")
    if r.get("ttft_seconds"):
        f = r["ttft_seconds"]
        peer = f", llama.cpp {f['llama_cpp']:.2f} s" if f.get("llama_cpp") is not None else ""
        lines.append(f"  time to first token, {f['prompt_tokens']}-token prompt: engine {f['engine']:.2f} s, generate {f['generate']:.2f} s{peer}")
    lines.append(f"  engine, routers on layers {r['routed_layers'][0]}-{r['routed_layers'][-1]}, never skip {tps['engine_never_skip']:7.2f} tok/s   "
                 f"speedup {r['routing']:.3f} (the cost of routing)")
    for p in ("mask", "kv", "drop"):
        lines.append(f"  engine, layers {r['skipped_layers'][0]}-{r['skipped_layers'][-1]} attention off, {p:<4}   "
                     f"{tps['deep_off_' + p]:7.2f} tok/s   speedup {r['speedup'][p]:.3f}  ideal {r['ideal_speedup'][p]:.3f}  "
                     f"({r['fraction_of_ideal'][p]:.0%} of ideal)")
    if r.get("kernel_floor_seconds"):
        f = r["kernel_floor_seconds"]
        vs = f"   kernel_floor_vs_llama_cpp {r['kernel_floor_vs_llama_cpp']:.3f}" if r.get("kernel_floor_vs_llama_cpp") is not None else ""
        lines.append(f"  kernel floor (products, attention and head alone)  {1 / f['total']:7.2f} tok/s   "
                     f"(ms: products {f['products'] * 1e3:.2f}, attention {f['attention'] * 1e3:.2f}, head {f['head'] * 1e3:.2f}){vs}")
    c = r["cost_seconds"]
    lines.append("  cost per decode token (ms): " + ", ".join(
        f"{k} {v * 1e3:.3f}" for k, v in c.items()) + "  [attention/mlp: one layer]")
    return "\n".join(lines)
