"""The failures a ``loopvae`` / ``srvit`` command reports in one line (exit status 2) instead of a traceback.

Expected failures are wrong input (files, keys, values), damaged data or checkpoints, an occupied run
folder and a full disk; each error's message already names the file, key or value and what to do.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

import loopdata
from loopdata import one_line

from .checkpoint import CheckpointSaveError, CorruptCheckpointError, OutputWriteError
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


def _bounded_int(text: str, minimum: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (``--limit -3`` is an error that names the value)."""
    return _bounded_int(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _bounded_int(text, 0, "an integer >= 0")
