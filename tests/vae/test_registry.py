"""Paper figures for every registered model, counted on the meta device (no memory, no weights)."""

import pytest
import torch

import loopvae
from loopcore.flops import count_macs, count_parameters
from loopvae.autoencoders import has_posterior

PARAMS = {  # name: (paper figure, relative tolerance)
    "loopvae-cnn-f8d16": (29.07e6, 0.03),
    "loopvae-vit-f8d16": (34e6, 0.05),
    "loopvae-multi": (208.31e6, 0.10),
    "sd-vae": (83.65e6, 0.001),
    "flux-vae": (83.82e6, 0.001),
}


def meta_model(name: str, **overrides) -> torch.nn.Module:
    with torch.device("meta"):
        return loopvae.create_model(name, **overrides)


def reconstruct_macs(model: torch.nn.Module, size: int = 256) -> int:
    with torch.device("meta"):
        x = torch.empty(1, 3, size, size)
    return count_macs(lambda: model.decode(model.encode(x).latent_dist.mode()))


def count_block_calls(core, fn) -> int:
    calls = []
    handles = [b.register_forward_pre_hook(lambda *a: calls.append(1)) for b in core.blocks]
    try:
        fn()
    finally:
        for h in handles:
            h.remove()
    return len(calls)


def test_registry_lists_the_spec_names() -> None:
    assert set(loopvae.list_models()) >= {
        "loopvae-cnn-f8d16", "loopvae-vit-f8d16", "loopvae-multi", "loopvae-cnn-tiny", "sd-vae", "flux-vae"
    }
    assert loopvae.list_models("loopvae-cnn-*") == ["loopvae-cnn-f8d16", "loopvae-cnn-small", "loopvae-cnn-tiny",
                                                    "loopvae-cnn-tiny-sc"]
    with pytest.raises(KeyError, match="unknown model 'loopvae-huge'; available: "):
        loopvae.create_model("loopvae-huge")


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_parameter_counts_match_the_paper(name: str) -> None:
    target, tol = PARAMS[name]
    model = meta_model(name)
    assert all(p.is_meta for p in model.parameters())
    assert abs(count_parameters(model) - target) <= tol * target, count_parameters(model)


@pytest.mark.parametrize("name,target,tol", [("loopvae-cnn-f8d16", 700.92e9, 0.10), ("flux-vae", 447.62e9, 0.03)])
def test_macs_at_256_match_the_paper(name: str, target: float, tol: float) -> None:
    macs = reconstruct_macs(meta_model(name))
    assert abs(macs - target) <= tol * target, macs / 1e9


@pytest.mark.parametrize("name", ["loopvae-cnn-f8d16", "loopvae-vit-f8d16"])
def test_f8d16_shapes_and_28_counted_applications_per_branch(name: str) -> None:
    model = meta_model(name)
    with torch.device("meta"):
        x = torch.empty(1, 3, 256, 256)
    posterior = {}
    enc_calls = count_block_calls(model.encoder.core, lambda: posterior.setdefault("d", model.encode(x).latent_dist))
    z = posterior["d"].mode()
    assert z.shape == (1, 16, 32, 32)
    out = {}
    dec_calls = count_block_calls(model.decoder.core, lambda: out.setdefault("x", model.decode(z).sample))
    assert out["x"].shape == (1, 3, 256, 256)
    assert enc_calls == dec_calls == 4 * (1 + 2 + 4) == 28


def test_multi_heads_and_decoder_suffixes() -> None:
    model = meta_model("loopvae-multi")
    with torch.device("meta"):
        x = torch.empty(1, 3, 256, 256)
    posteriors = model.encode_all(x)
    assert {f: tuple(p.mode().shape[1:]) for f, p in posteriors.items()} == {
        8: (16, 32, 32), 16: (64, 16, 16), 32: (128, 8, 8)
    }
    calls = {}
    for factor, posterior in posteriors.items():
        z = posterior.mode()
        calls[factor] = count_block_calls(model.decoder.core, lambda z=z: model.decode(z))
        assert model.decode(z).sample.shape == (1, 3, 256, 256)
    assert calls == {8: 24, 16: 42, 32: 78}
    assert len(model.encoder.core.blocks) == len(model.decoder.core.blocks) == 6


@pytest.mark.parametrize("sharing,stored", [("global", 4), ("scale", 12), ("none", 28)])
def test_sharing_rules_store_4_12_28_with_equal_macs_and_shapes(sharing: str, stored: int) -> None:
    model = meta_model("loopvae-cnn-f8d16", sharing=sharing)
    assert len(model.encoder.core.blocks) == len(model.decoder.core.blocks) == stored
    assert reconstruct_macs(model) == reconstruct_macs(meta_model("loopvae-cnn-f8d16"))
    with torch.device("meta"):
        x = torch.empty(2, 3, 128, 64)
    assert model(x).sample.shape == x.shape


# Exact counted parameters of every registered model (counted on meta); a change to any architecture shows up
# here first. The paper figures and their tolerances are PARAMS above.
COUNTED = {
    "flux-vae": 83_819_683, "flux-vae-tiny": 1_031_401, "loopvae-cnn-f8d16": 29_293_863, "loopvae-cnn-tiny": 350_535,
    "loopvae-cnn-tiny-sc": 350_535,
    "loopvae-cnn-small": 4_211_463, "flux-vae-small": 11_856_083,
    "loopvae-multi": 220_424_105, "loopvae-vit-f8d16": 32_688_423, "sd-vae": 83_653_863,
    "klvae-tiny-w32": 1_016_067, "klvae-tiny-w24": 988_251, "klvae-tiny-d2": 956_987, "klvae-tiny-w32-attn": 1_049_603,
    "dcae-tiny": 1_234_491,
}
# Tiny versions of every registered architecture (same graph: scales, loops, windows, heads), for numerics.
TINY_OVERRIDES = {
    "loopvae": dict(width=24, num_blocks=1, norm_num_groups=4),
    "attention": dict(num_heads=2),
    "reference": dict(block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=4),
    "dc": dict(encoder_block_out_channels=(8, 8, 16, 16), decoder_block_out_channels=(8, 8, 16, 16)),
}


def tiny_overrides(name: str) -> dict:
    if name == "flux-vae-tiny":
        return {}
    if name == "dcae-tiny":
        return TINY_OVERRIDES["dc"]
    if not name.startswith("loopvae"):
        return TINY_OVERRIDES["reference"]
    if meta_model(name).config.shortcuts:  # every shortcut needs a width divisible by 12, 16 and 3
        return {**TINY_OVERRIDES["loopvae"], "width": 48}
    if meta_model(name).config.block_type == "attention":
        return {**TINY_OVERRIDES["loopvae"], **TINY_OVERRIDES["attention"]}
    return TINY_OVERRIDES["loopvae"]


def test_every_registered_model_has_its_counted_parameters() -> None:
    assert sorted(COUNTED) == loopvae.list_models()
    for name, count in COUNTED.items():
        assert count_parameters(meta_model(name)) == count, name


@pytest.mark.parametrize("name", loopvae.list_models())
def test_every_registered_model_trains_at_tiny_size(name: str) -> None:
    """Forward and backward through every latent of a tiny copy: finite, shape-preserving, every parameter used."""
    torch.manual_seed(0)
    model = loopvae.create_model(name, **tiny_overrides(name))
    x = torch.rand(2, 3, 64, 64) * 2 - 1
    if isinstance(model, loopvae.LoopVAE):
        posteriors = list(model.encode_all(x).values())
    elif has_posterior(model):
        posteriors = [model.encode(x).latent_dist]
    else:  # a deterministic autoencoder (AutoencoderDC): its latent, no KL term
        posteriors = [None]
    loss = torch.zeros(())
    for posterior in posteriors:
        z = model.encode(x).latent if posterior is None else posterior.sample()
        recon = model.decode(z).sample
        assert recon.shape == x.shape
        loss = loss + (recon - x).square().mean() + (0.0 if posterior is None else 1e-6 * posterior.kl().mean())
    loss.backward()
    assert torch.isfinite(loss)
    unused = [n for n, p in model.named_parameters() if p.grad is None]
    assert not unused, unused[:5]
    assert all(torch.isfinite(p.grad).all() for p in model.parameters()), name


def test_pretrained_and_checkpoint_path_mean_what_they_mean_in_timm_and_srvit(tmp_path) -> None:
    import warnings

    import pytest
    import torch

    import loopvae
    from loopvae.demo import bundled_model_dir

    with pytest.raises(ValueError, match="checkpoint_path"):
        loopvae.create_model("loopvae-cnn-tiny", pretrained=True)
    bundled = loopvae.LoopVAE.from_pretrained(bundled_model_dir()).eval()
    loaded = loopvae.create_model("loopvae-cnn-tiny", shortcuts=True, checkpoint_path=bundled_model_dir()).eval()
    x = torch.rand(1, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        assert torch.equal(loaded(x).sample, bundled(x).sample)
    with pytest.raises(ValueError, match="does not match the architecture"):
        loopvae.create_model("loopvae-cnn-tiny", width=96, checkpoint_path=bundled_model_dir())
    with pytest.raises(FileNotFoundError, match="checkpoint_path"):
        loopvae.create_model("loopvae-cnn-tiny", checkpoint_path=tmp_path / "nothing")
    ref = loopvae.create_model("flux-vae-tiny")
    ref.register_to_config(scaling_factor=0.5, shift_factor=0.25)  # measured for these weights: they come along
    ref.save_pretrained(tmp_path / "ref")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = loopvae.create_model("flux-vae-tiny", pretrained=str(tmp_path / "ref"))
    assert any(issubclass(w.category, FutureWarning) for w in caught)
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), ref.state_dict().values(), strict=True))
    assert (again.config.scaling_factor, again.config.shift_factor) == (0.5, 0.25)
