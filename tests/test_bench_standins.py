"""bench standins on a tiny model: equal skip shares, the stand-ins' cost taken off, rows merged across runs."""

from __future__ import annotations

import pytest
import torch
from test_standin import routed_set
from test_ui import char_tokenizer

from routerlab.bench.standins import format_standins, merge, parse_sets, standins_benchmark
from routerlab.core.base.errors import RouterLabError
from routerlab.core.model.models import LoadedModel, tiny_model
from routerlab.tuning.data import Example


def _examples(n=6, length=40, start=8):
    g = torch.Generator().manual_seed(0)
    return [Example(tuple(torch.randint(4, 127, (length,), generator=g).tolist()), start) for _ in range(n)]


def test_sets_are_compared_at_equal_shares_with_the_stand_ins_cost_taken_off(tmp_path):
    model = tiny_model("llama")  # 4 layers; routers on 1 and 2
    loaded = LoadedModel(model, char_tokenizer(), "tiny-llama", "local")
    plain = routed_set(model, "mlp-token")
    stood = routed_set(model, "mlp-token", rank=4, standin_seed=2)
    for rs in (plain, stood):  # small random weights: scores spread around 0.5 (no ties at 0 or 1)
        g = torch.Generator().manual_seed(1)
        for r in rs.routers.values():
            r.proj.weight.data = torch.randn(r.proj.weight.shape, generator=g) * 0.15
    sets = [("plain", tmp_path, plain), ("stood", tmp_path, stood)]
    result = standins_benchmark(loaded, sets, {"d": _examples()}, rates=(0.1, 0.25), log=lambda *_: None)
    rows = {(r["set"], r["share_target"]): r for r in result["rows"]}
    assert len(rows) == 4
    for r in rows.values():  # a share of all 4 layers' cells, from quantiles of 2 routed layers' scores
        assert r["skip_rate_all_layers"] == pytest.approx(r["share_target"], abs=0.06)
        assert r["kl_full"] >= 0 and r["ideal_speedup"] >= 1.0
    assert rows[("plain", 0.1)]["standin_rank"] == 0 and rows[("stood", 0.1)]["standin_rank"] == 4
    assert result["standin_seconds"]["4"] > 0
    # the same skipped cells save less with a stand-in to run: its measured cost comes off each cell
    for share in (0.1, 0.25):
        p, s = rows[("plain", share)], rows[("stood", share)]
        per_cell_plain = p["step_ms_saved"] / max(1e-9, p["skip_rate_all_layers"])
        per_cell_stood = s["step_ms_saved"] / max(1e-9, s["skip_rate_all_layers"])
        assert per_cell_stood <= per_cell_plain
    assert "| d | stood | 4 | 10% |" in format_standins(result)


def test_save_keeps_the_rows_another_run_measured():
    row = lambda data, name, share, kl: {"data": data, "set": name, "share_target": share, "kl_full": kl}  # noqa: E731
    old = {"standin_seconds": {"64": 1e-5}, "rows": [row("s", "a", 0.1, 1.0), row("s", "b", 0.1, 2.0), row("g", "a", 0.1, 3.0)]}
    new = {"standin_seconds": {}, "rows": [row("s", "b", 0.1, 9.0), row("s", "c", 0.1, 4.0)]}
    merged = merge(old, new)
    assert [(r["data"], r["set"], r["kl_full"]) for r in merged["rows"]] == [
        ("s", "a", 1.0), ("s", "b", 9.0), ("s", "c", 4.0), ("g", "a", 3.0)]
    assert merged["standin_seconds"] == {"64": 1e-5} and merged["runs"] == 2
    assert merge(None, new) is new


def test_set_names_and_bad_folders(tmp_path):
    (tmp_path / "r").mkdir()
    assert parse_sets(f"x={tmp_path / 'r'},{tmp_path / 'r'}") == [("x", tmp_path / "r"), ("r", tmp_path / "r")]
    with pytest.raises(RouterLabError, match="is not a folder"):
        parse_sets(str(tmp_path / "missing"))
    with pytest.raises(RouterLabError, match="names no router folder"):
        parse_sets(" , ")


def test_recost_redoes_only_the_step_figures():
    from routerlab.bench.standins import recost

    rows = [{"data": "d", "set": "a", "share_target": 0.1, "skip_rate_all_layers": 0.1, "granularity": "mlp-token", "standin_rank": 0,
             "kl_full": 0.5, "step_ms_saved": 99.0, "ideal_speedup": 9.0}]
    costs = {"attention_full": 0.001, "attention_kv_only": 0.0004, "mlp": 0.002, "head": 0.01, "step": 0.05}
    out = recost({"rows": rows, "costs": {}}, costs, n_layers=10, hidden_size=64, source="speed.json")
    (r,) = out["rows"]
    assert r["step_ms_saved"] == pytest.approx(2.0) and r["step_ms"] == pytest.approx(50.0)  # 1 cell x 2 ms
    assert r["ideal_speedup"] == pytest.approx(50 / 48) and r["kl_full"] == 0.5
    assert out["costs_source"] == "speed.json" and out["costs"] is costs
