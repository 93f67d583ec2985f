"""Skip stand-ins on tiny models: zero stand-ins are plain skipping, `kv` equals `mask` with them, the
engine runs what training trained, only routers and stand-ins train, checkpoints keep them or refuse them."""

from __future__ import annotations

import json

import pytest
import torch
from test_engine import run  # prefill, then decode one token at a time: logits for every position
from torch import nn

from routerlab.core.base.config import GenerateConfig, RoutingConfig
from routerlab.core.base.errors import RouterLabError
from routerlab.core.decode.costs import ideal_speedup, saved_per_cell
from routerlab.core.decode.engine import Engine
from routerlab.core.model.models import tiny_model
from routerlab.core.records.trace import savings
from routerlab.core.routing.gates import Plan
from routerlab.core.routing.router import RouterSet
from routerlab.tuning.checkpoint import load_routers, save_routers
from routerlab.tuning.data import Example
from routerlab.tuning.forward import student_forward
from routerlab.tuning.train import TrainConfig, example_losses, train_routers

ROUTED = [1, 2]
GRANULARITIES = ["attention-token", "mlp-token", "block-token", "attention-sequence", "block-sequence"]


def routed_set(model, granularity, rank=0, seed=None, standin_seed=None):
    rs = RouterSet.zeros(model, RoutingConfig.from_granularity(granularity, ROUTED))
    if rank:
        rs = RouterSet(rs.config, rs.n_layers, rs.hidden_size, standin_rank=rank)
    if seed is not None:  # random router weights: about half the tokens skip at 0.5
        g = torch.Generator().manual_seed(seed)
        for r in rs.routers.values():
            r.proj.weight.data = torch.randn(r.proj.weight.shape, generator=g) * 3.0
    if standin_seed is not None:  # a trained-looking stand-in: up no longer zero
        g = torch.Generator().manual_seed(standin_seed)
        for s in rs.standins.values():
            s.up.weight.data = torch.randn(s.up.weight.shape, generator=g) * 0.1
    return rs


def _ids(seed, n=14):
    return torch.randint(0, 128, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("policy", ["mask", "kv", "drop"])
def test_zero_stand_ins_change_nothing(granularity, policy):
    model = tiny_model("llama")
    engine = Engine(model)
    ids = _ids(1)
    plain = run(engine, ids, Plan(routed_set(model, granularity, seed=3), 0.5, policy))
    with_zero = run(engine, ids, Plan(routed_set(model, granularity, rank=8, seed=3), 0.5, policy))
    assert torch.equal(plain, with_zero)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
@pytest.mark.parametrize("granularity", ["attention-token", "mlp-token", "block-token"])
def test_kv_equals_mask_with_stand_ins_and_stand_ins_matter(family, granularity):
    model = tiny_model(family)
    engine = Engine(model)
    ids = _ids(2)
    rs = routed_set(model, granularity, rank=8, seed=3, standin_seed=4)
    masked = run(engine, ids, Plan(rs, 0.5, "mask"))
    torch.testing.assert_close(run(engine, ids, Plan(rs, 0.5, "kv")), masked, atol=1e-4, rtol=1e-4)
    plain = run(engine, ids, Plan(routed_set(model, granularity, seed=3), 0.5, "mask"))
    assert (plain - masked).abs().max() > 1e-3, "a non-zero stand-in must change what skipped tokens compute"


class Replaced(nn.Module):
    """A sub-layer replaced by a stand-in, for the plain transformers forward (attention returns a pair)."""

    def __init__(self, standin, attention):
        super().__init__()
        self.standin, self.attention = standin, attention

    def forward(self, hidden_states, *args, **kwargs):
        out = self.standin(hidden_states)
        return (out, None) if self.attention else out


@pytest.mark.parametrize("target", ["attention", "mlp"])
@pytest.mark.parametrize("policy", ["kv", "drop"])
def test_always_skipping_runs_exactly_the_stand_in(target, policy):
    """Zero routers score 0.5: at 0.51 every routed cell skips, so the model is the base with those
    sub-layers replaced by their stand-ins (under kv the skipped attention's keys/values are never read)."""
    model = tiny_model("llama")
    engine = Engine(model)
    ids = _ids(5, 12)
    rs = routed_set(model, f"{target}-token", rank=8, standin_seed=6)
    got = run(engine, ids, Plan(rs, 0.51, policy))
    attr = "self_attn" if target == "attention" else "mlp"
    for i in ROUTED:
        setattr(model.model.layers[i], attr, Replaced(rs.standin(i), target == "attention"))
    with torch.no_grad():
        ref = model(ids).logits
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_a_skipped_block_is_its_input_plus_the_stand_in():
    model = tiny_model("llama")
    engine = Engine(model)
    ids = _ids(7, 12)
    rs = routed_set(model, "block-token", rank=8, standin_seed=8)
    got = run(engine, ids, Plan(rs, 0.51, "drop"))

    class Block(nn.Module):
        def __init__(self, layer, standin):
            super().__init__()
            self.layer, self.standin = layer, standin

        def forward(self, hidden_states, *args, **kwargs):
            return hidden_states + self.standin(self.layer.input_layernorm(hidden_states))

    for i in ROUTED:
        model.model.layers[i] = Block(model.model.layers[i], rs.standin(i))
    with torch.no_grad():
        ref = model(ids).logits
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("granularity", ["attention-token", "mlp-token", "block-token", "block-sequence"])
def test_the_engine_runs_what_training_trained(granularity):
    """The training forward (every sub-layer runs, hard gate with STE) gives the logits that real skipping gives."""
    model = tiny_model("llama")
    engine = Engine(model)
    ids, start = _ids(9, 16), 6
    rs = routed_set(model, granularity, rank=8, seed=10, standin_seed=11)
    with torch.no_grad():
        trained, _ = student_forward(engine.anatomy, ids, start, Plan(rs, 0.5, "kv", ste=True))
        served, _ = student_forward(engine.anatomy, ids, start, Plan(rs, 0.5, "kv"))
    torch.testing.assert_close(served, trained, atol=1e-4, rtol=1e-4)


def _examples(n=6, length=16, start=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [Example(tuple(torch.randint(0, 128, (length,), generator=g).tolist()), start) for _ in range(n)]


@pytest.mark.parametrize("granularity", ["mlp-token", "block-sequence"])
def test_only_routers_and_stand_ins_train_and_the_base_stays_bit_identical(granularity):
    model = tiny_model("llama")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = TrainConfig(granularity=granularity, steps=4, batch_size=2, lr=1e-2, lm_weight=1.0, target=0.5, ramp=0.0,
                      adapters=4, adapter_lr=1e-2)
    result = train_routers(model, _examples(), cfg, progress=False)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not any(p.requires_grad for p in model.parameters())
    assert result.routers.standin_rank == 4 and result.report["standin_rank"] == 4
    assert any(float(s.up.weight.detach().abs().sum()) > 0 for s in result.routers.standins.values()), "the stand-ins learned"


def test_a_few_steps_with_stand_ins_lower_the_loss():
    """Every cell skipped (gate 1.0 is above any score): only the stand-ins can lower the loss, and they do."""
    model = tiny_model("llama")
    examples = _examples(4)
    cfg = TrainConfig(granularity="mlp-token", steps=15, batch_size=4, lr=1e-9, lm_weight=1.0, kd_weight=0.0,
                      budget_weight=0.0, target=1.0, threshold=1.0, adapters=8, adapter_lr=3e-2)
    fresh = train_routers(model, examples, TrainConfig(**{**cfg.__dict__, "steps": 1, "adapter_lr": 1e-9}), progress=False).routers
    trained = train_routers(model, examples, cfg, progress=False).routers
    an = Engine(model).anatomy

    def loss(rs):
        with torch.no_grad():
            return sum(float(example_losses(an, rs, torch.tensor([e.ids]), e.start, cfg, 1.0, None)["loss"]) for e in examples)

    assert loss(trained) < loss(fresh) - 1e-3


def test_checkpoints_keep_stand_ins_and_refuse_a_wrong_shape(tmp_path):
    model = tiny_model("llama")
    rs = routed_set(model, "mlp-token", rank=8, seed=1, standin_seed=2)
    folder = save_routers(rs, tmp_path / "r", model)
    config = json.loads((folder / "router.json").read_text())
    assert config["standins"] == {"rank": 8, "activation": "silu"}
    loaded, _ = load_routers(folder, model)
    assert loaded.standin_rank == 8
    for i in ROUTED:
        assert torch.equal(loaded.standin(i).up.weight, rs.standin(i).up.weight)
        assert torch.equal(loaded.standin(i).down.weight, rs.standin(i).down.weight)
    plain = save_routers(routed_set(model, "mlp-token", seed=1), tmp_path / "plain", model)
    assert "standins" not in json.loads((plain / "router.json").read_text())
    assert load_routers(plain, model)[0].standin_rank == 0  # no stand-ins: loads as before they existed
    config["standins"]["rank"] = 4  # the weights are rank 8
    (folder / "router.json").write_text(json.dumps(config))
    with pytest.raises(RouterLabError, match=r"stand-in of layer 1 is malformed.*\(8, 64\).*expected \(4, 64\)"):
        load_routers(folder, model)
    del config["standins"]  # the weights hold stand-ins the config does not name
    (folder / "router.json").write_text(json.dumps(config))
    with pytest.raises(RouterLabError, match="without stand-ins"):
        load_routers(folder, model)
    config["standins"] = {"rank": "big"}
    (folder / "router.json").write_text(json.dumps(config))
    with pytest.raises(RouterLabError, match="stand-in rank"):
        load_routers(folder, model)


def test_bad_ranks_are_refused():
    with pytest.raises(RouterLabError, match="Stand-in rank"):
        RouterSet(RoutingConfig(layers=(1,)), 4, 64, standin_rank=-1)
    with pytest.raises(RouterLabError, match="adapters"):
        TrainConfig(adapters=-2)


def test_stand_ins_enter_the_cost_model_and_the_trace():
    costs = {"attention_full": 1.0, "attention_kv_only": 0.25, "mlp": 2.0, "head": 3.0, "step": 40.0}
    assert saved_per_cell(costs, "kv", "mlp", standin=0.5) == 1.5
    assert saved_per_cell(costs, "kv", "attention", standin=1.0) == 0.0  # never below 0
    assert ideal_speedup(costs, 4, "kv", "mlp", standin=0.5) < ideal_speedup(costs, 4, "kv", "mlp")
    model = tiny_model("llama")
    engine = Engine(model)
    config = GenerateConfig(max_new_tokens=6, threshold=0.51)  # zero routers: every MLP cell skips
    plain = _trace(engine, model, 0, config)
    stood = _trace(engine, model, 8, config)
    assert plain.meta["standin_rank"] == 0 and stood.meta["standin_rank"] == 8
    assert stood.meta["costs"]["standin"] == 4.0 * 64 * 8
    assert savings(stood)["routed_flops_saved"] < savings(plain)["routed_flops_saved"]


def _trace(engine, model, rank, config):
    from routerlab.core.decode.engine import Control

    control = Control(config.threshold)
    list(engine.generate_ids([1, 2, 3], routed_set(model, "mlp-token", rank=rank), config, control))
    return control.trace


def test_the_shipped_set_of_a_granularity_is_the_folder_named_after_it(tmp_path, monkeypatch):
    """A second set of a granularity (e.g. with stand-ins) sits beside it and never replaces it as the default."""
    import routerlab.tuning.checkpoint as ckpt

    model = tiny_model("llama")
    for name, rank in (("a-mlp-first", 0), ("mlp-token", 0), ("mlp-token-r8", 8)):
        save_routers(routed_set(model, "mlp-token", rank=rank), tmp_path / name, model)
    monkeypatch.setattr(ckpt, "SHIPPED", tmp_path)
    assert ckpt.shipped_routers() == {"mlp-token": tmp_path / "mlp-token"}
    (tmp_path / "mlp-token" / "router.json").unlink()
    assert ckpt.shipped_routers() == {"mlp-token": tmp_path / "a-mlp-first"}


def test_the_heatmap_marks_cells_that_ran_a_stand_in():
    from routerlab.ui.figures import plots

    model = tiny_model("llama")
    engine = Engine(model)
    config = GenerateConfig(max_new_tokens=4, threshold=0.51)  # zero routers: every routed cell skips
    heat = {rank: plots.heatmap(_trace(engine, model, rank, config)) for rank in (0, 8)}
    skipped = {rank: next(t for t in fig.data if t.name == "skipped") for rank, fig in heat.items()}
    assert "rank-8 stand-in ran" in skipped[8].hovertemplate and "stand-in" not in skipped[0].hovertemplate
    assert skipped[8].colorbar.title.text == "stand-in ran: score"
