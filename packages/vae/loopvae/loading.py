"""Load a tokenizer to evaluate: a release artifact, a training run directory, or a diffusers VAE folder."""

from __future__ import annotations

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
from loopcore.release import artifact_class_name, resolve_artifact

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
    names = ("model.safetensors", "diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin")
    return [folder / n for n in names if (folder / n).is_file()]


def load_tokenizer(path: str | Path, weights: str = "ema") -> LoadedTokenizer:
    """Load what ``--checkpoint`` names.

    Args:
        path: a release folder (``config.json`` + ``model.safetensors``), a diffusers folder of a
            ``LoopVAE`` or ``AutoencoderKL`` (e.g. the SD / FLUX VAEs), or a training run directory
            (its newest valid checkpoint).
        weights: for run directories: ``ema`` (default) or ``model`` (the raw training weights).
    """
    path = Path(path)
    check_weight_choice(weights)
    config_file = path / "config.json"
    if config_file.is_file():
        class_name = artifact_class_name(path)
        files = _weights_files(path)
        if not files:
            raise FileNotFoundError(f"{path} has a config.json but no model.safetensors / diffusion_pytorch_model.*")
        if class_name == "AutoencoderKL":
            model = AutoencoderKL.from_pretrained(path, local_files_only=True, low_cpu_mem_usage=False)
        elif class_name == "LoopVAE":
            model = LoopVAE.from_pretrained(path)
        else:
            raise ValueError(f"{config_file}: unsupported _class_name {class_name!r} (LoopVAE or AutoencoderKL)")
        return LoadedTokenizer(model.eval(), str(path), "release" if class_name == "LoopVAE" else "diffusers",
                               {f.name: sha256_file(f) for f in files})
    manager = CheckpointManager(path / "checkpoints")
    if (path / "config.yaml").is_file() and manager.list_checkpoints():
        from .train_config import load_train_config

        config = load_train_config(str(path / "config.yaml"))
        loaded, digests = load_run_checkpoint(path)
        if config.init_from:
            model = LoopVAE.from_config(LoopVAE.load_config(resolve_artifact(config.init_from)))
        else:
            model = create_model(config.model, **config.model_overrides)
        model.load_state_dict(model_weights(loaded, weights))
        return LoadedTokenizer(model.eval(), str(loaded.path), "run-checkpoint", digests, loaded.step)
    raise FileNotFoundError(
        f"{path} is not a release artifact, a diffusers VAE folder, or a training run directory with checkpoints"
    )
