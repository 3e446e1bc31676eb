"""Intervention hooks for the looped core: recording, prefix truncation, single-pass bypass.

A :class:`LoopHooks` object is handed to a stage call of :class:`loopcore.LoopedCore` (or installed with
:meth:`loopcore.LoopedCore.use_hooks` so a whole model picks it up). With no hooks, or with hooks
that ask for nothing, the core runs exactly the same operations as the plain forward, so outputs
are bit-identical.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def relative_update(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """Per-sample ``RMS(after - before) / max(RMS(before), 1e-8)``.

    Args:
        before, after: ``(B, ...)`` states of one pass (input ``h_t`` and output ``h_{t+1}``).

    Returns:
        ``(B,)`` float32 relative update sizes (>= 0).
    """
    b, a = before.detach().float().flatten(1), after.detach().float().flatten(1)
    rms_delta = (a - b).pow(2).mean(dim=1).sqrt()
    rms_before = b.pow(2).mean(dim=1).sqrt()
    return rms_delta / rms_before.clamp_min(1e-8)


@dataclass
class PassRecord:
    """What one executed (or bypassed) pass saw and produced.

    ``state_in`` is the pre-injection state ``h_t``; ``stack_in`` the tensor that entered the block
    stack (``h_t + [t>0] g_s P_s(h_0)``); ``state_out`` is ``h_{t+1}``. Tensors are detached and only
    kept when the hooks ask for ``keep_tensors``; ``relative_update`` is always filled (``(B,)``).
    """

    scale: int
    loop: int
    bypassed: bool
    relative_update: torch.Tensor
    state_in: torch.Tensor | None = None
    stack_in: torch.Tensor | None = None
    state_out: torch.Tensor | None = None


@dataclass
class LoopHooks:
    """Interventions and recording for one or more forward calls.

    Args:
        record: append a :class:`PassRecord` for every pass to ``records``.
        keep_tensors: with ``record``, also keep the pass tensors (memory!).
        prefix: ``{scale: k}`` runs only the first ``k`` passes of that scale's stage (1 <= k <= L_s);
            the stage output is then ``h_k`` (or the fusion of the first ``k`` pass outputs).
        bypass: ``{(scale, loop), ...}`` replaces that pass's output by its pre-injection input
            ``h_t``; later passes keep their own loop indices.
    """

    record: bool = False
    keep_tensors: bool = False
    prefix: dict[int, int] = field(default_factory=dict)
    bypass: set[tuple[int, int]] = field(default_factory=set)
    records: list[PassRecord] = field(default_factory=list)

    @property
    def active(self) -> bool:
        """True when these hooks change or observe anything."""
        return self.record or bool(self.prefix) or bool(self.bypass)

    def passes_to_run(self, scale: int, planned: int) -> int:
        """Number of passes to execute at ``scale`` out of the ``planned`` ones (the trained ``L_s`` by default)."""
        k = self.prefix.get(scale, planned)
        if not 1 <= k <= planned:
            raise ValueError(f"prefix for scale {scale} must be in [1, {planned}], got {k}")
        return k

    def clear(self) -> None:
        """Forget collected records (keeps the intervention settings)."""
        self.records.clear()
