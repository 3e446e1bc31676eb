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
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from loopdata.identity import data_identity, first_set_difference, only_mtimes_differ

from .checkpoint import CheckpointManager, CheckpointSaveError, CorruptCheckpointError, read_metadata, write_atomic
from .config import ConfigError, save_config, upgrade_renamed_keys
from .determinism import seed_step, state_digest
from .distributed import (
    DistributedContext,
    any_rank,
    gather_objects,
    init_distributed,
    mean_across_ranks,
    shutdown_distributed,
    sum_across_ranks,
)
from .output_dir import prepare_output_dir
from .release import save_release
from .run_lock import RunLock
from .run_logger import RunLogger, setup_run_logging, teardown_run_logging
from .signals import StopSignal

# Config keys a resumed run may change: they decide when to stop, save and log, never what is computed
# (``compile`` changes how, not what: the same graph, float rounding aside; ``accept_data_mtime`` lets a resume
# accept data whose modification times alone moved).
RESUMABLE_CHANGES = frozenset(
    {"max_steps", "epochs", "checkpoint_every", "keep_checkpoints", "log_every", "image_every", "eval_every",
     "eval_resolution", "eval_images",
     "progress_bar", "compile", "tracker", "accept_data_mtime"}
)


@runtime_checkable
class TrainingLoader(Protocol):
    """What :class:`TrainingLoop` needs from ``self.loader`` (``loopdata.make_loader(..., train=True)`` is one).

    One iteration is one epoch of this rank's batches (dicts holding at least ``"image"``); after it ends the
    loader has moved itself to the next epoch. ``state_dict`` / ``load_state_dict`` carry the data position
    into checkpoints, so a resumed run continues with the batch an uninterrupted one would have drawn.
    """

    num_samples: int  # samples this rank reads per epoch
    corrupt_count: int  # undecodable samples skipped so far (all epochs)
    epoch_corrupt: list[str]  # keys of the undecodable samples found in the epoch that just ended

    def __iter__(self) -> Iterator[dict[str, Any]]: ...

    def __len__(self) -> int: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def exclude_corrupt(self, keys: list[str]) -> None:
        """Leave ``keys`` (summed over ranks) out of the next epochs' plans."""
        ...


class NonFiniteLossError(RuntimeError):
    """The loss, the gradients or the state became NaN/Inf; the run stopped without writing a checkpoint."""


def _json_normal(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists), for comparing saved and current configs."""
    return json.loads(json.dumps(value, default=str))


def first_non_finite(obj: Any, prefix: str = "") -> str | None:
    """Name of the first floating tensor inside ``obj`` (nested dicts/lists) holding NaN/Inf, else ``None``."""
    if isinstance(obj, torch.Tensor):
        bad = obj.is_floating_point() and not bool(torch.isfinite(obj).all())
        return (prefix or "tensor") if bad else None
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return None
    for key, value in items:
        found = first_non_finite(value, f"{prefix}.{key}" if prefix else str(key))
        if found is not None:
            return found
    return None


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


DATA_IDENTITY_FILE = "data_identity.json"  # in the run folder: what the data held when the run started


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
        self.logger_name = logger_name
        self.created_run_dir = not self.run_dir.exists()
        # what this run adds to an existing folder, removed again if it fails before training
        self._new_files = [self.run_dir / n for n in (".lock", "train.log") if not (self.run_dir / n).exists()]
        self.lock: RunLock | None = None
        if self.ctx.is_main:
            prepare_output_dir(self.run_dir)  # a read-only or unwritable --out: one line naming it, no traceback
            self.lock = RunLock(self.run_dir)  # before anything is written: a second run fails here
        setup_run_logging(logger_name, self.run_dir, self.ctx.is_main, self.ctx.rank)
        self.log = logging.getLogger(f"{logger_name}.train")
        self.checkpoints = CheckpointManager(self.run_dir / "checkpoints", config.keep_checkpoints, self.ctx.is_main)
        self.checkpoints.recover()
        self.step = 0
        self.resumed_from: Path | None = None
        self.loader: TrainingLoader | None = None  # set by the subclass before resume()
        self.data_spec: list[str] | None = None  # the shards trained on (set by the subclass), checked on resume
        # what they hold (loopdata.identity: shard size/mtime, folder chunk file lists), checked on resume too
        self.data_identity: list[dict[str, Any]] | None = None
        self.data_mtime_accepted = False  # resumed with accept_data_mtime over data whose times alone moved

    @contextmanager
    def abandon_on_error(self) -> Iterator[None]:
        """Wrap the rest of a subclass's ``__init__``: on any error, :meth:`abandon` and re-raise."""
        try:
            yield
        except BaseException:
            self.abandon()
            raise

    def clip_and_check_gradients(self, parameters: list[torch.nn.Parameter], max_norm: float) -> float:
        """Clip the gradients to ``max_norm`` (no clipping when ``<= 0``) and stop every rank, before the
        optimizer step, if their norm is NaN/Inf; returns the norm."""
        norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm if max_norm > 0 else float("inf"))
        self.check_finite(norm, "gradient norm")
        return float(norm)

    def abandon(self) -> None:
        """Undo a construction that failed before training: close the run's log handlers and release its
        lock; a folder this run created is removed, and in an existing one the files it added, as long as
        no checkpoint was written."""
        teardown_run_logging(self.logger_name)
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        if not self.ctx.is_main or self.checkpoints.list_checkpoints():
            return
        if self.created_run_dir:
            import shutil

            shutil.rmtree(self.run_dir, ignore_errors=True)
            return
        for path in self._new_files:
            path.unlink(missing_ok=True)

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
        """Load the newest valid checkpoint, if any, then write ``config.yaml`` (call at the end of the
        subclass's ``__init__``).

        A checkpoint made with another config (beyond :data:`RESUMABLE_CHANGES`) or other data is refused
        with the differing keys, before any state is loaded and before ``config.yaml`` is touched.
        """
        required = [*self.model_state(), "trainer"]
        errors: list[CorruptCheckpointError] = []
        loaded = self.checkpoints.load_latest(map_location=self.ctx.device, required=required, errors=errors)
        if loaded is not None:
            self.check_resumable(loaded.metadata)
        elif self.checkpoints.list_checkpoints():
            self.refuse_unusable_checkpoints(errors)
        if self.ctx.is_main:
            save_config(self.config, self.run_dir / "config.yaml")
            if (loaded is None or self.data_mtime_accepted) and self.data_identity is not None:
                # the full file lists, to name a later change (the new times, once accepted)
                write_atomic(self.run_dir / DATA_IDENTITY_FILE, json.dumps(
                    data_identity(self.data_spec, compact=False), allow_nan=False))
        if loaded is None:
            return
        self.load_model_state(loaded.state)
        trainer = loaded.state["trainer"]
        self.step = int(trainer["step"])
        self.load_counters(trainer)
        self.loader.load_state_dict(trainer["data"])
        self.resumed_from = loaded.path
        self.log.info("resumed from %s at step %d", loaded.path, self.step)

    def refuse_unusable_checkpoints(self, errors: list[CorruptCheckpointError]) -> None:
        """Checkpoints exist but none verifies: starting from step 0 in this folder would overwrite them and the
        release. Raise :class:`ConfigError` when the newest readable one was made with another configuration
        (e.g. a stage-2 config on a stage-1 run, whose checkpoints lack the discriminator), else
        :class:`CorruptCheckpointError` naming every checkpoint and why it failed. Nothing is written."""
        present = self.checkpoints.list_checkpoints()
        for path in reversed(present):
            metadata = read_metadata(path)
            if metadata is not None and isinstance(metadata.get("config"), dict):
                self.check_resumable(metadata)  # the clearer reason, when the config differs
                break
        reasons = "; ".join(str(err) for err in errors) or "none verifies"
        raise CorruptCheckpointError(
            f"{self.checkpoints.directory} holds {len(present)} checkpoint(s) ({', '.join(p.name for p in present)}) "
            f"but none can be resumed: {reasons}. Training from step 0 here would overwrite them and the release, "
            f"so nothing was changed: restore the damaged files, rerun with the config that wrote them, or move "
            f"{self.checkpoints.directory} away (or choose a new --out) to start afresh"
        )

    def check_resumable(self, metadata: dict[str, Any]) -> None:
        """Raise :class:`ConfigError` when the checkpoint's config or data differ from this run's."""
        saved, current = metadata.get("config"), self._comparable(_json_normal(asdict(self.config)))
        problems = []
        if isinstance(saved, dict):
            saved = self._comparable(saved)
            # a key added to the schema after the checkpoint was written held its default then
            defaults = {f.name: _json_normal(f.default) for f in fields(self.config)
                        if f.default is not MISSING and f.name not in saved}
            saved = {**defaults, **saved}
            for key in sorted(set(saved) | set(current)):
                if key not in RESUMABLE_CHANGES and saved.get(key) != current.get(key):
                    problems.append(f"{key}: {saved.get(key)!r} in the checkpoint, {current.get(key)!r} now")
        if metadata.get("data") is not None and self.data_spec is not None and metadata["data"] != self.data_spec:
            problems.append(f"data: {len(metadata['data'])} shard(s) {metadata['data'][:2]}... in the checkpoint, "
                            f"{len(self.data_spec)} shard(s) {self.data_spec[:2]}... now")
        if not problems and metadata.get("data_identity") and self.data_identity is not None:
            difference = first_set_difference(metadata["data_identity"], self.data_identity)
            full = self.run_dir / DATA_IDENTITY_FILE
            recorded = metadata["data_identity"]
            if difference is not None and full.is_file():  # name the file, not just the chunk
                recorded = json.loads(full.read_text())
                difference = first_set_difference(recorded, data_identity(self.data_spec, compact=False)) or difference
            if difference is not None and only_mtimes_differ(recorded, data_identity(self.data_spec, compact=False)):
                # a copy without -p, a restore or a `touch`: the same files and sizes, only the times moved
                if getattr(self.config, "accept_data_mtime", False):
                    self.log.warning("data: %s; resuming anyway (accept_data_mtime=true)", difference)
                    self.data_mtime_accepted = True
                else:
                    raise ConfigError(
                        f"{self.run_dir}: resuming is refused until you confirm the data: {difference}. Only "
                        "modification times differ (the same files with the same sizes, as after a copy without -p, "
                        "a restore or a touch). If the content is unchanged, rerun the same command with "
                        "--set accept_data_mtime=true to resume; otherwise choose a new --out"
                    )
            elif difference is not None:
                problems.append(f"data: {difference} (the same shards or folder now hold other data)")
        if problems:
            raise ConfigError(
                f"{self.run_dir} holds a run with another configuration; resuming would silently change it:\n  "
                + "\n  ".join(problems)
                + f"\nRerun with the original settings, or choose a new --out. Keys that may change on resume: "
                f"{', '.join(sorted(RESUMABLE_CHANGES))}."
            )

    def _comparable(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` with renamed keys under their new names, so a run checkpointed before a rename resumes.

        Uses the schema's ``RENAMED_KEYS`` and, when it has one, its ``upgrade_model_overrides`` (the model's
        renamed arguments). Applied to both sides of the comparison; no warnings, since nobody edits a
        checkpoint's stored config.
        """
        schema = type(self.config)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            config = upgrade_renamed_keys(config, getattr(schema, "RENAMED_KEYS", {}), "checkpoint config")
            upgrade = getattr(schema, "upgrade_model_overrides", None)
            if upgrade is not None and isinstance(config.get("model_overrides"), dict):
                config = {**config, "model_overrides": upgrade(config["model_overrides"])}
        return config

    def save(self, reason: str) -> None:
        """Checkpoint the current state (main rank writes); every rank learns whether it worked.

        Refuses (:class:`NonFiniteLossError`) to write a state holding NaN/Inf; a failed write raises
        :class:`CheckpointSaveError` on every rank.
        """
        state = self.state()
        bad = first_non_finite(state)
        if any_rank(bad is not None, self.ctx):
            last = self.checkpoints.list_checkpoints()
            raise NonFiniteLossError(
                f"non-finite values in {bad or 'the state of another rank'} at step {self.step}; refusing to save "
                f"them. The last good checkpoint {last[-1] if last else '(none yet)'} is untouched"
            )
        error = None
        try:
            path = self.checkpoints.save(self.step, state, {"reason": reason, "config": asdict(self.config),
                                                            "data": self.data_spec,
                                                            "data_identity": self.data_identity})
        except CheckpointSaveError as err:
            error, path = err, None
        if any_rank(error is not None, self.ctx):
            raise error or CheckpointSaveError(f"the main rank could not write the checkpoint of step {self.step}")
        if path is not None:
            self.log.info("checkpoint %s (%s)", path, reason)

    def check_finite(self, loss: torch.Tensor, what: str = "loss", detail: str = "") -> None:
        """Stop every rank (without saving) when ``loss`` is NaN/Inf on any of them; ``detail``: the step's logs.

        Trainers call it on the loss and on the gradient norm (before ``optimizer.step``), so a step whose
        gradients are NaN while its loss is finite never reaches the weights.
        """
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
        logger = RunLogger(self.run_dir, self.total_steps, self.step, ctx.is_main, cfg.progress_bar,
                           tracker=getattr(cfg, "tracker", "tensorboard"), config=_json_normal(asdict(cfg)))
        outcome = LoopOutcome(None, {})
        batches = iter(self.loader)
        try:
            with StopSignal() as stop:
                while self.step < self.total_steps:
                    try:
                        batch = next(batches)
                    except StopIteration:  # the loader has moved itself to the next epoch
                        # Plan the next epochs without the samples found undecodable (summed over ranks, so
                        # every rank keeps the same number of batches), or good ones would repeat.
                        self.loader.exclude_corrupt(sum_across_ranks(self.loader.epoch_corrupt, ctx))
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
                    # A stop that arrives during the last step stops nothing: the run is complete, and its final
                    # work (e.g. the last validation) must be in the checkpoint, or a resume would finish without it.
                    last = self.step == self.total_steps
                    stop_now = stop_now and not last
                    if stop_now or self.step % cfg.checkpoint_every == 0 or last:
                        if last:
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
        summary: dict[str, Any] | None = None, card_facts: dict[str, Any] | None = None,
    ) -> Path | None:
        """End of a run: cross-rank weight check, the release artifact when the run completed, and
        ``train_summary.json`` (step, resume and stop information, per-rank digests and data statistics,
        last logs, plus ``summary``). ``card_facts`` go into the release's model card. Returns the release
        directory (main rank, completed runs)."""
        digests = self.check_ranks_agree(model)
        ranks = self.rank_reports()
        release = None
        if not self.ctx.is_main:
            return None
        if outcome.stopped_by is None:
            release = save_release(release_model, self.run_dir / "release",
                                   {"step": self.step, "run_dir": str(self.run_dir), **provenance}, card_facts)
            self.log.info("release artifact (%s weights) in %s", provenance.get("weights", "model"), release)
        data = {
            "step": self.step, "total_steps": self.total_steps, "stopped_by": outcome.stopped_by,
            "resumed_from": str(self.resumed_from) if self.resumed_from else None,
            "world_size": self.ctx.world_size, "weights_sha256_per_rank": digests, "ranks": ranks,
            "last_logs": outcome.last_logs, "release": str(release) if release else None, **(summary or {}),
        }
        write_atomic(self.run_dir / "train_summary.json", json.dumps(data, indent=2))
        if self.lock is not None:  # the run is over: the folder may be trained on again
            self.lock.release()
        return release

    def result(self, outcome: LoopOutcome, release: Path | None, validation: list | None = None) -> TrainResult:
        return TrainResult(self.run_dir, self.step, outcome.stopped_by, release, outcome.last_logs, outcome.history,
                           self.resumed_from, list(validation or []))


def run_training_command(prog: str, train: Any, config: Any, data: str, out: str, val_data: str | None,
                         summary: Any = None) -> int:
    """A ``<prog> train`` command's run and report, shared by ``loopvae train`` and ``srvit train``:
    ``train(config, data, out, val_data)`` -> :class:`TrainResult`; a non-finite loss is one line and exit status
    3; a stop by signal says how to resume; ``summary(result)`` may add to the finished line (e.g. validation
    top-1). The process group's distributed state is shut down however the run ends."""
    try:
        result = train(config, data, out, val_data)
    except NonFiniteLossError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 3
    finally:
        shutdown_distributed()
    if result.stopped_by:
        print(f"stopped at step {result.step} ({result.stopped_by}); rerun the same command to resume")
        return 0
    extra = summary(result) if summary is not None else ""
    print(f"finished at step {result.step}; release artifact: {result.release_dir}{extra}")
    return 0
