"""loopcore.depthwise: the weight gradient as a forward convolution equals the native gradient."""

import pytest
import torch
import torch.nn.functional as F

from loopcore.depthwise import depthwise_conv2d


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("k,bias", [(7, True), (3, False), (1, True)])
def test_gradients_match_native(memory_format, k, bias):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 9, 11, dtype=torch.float64).contiguous(memory_format=memory_format).requires_grad_()
    w = torch.randn(5, 1, k, k, dtype=torch.float64).contiguous(memory_format=memory_format).requires_grad_()
    b = torch.randn(5, dtype=torch.float64, requires_grad=True) if bias else None
    g = torch.randn(3, 5, 9, 11, dtype=torch.float64)
    ours = depthwise_conv2d(x, w, b)
    ref = F.conv2d(x, w, b, padding=k // 2, groups=5)
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)  # the forward is the same kernel call
    inputs = [x, w] + ([b] if bias else [])
    got = torch.autograd.grad(ours, inputs, g)
    want = torch.autograd.grad(ref, inputs, g)
    for a, e in zip(got, want, strict=True):
        assert a.shape == e.shape
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10)


def test_float32_weight_gradient_close_and_only_what_is_needed():
    torch.manual_seed(1)
    x = torch.randn(8, 48, 16, 16).contiguous(memory_format=torch.channels_last)
    w = torch.randn(48, 1, 7, 7, requires_grad=True)
    g = torch.randn(8, 48, 16, 16)
    (dw,) = torch.autograd.grad(depthwise_conv2d(x, w), [w], g)  # x needs no gradient: none is computed
    (ref,) = torch.autograd.grad(F.conv2d(x, w, padding=3, groups=48), [w], g)
    torch.testing.assert_close(dw, ref, rtol=1e-4, atol=1e-3)


def test_gradcheck():
    torch.manual_seed(2)
    x = torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 1, 3, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(depthwise_conv2d, (x, w, b))


def test_rejects_a_non_depthwise_weight():
    with pytest.raises(ValueError, match=r"weight \(4, 2, 3, 3\) is not \(C=4, 1, k, k\)"):
        depthwise_conv2d(torch.randn(1, 4, 5, 5), torch.randn(4, 2, 3, 3))
    with pytest.raises(ValueError, match="odd k"):
        depthwise_conv2d(torch.randn(1, 4, 5, 5), torch.randn(4, 1, 2, 2))
