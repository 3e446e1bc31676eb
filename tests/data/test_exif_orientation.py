"""EXIF orientation is applied in every decode path: bytes, shards (training and evaluation), image folders,
the shard writer's recorded size and ``loopvae encode``."""

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

import loopdata
from loopdata.decode import decode_image, exif_orientation, image_size


def _rotated_jpeg(orientation: int = 6) -> tuple[bytes, np.ndarray]:
    """A 64 x 32 JPEG (red left half, blue right half) stored with EXIF ``orientation``, and its upright pixels."""
    stored = np.zeros((32, 64, 3), np.uint8)
    stored[:, :32, 0] = 255
    stored[:, 32:, 2] = 255
    img = Image.fromarray(stored)
    exif = img.getexif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=95, exif=exif.tobytes())
    data = buf.getvalue()
    upright = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
    return data, upright


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_decoding_applies_the_exif_orientation(orientation: int) -> None:
    data, upright = _rotated_jpeg(orientation)
    assert exif_orientation(Image.open(io.BytesIO(data))) == orientation
    image = decode_image(data)
    assert tuple(image.shape[1:]) == upright.shape[:2]
    assert torch.equal(image.permute(1, 2, 0), torch.from_numpy(upright.copy()))
    expected = (32, 64) if orientation in (6, 8) else (64, 32)
    assert image_size(data)[:2] == expected  # what the writer records: the size as seen
    if orientation == 6:  # 90 degrees clockwise: the red left half ends up on top
        assert image[0, :16].float().mean() > 200 and image[2, -16:].float().mean() > 200


def test_shards_folders_training_and_evaluation_see_the_upright_image(tmp_path: Path) -> None:
    data, upright = _rotated_jpeg(6)  # upright: 64 tall, 32 wide
    shard = tmp_path / "s-000000.tar"
    with tarfile.open(shard, "w") as tar:
        for name, payload in (("phone.jpg", data), ("phone.cls", b"0")):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "phone.jpg").write_bytes(data)
    for source in (str(shard), str(folder)):
        # evaluation: shorter side resized to 32 and a centre crop: an upright image keeps red on top
        batch = next(iter(loopdata.make_loader(source, task="reconstruction", train=False, batch_size=1,
                                               num_workers=0, resolution=32, draft=False)))
        img = batch["image"][0]
        assert img[0, :8].mean() > 0.6 and img[2, :8].mean() < -0.6, source  # top rows red, not blue
        assert img[2, -8:].mean() > 0.6, source  # bottom rows blue
        # training (random crops of the upright 64 x 32 image): rows are one colour each (red above blue); the
        # sideways image would give columns of one colour instead (red left, blue right)
        train = next(iter(loopdata.make_loader(source, task="reconstruction", train=True, batch_size=1,
                                               num_workers=0, resolution=32, hflip=0.0, draft=False)))
        t = train["image"][0]
        assert float(t.std(dim=2).mean()) <= float(t.std(dim=1).mean()) + 0.05, source
