import pytest
import torch

import loopcore as lc
from lv_testing import randomize_


def test_euler_step_one_is_plain_recursion_bit_for_bit() -> None:
    core = randomize_(lc.LoopedCore(lc.block_factory("attention", 32, 32, num_heads=2), 1, [6], 32,
                                    features_last=True), std=0.1)
    block = lambda z, t: core.run_pass(z, 0, t)
    z0 = torch.randn(2, 4, 4, 32)
    plain, z = [], z0
    for t in range(6):
        z = block(z, t)
        plain.append(z)
    states = lc.ODESolver("euler", 1.0).integrate(block, z0, 6, return_states=True)
    assert all(torch.equal(a, b) for a, b in zip(states, plain))
    assert not torch.equal(lc.ODESolver("euler", 0.5).integrate(block, z0, 6), plain[-1])


def test_solver_orders_on_a_linear_field() -> None:
    # F(z) = M z gives z' = (M - I) z with exact solution expm((M - I) T) z0.
    torch.manual_seed(3)
    m = torch.eye(4, dtype=torch.float64) + 0.3 * torch.randn(4, 4, dtype=torch.float64)
    block = lambda z, t: z @ m.T
    z0 = torch.randn(1, 4, dtype=torch.float64)
    exact = z0 @ torch.linalg.matrix_exp(m - torch.eye(4, dtype=torch.float64)).T
    errors = {}
    for method in ("euler", "heun", "rk4"):
        errs = [
            (lc.ODESolver(method, 1.0 / n).integrate(block, z0, n) - exact).norm().item() for n in (8, 16)
        ]
        errors[method] = errs
    # halving h divides the error by ~2, ~4, ~16
    assert 1.7 < errors["euler"][0] / errors["euler"][1] < 2.3
    assert 3.4 < errors["heun"][0] / errors["heun"][1] < 4.6
    assert 13 < errors["rk4"][0] / errors["rk4"][1] < 19
    assert errors["rk4"][1] < errors["heun"][1] < errors["euler"][1]


def test_blackbox_field_and_costs() -> None:
    block = lambda z, t: 2 * z
    z0 = torch.ones(3)
    torch.testing.assert_close(lc.ODESolver("blackbox", 0.5).integrate(block, z0, 1), torch.full((3,), 2.0))
    torch.testing.assert_close(lc.heun_step(block, z0, 0, 1.0, field="blackbox"), torch.full((3,), 5.0))
    assert [lc.ODESolver(m).evaluations_per_step for m in lc.SOLVERS] == [1, 2, 4, 1]


def test_step_index_reaches_the_block_and_deep_supervision_schedule() -> None:
    seen = []
    lc.ODESolver("heun").integrate(lambda z, t: seen.append(t) or z, torch.zeros(1), 3)
    assert seen == [0, 0, 1, 1, 2, 2]
    assert lc.supervised_steps(12, 4) == [4, 8, 12]
    assert lc.supervised_steps(10, 4) == [4, 8, 10]
    with pytest.raises(ValueError, match="unknown solver"):
        lc.ODESolver("midpoint")
    with pytest.raises(ValueError, match="step_size must be > 0"):
        lc.ODESolver("euler", 0.0)
