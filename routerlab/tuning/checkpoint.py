"""Router checkpoints: routers (and their skip stand-ins) only, as `routers.safetensors` + `router.json`, never pickle.

A checkpoint folder holds the router weights and a JSON config: granularity, routed layers, the
default threshold and KV policy, a training summary, the identity of the base model it was
made for, and optionally a `calibration` (the set's score map, `scale` and `shift` plus how it
was fitted; without one the scores are the raw `sigmoid(w . x)`, as before calibration existed),
and optionally `standins` (rank and activation; their weights `standin.{layer}.down` / `.up` sit in
the same safetensors file; without the block a checkpoint has none, as before stand-ins existed).
Loading validates all of it and refuses a mismatched base with a clear message.
Writes are atomic (a temporary folder renamed into place), so a crash leaves nothing half-written.

Knows nothing about training or decoding.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from routerlab.core.base.config import GRANULARITIES, RoutingConfig, check_kv_policy, check_threshold, default_layers
from routerlab.core.base.errors import RouterLabError
from routerlab.core.base.paths import ASSETS
from routerlab.core.model.models import model_identity
from routerlab.core.routing.router import IDENTITY, Calibration, RouterSet
from routerlab.core.routing.standin import ACTIVATION

FORMAT = "routerlab-routers"
FORMAT_VERSION = 1
WEIGHTS, CONFIG = "routers.safetensors", "router.json"
SHIPPED = ASSETS / "routers"


def save_routers(routers: RouterSet, folder: str | Path, model: torch.nn.Module, *, threshold: float = 0.5,
                 kv_policy: str = "kv", summary: dict | None = None, calibration_info: dict | None = None) -> Path:
    """Write `folder` atomically: router weights (safetensors) + router.json.

    The set's calibration is stored when it is not the identity, with `calibration_info` (how it
    was fitted) next to its scale and shift.
    """
    folder = Path(folder)
    config = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "granularity": routers.granularity,
        "layers": list(routers.config.layers),
        "threshold": check_threshold(threshold),
        "kv_policy": check_kv_policy(kv_policy),
        "base_model": model_identity(model),
        "training": summary or {},
    }
    calibration = getattr(routers, "calibration", IDENTITY)
    if not calibration.identity:
        config["calibration"] = {**(calibration_info or {}), **calibration.to_dict()}
    tensors = {f"layer.{i}": routers.get(i).proj.weight.detach().float().cpu().contiguous() for i in routers.config.layers}
    if routers.standin_rank:
        config["standins"] = {"rank": routers.standin_rank, "activation": ACTIVATION}
        for i in routers.config.layers:
            for part in ("down", "up"):
                tensors[f"standin.{i}.{part}"] = getattr(routers.standin(i), part).weight.detach().float().cpu().contiguous()
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": FORMAT})
        (tmp / CONFIG).write_text(json.dumps(config, indent=1) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def read_config(folder: str | Path) -> dict[str, Any]:
    """The validated router.json of a checkpoint folder."""
    folder = Path(folder)
    path = folder / CONFIG
    if not path.is_file() or not (folder / WEIGHTS).is_file():
        raise RouterLabError(f"{folder} is not a router checkpoint (it needs {CONFIG} and {WEIGHTS}).",
                             "Point --routers at a folder written by `python -m routerlab train`.")
    try:
        config = json.loads(path.read_text())
        assert isinstance(config, dict) and config.get("format") == FORMAT, "wrong format tag"
        assert config["granularity"] in GRANULARITIES, f"unknown granularity {config['granularity']!r}"
        assert isinstance(config["layers"], list) and all(_is_int(i) for i in config["layers"]), "bad layers"
        # a JSON number, not a string (" 0.5\n" parses as a float) nor a boolean (true is not 1)
        assert _is_number(config["threshold"]), f"threshold {config['threshold']!r} is not a number"
        config["threshold"] = check_threshold(config["threshold"])  # -0.0 read as 0.0
        assert isinstance(config["kv_policy"], str), "bad kv_policy"
        check_kv_policy(config["kv_policy"])
        base = config["base_model"]
        assert _is_int(base["n_layers"]) and _is_int(base["hidden_size"]), "bad base_model"
        standins = config.get("standins")
        if standins is not None:
            rank = standins.get("rank") if isinstance(standins, dict) else None
            assert isinstance(rank, int) and not isinstance(rank, bool) and 1 <= rank <= base["hidden_size"], \
                f"bad stand-in rank {rank!r}"
            assert standins.get("activation", ACTIVATION) == ACTIVATION, f"unknown stand-in activation {standins.get('activation')!r}"
    except RecursionError:  # json.loads recurses once per level of nesting
        raise RouterLabError(f"{path} is nested too deeply to be a RouterLab router config.",
                             "Re-save the routers, or train them again.") from None
    except (ValueError, KeyError, TypeError, AssertionError, UnicodeDecodeError) as err:
        raise RouterLabError(f"{path} is corrupted or not a RouterLab router config ({err}).",
                             "Re-save the routers, or train them again.") from None
    try:
        calibration_of(config)
    except RouterLabError as err:
        raise RouterLabError(f"{path}: {err.problem}", err.fix) from None
    return config


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def calibration_of(config: dict[str, Any]) -> Calibration:
    """The score map a router.json stores; the identity when it stores none (checkpoints before calibration)."""
    block = config.get("calibration")
    if block is None:
        return IDENTITY
    if not isinstance(block, dict) or "scale" not in block or "shift" not in block:
        raise RouterLabError("Its calibration is not an object with a scale and a shift.",
                             "Fit it again with `python -m routerlab calibrate`, or remove the calibration.")
    return Calibration(block["scale"], block["shift"])


def write_calibration(folder: str | Path, block: dict[str, Any], threshold: float) -> dict[str, Any]:
    """Store a calibration (its scale, shift and how it was fitted) and the calibrated default threshold
    in a checkpoint's router.json, atomically; the weights are not touched. Returns the new config."""
    folder = Path(folder)
    config = read_config(folder)
    config["calibration"] = block
    config["threshold"] = check_threshold(threshold)
    calibration_of(config)  # refuse to write what would not load
    tmp = folder / f".{CONFIG}.tmp"
    tmp.write_text(json.dumps(config, indent=1) + "\n")
    os.replace(tmp, folder / CONFIG)
    return config


def load_routers(folder: str | Path, model: torch.nn.Module) -> tuple[RouterSet, dict[str, Any]]:
    """Load and validate a checkpoint for `model`. Returns the routers and their config."""
    folder = Path(folder)
    config = read_config(folder)
    mine, theirs = model_identity(model), config["base_model"]
    for key in ("n_layers", "hidden_size"):
        if mine[key] != theirs[key]:
            raise RouterLabError(
                f"These routers were made for {theirs.get('name', 'another model')} ({theirs['n_layers']} layers, "
                f"hidden size {theirs['hidden_size']}), not {mine['name']} ({mine['n_layers']} layers, hidden size "
                f"{mine['hidden_size']}).", "Use routers trained for this model, or train new ones.")
    if theirs.get("weights_sha256") not in (None, mine["weights_sha256"]):
        raise RouterLabError(f"These routers were trained on different weights ({theirs.get('name')}) than the loaded model.",
                             "Use routers trained for this exact model, or train new ones.")
    rank = config["standins"]["rank"] if config.get("standins") else 0
    routers = RouterSet(RoutingConfig.from_granularity(config["granularity"], config["layers"]), mine["n_layers"],
                        mine["hidden_size"], standin_rank=rank)
    try:
        tensors = load_file(str(folder / WEIGHTS))
    except Exception as err:  # the Rust loader raises its own types on truncated or random bytes
        raise RouterLabError(f"{folder / WEIGHTS} is corrupted ({err}).", "Re-save the routers, or train them again.") from None
    expected = {f"layer.{i}" for i in routers.config.layers}
    expected |= {f"standin.{i}.{part}" for i in routers.config.layers for part in ("down", "up")} if rank else set()
    if set(tensors) != expected:
        what = f"layers {config['layers']}" + (f" with rank-{rank} stand-ins" if rank else " without stand-ins")
        raise RouterLabError(f"{folder / WEIGHTS} holds {sorted(tensors)[:4]}... but router.json names {what}.",
                             "The folder is inconsistent: train or save the routers again.")
    for i in routers.config.layers:
        w = tensors[f"layer.{i}"]
        if tuple(w.shape) != (1, mine["hidden_size"]) or not torch.isfinite(w).all():
            raise RouterLabError(f"Router weights for layer {i} are malformed (shape {tuple(w.shape)} or non-finite).",
                                 "Train the routers again.")
        routers.get(i).proj.weight.data.copy_(w)
        if rank:
            _load_standin(routers.standin(i), tensors, i, mine["hidden_size"], rank)
    routers.calibration = calibration_of(config)
    return routers.to(next(model.parameters()).device), config


def _load_standin(standin, tensors: dict[str, torch.Tensor], layer: int, hidden: int, rank: int) -> None:
    for part, shape in (("down", (rank, hidden)), ("up", (hidden, rank))):
        w = tensors[f"standin.{layer}.{part}"]
        if tuple(w.shape) != shape or not torch.isfinite(w).all():
            raise RouterLabError(
                f"The stand-in of layer {layer} is malformed: its {part} weight has shape {tuple(w.shape)}"
                f"{'' if tuple(w.shape) != shape else ' with non-finite values'}, expected {shape} (rank {rank}, hidden size {hidden}).",
                "Train the routers and stand-ins again, or fix the rank in router.json.")
        getattr(standin, part).weight.data.copy_(w)


def shipped_routers() -> dict[str, Path]:
    """Granularity -> shipped checkpoint folder in assets/routers/: the folder named after the granularity
    when there is one (another set of it, e.g. with stand-ins, is chosen by path), else the first by name."""
    if not SHIPPED.is_dir():
        return {}
    found: dict[str, Path] = {}
    for folder in sorted(SHIPPED.iterdir()):
        if (folder / CONFIG).is_file():
            try:
                granularity = read_config(folder)["granularity"]
            except RouterLabError:
                continue
            if granularity not in found or folder.name == granularity:
                found[granularity] = folder
    return found


_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_HUB_FILES = [CONFIG, WEIGHTS, "README.md", "report.json"]


def routers_folder(spec: str | Path) -> Path:
    """The folder of a router set given as a folder, or as a Hugging Face Hub repo id (OWNER/NAME).

    A repo id is fetched with huggingface_hub's cache (only the set's own files); offline
    (`HF_HUB_OFFLINE=1`, or the Hub unreachable) only the cache is asked. A path that exists, or
    starts like one, is a folder.
    """
    text = str(spec).strip()
    if Path(text).expanduser().exists() or text.startswith(("/", ".", "~")) or not _HUB_ID.match(text):
        return Path(text).expanduser()
    from huggingface_hub import snapshot_download

    from routerlab.core.model.models import _hub_reachable

    try:
        return Path(snapshot_download(repo_id=text, allow_patterns=_HUB_FILES, local_files_only=not _hub_reachable()))
    except Exception as err:  # huggingface_hub raises its own types for offline, missing and gated repos
        reason = type(err).__name__
        raise RouterLabError(f"Router set '{text}' is neither a folder nor in the Hugging Face cache ({reason}).",
                             "Connect to the network once to fetch it, or download the set and pass its folder.") from None


def resolve_routers(path: str | None, granularity: str, model: torch.nn.Module) -> tuple[RouterSet | None, dict[str, Any]]:
    """Routers for the CLI and the app: a given folder or Hub repo id, else the shipped ones, else fresh
    (never-skipping) ones.

    Returns (routers, defaults) where defaults holds threshold, kv_policy and `source`.
    """
    if granularity == "full":
        return None, {"threshold": 0.5, "kv_policy": "kv", "source": "none (full model)"}
    if path is None:
        RoutingConfig.from_granularity(granularity)  # validates the name
        path = shipped_routers().get(granularity)
        if path is not None and model_identity(model)["weights_sha256"] != read_config(path)["base_model"].get("weights_sha256"):
            path = None  # shipped routers are for the embedded model; another base gets fresh ones
    if path is None:
        n = model.config.get_text_config().num_hidden_layers
        routers = RouterSet.zeros(model, RoutingConfig.from_granularity(granularity, default_layers(n)))
        return routers, {"threshold": 0.5, "kv_policy": "kv", "source": "untrained (fresh routers never skip at 0.5)"}
    folder = routers_folder(path)
    routers, config = load_routers(folder, model)
    return routers, {"threshold": config["threshold"], "kv_policy": config["kv_policy"], "source": str(path), "config": config}
