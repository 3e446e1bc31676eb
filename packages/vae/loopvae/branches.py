"""The two branches of a LoopVAE: :class:`LoopEncoder` and :class:`LoopDecoder`, each with its own looped core.

Encoder: stride-2 stem -> stages at 2x, 4x, 8x, ... (each a run of the encoder's looped core with
``encoder_passes[s]`` passes, stride-2 transitions between them) -> posterior head(s).
Decoder: latent projection -> stages from the latent's factor down to 2x (``decoder_passes``,
coarse to fine, nearest-upsample transitions) -> output head to full resolution. Stem, transitions,
injections and heads are never shared; the cores are separate per branch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

import loopcore as lc

from .layers import Downsample, LatentProjection, OutputHead, PosteriorHead, Stem, Upsample


def _make_core(
    width: int, num_blocks: int, passes: Sequence[int], block_type: str, num_heads: int, mlp_ratio: float,
    kernel_size: int, expansion: int, windows: Sequence[int | None] | None, sharing: str, fusion_mode: str,
    norm_groups: int,
) -> lc.LoopedCore:
    if block_type == "conv":
        if windows is not None and any(w is not None for w in windows):
            raise ValueError("attention windows were given for a conv LoopVAE; set block_type='attention'")
        factory = lc.block_factory(
            "conv", width, width, kernel_size=kernel_size, expansion=expansion, groups=norm_groups
        )
    elif block_type == "attention":
        factory = lc.block_factory("attention", width, width, num_heads=num_heads, mlp_ratio=mlp_ratio)
    else:
        raise ValueError(f"unknown block_type {block_type!r}; choose 'conv' or 'attention'")
    return lc.LoopedCore(
        factory, num_blocks, passes, width, sharing=sharing, features_last=block_type == "attention",
        window_sizes=windows, fusion_mode=fusion_mode,
    )


def run_stage(core: lc.LoopedCore, h: torch.Tensor, scale: int, return_passes: bool = False) -> lc.StageOutput:
    """Run one core stage on an NCHW map, converting to the core's layout and back."""
    if not core.features_last:
        return core(h, scale, return_passes=return_passes)
    out = core(h.permute(0, 2, 3, 1), scale, return_passes=return_passes)
    to_nchw = lambda t: t.permute(0, 3, 1, 2)
    passes = [to_nchw(p) for p in out.pass_outputs] if out.pass_outputs is not None else None
    return lc.StageOutput(to_nchw(out.output), passes, out.fusion_weights)


class LoopEncoder(nn.Module):
    """Image ``(B, 3, H, W)`` -> posterior moments ``{factor: (B, 2 z_f, H/f, W/f)}``."""

    def __init__(
        self, in_channels: int, width: int, passes: Sequence[int], heads: dict[int, int], shortcuts: bool = False,
        **core_kwargs,
    ) -> None:
        super().__init__()
        self.factors = [2 ** (s + 1) for s in range(len(passes))]
        groups = core_kwargs["norm_groups"]
        self.stem = Stem(in_channels, width, groups, shortcuts=shortcuts)
        self.core = _make_core(width, passes=passes, **core_kwargs)
        self.downs = nn.ModuleList(Downsample(width, shortcuts) for _ in range(len(passes) - 1))
        self.heads = nn.ModuleDict(
            {str(f): PosteriorHead(width, c, groups, shortcuts=shortcuts) for f, c in sorted(heads.items())}
        )

    def forward(self, x: torch.Tensor, factors: Sequence[int]) -> dict[int, torch.Tensor]:
        deepest = max(factors)
        h = self.stem(x)
        moments = {}
        for s, factor in enumerate(self.factors):
            if s > 0:
                h = self.downs[s - 1](h)
            h = run_stage(self.core, h, s).output
            if factor in factors:
                moments[factor] = self.heads[str(factor)](h)
            if factor == deepest:
                break
        return moments


@dataclass
class DecoderPasses:
    """Decoder output plus the output head applied to every pass of the finest stage.

    ``sample``: ``(B, 3, H, W)``; ``pass_samples``: one image per executed pass of the last stage,
    the last of which is ``sample`` (deep supervision of truncated decoders).
    """

    sample: torch.Tensor
    pass_samples: list[torch.Tensor]


class LoopDecoder(nn.Module):
    """Latent ``(B, z_f, h, w)`` entering at factor ``f`` -> image ``(B, 3, f h, f w)``."""

    def __init__(
        self, out_channels: int, width: int, passes: Sequence[int], entries: dict[int, int], shortcuts: bool = False,
        **core_kwargs,
    ) -> None:
        super().__init__()
        self.factors = [2 ** (len(passes) - s) for s in range(len(passes))]  # coarse -> fine
        groups = core_kwargs["norm_groups"]
        self.inputs = nn.ModuleDict(
            {str(f): LatentProjection(c, width, groups, shortcuts=shortcuts) for f, c in sorted(entries.items())}
        )
        self.core = _make_core(width, passes=passes, **core_kwargs)
        self.ups = nn.ModuleList(Upsample(width, shortcuts) for _ in range(len(passes) - 1))
        self.head = OutputHead(width, out_channels, groups, shortcuts=shortcuts)

    def forward(self, z: torch.Tensor, factor: int, return_passes: bool = False) -> torch.Tensor | DecoderPasses:
        start = self.factors.index(factor)
        h = self.inputs[str(factor)](z)
        last = len(self.factors) - 1
        for s in range(start, len(self.factors)):
            if s > start:
                h = self.ups[s - 1](h)
            stage = run_stage(self.core, h, s, return_passes=return_passes and s == last)
            h = stage.output
        sample = self.head(h)
        if not return_passes:
            return sample
        passes = [self.head(p) for p in stage.pass_outputs[:-1]] + [sample]
        return DecoderPasses(sample, passes)
