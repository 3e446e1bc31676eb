import pytest
import torch

import loopcore as lc
from lv_testing import randomize_


def states(features_last: bool, r: int = 4) -> list[torch.Tensor]:
    shape = (2, 5, 6, 16) if features_last else (2, 16, 5, 6)
    return [torch.randn(shape) for _ in range(r)]


@pytest.mark.parametrize("features_last", [True, False])
def test_last_mode_is_plain_recursion(features_last: bool) -> None:
    fusion = lc.SoftMoRFusion(16, 4, "last", features_last)
    xs = states(features_last)
    out = fusion(xs)
    assert torch.equal(out.fused, xs[-1])
    assert out.weights.shape == (2, 4, 5, 6)
    assert torch.equal(out.weights[:, -1], torch.ones(2, 5, 6))


@pytest.mark.parametrize("features_last", [True, False])
def test_token_weights_sum_to_one_and_vary_per_token(features_last: bool) -> None:
    fusion = randomize_(lc.SoftMoRFusion(16, 4, "token", features_last), std=0.5)
    xs = states(features_last)
    out = fusion(xs)
    torch.testing.assert_close(out.weights.sum(dim=1), torch.ones(2, 5, 6))
    assert (out.weights >= 0).all()
    assert out.weights.std(dim=(2, 3)).max() > 1e-3  # really token-wise
    # the fused state is the weighted sum of the steps
    w = out.weights.unsqueeze(-1) if features_last else out.weights.unsqueeze(2)
    torch.testing.assert_close(out.fused, sum(w[:, i] * xs[i] for i in range(4)), rtol=1e-5, atol=1e-6)


def test_token_router_starts_as_mean_and_global_mode() -> None:
    xs = states(True)
    mean = lc.SoftMoRFusion(16, 4, "mean")(xs).fused
    torch.testing.assert_close(mean, torch.stack(xs).mean(0))
    torch.testing.assert_close(lc.SoftMoRFusion(16, 4, "token")(xs).fused, mean)
    glob = lc.SoftMoRFusion(16, 4, "global")
    with torch.no_grad():
        glob.step_logits.copy_(torch.tensor([0.0, 0.0, 0.0, 50.0]))
    torch.testing.assert_close(glob(xs).fused, xs[-1], rtol=1e-5, atol=1e-5)


def test_router_parameter_cost_is_documented_formula() -> None:
    for dim, r in [(16, 4), (384, 4)]:
        for mode in lc.FUSION_MODES:
            fusion = lc.SoftMoRFusion(dim, r, mode)
            assert sum(p.numel() for p in fusion.parameters()) == lc.router_parameter_count(dim, r, mode)
    assert lc.router_parameter_count(384, 4, "token") == 148_997
    assert lc.router_parameter_count(384, 4, "query") == 148_612 == lc.router_parameter_count(384, 4)  # default
    assert sum(p.numel() for p in lc.SoftMoRFusion(16, 4, "global").parameters()) == 4


def test_prefix_of_steps_and_entropy() -> None:
    fusion = randomize_(lc.SoftMoRFusion(16, 4, "token"), std=0.5)
    out = fusion(states(True, r=2))
    assert out.weights.shape[1] == 2
    assert 0 < float(lc.fusion_entropy(out.weights.detach())) <= float(torch.log(torch.tensor(2.0))) + 1e-6
    with pytest.raises(ValueError, match="configured for 1..4"):
        fusion(states(True, r=5))


def test_core_with_fusion_returns_weights_and_gets_router_gradients() -> None:
    core = randomize_(lc.LoopedCore(lc.block_factory("conv", 32, 32), 2, [1, 3], 32, fusion_mode="token"), std=0.05)
    x = torch.randn(2, 32, 4, 4)
    out = core(x, 1)
    assert out.fusion_weights.shape == (2, 3, 4, 4)
    out.output.sum().backward()
    assert core.fusions["1"].router[-1].weight.grad.abs().sum() > 0
    last = randomize_(lc.LoopedCore(lc.block_factory("conv", 32, 32), 2, [1, 3], 32, fusion_mode="last"), std=0.05)
    plain = lc.LoopedCore(lc.block_factory("conv", 32, 32), 2, [1, 3], 32)
    plain.load_state_dict(last.state_dict())
    assert torch.equal(last(x, 1).output, plain(x, 1).output)


@pytest.mark.parametrize("features_last", [True, False])
def test_token_fusion_matches_a_per_step_reference(features_last: bool) -> None:
    """The fused implementation (running weighted sum, float32 softmax) equals a direct per-step reference."""
    fusion = randomize_(lc.SoftMoRFusion(16, 4, "token", features_last), std=0.3)
    xs = states(features_last)
    to_cl = (lambda h: h) if features_last else (lambda h: h.movedim(1, -1))
    logits = torch.stack([fusion.router(to_cl(h)).squeeze(-1) + fusion.step_bias[i] for i, h in enumerate(xs)], 1)
    weights = logits.softmax(dim=1)
    expected = sum(w.unsqueeze(-1) * to_cl(h) for w, h in zip(weights.unbind(1), xs))
    out = fusion(xs)
    torch.testing.assert_close(to_cl(out.fused), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.weights, weights, rtol=1e-5, atol=1e-6)


def test_more_states_than_steps_need_extrapolate_and_reuse_the_last_step_bias() -> None:
    fusion = lc.SoftMoRFusion(16, 2, "global")
    with torch.no_grad():
        fusion.step_logits.copy_(torch.tensor([0.0, 1.0]))
    xs = states(True, r=4)
    with pytest.raises(ValueError, match="extrapolate=True"):
        fusion(xs)
    weights = fusion(xs, extrapolate=True).weights[0, :, 0, 0]
    expected = torch.tensor([0.0, 1.0, 1.0, 1.0]).softmax(0)
    torch.testing.assert_close(weights, expected)


@pytest.mark.parametrize("features_last", [True, False])
def test_query_fusion_scores_each_step_against_a_query_from_the_start_state(features_last: bool) -> None:
    xs = states(features_last)
    start = torch.randn_like(xs[0])
    fusion = lc.SoftMoRFusion(16, 4, "query", features_last)
    mean = lc.SoftMoRFusion(16, 4, "mean", features_last)(xs).fused
    torch.testing.assert_close(fusion(xs, context=start).fused, mean)  # zero-initialised query
    randomize_(fusion, std=0.5)
    to_cl = (lambda h: h) if features_last else (lambda h: h.movedim(1, -1))
    q = fusion.query(to_cl(start))
    ln = torch.nn.functional.layer_norm
    logits = torch.stack([(q * ln(to_cl(h), (16,))).sum(-1) / 4.0 + fusion.step_bias[i] for i, h in enumerate(xs)], 1)
    weights = logits.softmax(dim=1)
    out = fusion(xs, context=start)
    torch.testing.assert_close(out.weights, weights, rtol=1e-5, atol=1e-6)
    assert out.weights.std(dim=(2, 3)).max() > 1e-3  # token-wise
    expected = sum(w.unsqueeze(-1) * to_cl(h) for w, h in zip(weights.unbind(1), xs))
    torch.testing.assert_close(to_cl(out.fused), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="pass context="):
        fusion(xs)


def test_core_passes_the_stage_input_to_query_fusion() -> None:
    core = randomize_(lc.LoopedCore(lc.block_factory("conv", 32, 32), 2, [1, 3], 32, fusion_mode="query"), std=0.05)
    out = core(torch.randn(2, 32, 4, 4), 1)
    assert out.fusion_weights.shape == (2, 3, 4, 4)
    out.output.sum().backward()
    assert core.fusions["1"].query[-1].weight.grad.abs().sum() > 0
