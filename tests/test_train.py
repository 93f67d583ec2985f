"""Router-Tuning on tiny models: only routers train and are saved, the base stays bit-identical,
a few steps lower the loss, checkpoints of trained routers refuse another base, 2 processes agree."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from routerlab.core.base.errors import RouterLabError
from routerlab.core.model.models import tiny_model
from routerlab.core.model.anatomy import Anatomy
from routerlab.tuning.checkpoint import load_routers, save_routers
from routerlab.tuning.data import Example
from routerlab.tuning.train import TrainConfig, example_losses, parse_layers, router_parameters_only, train_routers


def _examples(n=6, length=16, start=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [Example(tuple(torch.randint(0, 128, (length,), generator=g).tolist()), start) for _ in range(n)]


def _mean_loss(model, routers, examples, cfg):
    an = Anatomy(model)
    with torch.no_grad():
        return sum(float(example_losses(an, routers, torch.tensor([e.ids]), e.start, cfg, cfg.target, None)["loss"])
                   for e in examples) / len(examples)


@pytest.mark.parametrize("granularity", ["attention-token", "attention-sequence", "mlp-token", "block-sequence"])
def test_only_routers_train_and_the_base_stays_bit_identical(granularity):
    model = tiny_model("llama")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = train_routers(model, _examples(), TrainConfig(granularity=granularity, steps=3, batch_size=2, lr=1e-2,
                                                           lm_weight=1.0), progress=False)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not any(p.requires_grad for p in model.parameters())
    assert any(float(p.abs().sum()) > 0 for p in result.routers.parameters())  # the routers did move
    assert result.report["kv_policy"] == "kv" and result.report["steps"] == 3


def test_the_optimizer_check_rejects_a_base_parameter():
    model = tiny_model("llama")
    routers = train_routers(model, _examples(2), TrainConfig(steps=1, batch_size=1), progress=False).routers
    bad = torch.optim.Adam([*routers.parameters(), next(model.parameters())])
    with pytest.raises(AssertionError):
        router_parameters_only(model, routers, bad)


def test_a_few_steps_lower_the_loss():
    model = tiny_model("llama")
    examples = _examples(4)
    cfg = TrainConfig(steps=12, batch_size=4, lr=5e-2, lm_weight=1.0, kd_weight=0.0, budget_weight=0.0, target=1.0)
    fresh = train_routers(model, examples, TrainConfig(**{**cfg.__dict__, "steps": 1, "lr": 1e-9}), progress=False).routers
    trained = train_routers(model, examples, cfg, progress=False).routers
    assert _mean_loss(model, trained, examples, cfg) < _mean_loss(model, fresh, examples, cfg) - 1e-3


def test_saved_checkpoint_holds_only_router_weights_and_refuses_another_base(tmp_path):
    model = tiny_model("llama")
    result = train_routers(model, _examples(), TrainConfig(steps=2, batch_size=2), progress=False)
    folder = save_routers(result.routers, tmp_path / "r", model, threshold=0.45, kv_policy="kv", summary=result.report)
    tensors = load_file(str(folder / "routers.safetensors"))
    assert set(tensors) == {f"layer.{i}" for i in result.routers.config.layers}
    assert all(t.shape == (1, 64) for t in tensors.values())
    config = json.loads((folder / "router.json").read_text())
    assert config["kv_policy"] == "kv" and config["threshold"] == 0.45 and config["training"]["steps"] == 2
    loaded, _ = load_routers(folder, model)
    assert all(torch.equal(loaded.get(i).proj.weight, result.routers.get(i).proj.weight) for i in result.routers.config.layers)
    with pytest.raises(RouterLabError, match="different weights"):
        load_routers(folder, tiny_model("llama", seed=1))
    (folder / "routers.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(RouterLabError, match="corrupted"):
        load_routers(folder, model)


def test_config_and_layer_parsing_refuse_bad_values():
    assert parse_layers("1-3,7") == (1, 2, 3, 7)
    with pytest.raises(RouterLabError):
        parse_layers("a-b")
    with pytest.raises(RouterLabError):
        TrainConfig(target=1.5)
    with pytest.raises(RouterLabError):
        TrainConfig(lm_weight=0.0, kd_weight=0.0)
    assert TrainConfig(steps=10, ramp=0.5, target=0.6).target_at(0) == 1.0
    assert TrainConfig(steps=10, ramp=0.5, target=0.6).target_at(5) == 0.6
    warm = TrainConfig(steps=10, warmup=0.5, lr=1e-3)
    assert warm.lr_at(0) == pytest.approx(2e-4) and warm.lr_at(4) == warm.lr_at(9) == 1e-3
    assert TrainConfig(steps=10, warmup=0.0, lr=1e-3).lr_at(0) == 1e-3
    with pytest.raises(RouterLabError):
        TrainConfig(warmup=2.0)


def test_cosine_decay_peaks_after_warmup_and_falls_towards_zero():
    cos = TrainConfig(steps=10, warmup=0.2, lr=1e-3, decay="cosine")
    lrs = [cos.lr_at(i) for i in range(10)]
    assert lrs[0] == pytest.approx(5e-4) and lrs[1] == pytest.approx(1e-3)  # warmup, then the peak
    assert all(a > b for a, b in zip(lrs[1:], lrs[2:]))  # strictly falling after the peak
    assert 0 < lrs[-1] < 0.05e-3  # the last step still moves, barely
    assert TrainConfig(steps=10, warmup=0.0, lr=1e-3, decay="cosine").lr_at(0) == pytest.approx(1e-3)
    with pytest.raises(RouterLabError, match="decay"):
        TrainConfig(decay="linear")


_JOB = """
import json, sys, torch
from accelerate import Accelerator
from routerlab.core.model.models import tiny_model
from routerlab.tuning.data import Example
from routerlab.tuning.train import TrainConfig, train_routers

folder = sys.argv[1]
acc = Accelerator(cpu=True)
g = torch.Generator().manual_seed(0)
examples = [Example(tuple(torch.randint(0, 128, (16,), generator=g).tolist()), 6) for _ in range(8)]
result = train_routers(tiny_model("llama"), examples, TrainConfig(steps=3, batch_size=1, lr=1e-2, lm_weight=1.0),
                       accelerator=acc, progress=False)
weights = torch.cat([p.detach().flatten() for p in result.routers.parameters()]).tolist()
json.dump({"weights": weights, "report": result.report}, open(f"{folder}/rank{acc.process_index}.json", "w"))
# End like a real distributed job: meet, then destroy the gloo process group while the interpreter is still whole.
# Left to interpreter exit, a gloo worker thread still holding the last collective's tensors can need the GIL
# during finalization and the rank dies of SIGABRT ("terminate called without an active exception"), after its
# JSON is written (seen now and then on 2 loaded cores, most often with the last collective right at exit).
acc.wait_for_everyone()
acc.end_training()
"""


def test_two_processes_train_the_same_routers(tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2` on CPU (accelerate 1.15 runs `--cpu --num_processes 2`
    as ONE process; `--multi_gpu` without GPUs starts 2 gloo CPU ranks): each rank sees its own shard, gradients are averaged."""
    import os
    import shlex
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "job.py").write_text(_JOB)
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    # --main_process_port 0: accelerate picks a free port (bind to port 0) instead of its fixed 29500, which any
    # other job on the machine may hold.
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1", "--multi_gpu",
           "--main_process_port", "0", "--mixed_precision", "no", "--dynamo_backend", "no",
           str(tmp_path / "job.py"), str(tmp_path)]
    # All of both ranks' output goes to files (kept in pytest's basetemp); a failure names them and quotes the tail.
    out_path, err_path = tmp_path / "launch.stdout.log", tmp_path / "launch.stderr.log"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        out.write(f"$ {shlex.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=out, stderr=err, text=True)
        try:
            returncode = proc.wait(timeout=240)
        except subprocess.TimeoutExpired:
            returncode = "timeout after 240 s"
        finally:  # a timeout or Ctrl-C: SIGTERM makes torchrun take both ranks (their own sessions) down with it
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    err_text = err_path.read_text(errors="replace")  # a rank's own last words come first, the launcher's summary last
    quoted = err_text if len(err_text) <= 4000 else f"{err_text[:1500]}\n[...]\n{err_text[-2500:]}"
    assert returncode == 0, (f"accelerate launch: exit {returncode}; full output in {out_path} and {err_path}; "
                             f"stderr:\n{quoted}")
    a, b = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert a["weights"] == b["weights"] and any(w != 0 for w in a["weights"])  # averaged gradients: identical updates
    assert a["report"]["processes"] == 2


def test_a_training_gate_below_half_keeps_fresh_routers_clear_of_it():
    """Zero routers score exactly 0.5: at gate 0.5 Adam's first, sign-sized update flips cells to
    skip at once; at gate 0.45 they all still run after it."""
    model = tiny_model("llama")
    cfg = dict(steps=2, batch_size=4, lr=3e-3, warmup=0.0, target=0.5, ramp=0.0, kd_weight=0.0, lm_weight=1.0)
    on = train_routers(model, _examples(4), TrainConfig(**cfg), progress=False).log
    clear = train_routers(model, _examples(4), TrainConfig(**cfg, threshold=0.45), progress=False).log
    assert on[-1]["skip"] > 0.0 and clear[-1]["skip"] == 0.0


def test_on_step_sees_every_step_and_should_stop_keeps_what_was_trained():
    model = tiny_model("llama")
    seen = []
    stop_after = 3
    result = train_routers(model, _examples(), TrainConfig(steps=10, batch_size=2, lr=1e-2, lm_weight=1.0),
                           progress=False, on_step=lambda row, routers: seen.append(row),
                           should_stop=lambda: len(seen) >= stop_after)
    assert [r["step"] for r in seen] == [1, 2, 3]
    assert result.report["stopped"] is True and result.report["steps"] == 3
    routed = result.report["layers"]
    assert all(len(r["layer_skip"]) == len(routed) and all(0.0 <= v <= 1.0 for v in r["layer_skip"]) for r in seen)
    # the per-layer shares average to the step's skip share (every routed layer sees the same number of cells)
    assert all(abs(sum(r["layer_skip"]) / len(routed) - r["skip"]) < 1e-3 for r in seen)


def test_stop_between_a_steps_examples_drops_that_step_and_keeps_the_whole_steps():
    """should_stop is also asked between a step's examples: Stop lands within one example's forward and backward, the
    step in flight is dropped (no optimizer step, not logged), the routers are what the whole steps made them."""
    model = tiny_model("llama")
    cfg = TrainConfig(steps=10, batch_size=4, lr=1e-2, lm_weight=1.0)
    asked, seen = [], []

    def should_stop():  # before step 1, then between its examples 1-2, 2-3, 3-4; before step 2, then 1-2: Stop
        asked.append(len(seen))
        return len(asked) == 6

    result = train_routers(model, _examples(), cfg, progress=False, should_stop=should_stop,
                           on_step=lambda row, routers: seen.append({k: v.detach().clone() for k, v in routers.state_dict().items()}))
    assert asked == [0, 0, 0, 0, 1, 1]  # asked between the examples, not only before each step
    assert result.report["stopped"] is True and result.report["steps"] == 1 and len(result.log) == 1
    kept = result.routers.state_dict()
    assert all(torch.equal(kept[k], v) for k, v in seen[0].items())  # the half-done second step changed nothing


def test_a_short_first_step_reads_fewer_examples_then_whole_batches():
    """`first_examples`: the first step (the page's first curve point) reads that many examples, the rest whole batches."""
    model = tiny_model("llama")
    seen = []
    result = train_routers(model, _examples(), TrainConfig(steps=3, batch_size=4, lm_weight=1.0), progress=False,
                           first_examples=2, on_example=lambda step, example, batch: seen.append((step, example, batch)))
    assert seen == [(1, 1, 2), (1, 2, 2)] + [(s, e, 4) for s in (2, 3) for e in (1, 2, 3, 4)]
    assert result.report["steps"] == 3 and all(0.0 <= r["skip"] <= 1.0 for r in result.log)


def test_a_time_budget_plans_the_steps_from_the_first_steps_and_caps_them():
    from routerlab.tuning.train import PLAN_STEPS, planned_steps

    assert planned_steps(100, 1, 2.0, 60.0) == 30  # 60 s at 2 s a step
    assert planned_steps(100, 1, 0.1, 60.0) == 100  # never more than the cap
    assert planned_steps(100, 3, 50.0, 60.0) == 4  # at least one more than done
    assert planned_steps(2, 2, 0.1, 60.0) == 2  # ... unless the cap is reached
    assert planned_steps(100, 1, 2.0, None) == 100
    model = tiny_model("llama")
    capped = train_routers(model, _examples(), TrainConfig(steps=3, batch_size=1), progress=False, seconds=60.0)
    assert capped.report["steps"] == 3
    # a tiny budget: the loop plans few steps from the measured ones and ends (a stalled clock cannot make it run on)
    result = train_routers(model, _examples(), TrainConfig(steps=50, batch_size=1), progress=False, seconds=1e-6)
    assert 1 <= result.report["steps"] <= PLAN_STEPS and result.report["stopped"] is False


def test_at_lm_weight_0_the_lm_loss_is_logged_but_not_trained_on():
    """The Train tab trains on distillation alone: the step's loss is distillation + budget, and the LM loss is
    still measured for its curve."""
    model = tiny_model("llama")
    an = Anatomy(model)
    routers = train_routers(model, _examples(2), TrainConfig(steps=1, batch_size=1), progress=False).routers
    ex = _examples(1, seed=3)[0]
    ids = torch.tensor([ex.ids])
    from routerlab.tuning.forward import teacher_logits

    teacher = teacher_logits(an, ids, ex.start)
    for lm in (0.0, 1.0):
        cfg = TrainConfig(lm_weight=lm, kd_weight=1.0)
        out = example_losses(an, routers, ids, ex.start, cfg, 0.5, teacher)
        assert float(out["lm"]) > 0
        expected = lm * out["lm"] + out["kd"] + out["budget"]
        assert torch.allclose(out["loss"], expected)
    rows = train_routers(model, _examples(4), TrainConfig(steps=2, batch_size=2, lm_weight=0.0), progress=False).log
    assert all(r["lm"] > 0 for r in rows)
