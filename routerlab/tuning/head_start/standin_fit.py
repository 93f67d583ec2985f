"""Fit skip stand-ins to the sub-layers they stand in for, before routers and stand-ins train together.

Joint training alone teaches a stand-in only from the cells its router already skips, and routers
skip little while the stand-ins are still zero, so neither moves much. This fit gives every
stand-in a head start: at full depth, over the training examples' response tokens, it records each
routed layer's normed input `x` and the update its sub-layer adds (attention output, MLP output, or
the whole block's), then fits `standin(x)` to that update by least squares (Adam, full batch).
It reports how much of each update's variance the stand-in explains (R^2 on the fitted tokens).

Knows nothing about the joint training loop, checkpoints or the UI.
"""

from __future__ import annotations

import time

import torch

from routerlab.core.routing.router import RouterSet
from routerlab.tuning.forward import layer_walk


@torch.no_grad()
def record_updates(anatomy, examples, target: str, layers, max_tokens: int = 6_000,
                   norms: bool = False) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """layer -> (X (N, D) normed inputs, Y (N, D) the sub-layer's update), float32, response tokens of `examples` at full depth.
    With `norms`, Y is only each update's length (N,): what router_init needs, without holding every update."""
    xs = {i: [] for i in layers}
    ys = {i: [] for i in layers}
    seen = 0
    for ex in examples:
        if seen >= max_tokens:
            break
        ids = torch.tensor([ex.ids], device=anatomy.embed.weight.device)
        r = slice(ex.start, None)
        for i, h, x_attn, mid, x_mlp, out in layer_walk(anatomy, ids):
            if i in xs:
                x, y = {"attention": (x_attn, mid - h), "mlp": (x_mlp, out - mid), "block": (x_attn, out - h)}[target]
                xs[i].append(x[0, r].float().cpu())
                y = y[0, r].float()
                ys[i].append((y.norm(dim=1) if norms else y).cpu())
        seen += ex.n_response
    return {i: (torch.cat(xs[i]), torch.cat(ys[i])) for i in layers}


def fit_standins(anatomy, routers: RouterSet, examples, steps: int = 200, lr: float = 1e-2, log=lambda *_: None) -> dict:
    """Fit every stand-in of `routers` to its sub-layer's update (in place). Returns a report: seconds, tokens, R^2 per layer."""
    t0 = time.perf_counter()
    layers = list(routers.config.layers)
    data = record_updates(anatomy, examples, routers.config.target, layers)
    r2 = {}
    for i in layers:
        standin = routers.standin(i)
        x, y = data[i]
        x, y = x.to(standin.up.weight.device), y.to(standin.up.weight.device)
        opt = torch.optim.Adam(standin.parameters(), lr=lr)
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = (standin(x) - y).pow(2).mean()
            loss.backward()
            opt.step()
        with torch.no_grad():
            r2[str(i)] = round(1.0 - float((standin(x) - y).pow(2).sum() / (y - y.mean(0)).pow(2).sum().clamp_min(1e-12)), 4)
        log(f"stand-in fit: layer {i}: R^2 {r2[str(i)]:.3f} on {len(x)} tokens")
    n = len(next(iter(data.values()))[0]) if data else 0
    return {"steps": steps, "lr": lr, "tokens": n, "seconds": round(time.perf_counter() - t0, 1), "r2": r2}
