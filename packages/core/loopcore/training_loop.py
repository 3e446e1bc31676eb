"""The step loop every loopvision training command shares (``loopvae train``, ``srvit train``).

:class:`TrainingLoop` owns what does not depend on the model: the run directory and its resolved
config, logging, checkpoints (save, auto-resume from the newest valid one, keep the last few), the
per-step reseeding that makes resumed runs reproduce uninterrupted ones, the data-epoch rollover, the
stop signal agreed on by every rank, TensorBoard/progress logging and the cross-rank weight check.
A subclass builds its model, optimizers and ``self.loader`` and implements the template methods
:meth:`model_state`, :meth:`load_model_state` and :meth:`train_step` (optionally
:meth:`counters`, :meth:`after_step`, :meth:`before_final_checkpoint`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .checkpoint import CheckpointManager
from .config import save_config
from .determinism import seed_step, state_digest
from .distributed import DistributedContext, any_rank, gather_objects, init_distributed, mean_across_ranks
from .release import save_release
from .run_logger import RunLogger, setup_run_logging
from .signals import StopSignal


class NonFiniteLossError(RuntimeError):
    """The loss became NaN/Inf; the run stopped without writing a checkpoint."""


@dataclass
class LoopOutcome:
    """How :meth:`TrainingLoop.loop` ended: ``stopped_by`` is ``None`` when it reached ``total_steps``."""

    stopped_by: str | None
    last_logs: dict[str, float]
    history: list[dict[str, float]] = field(default_factory=list)  # this rank's per-step logs


@dataclass
class TrainResult:
    """What a training command returns: where it ran, how far, how it ended, and its logs."""

    run_dir: Path
    step: int
    stopped_by: str | None
    release_dir: Path | None
    last_logs: dict[str, float]
    history: list[dict[str, float]]  # this rank's per-step logs (``step`` included)
    resumed_from: Path | None = None
    validation: list[dict[str, float]] = field(default_factory=list)  # per validation: step and metrics


class TrainingLoop:
    """Base of a training run (see module docstring).

    Args:
        config: the run's dataclass config; needs ``device``, ``seed``, ``keep_checkpoints``,
            ``checkpoint_every``, ``log_every`` and ``progress_bar``.
        out_dir: run directory (created on the main rank, ``config.yaml`` written into it).
        logger_name: the package logger to route to stderr and ``train.log`` (e.g. ``"srvit"``).
    """

    def __init__(self, config: Any, out_dir: str | Path, logger_name: str) -> None:
        self.config = config
        self.ctx: DistributedContext = init_distributed(config.device)
        self.run_dir = Path(out_dir)
        if self.ctx.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_config(config, self.run_dir / "config.yaml")
        setup_run_logging(logger_name, self.run_dir, self.ctx.is_main, self.ctx.rank)
        self.log = logging.getLogger(f"{logger_name}.train")
        self.checkpoints = CheckpointManager(self.run_dir / "checkpoints", config.keep_checkpoints, self.ctx.is_main)
        self.step = 0
        self.resumed_from: Path | None = None
        self.loader: Any = None  # set by the subclass before resume()

    # -- template methods ----------------------------------------------------------------------
    @property
    def total_steps(self) -> int:
        return self.config.max_steps

    def model_state(self) -> dict[str, Any]:
        """Everything but the loop counters and the data position (models, EMA, optimizers, schedules)."""
        raise TypeError(f"{type(self).__name__} must implement model_state()")

    def load_model_state(self, state: dict[str, Any]) -> None:
        raise TypeError(f"{type(self).__name__} must implement load_model_state()")

    def counters(self) -> dict[str, Any]:
        """Extra loop state stored under ``state["trainer"]`` (e.g. discriminator steps)."""
        return {}

    def load_counters(self, trainer_state: dict[str, Any]) -> None:
        """Restore what :meth:`counters` saved."""

    def train_step(self, batch: dict[str, Any]) -> dict[str, float]:
        """One optimisation step on ``batch``; returns scalar logs."""
        raise TypeError(f"{type(self).__name__} must implement train_step()")

    def after_step(self, batch: dict[str, Any], logger: RunLogger) -> None:
        """Called after each step (the step counter already advanced): images, periodic validation."""

    def before_final_checkpoint(self, logger: RunLogger) -> None:
        """Called once when the last step is done, before its checkpoint (e.g. a final validation)."""

    # -- state ---------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {**self.model_state(),
                "trainer": {"step": self.step, "data": self.loader.state_dict(), **self.counters()}}

    def resume(self) -> None:
        """Load the newest valid checkpoint, if any (call at the end of the subclass's ``__init__``)."""
        loaded = self.checkpoints.load_latest(map_location=self.ctx.device)
        if loaded is None:
            return
        self.load_model_state(loaded.state)
        trainer = loaded.state["trainer"]
        self.step = int(trainer["step"])
        self.load_counters(trainer)
        self.loader.load_state_dict(trainer["data"])
        self.resumed_from = loaded.path
        self.log.info("resumed from %s at step %d", loaded.path, self.step)

    def save(self, reason: str) -> None:
        path = self.checkpoints.save(self.step, self.state(), {"reason": reason, "config": asdict(self.config)})
        if path is not None:
            self.log.info("checkpoint %s (%s)", path, reason)

    def check_finite(self, loss: torch.Tensor, what: str = "loss", detail: str = "") -> None:
        """Stop every rank (without saving) when ``loss`` is NaN/Inf on any of them; ``detail``: the step's logs."""
        if any_rank(not bool(torch.isfinite(loss)), self.ctx):
            last = self.checkpoints.list_checkpoints()
            raise NonFiniteLossError(
                f"non-finite {what} at step {self.step}{f' ({detail})' if detail else ''}; stopped without saving. "
                f"The last good checkpoint "
                f"{last[-1] if last else '(none yet)'} is untouched: lower lr, check the data, or resume from it"
            )

    # -- loop ----------------------------------------------------------------------------------
    def loop(self) -> LoopOutcome:
        """Run steps until ``total_steps`` or a stop signal (checkpointing on the way); see module docstring."""
        cfg, ctx = self.config, self.ctx
        logger = RunLogger(self.run_dir, self.total_steps, self.step, ctx.is_main, cfg.progress_bar)
        outcome = LoopOutcome(None, {})
        batches = iter(self.loader)
        try:
            with StopSignal() as stop:
                while self.step < self.total_steps:
                    try:
                        batch = next(batches)
                    except StopIteration:
                        self.loader.set_epoch(self.loader.epoch + 1)
                        batches = iter(self.loader)
                        continue
                    seed_step(cfg.seed, ctx.rank, self.step)
                    logs = self.train_step(batch)
                    self.step += 1
                    outcome.history.append({"step": self.step, **logs})
                    logger.step(batch["image"].shape[0] * ctx.world_size)
                    if self.step % cfg.log_every == 0 or self.step == self.total_steps:
                        logs = mean_across_ranks(logs, ctx)
                        logger.scalars(self.step, logs)
                    outcome.last_logs = logs
                    self.after_step(batch, logger)
                    stop_now = any_rank(stop.requested is not None, ctx)
                    if stop_now or self.step % cfg.checkpoint_every == 0 or self.step == self.total_steps:
                        if self.step == self.total_steps and not stop_now:
                            self.before_final_checkpoint(logger)
                        self.save("signal" if stop_now else "periodic")
                    if stop_now:
                        outcome.stopped_by = stop.requested or "signal on another rank"
                        self.log.info("stopping at step %d on %s", self.step, outcome.stopped_by)
                        break
        finally:
            logger.close()
        return outcome

    def rank_reports(self) -> list[dict[str, Any]]:
        """Every rank's data statistics (rank, batches and samples per epoch, corrupt samples skipped)."""
        report = {"rank": self.ctx.rank, "batches_per_epoch": len(self.loader),
                  "samples_per_epoch": self.loader.num_samples, "corrupt_samples": self.loader.corrupt_count}
        return gather_objects(report, self.ctx)  # type: ignore[return-value]

    def check_ranks_agree(self, model: nn.Module) -> list[str]:
        """sha256 of ``model``'s weights on every rank; raises if they differ (a DDP bug or desync)."""
        digests = gather_objects(state_digest(model), self.ctx)
        if len(set(digests)) != 1:
            raise RuntimeError(f"ranks hold different weights after training: {digests}")
        return digests  # type: ignore[return-value]

    def finish_run(
        self, model: nn.Module, release_model: nn.Module, provenance: dict[str, Any], outcome: LoopOutcome,
        summary: dict[str, Any] | None = None,
    ) -> Path | None:
        """End of a run: cross-rank weight check, the release artifact when the run completed, and
        ``train_summary.json`` (step, resume and stop information, per-rank digests and data statistics,
        last logs, plus ``summary``). Returns the release directory (main rank, completed runs)."""
        digests = self.check_ranks_agree(model)
        ranks = self.rank_reports()
        release = None
        if not self.ctx.is_main:
            return None
        if outcome.stopped_by is None:
            release = save_release(release_model, self.run_dir / "release",
                                   {"step": self.step, "run_dir": str(self.run_dir), **provenance})
            self.log.info("release artifact (%s weights) in %s", provenance.get("weights", "model"), release)
        data = {
            "step": self.step, "total_steps": self.total_steps, "stopped_by": outcome.stopped_by,
            "resumed_from": str(self.resumed_from) if self.resumed_from else None,
            "world_size": self.ctx.world_size, "weights_sha256_per_rank": digests, "ranks": ranks,
            "last_logs": outcome.last_logs, "release": str(release) if release else None, **(summary or {}),
        }
        (self.run_dir / "train_summary.json").write_text(json.dumps(data, indent=2))
        return release

    def result(self, outcome: LoopOutcome, release: Path | None, validation: list | None = None) -> TrainResult:
        return TrainResult(self.run_dir, self.step, outcome.stopped_by, release, outcome.last_logs, outcome.history,
                           self.resumed_from, list(validation or []))
