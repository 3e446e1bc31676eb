import pytest
import torch

import loopcore as lc
from lv_testing import randomize_


@pytest.mark.parametrize("kind", ["conv", "attention"])
def test_block_is_identity_at_init(kind: str) -> None:
    kwargs = {"num_heads": 4} if kind == "attention" else {}
    block = lc.block_factory(kind, 64, 32, **kwargs)()
    x = torch.randn(2, 64, 8, 8) if kind == "conv" else torch.randn(2, 8, 8, 64)
    cond = torch.randn(32)
    assert torch.equal(block(x, cond), x)
    # Only the modulation is zero: the operator itself is not trivial.
    assert any(p.abs().sum() > 0 for p in block.operator.parameters())


def test_block_matches_written_formula() -> None:
    torch.manual_seed(1)
    block = randomize_(lc.conv_block(32, 16), std=0.1)
    x, cond = torch.randn(2, 32, 6, 6), torch.randn(16)
    op = block.operator
    b1, g1, a1, b2, g2, a2 = (p.view(1, -1, 1, 1) for p in block.modulation(cond).chunk(6))
    norm = lambda t: torch.nn.functional.group_norm(t, 32, eps=1e-6)
    v = x + a1 * op.spatial((1 + g1) * norm(x) + b1)
    y = v + a2 * op.mlp((1 + g2) * norm(v) + b2)
    torch.testing.assert_close(block(x, cond), y, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(y, x, atol=1e-3)


def test_per_sample_conditioning_broadcasts() -> None:
    block = randomize_(lc.attention_block(32, 16, num_heads=2), std=0.1)
    x = torch.randn(3, 4, 5, 32)
    cond = torch.randn(3, 16)
    out = block(x, cond)
    for i in range(3):
        torch.testing.assert_close(out[i : i + 1], block(x[i : i + 1], cond[i]), rtol=1e-5, atol=1e-5)


def test_conv_operator_rejects_windows_and_bad_groups() -> None:
    with pytest.raises(ValueError, match="divisible by GroupNorm groups"):
        lc.ConvOperator(40)
    block = lc.conv_block(32, 8)
    with pytest.raises(ValueError, match="no attention windows"):
        block(torch.randn(1, 32, 4, 4), torch.randn(8), window_size=4)


@pytest.mark.parametrize("kind", ["conv", "attention"])
def test_blocks_build_on_meta_and_run_under_bf16_autocast(kind: str) -> None:
    kwargs = {"num_heads": 4} if kind == "attention" else {}
    with torch.device("meta"):
        meta_block = lc.block_factory(kind, 64, 64, **kwargs)()
    assert all(p.is_meta for p in meta_block.parameters())
    block = randomize_(lc.block_factory(kind, 64, 64, **kwargs)(), std=0.05)
    x = torch.randn(2, 64, 8, 8) if kind == "conv" else torch.randn(2, 8, 8, 64)
    cond = torch.randn(64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = block(x, cond)
    assert y.shape == x.shape and torch.isfinite(y).all()
    # bf16 autocast tracks the fp32 computation to bf16 precision.
    ref = block(x, cond)
    assert (y.float() - ref).abs().max() < 0.05 * ref.abs().max()
