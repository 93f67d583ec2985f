"""Taking a router set away (zip with report, curves and a Hub model card) and bringing it back safely."""

from __future__ import annotations

import io
import json
import stat
import zipfile

import pytest
import torch

from routerlab.core.base.config import RoutingConfig
from routerlab.core.base.errors import RouterLabError
from routerlab.core.model.models import tiny_model
from routerlab.core.routing.router import RouterSet
from routerlab.tuning import bundle
from routerlab.tuning.bundle import read_upload, write_extras, zip_folder
from routerlab.tuning.checkpoint import save_routers

ROWS = [{"step": k, "target": 1 - 0.01 * k, "loss": 1.0 / k, "kd": 0.5 / k, "lm": 2.0, "budget": 0.0, "skip": 0.01 * k} for k in range(1, 6)]
REPORT = {"granularity": "attention-token", "layers": [1, 2], "data": "test", "steps": 5, "seconds": 1.0, "stopped": False,
          "settings": {"skip": 0.15, "lr": 3e-3, "kd_weight": 1.0, "lm_weight": 1.0, "batch_size": 4, "max_tokens": 256},
          "heldout": {"examples": 3, "rows": {"mine at 0.5": {"threshold": 0.5, "skip_rate": 0.1, "skip_rate_all_layers": 0.05,
                                                              "perplexity_increase": 0.02, "kl_full": 0.01, "agreement": 0.9}}}}


@pytest.fixture()
def saved(tmp_path):
    model = tiny_model("llama")
    routers = RouterSet.zeros(model, RoutingConfig.from_granularity("attention-token", [1, 2]))
    for r in routers.routers.values():
        r.proj.weight.data = torch.randn(r.proj.weight.shape) * 0.1
    folder = save_routers(routers, tmp_path / "mine", model)
    write_extras(folder, REPORT, ROWS, "tiny-llama")
    return model, routers, folder


def test_a_zip_round_trip_gives_the_same_routers_and_a_hub_ready_card(saved, tmp_path):
    model, routers, folder = saved
    card = (folder / "README.md").read_text()
    assert card.startswith("---\nbase_model: ") and "library_name: routerlab" in card and "- router-tuning" in card
    assert "| mine at 0.5 | 0.5 | 10.0% |" in card
    assert (folder / "curves.png").read_bytes()[:4] == b"\x89PNG"
    archive = zip_folder(folder, tmp_path / "routerlab-mine.zip")
    names = zipfile.ZipFile(archive).namelist()
    assert "routerlab-mine/router.json" in names and "routerlab-mine/README.md" in names
    back, loaded, config = read_upload([archive], model, tmp_path)
    assert config["granularity"] == "attention-token"
    for i in (1, 2):
        assert torch.equal(loaded.get(i).proj.weight, routers.get(i).proj.weight)
    # loose files work too
    back2, loaded2, _ = read_upload([folder / "router.json", folder / "routers.safetensors"], model, tmp_path)
    assert torch.equal(loaded2.get(1).proj.weight, routers.get(1).proj.weight)


def _zip(tmp_path, members: dict[str, bytes], links=()):
    path = tmp_path / "upload.zip"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            info = zipfile.ZipInfo(name)
            if name in links:
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
            z.writestr(info, data)
    return path


@pytest.mark.parametrize("members, links, problem", [
    ({"/etc/router.json": b"{}"}, (), "absolute"),
    ({"../router.json": b"{}"}, (), "leaves its folder"),
    ({"router.json": b"/etc/passwd"}, ("router.json",), "link"),
    ({f"f{k}.txt": b"" for k in range(40)}, (), "entries"),
    ({"README.md": b"hello"}, (), "no router.json and no routers.safetensors"),
    ({"router.json": b"not json", "routers.safetensors": b"junk"}, (), "corrupted"),
])
def test_unsafe_or_malformed_zips_are_refused_with_a_message(saved, tmp_path, members, links, problem):
    model = saved[0]
    with pytest.raises(RouterLabError) as err:
        read_upload([_zip(tmp_path, members, links)], model, tmp_path)
    assert problem in str(err.value)
    assert not list(tmp_path.glob("upload-*"))  # nothing is left behind


def test_a_zip_bomb_and_a_set_for_another_model_are_refused(saved, tmp_path, monkeypatch):
    model, routers, folder = saved
    monkeypatch.setattr(bundle, "MAX_BYTES", 1000)
    big = _zip(tmp_path, {"routers.safetensors": b"\0" * 5000, "router.json": b"{}"})
    with pytest.raises(RouterLabError, match="more than"):
        read_upload([big], model, tmp_path)
    monkeypatch.undo()
    other = tiny_model("llama", hidden_size=48, intermediate_size=96)
    with pytest.raises(RouterLabError, match="were made for"):
        read_upload([zip_folder(folder, tmp_path / "x.zip")], other, tmp_path)
    with pytest.raises(RouterLabError, match="not a readable zip"):
        (tmp_path / "fake.zip").write_bytes(b"PK not really")
        read_upload([tmp_path / "fake.zip"], model, tmp_path)


def _lying(tmp_path, folder):
    """The set's zip with router.json's uncompressed size in the central directory made smaller than it is:
    zipfile opens it and fails only while reading the member (Bad CRC-32)."""
    import struct

    data = bytearray(zip_folder(folder, tmp_path / "honest.zip").read_bytes())
    at = data.find(b"PK\x01\x02")
    while at >= 0 and not data[at + 46 : at + 46 + struct.unpack_from("<H", data, at + 28)[0]].endswith(b"router.json"):
        at = data.find(b"PK\x01\x02", at + 4)
    struct.pack_into("<I", data, at + 24, 50)
    path = tmp_path / "lying.zip"
    path.write_bytes(bytes(data))
    return path


def test_damaged_zips_deep_json_and_oversized_members_are_messages_without_server_paths(saved, tmp_path):
    model, routers, folder = saved
    config = (folder / "router.json").read_text()
    for sub in ("deep", "big", "bad"):
        (tmp_path / sub).mkdir()
    cases = {
        "damaged": _lying(tmp_path, folder),
        "nested too deeply": _zip(tmp_path / "deep", {"router.json": b"[" * 30_000 + b"]" * 30_000,
                                                       "routers.safetensors": (folder / "routers.safetensors").read_bytes()}),
        "larger than 64 KB": _zip(tmp_path / "big", {"router.json": config[:-2].encode() + b', "x": "' + b"a" * (30 * 2**20) + b'"}',
                                                       "routers.safetensors": (folder / "routers.safetensors").read_bytes()}),
        "corrupted": _zip(tmp_path / "bad", {"router.json": b"{}", "routers.safetensors": b"junk"}),
    }
    root = tmp_path / "session"
    root.mkdir()
    for problem, path in cases.items():
        with pytest.raises(RouterLabError) as err:
            read_upload([path], model, root)
        assert problem in str(err.value), str(err.value)
        assert str(tmp_path) not in str(err.value) and "/tmp" not in str(err.value)  # file names, never the server's folders
    assert not list(root.iterdir())  # nothing left behind
    # loose files are held to the same caps
    big = tmp_path / "loose" / "router.json"
    big.parent.mkdir()
    big.write_bytes(b" " * (100 * 2**10))
    with pytest.raises(RouterLabError, match="larger than 64 KB"):
        read_upload([big, folder / "routers.safetensors"], model, root)


def test_eight_uploads_of_a_zip_holding_a_30_mb_router_json_are_refused_cheaply(saved, tmp_path):
    """An 88 KB zip whose router.json unpacks to 30 MB, uploaded 8 times (parsed, it grew the process by hundreds of MB):
    refused at its declared size (and at 512 KB of real bytes were the size a lie), so nothing is parsed or kept; the
    test measures what the refusals allocate."""
    import tracemalloc

    model, _, folder = saved
    weights = (folder / "routers.safetensors").read_bytes()
    path = tmp_path / "fat.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("router.json", b'{"pad": "' + b" " * (30 * 2**20) + b'"}')
        z.writestr("routers.safetensors", weights)
    assert path.stat().st_size < 200_000
    tracemalloc.start()
    try:
        for _ in range(8):
            with pytest.raises(RouterLabError, match="router.json is larger than 64 KB"):
                read_upload([path], model, tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, peak  # Python objects at the peak: a few MB at most, not the 30 MB member
    assert not list(tmp_path.glob("upload-*"))
