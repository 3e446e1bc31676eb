"""Any-time decoding: ``LoopVAE.decode(z, decoder_passes=[...])`` runs a prefix of each decoder stage's passes."""

import pytest
import torch

import loopcore as lc
import loopvae
from loopvae import LoopVAE
from loopvae.demo import bundled_model_dir
from lv_testing import randomize_


@pytest.fixture(scope="module")
def model() -> loopvae.LoopVAE:
    vae = loopvae.create_model("loopvae-cnn-tiny", shortcuts=True, sample_size=32)
    return randomize_(vae, std=0.05).eval()  # non-zero modulation: every pass changes the state


@pytest.fixture(scope="module")
def latent(model: loopvae.LoopVAE) -> torch.Tensor:
    torch.manual_seed(0)
    with torch.no_grad():
        return model.encode(torch.rand(2, 3, 32, 32) * 2 - 1).latent_dist.mode()


@torch.no_grad()
def test_the_trained_schedule_is_the_plain_decode_bit_for_bit(model: LoopVAE, latent: torch.Tensor) -> None:
    plain = model.decode(latent).sample
    assert torch.equal(model.decode(latent, decoder_passes=[1, 2, 4]).sample, plain)
    assert torch.equal(model.decode(latent, decoder_passes=None).sample, plain)
    assert torch.equal(model(torch.zeros(1, 3, 32, 32), decoder_passes=(1, 2, 4)).sample,
                       model(torch.zeros(1, 3, 32, 32)).sample)


@pytest.mark.parametrize("schedule", [[1, 2, 1], [1, 1, 4], [1, 2, 2], [1, 1, 1]])
@torch.no_grad()
def test_a_shorter_schedule_is_the_prefix_hooks_result(model: LoopVAE, latent: torch.Tensor,
                                                       schedule: list[int]) -> None:
    trained = list(model.config.decoder_passes)
    prefix = {s: k for s, k in enumerate(schedule) if k < trained[s]}
    with model.decoder.core.use_hooks(lc.LoopHooks(prefix=prefix)):
        expected = model.decode(latent).sample
    got = model.decode(latent, decoder_passes=schedule).sample
    assert torch.equal(got, expected)
    assert not torch.allclose(got, model.decode(latent).sample, atol=1e-4)  # it really ran fewer passes
    assert model.decoder.core.hooks is None  # nothing stays installed


@pytest.mark.parametrize("schedule", [[1, 2], [1, 2, 4, 1], [0, 2, 4], [1, 3, 4], [1, 2, 5], ["a", 2, 4]])
def test_schedules_that_do_not_fit_the_trained_one_are_refused(model: LoopVAE, latent: torch.Tensor,
                                                               schedule: list) -> None:
    with pytest.raises(ValueError, match=r"decoder_passes"):
        model.decode(latent, decoder_passes=schedule)


def test_it_refuses_to_mix_with_installed_hooks(model: LoopVAE, latent: torch.Tensor) -> None:
    with model.decoder.core.use_hooks(lc.LoopHooks(record=True)), pytest.raises(ValueError, match="hooks"):
        model.decode(latent, decoder_passes=[1, 2, 1])


@torch.no_grad()
def test_it_composes_with_slicing_and_tiling(model: LoopVAE) -> None:
    torch.manual_seed(1)
    z = model.encode(torch.rand(2, 3, 64, 64) * 2 - 1).latent_dist.mode()
    expected = model.decode(z, decoder_passes=[1, 1, 2]).sample
    one_by_one = torch.cat([model.decode(zs, decoder_passes=[1, 1, 2]).sample for zs in z.split(1)])
    model.enable_slicing()
    try:
        assert torch.equal(model.decode(z, decoder_passes=[1, 1, 2]).sample, one_by_one)
    finally:
        model.disable_slicing()
    model.enable_tiling(tile_sample_size=32)
    try:
        tiled = model.decode(z, decoder_passes=[1, 1, 2]).sample
        assert tiled.shape == expected.shape and not torch.equal(tiled, model.decode(z).sample)
    finally:
        model.disable_tiling()


@torch.no_grad()
def test_on_the_bundled_model_fewer_finest_passes_cost_less_arithmetic() -> None:
    from loopcore.flops import count_macs

    vae = LoopVAE.from_pretrained(bundled_model_dir()).eval()
    torch.manual_seed(0)
    z = vae.encode(torch.rand(1, 3, 64, 64) * 2 - 1).latent_dist.mode()
    full = count_macs(lambda: vae.decode(z))
    cut = count_macs(lambda: vae.decode(z, decoder_passes=[1, 2, 1]))
    assert cut < 0.75 * full  # the finest stage's passes are most of the decoder's arithmetic
