"""Configuration schema of ``srvit train`` and its presets (``srvit/configs/*.yaml``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from looprun.config import ConfigError, resolve_config

PRESETS_DIR = Path(__file__).parent / "configs"

# Data-pipeline keys passed to loopdata only when set; None keeps the protocol's default (docs/loopdata.md).
AUGMENTATION_KEYS = (
    "randaugment_magnitude", "randaugment_config", "random_erasing", "mixup_alpha", "cutmix_alpha", "label_smoothing",
    "hflip", "scale", "crop_pct",
)


@dataclass
class TrainConfig:
    """Every key a preset, a YAML file or ``--set key=value`` may give (see ``docs/srvit.md``)."""

    # what to train
    model: str = "vit-ti"
    model_overrides: dict[str, Any] = field(default_factory=dict)
    drop_path_rate: float = 0.1
    deep_supervision_every: int = 0  # k > 0: loss on the shared head every k trajectory states
    # data
    protocol: str = "imagenet"  # imagenet (DeiT) | cifar
    num_classes: int = 1000
    resolution: int = 224
    batch_size: int = 128  # per rank
    num_workers: int = 4
    shuffle_buffer: int = 1000  # samples; a class-sorted shard (the shared CIFAR ones) needs it to span the shard
    randaugment_magnitude: int | None = None  # None: the protocol default (imagenet m9, cifar off); timm's 0..10 scale
    randaugment_config: str | None = None  # a full timm RandAugment string, e.g. rand-m9-mstd0.5-inc1 (wins when set)
    repeated_aug: int = 1  # r > 1: each sample r times per epoch, independently augmented (DeiT: 3; loopdata.repeated)
    random_erasing: float | None = None
    mixup_alpha: float | None = None
    cutmix_alpha: float | None = None
    label_smoothing: float | None = None
    hflip: float | None = None
    scale: tuple[float, float] | None = None
    crop_pct: float | None = None
    # optimisation: DeiT's AdamW recipe; lr = base_lr * global_batch / lr_reference_batch unless lr is set
    epochs: float = 300.0
    max_steps: int | None = None  # overrides epochs
    warmup_epochs: float = 5.0
    base_lr: float = 5e-4
    lr_reference_batch: int = 512
    lr: float | None = None
    min_lr_ratio: float = 0.02  # DeiT: min_lr 1e-5 at base lr 5e-4
    lr_schedule: str = "cosine"
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 0.0  # 0 = off (DeiT does not clip)
    ema_decay: float = 0.99996
    precision: str = "bf16"  # bf16 autocast on CUDA; CPU runs fp32
    gradient_checkpointing: bool = False
    compile: bool = False  # torch.compile the training step's forward (srvit train --compile)
    device: str = "auto"
    seed: int = 0
    # validation and bookkeeping
    eval_every: int = 0  # steps; 0 = only at the end (when --val-data is given)
    eval_weights: str = "ema"  # ema | model: what the in-training validation and the release use
    checkpoint_every: int = 1000
    keep_checkpoints: int = 3
    log_every: int = 50
    progress_bar: bool = True
    tracker: str = "tensorboard"  # tensorboard | wandb (optional extra; offline without a login) | none
    # resume although the data's modification times moved (same files, same sizes: a copy without -p, a touch)
    accept_data_mtime: bool = False

    @staticmethod
    def upgrade_model_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
        """``model_overrides`` with the model's renamed arguments under their new names (with a warning)."""
        from .model import RecursiveViT

        return RecursiveViT.upgrade_config(overrides, "model_overrides")

    def validate(self) -> TrainConfig:
        """Cross-key checks; raises :class:`ConfigError` naming the key."""
        from looprun.trackers import check_tracker

        check_tracker(self.tracker)
        if self.protocol not in ("imagenet", "cifar"):
            raise ConfigError(f"protocol must be imagenet or cifar, got {self.protocol!r}")
        for key in ("batch_size", "checkpoint_every", "log_every", "num_classes", "resolution", "lr_reference_batch",
                    "shuffle_buffer", "repeated_aug"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"max_steps must be >= 1 (or unset to use epochs), got {self.max_steps}")
        if self.max_steps is None and not self.epochs > 0:
            raise ConfigError(f"epochs must be > 0 when max_steps is unset, got {self.epochs}")
        for key in ("eval_every", "deep_supervision_every", "num_workers", "warmup_epochs", "grad_clip"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{key} must be >= 0, got {getattr(self, key)}")
        if self.precision not in ("bf16", "fp32"):
            raise ConfigError(f"precision must be bf16 or fp32, got {self.precision!r}")
        if self.eval_weights not in ("ema", "model"):
            raise ConfigError(f"eval_weights must be ema or model, got {self.eval_weights!r}")
        if not 0.0 <= self.drop_path_rate < 1.0:
            raise ConfigError(f"drop_path_rate must be in [0, 1), got {self.drop_path_rate}")
        if self.repeated_aug > 1 and self.shuffle_buffer <= 1:
            raise ConfigError(
                f"repeated_aug={self.repeated_aug} needs shuffle_buffer > 1 to spread the copies of a sample apart "
                f"(got shuffle_buffer={self.shuffle_buffer}); set shuffle_buffer to a few batches or repeated_aug=1"
            )
        reserved = {"num_classes", "img_size", "drop_path_rate", "deep_supervision_every"} & set(self.model_overrides)
        if reserved:
            raise ConfigError(
                f"model_overrides sets {sorted(reserved)}; use the top-level keys num_classes, resolution, "
                "drop_path_rate and deep_supervision_every instead"
            )
        return self

    def model_kwargs(self) -> dict[str, Any]:
        """Overrides for :func:`srvit.create_model`: the run's classes, resolution and regularisers."""
        from loopdata.transforms import make_options

        # the normalisation and crop the weights will expect, recorded in config.json (timm's pretrained_cfg)
        data = make_options("classification", **self.data_options())
        return {
            "data_mean": tuple(data.mean), "data_std": tuple(data.std), "crop_pct": data.crop_pct,
            **self.model_overrides, "num_classes": self.num_classes, "img_size": self.resolution,
            "drop_path_rate": self.drop_path_rate, "deep_supervision_every": self.deep_supervision_every,
        }

    def data_options(self) -> dict[str, Any]:
        """Classification options for :func:`loopdata.make_loader` (protocol defaults where unset)."""
        options: dict[str, Any] = {"protocol": self.protocol, "num_classes": self.num_classes,
                                   "repeated_aug": self.repeated_aug}
        for key in AUGMENTATION_KEYS:
            value = getattr(self, key)
            if value is not None:
                options[key] = tuple(value) if isinstance(value, list) else value
        return options

    def learning_rate(self, world_size: int) -> float:
        """Peak LR: ``lr`` if set, else DeiT's linear scaling ``base_lr * batch_size * world_size / 512``."""
        if self.lr is not None:
            return self.lr
        return self.base_lr * self.batch_size * world_size / self.lr_reference_batch

    def total_steps(self, steps_per_epoch: int) -> int:
        return self.max_steps if self.max_steps is not None else max(1, math.ceil(self.epochs * steps_per_epoch))

    def warmup_steps(self, steps_per_epoch: int) -> int:
        return round(self.warmup_epochs * steps_per_epoch)


def load_train_config(preset: str, overrides: list[str] | None = None) -> TrainConfig:
    """Resolve ``preset`` (a name in ``srvit/configs`` or a YAML path) plus ``key=value`` overrides."""
    return resolve_config(TrainConfig, preset, PRESETS_DIR, overrides).validate()


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))
