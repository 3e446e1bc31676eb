"""Shard listing, URL expansion, ``_info.json`` sample counts and sample reading.

Shard layout (as in the Hugging Face ``timm/imagenet-1k-wds`` shards): a sample is a group of
consecutive tar members sharing a key, ``<key>.jpg|png`` (the image bytes), optionally ``<key>.cls``
(class index as ASCII decimal) and ``<key>.json`` (metadata).

``_info.json`` lives next to the shards, one file per directory, in timm's schema: a ``splits`` mapping
with one entry per split (e.g. ``train``, ``val``) holding ``num_samples``, ``filenames`` and
``shard_lengths``; our writer adds ``shard_bytes`` and ``shard_sha256``, which ``loopdata check``
verifies. Readers use it when present and count the tar members when it is absent.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import braceexpand
import webdataset as wds

INFO_NAME = "_info.json"
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm", "pbm")
_URL_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
_GLOB_CHARS = re.compile(r"[*?\[]")


class ShardReadError(RuntimeError):
    """A shard could not be opened or its tar stream is damaged."""


def is_local(url: str) -> bool:
    """True for plain paths and ``file:`` URLs (the only ones we can count, hash and glob)."""
    return url.startswith("file:") or not _URL_SCHEME.match(url) or bool(re.match(r"^[a-zA-Z]:[\\/]", url))


def local_path(url: str) -> Path:
    """Filesystem path of a local URL."""
    return Path(url[len("file:") :] if url.startswith("file:") else url)


def canonical_urls(urls: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """The shard list ``urls`` names, with local paths made absolute: the identity of a data set, so
    that a run resumed from another directory (or with other patterns for the same shards) compares equal."""
    return [str(local_path(u).resolve()) if is_local(u) else u for u in expand_urls(urls)]


def _split_top_level(spec: str) -> list[str]:
    """Split on commas, whitespace and ``::`` that are not inside ``{...}`` brace patterns or quotes.

    An entry that starts with a double or single quote (``"my data/shard,1.tar"``) runs to the matching quote,
    spaces and commas included (the quotes are removed); a quote inside a name (``O'Brien/*.tar``) is a
    character. ``pipe:`` commands contain spaces, so a specification starting with ``pipe:`` splits on ``::``
    only.
    """
    if spec.lstrip().startswith("pipe:"):
        return [p.strip() for p in spec.split("::") if p.strip()]
    parts, depth, current, quote = [], 0, [], None
    spec = spec.replace("::", " ")
    for ch in spec:
        if quote is not None:
            if ch == quote:
                quote = None
            else:
                current.append(ch)
            continue
        if ch in "\"'" and depth == 0 and not current:  # a quote opens an entry; inside a name it is a character
            quote = ch
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth = max(depth - 1, 0)
        if depth == 0 and (ch == "," or ch.isspace()):
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if quote is not None:
        raise ValueError(f"unbalanced {quote} quote in the shard specification {spec!r}")
    parts.append("".join(current))
    return [p for p in parts if p]


def _entries(item: str | os.PathLike) -> list[str]:
    """The entries of one specification item: a ``Path`` (or a string naming an existing file or folder) is one
    entry as it is, spaces and commas included; any other string is split by :func:`_split_top_level`."""
    if not isinstance(item, str):
        return [os.fspath(item)]
    plain = item.strip() and is_local(item) and not _GLOB_CHARS.search(item) and "{" not in item
    if plain and local_path(item).exists():
        return [item]
    return _split_top_level(item)


def expand_urls(urls: str | os.PathLike | Sequence[str | os.PathLike], must_exist: bool = True) -> list[str]:
    """Expand a shard specification into an ordered list of shard URLs.

    Accepts one string or a list of strings/paths. Each string may hold several entries separated by
    commas, whitespace or ``::`` (only ``::`` for ``pipe:`` commands); a path holding spaces or commas is
    given quoted (``'"my data/a.tar", other.tar'``), as a ``Path``, or as a string naming an existing file or
    folder (taken whole). Each entry may be a brace pattern
    (``shard-{000000..000003}.tar``), a glob (``data/*.tar``, sorted), a directory (all its ``*.tar``,
    sorted), a folder of image files without shards (read recursively as ``folder:`` chunks, see
    :mod:`loopdata.folders`) or a plain path/URL. Non-local URLs (``http://``, ``pipe:`` ...) are passed
    through unchanged.

    Raises:
        ValueError: nothing matched, an entry matched no file, a local shard is missing
            (``must_exist``), or a shard appears twice (it would be read twice in evaluation).
    """
    items = [urls] if isinstance(urls, (str, os.PathLike)) else list(urls)
    result: list[str] = []
    for item in items:
        for entry in _entries(item):
            for url in braceexpand.braceexpand(entry):
                if not is_local(url):
                    result.append(url)
                    continue
                path = local_path(url)
                if path.is_dir():
                    found = sorted(str(p) for p in path.glob("*.tar"))
                    if not found:
                        from .folders import folder_chunk_urls, holds_images

                        if not holds_images(path):
                            raise ValueError(
                                f"directory {path} holds neither *.tar shards nor image files; --data takes "
                                "WebDataset shards (a brace pattern, a glob, a directory of *.tar) or a folder "
                                "of images (jpg, png, ...; read recursively)"
                            )
                        found = folder_chunk_urls(path)
                    result.extend(found)
                elif _GLOB_CHARS.search(url):
                    found = sorted(glob.glob(os.fspath(path)))
                    if not found:
                        raise ValueError(f"shard pattern {url!r} matched no files")
                    result.extend(found)
                else:
                    if must_exist and not path.is_file():
                        raise ValueError(f"shard not found: {url} (check the path or pattern)")
                    result.append(url)
    if not result:
        raise ValueError(f"no shards given (specification: {urls!r})")
    seen: set[str] = set()
    for url in result:
        norm = os.path.abspath(local_path(url)) if is_local(url) else url
        if norm in seen:
            raise ValueError(f"shard {url} is listed twice; each shard may appear only once")
        seen.add(norm)
    return result


def read_info(directory: str | os.PathLike) -> dict[str, Any] | None:
    """Parse ``<directory>/_info.json``; ``None`` when absent. Malformed JSON is an error."""
    path = Path(directory) / INFO_NAME
    if not path.is_file():
        return None
    try:
        info = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{path}: invalid JSON ({exc}); fix or delete it and run `loopdata info --write`"
        ) from exc
    if not isinstance(info, dict) or not isinstance(info.get("splits", {}), dict):
        raise ValueError(f"{path}: expected an object with a 'splits' mapping (timm _info.json schema)")
    return info


def _read_remote_info(directory: str) -> dict[str, Any] | None:
    """``_info.json`` next to remote shards, fetched with ``webdataset.gopen``; ``None`` if unavailable."""
    try:
        with wds.gopen(f"{directory}/{INFO_NAME}") as handle:
            return json.load(handle)
    except Exception:  # noqa: BLE001 - any transport error just means "no info", counted later
        return None


def info_entries(info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Shard file name -> ``{"split", "num_samples", "bytes"?, "sha256"?}`` from a parsed ``_info.json``."""
    entries: dict[str, dict[str, Any]] = {}
    for split_name, split in info.get("splits", {}).items():
        names = [n for pattern in split.get("filenames", []) for n in braceexpand.braceexpand(pattern)]
        lengths = split.get("shard_lengths", [])
        if len(names) != len(lengths):
            raise ValueError(
                f"_info.json split {split_name!r}: {len(names)} filenames but {len(lengths)} shard_lengths"
            )
        sizes = split.get("shard_bytes", [None] * len(names))
        hashes = split.get("shard_sha256", [None] * len(names))
        for name, length, size, digest in zip(names, lengths, sizes, hashes):
            entry: dict[str, Any] = {"split": split_name, "num_samples": int(length)}
            if size is not None:
                entry["bytes"] = int(size)
            if digest is not None:
                entry["sha256"] = digest
            entries[os.path.basename(name)] = entry
    return entries


def count_samples(url: str) -> int:
    """Count the samples of a local shard by reading tar headers only (no image data).

    Uses the same grouping rule as webdataset: consecutive members with the same key (file name up to
    the first dot) form one sample; ``__*__`` metadata members are ignored.
    """
    from .folders import folder_chunk_count, is_folder_url

    if is_folder_url(url):
        return folder_chunk_count(url)
    if not is_local(url):
        raise ValueError(
            f"cannot count samples of remote shard {url}: put an {INFO_NAME} with shard_lengths next to it"
        )
    count, last = 0, None
    try:
        with tarfile.open(local_path(url), "r:*") as tar:
            for member in tar:
                if not member.isreg():
                    continue
                key, _ = wds.tariterators.base_plus_ext(member.name)
                base = os.path.basename(member.name)
                if key is None or (base.startswith("__") and base.endswith("__")):
                    continue
                if key != last:
                    count, last = count + 1, key
    except (tarfile.TarError, OSError) as exc:
        raise ShardReadError(f"{url}: cannot read tar ({exc}); run `loopdata check {url}`") from exc
    return count


def shard_counts(urls: Sequence[str], compute_missing: bool = True) -> list[int]:
    """Samples per shard, from each directory's ``_info.json``, counting tar headers where missing."""
    from .folders import folder_chunk_count, is_folder_url

    infos: dict[str, dict[str, dict[str, Any]]] = {}
    counts = []
    for url in urls:
        if is_folder_url(url):
            counts.append(folder_chunk_count(url))
            continue
        directory = os.path.dirname(url)
        if directory not in infos:
            info = read_info(local_path(directory or ".")) if is_local(url) else _read_remote_info(directory)
            infos[directory] = info_entries(info) if info else {}
        entry = infos[directory].get(os.path.basename(url))
        if entry is not None:
            counts.append(entry["num_samples"])
        elif compute_missing:
            counts.append(count_samples(url))
        else:
            raise ValueError(f"{url}: not listed in {os.path.join(directory, INFO_NAME)}")
    return counts


def file_digest(path: str | os.PathLike) -> tuple[int, str]:
    """``(size in bytes, sha256 hex)`` of a file."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def split_entry(split: str, paths: Sequence[str | os.PathLike], lengths: Sequence[int]) -> dict[str, Any]:
    """An ``_info.json`` split entry for local shards (hashes them)."""
    sizes, hashes = [], []
    for path in paths:
        size, digest = file_digest(path)
        sizes.append(size)
        hashes.append(digest)
    return {
        "name": split,
        "num_samples": int(sum(lengths)),
        "filenames": [os.path.basename(p) for p in paths],
        "shard_lengths": [int(n) for n in lengths],
        "shard_bytes": sizes,
        "shard_sha256": hashes,
    }


def update_info(
    directory: str | os.PathLike,
    entry: dict[str, Any],
    name: str | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Insert or replace one split entry in ``<directory>/_info.json`` (atomic write, sorted keys).

    Other splits already recorded there are kept, so several splits can share a directory.
    """
    directory = Path(directory)
    info = read_info(directory) or {}
    info.setdefault("name", name or directory.name)
    info.setdefault("splits", {})
    info["splits"][entry["name"]] = entry
    if extra:
        info.update(extra)
    path = directory / INFO_NAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def image_member(sample: dict[str, Any]) -> str | None:
    """Extension of the sample's image member (first of :data:`IMAGE_EXTS` present), or ``None``."""
    for ext in IMAGE_EXTS:
        if ext in sample:
            return ext
    return None


def iter_samples(url: str) -> Iterator[dict[str, Any]]:
    """Yield the samples of one shard as dicts ``{"__key__", "__url__", <ext>: bytes, ...}``.

    Tar reading and key grouping are webdataset's (``url_opener``, ``tar_file_expander``,
    ``group_by_keys``), so any URL ``webdataset.gopen`` can open works. Errors are re-raised as
    :class:`ShardReadError` naming the shard.
    """
    from .folders import is_folder_url, iter_folder_samples

    if is_folder_url(url):
        yield from iter_folder_samples(url)
        return
    stream = wds.tariterators.url_opener([{"url": url}], handler=wds.reraise_exception)
    files = wds.tariterators.tar_file_expander(stream, handler=wds.reraise_exception)
    samples = wds.tariterators.group_by_keys(files, handler=wds.reraise_exception)
    try:
        yield from samples
    except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
        reason = exc.args[0] if exc.args else exc
        raise ShardReadError(
            f"{url}: damaged or unreadable tar ({type(exc).__name__}: {reason}); "
            f"run `loopdata check {url}` and rewrite the shard"
        ) from exc
