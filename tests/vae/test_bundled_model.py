"""The trained tiny LoopVAE bundled in ``assets/models/loopvae-cnn-tiny`` (made by ``make release-vae``)."""

import json
import re

import pytest
import torch

import loopdata
import loopvae
from looprun.checkpoint import sha256_file
from looprun.release import WEIGHTS_NAME
from loopvae import LoopVAE
from loopvae.demo import bundled_model_dir
from loopvae.intervene import run_interventions
from loopvae.metrics import bicubic_baseline, psnr_per_image, to_uint8


@pytest.fixture(scope="module")
def bundled() -> LoopVAE:
    return LoopVAE.from_pretrained(bundled_model_dir())


@pytest.fixture(scope="module")
def kodak_val() -> torch.Tensor:
    loader = loopdata.make_loader(",".join(str(u) for u in loopdata.bundled_kodak_urls("val")), train=False,
                                  batch_size=4, num_workers=0, resolution=256)
    return next(iter(loader))["image"]


def _card() -> str:
    return (bundled_model_dir() / "README.md").read_text()


def test_the_artifact_is_what_its_card_and_release_json_say() -> None:
    folder = bundled_model_dir()
    digest = sha256_file(folder / WEIGHTS_NAME)
    assert digest in _card() and "make release-vae" in _card()
    release = json.loads((folder / "release.json").read_text())
    assert release["weights"] == "ema" and release["step"] == int(re.search(r"([0-9,]+) steps ×", _card())
                                                                   .group(1).replace(",", ""))
    assert (folder / WEIGHTS_NAME).stat().st_size < 5 * 2**20  # "a few MB"


def test_it_is_the_registered_tiny_architecture_with_the_shortcuts(bundled: LoopVAE) -> None:
    registered = loopvae.create_model("loopvae-cnn-tiny").config
    for key in ("width", "num_blocks", "encoder_passes", "decoder_passes", "latent_channels", "latent_factor",
                "sharing", "norm_num_groups", "block_type", "fusion_mode"):
        stored, expected = bundled.config[key], registered[key]
        if isinstance(expected, tuple):  # config.json stores tuples as lists
            stored, expected = list(stored), list(expected)
        assert stored == expected, key
    assert bundled.config.shortcuts is True and bundled.config.sharing == "global"


@torch.no_grad()
def test_the_card_reports_what_the_model_measures_and_it_beats_bicubic(bundled: LoopVAE,
                                                                       kodak_val: torch.Tensor) -> None:
    recon = bundled.decode(bundled.encode(kodak_val).latent_dist.mode()).sample
    psnr = float(psnr_per_image(to_uint8(recon), to_uint8(kodak_val)).mean())
    stated = float(re.search(r"kodim21–24 at 256²: PSNR ([0-9.]+) dB", _card()).group(1))
    assert psnr == pytest.approx(stated, abs=0.006)  # the card's figure rounds to 0.01 dB
    bic, _ = bicubic_baseline(kodak_val, 16 / 64)
    bicubic = float(psnr_per_image(to_uint8(bic), to_uint8(kodak_val)).mean())
    stated_bicubic = float(re.search(r"values per pixel: ([0-9.]+) dB", _card()).group(1))
    assert bicubic == pytest.approx(stated_bicubic, abs=0.006)
    assert psnr >= bicubic + 1.0  # the release bar (issue: >= 1 dB over bicubic at >= equal values per pixel)


@torch.no_grad()
def _normalised_latents(model: LoopVAE, images: torch.Tensor) -> torch.Tensor:
    z = model.encode(images).latent_dist.sample(generator=torch.Generator().manual_seed(0))
    return ((z - model.config.shift_factor) * model.config.scaling_factor).double()


def test_config_carries_measured_latent_statistics(bundled: LoopVAE, kodak_val: torch.Tensor) -> None:
    stats = bundled.config.latent_statistics
    assert stats is not None and stats["num_images"] >= 700 and stats["posterior"] == "sample"
    assert bundled.config.scaling_factor != 1.0 and bundled.config.shift_factor != 0.0
    # kodim21-24 (never trained on, nor used for the statistics) are 4 photos of another collection: their
    # normalised latents measured s.d. 0.80, and the card says so; the bar (mean ~0, s.d. ~1) is tested on the
    # 40 held-out ImageNet images below
    z = _normalised_latents(bundled, kodak_val)
    stated = re.search(r"on kodim21–24 \(4 photos of another collection\) mean\s+([-+0-9.]+), s\.d\. ([0-9.]+)",
                       _card())
    assert float(z.mean()) == pytest.approx(float(stated.group(1)), abs=0.0006)
    assert float(z.std()) == pytest.approx(float(stated.group(2)), abs=0.0006)


def test_latents_are_normalised_on_held_out_imagenet(bundled: LoopVAE, tmp_path) -> None:
    from loopdata.shards import iter_samples
    from loopdata.writer import TarShardWriter

    shared = loopdata.find_shared_data()
    if shared is None:
        pytest.skip("needs ../shared/data (the ImageNet sample) for the 40 held-out images")
    urls = loopdata.expand_urls(str(shared / "imagenet-sample" / "*.tar"))
    samples = sorted((s for u in urls for s in iter_samples(u)), key=lambda s: s["__key__"])
    with TarShardWriter(tmp_path, "held-out") as writer:  # the release's held-out images: every 20th key
        for sample in samples[::20]:
            writer.add(sample["__key__"], {k: v for k, v in sample.items() if not k.startswith("__")})
    loader = loopdata.make_loader(str(tmp_path), train=False, batch_size=8, num_workers=0, resolution=256)
    held_out = torch.cat([batch["image"] for batch in loader])
    assert held_out.shape[0] == 40
    z = _normalised_latents(bundled, held_out)
    assert abs(float(z.mean())) < 0.1 and abs(float(z.std()) - 1) < 0.1


@torch.no_grad()
def test_the_card_states_the_decoder_prefix_the_interventions_measure(bundled: LoopVAE,
                                                                     kodak_val: torch.Tensor) -> None:
    # a 128² centre crop: the stages and prefixes are the same at any size, at a quarter of the arithmetic
    result = run_interventions(bundled, kodak_val[..., 64:192, 64:192], batch_size=4)
    dec = next(s for s in result["stages"] if s["branch"] == "decoder" and s["scale"] == "2x")
    assert dec["prefix"][-1]["psnr"] == result["baseline"]["psnr"]  # the full prefix is the plain forward
    assert result["full_prefix_reproduces_baseline"]
    assert len(dec["prefix"]) == 4 and "k = 1..4 retained passes" in _card()


def test_the_card_has_hub_front_matter_with_the_release_measurements() -> None:
    import yaml

    text = _card()
    assert text.startswith("---\n")
    meta = yaml.safe_load(text.split("---\n")[1])
    assert (meta["library_name"], meta["license"]) == ("diffusers", "apache-2.0")
    values = {(r["dataset"]["name"].split(" ")[0], m["type"]): m["value"]
              for r in meta["model-index"][0]["results"] for m in r["metrics"]}
    card_table = {row.split("|")[1].strip(): row.split("|")[2].strip() for row in text.splitlines()
                  if row.startswith("| kodim21") or row.startswith("| 40 held-out")}
    assert f"{values[('kodim21-24', 'psnr')]:.2f}" == card_table["kodim21–24"]
    assert f"{values[('40', 'psnr')]:.2f}" == card_table["40 held-out ImageNet"]
    assert {("kodim21-24", "ssim"), ("40", "ssim")} <= set(values)
