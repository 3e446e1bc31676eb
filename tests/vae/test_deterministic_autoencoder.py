"""A tokenizer without a posterior (diffusers AutoencoderDC, ``dcae-tiny``) through train, eval, encode and
latent-stats, on the real command lines and the bundled Kodak shards."""

import json
import sys
from pathlib import Path

import pytest
import torch
from diffusers import AutoencoderDC, AutoencoderKL
from diffusers.models.attention_processor import Attention
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import loopdata
from loopvae import create_model
from loopvae.autoencoders import encode_mode, encode_posterior, encode_sample, has_posterior, latent_values_per_pixel
from loopvae.cli import main as loopvae_main
from loopvae.loading import load_tokenizer
from loopvae.losses import LossWeights, ReconstructionObjective
from lv_testing import FAST, data_urls


@pytest.fixture(scope="module")
def dcae_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dcae") / "run"
    code = loopvae_main(["train", "--config", "tiny-stage1", "--data", data_urls(), "--out", str(out),
                         "--val-data", data_urls("val"), "--set", *FAST, "model=dcae-tiny", "model_overrides={}",
                         "perceptual_weight=0", "max_steps=6", "checkpoint_every=3", "eval_every=3", "eval_images=2",
                         "log_every=1", "num_workers=0"])
    assert code == 0
    return out


def test_reference_shapes_have_the_stated_sizes_and_norm_groups() -> None:
    counts = {name: sum(p.numel() for p in create_model(name).parameters())
              for name in ("klvae-tiny-w32", "klvae-tiny-w24", "klvae-tiny-d2", "klvae-tiny-w32-attn", "dcae-tiny")}
    assert counts == {"klvae-tiny-w32": 1016067, "klvae-tiny-w24": 988251, "klvae-tiny-d2": 956987,
                      "klvae-tiny-w32-attn": 1049603, "dcae-tiny": 1234491}
    for name in ("klvae-tiny-w32", "klvae-tiny-w24", "klvae-tiny-d2"):
        vae = create_model(name)
        norms = [m for m in vae.modules() if isinstance(m, torch.nn.GroupNorm)]
        assert norms and min(m.num_channels // m.num_groups for m in norms) >= 4, name
        assert not any(isinstance(m, Attention) for m in vae.modules()), name
    assert any(isinstance(m, Attention) for m in create_model("klvae-tiny-w32-attn").modules())
    assert create_model("klvae-tiny-w32-attn").config == create_model("klvae-tiny-w32",
                                                                      mid_block_add_attention=True).config


def test_latent_helpers_agree_with_each_class() -> None:
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    dc, kl = create_model("dcae-tiny").eval(), create_model("klvae-tiny-w24").eval()
    assert not has_posterior(dc) and has_posterior(kl)
    assert encode_posterior(dc, x) is None
    with torch.no_grad():
        assert torch.equal(encode_mode(dc, x), dc.encode(x).latent)
        assert torch.equal(encode_sample(dc, x), encode_mode(dc, x))  # nothing to sample
        assert torch.equal(encode_mode(kl, x), kl.encode(x).latent_dist.mode())
    assert latent_values_per_pixel(dc) == latent_values_per_pixel(kl) == 16 / 64


def test_objective_has_no_kl_term_without_a_posterior() -> None:
    x = torch.rand(2, 3, 8, 8) * 2 - 1
    recon = x + 0.1
    terms = ReconstructionObjective(LossWeights(perceptual=0.0, kl=1.0))(x, recon, None, step=0)
    assert "kl" not in terms.logs
    assert terms.total.item() == pytest.approx((recon - x).abs().mean().item())


def test_training_an_autoencoder_dc_writes_a_loadable_release(dcae_run: Path) -> None:
    summary = json.loads((dcae_run / "train_summary.json").read_text())
    assert summary["step"] == 6 and summary["stopped_by"] is None
    model = AutoencoderDC.from_pretrained(dcae_run / "release")  # the contract: diffusers' own loader
    loaded = load_tokenizer(dcae_run / "release").model
    assert isinstance(loaded, AutoencoderDC)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    assert [e["step"] for e in json.loads((dcae_run / "validation.json").read_text())] == [3, 6]
    info = json.loads((dcae_run / "release" / "release.json").read_text())
    assert info["seed"] == 0 and info["batch_size"] == 4  # what pairs runs by seed in loopvae compare
    scalars = EventAccumulator(str(dcae_run / "tb")).Reload().Tags()["scalars"]
    assert "train/l1" in scalars and "train/kl" not in scalars  # no posterior, no KL term


def test_eval_encode_and_latent_stats_on_an_autoencoder_dc(dcae_run: Path, tmp_path: Path) -> None:
    release = dcae_run / "release"
    assert loopvae_main(["eval", "--checkpoint", str(release), "--data", data_urls("val"), "--out",
                         str(tmp_path / "eval"), "--resolution", "32", "--lpips-net", "none", "--num-workers", "0",
                         "--no-progress"]) == 0
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["model"]["class"] == "AutoencoderDC" and metrics["num_images"] == 4
    # encode: the stored latent is the deterministic latent (mean and "sample" alike)
    assert loopvae_main(["encode", "--checkpoint", str(release), "--data", data_urls("val"), "--out",
                         str(tmp_path / "latents"), "--resolution", "32", "--sample"]) == 0
    model = load_tokenizer(release).model
    dataset = loopdata.LatentDataset(str(tmp_path / "latents"), train=False, normalize=False)
    sample = next(iter(dataset))
    image = next(iter(loopdata.make_loader(data_urls("val"), task="reconstruction", train=False, batch_size=4,
                                           num_workers=0, resolution=32, rank=0, world_size=1)))
    index = list(image["key"]).index(sample["key"])
    with torch.no_grad():
        expected = encode_mode(model, image["image"][index: index + 1])[0]
    assert torch.allclose(sample["latent"], expected, atol=1e-5)
    # latent-stats: AutoencoderDC has scaling_factor only; the shift stays in latent_stats.json
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in release.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    assert loopvae_main(["latent-stats", "--checkpoint", str(copy), "--data", data_urls("val"), "--resolution", "32",
                         "--num-workers", "0", "--no-progress"]) == 0
    config = json.loads((copy / "config.json").read_text())
    stats = json.loads((copy / "latent_stats.json").read_text())
    assert config["scaling_factor"] == pytest.approx(stats["scaling_factor"]) and "shift_factor" not in config
    assert isinstance(AutoencoderDC.from_pretrained(copy), AutoencoderDC)


def test_kl_reference_trains_with_its_kl_term(tmp_path: Path) -> None:
    out = tmp_path / "kl"
    assert loopvae_main(["train", "--config", "tiny-stage1", "--data", data_urls(), "--out", str(out), "--set",
                         *FAST, "model=klvae-tiny-w24", "model_overrides={}", "perceptual_weight=0", "max_steps=2",
                         "checkpoint_every=2", "log_every=1", "num_workers=0"]) == 0
    assert isinstance(load_tokenizer(out / "release").model, AutoencoderKL)
    assert "train/kl" in EventAccumulator(str(out / "tb")).Reload().Tags()["scalars"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
