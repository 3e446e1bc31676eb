"""Defensive decoding: every colour mode becomes RGB, bad bytes give clear errors, loaders skip or raise."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from loopdata_helpers import encode, jpeg, noise_image, palette_png_with_alpha, png_16bit, write_shard
from PIL import Image

from loopdata import CorruptSampleError, DecodeError, decode_image, make_loader
from loopdata.decode import decode_pil

GOOD = ("cmyk", "palette_alpha", "png16_grey", "png16_rgb", "tiny", "grey", "rgba", "normal")
BAD = ("truncated", "zero_bytes", "text")


def hard_samples() -> dict[str, bytes]:
    """Hostile inputs (a truncated JPEG, a zero-byte file, a text file named .jpg) and awkward modes
    (CMYK, palette with alpha, 16-bit grey/RGB PNG, tiny, grey, RGBA, normal), keyed by sample key."""
    full = jpeg(64, 48, seed=3)
    return {
        "truncated": full[: len(full) // 2],
        "zero_bytes": b"",
        "text": b"this is a text file that was named .jpg by mistake\n",
        "cmyk": encode(Image.new("CMYK", (16, 16), (0, 255, 0, 0)), "JPEG", quality=95),
        "palette_alpha": palette_png_with_alpha(),
        "png16_grey": png_16bit(np.full((8, 8), 0xABCD, np.uint16)),
        "png16_rgb": png_16bit(
            np.stack([np.full((8, 8), v, np.uint16) for v in (0xABCD, 0x1234, 0xFF00)], -1)
        ),
        "tiny": jpeg(20, 20, seed=4),
        "grey": encode(noise_image(16, 12, 5, "L"), "JPEG"),
        "rgba": encode(Image.new("RGBA", (8, 8), (0, 0, 255, 0)), "PNG"),
        "normal": jpeg(40, 30, seed=6),
    }


@pytest.fixture
def hard_shard(tmp_path):
    """One shard holding every hard case (images stored under .jpg, as a mislabelled file would be)."""
    samples = [(key, {"jpg": data, "cls": b"1"}) for key, data in sorted(hard_samples().items())]
    return write_shard(tmp_path / "hard-000000.tar", samples)


@pytest.mark.parametrize("key", BAD)
def test_bad_bytes_raise_decode_error(key):
    with pytest.raises(DecodeError) as info:
        decode_image(hard_samples()[key])
    expected = {"truncated": "truncated", "zero_bytes": "empty", "text": "not a recognised image"}[key]
    assert expected in str(info.value)


@pytest.mark.parametrize("key", GOOD)
def test_every_mode_becomes_rgb_uint8(key):
    image = decode_image(hard_samples()[key])
    assert image.dtype == torch.uint8 and image.ndim == 3 and image.shape[0] == 3


def test_mode_conversions_give_the_expected_colours():
    samples = hard_samples()
    # CMYK (0, 255, 0, 0) = full magenta ink -> RGB magenta (JPEG is lossy: allow a few levels).
    cmyk = decode_image(samples["cmyk"])[:, 0, 0].tolist()
    assert cmyk[0] > 245 and cmyk[1] < 10 and cmyk[2] > 245
    # Palette with transparency: the transparent pixel composites to white, the opaque one stays red.
    palette = decode_image(samples["palette_alpha"])
    assert palette[:, 0, 0].tolist() == [255, 255, 255]
    assert palette[:, 1, 1].tolist() == [255, 0, 0]
    # 16-bit: top 8 bits (plain convert("RGB") would saturate greyscale to white).
    assert decode_image(samples["png16_grey"])[:, 0, 0].tolist() == [0xAB] * 3
    assert decode_image(samples["png16_rgb"])[:, 0, 0].tolist() == [0xAB, 0x12, 0xFF]
    # Fully transparent blue RGBA -> white background.
    assert decode_image(samples["rgba"])[:, 0, 0].tolist() == [255, 255, 255]
    grey = decode_image(samples["grey"])
    assert torch.equal(grey[0], grey[1]) and torch.equal(grey[1], grey[2])


def test_jpeg_draft_keeps_the_requested_shorter_side():
    data = jpeg(400, 300, seed=1)
    assert decode_image(data).shape == (3, 300, 400)
    drafted = decode_image(data, min_size=100)  # 1/2 scale keeps 150 >= 100; 1/4 would give 75
    assert drafted.shape == (3, 150, 200)
    assert decode_image(data, min_size=300).shape == (3, 300, 400)
    # PNGs have no draft mode: always full size.
    png = encode(noise_image(400, 300, 1), "PNG")
    assert decode_image(png, min_size=50).shape == (3, 300, 400)


def test_decoded_pixels_match_pil():
    data = jpeg(40, 30, seed=2)
    expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert np.array_equal(decode_image(data).permute(1, 2, 0).numpy(), expected)
    assert decode_pil(data).mode == "RGB"


def test_training_skips_and_counts_corrupt_samples(hard_shard):
    loader = make_loader(
        hard_shard, "reconstruction", train=True, batch_size=2, num_workers=0, resolution=32, shuffle_buffer=0
    )
    keys = [key for batch in loader for key in batch["key"]]
    assert len(keys) == len(loader) * 2 == (len(GOOD) + len(BAD)) // 2 * 2
    assert set(keys) == set(GOOD)  # every decodable sample, nothing else
    assert loader.corrupt_count >= len(BAD)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_evaluation_names_the_shard_and_key_of_a_corrupt_sample(hard_shard, num_workers):
    loader = make_loader(
        hard_shard, "reconstruction", train=False, batch_size=4, num_workers=num_workers, resolution=32
    )
    with pytest.raises(CorruptSampleError) as info:
        list(loader)
    message = str(info.value)
    assert hard_shard in message and "'text'" in message and "skip_corrupt=True" in message


def test_evaluation_with_skip_corrupt_yields_every_good_sample_once(hard_shard):
    loader = make_loader(
        hard_shard,
        "reconstruction",
        train=False,
        batch_size=3,
        num_workers=2,
        resolution=32,
        skip_corrupt=True,
    )
    batches = list(loader)
    keys = [key for batch in batches for key in batch["key"]]
    assert sorted(keys) == sorted(GOOD)
    assert loader.corrupt_count == len(BAD)
    for batch in batches:
        # The 20x20 image (and the 8x8 ones) are upscaled to the crop, not dropped.
        assert batch["image"].shape[1:] == (3, 32, 32)
        assert batch["image"].min() >= -1 and batch["image"].max() <= 1


def test_16bit_images_convert_in_blocks_to_the_same_top_byte(monkeypatch):
    """The row-block conversion equals the whole-image ``v >> 8`` (clipped to [0, 65535]) exactly, with blocks
    that do not divide the height, for 16-bit PNGs and 32-bit integer images with out-of-range values."""
    import loopdata.decode as decode_module

    monkeypatch.setattr(decode_module, "SIXTEEN_BIT_BLOCK_PIXELS", 7 * 13)  # 7 rows of 13 per block
    rng = np.random.default_rng(0)
    grey = rng.integers(0, 65536, size=(30, 13), dtype=np.uint16)
    out = decode_image(png_16bit(grey))
    assert torch.equal(out, torch.from_numpy((grey >> 8).astype(np.uint8)).expand(3, -1, -1))
    wide = rng.integers(-70000, 140000, size=(30, 13), dtype=np.int32)
    img = decode_module.to_rgb(Image.fromarray(wide, "I"))
    expected = (np.clip(wide, 0, 65535) >> 8).astype(np.uint8)
    assert np.array_equal(np.asarray(img)[..., 0], expected) and img.mode == "RGB"
