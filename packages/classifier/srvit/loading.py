"""Load a classifier to evaluate: a release artifact or a training run directory (its newest checkpoint)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from looprun.release import load_artifact

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


def build_from_run(run_dir: Path) -> RecursiveViT:
    """The untrained classifier that ``run_dir/config.yaml`` (a ``srvit train`` run) describes."""
    from .train_config import load_train_config

    config = load_train_config(str(run_dir / "config.yaml"))
    return create_model(config.model, **config.model_kwargs())


def load_classifier(path: str | Path, weights: str = "ema") -> LoadedClassifier:
    """Load what ``--checkpoint`` names (:func:`looprun.release.load_artifact` with srvit's classes).

    Args:
        path: a release folder (``config.json`` + ``diffusion_pytorch_model.safetensors``, e.g.
            ``RUN/release``) or a training run directory (``config.yaml`` + ``checkpoints/``; its newest
            valid checkpoint is used).
        weights: for run directories, ``ema`` (default) or ``model`` (the raw training weights).
    """
    loaded = load_artifact(path, RecursiveViT, build_from_run, weights, what="srvit")
    protocol = loaded.info.get("protocol")
    if protocol is None and loaded.run_dir is not None:
        from .train_config import load_train_config

        protocol = load_train_config(str(loaded.run_dir / "config.yaml")).protocol
    return LoadedClassifier(loaded.model, loaded.source, loaded.kind, loaded.weights, loaded.weights_sha256,
                            loaded.step, protocol)
