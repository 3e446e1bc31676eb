"""Folders of image files as data: the same loaders, splits and checks as WebDataset shards.

``--data photos/`` (a directory with image files and no ``*.tar``) is read recursively in a
deterministic order (sorted relative POSIX paths) and cut into *folder chunks* of
:data:`CHUNK_SIZE` images, each addressed by a URL ``folder:<absolute dir>#<start>-<stop>``. A chunk
behaves exactly like a shard: training shuffles chunks and samples, ranks and workers split them, and
evaluation reads every image exactly once. Samples look like shard samples: key = the relative path
without its extension, with ``/`` and ``.`` replaced by ``_`` (unique or an error naming both files),
the image bytes under their extension and, when every image sits inside a first-level sub-folder
(``root/<class>/**/<file>``, torchvision's ``ImageFolder``), ``cls`` = the index of that folder in the
sorted folder names.

Files whose extension is not an image extension are counted and named in a warning, never silently
used or dropped; a chunk whose listing changed since the split was planned raises, like a shard whose
sample count differs from ``_info.json``.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .shards import IMAGE_EXTS, ShardReadError

logger = logging.getLogger("loopdata")

FOLDER_SCHEME = "folder:"
CHUNK_SIZE = 256
_CHUNK = re.compile(r"^folder:(?P<root>.+)#(?P<start>\d+)-(?P<stop>\d+)$")


@dataclass(frozen=True)
class FolderImage:
    """One image of a folder: its path, relative POSIX path, sample key and class index (or ``None``)."""

    path: Path
    relpath: str
    key: str
    label: int | None


def is_folder_url(url: str) -> bool:
    """True for the ``folder:...#a-b`` chunk URLs of :func:`folder_chunk_urls`."""
    return url.startswith(FOLDER_SCHEME)


def walk_files(root: str | os.PathLike, recursive: bool = True, hidden: bool = True) -> list[Path]:
    """Every file under ``root`` as ``root/<relative path>``, sorted by relative POSIX path: the one folder walker
    of every reader (folders as data, ``loopdata write``).

    Directory symlinks are followed (Python 3.11's ``rglob`` does not), each real directory once: a link back to
    an ancestor or to a directory already walked is skipped with a warning naming it, so a loop cannot run
    forever. Broken links are named in a warning, never silently dropped. ``hidden=False`` leaves out file names
    starting with ``.``.
    """
    base = Path(root)
    seen: set[tuple[int, int]] = set()
    out: list[Path] = []
    broken: list[str] = []
    looped: list[str] = []
    for directory, dirnames, filenames in os.walk(base, followlinks=True):
        info = os.stat(directory)
        if (info.st_dev, info.st_ino) in seen:
            looped.append(Path(directory).relative_to(base).as_posix())
            dirnames[:] = []
            continue
        seen.add((info.st_dev, info.st_ino))
        dirnames.sort()
        for name in filenames:
            if not hidden and name.startswith("."):
                continue
            path = Path(directory) / name
            if not path.exists():  # a link whose target is gone
                broken.append(path.relative_to(base).as_posix())
            elif path.is_file():
                out.append(path)
        if not recursive:
            break
    if broken:
        logger.warning("loopdata: %s: %d broken link(s) are not read: %s", root, len(broken), broken[:5])
    if looped:
        logger.warning("loopdata: %s: %d linked folder(s) were already read through another path (a link loop or "
                       "a second link to one folder) and are skipped: %s", root, len(looped), looped[:5])
    return sorted(out, key=lambda p: p.relative_to(base).as_posix())


def holds_images(path: Path) -> bool:
    """Whether directory ``path`` contains at least one image file (at any depth, through directory links)."""
    return any(p.suffix[1:].lower() in IMAGE_EXTS for p in walk_files(path))


@functools.lru_cache(maxsize=8)
def _scan(root: str, mtime_ns: int) -> tuple[FolderImage, ...]:
    base = Path(root)
    files = walk_files(base, hidden=False)
    images = [p for p in files if p.suffix[1:].lower() in IMAGE_EXTS]
    others = [p.relative_to(base).as_posix() for p in files if p.suffix[1:].lower() not in IMAGE_EXTS]
    if others:
        logger.warning("loopdata: %s: %d file(s) without an image extension are not read, e.g. %s",
                       root, len(others), others[:3])
    if not images:
        raise ValueError(
            f"folder {root} holds no image files ({', '.join(IMAGE_EXTS)}); --data takes WebDataset shards "
            "(a brace pattern, a glob, a directory of *.tar) or a folder of images"
        )
    rel = [p.relative_to(base) for p in images]
    classes = sorted({r.parts[0] for r in rel}) if all(len(r.parts) > 1 for r in rel) else None
    index = {name: i for i, name in enumerate(classes or [])}
    out, seen = [], {}
    for path, r in zip(images, rel):
        relpath = r.as_posix()
        key = relpath[: -len(path.suffix)].replace("/", "_").replace(".", "_")
        if key in seen:
            raise ValueError(
                f"folder {root}: {seen[key]!r} and {relpath!r} map to the same sample key {key!r} "
                "(keys are relative paths with '/' and '.' replaced by '_'); rename one of them"
            )
        seen[key] = relpath
        out.append(FolderImage(path, relpath, key, index[r.parts[0]] if classes else None))
    return tuple(out)


def scan_folder(root: str | os.PathLike) -> tuple[FolderImage, ...]:
    """The images under ``root`` in their deterministic order (cached per process until ``root`` changes)."""
    path = Path(root).resolve()
    if not path.is_dir():
        raise ValueError(f"image folder {path} does not exist or is not a directory")
    return _scan(str(path), path.stat().st_mtime_ns)


def folder_chunk_urls(root: str | os.PathLike, chunk_size: int | None = None) -> list[str]:
    """``folder:<abs root>#<start>-<stop>`` URLs covering every image under ``root``, in order (chunks of
    ``chunk_size``, default :data:`CHUNK_SIZE`)."""
    chunk_size = chunk_size or CHUNK_SIZE
    images = scan_folder(root)
    base = Path(root).resolve()
    return [f"{FOLDER_SCHEME}{base}#{i}-{min(i + chunk_size, len(images))}"
            for i in range(0, len(images), chunk_size)]


def parse_folder_url(url: str) -> tuple[Path, int, int]:
    """``(root, start, stop)`` of a chunk URL; ``ValueError`` naming the URL when it is malformed."""
    match = _CHUNK.match(url)
    if not match or int(match["start"]) >= int(match["stop"]):
        raise ValueError(f"{url!r} is not a folder chunk URL (folder:<directory>#<start>-<stop>)")
    return Path(match["root"]), int(match["start"]), int(match["stop"])


def folder_chunk_count(url: str) -> int:
    """Images in the chunk ``url``."""
    _, start, stop = parse_folder_url(url)
    return stop - start


def iter_folder_samples(url: str) -> Iterator[dict[str, Any]]:
    """Yield the chunk's samples as shard-style dicts ``{"__key__", "__url__", <ext>: bytes[, "cls"]}``.

    An unreadable file raises :class:`loopdata.ShardReadError` naming it; a folder that no longer has
    the chunk's images (files removed since the split was planned) raises one too.
    """
    root, start, stop = parse_folder_url(url)
    try:
        images = scan_folder(root)
    except ValueError as err:
        raise ShardReadError(f"{url}: {err}") from err
    if stop > len(images):
        raise ShardReadError(
            f"{url}: the folder now holds {len(images)} images, fewer than when the data was planned; "
            "rerun the command"
        )
    for image in images[start:stop]:
        try:
            data = image.path.read_bytes()
        except OSError as err:
            raise ShardReadError(f"{url}: cannot read {image.relpath} ({err.strerror or err})") from err
        sample: dict[str, Any] = {"__key__": image.key, "__url__": url, image.path.suffix[1:].lower(): data}
        if image.label is not None:
            sample["cls"] = str(image.label).encode()
        yield sample
