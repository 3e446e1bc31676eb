"""The pre-norm ViT block and stochastic depth."""

import pytest
import torch

import loopcore as lc
from loopcore.flops import count_parameters


def test_prenorm_block_has_a_deit_blocks_parameters_and_shape() -> None:
    d = 48
    block = lc.PreNormBlock(d, num_heads=4)
    assert count_parameters(block) == 12 * d * d + 13 * d
    x = torch.randn(2, 7, d)
    assert block(x).shape == (2, 7, d)


def test_drop_path_is_identity_in_eval_and_unbiased_in_training() -> None:
    x = torch.ones(20000, 3)
    assert lc.drop_path(x, 0.3, training=False) is x
    assert lc.drop_path(x, 0.0, training=True) is x
    torch.manual_seed(0)
    y = lc.drop_path(x, 0.3, training=True)
    rows = y[:, 0]
    kept = rows[rows != 0]
    assert torch.allclose(kept, torch.full_like(kept, 1 / 0.7))
    assert torch.equal(y[:, 0], y[:, 2])  # one decision per sample
    assert rows.mean().item() == pytest.approx(1.0, abs=0.03)
    with pytest.raises(ValueError, match="drop-path probability"):
        lc.drop_path(x, 1.0, training=True)


def test_block_without_drop_path_in_training_equals_eval() -> None:
    block = lc.PreNormBlock(32, 4)
    x = torch.randn(2, 5, 32)
    assert torch.equal(block.train()(x), block.eval()(x))


def test_queries_compute_the_leading_tokens_of_the_full_block() -> None:
    block = lc.PreNormBlock(32, 4)
    x = torch.randn(2, 9, 32)
    for k in (1, 3, 9):
        torch.testing.assert_close(block(x, queries=k), block(x)[:, :k], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="queries must be in 1..9"):
        block(x, queries=10)
    with pytest.raises(ValueError, match="sequences, not"):
        block.attn(torch.randn(1, 2, 2, 32), queries=1)
