"""Load a tokenizer to evaluate: a release artifact, a training run directory, or a diffusers VAE folder."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from diffusers import AutoencoderDC, AutoencoderKL

from looprun import release
from looprun.release import artifact_class_name, resolve_artifact

from .autoencoders import TOKENIZER_CLASSES
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


def build_from_run(run_dir: Path) -> torch.nn.Module:
    """The untrained tokenizer that ``run_dir/config.yaml`` (a ``loopvae train`` run) describes: the registered
    architecture, or the architecture of its ``init_from`` artifact (stage 2)."""
    from .train_config import load_train_config

    config = load_train_config(str(run_dir / "config.yaml"))
    if config.init_from:
        source = resolve_artifact(config.init_from)
        cls = {"AutoencoderKL": AutoencoderKL, "AutoencoderDC": AutoencoderDC}.get(artifact_class_name(source), LoopVAE)
        return cls.from_config(cls.load_config(source))
    return create_model(config.model, **config.model_overrides)


def load_artifact(path: str | Path, torch_dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A ``LoopVAE``, ``AutoencoderKL`` or ``AutoencoderDC`` from a release folder (what ``loopvae train`` writes
    for each) or a diffusers folder (``save_pretrained``, e.g. a pipeline's ``vae/``); eval mode."""
    return release.load_artifact(path, TOKENIZER_CLASSES, torch_dtype=torch_dtype, what="loopvae").model


def load_tokenizer(path: str | Path, weights: str = "ema") -> LoadedTokenizer:
    """Load what ``--checkpoint`` names (:func:`looprun.release.load_artifact` with loopvae's classes).

    Args:
        path: a release folder (``config.json`` + ``diffusion_pytorch_model.safetensors`` + ``release.json``,
            or a legacy ``model.safetensors``), a diffusers folder of a ``LoopVAE``, ``AutoencoderKL`` or
            ``AutoencoderDC`` (e.g. the SD / FLUX VAEs, or a saved pipeline's ``vae/``), or a training run directory.
        weights: for run directories: ``ema`` (default) or ``model`` (the raw training weights).
    """
    loaded = release.load_artifact(path, TOKENIZER_CLASSES, build_from_run, weights, what="loopvae")
    return LoadedTokenizer(loaded.model, loaded.source, loaded.kind, loaded.weights_sha256, loaded.step)
