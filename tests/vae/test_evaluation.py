"""loopvae eval / intervene / profile: metric cross-checks against independent computations, and the CLIs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import piq
import pytest
import scipy.linalg
import torch
from PIL import Image
from torchmetrics.image.fid import FrechetInceptionDistance

import loopvae
from loopvae.cli import main as loopvae_main
from loopvae.metrics import INCEPTION_FILE, bicubic_baseline, psnr_per_image, range_statistics, ssim_per_image
from loopvae.perceptual import default_backbone_path
from lv_testing import data_urls


def run_cli(*args: str) -> None:
    assert loopvae_main(list(args)) == 0


def test_psnr_equals_numpy_on_the_saved_uint8_images(tiny_run, tmp_path: Path) -> None:
    run_dir, _ = tiny_run
    out = tmp_path / "eval"
    run_cli("eval", "--checkpoint", str(run_dir), "--data", data_urls("val"), "--out", str(out), "--resolution", "64",
            "--lpips-random-backbone", "--save-images", "--num-workers", "0")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["num_images"] == 4 and metrics["rfid"] is None
    assert "weights-inception" in metrics["rfid_unavailable_reason"]
    assert metrics["model"]["kind"] == "run-checkpoint" and metrics["model"]["step"] == 40
    assert any(k.endswith("model.pt") for k in metrics["weights_sha256"])
    psnrs = []
    for rec in sorted((out / "images" / "reconstruction" / "kodak-val-000000").glob("*.png")):
        a = np.asarray(Image.open(rec), dtype=np.float64)
        b = np.asarray(Image.open(out / "images" / "reference" / "kodak-val-000000" / rec.name), dtype=np.float64)
        psnrs.append(10 * np.log10(255.0**2 / np.mean((a - b) ** 2)))
    assert len(psnrs) == 4
    # torchmetrics evaluates its log10 constants in float32: agreement is to ~1e-7 dB, not bit-exact
    assert metrics["psnr"] == pytest.approx(float(np.mean(psnrs)), abs=1e-6)
    assert (out / "grid.png").is_file() and "| tokenizer |" in (out / "report.md").read_text()


def test_require_fid_without_weights_is_a_clear_error(tiny_run, tmp_path: Path) -> None:
    from loopvae.evaluate import EvalOptions, evaluate

    options = EvalOptions(resolution=64, require_fid=True, lpips_net="none", num_workers=0,
                          fid_weights=str(tmp_path / INCEPTION_FILE))
    with pytest.raises(FileNotFoundError, match="FID Inception weights not found at .*pass --fid-weights PATH"):
        evaluate(tiny_run[0], data_urls("val"), tmp_path / "strict", options)


def test_ssim_matches_piq_and_psnr_matches_formula() -> None:
    torch.manual_seed(0)
    a = torch.randint(0, 256, (3, 3, 48, 40), dtype=torch.uint8)
    b = (a.float() + torch.randn(a.shape) * 12).clamp(0, 255).round().to(torch.uint8)
    ours = ssim_per_image(b, a)
    ref = piq.ssim(b.double() / 255, a.double() / 255, data_range=1.0, kernel_size=11, kernel_sigma=1.5,
                   reduction="none", downsample=False)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-4)
    smooth = torch.nn.functional.avg_pool2d(a.float(), 5, 1, 2).round().to(torch.uint8)  # lower SSIM, borders matter
    noisy = (smooth.float() + torch.randn(a.shape) * 12).clamp(0, 255).round().to(torch.uint8)
    ref = piq.ssim(noisy.double() / 255, smooth.double() / 255, data_range=1.0, kernel_size=11, kernel_sigma=1.5,
                   reduction="none", downsample=False)
    torch.testing.assert_close(ssim_per_image(noisy, smooth), ref, rtol=0, atol=1e-4)
    mse = (a.double() - b.double()).pow(2).flatten(1).mean(1)
    torch.testing.assert_close(psnr_per_image(b, a), 10 * torch.log10(255.0**2 / mse))


def test_frechet_distance_matches_scipy_on_the_same_features() -> None:
    torch.manual_seed(0)
    # size-agnostic (torchmetrics probes the module with a 299x299 dummy): pool to 8x8, then project
    extractor = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(8), torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 6))
    extractor.requires_grad_(False)
    real = torch.randint(0, 256, (40, 3, 8, 8), dtype=torch.uint8)
    fake = (real.float() * 0.8 + 20).clamp(0, 255).to(torch.uint8)
    fid = FrechetInceptionDistance(feature=torch.nn.Sequential(_Float(), extractor), normalize=False)
    for chunk in range(0, 40, 16):  # streaming updates
        fid.update(real[chunk : chunk + 16], real=True)
        fid.update(fake[chunk : chunk + 16], real=False)
    with torch.no_grad():
        fr = extractor(real.float()).double().numpy()
        ff = extractor(fake.float()).double().numpy()
    mu1, mu2 = fr.mean(0), ff.mean(0)
    s1, s2 = np.cov(fr, rowvar=False), np.cov(ff, rowvar=False)
    covmean = scipy.linalg.sqrtm(s1 @ s2).real
    expected = float(((mu1 - mu2) ** 2).sum() + np.trace(s1 + s2 - 2 * covmean))
    assert float(fid.compute()) == pytest.approx(expected, rel=1e-6)


class _Float(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float()


def _random_inception_file(path: Path) -> Path:
    """Random weights with torch-fidelity's InceptionV3 architecture (the real file cannot be downloaded)."""
    from unittest import mock

    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    with mock.patch.object(torch, "load", return_value=None), \
         mock.patch.object(FeatureExtractorInceptionV3, "load_state_dict", return_value=None):
        net = FeatureExtractorInceptionV3("inception-v3-compat", ["2048"], feature_extractor_weights_path="x")
    torch.save(net.state_dict(), path)
    return path


def test_rfid_path_runs_with_an_inception_file_and_records_its_sha256(tiny_run, tmp_path: Path) -> None:
    weights = _random_inception_file(tmp_path / INCEPTION_FILE)
    run_cli("eval", "--checkpoint", str(tiny_run[0] / "release"), "--data", data_urls("val"), "--out",
            str(tmp_path / "fid"), "--resolution", "64", "--lpips-net", "none", "--fid-weights", str(weights),
            "--require-fid", "--num-workers", "0")
    metrics = json.loads((tmp_path / "fid" / "metrics.json").read_text())
    assert metrics["rfid"] is not None and np.isfinite(metrics["rfid"])
    assert metrics["weights_sha256"][f"inception/{INCEPTION_FILE}"]
    assert metrics["model"]["kind"] == "release"
    # 4 images are not the 50,000 published figures use: metrics.json and the report say so
    assert "4 images, not the 50,000" in metrics["rfid_warning"]
    assert "**Warning:** rFID from 4 images" in (tmp_path / "fid" / "report.md").read_text()


@pytest.mark.skipif(not default_backbone_path("alex").is_file(),
                    reason=f"real LPIPS backbone weights not present at {default_backbone_path('alex')}")
def test_lpips_with_real_backbone_weights(tiny_run, tmp_path: Path) -> None:
    run_cli("eval", "--checkpoint", str(tiny_run[0]), "--data", data_urls("val"), "--out", str(tmp_path / "e"),
            "--resolution", "64", "--lpips-net", "alex", "--num-workers", "0")
    metrics = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert 0 < metrics["lpips"] < 1 and any(k.startswith("lpips/") for k in metrics["weights_sha256"])


def test_eval_under_torchrun_counts_every_image_once(tiny_run, tmp_path: Path) -> None:
    out = tmp_path / "ddp-eval"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "loopvae",
           "eval", "--checkpoint", str(tiny_run[0]), "--data", f"{data_urls('train')},{data_urls('val')}",
           "--out", str(out), "--resolution", "32", "--lpips-net", "none", "--num-workers", "1", "--device", "cpu"]
    proc = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((out / "per_image.json").read_text())
    keys = [r["key"] for r in rows]
    assert len(keys) == len(set(keys)) == 24  # 20 train + 4 val images, each exactly once
    assert json.loads((out / "metrics.json").read_text())["num_images"] == 24


def test_eval_of_a_reference_autoencoderkl_folder(tmp_path: Path) -> None:
    vae = loopvae.create_model("sd-vae", block_out_channels=(32, 32, 32, 32), layers_per_block=1)
    vae.save_pretrained(tmp_path / "sd-small")
    run_cli("eval", "--checkpoint", str(tmp_path / "sd-small"), "--data", data_urls("val"), "--out",
            str(tmp_path / "e"), "--resolution", "64", "--lpips-net", "none", "--limit", "2", "--num-workers", "0")
    metrics = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert metrics["model"]["class"] == "AutoencoderKL" and metrics["num_images"] == 2
    # 4 latent channels / 8^2 = 1/16 values per pixel: 3 * 10^2 = 300 >= 64^2 / 16 = 256 > 3 * 9^2
    assert metrics["baseline"]["low_resolution"] == [10, 10]


def test_bicubic_baseline_keeps_at_least_the_latent_values_per_pixel() -> None:
    x = torch.rand(2, 3, 256, 256) * 2 - 1
    rec, (h, w) = bicubic_baseline(x, 16 / 64)
    assert rec.shape == x.shape and 3 * h * w >= 0.25 * 256 * 256 and (h, w) == (74, 74)
    recon = torch.zeros(1, 3, 16, 16)
    recon[:, 0] = 1.5  # every pixel has one channel out of range, by 0.25 on the [0, 1] scale
    stats = range_statistics(recon, torch.zeros(1, 3, 16, 16))
    assert float(stats["out_of_range"][0]) == 1.0
    assert float(stats["clip_displacement"][0]) == pytest.approx(0.25 / 3)


def test_intervene_on_a_trained_tiny_checkpoint(tiny_run, tmp_path: Path) -> None:
    out = tmp_path / "iv"
    run_cli("intervene", "--checkpoint", str(tiny_run[0]), "--data", data_urls("val"), "--out", str(out),
            "--limit", "4", "--resolution", "64")
    result = json.loads((out / "interventions.json").read_text())
    assert result["full_prefix_reproduces_baseline"] is True and result["num_images"] == 4
    assert {"psnr", "raw_psnr", "ssim", "out_of_range", "clip_displacement", "per_image"} <= set(result["baseline"])
    stages = result["stages"]
    assert [(s["branch"], s["scale"], s["passes"]) for s in stages] == [
        ("encoder", "2x", 1), ("encoder", "4x", 2), ("encoder", "8x", 4),
        ("decoder", "8x", 1), ("decoder", "4x", 2), ("decoder", "2x", 4),
    ]
    for st in stages:
        assert [p["passes"] for p in st["prefix"]] == list(range(1, st["passes"] + 1))
        assert [b["pass"] for b in st["bypass"]] == list(range(st["passes"]))
        assert len(st["relative_update"]) == st["passes"] and all(u >= 0 for u in st["relative_update"])
        assert st["prefix"][-1]["psnr"] == result["baseline"]["psnr"]
        assert len(st["prefix"][0]["per_image"]["raw_psnr"]) == 4
    for name in ("interventions.md", "psnr_vs_passes.png", "bypass_loss.png", "relative_update.png"):
        assert (out / name).is_file()


def test_profile_rows_for_every_registered_model_and_paper_macs(tmp_path: Path) -> None:
    models = loopvae.list_models()
    run_cli("profile", "--models", ",".join(models), "--macs-only", "--out", str(tmp_path / "p"))
    rows = {r["model"]: r for r in json.loads((tmp_path / "p" / "profile.json").read_text())}
    assert set(rows) == set(models)
    for r in rows.values():
        assert {"model", "params", "gmacs", "ms_per_image", "images_per_s", "peak_mem_mib"} <= set(r)
    assert abs(rows["loopvae-cnn-f8d16"]["gmacs"] - 700.92) <= 0.10 * 700.92
    assert abs(rows["flux-vae"]["gmacs"] - 447.62) <= 0.03 * 447.62
    assert abs(rows["loopvae-cnn-f8d16"]["params"] - 29.07e6) <= 0.03 * 29.07e6
    assert (tmp_path / "p" / "profile.png").is_file()
    assert "| loopvae-cnn-f8d16 |" in (tmp_path / "p" / "profile.md").read_text()


def test_profile_times_the_tiny_model_and_splits_core_time(tmp_path: Path) -> None:
    run_cli("profile", "--models", "loopvae-cnn-tiny", "--resolution", "64", "--warmup", "1", "--iters", "1",
            "--out", str(tmp_path / "p"))
    (row,) = json.loads((tmp_path / "p" / "profile.json").read_text())
    assert row["ms_per_image"] > 0 and row["images_per_s"] > 0 and row["peak_mem_mib"] > 0
    assert sum(row["stage_share_measured"].values()) == pytest.approx(1.0)
    analytic = row["stage_share_analytic"]
    ratios = [analytic[k] * 101 for k in ("encoder 2x", "encoder 4x", "encoder 8x", "decoder 8x", "decoder 4x",
                                           "decoder 2x")]
    assert [round(r) for r in ratios] == [16, 8, 4, 1, 8, 64]


def test_without_matplotlib_plots_are_skipped_with_the_extra_named(tiny_run, tmp_path: Path, monkeypatch,
                                                                    caplog) -> None:
    import sys

    from looprun.plotting import PlotsUnavailable, pyplot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(PlotsUnavailable, match=r"loopvision\[plots\]"):
        pyplot()
    with caplog.at_level("WARNING"):
        run_cli("intervene", "--checkpoint", str(tiny_run[0]), "--data", data_urls("val"), "--out",
                str(tmp_path / "i"), "--limit", "2", "--resolution", "32", "--no-progress")
    assert (tmp_path / "i" / "interventions.json").is_file() and not list((tmp_path / "i").glob("*.png"))
    assert "loopvision[plots]" in caplog.text
