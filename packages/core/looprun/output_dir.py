"""The output folder of a command (``--out``): created, and checked writable, before any work starts.

``Path.mkdir`` on a read-only file system raises ``OSError(EROFS)``, which is not a ``PermissionError``, and an
existing folder there only fails at the first file written into it (a log handler, a clean-up), as a traceback.
:func:`prepare_output_dir` turns every such failure into one :class:`~looprun.checkpoint.OutputWriteError` line
that names the flag, the folder and the reason (``loopvae`` / ``srvit`` report it with exit status 2).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .checkpoint import OutputWriteError


def _reason(err: OSError) -> str:
    if err.errno is not None:
        return f"{err.strerror or err} (errno {err.errno})"
    return str(err) or type(err).__name__


def check_writable_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """``OutputWriteError`` naming ``flag`` and ``path`` unless a file can be created (and removed) in the existing
    folder ``path``; returns ``path`` as a ``Path``."""
    folder = Path(path)
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=folder)
    except OSError as err:
        raise OutputWriteError(f"{flag} {folder}: cannot write in this folder: {_reason(err)}; choose a writable "
                               f"folder for {flag}") from err
    os.close(fd)
    os.unlink(probe)
    return folder


def prepare_output_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """Create the folder ``path`` (with its parents) if needed and check that files can be written in it.

    Raises :class:`~looprun.checkpoint.OutputWriteError` (one line naming ``flag``, the folder and the reason:
    read-only file system, permission denied, a file in the way, ...) instead of the raw ``OSError``. Call it
    after the command's inputs are checked, so that a failed start leaves no folder behind.
    """
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise OutputWriteError(f"{flag} {folder}: a file is in the way (not a folder); choose another {flag}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputWriteError(f"{flag} {folder}: cannot create the folder: {_reason(err)}; choose a writable "
                               f"folder for {flag}") from err
    return check_writable_dir(folder, flag)
