"""The classifier's head path: the last block application computed for the class token alone.

A logits-only forward reads nothing but the class token of the final state, and every SoftMoR mode weighs a
token's passes from that token alone, so the last application of the last block only needs the class
token's output (its attention still reads every key: :class:`loopcore.Attention` ``queries=``). This is a
classifier concern, so it lives here, not in the engine: :class:`loopcore.LoopedCore` and
:class:`loopcore.ODESolver` always advance whole states.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import loopcore as lc
from loopcore.ode import euler_step

# Methods whose step evaluates the block once, at the current state: the class token's new value then needs
# only the block's class-token output. Heun and RK4 evaluate the block at intermediate *full* states.
SINGLE_EVALUATION_METHODS = ("euler", "blackbox")


def advances_head_only(solver: lc.ODESolver) -> bool:
    """Whether :func:`head_step` can advance the leading tokens alone with ``solver``."""
    return solver.method in SINGLE_EVALUATION_METHODS


def head_step(
    solver: lc.ODESolver, head_block: Callable[[torch.Tensor, int], torch.Tensor], z: torch.Tensor, step: int,
    tokens: int = 1,
) -> torch.Tensor:
    """One ``solver`` step for the first ``tokens`` entries of ``z`` only.

    Args:
        solver: an Euler or black-box solver (:func:`advances_head_only`).
        head_block: maps the full state ``z`` ``(B, N, C)`` and the step index to the block's output for the
            first ``tokens`` tokens, ``(B, tokens, C)``.
        z: the full state ``(B, N, C)``.

    Returns:
        ``(B, tokens, C)``: equal (up to float rounding) to ``solver.step(block, z, step)[:, :tokens]``.
    """
    if not advances_head_only(solver):
        raise ValueError(f"solver {solver.method!r} cannot advance a subset of tokens; use euler or blackbox")
    field = "blackbox" if solver.method == "blackbox" else "residual"
    return euler_step(lambda _, t: head_block(z, t), z[:, :tokens], step, solver.step_size, field=field)
