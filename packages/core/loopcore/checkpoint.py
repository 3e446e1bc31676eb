"""Crash-safe training checkpoints: one directory per save, plain tensors, checksums, auto-resume.

Layout (``<run>/checkpoints/step-00001000/``): one ``<name>.pt`` per state entry (model, EMA,
optimizers, scheduler, trainer state, ...) holding only tensors and Python primitives, so
``torch.load(..., weights_only=True)`` reads it, plus ``metadata.json`` with the step, free-form
metadata and the sha256 of every file. A save is written to a temporary directory and renamed into
place (``os.replace``), so a checkpoint directory either is complete or does not exist; a file
damaged later is caught by its checksum and the previous checkpoint is used instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)
_STEP_DIR = re.compile(r"^step-(\d{8,})$")
FORMAT_VERSION = 1


class CorruptCheckpointError(RuntimeError):
    """A checkpoint directory is incomplete or a file fails its checksum or cannot be read."""


@dataclass
class LoadedCheckpoint:
    path: Path
    step: int
    state: dict[str, Any]
    metadata: dict[str, Any]


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file (streamed)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class CheckpointManager:
    """Save, prune and load step checkpoints under ``directory``.

    Args:
        directory: where the ``step-<8-digit step>`` folders live.
        keep_last: how many complete checkpoints to keep (older ones are deleted after a save).
        is_main: only the main rank writes; every rank may load.
    """

    def __init__(self, directory: str | Path, keep_last: int = 3, is_main: bool = True) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.is_main = is_main

    def step_dir(self, step: int) -> Path:
        return self.directory / f"step-{step:08d}"

    def list_checkpoints(self) -> list[Path]:
        """Checkpoint directories with a ``metadata.json``, oldest first (temporary ones are ignored)."""
        if not self.directory.is_dir():
            return []
        found = [
            p for p in self.directory.iterdir()
            if p.is_dir() and _STEP_DIR.match(p.name) and (p / "metadata.json").is_file()
        ]
        return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))

    def save(self, step: int, state: dict[str, Any], metadata: dict[str, Any] | None = None) -> Path | None:
        """Write ``state`` (``{name: picklable-with-weights_only object}``) as the checkpoint of ``step``."""
        if not self.is_main:
            return None
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.step_dir(step)
        tmp = self.directory / f".tmp-{final.name}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        files = {}
        for name, obj in state.items():
            target = tmp / f"{name}.pt"
            with open(target, "wb") as f:
                torch.save(obj, f)
                f.flush()
                os.fsync(f.fileno())
            files[target.name] = sha256_file(target)
        meta = {
            "format": FORMAT_VERSION, "step": step, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "files": files, **(metadata or {}),
        }
        (tmp / "metadata.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
        _fsync_dir(tmp)
        if final.exists():  # the same step saved again (e.g. a signal right after a periodic save)
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(self.directory)
        self._prune()
        return final

    def _prune(self) -> None:
        for old in self.list_checkpoints()[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)

    def load(self, path: str | Path, map_location: str | torch.device = "cpu") -> LoadedCheckpoint:
        """Load and verify one checkpoint directory; raises :class:`CorruptCheckpointError`."""
        path = Path(path)
        meta_path = path / "metadata.json"
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise CorruptCheckpointError(f"checkpoint {path}: unreadable metadata.json ({err})") from err
        state = {}
        for filename, digest in meta.get("files", {}).items():
            file = path / filename
            if not file.is_file():
                raise CorruptCheckpointError(f"checkpoint {path}: file {filename} is missing")
            actual = sha256_file(file)
            if actual != digest:
                raise CorruptCheckpointError(
                    f"checkpoint {path}: {filename} fails its sha256 check (expected {digest[:12]}..., "
                    f"found {actual[:12]}...); the file was damaged after it was written"
                )
            try:
                state[file.stem] = torch.load(file, map_location=map_location, weights_only=True)
            except Exception as err:  # noqa: BLE001 - any unpickling failure means a bad file
                raise CorruptCheckpointError(f"checkpoint {path}: cannot load {filename} ({err})") from err
        return LoadedCheckpoint(path, int(meta["step"]), state, meta)

    def load_latest(self, map_location: str | torch.device = "cpu") -> LoadedCheckpoint | None:
        """The newest checkpoint that verifies; corrupt ones are reported (logged) and skipped."""
        for path in reversed(self.list_checkpoints()):
            try:
                return self.load(path, map_location)
            except CorruptCheckpointError as err:
                log.error("%s -- falling back to the previous checkpoint", err)
        return None


def check_weight_choice(weights: str) -> str:
    """``weights`` if it names the weights a training checkpoint holds (``ema`` or ``model``), else a clear error."""
    if weights not in ("ema", "model"):
        raise ValueError(f"weights must be 'ema' or 'model', got {weights!r}")
    return weights


def model_weights(loaded: LoadedCheckpoint, weights: str = "ema") -> dict[str, torch.Tensor]:
    """The model state dict inside a training checkpoint: the EMA shadow (``ema``) or the raw ``model``.

    Training checkpoints hold ``state["model"]`` and ``state["ema"]`` (an :class:`loopcore.ema.EMA` state,
    whose model entries carry a ``module.`` prefix next to its update counter).
    """
    check_weight_choice(weights)
    if weights not in loaded.state:
        raise KeyError(f"{loaded.path} holds no {weights!r} state (keys: {sorted(loaded.state)})")
    state = loaded.state[weights]
    if weights == "ema":
        state = {k.removeprefix("module."): v for k, v in state.items() if k.startswith("module.")}
    return state


def load_run_checkpoint(run_dir: str | Path) -> tuple[LoadedCheckpoint, dict[str, str]]:
    """The newest valid checkpoint of a training run directory and its files' sha256 sums
    (``{"step-<8-digit step>/<file>": digest}``); a clear error when there is none."""
    directory = Path(run_dir) / "checkpoints"
    loaded = CheckpointManager(directory).load_latest()
    if loaded is None:
        raise FileNotFoundError(f"no valid checkpoint under {directory} (none written, or all failed verification)")
    digests = {f"{loaded.path.name}/{k}": v for k, v in loaded.metadata.get("files", {}).items()}
    return loaded, digests
