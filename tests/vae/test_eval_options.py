"""``loopvae eval`` / ``intervene`` / ``latent-stats`` options: missing metric weights, --weights, --dtype,
image folders as --data, logs, the intervention protocol and the latent statistics."""

import json
import math
import shutil
import tarfile
from pathlib import Path

import pytest
import torch

import loopdata
from loopvae import LoopVAE
from loopvae.cli import main as loopvae_main
from loopvae.intervene import score
from loopvae.metrics import PSNR_CAP_DB, psnr_per_image, range_statistics, ssim_per_image, to_uint8
from lv_testing import data_urls


def _run(*args: str) -> int:
    return loopvae_main(list(args))


def _kodak_folder(tmp_path: Path) -> Path:
    root = tmp_path / "photos" / "nested"
    root.mkdir(parents=True)
    with tarfile.open(loopdata.bundled_kodak_urls("val")[0]) as tar:
        for member in tar.getmembers():
            if member.name.endswith(".jpg"):
                (root / member.name).write_bytes(tar.extractfile(member).read())
    return root.parent


def test_missing_lpips_weights_give_null_with_the_reason_like_rfid(tiny_run, tmp_path: Path, monkeypatch,
                                                                   capsys) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty-hub"))  # no LPIPS or Inception weights there
    out = tmp_path / "e"
    assert _run("eval", "--checkpoint", str(tiny_run[0]), "--data", data_urls("val"), "--out", str(out),
                "--resolution", "64", "--num-workers", "0", "--lpips-net", "alex") == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["lpips"] is None and metrics["rfid"] is None
    assert "alexnet-owt-7be5be79.pth" in metrics["lpips_unavailable_reason"]
    assert "--require-lpips" in metrics["lpips_unavailable_reason"]
    # the hint names eval's own flags, not train's config keys
    assert "--lpips-net none" in metrics["lpips_unavailable_reason"]
    assert "perceptual_weight" not in metrics["lpips_unavailable_reason"]
    assert "FID Inception weights not found" in metrics["rfid_unavailable_reason"]
    log = (out / "eval.log").read_text()  # the user sees why: in eval.log and on stderr
    assert "LPIPS unavailable" in log and "rFID unavailable" in log
    assert "LPIPS unavailable" in capsys.readouterr().err
    assert _run("eval", "--checkpoint", str(tiny_run[0]), "--data", data_urls("val"), "--out", str(out),
                "--resolution", "64", "--num-workers", "0", "--require-lpips") == 2
    assert "alexnet-owt-7be5be79.pth, not found" in capsys.readouterr().err
    assert _run("eval", "--checkpoint", str(tiny_run[0]), "--data", data_urls("val"), "--out", str(out),
                "--resolution", "64", "--num-workers", "0", "--lpips-net", "none", "--require-fid") == 2
    assert "FID Inception weights not found" in capsys.readouterr().err


def test_weights_dtype_and_folder_data(tiny_run, tmp_path: Path) -> None:
    common = ["--resolution", "64", "--num-workers", "0", "--lpips-net", "none", "--no-progress"]
    results = {}
    for name, extra in {"ema": [], "model": ["--weights", "model"], "bf16": ["--dtype", "bf16"]}.items():
        out = tmp_path / name
        assert _run("eval", "--checkpoint", str(tiny_run[0]), "--data", data_urls("val"), "--out", str(out),
                    *common, *extra) == 0
        results[name] = json.loads((out / "metrics.json").read_text())
    assert results["model"]["model"]["weights"] == "model" and results["ema"]["model"]["weights"] == "ema"
    assert results["model"]["psnr"] != results["ema"]["psnr"]  # 40 steps at EMA 0.99: different weights
    assert results["bf16"]["model"]["dtype"] == "bf16"
    assert results["bf16"]["psnr"] != results["ema"]["psnr"]
    assert abs(results["bf16"]["psnr"] - results["ema"]["psnr"]) < 1.0  # bf16 rounding, not a different model
    folder = _kodak_folder(tmp_path)
    out = tmp_path / "folder"
    assert _run("eval", "--checkpoint", str(tiny_run[0]), "--data", str(folder), "--out", str(out), *common) == 0
    from_folder = json.loads((out / "metrics.json").read_text())
    assert from_folder["num_images"] == 4 and from_folder["psnr"] == pytest.approx(results["ema"]["psnr"], abs=1e-9)
    assert _run("intervene", "--checkpoint", str(tiny_run[0]), "--data", str(folder), "--out", str(tmp_path / "iv"),
                "--limit", "2", "--resolution", "32", "--dtype", "bf16", "--no-progress") == 0
    iv = json.loads((tmp_path / "iv" / "interventions.json").read_text())
    assert iv["dtype"] == "bf16" and iv["keys"] == ["nested_kodim21", "nested_kodim22"]
    assert (tmp_path / "iv" / "intervene.log").is_file()


def test_intervention_metrics_are_computed_on_float_outputs_and_capped() -> None:
    torch.manual_seed(0)
    target = torch.rand(2, 3, 32, 32) * 2 - 1
    recon = target + 0.01 * torch.randn_like(target)
    recon[0, :, :4, :4] = 1.3  # out of range
    stats = range_statistics(recon, target)
    u, ref = (recon.double() + 1) / 2, (target.double() + 1) / 2
    mse_clip = (u.clamp(0, 1) - ref).pow(2).flatten(1).mean(1)
    mse_raw = (u - ref).pow(2).flatten(1).mean(1)
    torch.testing.assert_close(stats["psnr"], 10 * torch.log10(1 / mse_clip))
    torch.testing.assert_close(stats["raw_psnr"], 10 * torch.log10(1 / mse_raw))
    assert bool((stats["raw_psnr"] < stats["psnr"]).all())  # clipping only helps
    uint8 = psnr_per_image(to_uint8(recon), to_uint8(target))
    assert not torch.allclose(stats["psnr"], uint8)  # not the quantised evaluation protocol
    # SSIM of clip(u) and of u on the float [0, 1] scale (computed in float32: within 1e-5 of float64)
    torch.testing.assert_close(stats["ssim"], ssim_per_image(u.clamp(0, 1), ref, data_range=1.0), atol=1e-5, rtol=0)
    torch.testing.assert_close(stats["raw_ssim"], ssim_per_image(u, ref, data_range=1.0), atol=1e-5, rtol=0)
    assert not torch.allclose(stats["ssim"], stats["raw_ssim"], atol=1e-5)
    exact = range_statistics(target, target)
    assert exact["psnr"].tolist() == exact["raw_psnr"].tolist() == [PSNR_CAP_DB] * 2


def test_an_exact_reconstruction_scores_the_cap_and_serialises_as_valid_json() -> None:
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    scores = score(x.clone(), x)
    text = json.dumps(scores, allow_nan=False)  # raises on inf / nan
    assert "Infinity" not in text and scores["psnr"] == scores["raw_psnr"] == [PSNR_CAP_DB] * 2
    assert scores["ssim"] == pytest.approx([1.0, 1.0]) and scores["out_of_range"] == [0.0, 0.0]


def test_latent_stats_give_unit_variance_latents_and_are_written_into_config(tiny_run, tmp_path: Path,
                                                                              capsys) -> None:
    release = tmp_path / "release"
    shutil.copytree(tiny_run[0] / "release", release)
    before = (release / "config.json").read_text()
    assert _run("latent-stats", "--checkpoint", str(release), "--data", data_urls("val"), "--resolution", "64",
                "--num-workers", "0", "--dry-run", "--no-progress") == 0
    assert "dry run" in capsys.readouterr().out and (release / "config.json").read_text() == before
    assert _run("latent-stats", "--checkpoint", str(release), "--data", data_urls("val"), "--resolution", "64",
                "--num-workers", "0", "--posterior", "mode", "--no-progress") == 0
    model = LoopVAE.from_pretrained(release)
    cfg = model.config
    assert cfg.latent_statistics["num_images"] == 4 and cfg.latent_statistics["posterior"] == "mode"
    record = json.loads((release / "latent_stats.json").read_text())
    assert record["keys"] == ["kodim21", "kodim22", "kodim23", "kodim24"] and len(record["channel_mean"]) == 16
    # independently: normalised latents of the same images have mean 0 and variance 1
    images = next(iter(loopdata.make_loader(data_urls("val"), train=False, batch_size=4, num_workers=0,
                                            resolution=64)))["image"]
    with torch.no_grad():
        z = model.encode(images).latent_dist.mode().double()
    normalised = (z - cfg.shift_factor) * cfg.scaling_factor
    assert abs(float(normalised.mean())) < 1e-6
    assert float(normalised.var(unbiased=False)) == pytest.approx(1.0, abs=1e-6)
    assert cfg.scaling_factor == pytest.approx(1 / math.sqrt(float(z.var(unbiased=False))), rel=1e-6)
    # the same four images as an image folder give the same estimate
    capsys.readouterr()
    assert _run("latent-stats", "--checkpoint", str(release), "--data", str(_kodak_folder(tmp_path)), "--resolution",
                "64", "--num-workers", "0", "--posterior", "mode", "--dry-run", "--no-progress") == 0
    printed = capsys.readouterr().out
    shift, scale = (float(printed.split(name)[1].split()[0].rstrip(",")) for name in ("shift_factor", "scaling_factor"))
    assert shift == pytest.approx(cfg.shift_factor, abs=1e-5) and scale == pytest.approx(cfg.scaling_factor, rel=1e-5)
    # per channel (diffusers' latents_mean / latents_std): every channel standardised, and the encode hand-off
    # records that normalisation
    assert _run("latent-stats", "--checkpoint", str(release), "--data", data_urls("val"), "--resolution", "64",
                "--num-workers", "0", "--posterior", "mode", "--per-channel", "--no-progress") == 0
    cfg = LoopVAE.from_pretrained(release).config
    mean, std = torch.tensor(cfg.latents_mean).view(1, -1, 1, 1), torch.tensor(cfg.latents_std).view(1, -1, 1, 1)
    per_channel = (z - mean) * cfg.scaling_factor / std
    assert cfg.scaling_factor == 1.0 and per_channel.mean(dim=(0, 2, 3)).abs().max() < 1e-5
    assert per_channel.var(dim=(0, 2, 3), unbiased=False).sub(1).abs().max() < 1e-4
    from loopdata.latents import LatentNormalization

    meta = {"latent_shape": [16, 8, 8], "scaling_factor": cfg.scaling_factor, "latents_mean": cfg.latents_mean,
            "latents_std": cfg.latents_std}
    assert torch.allclose(LatentNormalization.from_metadata(meta).normalize(z[0].float()), per_channel[0].float(),
                          atol=1e-5)
    # a plain estimate afterwards replaces the per-channel one (stale latents_mean / std would rescale twice)
    assert _run("latent-stats", "--checkpoint", str(release), "--data", data_urls("val"), "--resolution", "64",
                "--num-workers", "0", "--posterior", "mode", "--no-progress") == 0
    cfg = LoopVAE.from_pretrained(release).config
    assert cfg.latents_mean is None and cfg.latents_std is None and cfg.scaling_factor != 1.0


def test_eval_and_intervene_show_progress_bars_unless_asked_not_to(tiny_run, tmp_path: Path, capfd) -> None:
    common = ["--checkpoint", str(tiny_run[0]), "--data", data_urls("val"), "--resolution", "32"]
    assert _run("eval", *common, "--out", str(tmp_path / "e"), "--num-workers", "0", "--lpips-net", "none",
                "--batch-size", "2") == 0
    assert _run("intervene", *common, "--out", str(tmp_path / "i"), "--limit", "2") == 0
    err = capfd.readouterr().err
    assert "eval: 100%" in err and "2/2 [" in err  # 4 images in batches of 2
    assert "intervene: 100%" in err
    assert _run("eval", *common, "--out", str(tmp_path / "e2"), "--num-workers", "0", "--lpips-net", "none",
                "--no-progress") == 0
    assert _run("intervene", *common, "--out", str(tmp_path / "i2"), "--limit", "2", "--no-progress") == 0
    err = capfd.readouterr().err
    assert "eval:" not in err and "intervene:" not in err


def test_eval_memory_formats_agree(tiny_run, tmp_path: Path) -> None:
    common = ["--checkpoint", str(tiny_run[0]), "--data", data_urls("val"), "--resolution", "32", "--num-workers",
              "0", "--lpips-net", "none", "--no-progress"]
    psnr = {}
    for fmt in ("contiguous", "channels_last"):
        assert _run("eval", *common, "--out", str(tmp_path / fmt), "--memory-format", fmt) == 0
        psnr[fmt] = json.loads((tmp_path / fmt / "metrics.json").read_text())["psnr"]
    # the same model on uint8-quantised outputs: float-rounding differences move a pixel by one level at most
    assert psnr["channels_last"] == pytest.approx(psnr["contiguous"], abs=0.02)
