"""Recurrence as an ODE: explicit solvers over the residual field ``v(z) = F(z) - z``.

For a residual block ``F`` (``F(z) = z + r(z)``) repeated application ``z_{t+1} = F(z_t)`` is explicit
Euler with step 1 on ``z' = F(z) - z``. The steppers below generalise that to a step size ``h`` and
to higher-order methods (Heun / RK2, classical RK4), plus the "black-box" field ``z' = F(z)`` used
as an ablation. ``F`` receives the step index so loop-conditioned blocks know which pass they run.

Euler is written as ``lerp(z, F(z), h)``, which with ``h = 1`` is ``F(z)`` exactly (and is computed as
such), so Euler(h=1) is bit-identical to plain recursion.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

StepFn = Callable[[torch.Tensor, int], torch.Tensor]
SOLVERS: tuple[str, ...] = ("euler", "heun", "rk4", "blackbox")
Field = Literal["residual", "blackbox"]


def residual_field(block: StepFn, z: torch.Tensor, step: int) -> torch.Tensor:
    """``v(z) = F(z) - z``."""
    return block(z, step) - z


def euler_step(block: StepFn, z: torch.Tensor, step: int, h: float, field: Field = "residual") -> torch.Tensor:
    """One explicit Euler step of size ``h``."""
    if field == "blackbox":
        return z + h * block(z, step)
    if h == 1.0:  # lerp(z, F(z), 1) is F(z) exactly; skipping it saves a pass over the state
        return block(z, step)
    return torch.lerp(z, block(z, step), h)


def heun_step(block: StepFn, z: torch.Tensor, step: int, h: float, field: Field = "residual") -> torch.Tensor:
    """One Heun (explicit trapezoidal, RK2) step of size ``h``: two evaluations of ``F``."""
    f = _field(block, field)
    k1 = f(z, step)
    k2 = f(z + h * k1, step)
    return z + (0.5 * h) * (k1 + k2)


def rk4_step(block: StepFn, z: torch.Tensor, step: int, h: float, field: Field = "residual") -> torch.Tensor:
    """One classical Runge-Kutta-4 step of size ``h``: four evaluations of ``F``."""
    f = _field(block, field)
    k1 = f(z, step)
    k2 = f(z + (0.5 * h) * k1, step)
    k3 = f(z + (0.5 * h) * k2, step)
    k4 = f(z + h * k3, step)
    return z + (h / 6.0) * (k1 + 2 * k2 + 2 * k3 + k4)


def _field(block: StepFn, field: Field) -> StepFn:
    if field == "blackbox":
        return block
    if field == "residual":
        return lambda z, step: residual_field(block, z, step)
    raise ValueError(f"unknown vector field {field!r}; choose 'residual' or 'blackbox'")


_STEPPERS = {"euler": euler_step, "heun": heun_step, "rk4": rk4_step}
EVALS_PER_STEP = {"euler": 1, "heun": 2, "rk4": 4, "blackbox": 1}


@dataclass(frozen=True)
class ODESolver:
    """A fixed-step explicit solver.

    Args:
        method: ``euler`` | ``heun`` | ``rk4`` | ``blackbox`` (Euler on ``z' = F(z)``).
        step_size: ``h`` (> 0).
    """

    method: str = "euler"
    step_size: float = 1.0

    def __post_init__(self) -> None:
        if self.method not in SOLVERS:
            raise ValueError(f"unknown solver {self.method!r}; choose one of {SOLVERS}")
        if not self.step_size > 0:
            raise ValueError(f"solver step_size must be > 0, got {self.step_size}")

    @property
    def evaluations_per_step(self) -> int:
        """Block evaluations per step (arithmetic cost relative to plain recursion)."""
        return EVALS_PER_STEP[self.method]

    def step(self, block: StepFn, z: torch.Tensor, step: int) -> torch.Tensor:
        """Advance ``z`` (any shape) by one step of the solver on ``block``'s field."""
        if self.method == "blackbox":
            return euler_step(block, z, step, self.step_size, field="blackbox")
        return _STEPPERS[self.method](block, z, step, self.step_size)

    def integrate(
        self, block: StepFn, z0: torch.Tensor, steps: int, return_states: bool = False
    ) -> torch.Tensor | list[torch.Tensor]:
        """Run ``steps`` steps from ``z0``.

        Returns:
            The final state, or with ``return_states`` the list ``[z_1, ..., z_steps]`` (for deep
            supervision: put a loss on every k-th entry, see :func:`supervised_steps`).
        """
        if steps < 1:
            raise ValueError(f"integrate needs steps >= 1, got {steps}")
        z, states = z0, []
        for t in range(steps):
            z = self.step(block, z, t)
            if return_states:
                states.append(z)
        return states if return_states else z


def supervised_steps(steps: int, every: int) -> list[int]:
    """1-based step numbers that get a deep-supervision loss: every ``every``-th, always the last."""
    if every < 1:
        raise ValueError(f"deep supervision interval must be >= 1, got {every}")
    chosen = list(range(every, steps + 1, every))
    if not chosen or chosen[-1] != steps:
        chosen.append(steps)
    return chosen
