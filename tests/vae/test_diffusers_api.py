"""LoopVAE behaves like diffusers' AutoencoderKL: code written for one runs on the other."""

import pytest
import torch
from diffusers import AutoencoderKL
from diffusers.models.autoencoders.vae import DecoderOutput, DiagonalGaussianDistribution
from diffusers.models.modeling_outputs import AutoencoderKLOutput

import loopvae
from lv_testing import randomize_


def tiny(**overrides) -> loopvae.LoopVAE:
    model = loopvae.create_model("loopvae-cnn-tiny", **overrides)
    return randomize_(model, std=0.05).eval()  # non-zero modulation: the cores really compute


def diffusers_roundtrip(vae, images: torch.Tensor) -> torch.Tensor:
    """What diffusers pipelines do with any AutoencoderKL."""
    posterior = vae.encode(images).latent_dist
    latents = (posterior.sample() - (vae.config.shift_factor or 0.0)) * vae.config.scaling_factor
    latents = latents / vae.config.scaling_factor + (vae.config.shift_factor or 0.0)
    return vae.decode(latents).sample


@pytest.mark.parametrize("name", ["loopvae-cnn-tiny", "sd-vae"])
def test_same_code_runs_on_loopvae_and_autoencoderkl(name: str) -> None:
    overrides = {"block_out_channels": (32, 32, 32, 32), "layers_per_block": 1} if name == "sd-vae" else {}
    vae = loopvae.create_model(name, **overrides).eval()
    images = torch.rand(2, 3, 64, 64) * 2 - 1
    with torch.no_grad():
        out = vae.encode(images)
        assert isinstance(out, AutoencoderKLOutput)
        assert isinstance(out.latent_dist, DiagonalGaussianDistribution)
        assert diffusers_roundtrip(vae, images).shape == images.shape
        assert isinstance(vae(images), DecoderOutput)


def test_latent_shapes_and_posterior_mode() -> None:
    vae = tiny()
    x = torch.rand(2, 3, 64, 96) * 2 - 1
    with torch.no_grad():
        posterior = vae.encode(x).latent_dist
        assert posterior.mode().shape == (2, 16, 8, 12)
        assert not torch.equal(posterior.sample(), posterior.mode())
        assert torch.equal(vae(x).sample, vae.decode(posterior.mode()).sample)
        (dist,) = vae.encode(x, return_dict=False)
        (img,) = vae.decode(dist.mode(), return_dict=False)
    assert img.shape == x.shape


def test_save_load_round_trip_is_exact(tmp_path) -> None:
    vae = tiny(sharing="scale", fusion_mode="query")
    vae.register_to_config(scaling_factor=0.5, shift_factor=0.1)
    x = torch.rand(1, 3, 64, 64) * 2 - 1
    vae.save_pretrained(tmp_path)
    assert (tmp_path / "config.json").exists() and (tmp_path / "diffusion_pytorch_model.safetensors").exists()
    loaded = loopvae.LoopVAE.from_pretrained(tmp_path).eval()
    assert loaded.config.scaling_factor == 0.5 and loaded.config.shift_factor == 0.1
    assert loaded.config.sharing == "scale" and loaded.config.fusion_mode == "query"
    with torch.no_grad():
        assert torch.equal(loaded(x).sample, vae(x).sample)
    half = loopvae.LoopVAE.from_pretrained(tmp_path, torch_dtype=torch.bfloat16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}


def test_slicing_matches_batched_decode() -> None:
    vae = tiny()
    x = torch.rand(3, 3, 64, 64) * 2 - 1
    with torch.no_grad():
        z = vae.encode(x).latent_dist.mode()
        batched = vae.decode(z).sample
        vae.enable_slicing()
        torch.testing.assert_close(vae.encode(x).latent_dist.mode(), z, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(vae.decode(z).sample, batched, rtol=1e-5, atol=1e-5)


def test_bf16_cast_runs_and_tracks_fp32() -> None:
    vae = tiny()
    x = torch.rand(1, 3, 64, 64) * 2 - 1
    with torch.no_grad():
        ref = vae(x).sample
        out = vae.to(torch.bfloat16)(x.bfloat16()).sample
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert (out.float() - ref).abs().mean() < 0.05 * ref.abs().mean() + 1e-3


def test_gradient_checkpointing_gives_same_gradients_and_last_layer() -> None:
    vae = tiny()
    x = torch.rand(2, 3, 32, 32) * 2 - 1

    def grads():
        vae.zero_grad(set_to_none=True)
        vae(x).sample.square().mean().backward()
        return {n: p.grad.clone() for n, p in vae.named_parameters() if p.grad is not None}

    plain = grads()
    vae.enable_gradient_checkpointing()
    assert vae.encoder.core.gradient_checkpointing and vae.decoder.core.gradient_checkpointing
    ckpt = grads()
    assert plain.keys() == ckpt.keys()
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], rtol=0, atol=1e-6)
    assert vae.get_last_layer() is vae.decoder.head.conv_out.weight
    assert "decoder.head.conv_out.weight" in plain


def test_deep_supervision_passes_map_each_finest_pass_through_the_head() -> None:
    vae = tiny()
    z = torch.randn(1, 16, 4, 4)
    with torch.no_grad():
        out = vae.decode_passes(z)
        assert len(out.pass_samples) == 4 and out.pass_samples[-1] is out.sample
        assert torch.equal(out.sample, vae.decode(z).sample)
        assert not torch.equal(out.pass_samples[0], out.sample)


def test_clear_errors_for_bad_inputs() -> None:
    vae = tiny()
    with pytest.raises(ValueError, match="not divisible by the latent factor 8"):
        vae.encode(torch.zeros(1, 3, 60, 64))
    with pytest.raises(ValueError, match=r"expects \(B, 3, H, W\)"):
        vae.encode(torch.zeros(1, 1, 64, 64))
    with pytest.raises(ValueError, match="latent has 4 channels"):
        vae.decode(torch.zeros(1, 4, 8, 8))
    with pytest.raises(ValueError, match="unknown fusion_mode 'max'"):
        loopvae.create_model("loopvae-cnn-tiny", fusion_mode="max")
    with pytest.raises(ValueError, match="latent factor 64 is not one of the model's scales"):
        loopvae.create_model("loopvae-cnn-tiny", latent_factor=64)
    assert isinstance(loopvae.create_model("sd-vae", latent_channels=4, block_out_channels=(32,) * 4), AutoencoderKL)
