"""Recursive ViT classifiers: the DeiT baseline, bViT and SR-ViT as one module, :class:`RecursiveViT`.

The trunk has ``depth`` stored pre-norm blocks (:class:`loopcore.PreNormBlock`); block ``j`` is applied
``recursion`` times in place, each application being one step of an explicit ODE solver on the
residual field ``v(z) = B_j(z) - z`` (:class:`loopcore.ODESolver`; Euler with ``h = 1`` is plain
recursion ``z <- B_j(z)``, bit for bit). The recursion runs on the engine LoopVAE uses,
:class:`loopcore.LoopedCore`, as a schedule: stage ``j`` = block ``j`` for ``recursion`` passes (one block per
stage, sharing ``scale``; bViT: one stage, sharing ``global``), without conditioning or injection; so its
hooks (prefix truncation, bypass, pass records; :meth:`RecursiveViT.use_hooks`) and per-pass checkpointing
work on the classifiers too. The ``recursion`` step outputs of a block are fused by
:class:`loopcore.SoftMoRFusion` (per block, so a token router costs ``d^2 + 4d + 1 + R`` per block and a
query router ``d^2 + 3d + R``).

* ``vit``:   depth 12, recursion 1 (a DeiT ViT; no fusion parameters exist at ``R = 1``).
* ``bvit``:  depth 1, recursion ``T`` (= ``steps``), ``fusion_mode`` ``last``: one block applied ``T`` times,
  no step conditioning (``loop_embedding=True`` adds a learned, zero-initialised step embedding to the
  input of every application).
* ``srvit``: depth 12, recursion ``R``, ``fusion_mode`` ``query`` (SoftMoR; ``token`` the paper-sized router).

**Steps and deep supervision.** The *trajectory* is the sequence of states the classifier head can
read: the output of every application of the shared block for a single-block model (bViT; the last
entry is the fused output when it fuses), and the (fused) output of every block for deeper models.
``deep_supervision_every = k`` puts the shared head (final norm, class token, linear) on every ``k``-th
trajectory state and the last (:func:`loopcore.supervised_steps`). At inference ``steps=n`` runs every
block ``n`` times instead of ``recursion`` (beyond the training horizon when ``n > recursion``), with the
same weights.

Images are ``(B, 3, H, W)`` normalised with the dataset mean/std; logits are ``(B, num_classes)``.
``num_classes=0`` makes the head an ``nn.Identity`` (timm's convention): the forward then returns the
final-normed class token ``(B, embed_dim)``, the pooled features.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

import loopcore as lc
from looprun.config import RenamedKey
from looprun.release import ReleaseLoadingMixin

from .head_path import advances_head_only, head_step
from .timm_surface import IMAGENET_MEAN, IMAGENET_STD, TimmClassifierSurface


class PatchEmbed(nn.Module):
    """Non-overlapping ``p x p`` patches -> tokens: ``(B, 3, H, W)`` -> ``(B, (H/p)(W/p), d)``."""

    def __init__(self, img_size: int, patch_size: int, in_channels: int, dim: int) -> None:
        super().__init__()
        if img_size % patch_size:
            raise ValueError(f"img_size={img_size} is not a multiple of patch_size={patch_size}")
        self.img_size = img_size
        self.patch_size = patch_size
        self.num_patches = (img_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2:] != (self.img_size, self.img_size):
            raise ValueError(
                f"expected {self.img_size}x{self.img_size} images, got {tuple(x.shape[-2:])}; "
                "build the model with img_size=... to match the data"
            )
        return self.proj(x).flatten(2).transpose(1, 2)


@dataclass
class RecursionTrace:
    """What one forward produced besides the logits.

    ``trajectory``: the states the head can read, ``(B, 1 + N, d)`` each (see module docstring);
    ``step_states``: per block, its ``n`` step outputs (only when requested);
    ``fusion_weights``: per block, ``(B, n, 1 + N)`` SoftMoR weights (``None`` without fusion).
    """

    trajectory: list[torch.Tensor]
    step_states: list[list[torch.Tensor]] | None
    fusion_weights: list[torch.Tensor | None]


FAMILIES = ("vit", "bvit", "srvit")


class RecursiveViT(TimmClassifierSurface, ReleaseLoadingMixin, ModelMixin, ConfigMixin):
    """ViT / bViT / SR-ViT classifier (see module docstring).

    Args:
        img_size, patch_size, in_channels: input geometry (square images).
        num_classes: classifier outputs; 0 = no classifier (``head`` is ``nn.Identity``, the forward returns the
            pooled ``(B, embed_dim)`` features).
        embed_dim, depth, num_heads, mlp_ratio, qkv_bias: the stored blocks.
        recursion: applications of each block (``R`` for SR-ViT, ``T`` for bViT, 1 for ViT).
        fusion_mode: SoftMoR mode fusing each block's pass outputs (``fusion`` in older configs): ``last`` |
            ``mean`` | ``global`` | ``token`` | ``query`` (token-wise, scored against a query from the block
            input; see :mod:`loopcore.softmor`).
        solver, step_size: ODE stepper over ``v(z) = B(z) - z`` (``euler`` | ``heun`` | ``rk4``; ``blackbox``
            = Euler on ``z' = B(z)``) and its step ``h``.
        loop_embedding: add a learned per-step embedding to every application's input (bViT option).
        drop_path_rate: stochastic depth, rising linearly over the ``depth * recursion`` applications.
        deep_supervision_every: ``k > 0`` supervises every k-th trajectory state (training only).
        family: ``vit`` | ``bvit`` | ``srvit`` (bookkeeping for reports; the config above is the architecture).
        data_mean, data_std, crop_pct: the input normalisation and eval crop the weights expect (ImageNet's by
            default; ``srvit train`` records its protocol's). Not used by the network: they make
            :attr:`pretrained_cfg` true, which timm's ``resolve_data_config(model=...)`` reads.
    """

    _supports_gradient_checkpointing = True
    RENAMED_KEYS = {"fusion": RenamedKey("fusion_mode")}

    @register_to_config
    def __init__(
        self,
        img_size: int = 224,
        patch_size: int = 16,
        in_channels: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 384,
        depth: int = 12,
        num_heads: int = 6,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        recursion: int = 1,
        fusion_mode: str = "query",
        solver: str = "euler",
        step_size: float = 1.0,
        loop_embedding: bool = False,
        drop_path_rate: float = 0.0,
        deep_supervision_every: int = 0,
        family: str = "srvit",
        data_mean: Sequence[float] = IMAGENET_MEAN,
        data_std: Sequence[float] = IMAGENET_STD,
        crop_pct: float = 0.875,
    ) -> None:
        super().__init__()
        if depth < 1 or recursion < 1:
            raise ValueError(f"depth and recursion must be >= 1, got depth={depth}, recursion={recursion}")
        if family not in FAMILIES:
            raise ValueError(f"unknown family {family!r}; choose one of {FAMILIES}")
        if deep_supervision_every < 0:
            raise ValueError(f"deep_supervision_every must be >= 0 (0 = off), got {deep_supervision_every}")
        if not 0.0 <= drop_path_rate < 1.0:
            raise ValueError(f"drop_path_rate must be in [0, 1), got {drop_path_rate}")
        if num_classes < 0:
            raise ValueError(f"num_classes must be >= 0 (0 = no classifier, pooled features out), got {num_classes}")
        self.solver = lc.ODESolver(solver, step_size)
        self._fusion_record: list[torch.Tensor] | None = None  # see record_fusion_weights()

        self.patch_embed = PatchEmbed(img_size, patch_size, in_channels, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + self.patch_embed.num_patches, embed_dim))
        # The recursion runs on the shared engine: stage j = stored block j, run for `recursion` passes, each
        # pass one solver step, the passes fused by SoftMoR (routers only where several passes are fused:
        # R = 1 has exactly the ViT's parameters). No conditioning, no injection: bViT prescribes none.
        engine = lc.LoopedCore(
            lambda: lc.PreNormBlock(embed_dim, num_heads, mlp_ratio, qkv_bias), num_blocks=1,
            passes=[recursion] * depth, dim=embed_dim, sharing="global" if depth == 1 else "scale",
            features_last=True, conditioning=False, injection=False, solver=self.solver, block_call=self._call_block,
        )
        # The engine owns no parameters of its own here, so it is held unregistered and its blocks and routers
        # are registered on this model: parameter names stay timm's `blocks.i.*` (the DeiT state-dict recipe
        # and released weights rely on them) and the routers stay `fusions.i.*`.
        self.__dict__["engine"] = engine
        self.blocks = engine.blocks
        self.step_embedding = nn.Embedding(recursion, embed_dim) if loop_embedding else None
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self._init_weights()
        # Routers are drawn last (after the ViT init), so a seed gives the same trunk and head with or without
        # them; they exist only where several passes are fused: R = 1 has exactly the ViT's parameters.
        if recursion > 1:
            engine.add_fusion(fusion_mode, embed_dim)
        elif fusion_mode not in lc.FUSION_MODES:  # R = 1 builds no routers, but a typo is still an error
            raise ValueError(f"unknown fusion_mode {fusion_mode!r}; choose one of {lc.FUSION_MODES}")
        self.fusions = engine.fusions

    def _init_weights(self) -> None:
        # timm's ViT init: truncated-normal(0.02) linears and position embedding, tiny class token.
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        if self.step_embedding is not None:
            nn.init.zeros_(self.step_embedding.weight)  # starts as the unconditioned bViT

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute every block application in the backward pass (memory grows with ``recursion``)."""
        self.gradient_checkpointing = enable

    @property
    def gradient_checkpointing(self) -> bool:
        """Per-pass checkpointing of the engine (:meth:`loopcore.LoopedCore.set_gradient_checkpointing`)."""
        return self.engine.gradient_checkpointing

    @gradient_checkpointing.setter
    def gradient_checkpointing(self, enable: bool) -> None:
        self.engine.set_gradient_checkpointing(enable)

    def use_hooks(self, hooks: lc.LoopHooks | None):
        """Install loop interventions / recording for the forwards inside the ``with`` block.

        Stage ``j`` is stored block ``j`` (bViT: stage 0), pass ``t`` its ``t``-th application, exactly as
        in :class:`loopcore.LoopHooks`: ``prefix={j: k}`` applies block ``j`` only ``k`` times, ``bypass={(j, t)}``
        skips one application, ``record=True`` collects a :class:`loopcore.PassRecord` per application.
        While hooks are installed the class-token-only shortcut of the last application is not taken.
        """
        return self.engine.use_hooks(hooks)

    def _set_gradient_checkpointing(self, enable: bool = True, gradient_checkpointing_func=None) -> None:
        # diffusers' enable_gradient_checkpointing() lands here.
        self.gradient_checkpointing = enable

    @property
    def applications(self) -> int:
        """Block applications per forward at the training recursion: ``depth * recursion * evals/step``."""
        return self.config.depth * self.config.recursion * self.solver.evaluations_per_step

    def supervised_indices(self, steps: int | None = None) -> list[int]:
        """0-based trajectory indices that get a loss (just the last one without deep supervision)."""
        length = self.trajectory_length(steps)
        every = self.config.deep_supervision_every
        if every <= 0:
            return [length - 1]
        return [s - 1 for s in lc.supervised_steps(length, every)]

    def trajectory_length(self, steps: int | None = None) -> int:
        """Number of trajectory states: the steps of a single-block model, else its depth."""
        return (steps or self.config.recursion) if self.config.depth == 1 else self.config.depth

    @contextmanager
    def record_fusion_weights(self) -> Iterator[list[torch.Tensor]]:
        """Collect the SoftMoR weights of every forward run inside the ``with`` block (detached).

        Yields a list that receives, per fusing block and forward, its ``(B, n, T)`` weights (``T = 1 + N``
        tokens, or 1 for the class-token-only last block of a logits-only forward). Lets a training step
        log the routers' entropy (:func:`loopcore.fusion_entropy`) without a second forward.
        """
        record: list[torch.Tensor] = []
        previous, self._fusion_record = self._fusion_record, record
        try:
            yield record
        finally:
            self._fusion_record = previous

    # -- forward ---------------------------------------------------------------------------------
    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Images ``(B, 3, H, W)`` -> tokens ``(B, 1 + N, d)`` with class token and position embedding."""
        tokens = self.patch_embed(x)
        cls = self.cls_token.expand(tokens.shape[0], -1, -1)
        return torch.cat([cls, tokens], dim=1) + self.pos_embed

    def _call_block(
        self, block: nn.Module, z: torch.Tensor, stage: int, pass_index: int, slot: int = 0,
        queries: int | None = None,
    ) -> torch.Tensor:
        """One application of ``block`` (the engine's ``block_call``): the bViT step embedding, drop path."""
        cfg = self.config
        step = min(pass_index, cfg.recursion - 1)
        if self.step_embedding is not None:
            z = z + self.step_embedding.weight[step]
        drop = 0.0
        if self.training and cfg.drop_path_rate > 0:
            n = cfg.depth * cfg.recursion
            drop = cfg.drop_path_rate * (stage * cfg.recursion + step) / max(n - 1, 1)
        return block(z, drop, queries)

    @property
    def computes_head_only(self) -> bool:
        """Whether logits-only forwards compute just the class token in the last block application.

        Exact in value: the head reads nothing else, and every fusion mode weighs a token's steps from that
        token alone (or from nothing, for ``mean`` / ``global``); equal to the full computation up to float
        rounding. Needs a single-evaluation solver (Euler / black-box): Heun and RK4 evaluate the block at
        intermediate full states.
        """
        return advances_head_only(self.solver)

    def forward_trace(
        self, x: torch.Tensor, steps: int | None = None, return_step_states: bool = False,
        head_only: bool = False,
    ) -> RecursionTrace:
        """Run the trunk and keep the whole trajectory (un-normed tokens; see :class:`RecursionTrace`).

        Args:
            x: images ``(B, 3, H, W)``.
            steps: applications per block (default ``recursion``; more = beyond the training horizon).
            return_step_states: also keep every block's step outputs.
            head_only: the caller reads only the class token of the last state: where
                :attr:`computes_head_only` holds, the last application of the last block (and its fusion)
                runs for the class token alone and the last trajectory state is ``(B, 1, d)``.
        """
        if head_only and return_step_states:
            raise ValueError("head_only=True drops the last block's full state; it cannot return step states")
        trajectory: list[torch.Tensor] = []
        all_states: list[list[torch.Tensor]] = []
        weights: list[torch.Tensor | None] = []
        keep_steps = return_step_states or self.config.depth == 1
        for states, z, w in self._run_blocks(x, steps, head_only, keep_steps=keep_steps):
            weights.append(w)
            if return_step_states:
                all_states.append(states)
            # a single-block model exposes every step; its last state is the block's (fused) output
            trajectory.extend([*states[:-1], z] if self.config.depth == 1 else [z])
        return RecursionTrace(trajectory, all_states if return_step_states else None, weights)

    def _trajectory_states(self, x: torch.Tensor, steps: int | None, wanted: list[int]) -> list[torch.Tensor]:
        """The trajectory states at indices ``wanted`` (ascending), the last one for the class token only.

        Unlike :meth:`forward_trace` nothing else stays alive, so logits-only forwards hold two states at a time.
        """
        length = self.trajectory_length(steps)
        if not wanted or any(not 0 <= i < length for i in wanted):
            raise ValueError(f"trajectory indices {wanted} out of range for {length} states")
        single = self.config.depth == 1
        keep_steps = single and wanted != [length - 1]
        kept: list[torch.Tensor] = []
        for j, (states, z, _) in enumerate(self._run_blocks(x, steps, head_only=True, keep_steps=keep_steps)):
            if not single:
                if j in wanted:
                    kept.append(z)
            elif keep_steps:
                trajectory = [*states[:-1], z]
                kept = [trajectory[i] for i in wanted]
            else:
                kept = [z]
        return kept

    def _run_blocks(
        self, x: torch.Tensor, steps: int | None, head_only: bool, keep_steps: bool
    ) -> Iterator[tuple[list[torch.Tensor] | None, torch.Tensor, torch.Tensor | None]]:
        """Yield ``(step states or None, block output, fusion weights or None)`` block by block."""
        n = self.config.recursion if steps is None else int(steps)
        if n < 1:
            raise ValueError(f"steps must be >= 1, got {n}")
        z = self.embed(x)
        last = self.config.depth - 1
        for j in range(self.config.depth):
            if head_only and j == last and self.computes_head_only and self.engine.hooks is None:
                states, z, w = self._last_stage_head_only(z, n, keep_steps)
            else:
                out = self.engine(z, j, return_passes=keep_steps, num_passes=n)
                states, z, w = out.pass_outputs, out.output, out.fusion_weights
            if w is not None and self._fusion_record is not None:
                self._fusion_record.append(w.detach())
            yield (states if keep_steps else None), z, w

    def _last_stage_head_only(
        self, z: torch.Tensor, n: int, keep_steps: bool
    ) -> tuple[list[torch.Tensor] | None, torch.Tensor, torch.Tensor | None]:
        """The last block's ``n`` applications, the last one for the class token only (the classifier's head
        path: the head reads nothing else, and every fusion mode weighs a token's steps from that token alone).

        Returns ``(step states, output (B, 1, d), fusion weights (B, n, 1) or None)``; with ``keep_steps`` the
        step states are the ``n - 1`` full states and the class-token state.
        """
        j = self.config.depth - 1
        fuses = self.fusions is not None and n > 1
        states: list[torch.Tensor] = []
        prev = z
        if n > 1:
            out = self.engine(z, j, return_passes=keep_steps or fuses, num_passes=n - 1, fuse=False)
            states, prev = out.pass_outputs or [], out.output
        block = self.engine.blocks[self.engine.block_index(j, n - 1, 0)]
        head = lambda state, step: self._call_block(block, state, j, step, queries=1)  # noqa: E731
        last = head_step(self.solver, head, prev, n - 1, tokens=1)
        weights = None
        if fuses:
            fused = self.fusions[str(j)]([s[:, :1] for s in states] + [last], extrapolate=True, context=z[:, :1])
            out_state, weights = fused.fused, fused.weights
        else:
            out_state = last
        return ([*states, last] if keep_steps else None), out_state, weights

    def forward_features(self, x: torch.Tensor, steps: int | None = None) -> torch.Tensor:
        """Images -> final-normed tokens ``(B, 1 + N, d)`` (class token first)."""
        # deque(maxlen=1) keeps only the last block's output; earlier ones are freed as the trunk advances
        (_, z, _), = deque(self._run_blocks(x, steps, head_only=False, keep_steps=False), maxlen=1)
        return self.norm(z)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Normed tokens ``(B, 1 + N, d)`` -> logits ``(B, num_classes)``; the class token ``(B, d)`` with
        ``pre_logits`` or when ``num_classes == 0``."""
        cls = x[:, 0]
        return cls if pre_logits else self.head(cls)

    def forward(self, x: torch.Tensor, steps: int | None = None) -> torch.Tensor:
        """Images ``(B, 3, H, W)`` -> logits ``(B, num_classes)`` (features ``(B, d)`` when ``num_classes == 0``);
        ``steps`` overrides the recursion."""
        last = self.trajectory_length(steps) - 1
        return self.forward_head(self.norm(self._trajectory_states(x, steps, [last])[0]))

    def forward_supervised(self, x: torch.Tensor, steps: int | None = None) -> list[torch.Tensor]:
        """Logits of the shared head at every supervised trajectory state (the last one last)."""
        states = self._trajectory_states(x, steps, self.supervised_indices(steps))
        return [self.forward_head(self.norm(s)) for s in states]

    def forward_steps(self, x: torch.Tensor, steps: int | None = None) -> list[torch.Tensor]:
        """Logits of the shared head at every trajectory state, ``(B, num_classes)`` each (analysis: top-1 per
        recursion step; the stored blocks' outputs for a multi-block model, every step for a single block)."""
        return [self.forward_head(self.norm(s)) for s in self.forward_trace(x, steps, head_only=True).trajectory]

    def forward_intermediates(
        self, x: torch.Tensor, indices: int | list[int] | None = None, return_prefix_tokens: bool = False,
        norm: bool = False, stop_early: bool = False, output_fmt: str = "NCHW", intermediates_only: bool = False,
        steps: int | None = None,
    ) -> list | tuple[torch.Tensor, list]:
        """timm's ``forward_intermediates``: feature maps of selected trajectory states.

        The states are the stored blocks' (fused) outputs for a multi-block model (``depth`` of them) and every
        step's output for a single-block bViT (``steps`` of them), as timm counts a ViT's blocks.

        Args:
            x: images ``(B, 3, H, W)``.
            indices: ``n`` (the last ``n`` states), a list of state indices (negative from the end) or ``None``
                (all).
            return_prefix_tokens: return ``(feature map, class token (B, 1, d))`` pairs.
            norm: apply the final LayerNorm to every intermediate.
            stop_early: stop after the last selected state (the returned final features are then that state's).
            output_fmt: ``NCHW`` (``(B, d, H/p, W/p)`` patch-token maps) or ``NLC`` (``(B, N, d)`` tokens).
            intermediates_only: return the list alone.
            steps: applications per block (default ``recursion``).

        Returns:
            ``(final normed tokens (B, 1 + N, d), intermediates)``, or the intermediates alone.
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        length = self.trajectory_length(steps)
        if indices is None:
            wanted = list(range(length))
        elif isinstance(indices, int):
            if not 1 <= indices <= length:
                raise ValueError(f"indices={indices} asks for the last {indices} of {length} states")
            wanted = list(range(length - indices, length))
        else:
            if not indices or any(not -length <= i < length for i in indices):
                raise ValueError(f"indices {list(indices)} out of range for {length} states (select at least one)")
            wanted = sorted(i % length for i in indices)
        single = self.config.depth == 1
        h, w = x.shape[-2] // self.config.patch_size, x.shape[-1] // self.config.patch_size
        intermediates: list = []
        last = None
        index = 0
        for states, z, _ in self._run_blocks(x, steps, head_only=False, keep_steps=single):
            for state in ([*states[:-1], z] if single else [z]):
                if stop_early and index > wanted[-1]:
                    break
                last = state
                if index in wanted:
                    out = self.norm(state) if norm else state
                    prefix, tokens = out[:, :1], out[:, 1:]
                    if output_fmt == "NCHW":
                        tokens = tokens.reshape(tokens.shape[0], h, w, -1).permute(0, 3, 1, 2)
                    intermediates.append((tokens, prefix) if return_prefix_tokens else tokens)
                index += 1
            if stop_early and index > wanted[-1]:
                break
        if intermediates_only:
            return intermediates
        return self.norm(last), intermediates

    def use_solver(self, method: str | None = None, step_size: float | None = None) -> lc.ODESolver:
        """Evaluate with another solver and / or step size than the one trained (``None`` keeps the trained one):
        e.g. a bViT trained with Euler run with Heun at equal integration time. A runtime setting (the config
        keeps the trained solver); returns the solver now in use. Each pass is one step of it."""
        solver = lc.ODESolver(method or self.solver.method, self.solver.step_size if step_size is None else step_size)
        self.solver = solver
        self.engine.solver = solver
        return solver
