"""Held-out validation during ``loopvae train`` (the learning curve) and the optional MSE term."""

import json
from pathlib import Path

import pytest
import torch
from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

from loopvae.evaluate import EvalOptions, evaluate
from loopvae.losses import LossWeights, ReconstructionObjective, kl_per_element
from loopvae.train_config import ConfigError, load_train_config
from loopvae.trainer import train
from lv_testing import FAST, data_urls


def _config(*extra: str):
    return load_train_config("tiny-stage1", [*FAST, "checkpoint_every=5", "log_every=5", "eval_resolution=64",
                                             "eval_images=3", *extra])


def test_the_curve_is_logged_and_its_last_point_is_what_loopvae_eval_measures(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = train(_config("max_steps=10", "eval_every=5"), data_urls(), out, val_data=data_urls("val"))
    curve = json.loads((out / "validation.json").read_text())
    assert [e["step"] for e in curve] == [5, 10] and result.validation == curve
    assert [e["images_seen"] for e in curve] == [20, 40]
    assert all(e["num_images"] == 3 for e in curve)
    assert 0 < curve[0]["train_seconds"] < curve[1]["train_seconds"]
    assert 0 < curve[0]["train_wall_seconds"] < curve[1]["train_wall_seconds"]
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["validation"] == curve and summary["train_seconds"] >= curve[-1]["train_seconds"]
    # the same protocol as loopvae eval: the release (EMA weights) on the same three images
    metrics = evaluate(out / "release", data_urls("val"), tmp_path / "eval",
                       EvalOptions(resolution=64, limit=3, num_workers=0, lpips_net="none", progress=False))
    # training keeps the EMA copy in channels_last, the release loads contiguous: float rounding may move a
    # few uint8 pixels by one level (measured 2e-6 dB here), far below any reported digit
    assert metrics["psnr"] == pytest.approx(curve[-1]["psnr"], abs=1e-3)
    assert metrics["ssim"] == pytest.approx(curve[-1]["ssim"], abs=1e-4)  # eval's metrics, not PSNR only
    assert curve[-1]["lpips"] is None and "LPIPS" in curve[-1]["lpips_unavailable_reason"]
    assert curve[-1]["rfid"] is None and "Inception" in curve[-1]["rfid_unavailable_reason"]
    # the release's model card carries the measured PSNR as Hub front matter (model-index)
    import yaml

    card = (out / "release" / "README.md").read_text()
    assert card.startswith("---\n")
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["library_name"] == "diffusers" and meta["license"] == "apache-2.0" and "loopvae" in meta["tags"]
    (entry,) = meta["model-index"]
    (res,) = entry["results"]
    assert res["metrics"][0]["type"] == "psnr" and res["metrics"][0]["value"] == pytest.approx(curve[-1]["psnr"],
                                                                                               abs=1e-4)


def test_a_resumed_run_keeps_the_curve_of_its_earlier_invocation(tmp_path: Path) -> None:
    out = tmp_path / "run"
    train(_config("max_steps=5", "eval_every=5"), data_urls(), out, val_data=data_urls("val"))
    first = json.loads((out / "validation.json").read_text())
    # max_steps and eval_every may change on resume; the curve and the CPU seconds carry over
    train(_config("max_steps=10", "eval_every=5"), data_urls(), out, val_data=data_urls("val"))
    curve = json.loads((out / "validation.json").read_text())
    assert [e["step"] for e in curve] == [5, 10]
    assert curve[0] == first[0] and curve[1]["train_seconds"] > first[0]["train_seconds"]


def test_without_validation_data_nothing_is_written(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = train(_config("max_steps=5", "eval_every=5"), data_urls(), out)
    assert result.validation == [] and not (out / "validation.json").exists()


def test_mse_term_adds_exactly_its_weighted_mean_square() -> None:
    torch.manual_seed(0)
    x, recon = torch.rand(2, 3, 8, 8) * 2 - 1, torch.rand(2, 3, 8, 8) * 2 - 1
    posterior = DiagonalGaussianDistribution(torch.randn(2, 8, 1, 1))
    plain = ReconstructionObjective(LossWeights(perceptual=0.0))(x, recon, posterior, 0)
    mixed = ReconstructionObjective(LossWeights(perceptual=0.0, mse=10.0))(x, recon, posterior, 0)
    mse = float((recon - x).pow(2).mean())
    assert mixed.logs["mse"] == pytest.approx(mse)
    assert float(mixed.total) == pytest.approx(float(plain.total) + 10.0 * mse, rel=1e-6)
    assert float(plain.total) == pytest.approx(float((recon - x).abs().mean() + 1e-6 * kl_per_element(posterior)))
    assert "mse" not in plain.logs


@pytest.mark.parametrize("override, key", [("eval_every=-1", "eval_every"), ("mse_weight=-1", "mse_weight"),
                                           ("eval_images=0", "eval_images")])
def test_bad_validation_and_loss_keys_are_named(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        load_train_config("tiny-stage1", [override])


def test_validation_reports_lpips_and_rfid_as_eval_does_when_their_weights_are_there(tmp_path: Path) -> None:
    """Random-weight stand-ins of the LPIPS backbone and the Inception net (the real files cannot be downloaded):
    the validation numbers equal loopvae eval's with the same nets on the same images."""
    from test_evaluation import _random_inception_file

    from looprun.distributed import DistributedContext
    from loopvae.demo import bundled_model_dir
    from loopvae.loading import load_artifact
    from loopvae.perceptual import PerceptualLoss
    from loopvae.validation import ValidationMetrics, ValidationSet, validation_psnr

    inception = _random_inception_file(tmp_path / "inception.pth")
    torch.manual_seed(0)
    lpips = PerceptualLoss("alex", random_backbone=True)
    model = load_artifact(bundled_model_dir())
    metrics = ValidationMetrics(lpips=lpips, lpips_reason=None, fid_weights=str(inception))
    ctx = DistributedContext()
    val = validation_psnr(model, ValidationSet(data_urls("val"), 64, 4), ctx, metrics)
    ev = evaluate(bundled_model_dir(), data_urls("val"), tmp_path / "e",
                  EvalOptions(resolution=64, limit=4, num_workers=0, lpips_net="none", fid_weights=str(inception),
                              progress=False))
    for key in ("psnr", "ssim", "rfid"):
        assert val[key] == pytest.approx(ev[key], rel=1e-4, abs=1e-6), key
    # LPIPS: the same (randomly initialised) net applied as eval applies it, to the uint8 images
    import loopdata
    from loopvae.autoencoders import reconstruct_mode
    from loopvae.metrics import to_uint8

    batch = next(iter(loopdata.make_loader(data_urls("val"), task="reconstruction", train=False, batch_size=4,
                                           num_workers=0, resolution=64, rank=0, world_size=1)))
    with torch.no_grad():
        ref, rec = to_uint8(batch["image"]), to_uint8(reconstruct_mode(model, batch["image"]))
        expected = float(lpips(rec.float() / 127.5 - 1, ref.float() / 127.5 - 1).mean())
    assert val["lpips"] == pytest.approx(expected, rel=1e-5)
