"""The tuned references bundled next to the LoopVAE (``assets/models/klvae-tiny-w32-attn``, ``assets/models/dcae-tiny``;
made by ``make release-references``): diffusers folders that load with their own class, whose cards state what
the weights measure, and ``loopvae compare`` from a clone's ``assets/`` alone."""

import json
import re
from pathlib import Path

import diffusers
import pytest
import torch

import loopdata
from loopdata.assets import repo_root
from looprun.checkpoint import sha256_file
from looprun.release import WEIGHTS_NAME
from loopvae.autoencoders import encode_mode, latent_values_per_pixel
from loopvae.cli import main as loopvae_main
from loopvae.metrics import bicubic_baseline, psnr_per_image, to_uint8

MODELS = repo_root() / "assets" / "models"
REFERENCES = {"klvae-tiny-w32-attn": "AutoencoderKL", "dcae-tiny": "AutoencoderDC"}


@pytest.fixture(scope="module")
def kodak_val() -> torch.Tensor:
    loader = loopdata.make_loader(",".join(str(u) for u in loopdata.bundled_kodak_urls("val")), train=False,
                                  batch_size=4, num_workers=0, resolution=256)
    return next(iter(loader))["image"]


def _card(name: str) -> str:
    return (MODELS / name / "README.md").read_text()


def _card_row(name: str, label: str) -> tuple[float, float, float]:
    """(PSNR, SSIM, bicubic PSNR) of the card's measured-table row ``label``."""
    row = re.search(rf"^\| {re.escape(label)} \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|$", _card(name), re.M)
    assert row is not None, f"{name}: the card has no measured row for {label}"
    return float(row.group(1)), float(row.group(2)), float(row.group(3))


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_the_bundle_is_a_diffusers_folder_its_card_and_release_json_describe(name: str) -> None:
    folder = MODELS / name
    config = json.loads((folder / "config.json").read_text())
    assert config["_class_name"] == REFERENCES[name]
    model = getattr(diffusers, REFERENCES[name]).from_pretrained(folder)  # the contract: the class's own loader
    assert type(model).__name__ == REFERENCES[name]
    assert (folder / WEIGHTS_NAME).stat().st_size < 5 * 2**20  # "a few MB"
    card, release = _card(name), json.loads((folder / "release.json").read_text())
    assert sha256_file(folder / WEIGHTS_NAME) in card and "make release-references" in card
    assert release["command"] == "make release-references" and release["weights"] == "ema"
    # the card's images seen and CPU-hours are release.json's
    assert f"{release['images_seen']:,} crops seen" in card
    assert f"{release['train_cpu_hours']:.2f} CPU-hours" in card
    assert release["recipe_arm"] in card
    stats = json.loads((folder / "latent_stats.json").read_text())
    assert config["scaling_factor"] == pytest.approx(stats["scaling_factor"]) and config["scaling_factor"] != 1.0


@pytest.mark.parametrize("name", sorted(REFERENCES))
@torch.no_grad()
def test_the_card_reports_what_the_weights_measure_and_they_beat_bicubic(name: str, kodak_val: torch.Tensor) -> None:
    model = getattr(diffusers, REFERENCES[name]).from_pretrained(MODELS / name).eval()
    recon = model.decode(encode_mode(model, kodak_val)).sample
    psnr = float(psnr_per_image(to_uint8(recon), to_uint8(kodak_val)).mean())
    stated_psnr, _, stated_bicubic = _card_row(name, "kodim21–24")
    assert psnr == pytest.approx(stated_psnr, abs=0.006)  # the card rounds to 0.01 dB
    bic, _ = bicubic_baseline(kodak_val, latent_values_per_pixel(model))  # f8, 16 channels: 0.25 values / pixel
    assert float(psnr_per_image(to_uint8(bic), to_uint8(kodak_val)).mean()) == pytest.approx(stated_bicubic, abs=0.006)
    # the release's refusal rule, on the 40 held-out ImageNet images the card measured
    heldout, _, heldout_bicubic = _card_row(name, "40 held-out ImageNet")
    assert heldout > heldout_bicubic


def test_compare_runs_from_the_bundled_assets_alone(tmp_path: Path) -> None:
    arms = {"loopvae": "loopvae-cnn-tiny", "klvae": "klvae-tiny-w32-attn", "dcae": "dcae-tiny"}
    argv = ["compare", *(a for arm, name in arms.items() for a in ("--arm", f"{arm}={MODELS / name}")),
            "--data", str(repo_root() / "assets" / "kodak" / "kodak-val-000000.tar"), "--out", str(tmp_path / "cmp"),
            "--limit", "2", "--num-workers", "0", "--no-progress"]
    assert loopvae_main(argv) == 0
    result = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    by_name = {a["name"]: a for a in result["arms"]}
    assert set(by_name) == set(arms) and result["num_images"] == 2
    assert [by_name[a]["class"] for a in ("klvae", "dcae")] == ["AutoencoderKL", "AutoencoderDC"]
    for arm in by_name.values():
        assert len(arm["per_seed"]) == 1 and arm["psnr"] > result["bicubic"]["psnr"]
    # one checkpoint per arm: descriptive numbers, never a verdict word between two single runs
    assert len(result["comparisons"]) == 6  # three pairs x (PSNR, SSIM)
    assert all(c["verdict"] == "inconclusive" and c["ci"] == [None, None] for c in result["comparisons"])


@pytest.mark.slow
def test_release_references_end_to_end_at_a_tiny_budget(tmp_path: Path) -> None:
    """``studies/_release_references.py`` at 4 steps: both references train at their searches' picks, are
    measured and bundled as loadable diffusers folders with card and release.json (~5 min)."""
    import subprocess
    import sys

    from loopdata import find_shared_data

    if find_shared_data() is None:
        pytest.skip("the release trains on ../shared/data (the ImageNet sample)")
    bundles = tmp_path / "bundles"
    subprocess.run([sys.executable, str(repo_root() / "studies" / "_release_references.py"), "--steps", "4",
                    "--runs", str(tmp_path / "runs"), "--bundle-dir", str(bundles), "--docs", str(tmp_path / "docs")],
                   check=True, cwd=repo_root())
    smoke = json.loads((tmp_path / "docs" / "references-smoke.json").read_text())
    assert set(smoke["references"]) == set(REFERENCES)
    for name, cls in REFERENCES.items():
        r = smoke["references"][name]
        assert r["class"] == cls and r["steps"] == 4 and r["bundled"] is True
        assert getattr(diffusers, cls).from_pretrained(bundles / name) is not None
        release = json.loads((bundles / name / "release.json").read_text())
        assert release["command"] == "make release-references" and release["images_seen"] == r["images_seen"]
        assert r["sha256"] == sha256_file(bundles / name / WEIGHTS_NAME)
        assert r["sha256"] in (bundles / name / "README.md").read_text()


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_a_resolution_the_latent_factor_does_not_divide_is_refused_in_one_line(name: str, tmp_path: Path,
                                                                               capsys) -> None:
    """AutoencoderKL would silently crop a 60² image to a 7² latent (decoding to 56²) and AutoencoderDC fail inside
    pixel_unshuffle: encoding refuses the size, `encode` and `train init_from=` refuse the flag before writing."""
    from loopvae.autoencoders import check_resolution, encode_sample, spatial_factor
    from loopvae.loading import load_artifact

    model = load_artifact(MODELS / name)
    assert spatial_factor(model) == 8
    for encode in (encode_mode, encode_sample):
        with pytest.raises(ValueError, match=rf"image size \(60, 60\) is not divisible by the {REFERENCES[name]}'s "
                                             "latent factor 8"):
            encode(model, torch.zeros(1, 3, 60, 60))
    assert encode_mode(model, torch.zeros(1, 3, 64, 64)).shape[-2:] == (8, 8)
    with pytest.raises(ValueError, match=r"--resolution=60 is not a multiple .* factor 8: use a multiple of 8 "
                                         r"\(e\.g\. 56 or 64\)"):
        check_resolution(model, 60)
    val, train = (",".join(map(str, loopdata.bundled_kodak_urls(split))) for split in ("val", "train"))
    for argv in (["encode", "--checkpoint", str(MODELS / name), "--data", val, "--resolution", "60"],
                 ["train", "--config", "tiny-stage1", "--data", train, "--set", "max_steps=1", "resolution=36",
                  "num_workers=0", f"init_from={MODELS / name}"]):
        capsys.readouterr()
        assert loopvae_main([*argv, "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert re.search(r"resolution=(60|36) is not a multiple of the .* latent factor 8", err), err
        assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_the_autoencoderdc_factor_is_counted_from_its_encoder() -> None:
    """A stage without layers does not downsample: (1, 1, 0, 1) layers over 4 stages is f4, not 2^(4 - 1) = f8."""
    from loopvae.autoencoders import spatial_factor

    common = dict(encoder_block_types="ResBlock", decoder_block_types="ResBlock", latent_channels=16,
                  attention_head_dim=8, encoder_qkv_multiscales=((),) * 4, decoder_qkv_multiscales=((),) * 4)
    skipped = diffusers.AutoencoderDC(encoder_block_out_channels=(16, 32, 64, 64),
                                      decoder_block_out_channels=(16, 32, 64, 64),
                                      encoder_layers_per_block=(1, 1, 0, 1), decoder_layers_per_block=(1, 1, 0, 1),
                                      **common)
    full = diffusers.AutoencoderDC(encoder_block_out_channels=(16, 32, 64, 128),
                                   decoder_block_out_channels=(16, 32, 64, 128),
                                   encoder_layers_per_block=(0, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1),
                                   **common)
    for model, factor in ((skipped, 4), (full, 8)):
        assert spatial_factor(model) == factor
        assert model.encode(torch.zeros(1, 3, 32, 32)).latent.shape[-1] == 32 // factor


def test_the_release_card_of_an_autoencoderdc_is_tagged_as_one() -> None:
    from looprun.release import hub_identity, render_model_card
    from loopvae.loading import load_artifact

    for name, tag in (("dcae-tiny", "autoencoderdc"), ("klvae-tiny-w32-attn", "autoencoderkl"),
                      ("loopvae-cnn-tiny", "loopvae")):
        model = load_artifact(MODELS / name)
        library, tags, _ = hub_identity(model)
        assert library == "diffusers" and tag in tags and not {"autoencoderkl", "autoencoderdc", "loopvae"} - {tag} \
            & set(tags), (name, tags)
        assert f"- {tag}\n" in render_model_card(model, {})


def test_the_release_driver_plans_and_writes_what_references_json_and_the_cards_record(tmp_path: Path,
                                                                                        monkeypatch) -> None:
    """``studies/_release_references.py`` trains each reference at its fair-study pick for the bundled LoopVAE's
    crops (what references.json recorded), and its card writer reproduces the committed cards."""
    monkeypatch.syspath_prepend(str(repo_root() / "studies"))
    import _release_references as rr

    recorded = json.loads((repo_root() / "docs/study_loopvae/references.json").read_text())["references"]
    assert set(recorded) == set(REFERENCES)
    for name, r in recorded.items():
        arm, record = rr.reference_arm(r["family"], None, repo_root() / "docs/study_fair")
        assert arm.name == f"{name}-s0" and record == {k: r[k] for k in record}
        assert f"max_steps={r['steps']}" in arm.overrides and arm.overrides[-len(r["recipe"]):] == r["recipe"]
        (tmp_path / name).mkdir()
        rr.write_card(tmp_path / name, r)
        assert (tmp_path / name / "README.md").read_text() == _card(name).replace(
            "benchmarks/release_references.py", "studies/_release_references.py")  # the driver's new place
