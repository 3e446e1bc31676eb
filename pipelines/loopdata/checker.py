"""``loopdata check``: verify shards before a long run.

Per shard: sample count, bytes, SHA-256 (compared with ``_info.json`` when it lists the shard), tar
integrity, one image per sample that decodes (with the loader's own decoder), ``.cls`` and ``.json``
parse and agree. Across shards: duplicate keys, label coverage (distinct labels, range, classes absent,
samples without a label). Any problem makes :attr:`CheckReport.ok` false (and the CLI exit non-zero);
absent classes are reported but are not a problem (subsets such as the ImageNet sample lack classes).
"""

from __future__ import annotations

import json
import os
import re
import tarfile
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from .decode import DecodeError, decode_pil, image_size
from .keys import key_problem
from .shards import (
    INFO_NAME,
    ShardReadError,
    file_digest,
    image_member,
    info_entries,
    is_local,
    iter_samples,
    local_path,
    read_info,
)

_MAX_LISTED = 20


@dataclass
class ShardCheck:
    """Result for one shard."""

    url: str
    num_samples: int = 0
    bytes: int | None = None
    sha256: str | None = None
    expected_samples: int | None = None
    labels: Counter = field(default_factory=Counter)
    unlabelled: int = 0
    decode_failures: list[dict[str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (keys and the per-label histogram omitted)."""
        return {
            "url": self.url,
            "num_samples": self.num_samples,
            "expected_samples": self.expected_samples,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "labelled": sum(self.labels.values()),
            "unlabelled": self.unlabelled,
            "decode_failures": self.decode_failures,
            "problems": self.problems,
        }


def _check_sample(sample: dict[str, Any], decode: bool, result: ShardCheck, max_pixels: int | None = None) -> None:
    key = sample["__key__"]
    unsafe = key_problem(key)
    if unsafe is not None:
        result.problems.append(f"{key!r}: unsafe sample key ({unsafe}); loaders refuse it")
    ext = image_member(sample)
    if ext is None:
        members = sorted(k for k in sample if not k.startswith("__"))
        result.decode_failures.append({"key": key, "reason": f"no image member (members: {members})"})
    else:
        try:
            if decode:
                decode_pil(sample[ext], max_pixels=max_pixels)
            else:
                image_size(sample[ext], max_pixels)
        except DecodeError as exc:
            result.decode_failures.append({"key": key, "reason": f".{ext}: {exc}"})
    label = None
    if "cls" in sample:
        text = sample["cls"].decode("utf-8", "replace").strip()
        try:
            label = int(text)
            result.labels[label] += 1
        except ValueError:
            result.problems.append(f"{key}: .cls is not an integer: {text[:40]!r}")
    else:
        result.unlabelled += 1
    if "json" in sample:
        try:
            meta = json.loads(sample["json"])
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            result.problems.append(f"{key}: .json does not parse: {exc}")
        else:
            if label is not None and isinstance(meta, dict) and "label" in meta and meta["label"] != label:
                result.problems.append(f"{key}: .cls says {label} but .json label says {meta['label']}")


def unkeyed_members(path: str | os.PathLike) -> list[str]:
    """Regular members of the tar ``path`` that webdataset's key split (``base_plus_ext``: key = the name up to its
    first '.') silently drops, so every reader ignores them: ``.hidden.png``, ``dir/.x.png``, ``README``. Metadata
    members (``__name__``) are skipped by design and not listed. Reads the headers only."""
    dropped = []
    with tarfile.open(path) as tar:
        for member in tar:
            name = member.name
            if not member.isreg() or re.match(r"__[^/]*__($|/)", name):
                continue
            if not re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", name):
                dropped.append(name)
    return dropped


def check_shard(
    url: str, decode: bool = True, info_entry: dict[str, Any] | None = None, max_pixels: int | None = None
) -> ShardCheck:
    """Check one shard (see module docstring). ``info_entry`` is its ``_info.json`` record, if any;
    images above ``max_pixels`` (default :func:`loopdata.decode.default_max_pixels`) fail like corrupt ones."""
    result = ShardCheck(url)
    if is_local(url):
        try:
            result.bytes, result.sha256 = file_digest(local_path(url))
        except OSError as exc:
            result.problems.append(f"cannot read file: {exc}")
            return result
    seen: set[str] = set()
    try:
        for sample in iter_samples(url):
            key = sample["__key__"]
            if key in seen:
                result.problems.append(
                    f"{key}: key appears twice (its members are not contiguous in the tar)"
                )
            seen.add(key)
            result.keys.append(key)
            result.num_samples += 1
            _check_sample(sample, decode, result, max_pixels)
    except ShardReadError as exc:
        result.problems.append(f"damaged tar after {result.num_samples} samples: {exc}")
    else:
        unseen: list[str] = []
        try:
            if is_local(url):
                unseen = unkeyed_members(local_path(url))
        except (tarfile.TarError, OSError) as exc:
            result.problems.append(f"cannot list the tar's members: {exc}")
        if unseen:
            result.problems.append(
                f"{len(unseen)} member(s) that no reader sees, having no sample key (a name that starts with '.' or "
                f"has no extension): {unseen[:5]}; rename them (e.g. x.png, not .x.png) and rewrite the shard"
            )
    if result.decode_failures:
        shown = ", ".join(f["key"] for f in result.decode_failures[:5])
        result.problems.append(f"{len(result.decode_failures)} sample(s) fail to decode: {shown}")
    if info_entry is not None:
        result.expected_samples = info_entry["num_samples"]
        if info_entry["num_samples"] != result.num_samples:
            result.problems.append(
                f"{INFO_NAME} says {info_entry['num_samples']} samples, found {result.num_samples}"
            )
        if result.bytes is not None and info_entry.get("bytes") not in (None, result.bytes):
            result.problems.append(f"{INFO_NAME} says {info_entry['bytes']} bytes, file has {result.bytes}")
        if result.sha256 is not None and info_entry.get("sha256") not in (None, result.sha256):
            result.problems.append(
                f"sha256 {result.sha256} differs from {INFO_NAME} ({info_entry['sha256']})"
            )
    if result.num_samples == 0 and not result.problems:
        result.problems.append("shard holds no samples")
    return result


@dataclass
class CheckReport:
    """Result of :func:`check_shards`."""

    shards: list[ShardCheck]
    problems: list[str]
    num_classes: int | None
    labels: Counter
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No problem in any shard nor across shards."""
        return not self.problems and not any(s.problems for s in self.shards)

    @property
    def num_samples(self) -> int:
        """Samples in all shards."""
        return sum(s.num_samples for s in self.shards)

    def coverage(self) -> dict[str, Any]:
        """Label coverage: labelled/unlabelled counts, distinct labels, range and absent classes."""
        labelled = sum(self.labels.values())
        result: dict[str, Any] = {
            "labelled": labelled,
            "unlabelled": sum(s.unlabelled for s in self.shards),
            "distinct_labels": len(self.labels),
            "min_label": min(self.labels) if self.labels else None,
            "max_label": max(self.labels) if self.labels else None,
        }
        if self.num_classes is not None and labelled:
            absent = [c for c in range(self.num_classes) if c not in self.labels]
            result.update(
                num_classes=self.num_classes, absent_classes=len(absent), absent_examples=absent[:_MAX_LISTED]
            )
        return result

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready report."""
        return {
            "ok": self.ok,
            "num_samples": self.num_samples,
            "num_shards": len(self.shards),
            "labels": self.coverage(),
            "problems": self.problems,
            "notes": self.notes,
            "shards": [s.to_dict() for s in self.shards],
        }

    def format_text(self) -> str:
        """Human-readable report."""
        lines = [f"{'shard':<48} {'samples':>8} {'bytes':>14}  sha256            status"]
        for s in self.shards:
            name = s.url if len(s.url) <= 48 else "..." + s.url[-45:]
            size = f"{s.bytes:,}" if s.bytes is not None else "-"
            digest = (s.sha256 or "-")[:16]
            lines.append(
                f"{name:<48} {s.num_samples:>8} {size:>14}  {digest:<16}  "
                f"{'ok' if not s.problems else 'PROBLEM'}"
            )
        cov = self.coverage()
        lines.append(f"total: {self.num_samples} samples in {len(self.shards)} shard(s)")
        if cov["labelled"]:
            text = (
                f"labels: {cov['labelled']} labelled, {cov['unlabelled']} unlabelled, "
                f"{cov['distinct_labels']} distinct in [{cov['min_label']}, {cov['max_label']}]"
            )
            if "absent_classes" in cov:
                text += f"; {cov['absent_classes']} of {cov['num_classes']} classes absent"
            lines.append(text)
        else:
            lines.append("labels: none (unlabelled data)")
        problems = [f"{s.url}: {p}" for s in self.shards for p in s.problems] + self.problems
        failures = [f"{s.url}: {f['key']}: {f['reason']}" for s in self.shards for f in s.decode_failures]
        lines.extend(f"  decode failure: {f}" for f in failures[:_MAX_LISTED])
        lines.extend(f"  note: {n}" for n in self.notes)
        lines.extend(f"  problem: {p}" for p in problems)
        lines.append("OK" if self.ok else f"FAILED: {len(problems)} problem(s)")
        return "\n".join(lines)


def check_shards(
    urls: Sequence[str], decode: bool = True, num_classes: int | None = None, workers: int = 1,
    max_pixels: int | None = None, progress: bool = False,
) -> CheckReport:
    """Check shards (see module docstring); ``workers > 1`` checks shards in parallel processes.
    ``progress`` shows a bar over the shards on stderr.

    ``num_classes`` defaults to the ``num_classes`` recorded in ``_info.json`` by ``loopdata write``.
    """
    entries: dict[str, dict[str, Any]] = {}
    recorded_classes = None
    for directory in sorted({os.path.dirname(u) for u in urls if is_local(u)}):
        info = read_info(local_path(directory or "."))
        if info:
            for name, entry in info_entries(info).items():
                entries[os.path.join(directory, name)] = entry
            for split in info.get("splits", {}).values():
                recorded_classes = recorded_classes or split.get("num_classes")
    args = [(u, decode, entries.get(os.path.join(os.path.dirname(u), os.path.basename(u))), max_pixels)
            for u in urls]
    with tqdm(total=len(args), desc="check", unit="shard", disable=not progress, dynamic_ncols=True) as bar:
        if workers > 1 and len(urls) > 1:
            with ProcessPoolExecutor(min(workers, len(urls))) as pool:
                shards = []
                for shard in pool.map(check_shard, *zip(*args)):
                    shards.append(shard)
                    bar.update(1)
        else:
            shards = []
            for a in args:
                shards.append(check_shard(*a))
                bar.update(1)
    num_classes = num_classes if num_classes is not None else recorded_classes
    problems: list[str] = []
    notes: list[str] = []
    # Keys must be unique within a split; the same key in two splits (e.g. a full-resolution copy of a
    # validation image) is legitimate but worth knowing (train/val leakage), so it is a note.
    split_of = {u: (e or {}).get("split") for u, _, e, _ in args}
    owners: dict[str, str] = {}
    same_split, cross_split = [], []
    for s in shards:
        for key in s.keys:
            owner = owners.setdefault(key, s.url)
            if owner != s.url:
                clash = f"{key} ({owner}, {s.url})"
                splits = (split_of[owner], split_of[s.url])
                known_apart = None not in splits and splits[0] != splits[1]
                (cross_split if known_apart else same_split).append(clash)
    if same_split:
        problems.append(f"{len(same_split)} key(s) appear in several shards, e.g. {same_split[:3]}")
    if cross_split:
        notes.append(f"{len(cross_split)} key(s) appear in several splits, e.g. {cross_split[:3]}")
    labels: Counter = Counter()
    for s in shards:
        labels.update(s.labels)
    unlabelled = sum(s.unlabelled for s in shards)
    if labels and unlabelled:
        problems.append(f"{unlabelled} sample(s) have no .cls label while {sum(labels.values())} do")
    if num_classes is not None and labels:
        outside = sorted(label for label in labels if not 0 <= label < num_classes)
        if outside:
            problems.append(f"labels outside [0, {num_classes}): {outside[:_MAX_LISTED]}")
    return CheckReport(shards, problems, num_classes, labels, notes)
