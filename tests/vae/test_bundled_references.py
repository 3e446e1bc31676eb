"""The tuned references bundled next to the LoopVAE (``assets/models/klvae-tiny-w32-attn``, ``assets/models/dcae-tiny``;
made by ``make release-references``: ``studies/release_vae.py``, phase ``references``): diffusers folders that load
with their own class, whose cards state what the weights measure, and ``loopvae compare`` from a clone's ``assets/``
alone."""

import json
import re
import sys
from dataclasses import asdict
from pathlib import Path

import diffusers
import pytest
import torch

import loopdata
from loopdata.assets import repo_root
from looprun.checkpoint import sha256_file
from looprun.release import WEIGHTS_NAME
from looprun.study import ResultStore, load_study
from looprun.study.engine import execute_run
from loopvae.autoencoders import encode_mode, latent_values_per_pixel
from loopvae.cli import main as loopvae_main
from loopvae.metrics import bicubic_baseline, psnr_per_image, to_uint8

MODELS = repo_root() / "assets" / "models"
REFERENCES = {"klvae-tiny-w32-attn": "AutoencoderKL", "dcae-tiny": "AutoencoderDC"}
RELEASE = load_study("release-vae", repo_root())
rv = sys.modules["loopvision_studies.release_vae"]  # the spec's module: its helpers, and what a test replaces


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
    """``loopvae study release-vae --phase references`` at 4 steps: both references train at their searches' picks,
    are measured and bundled as loadable diffusers folders with card and release.json (~5 min)."""
    import subprocess

    from loopdata import find_shared_data

    if find_shared_data() is None:
        pytest.skip("the release trains on ../shared/data (the ImageNet sample)")
    bundles, docs = tmp_path / "bundles", tmp_path / "docs-root"
    committed = {name: sha256_file(MODELS / name / WEIGHTS_NAME) for name in REFERENCES}
    subprocess.run([sys.executable, "-m", "loopvae", "study", "release-vae", "--phase", "references", "--jobs", "2",
                    "--option", "steps=4", "--option", f"bundle={bundles}", "--docs-root", str(docs),
                    "--workdir", str(tmp_path / "runs")], check=True, cwd=repo_root())
    smoke = {r["model"]: r for r in ResultStore(docs, RELEASE.docs).all().values()}
    assert set(smoke) == set(REFERENCES)
    for name, cls in REFERENCES.items():
        r = smoke[name]
        assert r["status"] == "finished" and r["phase"] == "references" and r["id"] == f"{name}-s0"
        assert r["class"] == cls and r["steps"] == 4 and r["bundled"] is True
        assert getattr(diffusers, cls).from_pretrained(bundles / name) is not None
        release = json.loads((bundles / name / "release.json").read_text())
        assert release["command"] == "make release-references" and release["images_seen"] == r["images_seen"]
        assert r["sha256"] == sha256_file(bundles / name / WEIGHTS_NAME)
        assert r["sha256"] in (bundles / name / "README.md").read_text()
    # a smoke run bundles only to its bundle option: the committed bundles are untouched
    assert committed == {name: sha256_file(MODELS / name / WEIGHTS_NAME) for name in REFERENCES}


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


def test_the_release_plans_and_writes_what_the_reference_runs_and_the_cards_record(tmp_path: Path) -> None:
    """The phase ``references`` trains each reference at its fair-study pick for the bundled LoopVAE's crops (what
    its result files recorded, migrated from references.json), and its card writer reproduces the committed cards."""
    recorded = rv.lp.references(repo_root())
    assert list(recorded) == list(REFERENCES)  # AutoencoderKL first, as the pages and the LoopVAE card list them
    planned = {p.settings["model"]: p for p in rv.plan_references(RELEASE, {})}
    for name, r in recorded.items():
        p = planned[name]
        assert p.id == f"{name}-s0" and p.phase == r["phase"] == "references" and p.arm == r["family"]
        assert {k: p.settings[k] for k in ("family", "model", "model_overrides", "recipe_arm", "recipe", "steps")} == {
            k: r[k] for k in ("family", "model", "model_overrides", "recipe_arm", "recipe", "steps")}
        items = rv.reference_items(p.settings, p.settings["steps"])
        assert f"max_steps={r['steps']}" in items and items[-len(r["recipe"]):] == r["recipe"]
        (tmp_path / name).mkdir()
        rv.reference_card(tmp_path / name, r)
        assert (tmp_path / name / "README.md").read_text() == _card(name).replace(
            "benchmarks/release_references.py", "studies/release_vae.py")  # the driver's new place


@pytest.mark.parametrize("heldout", [25.0, 25.3, 26.0])
def test_a_reference_not_above_bicubic_is_refused_and_keeps_its_numbers(heldout: float, tmp_path: Path,
                                                                         monkeypatch) -> None:
    """The refusal rule through the engine (training and measurement replaced by their results): at or below bicubic
    on the held-out images (25.30 dB here) the run's file keeps every number with status ``refused`` and nothing is
    bundled; above it, the reference is bundled with its card."""
    planned = next(p for p in rv.plan_references(RELEASE, {}) if p.arm == "klvae")
    work = tmp_path / "work"
    release = work / planned.id / "release"
    release.mkdir(parents=True)
    for name, content in (("config.json", "{}"), ("latent_stats.json", "{}"), ("release.json", "{}"),
                          (WEIGHTS_NAME, "weights")):
        (release / name).write_text(content)
    split = {"psnr": heldout, "ssim": 0.7, "baseline": {"psnr": 25.3}}
    monkeypatch.setattr(rv.vr, "train_and_evaluate", lambda *a, **k: {"status": "finished", "curve": [],
                                                                       "train_seconds": 3600.0})
    monkeypatch.setattr(rv.vr, "evaluate_arm", lambda *a: {"kodak": split, "imagenet": split})
    monkeypatch.setattr(rv, "write_latent_stats", lambda *a: {"shift_factor": 0.1, "scaling_factor": 0.5})
    monkeypatch.setattr(rv, "_architecture", lambda *a: {"class": "AutoencoderKL", "params": 1, "gmacs": 2.0})
    data = rv.vr.StudyData("train.tar", "kodak.tar", "holdout.tar", 740, 40)
    bundles = tmp_path / "bundles"  # never assets/models: the option a full run leaves out
    execute_run({"study_file": str(RELEASE.source), "run": planned.as_dict(), "docs_root": str(tmp_path),
                 "docs": RELEASE.docs, "code_root": str(repo_root()), "workdir": str(work),
                 "options": {"data": asdict(data), "bundle": str(bundles)}})
    record = ResultStore(tmp_path, RELEASE.docs).load(planned.id)
    assert record["eval"]["imagenet"] == split and record["images_seen"] == 7500 * 8 and record["sha256"] == \
        sha256_file(release / WEIGHTS_NAME)
    if heldout <= 25.3:
        assert record["status"] == "refused" and record["bundled"] is False and not bundles.exists()
        assert record["refused"].startswith(f"klvae-tiny-w32-attn: {heldout:.2f} dB on the held-out images is not "
                                            "above bicubic (25.30 dB)")
    else:
        assert record["status"] == "finished" and record["bundled"] is True and "refused" not in record
        card = (bundles / "klvae-tiny-w32-attn" / "README.md").read_text()
        assert record["sha256"] in card and "**l1+mse**" in card
        assert json.loads((bundles / "klvae-tiny-w32-attn" / "release.json").read_text())["train_cpu_hours"] == 1.0
