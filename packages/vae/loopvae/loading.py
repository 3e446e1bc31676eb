"""Load a tokenizer to evaluate: a release artifact, a training run directory, or a diffusers VAE folder."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from diffusers import AutoencoderKL

from loopcore.checkpoint import (
    CheckpointManager,
    check_weight_choice,
    load_run_checkpoint,
    model_weights,
    sha256_file,
)
from loopcore.release import (
    LEGACY_WEIGHTS_NAME,
    WEIGHTS_NAME,
    artifact_class_name,
    load_release,
    release_weights_file,
    resolve_artifact,
)
from loopdata import one_line

from .model import LoopVAE
from .registry import create_model


@dataclass
class LoadedTokenizer:
    """The model (eval mode) and where it came from: ``source``, ``kind`` and file checksums."""

    model: torch.nn.Module
    source: str
    kind: str  # release | run-checkpoint | diffusers
    weights_sha256: dict[str, str] = field(default_factory=dict)
    step: int | None = None


def _weights_files(folder: Path) -> list[Path]:
    names = (WEIGHTS_NAME, LEGACY_WEIGHTS_NAME, "diffusion_pytorch_model.bin")
    return [folder / n for n in names if (folder / n).is_file()]


def load_artifact(path: str | Path, torch_dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A ``LoopVAE`` or ``AutoencoderKL`` from a release folder (what ``loopvae train`` writes for either)
    or a diffusers folder (``save_pretrained``, e.g. a pipeline's ``vae/``); eval mode."""
    path = Path(path)
    try:
        class_name = artifact_class_name(path)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path / 'config.json'} is not valid JSON ({err})") from None
    try:
        if class_name == "LoopVAE":
            return LoopVAE.from_pretrained(path, torch_dtype=torch_dtype).eval()
        if class_name == "AutoencoderKL":
            if release_weights_file(path) is not None:
                return load_release(AutoencoderKL, path, torch_dtype)
            return AutoencoderKL.from_pretrained(
                path, local_files_only=True, low_cpu_mem_usage=False, torch_dtype=torch_dtype
            ).eval()
    except (OSError, RuntimeError, TypeError) as err:  # diffusers' errors for unreadable weights / configs
        raise ValueError(f"cannot load the {class_name} in {path}: {one_line(err)}") from err
    raise ValueError(f"{path / 'config.json'}: unsupported _class_name {class_name!r} (LoopVAE or AutoencoderKL)")


def load_tokenizer(path: str | Path, weights: str = "ema") -> LoadedTokenizer:
    """Load what ``--checkpoint`` names.

    Args:
        path: a release folder (``config.json`` + ``diffusion_pytorch_model.safetensors`` + ``release.json``,
            or a legacy ``model.safetensors``), a diffusers folder of a ``LoopVAE`` or ``AutoencoderKL``
            (e.g. the SD / FLUX VAEs, or a saved pipeline's ``vae/``), or a training run directory.
        weights: for run directories: ``ema`` (default) or ``model`` (the raw training weights).
    """
    path = Path(path)
    check_weight_choice(weights)
    config_file = path / "config.json"
    if config_file.is_file():
        files = _weights_files(path)
        if not files:
            raise FileNotFoundError(f"{path} has a config.json but no {WEIGHTS_NAME} (or {LEGACY_WEIGHTS_NAME})")
        model = load_artifact(path)
        kind = "release" if (path / "release.json").is_file() else "diffusers"
        return LoadedTokenizer(model, str(path), kind, {f.name: sha256_file(f) for f in files})
    manager = CheckpointManager(path / "checkpoints")
    if (path / "config.yaml").is_file() and manager.list_checkpoints():
        from .train_config import load_train_config

        config = load_train_config(str(path / "config.yaml"))
        loaded, digests = load_run_checkpoint(path)
        if config.init_from:
            source = resolve_artifact(config.init_from)
            cls = AutoencoderKL if artifact_class_name(source) == "AutoencoderKL" else LoopVAE
            model = cls.from_config(cls.load_config(source))
        else:
            model = create_model(config.model, **config.model_overrides)
        model.load_state_dict(model_weights(loaded, weights))
        return LoadedTokenizer(model.eval(), str(loaded.path), "run-checkpoint", digests, loaded.step)
    raise FileNotFoundError(
        f"{path} is not a release artifact, a diffusers VAE folder, or a training run directory with checkpoints"
    )
