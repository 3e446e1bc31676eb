"""Preprocessing as a recorded protocol: full JPEG decoding by default, ADM's centre crop (checked against a
straightforward PIL transcription of the paper's procedure), the choice recorded in metrics.json and the report,
and ``--save-npz`` in the ADM evaluator's layout."""

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from loopdata_helpers import write_shard
from PIL import Image

import loopdata
from loopdata.decode import decode_image
from loopdata.transforms import AdmCenterCrop, build_transforms, make_options
from loopvae.cli import main as loopvae_main
from loopvae.demo import bundled_model_dir
from lv_testing import data_urls


def adm_reference(pil: Image.Image, size: int) -> np.ndarray:
    """ADM's center_crop_arr as the paper's code does it, written out plainly for the comparison."""
    while min(*pil.size) >= 2 * size:
        pil = pil.resize(tuple(x // 2 for x in pil.size), resample=Image.BOX)
    scale = size / min(*pil.size)
    pil = pil.resize(tuple(round(x * scale) for x in pil.size), resample=Image.BICUBIC)
    arr = np.array(pil)
    top, left = (arr.shape[0] - size) // 2, (arr.shape[1] - size) // 2
    return arr[top: top + size, left: left + size]


def _photo(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, size=(height // 8 + 1, width // 8 + 1, 3), dtype=np.uint8)
    smooth = Image.fromarray(base).resize((width, height), Image.BICUBIC)
    noise = rng.integers(-20, 21, size=(height, width, 3))
    return Image.fromarray(np.clip(np.asarray(smooth).astype(int) + noise, 0, 255).astype(np.uint8))


@pytest.mark.parametrize("size, wh", [(64, (1000, 700)), (64, (300, 200)), (256, (256, 300)), (32, (33, 500)),
                                      (64, (40, 30))])
def test_adm_centre_crop_equals_the_plain_pil_procedure(size: int, wh: tuple[int, int]) -> None:
    pil = _photo(*wh, seed=size)
    ours = AdmCenterCrop(size)(torch.from_numpy(np.asarray(pil).copy()).permute(2, 0, 1))
    assert ours.shape == (3, size, size) and ours.dtype == torch.uint8
    assert np.array_equal(ours.permute(1, 2, 0).numpy(), adm_reference(pil, size))


def test_jpeg_draft_is_off_by_default_and_differs_when_asked_for() -> None:
    buf = io.BytesIO()
    _photo(1024, 768, seed=3).save(buf, format="JPEG", quality=90)
    data = buf.getvalue()
    full = build_transforms("reconstruction", False, 128, make_options("reconstruction"))
    draft = build_transforms("reconstruction", False, 128, make_options("reconstruction", draft=True))
    assert full.draft_size is None and draft.draft_size == 128
    a = full.sample(decode_image(data, full.draft_size))
    b = draft.sample(decode_image(data, draft.draft_size))
    plain = full.sample(torch.from_numpy(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).copy())
                        .permute(2, 0, 1))
    assert torch.equal(a, plain)  # the default is a full decode
    assert (a.int() - b.int()).abs().max() > 0  # draft decoding changes pixels: it must be asked for
    with pytest.raises(ValueError, match="preprocess 'center'"):
        make_options("reconstruction", preprocess="center")


def test_eval_records_the_preprocessing_and_writes_adm_npz_batches(tmp_path: Path) -> None:
    buf = io.BytesIO()
    _photo(600, 400, seed=5).save(buf, format="JPEG", quality=92)
    shard = write_shard(tmp_path / "s" / "s-000000.tar", [("wide", {"jpg": buf.getvalue()})])
    urls = f"{shard},{data_urls('val')}"
    out = tmp_path / "adm"
    assert loopvae_main(["eval", "--checkpoint", str(bundled_model_dir()), "--data", urls, "--out", str(out),
                         "--resolution", "64", "--lpips-net", "none", "--num-workers", "0", "--no-progress",
                         "--preprocess", "adm", "--save-npz"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["preprocessing"]["method"] == "adm" and metrics["preprocessing"]["jpeg_draft"] is False
    assert "`adm`" in (out / "report.md").read_text() and "draft decoding off" in (out / "report.md").read_text()
    rec = np.load(out / "npz" / "reconstructions.npz")["arr_0"]
    ref = np.load(out / "npz" / "references.npz")["arr_0"]
    keys = json.loads((out / "npz" / "keys.json").read_text())
    assert rec.shape == ref.shape == (5, 64, 64, 3) and rec.dtype == ref.dtype == np.uint8
    # the references are ADM crops of the decoded images, and the arrays are what the metrics were computed on
    i = [k["key"] for k in keys].index("wide")
    assert np.array_equal(ref[i], adm_reference(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"), 64))
    rows = {r["key"]: r for r in json.loads((out / "per_image.json").read_text())}
    mse = ((rec[i].astype(np.float64) - ref[i]) ** 2).mean()
    assert rows["wide"]["psnr"] == pytest.approx(10 * np.log10(255**2 / mse), abs=1e-6)
    default = tmp_path / "default"
    assert loopvae_main(["eval", "--checkpoint", str(bundled_model_dir()), "--data", urls, "--out", str(default),
                         "--resolution", "64", "--lpips-net", "none", "--num-workers", "0", "--no-progress"]) == 0
    pre = json.loads((default / "metrics.json").read_text())["preprocessing"]
    assert pre["method"] == "resize-crop" and pre["jpeg_draft"] is False
    assert not (default / "npz").exists()
    loader = loopdata.make_loader(str(shard), task="reconstruction", train=False, batch_size=1, num_workers=0,
                                  resolution=64, rank=0, world_size=1)
    assert next(iter(loader))["image"].shape == (1, 3, 64, 64)
