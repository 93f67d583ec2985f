"""The whole trade-off sweep on a tiny model, in seconds: CSV columns and finite figures."""

import csv
import math

import torch

from routerlab.bench.tradeoff import COLUMNS, granularity_table, run_tradeoff, write_outputs
from routerlab.core.base.config import RoutingConfig
from routerlab.core.model.models import LoadedModel, tiny_model
from routerlab.core.routing.router import RouterSet
from routerlab.tuning.data import Example


def test_sweep_on_a_tiny_model_writes_complete_rows(tmp_path):
    model = tiny_model("llama")
    loaded = LoadedModel(model, None, "tiny-llama", "test")
    g = torch.Generator().manual_seed(0)
    sets = {}
    for name in ("attention-token", "mlp-token"):
        rs = RouterSet.zeros(model, RoutingConfig.from_granularity(name, [1, 2]))
        for r in rs.routers.values():
            r.proj.weight.data = torch.randn(r.proj.weight.shape, generator=g) * 3
        sets[name] = (rs, 0.5)
    examples = [Example(tuple(int(x) for x in torch.randint(0, 128, (24,), generator=g)), 8) for _ in range(3)]
    result = run_tradeoff(loaded, sets, examples, new_tokens=4, rounds=1, contexts=(16,), log=lambda *a: None)
    paths = write_outputs(result, tmp_path, log=lambda *a: None)
    with open(paths["csv"]) as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == COLUMNS
    assert {"tuned", "tuned-drop", "official-mask", "random", "static", "full"} <= {r["method"] for r in rows}
    for r in rows:
        for col in ("skip_rate_all_layers", "perplexity", "agreement", "tokens_per_second", "speedup", "ideal_speedup"):
            assert math.isfinite(float(r[col])), (r["method"], col)
    assert paths["html"].stat().st_size > 1000
    md = paths["md"].read_text()  # the README's tables
    assert md.count("| tuned |") >= 2 and "## Longer prompts" in md and "Cost per decode step" in md
    table = granularity_table(result["rows"])
    assert [t["granularity"] for t in table] == ["attention-token", "mlp-token"]
    tuned = sorted(float(r["skip_rate_all_layers"]) for r in rows if r["method"] == "tuned" and r["granularity"] == "attention-token")
    assert len(tuned) >= 2 and tuned[0] < tuned[-1]  # default points follow the routers' own score quantiles
    longer = result["context_scaling"]
    assert {r["method"] for r in longer} == {"tuned", "tuned-drop", "full"}
    assert all(math.isfinite(r["speedup"]) and math.isfinite(r["perplexity"]) for r in longer)
    assert len(rows) == len(result["rows"]) + len(longer)  # the CSV holds both


def test_long_examples_prepend_other_examples_whole():
    from routerlab.bench.tradeoff import long_examples

    exs = [Example(tuple(range(10 * k, 10 * k + 10)), 4) for k in range(5)]
    out = long_examples(exs, 30, 2)
    assert out[0].ids[-10:] == exs[0].ids and out[0].ids[:20] == exs[1].ids + exs[2].ids
    assert out[0].start == 24 and out[0].n_response == exs[0].n_response
    assert out[1].ids[:10] == exs[2].ids


def test_lockstep_timing_runs_every_configuration_to_the_end():
    """Configurations decoded in lockstep produce the same generations as solo runs."""
    from routerlab.bench.speed import measure_speed
    from routerlab.core.base.config import GenerateConfig
    from routerlab.core.decode.engine import Engine

    model = tiny_model("llama")
    engine = Engine(model)
    rs = RouterSet.zeros(model, RoutingConfig.from_granularity("attention-token", [1, 2]))
    for r in rs.routers.values():
        r.proj.weight.data = torch.randn(r.proj.weight.shape, generator=torch.Generator().manual_seed(5)) * 3
    ids = [int(x) for x in torch.randint(0, 128, (10,), generator=torch.Generator().manual_seed(6))]
    configs = {"kv": (rs, 0.5, "kv"), "drop": (rs, 0.5, "drop"), "never": (rs, 0.0, "kv")}
    out = measure_speed(engine, [ids], configs, new_tokens=6, rounds=2, log=lambda *a: None)
    assert set(out) == {"full", "kv", "drop", "never"}
    for name, (routers, threshold, policy) in configs.items():
        config = GenerateConfig(max_new_tokens=6, threshold=threshold, kv_policy=policy, ignore_eos=True)
        solo = [s for s in engine.generate_ids(ids, routers, config) if not s.is_prompt and s.seconds > 0]
        skipped = sum(e is False for s in solo for e in s.executed) / (len(solo) * engine.n_layers)
        assert out[name]["skip_rate_all_layers_measured"] == skipped, name
        assert out[name]["tokens_per_second"] > 0 and math.isfinite(out[name]["speedup"])
    assert out["never"]["skip_rate_all_layers_measured"] == 0.0 < out["kv"]["skip_rate_all_layers_measured"]


def test_report_prints_the_tables_of_a_run_or_says_what_is_missing(tmp_path, capsys):
    import json

    from routerlab.__main__ import main

    assert main(["bench", "report", "--out", str(tmp_path)]) == 2
    assert "No trade-off results" in capsys.readouterr().err
    (tmp_path / "tradeoff.json").write_text(json.dumps({"model": "m"}))
    assert main(["bench", "report", "--out", str(tmp_path)]) == 2
    assert "not a complete bench tradeoff result" in capsys.readouterr().err
