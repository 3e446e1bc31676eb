"""The two-stage tokenizer training loop (``loopvae train``), single process or torchrun/DDP.

Determinism and resumption: every step reseeds the global RNG from ``(seed, rank, step)``, so the
latent noise and DiffAugment draws of a step depend only on those three numbers; a checkpoint
stores model, EMA, optimizers, LR schedule, discriminator, step counters and the data position,
which is everything needed for a resumed run to end with the weights of an uninterrupted one.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torchvision
from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import loopdata
from loopcore.flops import count_macs
from loopdata.identity import data_identity
from loopdata.shards import canonical_urls
from looprun.checkpoint import write_atomic
from looprun.config import ConfigError
from looprun.distributed import average_gradients
from looprun.optimization import EMA, make_scheduler
from looprun.release import resolve_artifact
from looprun.run_logger import RunLogger
from looprun.speed import memory_format
from looprun.training_loop import NonFiniteLossError, TrainingLoop, TrainResult

from .autoencoders import TOKENIZER_CLASSES, check_resolution, encode_posterior, encode_sample, last_layer
from .diffaugment import diff_augment
from .discriminators import build_discriminator, r1_penalty
from .loading import load_artifact
from .losses import LossWeights, ReconstructionObjective, hinge_d_loss, noisy_posterior_sample
from .model import LoopVAE
from .perceptual import PerceptualLoss
from .registry import create_model
from .train_config import TrainConfig
from .validation import ValidationMetrics, ValidationSet, validation_psnr

log = logging.getLogger("loopvae.train")

__all__ = ["NonFiniteLossError", "ReconstructionStep", "TrainResult", "Trainer", "build_vae", "last_layer", "train"]


class ReconstructionStep(nn.Module):
    """Encode -> noisy posterior sample -> decode, as one module so DDP sees a single forward.

    Returns ``(recon (B,3,H,W), posterior moments (B,2z,h,w) or None, earlier finest-stage pass images)``.
    A deterministic autoencoder (``AutoencoderDC``) has no posterior: its latent gets the same
    ``N(0, noise_std^2)`` training noise and the moments are ``None`` (no KL term).
    """

    def __init__(self, vae: nn.Module, noise_std: float, deep_supervision: bool) -> None:
        super().__init__()
        self.vae = vae
        self.noise_std = noise_std
        self.deep_supervision = deep_supervision

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        posterior = encode_posterior(self.vae, x)
        if posterior is None:
            z = encode_sample(self.vae, x)
            if self.noise_std > 0:
                z = z + self.noise_std * torch.randn_like(z)
        else:
            z = noisy_posterior_sample(posterior, self.noise_std)
        moments = None if posterior is None else posterior.parameters
        if self.deep_supervision:
            out = self.vae.decode_passes(z)
            return out.sample, moments, out.pass_samples[:-1]
        return self.vae.decode(z).sample, moments, []


TRAINABLE = TOKENIZER_CLASSES


def build_vae(config: TrainConfig) -> nn.Module:
    """The model to train: the registered architecture, or the ``init_from`` artifact (stage 2, or a diffusers
    ``AutoencoderKL`` / ``AutoencoderDC`` folder to fine-tune, in either stage).

    LoopVAEs and the diffusers references (``AutoencoderKL``, e.g. ``klvae-tiny-w32``; ``AutoencoderDC``, e.g.
    ``dcae-tiny``) train with the same loop, so a comparison between them differs only in the model and recipe.
    """
    if config.init_from:
        source = resolve_artifact(config.init_from)
        if config.model_overrides:
            log.warning("model_overrides are ignored: the architecture comes from %s", source)
        model = load_artifact(source).train()
    else:
        model = create_model(config.model, **config.model_overrides)
    if not isinstance(model, TRAINABLE):
        raise ValueError(
            f"loopvae train trains {', '.join(c.__name__ for c in TRAINABLE)} models; {config.model!r} is a "
            f"{type(model).__name__}"
        )
    if config.deep_supervision_weight > 0 and not isinstance(model, LoopVAE):
        raise ValueError(
            f"deep_supervision_weight={config.deep_supervision_weight} needs a LoopVAE (it supervises the passes of "
            f"the decoder's finest stage); {config.model!r} is a {type(model).__name__}: set it to 0"
        )
    return model


DECODER_PREFIXES = ("decoder.", "post_quant_conv.")  # what decodes a latent, in LoopVAE and diffusers' autoencoders


def freeze_all_but_decoder(vae: nn.Module) -> int:
    """Decoder-only fine-tuning: every parameter outside the decoder (and ``post_quant_conv``) stops requiring
    gradients, so the optimizer never sees it and the encoder's weights stay bit-identical. Returns the count."""
    frozen = 0
    for name, p in vae.named_parameters():
        if not name.startswith(DECODER_PREFIXES):
            p.requires_grad_(False)
            frozen += p.numel()
    if frozen == 0 or not any(p.requires_grad for p in vae.parameters()):
        raise ValueError(f"trainable=decoder: {type(vae).__name__} has no separate encoder/decoder parameters")
    return frozen


def conditioning_parameters(vae: nn.Module) -> list[nn.Parameter]:
    """The conditioning path of every looped core: the ``c = e_s + e_t`` embeddings and the blocks'
    adaLN-Zero modulation linears (empty for models without looped cores)."""
    return [p for name, p in vae.named_parameters() if ".embedding." in name or ".modulation." in name]


def parameter_groups(vae: nn.Module, lr: float, conditioning_lr_scale: float) -> list[dict[str, Any]]:
    """AdamW groups: the conditioning path at ``lr * conditioning_lr_scale``, everything else at ``lr``.

    Why a separate rate: the modulation starts at exactly zero (adaLN-Zero), and Adam moves a gate by at
    most about ``lr`` per step, so in a short run the looped blocks stay close to the identity while the
    plain convolutions around them learn the reconstruction (measured: relative updates of 0.2-0.8% per
    pass after 600 steps at scale 1). ``1.0`` is one group with one learning rate, as before the key
    existed, so older checkpoints resume.
    """
    trainable = [p for p in vae.parameters() if p.requires_grad]  # frozen ones (trainable=decoder) stay out
    if conditioning_lr_scale == 1.0:
        return [{"params": trainable, "lr": lr}]
    conditioning = [p for p in conditioning_parameters(vae) if p.requires_grad]
    ids = {id(p) for p in conditioning}
    rest = [p for p in trainable if id(p) not in ids]
    groups: list[dict[str, Any]] = [{"params": rest, "lr": lr}]
    if conditioning:
        groups.append({"params": conditioning, "lr": lr * conditioning_lr_scale})
    return groups


def lazy_regularization_ratio(config: TrainConfig) -> float:
    """StyleGAN2's lazy-regularisation ratio ``c = k / (k + 1)`` for R1 every ``k = r1_every`` D steps.

    ``1.0`` (no correction) when R1 is off (``r1_gamma == 0``) or applied every step (``r1_every == 1``).
    """
    k = config.r1_every
    return k / (k + 1) if config.r1_gamma > 0 and k > 1 else 1.0


def discriminator_optimizer(params: list[nn.Parameter], config: TrainConfig) -> torch.optim.AdamW:
    """AdamW for the discriminator at ``disc_lr * c`` with betas ``disc_betas ** c``.

    ``c`` is :func:`lazy_regularization_ratio`: with R1 every ``k`` steps StyleGAN2 (Karras et al. 2020,
    Appendix B) scales Adam's learning rate by ``c`` and raises both betas to the power ``c``, and
    multiplies the penalty by ``k`` (:meth:`Trainer.discriminator_step`). A checkpoint's optimizer
    state carries its own lr and betas, so a resumed run keeps the values it started with.
    """
    c = lazy_regularization_ratio(config)
    beta1, beta2 = config.disc_betas
    return torch.optim.AdamW(params, lr=config.disc_lr * c, betas=(beta1**c, beta2**c))


def preflight(config: TrainConfig) -> None:
    """What can be checked before any file is written (a failed start leaves no files): the model builds with its
    ``model_overrides`` (a wrongly typed value is named with its key) and takes ``resolution``² crops. Runs on the
    meta device: no memory, no time."""
    if config.init_from:
        return  # the architecture comes from the artifact, checked when it is loaded
    with torch.device("meta"):
        try:
            model = create_model(config.model, **config.model_overrides)
        except KeyError as err:
            raise ConfigError(f"model: {err.args[0]}") from None
        except (TypeError, ValueError, RuntimeError) as err:  # RuntimeError: "Storage size calculation overflowed"
            defaults = dict(create_model(config.model).config)
            for key, value in config.model_overrides.items():
                default = defaults.get(key)
                if isinstance(default, (bool, int, float)) and not isinstance(value, type(default)) and not (
                        isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool)):
                    kind = {bool: "a boolean", int: "an integer", float: "a number"}[type(default)]
                    raise ConfigError(f"model_overrides.{key}: {value!r} is not {kind} "
                                      f"({config.model}'s default is {default!r})") from None
            raise ConfigError(f"model_overrides {dict(config.model_overrides)} do not build {config.model}: "
                              f"{err}") from None
        try:  # encode_sample refuses a size the latent factor does not divide (AutoencoderKL would crop it)
            x = torch.empty(1, 3, config.resolution, config.resolution)
            model.decode(encode_sample(model, x))
        except (ValueError, RuntimeError) as err:
            raise ConfigError(f"resolution={config.resolution}: {config.model} cannot reconstruct "
                              f"{config.resolution}² crops ({err})") from None


class Trainer(TrainingLoop):
    """Owns every piece of training state; :meth:`run` runs :class:`looprun.training_loop.TrainingLoop`."""

    def __init__(
        self, config: TrainConfig, data: str | list[str], out_dir: str | Path, val_data: str | list[str] | None = None
    ) -> None:
        preflight(config.validate())  # before the run folder, lock, config.yaml, log or tb/ exist
        super().__init__(config, out_dir, "loopvae")
        with self.abandon_on_error():
            dev = self.ctx.device
            self.autocast = dev.type == "cuda" and config.precision == "bf16"

            torch.manual_seed(config.seed)  # identical initialisation on every rank
            self.vae = build_vae(config).to(dev)
            try:  # preflight could not check an init_from artifact's latent factor
                check_resolution(self.vae, config.resolution, "resolution")
                if val_data:
                    check_resolution(self.vae, config.eval_resolution, "eval_resolution")
            except ValueError as err:
                raise ConfigError(f"{err} ({config.init_from or config.model})") from None
            self.memory_format = memory_format(config.memory_format)
            self.vae = self.vae.to(memory_format=self.memory_format)
            if config.gradient_checkpointing:
                self.vae.enable_gradient_checkpointing()
            if config.trainable == "decoder":
                frozen = freeze_all_but_decoder(self.vae)
                log.info("trainable=decoder: %d encoder parameters frozen (%d trainable)", frozen,
                         sum(p.numel() for p in self.vae.parameters() if p.requires_grad))
            self.ema = EMA(self.vae, config.ema_decay).to(dev)
            perceptual = None
            if config.perceptual_weight > 0:
                perceptual = PerceptualLoss(
                    config.lpips_net, config.lpips_weights,
                    options_hint="pass --set lpips_weights=PATH, or train without the perceptual term "
                                 "(--set perceptual_weight=0)").to(dev)
            weights = LossWeights(
                l1=config.l1_weight, mse=config.mse_weight, perceptual=config.perceptual_weight,
                kl=config.kl_weight, gan=config.gan_weight,
                gan_start_step=config.gan_start_step, adaptive_weight_max=config.adaptive_weight_max,
                deep_supervision=config.deep_supervision_weight,
            )
            self.objective = ReconstructionObjective(weights, perceptual)
            step_module = ReconstructionStep(self.vae, config.latent_noise_std, config.deep_supervision_weight > 0)
            if config.compile:
                step_module.compile()  # in place: parameter names, checkpoints and the EMA are unchanged
            self.step_module = (
                DistributedDataParallel(step_module, device_ids=[dev.index] if dev.type == "cuda" else None)
                if self.ctx.distributed else step_module
            )
            self.optimizer = torch.optim.AdamW(
                [g for g in parameter_groups(self.vae, config.lr, config.modulation_lr_scale) if g["params"]],
                lr=config.lr,
                betas=tuple(config.betas), weight_decay=config.weight_decay,
            )
            self.scheduler = make_scheduler(
                self.optimizer, config.warmup_steps, config.max_steps, config.lr_schedule, config.min_lr_ratio
            )
            self.disc = self.d_optimizer = None
            if config.stage == 2:
                self.disc = build_discriminator(config.discriminator, config.dino_weights).to(dev)
                self.d_params = [p for p in self.disc.parameters() if p.requires_grad]
                self.d_optimizer = discriminator_optimizer(self.d_params, config)
            # one loader batch feeds one optimizer step: grad_accum_steps micro-batches of batch_size
            self.loader = loopdata.make_loader(
                data, task="reconstruction", train=True, batch_size=config.batch_size * config.grad_accum_steps,
                num_workers=config.num_workers,
                resolution=config.resolution, rank=self.ctx.rank, world_size=self.ctx.world_size, seed=config.seed,
                scale=tuple(config.scale_jitter), hflip=config.hflip, draft=config.jpeg_draft,
            )
            self.data_spec = canonical_urls(data)
            self.data_identity = data_identity(self.data_spec)
            self.d_steps = 0
            # the learning curve: one entry per validation; train_seconds is the CPU time of the optimisation
            # steps alone (time.process_time: every thread of this process, data loading in it included)
            self.val_set = (ValidationSet(val_data, config.eval_resolution, config.eval_images)
                            if val_data else None)
            # eval's metrics beyond PSNR/SSIM: LPIPS (config.lpips_net) and rFID when their weights are present
            self.val_metrics = (ValidationMetrics.build(config.lpips_net, config.lpips_weights,
                                                        config.fid_weights, dev) if val_data else None)
            self.validation: list[dict[str, Any]] = []
            self.train_seconds = 0.0
            self.train_wall_seconds = 0.0  # the same steps' wall time (GPU runs: CPU time is not the cost)
            self._last_batch: tuple[torch.Tensor, torch.Tensor] | None = None
            self.resume()

    # -- state ---------------------------------------------------------------------------------
    def model_state(self) -> dict[str, Any]:
        state = {
            "model": self.vae.state_dict(),
            "ema": self.ema.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }
        if self.disc is not None:
            state["discriminator"] = {k: v for k, v in self.disc.state_dict().items()}
            state["d_optimizer"] = self.d_optimizer.state_dict()
        return state

    def load_model_state(self, s: dict[str, Any]) -> None:
        self.vae.load_state_dict(s["model"])
        self.ema.load_state_dict(s["ema"])
        self.optimizer.load_state_dict(s["optimizer"])
        self.scheduler.load_state_dict(s["scheduler"])
        if self.disc is not None:
            if "discriminator" not in s:
                raise RuntimeError("the checkpoint has no discriminator state but this is a stage-2 run")
            self.disc.load_state_dict(s["discriminator"])
            self.d_optimizer.load_state_dict(s["d_optimizer"])

    def counters(self) -> dict[str, Any]:
        return {"d_steps": self.d_steps, "train_seconds": self.train_seconds,
                "train_wall_seconds": self.train_wall_seconds,
                "validation": json.dumps(self.validation)}

    def load_counters(self, trainer_state: dict[str, Any]) -> None:
        self.d_steps = int(trainer_state["d_steps"])
        # checkpoints written before these counters existed resume with an empty curve
        self.train_seconds = float(trainer_state.get("train_seconds", 0.0))
        self.train_wall_seconds = float(trainer_state.get("train_wall_seconds", 0.0))
        self.validation = json.loads(trainer_state.get("validation", "[]"))

    # -- steps ---------------------------------------------------------------------------------
    def _autocast(self):
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.autocast)

    def _micro_batches(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        k = self.config.grad_accum_steps
        if x.shape[0] % k:
            raise RuntimeError(f"a batch of {x.shape[0]} images does not split into grad_accum_steps={k} micro-batches")
        return x.chunk(k) if k > 1 else (x,)

    def _sync_unless(self, module: torch.nn.Module, last: bool):
        """DDP's ``no_sync`` on every micro-step but the last (the gradients are all-reduced once per step)."""
        return module.no_sync() if (not last and isinstance(module, DistributedDataParallel)) else nullcontext()

    def generator_step(self, x: torch.Tensor) -> tuple[dict[str, float], torch.Tensor]:
        """One optimizer step over ``grad_accum_steps`` micro-batches of ``x`` (``(k b, 3, H, W)``): each micro-loss
        is divided by k, so the summed gradient is the gradient of the mean loss over the k b images."""
        cfg = self.config
        micro = self._micro_batches(x)
        k = len(micro)
        self.optimizer.zero_grad(set_to_none=True)
        recons, logs_sum = [], {}
        for i, xi in enumerate(micro):
            with self._sync_unless(self.step_module, last=i == k - 1):
                with self._autocast():
                    recon, moments, passes = self.step_module(xi)
                posterior = None if moments is None else DiagonalGaussianDistribution(moments.float())
                fake_logits = None
                if self.disc is not None:
                    self.disc.requires_grad_(False)
                    with self._autocast():
                        fake_logits = self.disc(diff_augment(recon.float(), cfg.diffaug_p, cfg.diffaug_cutout))
                terms = self.objective(
                    xi, recon, posterior, self.step, fake_logits=fake_logits, last_layer=last_layer(self.vae),
                    pass_recons=passes,
                )
                self.check_finite(terms.total, detail=str(terms.logs))
                (terms.total if k == 1 else terms.total / k).backward()
            recons.append(recon.detach())
            for key, value in terms.logs.items():
                logs_sum[key] = logs_sum.get(key, 0.0) + value / k
        grad_norm = self.clip_and_check_gradients(list(self.vae.parameters()), cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.ema.update(self.vae)
        logs = dict(logs_sum, grad_norm=float(grad_norm), lr=self.scheduler.get_last_lr()[0])
        return logs, (recons[0] if k == 1 else torch.cat(recons))

    def discriminator_step(self, x: torch.Tensor, recon: torch.Tensor) -> dict[str, float]:
        """One hinge-loss step of the discriminator, and every ``r1_every``-th time a separate R1 step.

        StyleGAN2's lazy regularisation: the R1 step is its own optimiser step with the penalty scaled by
        ``r1_every`` = k, so Adam sees k + 1 steps per k minibatches, which is what the lr / betas
        correction ``c = k / (k + 1)`` of :func:`discriminator_optimizer` compensates for.
        """
        cfg = self.config
        for p in self.d_params:
            p.requires_grad_(True)
        # counted per optimizer step: with grad_accum_steps = k the R1 step comes every r1_every D steps of k b images
        lazy_r1 = self.d_steps % cfg.r1_every == 0 and cfg.r1_gamma > 0
        reals, fakes = self._micro_batches(x.detach().float()), self._micro_batches(recon.float())
        k = len(reals)
        logs = {"d_loss": 0.0, "d_real": 0.0, "d_fake": 0.0}

        def hinge(i: int) -> torch.Tensor:
            with self._autocast():
                real_logits = self.disc(diff_augment(reals[i], cfg.diffaug_p, cfg.diffaug_cutout))
                fake_logits = self.disc(diff_augment(fakes[i], cfg.diffaug_p, cfg.diffaug_cutout))
            d_loss = hinge_d_loss(real_logits, fake_logits)
            logs["d_loss"] += float(d_loss.detach()) / k
            logs["d_real"] += float(real_logits.detach().float().mean()) / k
            logs["d_fake"] += float(fake_logits.detach().float().mean()) / k
            return d_loss

        self._discriminator_update(hinge, k, "discriminator loss", logs)
        if lazy_r1:
            logs["r1"] = 0.0

            def r1(i: int) -> torch.Tensor:
                real = reals[i].requires_grad_(True)
                with self._autocast():
                    logits = self.disc(diff_augment(real, cfg.diffaug_p, cfg.diffaug_cutout))
                penalty = r1_penalty(real, logits.float())  # on each sample's mean logit, like the hinge loss
                logs["r1"] += float(penalty.detach()) / k
                return 0.5 * cfg.r1_gamma * cfg.r1_every * penalty

            self._discriminator_update(r1, k, "R1 penalty", logs)
        self.d_steps += 1
        return logs

    def _discriminator_update(self, micro_loss, k: int, what: str, logs: dict[str, float]) -> None:
        """One discriminator optimizer step on ``micro_loss(i)`` accumulated over the k micro-batches."""
        self.d_optimizer.zero_grad(set_to_none=True)
        for i in range(k):
            loss = micro_loss(i)
            self.check_finite(loss, what, detail=str(logs))
            (loss if k == 1 else loss / k).backward()
        average_gradients(self.d_params, self.ctx)
        self.clip_and_check_gradients(self.d_params, self.config.grad_clip)
        self.d_optimizer.step()

    # -- release -------------------------------------------------------------------------------
    def release_provenance(self) -> dict[str, Any]:
        """``release.json`` facts beyond step and run: stage, weights, model, preset and data."""
        cfg = self.config
        facts = {"stage": cfg.stage, "weights": "ema", "model_name": None if cfg.init_from else cfg.model,
                 "init_from": cfg.init_from, "data": describe_data(self.data_spec), "resolution": cfg.resolution,
                 "batch_size": cfg.batch_size, "grad_accum_steps": cfg.grad_accum_steps,
                 "world_size": self.ctx.world_size,
                 # what fixes the data order and augmentation draws: two runs that agree here saw the same crops in
                 # the same order (loopvae compare pairs such runs by seed)
                 "seed": cfg.seed, "scale_jitter": list(cfg.scale_jitter), "hflip": cfg.hflip,
                 "num_workers": cfg.num_workers}
        return {k: v for k, v in facts.items() if v is not None}

    def card_facts(self) -> dict[str, Any]:
        """Model-card lines: MACs per 256² reconstruction and how to measure the metrics."""
        macs = reconstruction_macs(self.ema.module, 256)
        facts: dict[str, Any] = {}
        if self.validation:
            last = self.validation[-1]
            dataset = f"validation ({last['num_images']} images, {self.config.eval_resolution}²)"
            facts["metrics"] = {"validation PSNR (EMA weights)": f"{last['psnr']:.2f} dB on {last['num_images']} "
                                                                 f"images (step {last['step']})"}
            facts["results"] = [{"task": "image-to-image", "dataset": dataset, "type": "psnr", "name": "PSNR",
                                 "value": last["psnr"]}]
        return {**facts, "MACs per 256² reconstruction": f"{macs / 1e9:.2f} G (encode, sample, decode; batch 1)",
                "training crops": f"{self.step} steps × {self.config.batch_size} × {self.config.grad_accum_steps} "
                                  f"micro-batch(es) × {self.ctx.world_size} rank(s) of {self.config.resolution}²",
                "measure_command": "loopvae eval --checkpoint <this folder> --data <shards or image folder> --out DIR"}

    # -- loop ----------------------------------------------------------------------------------
    def train_step(self, batch: dict[str, Any]) -> dict[str, float]:
        # CPU time of this process (all its threads), not wall time: runs sharing a machine stay comparable
        start, wall = time.process_time(), time.perf_counter()
        self.vae.train()
        x = batch["image"].to(self.ctx.device, non_blocking=True).contiguous(memory_format=self.memory_format)
        logs, recon = self.generator_step(x)
        if self.disc is not None and self.step >= self.config.disc_start_step:
            logs.update(self.discriminator_step(x, recon))
        self._last_batch = (x, recon)
        self.train_seconds += time.process_time() - start
        self.train_wall_seconds += time.perf_counter() - wall
        return logs

    def validate(self, logger: RunLogger) -> dict[str, Any] | None:
        """Held-out PSNR of the EMA weights (``--val-data``); appended to the curve, logged as ``val/psnr``
        and written to ``validation.json``. ``None`` without validation data."""
        if self.val_set is None:
            return None
        result = validation_psnr(self.ema.module, self.val_set, self.ctx, self.val_metrics)
        entry = {"step": self.step, "images_seen": self.step * self.config.batch_size * self.config.grad_accum_steps
                 * self.ctx.world_size,
                 "train_seconds": round(self.train_seconds, 2),
                 "train_wall_seconds": round(self.train_wall_seconds, 2), **result}
        self.validation = [e for e in self.validation if e["step"] < self.step] + [entry]
        logger.scalars(self.step, {k: entry[k] for k in ("psnr", "ssim", "lpips", "rfid") if entry.get(k) is not None},
                       prefix="val", throughput=False)
        extra = "".join(f", {k.upper()} {entry[k]:.4f}" for k in ("lpips", "rfid") if entry.get(k) is not None)
        log.info("step %d: validation PSNR %.3f dB, SSIM %.4f%s on %d images (EMA weights)", self.step,
                 entry["psnr"], entry["ssim"], extra, entry["num_images"])
        if self.ctx.is_main:
            write_atomic(self.run_dir / "validation.json", json.dumps(self.validation, indent=2, allow_nan=False))
        return entry

    def before_final_checkpoint(self, logger: RunLogger) -> None:
        self.validate(logger)  # stored in the final checkpoint

    def after_step(self, batch: dict[str, Any], logger: RunLogger) -> None:
        cfg = self.config
        if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < self.total_steps:
            self.validate(logger)
        if self.ctx.is_main and (self.step % cfg.image_every == 0 or self.step == cfg.max_steps):
            x, recon = self._last_batch
            grid = torchvision.utils.make_grid(
                torch.cat([x[:4], recon[:4]]).float().add(1).div(2).cpu(), nrow=min(4, x.shape[0])
            )
            logger.images(self.step, "reconstruction/top_input_bottom_output", grid)

    def model_description(self) -> str:
        """What is trained: the registered name, or for a fine-tuning run the class and the ``init_from`` artifact
        (the preset's ``model`` key is not what a run started from an AutoencoderKL trains)."""
        cfg = self.config
        if cfg.init_from:
            return f"{type(self.vae).__name__} from {cfg.init_from}"
        return cfg.model

    def run(self) -> TrainResult:
        cfg = self.config
        log.info(
            "training %s stage %d on %d rank(s), %d batches/epoch/rank, from step %d to %d", self.model_description(),
            cfg.stage, self.ctx.world_size, len(self.loader), self.step, cfg.max_steps,
        )
        outcome = self.loop()
        release = self.finish_run(
            self.vae, self.ema.module, self.release_provenance(), outcome,
            {"max_steps": cfg.max_steps, "train_seconds": round(self.train_seconds, 2),
             "train_wall_seconds": round(self.train_wall_seconds, 2), "validation": self.validation},
            card_facts=self.card_facts() if outcome.stopped_by is None and self.ctx.is_main else None,
        )
        return self.result(outcome, release, self.validation)


def describe_data(spec: Any) -> str:
    """A short description of the training data for provenance: the sources, at most three named."""
    items = [str(u) for u in spec] if isinstance(spec, (list, tuple)) else [str(spec)]
    shown = ", ".join(items[:3])
    return shown + (f" and {len(items) - 3} more" if len(items) > 3 else "")


def reconstruction_macs(model: torch.nn.Module, resolution: int) -> int:
    """MACs of one ``resolution``² reconstruction (encode -> sample -> decode) at batch 1, counted on a
    meta-device copy of ``model``'s architecture (no memory, no time)."""
    with torch.device("meta"):
        twin = type(model).from_config(model.config)
        x = torch.empty(1, 3, resolution, resolution)
    return count_macs(lambda: twin.decode(encode_sample(twin, x)))


def train(
    config: TrainConfig, data: str | list[str], out_dir: str | Path, val_data: str | list[str] | None = None
) -> TrainResult:
    """Train (or resume) a LoopVAE per ``config`` on WebDataset ``data``, writing to ``out_dir``; with
    ``val_data``, held-out PSNR every ``eval_every`` steps and at the end (``validation.json``)."""
    return Trainer(config, data, out_dir, val_data).run()
