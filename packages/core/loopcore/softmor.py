"""SoftMoR: soft mixture over the outputs of all recursion passes.

Given the outputs ``h^(1..R)`` of ``R`` passes, per token ``alpha = softmax_r(score_r(h^(r)))`` and
the fused state is ``sum_r alpha_r h^(r)``. Modes:

* ``last``   -- plain recursion (weight 1 on the last pass; no parameters);
* ``mean``   -- uniform weights (no parameters);
* ``global`` -- one learned logit per step, shared by all tokens (``R`` parameters);
* ``token``  -- a per-token router. The SoftMoR paper gives no equations; ours is
  ``LayerNorm(d) -> Linear(d, d) -> GELU -> Linear(d, 1)`` applied to every step's output,
  shared over steps, plus a learned per-step bias. Parameter cost: ``2d + (d^2 + d) + (d + 1) + R
  = d^2 + 4d + 1 + R`` (e.g. 148,997 for d=384, R=4). The last linear and the step biases start
  at zero, so the router starts as ``mean`` and learns to prefer steps.
* ``query``  -- the default: token-wise like ``token``, at a fraction of its arithmetic: a query
  ``q = Linear(d, d)(LayerNorm(c))`` is computed once per token from the state ``c`` the passes started
  from (the ``context``), and step ``r`` scores ``q . LN(h^(r)) / sqrt(d)`` (affine-free LN) plus a
  per-step bias. The ``d x d`` product runs once per token instead of once per token and step, so at
  ``R = 4`` it costs a quarter of ``token``'s router GEMMs, with nearly the same parameters:
  ``2d + d^2 + d + R = d^2 + 3d + R``. The query's linear starts at zero (= ``mean``). It is the default
  because ``token``'s router alone adds 7.2% MACs to SR-ViT-S at R = 4 (over the 5% budget) while
  ``query`` adds 1.8% (docs/benchmarks.md). Accuracy did not decide it: in the recurrence study neither
  router was shown better than the other (the difference was inconclusive, docs/study_recursion.md).

Tokens are pixels for ``(B, C, H, W)`` maps (``features_last=False``) and the leading positions
for ``(B, ..., C)`` tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

FusionMode = Literal["last", "mean", "global", "token", "query"]
FUSION_MODES: tuple[str, ...] = ("last", "mean", "global", "token", "query")


@dataclass
class FusionOutput:
    """``fused``: shape of one step's state; ``weights``: ``(B, R, *token_dims)``, summing to 1 over R."""

    fused: torch.Tensor
    weights: torch.Tensor


def router_parameter_count(dim: int, steps: int, mode: FusionMode = "query") -> int:
    """Parameters of one fusion module of ``mode`` for width ``dim`` and ``steps`` recursion steps."""
    counts = {"last": 0, "mean": 0, "global": steps, "token": dim * dim + 4 * dim + 1 + steps,
              "query": dim * dim + 3 * dim + steps}
    if mode not in counts:
        raise ValueError(f"unknown SoftMoR mode {mode!r}; choose one of {FUSION_MODES}")
    return counts[mode]


class SoftMoRFusion(nn.Module):
    """Fuse ``R`` pass outputs with soft, optionally token-wise, weights.

    Args:
        dim: channels ``d`` of each state.
        steps: maximum number of steps ``R`` that will be fused (prefixes of fewer steps are allowed).
        mode: one of ``last``, ``mean``, ``global``, ``token``, ``query`` (default).
        features_last: layout of the states (see module docstring).
    """

    def __init__(self, dim: int, steps: int, mode: FusionMode = "query", features_last: bool = True) -> None:
        super().__init__()
        if mode not in FUSION_MODES:
            raise ValueError(f"unknown SoftMoR mode {mode!r}; choose one of {FUSION_MODES}")
        if steps < 1:
            raise ValueError(f"SoftMoR needs steps >= 1, got {steps}")
        self.mode = mode
        self.steps = steps
        self.features_last = features_last
        if mode == "global":
            self.step_logits = nn.Parameter(torch.zeros(steps))
        elif mode == "token":
            self.router = nn.Sequential(
                nn.LayerNorm(dim), nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, 1)
            )
            self.step_bias = nn.Parameter(torch.zeros(steps))
            nn.init.zeros_(self.router[-1].weight)
            nn.init.zeros_(self.router[-1].bias)
        elif mode == "query":
            self.query = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim))
            self.step_bias = nn.Parameter(torch.zeros(steps))
            nn.init.zeros_(self.query[-1].weight)
            nn.init.zeros_(self.query[-1].bias)

    def step_index(self, r: int) -> list[int]:
        """Per-step parameter index for ``r`` states: ``0..r-1``, steps beyond ``R`` reuse step ``R - 1``."""
        return [min(i, self.steps - 1) for i in range(r)]

    def forward(
        self, states: list[torch.Tensor] | tuple[torch.Tensor, ...], extrapolate: bool = False,
        context: torch.Tensor | None = None,
    ) -> FusionOutput:
        """Fuse ``states`` (tensors of identical shape, oldest first).

        ``r = len(states)`` must be in ``1..steps``; with ``extrapolate`` (evaluation beyond the training
        horizon) more states are allowed and steps past ``R`` share the last step's bias / logit.
        ``context`` (shape of a state): the state the passes started from; required by ``query``.
        """
        r = len(states)
        if r < 1 or (r > self.steps and not extrapolate):
            raise ValueError(
                f"SoftMoR got {r} states, configured for 1..{self.steps}; pass extrapolate=True to fuse more"
            )
        ref = states[-1]
        b = ref.shape[0]
        token_dims = ref.shape[1:-1] if self.features_last else ref.shape[2:]
        if self.mode == "last":
            weights = torch.zeros(b, r, *token_dims, device=ref.device, dtype=ref.dtype)
            weights[:, -1] = 1
            return FusionOutput(ref, weights)
        # Per-step router GEMMs and a running weighted sum: no (B, *tokens, R, C) stack is materialised,
        # which on CPU is cheaper in time and memory than one batched GEMM over a stacked copy.
        hs = [h if self.features_last else h.movedim(1, -1) for h in states]
        logit_shape = (*hs[-1].shape[:-1], r)
        if self.mode == "mean":
            logits = torch.zeros(logit_shape, device=ref.device, dtype=torch.float32)
        elif self.mode == "global":
            logits = self.step_logits[self.step_index(r)].float().expand(logit_shape)
        elif self.mode == "query":
            if context is None:
                raise ValueError("SoftMoR 'query' fusion scores each step against a query from the state the "
                                 "passes started from: pass context= (same shape as a state)")
            start = context if self.features_last else context.movedim(1, -1)
            dim = start.shape[-1]
            query = self.query(start).unsqueeze(-2)  # (B, *tokens, 1, C)
            # token-wise dot products as (1 x C) @ (C x 1) matmuls: no (B, *tokens, C) product tensor
            scores = torch.cat([query @ F.layer_norm(h, (dim,)).unsqueeze(-1) for h in hs], dim=-1).squeeze(-2)
            logits = scores.float() * dim**-0.5 + self.step_bias[self.step_index(r)].float()
        else:
            logits = torch.cat([self.router(h) for h in hs], dim=-1).float()
            logits = logits + self.step_bias[self.step_index(r)].float()
        weights = logits.softmax(dim=-1).to(ref.dtype)  # (B, *tokens, R)
        fused = hs[0] * weights[..., :1]
        for i in range(1, r):
            fused = torch.addcmul(fused, hs[i], weights[..., i : i + 1])
        if not self.features_last:
            fused = fused.movedim(-1, 1)
        return FusionOutput(fused, weights.movedim(-1, 1))


def fusion_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Mean entropy (nats) of the fusion distribution over steps; ``weights``: ``(B, R, ...)``."""
    w = weights.float().clamp_min(1e-12)
    return -(w * w.log()).sum(dim=1).mean()
