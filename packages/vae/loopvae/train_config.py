"""Configuration schema of ``loopvae train`` and its presets (``loopvae/configs/*.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from looprun.config import ConfigError, RenamedKey, resolve_config
from looprun.speed import MEMORY_FORMATS

PRESETS_DIR = Path(__file__).parent / "configs"


@dataclass
class TrainConfig:
    """Every key a preset, a YAML file or ``--set key=value`` may give (see ``docs/training.md``)."""

    # what to train
    model: str = "loopvae-cnn-tiny"
    model_overrides: dict[str, Any] = field(default_factory=dict)
    stage: int = 1
    # the weights to start from: stage 2's stage-1 release, or (either stage) any tokenizer folder we load, e.g. a
    # diffusers AutoencoderKL (SD / FLUX VAE) to fine-tune; its config.json gives the architecture
    init_from: str | None = None
    trainable: str = "all"  # all | decoder (decoder-only fine-tuning, as SD's ft-MSE VAE: the encoder stays frozen)
    # data
    resolution: int = 128
    batch_size: int = 8  # per rank and micro-step
    # micro-batches of batch_size accumulated into each optimizer step (global batch = batch_size x grad_accum_steps
    # x ranks): the paper's 8 GPUs x 4 on fewer GPUs. Steps (max_steps, warm-up, checkpoint_every, GAN and R1
    # schedules) count optimizer steps.
    grad_accum_steps: int = 1
    num_workers: int = 2
    jpeg_draft: bool = False  # decode training JPEGs at reduced DCT scale when the crop allows (throughput only)
    scale_jitter: tuple[float, float] = (1.0, 1.0)
    hflip: float = 0.5
    # optimisation
    max_steps: int = 1000
    lr: float = 1e-4
    weight_decay: float = 0.0
    modulation_lr_scale: float = 1.0  # lr multiplier for the cores' embeddings and adaLN-Zero modulation
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_steps: int = 0
    lr_schedule: str = "constant"
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    ema_decay: float = 0.9999
    precision: str = "bf16"  # bf16 autocast on CUDA; CPU runs fp32
    gradient_checkpointing: bool = False
    memory_format: str = "channels_last"  # torch layout of the activations (looprun.speed): channels_last | contiguous
    compile: bool = False  # torch.compile the training step's forward (loopvae train --compile)
    device: str = "auto"
    seed: int = 0
    # objective
    l1_weight: float = 1.0
    mse_weight: float = 0.0  # an L2 term next to L1 (both on the [-1, 1] scale; 0 = the paper's objective)
    perceptual_weight: float = 1.0
    lpips_net: str = "vgg"
    lpips_weights: str | None = None
    fid_weights: str | None = None  # Inception weights for rFID during validation (default: the torch hub cache)
    kl_weight: float = 1e-6
    latent_noise_std: float = 0.05
    deep_supervision_weight: float = 0.0
    # stage 2
    discriminator: str = "none"  # none | patchgan | dino
    dino_weights: str | None = None
    # discriminator AdamW: with R1 on (r1_gamma > 0, r1_every = k > 1) it runs at lr = disc_lr * c and
    # betas = disc_betas ** c with c = k / (k + 1), StyleGAN2's lazy-regularisation correction (Karras et
    # al. 2020, Appendix B); the defaults (k = 16) give lr = 5e-5 * 16/17 and betas = (0.5, 0.9) ** (16/17)
    disc_lr: float = 5e-5
    disc_betas: tuple[float, float] = (0.5, 0.9)
    disc_start_step: int = 0
    gan_start_step: int = 5000
    gan_weight: float = 0.5
    adaptive_weight_max: float = 1e4
    # R1 = E_x ||grad_x mean_patches D(x)||^2 on real images: the gradient of each sample's *mean* patch /
    # token logit (the average the hinge loss takes), so gamma means the same for PatchGAN, DINO and a
    # single-logit D. Lazy: every r1_every-th D step adds (r1_gamma / 2) * r1_every * R1; 0 turns R1 off
    r1_gamma: float = 10.0
    r1_every: int = 16
    diffaug_p: float = 1.0
    diffaug_cutout: float = 0.2
    # bookkeeping
    # held-out validation during training (loopvae train --val-data): PSNR of the EMA weights on the first
    # eval_images images at eval_resolution^2, every eval_every steps and at the end (0 = only at the end)
    eval_every: int = 0
    eval_resolution: int = 256
    eval_images: int = 40
    checkpoint_every: int = 1000
    keep_checkpoints: int = 3
    log_every: int = 50
    image_every: int = 500
    progress_bar: bool = True
    tracker: str = "tensorboard"  # tensorboard | wandb (optional extra; offline without a login) | none
    # resume although the data's modification times moved (same files, same sizes: a copy without -p, a touch)
    accept_data_mtime: bool = False

    # configs written before a key was renamed still load, with a warning (looprun.config.RenamedKey)
    RENAMED_KEYS: ClassVar[dict[str, RenamedKey]] = {
        "channels_last": RenamedKey("memory_format", lambda on: "channels_last" if on else "contiguous"),
    }

    @staticmethod
    def upgrade_model_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
        """``model_overrides`` with the model's renamed arguments under their new names (with a warning)."""
        from .model import LoopVAE

        return LoopVAE.upgrade_config(overrides, "model_overrides")

    def validate(self) -> TrainConfig:
        """Cross-key checks; raises :class:`ConfigError` naming the key."""
        if self.memory_format not in MEMORY_FORMATS:
            raise ConfigError(f"memory_format must be one of {', '.join(MEMORY_FORMATS)}, got {self.memory_format!r}")
        if self.stage not in (1, 2):
            raise ConfigError(f"stage must be 1 or 2, got {self.stage}")
        if self.stage == 2 and self.discriminator == "none":
            raise ConfigError("stage 2 needs discriminator: patchgan or dino")
        if self.stage == 1 and self.discriminator != "none":
            raise ConfigError(f"stage 1 trains without a discriminator; got discriminator={self.discriminator!r}")
        if self.discriminator not in ("none", "patchgan", "dino"):
            raise ConfigError(f"discriminator must be none, patchgan or dino, got {self.discriminator!r}")
        for key in ("max_steps", "batch_size", "grad_accum_steps", "checkpoint_every", "log_every", "image_every",
                    "r1_every", "eval_resolution", "eval_images", "keep_checkpoints"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be >= 1, got {getattr(self, key)}")
        from loopdata.decode import MAX_PIXELS_ENV, default_max_pixels

        limit = default_max_pixels()
        for key in ("resolution", "eval_resolution"):
            side = getattr(self, key)
            if side < 1:
                raise ConfigError(f"{key} must be >= 1, got {side}")
            if side * side > limit:  # every image would be refused by the decoder's pixel guard (or exhaust memory)
                raise ConfigError(f"{key}={side}: a {side}x{side} crop is {side * side:,} pixels, over loopdata's "
                                  f"limit of {limit:,} pixels per image ({MAX_PIXELS_ENV}); choose a smaller {key}")
        if self.precision not in ("bf16", "fp32"):
            raise ConfigError(f"precision must be bf16 or fp32, got {self.precision!r}")
        if self.eval_every < 0:
            raise ConfigError(f"eval_every must be >= 0 (0 = validate only at the end), got {self.eval_every}")
        if self.mse_weight < 0 or self.l1_weight < 0:
            raise ConfigError(f"l1_weight and mse_weight must be >= 0, got {self.l1_weight}, {self.mse_weight}")
        if self.modulation_lr_scale <= 0:
            raise ConfigError(f"modulation_lr_scale must be > 0, got {self.modulation_lr_scale}")
        from looprun.trackers import check_tracker

        check_tracker(self.tracker)
        if self.trainable not in ("all", "decoder"):
            raise ConfigError(f"trainable must be all or decoder, got {self.trainable!r}")
        if self.lpips_net not in ("vgg", "alex"):
            raise ConfigError(f"lpips_net must be vgg or alex, got {self.lpips_net!r}")
        return self


def load_train_config(preset: str, overrides: list[str] | None = None) -> TrainConfig:
    """Resolve ``preset`` (a name in ``loopvae/configs`` or a YAML path) plus ``key=value`` overrides."""
    return resolve_config(TrainConfig, preset, PRESETS_DIR, overrides).validate()


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))
