"""``loopdata`` command line: write, check and inspect shards, rebuild the bundled Kodak shards.

    loopdata write SRC OUT_DIR [--labels FILE] [--class-names FILE|DIR] [--layout auto|classes|flat]
                   [--prefix NAME] [--split NAME] [--max-count N] [--max-size BYTES]
                   [--no-verify] [--overwrite]
    loopdata check URLS... [--json] [--num-classes K] [--no-decode] [--workers N]
    loopdata info URLS... [--write --split NAME] [--json]
    loopdata bundle-kodak [--source TAR] [--out DIR]

Exit status: 0 success, 1 ``check`` found problems, 2 bad arguments or input.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

from tqdm import tqdm

from . import bundle_kodak
from .checker import check_shards
from .errors import one_line
from .shards import (
    ShardReadError,
    count_samples,
    expand_urls,
    is_local,
    local_path,
    shard_counts,
    split_entry,
    update_info,
)
from .writer import write_shards

_SIZE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30}


def parse_size(text: str) -> int:
    """``"500MB"``, ``"1.5G"``, ``"64MiB"``, ``"1e9"`` -> bytes."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([kKmMgGtT]i?)?[bB]?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}; use e.g. 1000000000, 500MB, 1.5G, 64MiB")
    value = float(match.group(1)) * _SIZE_UNITS[(match.group(2) or "").lower()]
    if value < 1:
        raise argparse.ArgumentTypeError(f"size must be at least 1 byte, got {text!r}")
    return int(value)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    parser = argparse.ArgumentParser(prog="loopdata", description="WebDataset shard tooling for loopvision.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "write",
        help="write image folders as shards (original bytes) + _info.json",
        description="Write SRC as OUT_DIR/<prefix>-NNNNNN.tar shards. SRC is a class-folder tree "
        "(<SRC>/<class>/*.JPEG, label = sorted class index), a flat folder of unlabelled images, "
        "or, with --labels, a folder plus '<filename> <label>' lines.",
    )
    p.add_argument("src", help="source folder")
    p.add_argument("out", help="output directory")
    p.add_argument("--labels", help="labels file of '<relative filename> <label>' lines (e.g. ImageNet val)")
    p.add_argument(
        "--class-names", help="file (one name per line) or class-folder tree mapping non-integer labels"
    )
    p.add_argument(
        "--layout",
        choices=("auto", "classes", "flat"),
        default="auto",
        help="source layout without --labels (default: auto-detect)",
    )
    p.add_argument("--prefix", help="shard name prefix (default: SRC folder name)")
    p.add_argument("--split", help="split name in _info.json (default: the prefix)")
    p.add_argument("--max-count", type=_positive_int, default=10000, help="samples per shard (default 10000)")
    p.add_argument(
        "--max-size", type=parse_size, default=10**9, help="bytes per shard (default 1GB; 500MB, 2GiB ...)"
    )
    p.add_argument("--no-verify", action="store_true", help="do not decode images (header check only)")
    p.add_argument("--overwrite", action="store_true", help="replace existing shards with the same prefix")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = sub.add_parser("check", help="verify shards: counts, sha256, decoding, labels; exit 1 on any problem")
    p.add_argument("urls", nargs="+", help="shards: paths, globs, brace patterns, directories, comma lists")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--num-classes", type=_positive_int, help="expected classes (default: from _info.json)")
    p.add_argument("--no-decode", action="store_true", help="check image headers only (faster)")
    p.add_argument("--workers", type=_positive_int, default=1, help="shards checked in parallel")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--max-pixels", type=_positive_int, default=None,
                   help="images with more pixels fail (decompression-bomb guard; default $LOOPDATA_MAX_PIXELS "
                        "or 67108864)")

    p = sub.add_parser("info", help="per-shard sample counts; --write stores them in _info.json")
    p.add_argument("urls", nargs="+", help="shards")
    p.add_argument("--write", action="store_true", help="count the tars and write _info.json next to them")
    p.add_argument("--split", help="split name for --write")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("bundle-kodak", help="regenerate the bundled Kodak shards in assets/kodak")
    bundle_kodak.add_arguments(p)
    return parser


class _ProgressBar:
    """``progress(done, total)`` callback drawing a tqdm bar on stderr (created at the first call)."""

    def __init__(self, desc: str, unit: str) -> None:
        self.desc, self.unit, self.bar = desc, unit, None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            self.bar = tqdm(total=total, desc=self.desc, unit=self.unit, dynamic_ncols=True)
        self.bar.n = done
        self.bar.refresh()
        if done >= total:
            self.bar.close()


def _write(args: argparse.Namespace) -> int:
    report = write_shards(
        args.src,
        args.out,
        layout=args.layout,
        labels_file=args.labels,
        class_names=args.class_names,
        prefix=args.prefix,
        split=args.split,
        max_count=args.max_count,
        max_size=args.max_size,
        verify=not args.no_verify,
        overwrite=args.overwrite,
        progress=None if args.no_progress else _ProgressBar("write", "file"),
    )
    for path, count in zip(report.shards, report.counts):
        print(f"{path}\t{count} samples")
    classes = f", {len(report.class_names)} classes" if report.class_names else ""
    print(
        f"wrote {report.num_samples} samples in {len(report.shards)} shard(s) "
        f"({report.layout} layout{classes}); info: {report.info_file}"
    )
    if report.skipped:
        print(f"left out {len(report.skipped)} file(s), listed in {report.skipped_file}", file=sys.stderr)
    return 0


def _check(args: argparse.Namespace) -> int:
    urls = expand_urls(args.urls)
    folders = {Path(u).parent for u in urls} if all(Path(u).is_file() for u in urls) else set()
    if len(args.urls) == 1 and (Path(args.urls[0]) / "latents.json").is_file():  # a `loopvae encode` output
        folders = {Path(args.urls[0])}
    if len(folders) == 1 and (next(iter(folders)) / "latents.json").is_file():
        from .latents import check_latent_set

        latent = check_latent_set(next(iter(folders)))
        if args.json:
            print(json.dumps(latent, indent=2))
        else:
            checks = "counts and sha256" if latent["checksums"] else "counts (no sha256 recorded)"
            print(f"{latent['folder']}: latent shard set, {latent['num_samples']} samples in {latent['num_shards']} "
                  f"shard(s); checked {checks}, every latent's shape and values")
            for problem in latent["problems"][:50]:
                print(f"  PROBLEM {problem}")
            print("OK" if not latent["problems"] else f"{len(latent['problems'])} problem(s)")
        return 0 if not latent["problems"] else 1
    report = check_shards(
        urls, decode=not args.no_decode, num_classes=args.num_classes, workers=args.workers,
        max_pixels=args.max_pixels, progress=not args.no_progress,
    )
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.format_text())
    return 0 if report.ok else 1


def _info(args: argparse.Namespace) -> int:
    urls = expand_urls(args.urls)
    if args.write:
        if not args.split:
            raise ValueError("info --write needs --split NAME (the split name to record)")
        by_dir: dict[str, list[str]] = defaultdict(list)
        for url in urls:
            if not is_local(url):
                raise ValueError(f"info --write needs local shards, got {url}")
            by_dir[os.path.dirname(os.path.abspath(local_path(url)))].append(str(local_path(url)))
        for directory, paths in by_dir.items():
            path = update_info(directory, split_entry(args.split, paths, [count_samples(p) for p in paths]))
            print(f"wrote {path}")
    counts = shard_counts(urls)
    if args.json:
        print(json.dumps({"shards": dict(zip(urls, counts)), "num_samples": sum(counts)}, indent=2))
    else:
        for url, count in zip(urls, counts):
            print(f"{url}\t{count}")
        print(f"total\t{sum(counts)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``loopdata`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    handlers = {"write": _write, "check": _check, "info": _info, "bundle-kodak": bundle_kodak.run}
    try:
        return handlers[args.command](args)
    except (ValueError, FileExistsError, FileNotFoundError, NotADirectoryError, PermissionError, ShardReadError) as exc:
        print(f"loopdata {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return 2
