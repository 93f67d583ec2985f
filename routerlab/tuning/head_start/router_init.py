"""A head start for routers: each router fitted, before training, to how little its sub-layer changes a token.

Zero-initialised routers (the paper's) know nothing at step 0: every score is 0.5, and the first steps
of a short training are spent finding out which cells matter at all. `probe_init` gives each router a
direction first: at full depth, over a few training examples' response tokens, it records each routed
layer's normed input `x` and the size of the update its sub-layer adds relative to that input
(`log |update| / |x|`: a small update is cheap to skip), and fits a bias-free linear map of `x` to that
size by ridge regression, shifted so that the smallest `skip` share of updates score below the gate.
Router-Tuning then trains from there with its own losses. Knows nothing about the training loop.
"""

from __future__ import annotations

import time

import torch

from routerlab.core.routing.router import RouterSet
from routerlab.tuning.head_start.standin_fit import record_updates

RIDGE = 1e-2  # the ridge term, relative to the mean of diag(X^T X)


@torch.no_grad()
def probe_init(anatomy, routers: RouterSet, examples, skip: float, max_tokens: int = 4_000) -> dict:
    """Set every router of `routers` (in place) from a fit on `examples`. Returns a report: seconds, tokens, per-layer fit."""
    t0 = time.perf_counter()
    layers = list(routers.config.layers)
    data = record_updates(anatomy, examples, routers.config.target, layers, max_tokens=max_tokens, norms=True)
    fit = {}
    for i in layers:
        x, length = data[i]  # (N, D) router inputs and (N,) update lengths, float32
        size = torch.log(length.clamp_min(1e-6) / x.norm(dim=1).clamp_min(1e-6))  # (N,)
        z = (size - torch.quantile(size, skip)) / size.std().clamp_min(1e-6)  # below 0: the `skip` share of smallest updates
        gram = x.T @ x
        w = torch.linalg.solve(gram + RIDGE * gram.diagonal().mean() * torch.eye(gram.shape[0]), x.T @ z)  # (D,)
        router = routers.get(i)
        router.proj.weight.copy_(w.to(router.proj.weight)[None])
        pred = x @ w
        fit[str(i)] = {"corr": round(float(torch.corrcoef(torch.stack([pred, z]))[0, 1]), 3),
                       "skipped": round(float((pred < 0).float().mean()), 3)}
    n = len(next(iter(data.values()))[0]) if data else 0
    return {"tokens": n, "seconds": round(time.perf_counter() - t0, 1), "layers": fit}
