import pytest
import torch

import loopcore as lc
from lv_testing import randomize_


def test_one_window_equals_global_attention() -> None:
    attn = randomize_(lc.Attention(32, num_heads=2), std=0.2)
    x = torch.randn(2, 8, 8, 32)
    torch.testing.assert_close(attn(x, window_size=8), attn(x, window_size=None), rtol=0, atol=1e-6)
    torch.testing.assert_close(attn(x, window_size=16), attn(x, window_size=None), rtol=0, atol=1e-6)


@pytest.mark.parametrize("size", [(8, 8), (7, 10)])
def test_windows_attend_only_inside_their_window(size: tuple[int, int]) -> None:
    # RoPE is relative, so each window equals global attention over that window cropped out on its own.
    attn = randomize_(lc.Attention(32, num_heads=2), std=0.2)
    height, width = size
    x = torch.randn(1, height, width, 32)
    out = attn(x, window_size=4)
    for y0 in range(0, height, 4):
        for x0 in range(0, width, 4):
            crop = x[:, y0 : y0 + 4, x0 : x0 + 4]
            torch.testing.assert_close(out[:, y0 : y0 + 4, x0 : x0 + 4], attn(crop), rtol=1e-4, atol=1e-5)


def test_rope_makes_logits_depend_on_offsets_only() -> None:
    cos, sin = lc.rope_2d_cos_sin(6, 6, 16)
    q, k = torch.randn(16), torch.randn(16)
    rot = lambda v: lc.apply_rope_2d(v.expand(36, 16), cos, sin).view(6, 6, 16)
    rq, rk = rot(q), rot(k)
    # token (1,2)->(3,5) has the same offset as (0,0)->(2,3)
    torch.testing.assert_close(rq[1, 2] @ rk[3, 5], rq[0, 0] @ rk[2, 3], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(rq[1, 2] @ rk[3, 5], rq[0, 0] @ rk[3, 5], atol=1e-3)
    # rotation keeps norms
    torch.testing.assert_close(rq.norm(dim=-1), q.norm().expand(6, 6), rtol=1e-5, atol=1e-5)


def test_sequence_attention_matches_manual_softmax() -> None:
    attn = randomize_(lc.Attention(16, num_heads=2, rope=False), std=0.3)
    x = torch.randn(2, 5, 16)
    q, k, v = attn.qkv(x).view(2, 5, 3, 2, 8).permute(2, 0, 3, 1, 4)
    w = (q @ k.transpose(-1, -2) / 8**0.5).softmax(-1)
    ref = attn.proj((w @ v).transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(attn(x), ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="needs a \\(B, H, W, C\\) grid"):
        attn(x, window_size=2)


def test_attention_rejects_bad_head_dims() -> None:
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        lc.Attention(30, num_heads=4)
    with pytest.raises(ValueError, match="head_dim % 4"):
        lc.Attention(12, num_heads=2)
