"""One training run (or ``loopvae encode``) per output folder: an advisory ``fcntl`` lock on ``<out>/.lock``.

Two runs writing into one folder would overwrite and prune each other's checkpoints (two encodes, each other's
temporary shards). The lock is held
by the main rank for the life of the process and released by the kernel when the process ends, however
it ends (``kill -9`` included), so a crashed run never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = ".lock"


class RunLockedError(RuntimeError):
    """Another live process holds the run folder's lock."""


class RunLock:
    """Hold the lock of ``run_dir`` (created if needed) until :meth:`release` or process exit.

    ``what`` names the holder in the lock file (``training run``, ``loopvae encode``, ...), so that a second
    process is told what occupies the folder.
    """

    def __init__(self, run_dir: str | Path, what: str = "training run") -> None:
        self._fd: int | None = None
        self.path = Path(run_dir) / LOCK_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, _, holder = os.pread(fd, 128, 0).decode(errors="replace").strip().partition(" ")
            os.close(fd)
            raise RunLockedError(
                f"{self.path.parent} is in use by another {holder or 'process'} (pid {pid or 'unknown'}); wait for "
                "it to finish, stop it, or choose another --out"
            ) from None
        self._fd = fd
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {what}\n".encode(), 0)

    def release(self) -> None:
        """Give the lock up (idempotent)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.release()
