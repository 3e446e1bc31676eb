"""Experiment trackers behind :class:`looprun.run_logger.RunLogger`: the same scalars, images and text go to
TensorBoard (``tb/``, the default), Weights & Biases, or nowhere.

``tracker: wandb`` needs the optional extra (``pip install 'loopvision[wandb]'``). Without a login
(``WANDB_API_KEY`` unset and no ``WANDB_MODE``) it runs offline, writing ``<run>/wandb/offline-run-*`` that
``wandb sync`` uploads later. The run id is drawn when a run starts and kept in ``<run>/wandb_run_id``: a resumed
run continues the same W&B run, a new run in a reused folder (or at the same path elsewhere) gets its own.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from pathlib import Path
from typing import Any

import torch

from .checkpoint import write_atomic
from .config import ConfigError

TRACKERS = ("tensorboard", "wandb", "none")
WANDB_HINT = "pip install 'loopvision[wandb]'"


def check_tracker(name: str) -> None:
    """:class:`looprun.config.ConfigError` for an unknown tracker or a missing optional package (called by the
    training configs' ``validate``, before any file is written)."""
    if name not in TRACKERS:
        raise ConfigError(f"tracker must be one of {', '.join(TRACKERS)}, got {name!r}")
    if name == "wandb":
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ConfigError(f"tracker: wandb needs the wandb package, which is not installed: {WANDB_HINT} "
                             "(or use tracker: tensorboard)") from None


class TensorBoardTracker:
    """``torch.utils.tensorboard.SummaryWriter`` events in ``run_dir/tb``."""

    def __init__(self, run_dir: Path, config: dict[str, Any] | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tb"))

    def scalar(self, tag: str, value: float, step: int) -> None:
        self.writer.add_scalar(tag, value, step)

    def image(self, tag: str, grid: torch.Tensor, step: int) -> None:
        self.writer.add_image(tag, grid, step)

    def text(self, tag: str, text: str, step: int) -> None:
        self.writer.add_text(tag, text, step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class WandbTracker:
    """A Weights & Biases run (online with a login, offline otherwise) in ``run_dir/wandb``."""

    def __init__(self, run_dir: Path, config: dict[str, Any] | None = None, project: str | None = None,
                 resumed: bool = False) -> None:
        import wandb

        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        run_id = wandb_run_id(run_dir, resumed)
        self.run = wandb.init(project=project or os.environ.get("WANDB_PROJECT", "loopvision"), dir=str(run_dir),
                              name=run_dir.name, id=run_id, resume="allow", mode=mode, config=config or {},
                              reinit="create_new")
        self._wandb = wandb

    def scalar(self, tag: str, value: float, step: int) -> None:
        self.run.log({tag: value}, step=step)

    def image(self, tag: str, grid: torch.Tensor, step: int) -> None:
        array = (grid.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
        self.run.log({tag: self._wandb.Image(array)}, step=step)

    def text(self, tag: str, text: str, step: int) -> None:
        self.run.log({tag: self._wandb.Html(f"<pre>{text}</pre>")}, step=step)

    def close(self) -> None:
        self.run.finish()


WANDB_ID_FILE = "wandb_run_id"  # in the run folder: the W&B run this training run logs to


def wandb_run_id(run_dir: Path, resumed: bool) -> str:
    """The W&B run id of the training run in ``run_dir``: the one stored in ``run_dir/wandb_run_id`` when the run
    resumes from a checkpoint, a fresh random one (stored there) when it starts from step 0. A resumed run without
    a stored id (started before ids were stored) keeps the id it had then, the hash of its folder path."""
    path = run_dir / WANDB_ID_FILE
    if resumed:
        stored = path.read_text().strip() if path.is_file() else ""
        if re.fullmatch(r"[a-z0-9]{8,64}", stored):
            return stored
        run_id = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:16]
    else:
        run_id = uuid.uuid4().hex[:16]
    write_atomic(path, run_id + "\n")
    return run_id


class NullTracker:
    """``tracker: none``: nothing is written (the run's log and checkpoints still are)."""

    def __init__(self, run_dir: Path, config: dict[str, Any] | None = None) -> None:
        pass

    def scalar(self, tag: str, value: float, step: int) -> None:
        pass

    def image(self, tag: str, grid: torch.Tensor, step: int) -> None:
        pass

    def text(self, tag: str, text: str, step: int) -> None:
        pass

    def close(self) -> None:
        pass


def make_tracker(name: str, run_dir: str | Path, config: dict[str, Any] | None = None, resumed: bool = False):
    """The tracker called ``name`` for ``run_dir`` (``config``: the run's settings, recorded by W&B; ``resumed``:
    the run continues from a checkpoint, so W&B continues its run instead of starting a new one)."""
    check_tracker(name)
    if name == "wandb":
        return WandbTracker(Path(run_dir), config, resumed=resumed)
    cls = {"tensorboard": TensorBoardTracker, "none": NullTracker}[name]
    return cls(Path(run_dir), config)
