"""Crash-safe training checkpoints: one directory per save, plain tensors, checksums, auto-resume.

Layout (``<run>/checkpoints/step-00001000/``): one ``<name>.pt`` per state entry (model, EMA,
optimizers, scheduler, trainer state, ...) holding only tensors and Python primitives, so
``torch.load(..., weights_only=True)`` reads it, plus ``metadata.json`` with the format version, the
step, free-form metadata and the sha256 of every file.

Crash consistency: a save is written to ``.tmp-step-N-PID/`` with every file and the folder fsynced,
then renamed into place (``os.replace``), so a checkpoint directory either is complete or does not
exist. Re-saving an existing step moves the old copy to ``.old-step-N-PID/`` first and deletes it only
after the new one is in place; :meth:`CheckpointManager.recover` (run at start-up) restores such an
old copy when a crash left no new one, and removes stale temporary folders. A checkpoint whose
metadata is malformed, whose files are missing or fail their checksum, or that lacks a required state
entry is *corrupt*: it is reported and the previous one is used. A failed write (disk full, ...)
raises :class:`CheckpointSaveError` and leaves the earlier checkpoints untouched.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)
_STEP_DIR = re.compile(r"^step-(\d{8,})$")
FORMAT_VERSION = 1


class CorruptCheckpointError(RuntimeError):
    """A checkpoint directory is incomplete or inconsistent, or a file fails its checksum or cannot be read."""


class OutputWriteError(OSError):
    """An output (checkpoint, release, shard, latent, image, metrics file) could not be written: the disk is full,
    a file size limit was hit, the folder is read-only. The message names the path, the reason and the free space;
    the writer has removed its partial files and left the previous good state as it was."""


class CheckpointSaveError(OutputWriteError):
    """A checkpoint could not be written (e.g. the disk is full); earlier checkpoints are intact."""


def free_space(path: str | Path) -> str:
    """Free space on the filesystem that holds ``path`` (its nearest existing folder), e.g. ``"1.2 MiB free"``."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return "free space unknown"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if free >= size:
            return f"{free / size:.1f} {unit} free"
    return f"{free} bytes free"


# errnos a full or limited output filesystem gives (ENOSPC, EFBIG from RLIMIT_FSIZE, EDQUOT, EROFS)
WRITE_ERRNOS = frozenset(e for e in (errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", None), errno.EROFS) if e)


def is_write_failure(err: BaseException) -> bool:
    """Whether ``err`` (anywhere in its cause chain) is the filesystem refusing a write."""
    while err is not None:
        if isinstance(err, OutputWriteError) or (isinstance(err, OSError) and err.errno in WRITE_ERRNOS):
            return True
        err = err.__cause__ or err.__context__
    return False


def write_failure(path: str | Path, err: BaseException) -> str:
    """One line for a failed write of ``path``, whatever raised it: an ``OSError`` (ENOSPC, EFBIG, EROFS...) or
    the ``RuntimeError`` torch's and PIL's writers turn a full disk into."""
    if isinstance(err, OSError) and err.errno is not None:
        reason = f"{err.strerror or err} (errno {err.errno})"
    else:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return f"could not write {path}: {reason}; {free_space(path)} there"


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


def write_durable(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` and fsync it (the caller renames or fsyncs the folder)."""
    raw = data.encode() if isinstance(data, str) else data
    with open(path, "wb") as f:
        f.write(raw)
        f.flush()
        os.fsync(f.fileno())


def write_atomic(path: str | Path, data: bytes | str) -> None:
    """Replace ``path`` by ``data`` atomically: a reader sees the old file or the whole new one. A failed write
    raises :class:`OutputWriteError` naming the path and the free space, and leaves the old file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write_durable(tmp, data)
        os.replace(tmp, path)
    except OSError as err:
        raise OutputWriteError(write_failure(path, err)) from err
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(path.parent)


def _step_of(name: str) -> int | None:
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def validate_metadata(path: Path, meta: Any, required: Sequence[str] = ()) -> dict[str, Any]:
    """``meta`` (a parsed ``metadata.json``) if it is consistent with the checkpoint folder ``path``.

    Raises :class:`CorruptCheckpointError` naming what is wrong: not a mapping, unknown format, a step
    that disagrees with the folder name, a missing or malformed ``files`` table, or a ``required`` state
    entry (``name`` for ``name.pt``) that the table does not list.
    """
    if not isinstance(meta, dict):
        raise CorruptCheckpointError(f"checkpoint {path}: metadata.json holds a {type(meta).__name__}, not a mapping")
    if meta.get("format") != FORMAT_VERSION:
        raise CorruptCheckpointError(
            f"checkpoint {path}: metadata.json format {meta.get('format')!r}, expected {FORMAT_VERSION}"
        )
    step = meta.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step != _step_of(path.name):
        raise CorruptCheckpointError(f"checkpoint {path}: metadata.json step {step!r} does not match the folder name")
    files = meta.get("files")
    if not isinstance(files, dict) or not files or not all(
        isinstance(k, str) and k.endswith(".pt") and "/" not in k and isinstance(v, str) and len(v) == 64
        for k, v in files.items()
    ):
        raise CorruptCheckpointError(f"checkpoint {path}: metadata.json has no valid 'files' table ({files!r:.80})")
    missing = [name for name in required if f"{name}.pt" not in files]
    if missing:
        raise CorruptCheckpointError(f"checkpoint {path}: required state {missing} not in metadata.json")
    return meta


def fsync_dir(path: Path) -> None:
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

    def __init__(
        self, directory: str | Path, keep_last: int = 3, is_main: bool = True, required: Sequence[str] = ()
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.is_main = is_main
        self.required = tuple(required)

    def recover(self) -> list[str]:
        """Clean up after a crash during a save (main rank, before training starts).

        An ``.old-step-N-*`` copy is moved back to ``step-N`` when no ``step-N`` exists (the crash came
        between moving it aside and installing the new copy) and deleted otherwise; ``.tmp-*`` folders
        (unfinished saves) are deleted. Returns what was done, one line per folder.
        """
        if not self.is_main or not self.directory.is_dir():
            return []
        done = []
        for entry in sorted(self.directory.iterdir()):
            if not entry.is_dir():
                continue
            if entry.name.startswith(".old-"):
                name = entry.name[len(".old-"):].rsplit("-", 1)[0]
                final = self.directory / name
                if _step_of(name) is not None and not final.exists():
                    os.replace(entry, final)
                    done.append(f"restored {final} from {entry.name}")
                else:
                    shutil.rmtree(entry, ignore_errors=True)
                    done.append(f"removed stale {entry.name}")
        for entry in sorted(self.directory.iterdir()):
            if entry.is_dir() and entry.name.startswith(".tmp-"):
                shutil.rmtree(entry, ignore_errors=True)
                done.append(f"removed unfinished save {entry.name}")
        if done:
            fsync_dir(self.directory)
            for line in done:
                log.warning("checkpoints: %s", line)
        return done

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
        """Write ``state`` (``{name: picklable-with-weights_only object}``) as the checkpoint of ``step``.

        Raises :class:`CheckpointSaveError` when the write fails; nothing of it is left behind and the
        earlier checkpoints are untouched.
        """
        if not self.is_main:
            return None
        final = self.step_dir(step)
        tmp = self.directory / f".tmp-{final.name}-{os.getpid()}"
        old: Path | None = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
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
            write_durable(tmp / "metadata.json", json.dumps(meta, indent=2, sort_keys=True))
            fsync_dir(tmp)
            if final.exists():  # the same step saved again (e.g. a signal right after a periodic save)
                old = self.directory / f".old-{final.name}-{os.getpid()}"
                os.replace(final, old)
            os.replace(tmp, final)
            fsync_dir(self.directory)
        except (OSError, RuntimeError) as err:  # torch.save reports a full disk as a RuntimeError
            shutil.rmtree(tmp, ignore_errors=True)
            if old is not None and old.exists() and not final.exists():
                os.replace(old, final)  # put the earlier copy of this step back
            previous = [p.name for p in self.list_checkpoints()]
            raise CheckpointSaveError(
                f"checkpoint: {write_failure(final, err)}. Earlier checkpoints are intact "
                f"({', '.join(previous) or 'none yet'}); free disk space or fix the folder, then rerun the same "
                "command to resume"
            ) from err
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self._prune()
        return final

    def _prune(self) -> None:
        for old in self.list_checkpoints()[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)

    def load(
        self, path: str | Path, map_location: str | torch.device = "cpu", required: Sequence[str] | None = None
    ) -> LoadedCheckpoint:
        """Load and verify one checkpoint directory; raises :class:`CorruptCheckpointError`.

        ``required``: state entries that must be present (default: the manager's ``required``).
        """
        path = Path(path)
        meta_path = path / "metadata.json"
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CorruptCheckpointError(f"checkpoint {path}: unreadable metadata.json ({err})") from err
        meta = validate_metadata(path, meta, self.required if required is None else required)
        state = {}
        for filename, digest in meta["files"].items():
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
        return LoadedCheckpoint(path, meta["step"], state, meta)

    def load_latest(
        self, map_location: str | torch.device = "cpu", required: Sequence[str] | None = None,
        errors: list[CorruptCheckpointError] | None = None,
    ) -> LoadedCheckpoint | None:
        """The newest checkpoint that verifies; corrupt ones are reported (logged) and skipped, and appended
        to ``errors`` when it is given (so a caller can name them when none verifies)."""
        for path in reversed(self.list_checkpoints()):
            try:
                return self.load(path, map_location, required)
            except CorruptCheckpointError as err:
                log.error("%s -- falling back to the previous checkpoint", err)
                if errors is not None:
                    errors.append(err)
        return None


def read_metadata(path: str | Path) -> dict[str, Any] | None:
    """A checkpoint folder's ``metadata.json`` as a mapping, or ``None`` when it is unreadable or not a mapping
    (no checksums are verified: for naming what a checkpoint was made with, never for loading it)."""
    try:
        meta = json.loads((Path(path) / "metadata.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return meta if isinstance(meta, dict) else None


def check_weight_choice(weights: str) -> str:
    """``weights`` if it names the weights a training checkpoint holds (``ema`` or ``model``), else a clear error."""
    if weights not in ("ema", "model"):
        raise ValueError(f"weights must be 'ema' or 'model', got {weights!r}")
    return weights


def model_weights(loaded: LoadedCheckpoint, weights: str = "ema") -> dict[str, torch.Tensor]:
    """The model state dict inside a training checkpoint: the EMA shadow (``ema``) or the raw ``model``.

    Training checkpoints hold ``state["model"]`` and ``state["ema"]`` (an :class:`looprun.optimization.EMA` state,
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
