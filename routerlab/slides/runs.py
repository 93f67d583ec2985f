"""The fresh runs behind the slide figures: greedy generations of the example prompts with the shipped routers.

Owns `Job` (one run: prompt, threshold or the full model, KV policy, quality pass on or off), `plan` (the runs
a set of figures needs, each once) and `lockstep` (runs advanced one token each in turn on the calling thread,
who goes first rotating every round, as the Compare tab's Decoder does, so their speeds are measured under the
same load). Knows nothing about plotly, figures or files.
"""

from __future__ import annotations

from dataclasses import dataclass

from routerlab.core.base.config import KV_POLICIES, GenerateConfig
from routerlab.core.records.trace import Trace


@dataclass(frozen=True)
class Job:
    prompt: str
    threshold: float | None  # None: the full model (no routers)
    kv_policy: str
    quality: bool = True  # per-token KL to the full model (the Compare tab's columns measure it)

    def config(self, max_new_tokens: int) -> GenerateConfig:
        """Greedy (temperature 0, reproducible text); quality scored in full chunks and at the end (no live view)."""
        return GenerateConfig(max_new_tokens=max_new_tokens, temperature=0.0, threshold=0.5 if self.threshold is None else self.threshold,
                              kv_policy=self.kv_policy, quality=self.quality, quality_refresh=None, shared=False)


def plan(names: tuple[str, ...], prompts: list[str], threshold: float, kv_policy: str,
         ladder: tuple[float, ...]) -> tuple[list[Job], list[Job]]:
    """(runs of the first prompt, timed side by side; runs of every prompt for the layer map), each run once.

    heatmap: the routers at `threshold`; ladder: the full model and each threshold of `ladder`; kv: the full
    model and the routers at `threshold` under every KV policy; layers: every prompt at `threshold`, no quality pass.
    """
    first = prompts[0]
    wanted: list[Job] = []
    if "heatmap" in names:
        wanted.append(Job(first, threshold, kv_policy))
    if "ladder" in names:
        wanted += [Job(first, None, kv_policy)] + [Job(first, t, kv_policy) for t in ladder]
    if "kv" in names:
        wanted += [Job(first, None, kv_policy)] + [Job(first, threshold, p) for p in KV_POLICIES]
    layers = [Job(p, threshold, kv_policy, quality=False) for p in prompts] if "layers" in names else []
    return list(dict.fromkeys(wanted)), layers


def lockstep(engine, routers, jobs: list[Job], max_new_tokens: int) -> dict[Job, Trace]:
    """Run `jobs` to the end, one token each in turn on this thread; their Traces by job."""
    from routerlab.core.decode.engine import Control
    from routerlab.core.serve.lockstep import lockstep

    controls, live = {}, []
    for job in jobs:
        config = job.config(max_new_tokens)
        controls[job] = control = Control(config.threshold)
        live.append(engine.generate(job.prompt, None if job.threshold is None else routers, config, control))
    lockstep(live)
    return {job: control.trace for job, control in controls.items()}
