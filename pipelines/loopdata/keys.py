"""Sample keys that are safe to use as relative file names.

A sample key is the part of a tar member's name before its first dot (webdataset's grouping), and tools
write outputs named by it (``loopvae eval --save-images`` writes ``<out>/images/.../<key>.png``). A
hostile or broken shard with members named ``../../x.jpg`` or ``/abs/x.jpg`` would then write outside
the output folder. The documented layout is ``<key>.<ext>``, where a key is one or more ``/``-separated
segments of printable characters other than ``\\``; we reject absolute keys, ``.`` and ``..`` segments,
empty segments (``a//b``, trailing ``/``), backslashes and control characters.
"""

from __future__ import annotations

from pathlib import Path


class UnsafeKeyError(ValueError):
    """A sample key that could escape a folder when used as a file name."""


def key_problem(key: str) -> str | None:
    """Why ``key`` is unsafe as a relative file name, or ``None`` when it is safe."""
    if not key:
        return "empty key"
    if key.startswith("/"):
        return "absolute path"
    if "\\" in key:
        return "backslash in key"
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        return "control character in key"
    segments = key.split("/")
    if any(s in ("", ".", "..") for s in segments):
        return "empty, '.' or '..' path segment"
    return None


def check_key(key: str, where: str) -> str:
    """``key`` if safe, else :class:`UnsafeKeyError` naming ``where`` (a shard) and the reason."""
    problem = key_problem(key)
    if problem is not None:
        raise UnsafeKeyError(
            f"{where}: unsafe sample key {key!r} ({problem}): keys name output files and must be relative "
            "paths without '..'; rewrite the shard (`loopdata check` lists every such key)"
        )
    return key


def path_for_key(folder: str | Path, key: str, suffix: str) -> Path:
    """``folder/<key><suffix>``, guaranteed inside ``folder`` (raises :class:`UnsafeKeyError` otherwise)."""
    check_key(key, str(folder))
    root = Path(folder).resolve()
    path = (root / f"{key}{suffix}").resolve()
    if not path.is_relative_to(root):
        raise UnsafeKeyError(f"sample key {key!r} resolves outside {root}")
    return path
