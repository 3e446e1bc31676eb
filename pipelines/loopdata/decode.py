"""Defensive image decoding: bytes -> RGB ``uint8`` tensor.

Every colour mode PIL can return is mapped to RGB explicitly, because ``Image.convert("RGB")`` alone is
wrong for some of them (16-bit greyscale saturates to white, palette/alpha images show whatever colour
sits under transparent pixels). JPEGs are decoded in *draft* mode when the caller will downscale: libjpeg
then decodes at 1/2, 1/4 or 1/8 scale in the DCT domain, never below the requested shorter side, which
is both faster and a good anti-aliasing pre-filter.

Images are turned upright by their EXIF orientation (phone photos are often stored sideways). The result is a
``torch.uint8`` tensor (3, H, W) whose memory is channels-last, the layout that
torchvision's fast uint8 antialiased resize kernels use.
"""

from __future__ import annotations

import io
import math
import os
import warnings

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torchvision.transforms.v2 import functional as TF

# Formats we decode; the key is PIL's ``Image.format``, the value the tar member extension we write.
FORMAT_EXTS = {
    "JPEG": "jpg",
    "PNG": "png",
    "WEBP": "webp",
    "BMP": "bmp",
    "GIF": "gif",
    "TIFF": "tiff",
    "PPM": "ppm",
}
# Alpha and palette-with-transparency images are composited on white, as a viewer shows them on a page.
BACKGROUND = (255, 255, 255)


# Decompression-bomb guard: images with more pixels are refused from their header, before any pixel is
# decoded (a 385 KB PNG can hold 9500 x 9500 pixels, 270 MB decoded). 64 Mi pixels is 8192 x 8192, far
# above any photo data set (ImageNet's largest are ~10 Mpx) and below Pillow's own warning threshold
# (~89 Mpx), which Pillow only warns about. Override per call (``max_pixels=``, ``make_loader(max_pixels=)``,
# ``loopdata check --max-pixels``) or for every tool with the ``LOOPDATA_MAX_PIXELS`` environment variable.
DEFAULT_MAX_PIXELS = 64 * 2**20
MAX_PIXELS_ENV = "LOOPDATA_MAX_PIXELS"


def default_max_pixels() -> int:
    """``$LOOPDATA_MAX_PIXELS`` when set (a positive integer), else :data:`DEFAULT_MAX_PIXELS`."""
    raw = os.environ.get(MAX_PIXELS_ENV)
    if raw is None:
        return DEFAULT_MAX_PIXELS
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{MAX_PIXELS_ENV}={raw!r} is not a positive integer (pixels per image)")
    return value


class DecodeError(ValueError):
    """The bytes are not a decodable image; the message says why (empty, unknown format, truncated,
    larger than the pixel limit...)."""


def resized_size(width: int, height: int, side: int) -> tuple[int, int]:
    """``(width, height)`` after resizing the shorter side to ``side`` (aspect ratio kept), as torchvision's
    ``Resize(side)`` computes it."""
    short, long = min(width, height), max(width, height)
    long = int(side * long / short)
    return (side, long) if width <= height else (long, side)


def open_image(data: bytes, max_pixels: int | None = None, resize_side: int | None = None) -> Image.Image:
    """Open (lazily) an image from bytes, raising :class:`DecodeError` for empty or non-image data and for
    images with more than ``max_pixels`` pixels (default :func:`default_max_pixels`), read from the header.

    ``resize_side``: the shorter side the caller will resize the image to (before its crop). The resized image
    must fit the same limit: a 1 KB PNG of 1,000,000 x 1 pixels passes the decoded-pixel limit, but resized to a
    shorter side of 256 it would be 256 x 256,000,000 pixels (196 GB as float32)."""
    if not data:
        raise DecodeError("empty image member (0 bytes)")
    try:
        with warnings.catch_warnings():
            # Pillow warns (rather than raises) on decompression-bomb sizes and odd EXIF; those are not
            # failures, and warnings from inside DataLoader workers only add noise.
            warnings.simplefilter("ignore")
            img = Image.open(io.BytesIO(data))
    except UnidentifiedImageError as exc:
        head = data[:16]
        raise DecodeError(f"not a recognised image format ({len(data)} bytes, starting {head!r})") from exc
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise DecodeError(f"cannot open image: {exc}") from exc
    if img.format not in FORMAT_EXTS:
        raise DecodeError(f"unsupported image format {img.format}; supported: {', '.join(FORMAT_EXTS)}")
    limit = default_max_pixels() if max_pixels is None else max_pixels
    width, height = img.size
    if width * height > limit:
        raise DecodeError(
            f"{img.format} image of {width}x{height} = {width * height:,} pixels exceeds the limit of {limit:,} "
            f"(decompression-bomb guard; raise it with max_pixels= or {MAX_PIXELS_ENV} if the image is genuine)"
        )
    if resize_side is not None and width > 0 and height > 0:
        new_width, new_height = resized_size(width, height, resize_side)
        if new_width * new_height > limit:
            raise DecodeError(
                f"{img.format} image of {width}x{height} (aspect ratio {max(width, height) / min(width, height):,.0f}"
                f":1) would be resized to {new_width}x{new_height} = {new_width * new_height:,} pixels (shorter side "
                f"{resize_side}), over the limit of {limit:,} (decompression-bomb guard; raise it with max_pixels= or "
                f"{MAX_PIXELS_ENV} if the image is genuine)"
            )
    return img


EXIF_ORIENTATION = 0x0112  # the EXIF tag of how the stored pixels must be turned to be seen upright
_SWAPS_AXES = (5, 6, 7, 8)  # orientations that include a 90-degree turn


def exif_orientation(img: Image.Image) -> int:
    """The image's EXIF orientation (1..8; 1 = stored upright), 1 when absent or invalid."""
    try:
        value = int(img.getexif().get(EXIF_ORIENTATION, 1))
    except (TypeError, ValueError, OSError, SyntaxError):
        return 1
    return value if 1 <= value <= 8 else 1


def upright(img: Image.Image) -> Image.Image:
    """``img`` turned as its EXIF orientation says (phone photos are often stored sideways), as every viewer,
    torchvision's ``decode_jpeg(apply_exif_orientation=True)`` and the paper's protocol show them."""
    return ImageOps.exif_transpose(img) if exif_orientation(img) != 1 else img


def draft_request(width: int, height: int, min_size: int) -> tuple[int, int]:
    """The (w, h) to pass to ``Image.draft`` so that the decoded shorter side stays >= ``min_size``."""
    scale = min_size / min(width, height)
    return max(1, math.ceil(width * scale)), max(1, math.ceil(height * scale))


SIXTEEN_BIT_BLOCK_PIXELS = 1 << 22  # pixels converted at a time: the int32 block is 16 MiB, whatever the image


def _top_byte(img: Image.Image) -> Image.Image:
    """A 16-bit (``I;16*``) or 32-bit integer (``I``) greyscale image's top 8 bits of [0, 65535] as mode ``L``,
    converted in row blocks: beside the decoded image only one block and the 8-bit result are held (a whole-image
    int64 conversion of an 8000 x 6000 PNG added ~1.2 GB)."""
    width, height = img.size
    out = np.empty((height, width), dtype=np.uint8)
    rows = max(1, SIXTEEN_BIT_BLOCK_PIXELS // max(width, 1))
    for top in range(0, height, rows):
        block = np.asarray(img.crop((0, top, width, min(height, top + rows))))
        out[top: top + block.shape[0]] = np.clip(block, 0, 65535) >> 8
    return Image.fromarray(out, "L")


def to_rgb(img: Image.Image) -> Image.Image:
    """Convert any PIL mode to 8-bit RGB.

    * ``1``, ``L``, ``CMYK``, ``YCbCr``, ``LAB``, ``HSV``: PIL's conversion (Adobe-inverted CMYK JPEGs
      are handled by PIL's JPEG plugin).
    * ``RGBA``, ``LA``, ``PA`` and ``P``/``L``/``RGB`` with a ``transparency`` entry: alpha-composited
      over white.
    * ``I;16*`` and ``I`` (16-bit PNG/TIFF greyscale): the top 8 bits (``v >> 8``).

    Raises:
        DecodeError: for modes with no defined 8-bit meaning (``F``, 32-bit float).
    """
    mode = img.mode
    if mode == "RGB":
        if "transparency" not in img.info:
            return img
    if mode.startswith("I;16") or mode == "I":
        return _top_byte(img).convert("RGB")
    if mode == "F":
        raise DecodeError("32-bit float image (mode F) has no defined 8-bit range; convert it to 8/16-bit")
    if mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in img.info:
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, BACKGROUND + (255,))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return img.convert("RGB")


def decode_pil(data: bytes, min_size: int | None = None, max_pixels: int | None = None,
               resize_side: int | None = None) -> Image.Image:
    """Decode image bytes to an RGB PIL image.

    Args:
        data: encoded image bytes (JPEG, PNG, WebP, BMP, GIF, TIFF, PPM).
        min_size: if given, a JPEG may be decoded at reduced scale (draft mode) provided its shorter side
            stays >= ``min_size``. ``None`` decodes at full resolution.
        max_pixels: pixel limit (see :func:`open_image`).
        resize_side: the shorter side the image will be resized to; the resized image must fit ``max_pixels``
            too (see :func:`open_image`).

    Returns:
        An RGB image (8 bit per channel), upright: the EXIF orientation is applied (:func:`upright`).

    Raises:
        DecodeError: empty, unrecognised, truncated, oversized or otherwise undecodable bytes.
    """
    img = open_image(data, max_pixels, resize_side)
    if min_size is not None and img.format == "JPEG":
        img.draft("RGB", draft_request(*img.size, min_size))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            img.load()
            return to_rgb(upright(img))
    except DecodeError:
        raise
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as exc:
        raise DecodeError(f"corrupt or truncated {img.format} data: {exc}") from exc


def decode_image(data: bytes, min_size: int | None = None, max_pixels: int | None = None,
                 resize_side: int | None = None) -> torch.Tensor:
    """Decode image bytes to a ``torch.uint8`` tensor of shape (3, H, W), values in [0, 255].

    See :func:`decode_pil` for ``min_size`` (JPEG draft decoding) and the errors raised. The tensor is a
    channels-last view (strides H*W*3 -> 1), which torchvision's uint8 resize kernels process fastest.
    """
    return TF.pil_to_tensor(decode_pil(data, min_size, max_pixels, resize_side))


def image_size(data: bytes, max_pixels: int | None = None) -> tuple[int, int, str]:
    """``(width, height, format)`` as the image is seen (EXIF orientation applied), from the header only; raises
    :class:`DecodeError` as :func:`open_image`."""
    img = open_image(data, max_pixels)
    width, height = img.size
    if exif_orientation(img) in _SWAPS_AXES:
        width, height = height, width
    return width, height, img.format
