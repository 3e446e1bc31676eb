"""The fused block path computes the plain adaLN-Zero formula (up to float rounding), in both torch memory
formats, forward and backward; the speed switches change no parameter and no MAC."""

from __future__ import annotations

import copy

import pytest
import torch

import loopcore as lc
from loopcore.flops import count_macs, count_parameters
from looprun.speed import prepare_for_speed, to_memory_format
from loopvae import create_model
from lv_testing import randomize_


def _block_and_input(kind: str) -> tuple[lc.ModulatedBlock, torch.Tensor]:
    if kind == "conv":
        return randomize_(lc.conv_block(64, 16), std=0.1), torch.randn(2, 64, 9, 7)
    return randomize_(lc.attention_block(64, 16, num_heads=4), std=0.1), torch.randn(2, 6, 5, 64)


@pytest.mark.parametrize("kind", ["conv", "attention"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_fused_block_equals_the_plain_formula_forward_and_backward(kind: str, layout: str) -> None:
    block, x = _block_and_input(kind)
    cond = torch.randn(16)
    plain = lc.set_fused_blocks(copy.deepcopy(block), False)
    fused = prepare_for_speed(block, layout) if kind == "conv" else block
    x_fused = to_memory_format(x, layout) if kind == "conv" else x

    with torch.no_grad():
        ref = plain(x, cond)
        torch.testing.assert_close(fused(x_fused, cond), ref, rtol=0, atol=1e-5)
        assert not torch.allclose(ref, x, atol=1e-2)  # the block does work: the comparison is not trivial

    xa, xb = x.clone().requires_grad_(True), x_fused.clone().requires_grad_(True)
    (plain(xa, cond) ** 2).sum().backward()
    (fused(xb, cond) ** 2).sum().backward()
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-4, atol=1e-4)
    for (name, pa), (_, pb) in zip(plain.named_parameters(), fused.named_parameters()):
        torch.testing.assert_close(pb.grad, pa.grad, rtol=1e-4, atol=1e-4, msg=name)


def test_per_sample_modulation_takes_the_plain_formula() -> None:
    # (B, cond_dim) conditioning cannot be folded into shared weights: the fused path must not be taken.
    block, x = _block_and_input("conv")
    cond = torch.randn(2, 16)
    plain = lc.set_fused_blocks(copy.deepcopy(block), False)
    torch.testing.assert_close(block(x, cond), plain(x, cond), rtol=0, atol=0)


@pytest.mark.parametrize("sharing", lc.SHARING_RULES)
def test_looped_core_with_fused_blocks_matches_the_written_recursion(sharing: str) -> None:
    core = randomize_(lc.LoopedCore(lc.block_factory("conv", 32, 32), 2, [1, 3], 32, sharing=sharing), std=0.1)
    plain = lc.set_fused_blocks(copy.deepcopy(core), False)
    h0 = torch.randn(2, 32, 8, 8)
    with torch.no_grad():
        for scale in range(2):
            expected = h0
            for t in range(core.passes[scale]):  # the written recursion with the plain formula
                key = str(scale)
                x = expected if t == 0 else expected + plain.injection_gates[key] * plain.injections[key](h0)
                expected = plain.run_pass(x, scale, t)
            torch.testing.assert_close(core(h0, scale).output, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["loopvae-cnn-tiny", "loopvae-vit-f8d16"])
def test_optimised_tokenizer_equals_the_eager_reference_path(name: str) -> None:
    kwargs = {} if name == "loopvae-cnn-tiny" else {"width": 64, "num_heads": 2, "num_blocks": 2}
    model = randomize_(create_model(name, **kwargs).eval(), std=0.05)
    reference = lc.set_fused_blocks(copy.deepcopy(model), False)
    x = torch.rand(2, 3, 64, 64) * 2 - 1
    with torch.no_grad():
        expected = reference(x).sample
        fast = prepare_for_speed(model, "channels_last")
        got = fast(to_memory_format(x, "channels_last")).sample
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    # the cores do work in this comparison: without their blocks' modulation the output moves far more than 1e-5
    identity_cores = copy.deepcopy(reference)
    for m in identity_cores.modules():
        if isinstance(m, lc.ModulatedBlock):
            m.reset_modulation()
    with torch.no_grad():
        assert (identity_cores(x).sample - expected).abs().max() > 1e-2


def test_speed_switches_change_no_parameter_and_no_mac() -> None:
    with torch.device("meta"):
        model = create_model("loopvae-cnn-f8d16")
        x = torch.empty(1, 3, 256, 256)
    params, macs = count_parameters(model), count_macs(lambda: model.decode(model.encode(x).latent_dist.mode()))
    lc.set_fused_blocks(model, False)
    assert count_macs(lambda: model.decode(model.encode(x).latent_dist.mode())) == macs
    prepare_for_speed(model, "channels_last")
    assert count_parameters(model) == params == 29_293_863
    assert count_macs(lambda: model.decode(model.encode(x).latent_dist.mode())) == macs
