"""The failures a ``loopvae`` / ``srvit`` command reports in one line (exit status 2) instead of a traceback.

Expected failures are wrong input (files, keys, values), damaged data or checkpoints, an occupied run
folder and a full disk; each error's message already names the file, key or value and what to do
(``loopvae study`` reports its own, looprun.study.cli).
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import loopdata
from loopdata import one_line

from .checkpoint import CheckpointSaveError, CorruptCheckpointError, OutputWriteError
from .cli_args import non_negative_int, positive_int  # noqa: F401 (re-exported: the older import path)
from .config import ConfigError
from .distributed import RemoteRankError
from .run_lock import RunLockedError

EXPECTED_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError, FileNotFoundError, FileExistsError, NotADirectoryError, PermissionError, ValueError, KeyError,
    json.JSONDecodeError, CorruptCheckpointError, CheckpointSaveError, OutputWriteError, RunLockedError,
    RemoteRankError,
    loopdata.CorruptSampleError, loopdata.ShardReadError, loopdata.ShardCountError, loopdata.NoUsableSamplesError,
)


def run_command(prog: str, command: str, fn: Callable[[], int]) -> int:
    """Run ``fn``; an expected failure prints ``prog command: error: <one line>`` and returns 2."""
    try:
        return fn()
    except EXPECTED_ERRORS as err:
        print(f"{prog} {command}: error: {one_line(err)}", file=sys.stderr)
        return 2
