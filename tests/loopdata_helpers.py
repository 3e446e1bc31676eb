"""Helpers for loopdata tests: tiny images and shards built on the fly (imported by the tests)."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

from loopdata.writer import TarShardWriter


def noise_image(width: int, height: int, seed: int = 0, mode: str = "RGB") -> Image.Image:
    """A deterministic random image (noise, so that crops and flips are distinguishable)."""
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "L": None, "CMYK": 4, "RGBA": 4}[mode]
    shape = (height, width) if channels is None else (height, width, channels)
    return Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode)


def encode(image: Image.Image, fmt: str = "JPEG", **kwargs: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **kwargs)
    return out.getvalue()


def jpeg(width: int = 24, height: int = 20, seed: int = 0, mode: str = "RGB") -> bytes:
    return encode(noise_image(width, height, seed, mode), "JPEG", quality=90)


def png_16bit(array: np.ndarray) -> bytes:
    """A 16-bit PNG (grey (H, W) or RGB (H, W, 3) uint16), written by hand: PIL cannot write 48-bit RGB."""
    height, width = array.shape[:2]
    colour_type = 2 if array.ndim == 3 else 0
    raw = b"".join(b"\x00" + array[y].astype(">u2").tobytes() for y in range(height))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
        )

    header = struct.pack(">IIBBBBB", width, height, 16, colour_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def palette_png_with_alpha() -> bytes:
    """4x4 palette PNG: index 0 fully transparent (stored colour black), index 1 opaque red."""
    image = Image.new("P", (4, 4), 1)
    image.putpalette([0, 0, 0, 255, 0, 0] + [0, 0, 0] * 254)
    image.putpixel((0, 0), 0)
    return encode(image, "PNG", transparency=0)


def write_shard(path: Path, samples: list[tuple[str, dict[str, bytes]]]) -> str:
    """Write one shard with the project's deterministic writer; returns its path."""
    with TarShardWriter(path.parent, path.name.removesuffix("-000000.tar"), max_count=10**6) as writer:
        for key, members in samples:
            writer.add(key, members)
    return str(path)
