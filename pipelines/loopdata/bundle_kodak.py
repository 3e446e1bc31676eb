"""Regenerate the bundled Kodak shards in ``assets/kodak`` from the shared Kodak shard.

Source: ``kodak/kodak-000000.tar`` of the shared data sets (24 lossless PNGs of the Kodak Lossless True
Color Image Suite, PhotoCD PCD0992, released by Eastman Kodak for unrestricted usage).

Output (a few MB, committed to the repository):

* ``kodak-train-000000.tar``: kodim01-20, each 2x2 box-downsampled (``Image.reduce(2)``: 768x512 ->
  384x256, portraits 256x384) and encoded once as JPEG quality 95, 4:4:4 chroma, baseline;
* ``kodak-val-000000.tar``: kodim21-24, same processing;
* ``kodak-full-000000.tar``: kodim23 and kodim24, the original 768x512 PNG bytes (for tiling tests);
* ``_info.json`` with the three splits, sample counts, sizes, SHA-256 and the provenance.

These are *derived* assets, so re-encoding them once here is intended; the shards themselves are written
with the deterministic tar writer. With the same Pillow (libjpeg-turbo) version the output is
byte-identical; ``_info.json`` records the version used.

Run: ``loopdata bundle-kodak [--source PATH] [--out DIR]`` or ``python -m loopdata.bundle_kodak``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
from pathlib import Path

import PIL
from PIL import Image

from .assets import bundled_kodak_dir, find_shared_data
from .shards import file_digest, iter_samples, split_entry, update_info
from .writer import TarShardWriter, existing_shards

SOURCE_SHA256 = "364d79ad86e9056f827f1b3f70a842ba6d771dad35544b7b69241cc0483a15e8"
SPLITS = {"train": tuple(range(1, 21)), "val": tuple(range(21, 25)), "full": (23, 24)}
JPEG_QUALITY = 95
PROVENANCE = {
    "dataset": "Kodak Lossless True Color Image Suite (Kodak PhotoCD PCD0992), kodim01-kodim24",
    "license": "released by the Eastman Kodak Company for unrestricted usage (per http://r0k.us/graphics/kodak/)",
    "source_shard": "shared data kodak/kodak-000000.tar",
    "source_sha256": SOURCE_SHA256,
    "source_origin": "GitHub coodie/quant@bc7affc715299a8d98403622918116b88657a8b8 images/kodim/kodimNN.png "
    "(Rich Franzen's PNG conversion, r0k.us)",
    "processing": {
        "train/val": f"Image.reduce(2) (2x2 box average), JPEG quality {JPEG_QUALITY}, 4:4:4, baseline",
        "full": "original PNG bytes, unchanged",
    },
    "generator": "python -m loopdata.bundle_kodak",
}


def encode_derived(png: bytes) -> tuple[bytes, int, int]:
    """Half-resolution JPEG of one Kodak PNG: ``(jpeg bytes, width, height)``."""
    image = Image.open(io.BytesIO(png)).convert("RGB").reduce(2)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=JPEG_QUALITY, subsampling=0, optimize=False, progressive=False)
    return out.getvalue(), image.width, image.height


def default_source() -> Path | None:
    """``<shared data>/kodak/kodak-000000.tar`` when the shared data is present."""
    shared = find_shared_data()
    path = shared / "kodak" / "kodak-000000.tar" if shared else None
    return path if path is not None and path.is_file() else None


def build_kodak_bundle(
    source: str | os.PathLike, out_dir: str | os.PathLike, check_source: bool = True
) -> list[str]:
    """Write the bundled Kodak shards and ``_info.json``; returns the shard paths.

    Raises:
        ValueError: the source shard's SHA-256 is not the documented one (``check_source``) or it lacks
            one of kodim01-24.
    """
    source = Path(source)
    _, digest = file_digest(source)
    if check_source and digest != SOURCE_SHA256:
        raise ValueError(f"{source}: sha256 {digest} is not the documented Kodak shard {SOURCE_SHA256}")
    pngs = {}
    for sample in iter_samples(str(source)):
        if "png" in sample:
            pngs[int(sample["__key__"].removeprefix("kodim"))] = sample["png"]
    missing = sorted(set(range(1, 25)) - set(pngs))
    if missing:
        raise ValueError(f"{source}: missing kodim images {missing}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, indices in SPLITS.items():
        prefix = f"kodak-{split}"
        for old in existing_shards(out, prefix):
            old.unlink()
        with TarShardWriter(out, prefix, max_count=100) as writer:
            for index in indices:
                png = pngs[index]
                meta = {"filename": f"kodim{index:02d}.png", "index": index, "source": "kodak-000000.tar"}
                if split == "full":
                    image = Image.open(io.BytesIO(png))
                    members = {"png": png}
                    meta.update(width=image.width, height=image.height, processing="original bytes")
                else:
                    data, width, height = encode_derived(png)
                    members = {"jpg": data}
                    meta.update(width=width, height=height, processing=PROVENANCE["processing"]["train/val"])
                members["json"] = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
                writer.add(f"kodim{index:02d}", members)
        records = writer.records
        update_info(
            out,
            split_entry(split, [r.path for r in records], [r.num_samples for r in records]),
            name="kodak-bundled",
            extra={"provenance": {**PROVENANCE, "pillow": PIL.__version__}},
        )
        paths.extend(str(r.path) for r in records)
    return paths


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m loopdata.bundle_kodak [--source TAR] [--out DIR]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments shared with ``loopdata bundle-kodak``."""
    parser.add_argument(
        "--source",
        type=Path,
        default=None,
        help="the shared kodak-000000.tar (default: <shared data>/kodak/kodak-000000.tar)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="output directory (default: <repo>/assets/kodak)"
    )


def run(args: argparse.Namespace) -> int:
    """Build the bundle from parsed arguments; prints the shards written."""
    source = args.source or default_source()
    if source is None:
        raise FileNotFoundError(
            "no Kodak source shard found: pass --source .../kodak/kodak-000000.tar "
            "or set LOOPVISION_SHARED_DATA"
        )
    paths = build_kodak_bundle(source, args.out or bundled_kodak_dir())
    for path in paths:
        print(f"{path}\t{os.path.getsize(path):,} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
