"""Router checkpoints: round trip, refusal of a mismatched base, and a fuzz of the loader."""

import json
import random

import pytest
import torch

from routerlab.core.base.config import RoutingConfig
from routerlab.core.base.errors import RouterLabError
from routerlab.core.model.models import tiny_model
from routerlab.core.routing.router import RouterSet
from routerlab.tuning.checkpoint import CONFIG, WEIGHTS, load_routers, read_config, resolve_routers, save_routers


@pytest.fixture
def saved(tmp_path):
    model = tiny_model("llama")
    routers = RouterSet.zeros(model, RoutingConfig.from_granularity("attention-token", [1, 2]))
    for r in routers.routers.values():
        torch.nn.init.normal_(r.proj.weight)
    folder = save_routers(routers, tmp_path / "ckpt", model, threshold=0.6, kv_policy="kv", summary={"steps": 3})
    return model, routers, folder


def test_round_trip_restores_weights_and_config(saved):
    model, routers, folder = saved
    loaded, config = load_routers(folder, model)
    assert config["threshold"] == 0.6 and config["granularity"] == "attention-token" and config["training"] == {"steps": 3}
    for i in (1, 2):
        assert torch.equal(loaded.get(i).proj.weight, routers.get(i).proj.weight)
    assert sorted(p.name for p in folder.iterdir()) == [CONFIG, WEIGHTS]  # nothing else, no pickle


def test_routers_for_another_base_are_refused(saved):
    _, _, folder = saved
    with pytest.raises(RouterLabError, match="6 layers"):
        load_routers(folder, tiny_model("llama", num_hidden_layers=6))
    with pytest.raises(RouterLabError, match="different weights"):
        load_routers(folder, tiny_model("llama", seed=1))


def test_fresh_routers_when_nothing_is_shipped_for_another_model():
    routers, defaults = resolve_routers(None, "mlp-token", tiny_model("qwen2"))
    assert routers.granularity == "mlp-token" and "untrained" in defaults["source"]
    assert resolve_routers(None, "full", tiny_model("qwen2"))[0] is None


def test_fuzzed_files_fail_only_with_clean_errors(saved):
    model, _, folder = saved
    weights, config = (folder / WEIGHTS).read_bytes(), (folder / CONFIG).read_text()
    rng = random.Random(0)
    cases = [weights[:n] for n in (0, 7, 8, 50, len(weights) // 2, len(weights) - 1)]
    cases += [bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 400))) for _ in range(20)]
    cases += [bytearray(weights) for _ in range(20)]
    for case in cases[-20:]:
        for _ in range(3):
            case[rng.randrange(len(case))] = rng.getrandbits(8)
    for case in cases:
        (folder / WEIGHTS).write_bytes(bytes(case))
        try:
            load_routers(folder, model)
        except RouterLabError:
            pass
    (folder / WEIGHTS).write_bytes(weights)
    bad_configs = ["", "{", "[]", "null", json.dumps({"format": "x"}), config.replace('"kv"', '"fast"'),
                   config.replace('"threshold": 0.6', '"threshold": NaN'), config.replace("[\n  1,\n  2\n ]", "[1, 2, 9]"),
                   config[: len(config) // 2], "\xff\xfe garbage", "[" * 100_000 + "]" * 100_000]
    for text in bad_configs:
        (folder / CONFIG).write_text(text)
        with pytest.raises(RouterLabError):
            load_routers(folder, model)


def test_a_failed_save_leaves_the_old_checkpoint_whole(saved, monkeypatch):
    model, routers, folder = saved
    before = read_config(folder)

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("routerlab.tuning.checkpoint.save_file", boom)
    with pytest.raises(OSError):
        save_routers(routers, folder, model, threshold=0.9)
    assert read_config(folder) == before and [p for p in folder.parent.iterdir() if p.name.startswith(".")] == []


def _hub_cache(root, repo_id: str, folder) -> None:
    """A Hugging Face Hub cache holding `folder`'s files as repo `repo_id`, laid out as huggingface_hub lays it."""
    import shutil

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = root / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(folder, repo / "snapshots" / commit)


def test_a_hub_repo_id_loads_from_the_cache_offline_and_decides_as_the_folder(saved, tmp_path, monkeypatch):
    import huggingface_hub.constants

    from routerlab.core.base.config import GenerateConfig
    from routerlab.core.decode.engine import Engine

    model, _, folder = saved
    _hub_cache(tmp_path / "hub", "someone/my-routers", folder)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from_hub, defaults = resolve_routers("someone/my-routers", "attention-token", model)
    from_folder, _ = resolve_routers(str(folder), "attention-token", model)
    assert defaults["source"] == "someone/my-routers"
    engine = Engine(model)
    config = GenerateConfig(max_new_tokens=8, ignore_eos=True, quality=False, threshold=0.5)
    ids = [(3 * i + 1) % 128 for i in range(10)]
    runs = [[s.executed for s in engine.generate_ids(ids, r, config)] for r in (from_hub, from_folder)]
    assert runs[0] == runs[1]
    with pytest.raises(RouterLabError, match="neither a folder nor in the Hugging Face cache"):
        resolve_routers("someone/not-there", "attention-token", model)


def test_the_operators_router_sets_come_from_folders_or_the_hub_cache_and_are_checked_at_start(saved, tmp_path, monkeypatch):
    """`app.py --routers` / ROUTERLAB_ROUTERS: each set is loaded against the model before the app starts."""
    import huggingface_hub.constants

    from routerlab.ui.state.resources import operator_router_sets

    model, _, folder = saved
    _hub_cache(tmp_path / "hub", "someone/my-routers", folder)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    sets = operator_router_sets(f"someone/my-routers, {folder}", model)
    assert [s.label for s in sets] == ["attention-token (someone/my-routers)", f"attention-token ({folder})"]
    assert operator_router_sets(None, model) == [] and operator_router_sets(" ", model) == []
    with pytest.raises(RouterLabError, match="neither a folder nor in the Hugging Face cache"):
        operator_router_sets("someone/not-there", model)
    other = tiny_model("llama", hidden_size=48, intermediate_size=96)
    with pytest.raises(RouterLabError, match="were made for"):
        operator_router_sets(str(folder), other)
