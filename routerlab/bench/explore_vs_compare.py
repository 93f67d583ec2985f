"""`python -m routerlab.bench.explore_vs_compare`: Explore's decode tok/s (runs alone, quality on, not counting the quality pass) against Compare's (lockstep) on the
tide-mill document: full model and attention-token 0.7 drop, 64 new tokens, greedy, the page's defaults otherwise."""
import dataclasses

from routerlab import ui
from routerlab.core.base.documents import load_documents
from routerlab.core.decode.engine import Control, Engine
from routerlab.core.model.models import load_model


def main() -> None:
    eng = Engine.from_loaded(load_model())
    res = ui.Resources(eng, ui.Limits.from_env())
    doc = next(d for d in load_documents() if d.id == "tide-mill")
    prompt = doc.prompt
    label = next(r.label for r in res.router_sets if r.granularity == "attention-token" and r.path is not None)
    routers = res.routers_for(eng, label)
    def cfg(t): return dataclasses.replace(res.generate_config(64, 0, t, "drop", quality=True), shared=False)
    def alone(r, t):
        c = Control(t); list(eng.generate(prompt, r, cfg(t), c)); return c.trace
    def lockstep(t):
        cs = [Control(0.5), Control(t)]
        gens = [eng.generate(prompt, None, cfg(0.5), cs[0]), eng.generate(prompt, routers, cfg(t), cs[1])]
        live = [True, True]; k = 0
        while any(live):
            for j in ((0, 1) if k % 2 == 0 else (1, 0)):
                if live[j] and next(gens[j], None) is None: live[j] = False
            k += 1
        return [c.trace for c in cs]
    rows = []
    for r in range(3):
        full, routed = alone(None, 0.5), alone(routers, 0.7)
        cf, cr = lockstep(0.7)
        n = min(len(cf.generated_steps), len(cr.generated_steps))
        rows.append((full.decode_speed(), routed.decode_speed(), cf.decode_speed(n), cr.decode_speed(n), routed.skip_rate()))
        print("round %d: Explore full %.1f, 0.7 drop %.1f (skip %.0f%%) | Compare full %.1f, 0.7 drop %.1f | Explore/Compare for 0.7: %.2f"
              % (r + 1, rows[-1][0], rows[-1][1], 100 * rows[-1][4], rows[-1][2], rows[-1][3], rows[-1][1] / rows[-1][3]), flush=True)
    print("label", label, "prompt tokens", len(eng.encode(prompt, cfg(0.7))))


if __name__ == "__main__":
    main()
