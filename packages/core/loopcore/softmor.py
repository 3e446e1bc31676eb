"""SoftMoR: soft mixture over the outputs of all recursion passes.

Given the outputs ``h^(1..R)`` of ``R`` passes, per token ``alpha = softmax_r(score_r(h^(r)))`` and
the fused state is ``sum_r alpha_r h^(r)``. Modes:

* ``last``   -- plain recursion (weight 1 on the last pass; no parameters);
* ``mean``   -- uniform weights (no parameters);
* ``global`` -- one learned logit per step, shared by all tokens (``R`` parameters);
* ``token``  -- a per-token router (default). The SoftMoR paper gives no equations; ours is
  ``LayerNorm(d) -> Linear(d, d) -> GELU -> Linear(d, 1)`` applied to every step's output,
  shared over steps, plus a learned per-step bias. Parameter cost: ``2d + (d^2 + d) + (d + 1) + R
  = d^2 + 4d + 1 + R`` (e.g. 148,997 for d=384, R=4). The last linear and the step biases start
  at zero, so the router starts as ``mean`` and learns to prefer steps.

Tokens are pixels for ``(B, C, H, W)`` maps (``channels_last=False``) and the leading positions
for ``(B, ..., C)`` tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

FusionMode = Literal["last", "mean", "global", "token"]
FUSION_MODES: tuple[str, ...] = ("last", "mean", "global", "token")


@dataclass
class FusionOutput:
    """``fused``: shape of one step's state; ``weights``: ``(B, R, *token_dims)``, summing to 1 over R."""

    fused: torch.Tensor
    weights: torch.Tensor


def router_parameter_count(dim: int, steps: int) -> int:
    """Parameters of the ``token`` router for width ``dim`` and ``steps`` recursion steps."""
    return dim * dim + 4 * dim + 1 + steps


class SoftMoRFusion(nn.Module):
    """Fuse ``R`` pass outputs with soft, optionally token-wise, weights.

    Args:
        dim: channels ``d`` of each state.
        steps: maximum number of steps ``R`` that will be fused (prefixes of fewer steps are allowed).
        mode: one of ``last``, ``mean``, ``global``, ``token``.
        channels_last: layout of the states (see module docstring).
    """

    def __init__(self, dim: int, steps: int, mode: FusionMode = "token", channels_last: bool = True) -> None:
        super().__init__()
        if mode not in FUSION_MODES:
            raise ValueError(f"unknown SoftMoR mode {mode!r}; choose one of {FUSION_MODES}")
        if steps < 1:
            raise ValueError(f"SoftMoR needs steps >= 1, got {steps}")
        self.mode = mode
        self.steps = steps
        self.channels_last = channels_last
        if mode == "global":
            self.step_logits = nn.Parameter(torch.zeros(steps))
        elif mode == "token":
            self.router = nn.Sequential(
                nn.LayerNorm(dim), nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, 1)
            )
            self.step_bias = nn.Parameter(torch.zeros(steps))
            nn.init.zeros_(self.router[-1].weight)
            nn.init.zeros_(self.router[-1].bias)

    def step_index(self, r: int) -> list[int]:
        """Per-step parameter index for ``r`` states: ``0..r-1``, steps beyond ``R`` reuse step ``R - 1``."""
        return [min(i, self.steps - 1) for i in range(r)]

    def forward(
        self, states: list[torch.Tensor] | tuple[torch.Tensor, ...], extrapolate: bool = False
    ) -> FusionOutput:
        """Fuse ``states`` (tensors of identical shape, oldest first).

        ``r = len(states)`` must be in ``1..steps``; with ``extrapolate`` (evaluation beyond the training
        horizon) more states are allowed and steps past ``R`` share the last step's bias / logit.
        """
        r = len(states)
        if r < 1 or (r > self.steps and not extrapolate):
            raise ValueError(
                f"SoftMoR got {r} states, configured for 1..{self.steps}; pass extrapolate=True to fuse more"
            )
        ref = states[-1]
        b = ref.shape[0]
        token_dims = ref.shape[1:-1] if self.channels_last else ref.shape[2:]
        if self.mode == "last":
            weights = torch.zeros(b, r, *token_dims, device=ref.device, dtype=ref.dtype)
            weights[:, -1] = 1
            return FusionOutput(ref, weights)
        # One (B, *tokens, R, C) stack serves the router (a single GEMM over every step) and the weighted sum.
        stacked = torch.stack([h if self.channels_last else h.movedim(1, -1) for h in states], dim=-2)
        if self.mode == "mean":
            logits = torch.zeros(stacked.shape[:-1], device=ref.device, dtype=torch.float32)
        elif self.mode == "global":
            logits = self.step_logits[self.step_index(r)].float().expand(stacked.shape[:-1])
        else:
            logits = self.router(stacked).squeeze(-1).float() + self.step_bias[self.step_index(r)].float()
        weights = logits.softmax(dim=-1).to(ref.dtype)  # (B, *tokens, R)
        fused = (stacked * weights.unsqueeze(-1)).sum(dim=-2)
        if not self.channels_last:
            fused = fused.movedim(-1, 1)
        return FusionOutput(fused, weights.movedim(-1, 1))


def fusion_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Mean entropy (nats) of the fusion distribution over steps; ``weights``: ``(B, R, ...)``."""
    w = weights.float().clamp_min(1e-12)
    return -(w * w.log()).sum(dim=1).mean()
