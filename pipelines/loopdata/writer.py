"""Deterministic WebDataset shard writing with ``tarfile`` (original bytes, never re-encoded).

webdataset's ``ShardWriter`` / ``TarWriter`` would pass ``bytes`` through unchanged too (1.0.2 encodes only
non-bytes values) and take a fixed ``mtime`` / ``user`` / ``group``; they are not used because of what they
lack: a shard is written to ``*.tar.partial`` and renamed when complete (a crash never leaves a truncated
``.tar`` that looks finished), the size limit counts tar headers and padding (:func:`sample_tar_bytes`), keys
are checked (no ``.`` or ``/``, no repeat), and members go in sorted extension order (``.cls``, ``.jpg``,
``.json``) with mtime 2000-01-01, uid/gid 0, empty user/group names and mode 0644, so the same inputs give
byte-identical shards and SHA-256 sums.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .decode import FORMAT_EXTS, DecodeError, decode_pil, image_size
from .shards import split_entry, update_info
from .sources import (
    LAYOUTS,
    Skipped,
    SourceItem,
    detect_layout,
    load_class_names,
    scan_classes,
    scan_flat,
    scan_labels_file,
)

logger = logging.getLogger("loopdata")
TAR_MTIME = 946684800  # 2000-01-01T00:00:00Z, as in the shared data sets
_BLOCK = 512


def _padded(size: int) -> int:
    return (size + _BLOCK - 1) // _BLOCK * _BLOCK


def sample_tar_bytes(members: dict[str, bytes], key: str) -> int:
    """Bytes a sample occupies in a tar (headers + padded data; long names add a PAX header)."""
    total = 0
    for ext, data in members.items():
        name_len = len(f"{key}.{ext}".encode())
        total += _BLOCK + _padded(len(data)) + (2 * _BLOCK if name_len > 100 else 0)
    return total


@dataclass
class ShardRecord:
    """One finished shard."""

    path: Path
    num_samples: int


class TarShardWriter:
    """Write samples into ``<out_dir>/<prefix>-NNNNNN.tar``, starting a new shard by count or size.

    Each shard is written to ``*.tar.partial`` and renamed when complete, so a crash never leaves a
    truncated ``.tar`` that looks finished.

    Args:
        out_dir: output directory (created).
        prefix: shard name prefix.
        max_count: most samples per shard.
        max_size: most bytes per shard (a single larger sample still gets a shard of its own).
    """

    def __init__(
        self, out_dir: str | os.PathLike, prefix: str, max_count: int = 10000, max_size: int = 1_000_000_000
    ) -> None:
        if max_count < 1 or max_size < 1:
            raise ValueError(f"max_count and max_size must be >= 1, got {max_count}, {max_size}")
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.prefix = prefix
        self.max_count = max_count
        self.max_size = max_size
        self.records: list[ShardRecord] = []
        self._tar: tarfile.TarFile | None = None
        self._count = 0
        self._bytes = 0
        self._last_key: str | None = None

    def _open(self) -> None:
        path = self.out_dir / f"{self.prefix}-{len(self.records):06d}.tar"
        self._partial = path.with_name(path.name + ".partial")
        self._path = path
        self._tar = tarfile.open(self._partial, "w", format=tarfile.PAX_FORMAT)
        self._count = 0
        self._bytes = 0

    def _finish(self) -> None:
        if self._tar is None:
            return
        self._tar.close()
        os.replace(self._partial, self._path)
        self.records.append(ShardRecord(self._path, self._count))
        self._tar = None

    def add(self, key: str, members: dict[str, bytes]) -> None:
        """Append one sample; ``members`` maps extension (``"jpg"``, ``"cls"``...) to bytes."""
        if not key or "." in key or "/" in key:
            raise ValueError(f"invalid sample key {key!r}: keys must be non-empty without '.' or '/'")
        if key == self._last_key:
            raise ValueError(f"sample key {key!r} written twice in a row; keys must be unique")
        size = sample_tar_bytes(members, key)
        if self._tar is not None and (
            self._count >= self.max_count or self._bytes + size + 2 * _BLOCK > self.max_size
        ):
            self._finish()
        if self._tar is None:
            self._open()
        assert self._tar is not None
        for ext in sorted(members):
            data = members[ext]
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size = len(data)
            info.mtime = TAR_MTIME
            info.mode = 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            self._tar.addfile(info, _BytesReader(data))
        self._count += 1
        self._bytes += size
        self._last_key = key

    def close(self) -> list[ShardRecord]:
        """Finish the current shard and return all shards written."""
        self._finish()
        return self.records

    def __enter__(self) -> TarShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        elif self._tar is not None:
            self._tar.close()
            self._partial.unlink(missing_ok=True)


class _BytesReader:
    """Minimal file object for ``TarFile.addfile`` (avoids copying into a BytesIO)."""

    def __init__(self, data: bytes) -> None:
        self._view = memoryview(data)
        self._pos = 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._view) if size < 0 else min(self._pos + size, len(self._view))
        chunk = self._view[self._pos : end].tobytes()
        self._pos = end
        return chunk


@dataclass
class WriteReport:
    """Result of :func:`write_shards`."""

    layout: str
    shards: list[str]
    counts: list[int]
    skipped: list[Skipped]
    skipped_file: Path | None
    info_file: Path
    class_names: list[str] = field(default_factory=list)

    @property
    def num_samples(self) -> int:
        """Samples written."""
        return sum(self.counts)


def existing_shards(out_dir: Path, prefix: str) -> list[Path]:
    """Shards (and leftovers) named like ``<prefix>-NNNNNN.tar`` in ``out_dir``."""
    pattern = re.compile(re.escape(prefix) + r"-\d{6}\.tar(\.partial)?$")
    return sorted(p for p in out_dir.glob(f"{prefix}-*") if pattern.match(p.name)) if out_dir.is_dir() else []


def _prepare(item: SourceItem, verify: bool) -> tuple[dict[str, bytes] | None, str | None]:
    """Members of one sample, or ``(None, reason)`` when the file is unusable."""
    try:
        data = item.path.read_bytes()
    except OSError as exc:
        return None, f"cannot read: {exc}"
    try:
        width, height, fmt = image_size(data)
        if verify:
            decode_pil(data, 1)  # 1/8-scale JPEG decode still reads every byte: catches truncation
    except DecodeError as exc:
        return None, str(exc)
    meta: dict[str, object] = {"filename": item.relpath, "width": width, "height": height}
    members = {FORMAT_EXTS[fmt]: data}
    if item.label is not None:
        members["cls"] = str(item.label).encode()
        meta["label"] = item.label
    if item.class_name is not None:
        meta["class_name"] = item.class_name
    members["json"] = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    return members, None


def write_shards(
    src: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    layout: str = "auto",
    labels_file: str | os.PathLike | None = None,
    class_names: str | os.PathLike | None = None,
    prefix: str | None = None,
    split: str | None = None,
    max_count: int = 10000,
    max_size: int = 1_000_000_000,
    verify: bool = True,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> WriteReport:
    """Write an image folder as WebDataset shards plus ``_info.json`` and a list of skipped files.

    Args:
        src: source root: a class-folder tree, a flat folder, or a folder with ``labels_file``.
        out_dir: output directory; shards are ``<prefix>-NNNNNN.tar``.
        layout: ``auto`` | ``classes`` | ``flat`` (ignored with ``labels_file``).
        labels_file: ``<relative filename> <label>`` lines; the images live under ``src``.
        class_names: file (one name per line) or class-folder tree mapping non-integer labels to indices.
        prefix: shard name prefix (default: the source folder name).
        split: split name in ``_info.json`` (default: ``prefix``).
        max_count, max_size: shard limits (samples, bytes).
        verify: fully decode every image (at 1/8 scale for JPEG) and leave out undecodable ones.
        overwrite: replace existing shards with the same prefix.
        progress: called as ``progress(done, total)`` after each file.

    Returns:
        A :class:`WriteReport`. Unusable files are listed in ``<prefix>_skipped.txt`` (tab-separated
        path and reason) and logged; they are never dropped silently.
    """
    root = Path(src)
    out = Path(out_dir)
    if not root.is_dir():
        raise ValueError(f"source {root} is not a directory")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {LAYOUTS}")
    prefix = prefix or root.resolve().name
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+", prefix):
        raise ValueError(f"prefix {prefix!r} may only hold letters, digits and _ . + -")
    names: list[str] = []
    if labels_file is not None:
        layout = "labels"
        mapping = load_class_names(class_names) if class_names is not None else None
        items, skipped = scan_labels_file(root, Path(labels_file), mapping)
        names = mapping or []
    else:
        layout = detect_layout(root) if layout == "auto" else layout
        if layout == "classes":
            items, skipped, names = scan_classes(root)
        else:
            items, skipped = scan_flat(root)
    old = existing_shards(out, prefix)
    if old and not overwrite:
        raise FileExistsError(
            f"{out} already holds {len(old)} shard(s) named {prefix}-*.tar; "
            "pass --overwrite or use another --prefix"
        )
    skipped_file = out / f"{prefix}_skipped.txt"

    # The new shards go to a staging folder first: the old ones (and _info.json) are replaced only once the whole
    # write succeeded, so a failed --overwrite (no usable image, a crash, a full disk) leaves the old set as it was.
    staging = out / f".tmp-write-{prefix}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with TarShardWriter(staging, prefix, max_count=max_count, max_size=max_size) as writer:
            for done, item in enumerate(items, start=1):
                members, reason = _prepare(item, verify)
                if members is None:
                    skipped.append(Skipped(item.relpath, reason or "unusable"))
                    logger.warning("loopdata write: left out %s: %s", item.path, reason)
                else:
                    writer.add(item.key, members)
                if progress is not None:
                    progress(done, len(items))
        staged = writer.records
        if not staged:
            raise ValueError(f"no usable images under {root} ({len(skipped)} file(s) skipped)"
                             + (f"; the {len(old)} existing {prefix}-*.tar shard(s) in {out} are kept" if old else ""))
        entry = split_entry(split or prefix, [r.path for r in staged], [r.num_samples for r in staged])
        records = [ShardRecord(out / r.path.name, r.num_samples) for r in staged]
        for record, staged_record in zip(records, staged):
            os.replace(staged_record.path, record.path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    new_names = {r.path.name for r in records}
    for path in old:  # shards of the earlier write beyond the new count, and its leftovers
        if path.name not in new_names:
            path.unlink(missing_ok=True)
    skipped_file.unlink(missing_ok=True)
    if skipped:
        skipped_file.write_text("".join(f"{s.path}\t{s.reason}\n" for s in skipped))
    if names:
        entry["num_classes"] = len(names)
        entry["class_names"] = names
    info_file = update_info(out, entry)
    return WriteReport(
        layout,
        [str(r.path) for r in records],
        [r.num_samples for r in records],
        skipped,
        skipped_file if skipped else None,
        info_file,
        names,
    )
