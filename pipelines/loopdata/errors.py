"""The errors loopdata raises for bad data, and the one-line messages the command-line tools print for them."""

from __future__ import annotations

import re


class NoUsableSamplesError(RuntimeError):
    """A training split (or a rank's share of it) holds no decodable image."""


class CorruptSampleError(RuntimeError):
    """An evaluation sample could not be decoded; the message names the shard and the key."""


class ShardCountError(RuntimeError):
    """A shard holds a different number of samples than the counts used to split it."""


def one_line(err: BaseException) -> str:
    """A one-line message for ``err``.

    Errors raised in a DataLoader worker arrive wrapped in the worker's traceback ("Caught X in
    DataLoader worker process 0. Original Traceback ..."): keep the original message, its last line.
    ``KeyError`` prints its message without the quotes ``str()`` adds.
    """
    if isinstance(err, KeyError) and err.args:
        text = str(err.args[0])
    else:
        text = str(err).strip()
    if "Original Traceback" in text:
        text = re.sub(r"^[\w.]+: ", "", text.splitlines()[-1].strip())
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " ".join(lines) if lines else type(err).__name__
