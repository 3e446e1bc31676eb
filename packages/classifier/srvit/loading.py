"""Load a classifier to evaluate: a release artifact or a training run directory (its newest checkpoint)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from loopcore.checkpoint import (
    CheckpointManager,
    check_weight_choice,
    load_run_checkpoint,
    model_weights,
    sha256_file,
)
from loopcore.release import WEIGHTS_NAME, artifact_class_name, release_weights_file

from .model import RecursiveViT
from .registry import create_model


@dataclass
class LoadedClassifier:
    """The model (eval mode) and where it came from."""

    model: RecursiveViT
    source: str
    kind: str  # release | run-checkpoint
    weights: str  # ema | model | release
    weights_sha256: dict[str, str] = field(default_factory=dict)
    step: int | None = None
    protocol: str | None = None  # the training run's data protocol, when known


def _run_protocol(run_dir: Path) -> str | None:
    if (run_dir / "config.yaml").is_file():
        from .train_config import load_train_config

        return load_train_config(str(run_dir / "config.yaml")).protocol
    return None


def load_classifier(path: str | Path, weights: str = "ema") -> LoadedClassifier:
    """Load what ``--checkpoint`` names.

    Args:
        path: a release folder (``config.json`` + ``diffusion_pytorch_model.safetensors``, e.g.
            ``RUN/release``) or a training run directory (``config.yaml`` + ``checkpoints/``; its newest
            valid checkpoint is used).
        weights: for run directories, ``ema`` (default) or ``model`` (the raw training weights).
    """
    path = Path(path)
    check_weight_choice(weights)
    if (path / "config.json").is_file():
        class_name = artifact_class_name(path)
        if class_name != RecursiveViT.__name__:
            raise ValueError(
                f"{path / 'config.json'}: _class_name is {class_name!r}, not a srvit RecursiveViT artifact"
            )
        weights_file = release_weights_file(path)
        if weights_file is None:
            raise FileNotFoundError(f"{path} has a config.json but no {WEIGHTS_NAME}")
        model = RecursiveViT.from_pretrained(path)
        info = json.loads((path / "release.json").read_text()) if (path / "release.json").is_file() else {}
        return LoadedClassifier(model.eval(), str(path), "release", info.get("weights", "release"),
                                {weights_file.name: sha256_file(weights_file)}, info.get("step"),
                                info.get("protocol") or _run_protocol(path.parent))
    manager = CheckpointManager(path / "checkpoints")
    if (path / "config.yaml").is_file() and manager.list_checkpoints():
        from .train_config import load_train_config

        config = load_train_config(str(path / "config.yaml"))
        loaded, digests = load_run_checkpoint(path)
        model = create_model(config.model, **config.model_kwargs())
        model.load_state_dict(model_weights(loaded, weights))
        return LoadedClassifier(model.eval(), str(loaded.path), "run-checkpoint", weights, digests, loaded.step,
                                config.protocol)
    raise FileNotFoundError(
        f"{path} is neither a srvit release artifact (config.json + {WEIGHTS_NAME}) nor a training run directory "
        "with config.yaml and checkpoints/; pass the --out directory of `srvit train` or its release/ folder"
    )
