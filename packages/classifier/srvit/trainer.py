"""Classifier training (``srvit train``): DeiT / CIFAR recipes, single process or torchrun/DDP.

The shared run infrastructure of loopcore does the bookkeeping: typed config written next to the
outputs, checkpoints every ``checkpoint_every`` steps and on SIGTERM/SIGINT (model, EMA, optimizer, LR
schedule, data position), auto-resume from the newest valid checkpoint, per-step reseeding so a resumed
run draws the same augmentation and drop-path as an uninterrupted one, EMA weights, TensorBoard and a
rank-0 progress bar, and a cross-rank weight digest at the end.

``train_seconds`` (checkpointed, so cumulative across resumes; in ``train_summary.json``): CPU-seconds of this
process (``time.process_time``, every thread) spent in the optimisation loop: loading and augmenting the
batches, the steps and their logging; not the validation passes, checkpoint writes or start-up. A resumed run
counts the steps of its final trajectory once (steps redone after a kill replace the lost ones).

Loss: soft-target cross-entropy when the loader mixes (Mixup/CutMix give float targets with label
smoothing already applied), else cross-entropy with ``label_smoothing``; with deep supervision the mean
of the loss of the shared head over every supervised trajectory state.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import loopdata
from loopcore.flops import count_parameters
from loopcore.softmor import fusion_entropy
from loopdata.identity import data_identity
from loopdata.shards import canonical_urls
from looprun.optimization import EMA, make_scheduler
from looprun.run_logger import RunLogger
from looprun.training_loop import NonFiniteLossError, TrainingLoop, TrainResult

from .evaluate import evaluate_model
from .model import RecursiveViT
from .registry import create_model
from .train_config import TrainConfig

log = logging.getLogger("srvit.train")

__all__ = ["NonFiniteLossError", "SupervisedForward", "TrainResult", "Trainer", "classification_loss",
           "fusion_entropy_logs", "parameter_groups", "train"]


def classification_loss(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """Cross-entropy of ``(B, K)`` logits against int64 ``(B,)`` labels (smoothed) or float ``(B, K)`` class
    probabilities (Mixup / CutMix targets, already smoothed: ``F.cross_entropy`` takes them as they are)."""
    logits = logits.float()
    if target.is_floating_point():
        return F.cross_entropy(logits, target.float())
    return F.cross_entropy(logits, target, label_smoothing=label_smoothing)


def parameter_groups(model: RecursiveViT, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay on matrices and convolutions; none on biases, norms, 1-d step parameters and
    the embeddings the model lists in ``no_weight_decay()`` (DeiT's recipe)."""
    skip = model.no_weight_decay()
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim <= 1 or name in skip else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def fusion_entropy_logs(weights: list[torch.Tensor]) -> dict[str, float]:
    """``{"fusion_entropy/blockNN": nats}`` per fusing block, plus their mean as ``fusion_entropy``.

    ``weights``: the per-block ``(B, n, T)`` SoftMoR weights of one forward in block order (what
    :meth:`RecursiveViT.record_fusion_weights` collects). The entropy is over the ``n`` steps, averaged over
    images and tokens: ``ln n`` for uniform weights, 0 when one step takes all.
    """
    if not weights:
        return {}
    entropies = [float(fusion_entropy(w)) for w in weights]
    logs = {f"fusion_entropy/block{j:02d}": e for j, e in enumerate(entropies)}
    logs["fusion_entropy"] = sum(entropies) / len(entropies)
    return logs


class SupervisedForward(nn.Module):
    """The training forward as one module (DDP sees a single call): images -> supervised logits list."""

    def __init__(self, model: RecursiveViT) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.model.forward_supervised(x)


class Trainer(TrainingLoop):
    """Owns every piece of training state; :meth:`run` runs :class:`looprun.training_loop.TrainingLoop`."""

    def __init__(
        self, config: TrainConfig, data: str | list[str], out_dir: str | Path, val_data: str | list[str] | None = None
    ) -> None:
        super().__init__(config.validate(), out_dir, "srvit")
        with self.abandon_on_error():
            dev = self.ctx.device
            self.autocast = dev.type == "cuda" and config.precision == "bf16"

            torch.manual_seed(config.seed)  # identical initialisation on every rank
            model = create_model(config.model, **config.model_kwargs())
            if not isinstance(model, RecursiveViT):
                raise ValueError(f"srvit train trains RecursiveViT models; {config.model!r} is {type(model).__name__}")
            self.model = model.to(dev)
            self.model.set_grad_checkpointing(config.gradient_checkpointing)
            self.ema = EMA(self.model, config.ema_decay).to(dev)
            step_module = SupervisedForward(self.model)
            if config.compile:
                step_module.compile()  # in place: parameter names, checkpoints and the EMA are unchanged
            self.step_module = (
                DistributedDataParallel(step_module, device_ids=[dev.index] if dev.type == "cuda" else None)
                if self.ctx.distributed else step_module
            )
            self.loader = loopdata.make_loader(
                data, task="classification", train=True, batch_size=config.batch_size, num_workers=config.num_workers,
                resolution=config.resolution, rank=self.ctx.rank, world_size=self.ctx.world_size, seed=config.seed,
                shuffle_buffer=config.shuffle_buffer, **config.data_options(),
            )
            self.val_loader = None
            if val_data:
                self.val_loader = loopdata.make_loader(
                    val_data, task="classification", train=False, batch_size=config.batch_size,
                    num_workers=config.num_workers, resolution=config.resolution, rank=self.ctx.rank,
                    world_size=self.ctx.world_size, protocol=config.protocol, num_classes=config.num_classes,
                )
            steps_per_epoch = self.loader.num_batches
            self._total_steps = config.total_steps(steps_per_epoch)
            self.lr = config.learning_rate(self.ctx.world_size)
            self.optimizer = torch.optim.AdamW(
                parameter_groups(self.model, config.weight_decay), lr=self.lr, betas=tuple(config.betas)
            )
            self.scheduler = make_scheduler(
                self.optimizer, config.warmup_steps(steps_per_epoch), self._total_steps, config.lr_schedule,
                config.min_lr_ratio,
            )
            # Without mixing the labels are hard and smoothing belongs in the loss; with mixing the loader
            # already smoothed the soft targets.
            options = loopdata.make_options("classification", **config.data_options())
            self.loss_smoothing = 0.0 if options.mixing else options.label_smoothing
            self.validation: list[dict[str, float]] = []
            self.train_seconds = 0.0  # cumulative over resumes (see the module docstring)
            self._clock = time.process_time()
            self.data_spec = canonical_urls(data)
            self.data_identity = data_identity(self.data_spec)
            self.resume()

    @property
    def total_steps(self) -> int:
        return self._total_steps

    # -- state ---------------------------------------------------------------------------------
    def model_state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "ema": self.ema.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }

    def load_model_state(self, s: dict[str, Any]) -> None:
        self.model.load_state_dict(s["model"])
        self.ema.load_state_dict(s["ema"])
        self.optimizer.load_state_dict(s["optimizer"])
        self.scheduler.load_state_dict(s["scheduler"])

    def counters(self) -> dict[str, Any]:
        return {"validation": self.validation, "train_seconds": self.train_seconds}

    def load_counters(self, trainer_state: dict[str, Any]) -> None:
        self.validation = list(trainer_state.get("validation", []))
        # checkpoints written before the counter existed resume from 0
        self.train_seconds = float(trainer_state.get("train_seconds", 0.0))

    @property
    def eval_model(self) -> RecursiveViT:
        return self.ema.module if self.config.eval_weights == "ema" else self.model

    # -- steps ---------------------------------------------------------------------------------
    def train_step(self, batch: dict[str, Any]) -> dict[str, float]:
        cfg = self.config
        self.model.train()
        x = batch["image"].to(self.ctx.device, non_blocking=True)
        target = batch["label"].to(self.ctx.device, non_blocking=True)
        # On logging steps also record the SoftMoR weights of this forward (no extra computation).
        logging_step = (self.step + 1) % cfg.log_every == 0 and self.model.fusions is not None
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.autocast), \
                self.model.record_fusion_weights() as fusion_weights:
            supervised = self.step_module(x)
        losses = [classification_loss(logits, target, self.loss_smoothing) for logits in supervised]
        loss = torch.stack(losses).mean()
        self.check_finite(loss)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        logs: dict[str, float] = {"loss": float(loss.detach()), "loss_final": float(losses[-1].detach())}
        logs["grad_norm"] = self.clip_and_check_gradients(list(self.model.parameters()), cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.ema.update(self.model)
        hard = target if not target.is_floating_point() else target.argmax(dim=-1)
        logs["train_top1"] = float((supervised[-1].detach().argmax(dim=-1) == hard).float().mean())
        logs["lr"] = self.scheduler.get_last_lr()[0]
        if logging_step:
            logs.update(fusion_entropy_logs(fusion_weights))
        return logs

    def after_step(self, batch: dict[str, Any], logger: RunLogger) -> None:
        # the training CPU since the last mark: this step's batch (loading, augmentation), the step, its logging
        self.train_seconds += time.process_time() - self._clock
        every = self.config.eval_every
        if every and self.step % every == 0 and self.step < self.total_steps:
            self.validate(logger)
        self._clock = time.process_time()  # the validation pass is not training

    def save(self, reason: str) -> None:
        super().save(reason)
        self._clock = time.process_time()  # nor are the final validation and the checkpoint write

    def before_final_checkpoint(self, logger: RunLogger) -> None:
        self.validate(logger)  # stored in the final checkpoint

    def validate(self, logger: RunLogger) -> dict[str, float] | None:
        if self.val_loader is None:
            return None
        counts = evaluate_model(self.eval_model, self.val_loader, self.ctx.device, autocast=self.autocast,
                                ctx=self.ctx)
        result = {"step": self.step, "top1": counts.top1 / max(counts.num_images, 1),
                  "top5": counts.top5 / max(counts.num_images, 1), "num_images": counts.num_images}
        self.validation.append(result)
        logger.scalars(self.step, {"top1": result["top1"], "top5": result["top5"]}, prefix="val", throughput=False)
        log.info("step %d: validation top-1 %.4f, top-5 %.4f on %d images (%s weights)", self.step,
                 result["top1"], result["top5"], counts.num_images, self.config.eval_weights)
        return result

    # -- loop ----------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        cfg = self.config
        parameters = count_parameters(self.model)
        log.info(
            "training %s (%.2fM parameters) on %d rank(s): %d batches/epoch/rank, steps %d -> %d, peak lr %.3g",
            cfg.model, parameters / 1e6, self.ctx.world_size, len(self.loader),
            self.step, self.total_steps, self.lr,
        )
        self._clock = time.process_time()
        outcome = self.loop()
        release = self.finish_run(
            self.model, self.eval_model,
            {"weights": cfg.eval_weights, "model": cfg.model, "protocol": cfg.protocol}, outcome,
            {"peak_lr": self.lr, "validation": self.validation, "epochs": self.step / max(self.loader.num_batches, 1),
             "parameters": parameters, "train_seconds": round(self.train_seconds, 2)},
            card_facts=self.card_facts(),
        )
        return self.result(outcome, release, self.validation)


    def card_facts(self) -> dict[str, Any]:
        """Model-card lines: the protocol, epochs and the last validation (top-1/top-5 with image count)."""
        cfg = self.config
        facts: dict[str, Any] = {"protocol": f"{cfg.protocol} at {cfg.resolution}², {cfg.num_classes} classes",
                                 "measure_command": "srvit eval --checkpoint <this folder> --data <shards> --out DIR"}
        if self.validation:
            last = self.validation[-1]
            facts["metrics"] = {
                "validation top-1": f"{100 * last['top1']:.2f}% on {last['num_images']} images (step {last['step']})",
                "validation top-5": f"{100 * last['top5']:.2f}%" if "top5" in last else "not measured",
            }
            dataset = f"validation ({last['num_images']} images)"
            facts["results"] = [{"task": "image-classification", "dataset": dataset, "type": "accuracy",
                                 "name": "top-1", "value": 100 * last["top1"]}]
            if "top5" in last:
                facts["results"].append({"task": "image-classification", "dataset": dataset, "type": "accuracy",
                                         "name": "top-5", "value": 100 * last["top5"]})
        return facts


def train(
    config: TrainConfig, data: str | list[str], out_dir: str | Path, val_data: str | list[str] | None = None
) -> TrainResult:
    """Train (or resume) a classifier per ``config`` on WebDataset ``data``, writing to ``out_dir``."""
    return Trainer(config, data, out_dir, val_data).run()
