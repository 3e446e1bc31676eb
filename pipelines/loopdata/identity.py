"""What a shard or a folder chunk was made from, so that a resumed run or a rerun of ``loopvae encode`` can tell
whether its input is still the same.

* a local tar shard: its size and modification time;
* a folder chunk (``folder:<dir>#<start>-<stop>``): its image files in order, each with its relative path, size
  and modification time (the compact form keeps a digest of that list, the count and the first and last names);
* anything else (``pipe:``, remote URLs): the URL only (nothing to check).

:func:`first_difference` compares a recorded identity with the current one and names the first difference (a
file renamed, added, removed or rewritten), or returns ``None`` when they agree.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

from .folders import is_folder_url, parse_folder_url, scan_folder
from .shards import is_local, local_path


def source_identity(url: str, compact: bool = False) -> dict[str, Any]:
    """The identity of one shard or folder chunk (``compact``: a folder chunk's file list as a digest)."""
    if is_folder_url(url):
        root, start, stop = parse_folder_url(url)
        images = scan_folder(root)[start:stop]
        files = []
        for image in images:
            info = os.stat(image.path)
            files.append([image.relpath, info.st_size, info.st_mtime_ns])
        digest = hashlib.sha256("\n".join(f"{r}\t{s}\t{m}" for r, s, m in files).encode()).hexdigest()
        out: dict[str, Any] = {"url": url, "count": len(files), "digest": digest,
                               "first": files[0][0] if files else None, "last": files[-1][0] if files else None}
        if not compact:
            out["files"] = files
        return out
    if is_local(url):
        path = local_path(url)
        info = os.stat(path)
        return {"url": url, "size": info.st_size, "mtime_ns": info.st_mtime_ns}
    return {"url": url}


def data_identity(urls: Sequence[str], compact: bool = True) -> list[dict[str, Any]]:
    """:func:`source_identity` of every URL, in order."""
    return [source_identity(u, compact) for u in urls]


def first_difference(recorded: dict[str, Any], current: dict[str, Any]) -> str | None:
    """How ``current`` differs from ``recorded`` (one line naming the first differing file), or ``None``."""
    url = current.get("url", recorded.get("url"))
    if recorded.get("url") != current.get("url"):
        return f"the input was {recorded.get('url')}, now {current.get('url')}"
    if "digest" in recorded:
        if recorded["digest"] == current.get("digest"):
            return None
        old, new = recorded.get("files"), current.get("files")
        if old is not None and new is not None:
            for i, (a, b) in enumerate(zip(old, new)):
                if a != b:
                    if a[0] != b[0]:
                        return f"{url}: file {i + 1} was {a[0]!r}, now {b[0]!r} (files renamed, added or removed)"
                    if a[1] != b[1]:
                        return f"{url}: {a[0]!r} changed (size: {a[1:]} then, {b[1:]} now)"
                    return (f"{url}: {a[0]!r}: its modification time moved ({a[2]} then, {b[2]} now), its size "
                            f"did not ({a[1]} bytes)")
            return f"{url}: {len(old)} files then, {len(new)} now"
        return (f"{url}: its files changed ({recorded.get('count')} files {recorded.get('first')!r} .. "
                f"{recorded.get('last')!r} then, {current.get('count')} files {current.get('first')!r} .. "
                f"{current.get('last')!r} now)")
    if "size" in recorded and recorded["size"] != current.get("size"):
        return f"{url}: the shard changed (size {recorded['size']} then, {current.get('size')} now)"
    if "mtime_ns" in recorded and recorded["mtime_ns"] != current.get("mtime_ns"):
        return (f"{url}: its modification time moved ({recorded['mtime_ns']} then, {current.get('mtime_ns')} now), "
                f"its size did not ({recorded.get('size')} bytes)")
    return None


def _without_mtimes(identity: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in identity.items() if k not in ("mtime_ns", "digest")}
    if "files" in out:
        out["files"] = [list(f[:2]) for f in out["files"]]
    return out


def only_mtimes_differ(recorded: Sequence[dict[str, Any]], current: Sequence[dict[str, Any]]) -> bool:
    """Whether two *full* :func:`data_identity` lists (``compact=False``) differ in modification times alone: the
    same shards and files, in the same order, with the same sizes (a copy without ``-p``, a restore, a ``touch``).
    ``False`` when a folder chunk's file list is missing (a compact identity cannot tell)."""
    if len(recorded) != len(current):
        return False
    for old, new in zip(recorded, current):
        if ("digest" in old or "digest" in new) and ("files" not in old or "files" not in new):
            return False
        if _without_mtimes(old) != _without_mtimes(new):
            return False
    return True


def first_set_difference(recorded: Sequence[dict[str, Any]], current: Sequence[dict[str, Any]]) -> str | None:
    """The first difference between two :func:`data_identity` lists (count first, then entry by entry)."""
    for old, new in zip(recorded, current):
        diff = first_difference(old, new)
        if diff is not None:
            return diff
    if len(recorded) != len(current):
        return f"{len(recorded)} shard(s) or folder chunk(s) then, {len(current)} now"
    return None
