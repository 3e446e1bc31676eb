"""Tiled encode/decode: blending is exact for pointwise maps and close for the real decoder; it saves memory."""

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import loopvae
from lv_testing import randomize_


def test_tile_starts_cover_the_axis() -> None:
    assert loopvae.tile_starts(100, 128, 32) == [0]
    assert loopvae.tile_starts(512, 256, 64) == [0, 192, 256]
    for size in (257, 300, 769):
        starts = loopvae.tile_starts(size, 128, 32)
        assert starts[0] == 0 and starts[-1] + 128 == size
        assert all(b - a <= 96 for a, b in zip(starts, starts[1:]))
    with pytest.raises(ValueError, match="must be larger than the overlap"):
        loopvae.tile_starts(100, 16, 16)


def test_blending_is_exact_for_pointwise_and_upsampling_maps() -> None:
    x = torch.randn(2, 3, 70, 45)
    out = loopvae.tiled_apply(lambda t: 3 * t + 1, x, tile=16, overlap=6, scale=1.0)
    torch.testing.assert_close(out, 3 * x + 1, rtol=1e-6, atol=1e-6)
    up = loopvae.tiled_apply(lambda t: F.interpolate(t, scale_factor=8), x[..., :64, :40], 16, 8, 8.0)
    torch.testing.assert_close(up, F.interpolate(x[..., :64, :40], scale_factor=8), rtol=1e-6, atol=1e-6)


def psnr_between(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(10 * torch.log10(4.0 / (a - b).pow(2).mean()))  # [-1, 1] images: data range 2


def test_tiled_768x512_matches_untiled_decode_and_encode() -> None:
    torch.manual_seed(0)
    vae = loopvae.create_model("loopvae-cnn-tiny").eval()
    randomize_(vae.encoder.core, std=0.05)  # make the looped cores compute (they start as identity)
    randomize_(vae.decoder.core, std=0.05, seed=1)
    z = torch.randn(1, 16, 64, 96)  # a 512x768 image's latent
    x = torch.rand(1, 3, 512, 768) * 2 - 1
    with torch.no_grad():
        ref_img, ref_lat = vae.decode(z).sample, vae.encode(x).latent_dist.mode()
        vae.enable_tiling(tile_sample_size=256)  # 25% overlap
        img, lat = vae.decode(z).sample, vae.encode(x).latent_dist.mode()
        vae.enable_tiling(tile_sample_size=128)
        small_tiles = vae.decode(z).sample
    assert img.shape == ref_img.shape and lat.shape == ref_lat.shape
    # Stated tolerance: GroupNorm statistics are per tile, so tiling is close, not exact
    # (measured on this random-weight model: 47.2 dB with 256 px tiles, 38.7 dB with 128 px tiles).
    assert psnr_between(img, ref_img) > 35.0
    assert psnr_between(small_tiles, ref_img) > 28.0
    assert (lat - ref_lat).abs().mean() < 0.1 * ref_lat.abs().mean()


PEAK_SCRIPT = """
import json, sys, torch, loopvae
from looprun.memory import track_peak_memory
torch.manual_seed(0)
vae = loopvae.create_model("loopvae-cnn-tiny").eval()
if sys.argv[1] == "tiled":
    vae.enable_tiling(tile_sample_size=256)
z = torch.randn(1, 16, 64, 96)
with torch.no_grad(), track_peak_memory("cpu") as peak:
    vae.decode(z)
print(json.dumps({"peak_mib": peak.peak_mib}))
"""


def test_tiled_decode_uses_less_peak_memory() -> None:
    from looprun.memory import cpu_peak_tracking_available

    if not cpu_peak_tracking_available():
        pytest.skip("CPU peak-memory tracking needs a writable /proc/self/clear_refs (Linux)")
    peaks = {}
    for mode in ("untiled", "tiled"):
        # fresh processes: a previous run's freed memory would hide the next run's peak
        out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, mode], capture_output=True, text=True, check=True)
        peaks[mode] = json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"]
    assert peaks["tiled"] < 0.5 * peaks["untiled"], peaks


def test_enable_tiling_takes_diffusers_call_styles_without_touching_the_config(tmp_path) -> None:
    import json

    vae = loopvae.create_model("loopvae-cnn-tiny")
    before = dict(vae.config)
    vae.enable_tiling(True)  # older diffusers: use_tiling
    assert vae.use_tiling and vae.tile_sample_size == vae.config.sample_size
    vae.enable_tiling(False)
    assert not vae.use_tiling
    vae.enable_tiling()
    assert vae.use_tiling
    vae.enable_tiling(tile_sample_min_height=64, tile_sample_min_width=64, tile_sample_stride_height=48,
                      tile_sample_stride_width=48)  # newer diffusers VAEs
    assert vae.tile_sample_size == 64 and vae.tile_overlap_factor == pytest.approx(0.25)
    vae.enable_tiling(tile_sample_min_height=96, tile_sample_min_width=96, tile_sample_stride_height=80,
                      tile_sample_stride_width=80)
    assert vae._tile_geometry(8) == (96, 16)  # 96 - 80 px of overlap, not a float-truncated 8
    vae.enable_tiling(tile_sample_size=128, tile_overlap_factor=0.5)
    assert (vae.tile_sample_size, vae.tile_overlap_factor) == (128, 0.5)
    assert dict(vae.config) == before  # runtime settings, not configuration
    vae.save_pretrained(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["tile_overlap_factor"] == 0.25
    for bad, match in ((dict(use_tiling=256), "tile_sample_size="), (dict(tile_sample_size=100), "multiple of 8"),
                       (dict(tile_sample_min_height=64, tile_sample_min_width=32), "square"),
                       (dict(tile_sample_size=64, tile_sample_stride_height=80), "stride")):
        with pytest.raises((TypeError, ValueError), match=match):
            vae.enable_tiling(**bad)


def _tiny_computing() -> loopvae.LoopVAE:
    torch.manual_seed(0)  # the same weights on every call
    vae = loopvae.create_model("loopvae-cnn-tiny").eval()  # sample_size 128: one 128-px tile by default
    randomize_(vae.encoder.core, std=0.05)
    randomize_(vae.decoder.core, std=0.05, seed=1)
    return vae


@torch.no_grad()
def _encode_decode(vae: loopvae.LoopVAE, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return vae.encode(x).latent_dist.mode(), vae.decode(z).sample


def test_autoencoderkl_tiling_attributes_set_directly_govern_tiling() -> None:
    """Scripts written for AutoencoderKL set ``use_tiling`` / ``tile_sample_min_size`` / ``tile_latent_min_size`` /
    ``tile_overlap_factor`` directly: each changes the result exactly as the equivalent ``enable_tiling`` call."""
    vae = _tiny_computing()
    x, z = torch.rand(1, 3, 128, 128) * 2 - 1, torch.randn(1, 16, 16, 16)
    default_lat, default_img = _encode_decode(vae, x, z)
    assert (vae.tile_sample_min_size, vae.tile_latent_min_size, vae.tile_overlap_factor) == (128, 16, 0.25)

    vae.tile_sample_min_size = 64  # without use_tiling nothing tiles (AutoencoderKL's rule)
    assert all(torch.equal(a, b) for a, b in zip(_encode_decode(vae, x, z), (default_lat, default_img)))
    vae.use_tiling = True
    direct_lat, direct_img = _encode_decode(vae, x, z)
    assert not torch.equal(direct_lat, default_lat) and not torch.equal(direct_img, default_img)
    assert (vae.tile_sample_size, vae.tile_latent_min_size) == (64, 8)  # one setting, two names

    reference = _tiny_computing()
    reference.enable_tiling(tile_sample_size=64)
    ref_lat, ref_img = _encode_decode(reference, x, z)
    assert torch.equal(direct_lat, ref_lat) and torch.equal(direct_img, ref_img)

    vae.tile_sample_min_size = 128  # the latent side names the same tile: 8 latent pixels = 64 image pixels
    vae.tile_latent_min_size = 8
    assert vae.tile_sample_min_size == 64
    assert all(torch.equal(a, b) for a, b in zip(_encode_decode(vae, x, z), (ref_lat, ref_img)))

    vae.tile_overlap_factor = 0.5  # and after enable_tiling too
    reference.enable_tiling(tile_overlap_factor=0.5)
    half_lat, half_img = _encode_decode(vae, x, z)
    assert not torch.equal(half_img, ref_img) and not torch.equal(half_lat, ref_lat)
    assert all(torch.equal(a, b) for a, b in zip(_encode_decode(reference, x, z), (half_lat, half_img)))
    vae.disable_tiling()
    assert all(torch.equal(a, b) for a, b in zip(_encode_decode(vae, x, z), (default_lat, default_img)))


def test_direct_tiling_attributes_are_validated_and_stay_out_of_the_config(tmp_path) -> None:
    vae = loopvae.create_model("loopvae-cnn-tiny")
    before = dict(vae.config)
    vae.tile_sample_min_size, vae.tile_overlap_factor = 256, 0.5
    vae.tile_latent_min_size = 24.0  # AutoencoderKL code computes it as a float: integral values are accepted
    assert (vae.tile_sample_size, vae.tile_overlap_factor) == (192, 0.5)
    for name, bad, error, match in (
        ("tile_sample_min_size", 100, ValueError, "tile_sample_min_size 100: .* multiple of 8"),
        ("tile_sample_min_size", 0, ValueError, "positive multiple of 8"),
        ("tile_sample_size", 60, ValueError, "multiple of 8"),
        ("tile_latent_min_size", -2, ValueError, r"tile_latent_min_size -2 \(x8 = -16 image pixels\)"),
        ("tile_sample_min_size", 64.5, TypeError, "must be an integer"),
        ("tile_sample_min_size", True, TypeError, "must be an integer"),
        ("tile_overlap_factor", 1.0, ValueError, r"tile_overlap_factor must be in \[0, 1\)"),
        ("tile_overlap_factor", -0.1, ValueError, r"in \[0, 1\)"),
    ):
        with pytest.raises(error, match=match):
            setattr(vae, name, bad)
    assert (vae.tile_sample_size, vae.tile_overlap_factor) == (192, 0.5)  # a rejected value changes nothing
    with pytest.raises(ValueError, match=r"in \[0, 1\)"):
        vae.enable_tiling(tile_sample_size=64, tile_overlap_factor=2.0)
    assert vae.tile_sample_size == 192  # enable_tiling validates everything before changing anything
    assert dict(vae.config) == before
    vae.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert (saved["sample_size"], saved["tile_overlap_factor"]) == (128, 0.25)
    # a model with a deeper latent (x16) needs tiles that are multiples of 16, in either unit
    multi = loopvae.LoopVAE(width=16, num_blocks=1, norm_num_groups=4, latent_channels=4, latent_factor=8,
                            extra_latents=[[16, 8]], encoder_passes=(1, 1, 1, 1), decoder_passes=(1, 1, 1, 1))
    with pytest.raises(ValueError, match="multiple of 16"):
        multi.tile_sample_min_size = 72
    with pytest.raises(ValueError, match=r"x8 = 72 image pixels.*multiple of 16"):
        multi.tile_latent_min_size = 9
    multi.tile_latent_min_size = 10
    assert (multi.tile_sample_min_size, multi.tile_latent_min_size) == (80, 10)
