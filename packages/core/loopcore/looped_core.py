"""The looped core: K stored blocks run for a per-scale number of passes.

Vocabulary (the same in every package, config and document): a *pass* is one run of the K-block stack; a
*stage* is the run of ``L_s`` passes at scale index ``s``; ``fusion_mode`` is the SoftMoR mode that fuses a
stage's pass outputs (``last`` = plain recursion, no fusion parameters).

At scale ``s`` the K-block stack runs ``L_s`` passes,

    h_{t+1} = Core(h_t + [t > 0] * g_s * P_s(h_0), c_{s,t}),

where ``P_s`` is a scale-specific 1x1 (token-wise linear) projection and ``g_s`` a scalar gate that
starts at 0. Every piece is optional so that the recursive classifiers run on the same engine: without
conditioning the blocks are called on the state alone, without injection ``h_{t+1} = Core(h_t)``, and a
``solver`` (:class:`loopcore.ODESolver`) turns each pass into one step of an explicit solver on the field
``Core(h) - h`` (Euler with ``h = 1`` is the plain pass, bit for bit).

Which stored block serves block slot ``k`` of pass ``t`` at scale ``s`` is the sharing rule: ``global``
(K blocks for everything), ``scale`` (K per scale) or ``none`` (one per application). Sharing is always
*one module instance called several times*, never tied Parameters, so safetensors, DDP and
``torch.compile`` see ordinary modules. The execution graph and arithmetic are identical under the three
rules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .hooks import LoopHooks, PassRecord, relative_update
from .modulation import ScaleLoopEmbedding
from .ode import ODESolver
from .softmor import FUSION_MODES, SoftMoRFusion

# block_call(block, x, stage, pass_index, slot) -> block output: how an unconditioned core calls a block
BlockCall = Callable[[nn.Module, torch.Tensor, int, int, int], torch.Tensor]

SharingRule = Literal["global", "scale", "none"]
SHARING_RULES: tuple[str, ...] = ("global", "scale", "none")


def stored_block_count(num_blocks: int, passes: Sequence[int], sharing: str) -> int:
    """Blocks a core stores: ``K`` (global), ``K * S`` (scale) or ``K * sum(L)`` (none); ``passes``: ``L_s``."""
    if sharing == "global":
        return num_blocks
    if sharing == "scale":
        return num_blocks * len(passes)
    if sharing == "none":
        return num_blocks * sum(passes)
    raise ValueError(f"unknown sharing rule {sharing!r}; choose one of {SHARING_RULES}")


@dataclass
class StageOutput:
    """Result of one stage.

    ``output``: the stage's final state (``h_L``, or the SoftMoR fusion of the pass outputs);
    ``pass_outputs``: every executed pass's output ``h_1..h_k`` when requested or fused, else ``None``;
    ``fusion_weights``: ``(B, k, *tokens)`` SoftMoR weights when the core fuses, else ``None``.
    """

    output: torch.Tensor
    pass_outputs: list[torch.Tensor] | None = None
    fusion_weights: torch.Tensor | None = None


class LoopedCore(nn.Module):
    """A weight-shared, scale- and loop-conditioned recursive block stack.

    Args:
        block_factory: zero-argument callable building one block ``block(x, cond, window_size)``
            (see :func:`loopcore.conv_block`, :func:`loopcore.attention_block`).
        num_blocks: ``K``, blocks per pass.
        passes: ``L_s``, the passes of every stage ``s`` (the order the caller runs its stages in).
        dim: feature width ``C`` (for the injection projections and SoftMoR).
        cond_dim: width of the conditioning vector (default ``dim``).
        sharing: ``global`` | ``scale`` | ``none``.
        features_last: layout (shape) of the states, not a torch memory format: ``False`` = ``(B, C, H, W)`` maps
            (convolution blocks), ``True`` = ``(B, ..., C)`` tokens (attention blocks).
        window_sizes: attention window side per scale (``None`` = global); only for attention blocks.
        fusion_mode: ``"last"`` (plain recursion; no fusion parameters) or a SoftMoR mode fusing each stage's
            pass outputs (:data:`loopcore.FUSION_MODES`).
        conditioning: condition every block on ``c_{s,t}`` (``block(x, cond, window_size)``); ``False`` calls
            ``block_call(block, x, stage, pass_index, slot)`` (default ``block(x)``) and stores no embedding.
        injection: add the gated input injection ``g_s P_s(h_0)`` from the second pass on.
        solver: ``None`` (each pass maps ``h -> Core(h)``) or an :class:`ODESolver` stepping ``h`` along
            ``Core(h) - h`` (or ``Core(h)`` for ``blackbox``); Heun / RK4 evaluate the stack several times.
        block_call: see ``conditioning``.
    """

    def __init__(
        self,
        block_factory: Callable[[], nn.Module],
        num_blocks: int,
        passes: Sequence[int],
        dim: int,
        cond_dim: int | None = None,
        sharing: SharingRule = "global",
        features_last: bool = False,
        window_sizes: Sequence[int | None] | None = None,
        fusion_mode: str = "last",
        conditioning: bool = True,
        injection: bool = True,
        solver: ODESolver | None = None,
        block_call: BlockCall | None = None,
    ) -> None:
        super().__init__()
        passes = [int(v) for v in passes]
        if num_blocks < 1 or not passes or min(passes) < 1:
            raise ValueError(f"LoopedCore needs num_blocks >= 1 and passes >= 1, got K={num_blocks}, passes={passes}")
        if window_sizes is not None and len(window_sizes) != len(passes):
            raise ValueError(f"window_sizes has {len(window_sizes)} entries for {len(passes)} stages")
        self.num_blocks = num_blocks
        self.passes = passes
        self.sharing = sharing
        self.features_last = features_last
        self.window_sizes = list(window_sizes) if window_sizes is not None else [None] * len(passes)
        self.solver = solver
        self.block_call = block_call
        self.gradient_checkpointing = False
        self.hooks: LoopHooks | None = None

        self.embedding = ScaleLoopEmbedding(len(passes), max(passes), cond_dim or dim) if conditioning else None
        self.blocks = nn.ModuleList(block_factory() for _ in range(stored_block_count(num_blocks, passes, sharing)))
        self._offsets = [sum(passes[:s]) for s in range(len(passes))]
        # Injection only exists where a stage has a second pass: unused parameters would break DDP.
        proj = (lambda: nn.Linear(dim, dim)) if features_last else (lambda: nn.Conv2d(dim, dim, 1))
        injected = [s for s, n in enumerate(passes) if n > 1] if injection else []
        self.injections = nn.ModuleDict({str(s): proj() for s in injected})
        self.injection_gates = nn.ParameterDict({str(s): nn.Parameter(torch.zeros(())) for s in injected})
        self.fusions = None
        self.fusion_mode = "last"
        self.add_fusion(fusion_mode, dim)

    def add_fusion(self, mode: str, dim: int) -> None:
        """Create the SoftMoR routers (``mode``) of every stage with more than one pass; once, before training.

        ``last`` creates nothing (plain recursion). The constructor calls it for ``fusion_mode=...``; a model that
        must draw its routers' initial weights after its other parameters (to keep a seeded initialisation
        stable) builds the core without and calls it.
        """
        if self.fusions is not None:
            raise RuntimeError(f"this core already fuses with {self.fusion_mode!r}")
        if mode not in FUSION_MODES:
            raise ValueError(f"unknown fusion_mode {mode!r}; choose one of {FUSION_MODES}")
        if mode == "last":
            return
        self.fusion_mode = mode
        self.fusions = nn.ModuleDict(
            {str(s): SoftMoRFusion(dim, n, mode, self.features_last) for s, n in enumerate(self.passes) if n > 1}
        )

    # -- structure -----------------------------------------------------------------------------
    @property
    def num_scales(self) -> int:
        return len(self.passes)

    @property
    def applications(self) -> int:
        """Block applications in one full forward over all scales: ``K * sum(L)``."""
        return self.num_blocks * sum(self.passes)

    def block_index(self, scale: int, loop: int, slot: int) -> int:
        """Index into ``self.blocks`` of the block run in ``slot`` of pass ``loop`` at ``scale``."""
        if self.sharing == "global":
            return slot
        if self.sharing == "scale":
            return scale * self.num_blocks + slot
        return (self._offsets[scale] + loop) * self.num_blocks + slot

    # -- switches ------------------------------------------------------------------------------
    def set_gradient_checkpointing(self, enabled: bool = True) -> None:
        """Recompute each pass in the backward pass instead of storing its activations."""
        self.gradient_checkpointing = enabled

    @contextmanager
    def use_hooks(self, hooks: LoopHooks | None) -> Iterator[LoopHooks | None]:
        """Install ``hooks`` for every stage run inside the ``with`` block (restores the old ones)."""
        previous, self.hooks = self.hooks, hooks
        try:
            yield hooks
        finally:
            self.hooks = previous

    # -- execution -----------------------------------------------------------------------------
    def run_pass(self, x: torch.Tensor, scale: int, loop: int) -> torch.Tensor:
        """Run the K-block stack once with conditioning ``c_{scale, loop}``; ``x`` is post-injection."""
        if self.embedding is None:
            for slot in range(self.num_blocks):
                block = self.blocks[self.block_index(scale, loop, slot)]
                x = block(x) if self.block_call is None else self.block_call(block, x, scale, loop, slot)
            return x
        cond = self.embedding(scale, loop)
        window = self.window_sizes[scale]
        for slot in range(self.num_blocks):
            x = self.blocks[self.block_index(scale, loop, slot)](x, cond, window_size=window)
        return x

    def _stack_fn(self, scale: int, shift: torch.Tensor | None) -> Callable[[torch.Tensor, int], torch.Tensor]:
        """``(z, pass) -> Core(z + shift)`` at ``scale``: the function a solver step evaluates."""
        if shift is None:
            return lambda z, loop: self._pass(z, scale, loop)
        return lambda z, loop: self._pass(z + shift, scale, loop)

    def _pass(self, x: torch.Tensor, scale: int, loop: int) -> torch.Tensor:
        if self.gradient_checkpointing and torch.is_grad_enabled():
            return checkpoint(self.run_pass, x, scale, loop, use_reentrant=False)
        return self.run_pass(x, scale, loop)

    def forward(
        self, h0: torch.Tensor, scale: int, hooks: LoopHooks | None = None, return_passes: bool = False,
        num_passes: int | None = None, fuse: bool = True,
    ) -> StageOutput:
        """Run the stage at ``scale`` from its input ``h0``.

        Args:
            h0: stage input, ``(B, C, H, W)`` or ``(B, ..., C)`` per ``features_last``.
            scale: the stage's scale index into ``passes``.
            hooks: interventions / recording (default: the ones installed with :meth:`use_hooks`).
            return_passes: also return every pass output (deep supervision, analysis).
            num_passes: run this many passes instead of ``passes[scale]``; more than trained (beyond the horizon)
                needs a core without conditioning and with stored blocks shared across passes; SoftMoR then
                extrapolates (passes past ``L_s`` share the last pass's router bias). Hooks' prefixes refer
                to this count.
            fuse: ``False`` returns the last pass output unfused (a caller that fuses itself).

        Returns:
            :class:`StageOutput`; ``output`` has the shape of ``h0``.
        """
        if not 0 <= scale < self.num_scales:
            raise IndexError(f"scale {scale} outside [0, {self.num_scales})")
        hooks = hooks if hooks is not None else self.hooks
        planned = self.passes[scale] if num_passes is None else int(num_passes)
        if planned < 1:
            raise ValueError(f"num_passes must be >= 1, got {planned}")
        if planned > self.passes[scale] and (self.embedding is not None or self.sharing == "none"):
            raise ValueError(
                f"{planned} passes at scale {scale} exceed the trained {self.passes[scale]}: only a core without "
                "conditioning and with shared blocks (sharing global or scale) can run beyond its horizon"
            )
        n_run = hooks.passes_to_run(scale, planned) if hooks is not None else planned
        fuses = fuse and self.fusions is not None
        keep = return_passes or fuses
        outputs: list[torch.Tensor] = []
        injected = None
        h = h0
        for t in range(n_run):
            if t == 0 or str(scale) not in self.injections:
                x = h
            else:
                if injected is None:  # g_s * P_s(h_0) does not change between passes: compute once
                    key = str(scale)
                    injected = self.injection_gates[key] * self.injections[key](h0)
                x = h + injected
            bypassed = hooks is not None and (scale, t) in hooks.bypass
            if bypassed:
                out = h
            elif self.solver is None:
                out = self._pass(x, scale, t)
            else:  # the pass is one solver step on Core(. + injection) - .
                out = self.solver.step(self._stack_fn(scale, None if t == 0 else injected), h, t)
            if hooks is not None and hooks.record:
                hooks.records.append(self._record(scale, t, bypassed, h, x, out, hooks.keep_tensors))
            h = out
            if keep:
                outputs.append(out)
        if fuses and len(outputs) > 1:
            fused = self.fusions[str(scale)](outputs, extrapolate=len(outputs) > self.passes[scale], context=h0)
            return StageOutput(fused.fused, outputs, fused.weights)
        return StageOutput(h, outputs if return_passes else None, None)

    @staticmethod
    def _record(
        scale: int, loop: int, bypassed: bool, h: torch.Tensor, x: torch.Tensor, out: torch.Tensor, keep: bool
    ) -> PassRecord:
        record = PassRecord(scale, loop, bypassed, relative_update(h, out))
        if keep:
            record.state_in, record.stack_in, record.state_out = h.detach(), x.detach(), out.detach()
        return record
