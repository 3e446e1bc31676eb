"""The two-stage tokenizer training loop (``loopvae train``), single process or torchrun/DDP.

Determinism and resumption: every step reseeds the global RNG from ``(seed, rank, step)``, so the
latent noise and DiffAugment draws of a step depend only on those three numbers; a checkpoint
stores model, EMA, optimizers, LR schedule, discriminator, step counters and the data position,
which is everything needed for a resumed run to end with the weights of an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torchvision
from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import loopdata
from loopcore.checkpoint import CheckpointManager
from loopcore.config import save_config
from loopcore.distributed import (
    DistributedContext,
    any_rank,
    average_gradients,
    gather_objects,
    init_distributed,
    mean_across_ranks,
)
from loopcore.ema import EMA
from loopcore.run_logger import RunLogger
from loopcore.schedule import make_scheduler
from loopcore.signals import StopSignal

from .diffaugment import diff_augment
from .discriminators import build_discriminator, r1_penalty
from .losses import LossWeights, ReconstructionObjective, hinge_d_loss, noisy_posterior_sample
from .model import LoopVAE
from .perceptual import PerceptualLoss
from .registry import create_model
from .release import resolve_artifact, save_release
from .train_config import TrainConfig

log = logging.getLogger("loopvae.train")


class NonFiniteLossError(RuntimeError):
    """The loss became NaN/Inf; the run stopped without writing a checkpoint."""


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    stopped_by: str | None
    release_dir: Path | None
    last_logs: dict[str, float]
    history: list[dict[str, float]]  # this rank's per-step logs (``step`` included)
    resumed_from: Path | None = None


class ReconstructionStep(nn.Module):
    """Encode -> noisy posterior sample -> decode, as one module so DDP sees a single forward.

    Returns ``(recon (B,3,H,W), posterior moments (B,2z,h,w), earlier finest-stage pass images)``.
    """

    def __init__(self, vae: LoopVAE, noise_std: float, deep_supervision: bool) -> None:
        super().__init__()
        self.vae = vae
        self.noise_std = noise_std
        self.deep_supervision = deep_supervision

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        posterior = self.vae.encode(x).latent_dist
        z = noisy_posterior_sample(posterior, self.noise_std)
        if self.deep_supervision:
            out = self.vae.decode_passes(z)
            return out.sample, posterior.parameters, out.pass_samples[:-1]
        return self.vae.decode(z).sample, posterior.parameters, []


def seed_step(seed: int, rank: int, step: int) -> None:
    """Reseed the global RNG from ``(seed, rank, step)`` (see module docstring)."""
    digest = hashlib.sha256(f"{seed}/{rank}/{step}".encode()).digest()
    torch.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def build_vae(config: TrainConfig) -> LoopVAE:
    """The model to train: the registered architecture, or the ``init_from`` artifact (stage 2)."""
    if config.init_from:
        source = resolve_artifact(config.init_from)
        if config.model_overrides:
            log.warning("model_overrides are ignored: the architecture comes from %s", source)
        return LoopVAE.from_pretrained(source).train()
    model = create_model(config.model, **config.model_overrides)
    if not isinstance(model, LoopVAE):
        raise ValueError(f"loopvae train trains LoopVAE models; {config.model!r} is a {type(model).__name__}")
    return model


def _weights_digest(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _setup_logging(run_dir: Path, ctx: DistributedContext) -> None:
    root = logging.getLogger("loopvae")
    root.setLevel(logging.INFO)
    for handler in list(root.handlers):
        if getattr(handler, "_loopvae", False):
            root.removeHandler(handler)
    fmt = logging.Formatter(f"%(asctime)s [rank {ctx.rank}] %(levelname)s %(message)s")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if ctx.is_main:
        handlers.append(logging.FileHandler(run_dir / "train.log"))
    for handler in handlers:
        handler.setFormatter(fmt)
        handler._loopvae = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    logging.getLogger("loopcore").addHandler(handlers[0])


class Trainer:
    """Owns every piece of training state; :meth:`run` executes the loop."""

    def __init__(self, config: TrainConfig, data: str | list[str], out_dir: str | Path) -> None:
        self.config = config.validate()
        self.ctx = init_distributed(config.device)
        self.run_dir = Path(out_dir)
        if self.ctx.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_config(config, self.run_dir / "config.yaml")
        _setup_logging(self.run_dir if self.ctx.is_main else Path("."), self.ctx)
        dev = self.ctx.device
        self.autocast = dev.type == "cuda" and config.precision == "bf16"

        torch.manual_seed(config.seed)  # identical initialisation on every rank
        self.vae = build_vae(config).to(dev)
        self.memory_format = torch.channels_last if config.channels_last else torch.contiguous_format
        self.vae = self.vae.to(memory_format=self.memory_format)
        if config.gradient_checkpointing:
            self.vae.enable_gradient_checkpointing()
        self.ema = EMA(self.vae, config.ema_decay).to(dev)
        perceptual = None
        if config.perceptual_weight > 0:
            perceptual = PerceptualLoss(config.lpips_net, config.lpips_weights).to(dev)
        weights = LossWeights(
            l1=config.l1_weight, perceptual=config.perceptual_weight, kl=config.kl_weight, gan=config.gan_weight,
            gan_start_step=config.gan_start_step, adaptive_weight_max=config.adaptive_weight_max,
            deep_supervision=config.deep_supervision_weight,
        )
        self.objective = ReconstructionObjective(weights, perceptual)
        step_module = ReconstructionStep(self.vae, config.latent_noise_std, config.deep_supervision_weight > 0)
        self.step_module = (
            DistributedDataParallel(step_module, device_ids=[dev.index] if dev.type == "cuda" else None)
            if self.ctx.distributed else step_module
        )
        self.optimizer = torch.optim.AdamW(
            self.vae.parameters(), lr=config.lr, betas=tuple(config.betas), weight_decay=config.weight_decay
        )
        self.scheduler = make_scheduler(
            self.optimizer, config.warmup_steps, config.max_steps, config.lr_schedule, config.min_lr_ratio
        )
        self.disc = self.d_optimizer = None
        if config.stage == 2:
            self.disc = build_discriminator(config.discriminator, config.dino_weights).to(dev)
            self.d_params = [p for p in self.disc.parameters() if p.requires_grad]
            self.d_optimizer = torch.optim.AdamW(self.d_params, lr=config.disc_lr, betas=tuple(config.disc_betas))
        self.loader = loopdata.make_loader(
            data, task="reconstruction", train=True, batch_size=config.batch_size, num_workers=config.num_workers,
            resolution=config.resolution, rank=self.ctx.rank, world_size=self.ctx.world_size, seed=config.seed,
            scale=tuple(config.scale_jitter), hflip=config.hflip,
        )
        self.checkpoints = CheckpointManager(self.run_dir / "checkpoints", config.keep_checkpoints, self.ctx.is_main)
        self.step = 0
        self.d_steps = 0
        self.resumed_from: Path | None = None
        self._resume()

    # -- state ---------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        state = {
            "model": self.vae.state_dict(),
            "ema": self.ema.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "trainer": {"step": self.step, "d_steps": self.d_steps, "data": self.loader.state_dict()},
        }
        if self.disc is not None:
            state["discriminator"] = {k: v for k, v in self.disc.state_dict().items()}
            state["d_optimizer"] = self.d_optimizer.state_dict()
        return state

    def _resume(self) -> None:
        loaded = self.checkpoints.load_latest(map_location=self.ctx.device)
        if loaded is None:
            return
        s = loaded.state
        self.vae.load_state_dict(s["model"])
        self.ema.load_state_dict(s["ema"])
        self.optimizer.load_state_dict(s["optimizer"])
        self.scheduler.load_state_dict(s["scheduler"])
        if self.disc is not None:
            if "discriminator" not in s:
                raise RuntimeError(f"{loaded.path} has no discriminator state but this is a stage-2 run")
            self.disc.load_state_dict(s["discriminator"])
            self.d_optimizer.load_state_dict(s["d_optimizer"])
        self.step = int(s["trainer"]["step"])
        self.d_steps = int(s["trainer"]["d_steps"])
        self.loader.load_state_dict(s["trainer"]["data"])
        self.resumed_from = loaded.path
        log.info("resumed from %s at step %d", loaded.path, self.step)

    def save(self, reason: str) -> None:
        path = self.checkpoints.save(self.step, self.state(), {"reason": reason, "config": asdict(self.config)})
        if path is not None:
            log.info("checkpoint %s (%s)", path, reason)

    # -- steps ---------------------------------------------------------------------------------
    def _autocast(self):
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.autocast)

    def generator_step(self, x: torch.Tensor) -> tuple[dict[str, float], torch.Tensor]:
        cfg = self.config
        with self._autocast():
            recon, moments, passes = self.step_module(x)
        posterior = DiagonalGaussianDistribution(moments.float())
        fake_logits = None
        if self.disc is not None:
            self.disc.requires_grad_(False)
            with self._autocast():
                fake_logits = self.disc(diff_augment(recon.float(), cfg.diffaug_p, cfg.diffaug_cutout))
        terms = self.objective(
            x, recon, posterior, self.step, fake_logits=fake_logits, last_layer=self.vae.get_last_layer(),
            pass_recons=passes,
        )
        if any_rank(not bool(torch.isfinite(terms.total)), self.ctx):
            last = self.checkpoints.list_checkpoints()
            raise NonFiniteLossError(
                f"non-finite loss at step {self.step} ({terms.logs}); stopped without saving. The last good "
                f"checkpoint {last[-1] if last else '(none yet)'} is untouched: lower lr, check the data, or "
                "resume from it"
            )
        self.optimizer.zero_grad(set_to_none=True)
        terms.total.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.vae.parameters(), cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.ema.update(self.vae)
        logs = dict(terms.logs, grad_norm=float(grad_norm), lr=self.scheduler.get_last_lr()[0])
        return logs, recon.detach()

    def discriminator_step(self, x: torch.Tensor, recon: torch.Tensor) -> dict[str, float]:
        cfg = self.config
        for p in self.d_params:
            p.requires_grad_(True)
        lazy_r1 = self.d_steps % cfg.r1_every == 0 and cfg.r1_gamma > 0
        real = x.detach().float().requires_grad_(lazy_r1)
        with self._autocast():
            real_logits = self.disc(diff_augment(real, cfg.diffaug_p, cfg.diffaug_cutout))
            fake_logits = self.disc(diff_augment(recon.float(), cfg.diffaug_p, cfg.diffaug_cutout))
        d_loss = hinge_d_loss(real_logits, fake_logits)
        logs = {"d_loss": float(d_loss.detach()), "d_real": float(real_logits.detach().float().mean()),
                "d_fake": float(fake_logits.detach().float().mean())}
        total = d_loss
        if lazy_r1:
            r1 = r1_penalty(real, real_logits.float())
            # lazy regularisation: apply every r1_every steps, scaled up by r1_every
            total = total + 0.5 * cfg.r1_gamma * cfg.r1_every * r1
            logs["r1"] = float(r1.detach())
        if any_rank(not bool(torch.isfinite(total)), self.ctx):
            raise NonFiniteLossError(
                f"non-finite discriminator loss at step {self.step} ({logs}); stopped without saving"
            )
        self.d_optimizer.zero_grad(set_to_none=True)
        total.backward()
        average_gradients(self.d_params, self.ctx)
        torch.nn.utils.clip_grad_norm_(self.d_params, cfg.grad_clip)
        self.d_optimizer.step()
        self.d_steps += 1
        return logs

    # -- loop ----------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        cfg, ctx = self.config, self.ctx
        logger = RunLogger(self.run_dir, cfg.max_steps, self.step, ctx.is_main, cfg.progress_bar)
        log.info(
            "training %s stage %d on %d rank(s), %d batches/epoch/rank, from step %d to %d",
            cfg.model, cfg.stage, ctx.world_size, len(self.loader), self.step, cfg.max_steps,
        )
        logs: dict[str, float] = {}
        history: list[dict[str, float]] = []
        stopped_by = None
        batches = iter(self.loader)
        try:
            with StopSignal() as stop:
                while self.step < cfg.max_steps:
                    try:
                        batch = next(batches)
                    except StopIteration:
                        self.loader.set_epoch(self.loader.epoch + 1)
                        batches = iter(self.loader)
                        continue
                    seed_step(cfg.seed, ctx.rank, self.step)
                    self.vae.train()
                    x = batch["image"].to(ctx.device, non_blocking=True).contiguous(memory_format=self.memory_format)
                    logs, recon = self.generator_step(x)
                    if self.disc is not None and self.step >= cfg.disc_start_step:
                        logs.update(self.discriminator_step(x, recon))
                    self.step += 1
                    history.append({"step": self.step, **logs})
                    logger.step(x.shape[0] * ctx.world_size)
                    if self.step % cfg.log_every == 0 or self.step == cfg.max_steps:
                        logs = mean_across_ranks(logs, ctx)
                        logger.scalars(self.step, logs)
                    if ctx.is_main and (self.step % cfg.image_every == 0 or self.step == cfg.max_steps):
                        grid = torchvision.utils.make_grid(
                            torch.cat([x[:4], recon[:4]]).float().add(1).div(2).cpu(), nrow=min(4, x.shape[0])
                        )
                        logger.images(self.step, "reconstruction/top_input_bottom_output", grid)
                    stop_now = any_rank(stop.requested is not None, ctx)
                    if stop_now or self.step % cfg.checkpoint_every == 0 or self.step == cfg.max_steps:
                        self.save("signal" if stop_now else "periodic")
                    if stop_now:
                        stopped_by = stop.requested or "signal on another rank"
                        log.info("stopping at step %d on %s", self.step, stopped_by)
                        break
        finally:
            logger.close()
        release = self.finish(stopped_by, logs)
        return TrainResult(self.run_dir, self.step, stopped_by, release, logs, history, self.resumed_from)

    def finish(self, stopped_by: str | None, logs: dict[str, float]) -> Path | None:
        """Cross-rank weight check, run summary and (when complete) the EMA release artifact."""
        ctx = self.ctx
        digests = gather_objects(_weights_digest(self.vae), ctx)
        ranks = gather_objects(
            {"rank": ctx.rank, "batches_per_epoch": len(self.loader), "samples_per_epoch": self.loader.num_samples,
             "corrupt_samples": self.loader.corrupt_count}, ctx,
        )
        if len(set(digests)) != 1:
            raise RuntimeError(f"ranks hold different weights after training: {digests}")
        release = None
        if ctx.is_main:
            if stopped_by is None:
                release = save_release(
                    self.ema.module, self.run_dir / "release",
                    {"step": self.step, "stage": self.config.stage, "weights": "ema", "run_dir": str(self.run_dir)},
                )
                log.info("release artifact (EMA weights) in %s", release)
            summary = {
                "step": self.step, "max_steps": self.config.max_steps, "stopped_by": stopped_by,
                "resumed_from": str(self.resumed_from) if self.resumed_from else None,
                "world_size": ctx.world_size, "weights_sha256_per_rank": digests, "ranks": ranks,
                "last_logs": logs, "release": str(release) if release else None,
            }
            (self.run_dir / "train_summary.json").write_text(json.dumps(summary, indent=2))
        return release


def train(config: TrainConfig, data: str | list[str], out_dir: str | Path) -> TrainResult:
    """Train (or resume) a LoopVAE per ``config`` on WebDataset ``data``, writing to ``out_dir``."""
    return Trainer(config, data, out_dir).run()
