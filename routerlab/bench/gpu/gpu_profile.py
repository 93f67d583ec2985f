"""`python -m routerlab.bench.gpu.gpu_profile`: per-step medians of a random-weight SmolLM2-135M-shaped model by KV policy and
quality pass, then torch.profiler over one 12-token `drop` run (what assets/bench/gpu-profile-drop-h200.txt holds).
For a CUDA machine; needs none of gradio, plotly or gguf."""
import statistics

import torch

from routerlab.bench.gpu import gpu_check as g
from routerlab.core.decode.engine import Control


def main() -> None:
    eng = g.build_engine("smollm", g.choose_device(None))
    rs, ids = g.random_routers(eng), g.prompt_ids(eng, 256)

    def run(policy, quality, n=32, routers=rs):
        c = Control(0.5)
        list(eng.generate_ids(ids, routers, g._config(n, kv_policy=policy, quality=quality, quality_chunk=8), c))
        st = [s.seconds for s in c.trace.generated_steps if s.seconds > 0]
        return statistics.median(st) * 1e3, c.trace.meta.get("prefill_seconds")

    run("kv", False, 8)  # warm-up
    for p in ("kv", "drop", "mask"):
        for q in (False, True):
            print(p, "quality" if q else "no-quality", "median step ms %.2f prefill s %.3f" % run(p, q), flush=True)
    print("full", "median step ms %.2f prefill s %.3f" % run("kv", False, routers=None), flush=True)
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        run("drop", False, 12)
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
