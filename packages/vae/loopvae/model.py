"""LoopVAE: a recurrent hierarchical KL image tokenizer (arXiv 2609.11516) as a diffusers model.

Encoder: stride-2 stem -> stages at 2x, 4x, 8x, ... (each a run of the encoder's looped core with
``encoder_passes[s]`` passes, stride-2 transitions between them) -> posterior head(s).
Decoder: latent projection -> stages from the latent's factor down to 2x (``decoder_passes``,
coarse to fine, nearest-upsample transitions) -> output head to full resolution. Encoder and
decoder own separate :class:`loopcore.LoopedCore` instances; stem, transitions, injections and heads
are never shared. The multi-resolution variant has posterior heads at several factors and a
decoder entry at each, which runs the remaining suffix of the decoder.

The public surface is diffusers' ``AutoencoderKL``: ``encode`` -> ``AutoencoderKLOutput(latent_dist)``,
``decode`` -> ``DecoderOutput(sample)``, ``forward``, ``save_pretrained`` / ``from_pretrained``,
``config.scaling_factor`` / ``shift_factor``, ``enable_slicing`` / ``enable_tiling``,
``enable_gradient_checkpointing``. Images are ``(B, 3, H, W)`` in [-1, 1].
"""

from __future__ import annotations

import contextlib
import json
import operator
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.autoencoders.vae import AutoencoderMixin, DecoderOutput, DiagonalGaussianDistribution
from diffusers.models.modeling_outputs import AutoencoderKLOutput
from diffusers.models.modeling_utils import ModelMixin

import loopcore as lc
from looprun.config import ConfigError, RenamedKey
from looprun.release import ReleaseLoadingMixin

from .branches import DecoderPasses, LoopDecoder, LoopEncoder
from .tiling import tiled_apply

# What a config.json without a ``shortcuts`` key was built with (every release before the key existed).
LEGACY_SHORTCUTS = True

# diffusers' hub options, which ``diffusers.AutoModel.from_pretrained`` passes on (``None`` when not given).
HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "proxies", "revision", "token", "subfolder")


def level_widths(width: int, latent_factor: int) -> list[int]:
    """A LoopVAE's channel width at each resolution level, full resolution first, down to the latent factor.

    ``log2(latent_factor) + 1`` levels (AutoencoderKL's ``block_out_channels`` layout); a LoopVAE has one width
    at every level: the decoder's output head works at full resolution, stem, stages and transitions at
    ``2x .. latent_factor``, all with ``width`` channels.
    """
    return [int(width)] * int(latent_factor).bit_length()


class LoopVAE(ReleaseLoadingMixin, ModelMixin, AutoencoderMixin, ConfigMixin):
    r"""Recurrent KL-VAE with weight-shared, loop-conditioned cores (see module docstring).

    Args:
        in_channels, out_channels: image channels.
        latent_channels: channels of the primary latent (the one ``encode``/``decode`` use by default).
        latent_factor: downsampling factor of the primary latent (8 for f8d16).
        extra_latents: further ``[factor, channels]`` posterior heads / decoder entries (multi-resolution).
        width: model width ``C`` (one width for every scale).
        num_blocks: ``K`` stored blocks per pass.
        block_type: ``conv`` (ConvNeXt operator) or ``attention`` (DiT operator with 2-D RoPE).
        num_heads, mlp_ratio: attention operator settings.
        kernel_size, expansion: conv operator settings.
        encoder_passes: passes per encoder stage, fine to coarse (2x first) (``encoder_loops`` in older configs).
        decoder_passes: passes per decoder stage, coarse to fine (2x last) (``decoder_loops`` in older configs).
        encoder_windows, decoder_windows: attention window side per stage (``None`` = global).
        sharing: ``global`` | ``scale`` | ``none`` (stored blocks per branch K / K S / K sum L).
        fusion_mode: how each stage's pass outputs become its output: ``last`` (plain recursion, the default) or
            a SoftMoR mode fusing them before the transition (``query``; ``token`` the heavier router; see
            :data:`loopcore.FUSION_MODES`). Older configs said ``fusion: none|softmor`` plus ``fusion_mode``;
            they load as ``last`` / their ``fusion_mode``.
        norm_num_groups: GroupNorm groups in the conv blocks, stem and heads (32; narrow models want
            several channels per group, or the normalisation erases per-image colour statistics);
            diffusers' name (``norm_groups`` in older configs).
        shortcuts: parameter-free DC-AE-style paths around the stem, transitions and heads (our
            addition; see :mod:`loopvae.layers`). ``False`` is the paper's architecture and the default;
            a ``config.json`` written before the key existed loads with ``True``, its old behaviour.
        sample_size: training resolution; also the default tile side for tiling.
        scaling_factor, shift_factor: latent normalisation for diffusion models
            (``z_model = (z - shift) * scale``, the SD3 / FLUX convention), estimated from data and written
            into a release's ``config.json`` by ``loopvae latent-stats``.
        latent_statistics: where ``loopvae latent-stats`` got them (data, image count, resolution,
            posterior, seed); ``None`` until estimated. Not used by the network.
        force_upcast: diffusers pipelines upcast the VAE to fp32 when true (not needed: LoopVAE is bf16-safe).
        block_out_channels: the channel width of the feature maps at each resolution level, from full
            resolution to the primary latent (AutoencoderKL's meaning: one entry per level, so diffusers
            pipelines' ``vae_scale_factor = 2 ** (len(block_out_channels) - 1)`` is the latent factor):
            ``log2(latent_factor) + 1`` entries. Level 0 is the full-resolution map (the decoder's output
            head conv; the encoder's stem reads the image there), level ``s`` the stage at ``2**s`` (stem
            and stages, transitions, heads). A LoopVAE has one width ``C`` at every level, so the widths are
            ``[width] * (log2(latent_factor) + 1)`` (``[48, 48, 48, 48]`` for ``loopvae-cnn-tiny``; see
            :func:`level_widths`). Derived when not given (and for configs saved before the key existed); a
            given value must equal it. A saved config with other values of the right length loads with a
            ``FutureWarning`` and the real widths. Informative: the network is built from ``width``.
        tile_overlap_factor: default tile overlap as a fraction of the tile side. The model's attribute of
            the same name (set directly or by ``enable_tiling``) is the runtime setting; the config keeps
            the default.
        latents_mean, latents_std: per-channel latent statistics (diffusers' convention for per-channel
            normalisation: ``z_model = (z - mean_c) * scaling_factor / std_c``), written by ``loopvae
            latent-stats --per-channel``; ``None`` until estimated. Not used by the network.
    """

    _supports_gradient_checkpointing = True

    @register_to_config
    def __init__(
        self,
        in_channels: int = 3,
        out_channels: int = 3,
        latent_channels: int = 16,
        latent_factor: int = 8,
        extra_latents: Sequence[Sequence[int]] = (),
        width: int = 384,
        num_blocks: int = 4,
        block_type: str = "conv",
        num_heads: int = 6,
        mlp_ratio: float = 4.0,
        kernel_size: int = 7,
        expansion: int = 4,
        encoder_passes: Sequence[int] = (1, 2, 4),
        decoder_passes: Sequence[int] = (1, 2, 4),
        encoder_windows: Sequence[int | None] | None = None,
        decoder_windows: Sequence[int | None] | None = None,
        sharing: str = "global",
        fusion_mode: str = "last",
        norm_num_groups: int = 32,
        shortcuts: bool = False,
        sample_size: int = 256,
        scaling_factor: float = 1.0,
        shift_factor: float = 0.0,
        force_upcast: bool = False,
        tile_overlap_factor: float = 0.25,
        block_out_channels: Sequence[int] | None = None,
        latent_statistics: dict | None = None,
        latents_mean: Sequence[float] | None = None,
        latents_std: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        if latent_factor < 2 or latent_factor & (latent_factor - 1):
            raise ValueError(f"latent_factor must be a power of two >= 2, got {latent_factor}")
        widths = level_widths(width, latent_factor)
        if block_out_channels is None:
            # Registered so that pipelines' vae_scale_factor = 2 ** (len - 1) equals the latent factor.
            self.register_to_config(block_out_channels=widths)
        elif len(block_out_channels) != len(widths):
            raise ValueError(
                f"block_out_channels {list(block_out_channels)} has {len(block_out_channels)} entries; diffusers "
                f"pipelines read 2 ** (len - 1) as the latent factor, so latent_factor {latent_factor} needs "
                f"{len(widths)} (or leave it unset)"
            )
        elif [int(c) for c in block_out_channels] != widths:
            raise ValueError(
                f"block_out_channels {list(block_out_channels)} are not this model's widths {widths} (one width "
                f"{width} at every level from full resolution to the latent); leave it unset"
            )
        if len(encoder_passes) != len(decoder_passes):
            raise ValueError(
                f"encoder_passes {list(encoder_passes)} and decoder_passes {list(decoder_passes)} "
                "need one entry per scale each"
            )
        latents = {int(latent_factor): int(latent_channels)}
        for pair in extra_latents:
            factor, channels = (int(v) for v in pair)
            if factor in latents:
                raise ValueError(f"extra_latents repeats factor {factor}")
            latents[factor] = channels
        scales = [2 ** (s + 1) for s in range(len(encoder_passes))]
        for factor in latents:
            if factor not in scales:
                raise ValueError(f"latent factor {factor} is not one of the model's scales {scales}")
        if len(set(latents.values())) != len(latents):
            raise ValueError(f"latent channels must differ between factors to route decode(); got {latents}")
        self.latent_channels_by_factor = latents
        core_kwargs = dict(
            num_blocks=num_blocks, block_type=block_type, num_heads=num_heads, mlp_ratio=mlp_ratio,
            kernel_size=kernel_size, expansion=expansion, sharing=sharing, fusion_mode=fusion_mode,
            norm_groups=norm_num_groups,
        )
        self.encoder = LoopEncoder(
            in_channels, width, encoder_passes, latents, shortcuts=shortcuts, windows=encoder_windows, **core_kwargs
        )
        self.decoder = LoopDecoder(
            out_channels, width, decoder_passes, latents, shortcuts=shortcuts, windows=decoder_windows, **core_kwargs
        )
        for name, stats in (("latents_mean", latents_mean), ("latents_std", latents_std)):
            if stats is not None and len(stats) != latent_channels:
                raise ValueError(f"{name} has {len(stats)} entries; the latent has {latent_channels} channels")
        if latents_std is not None and min(latents_std) <= 0:
            raise ValueError(f"latents_std must be positive, got {list(latents_std)}")
        self.use_slicing = False
        self.use_tiling = False
        # Runtime tiling settings (enable_tiling, or the AutoencoderKL attributes set directly); the config keeps
        # the defaults. One tile side: tile_sample_size = tile_sample_min_size = tile_latent_min_size * factor.
        self._tile_sample_size = sample_size
        self._tile_overlap_factor = tile_overlap_factor

    RENAMED_KEYS = {"encoder_loops": RenamedKey("encoder_passes"), "decoder_loops": RenamedKey("decoder_passes"),
                    "norm_groups": RenamedKey("norm_num_groups")}
    LEGACY_FUSIONS = ("none", "softmor")

    @classmethod
    def upgrade_config(cls, config, source="config") -> dict:
        """Renamed keys (:attr:`RENAMED_KEYS`), and the old ``fusion: none|softmor`` switch folded into
        ``fusion_mode``: ``none`` -> ``last``, ``softmor`` -> the config's ``fusion_mode`` (``query`` when
        absent, the default it was written with). Warns (``FutureWarning``) naming ``source``."""
        config = dict(config)
        if "fusion" in config:
            fusion = config.pop("fusion")
            if fusion not in cls.LEGACY_FUSIONS:
                raise ConfigError(
                    f"{source}: the deprecated key 'fusion' must be one of {cls.LEGACY_FUSIONS}, got {fusion!r}; "
                    f"write fusion_mode (one of {lc.FUSION_MODES}) instead"
                )
            mode = "last" if fusion == "none" else config.get("fusion_mode", "query")
            warnings.warn(
                f"{source}: config keys 'fusion' (deprecated) and 'fusion_mode' were read as fusion_mode={mode!r}; "
                "write fusion_mode alone ('last' = no fusion)", FutureWarning, stacklevel=2,
            )
            config["fusion_mode"] = mode
        config = super().upgrade_config(config, source)
        given, width, factor = (config.get(k) for k in ("block_out_channels", "width", "latent_factor"))
        if given is not None and isinstance(width, int) and isinstance(factor, int) and factor >= 2:
            widths = level_widths(width, factor)  # a whole config (config.json); partial overrides meet __init__
            if isinstance(given, (list, tuple)) and len(given) == len(widths) and list(given) != widths:
                warnings.warn(
                    f"{source}: block_out_channels {list(given)} are not the model's widths; read as {widths} (one "
                    f"width {width} at every level from full resolution to the latent)", FutureWarning, stacklevel=2,
                )
                config["block_out_channels"] = widths
        return config

    @classmethod
    def load_config(cls, *args, **kwargs):
        """diffusers' ``load_config``, with ``shortcuts=True`` for configs saved before the key existed.

        Every LoopVAE released before ``shortcuts`` became a key was built with the shortcuts on; the
        constructor's default is now the paper's ``False``, so a missing key must not fall back to it.
        """
        loaded = super().load_config(*args, **kwargs)
        config = loaded[0] if isinstance(loaded, tuple) else loaded
        config.setdefault("shortcuts", LEGACY_SHORTCUTS)
        return loaded

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """Load a release, a ``save_pretrained`` folder or a pipeline's ``subfolder`` (see
        :class:`looprun.release.ReleaseLoadingMixin`). Hub options given as ``None`` (``diffusers.AutoModel``
        passes every one) are dropped, so ``AutoModel.from_pretrained(release)`` takes the same path (and
        the same checks) as ``LoopVAE.from_pretrained(release)``."""
        kwargs = {k: v for k, v in kwargs.items() if not (k in HUB_KWARGS and v is None)}
        return super().from_pretrained(*args, **kwargs)

    # -- helpers ---------------------------------------------------------------------------------
    @property
    def downsample_factor(self) -> int:
        """Factor of the primary latent (8 for f8 models)."""
        return self.config.latent_factor

    def get_last_layer(self) -> torch.Tensor:
        """Weight of the final RGB conv, for the LDM adaptive GAN weight."""
        return self.decoder.head.conv_out.weight

    # -- tiling settings -------------------------------------------------------------------------
    # One tile side, stored once; AutoencoderKL's attribute names are views of it, so code that sets
    # ``vae.tile_sample_min_size`` / ``tile_latent_min_size`` / ``tile_overlap_factor`` directly (as many
    # diffusers scripts do) governs tiling exactly as ``enable_tiling`` does. None of them touches the config.
    def _check_tile_side(self, value, name: str, pixels_per_unit: int = 1) -> int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # AutoencoderKL code often computes sides as floats (sample_size / 8)
        try:
            if isinstance(value, bool):
                raise TypeError
            value = operator.index(value)  # ints and numpy integers
        except TypeError:
            raise TypeError(f"{name} must be an integer, got {value!r}") from None
        factor = max(self.latent_channels_by_factor)
        side = value * pixels_per_unit
        if side <= 0 or side % factor:
            scaled = f" (x{pixels_per_unit} = {side} image pixels)" if pixels_per_unit > 1 else ""
            given = f"{name} {value!r}{scaled}"
            raise ValueError(f"{given}: the tile side must be a positive multiple of {factor} image pixels (the "
                             "model's largest latent factor)")
        return side

    @staticmethod
    def _check_overlap(value) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ValueError(f"tile_overlap_factor must be in [0, 1), got {value!r}")
        return float(value)

    @property
    def tile_sample_size(self) -> int:
        """Tile side in image pixels (default ``sample_size``); tiling applies to inputs larger than a tile."""
        return self._tile_sample_size

    @tile_sample_size.setter
    def tile_sample_size(self, value: int) -> None:
        self._tile_sample_size = self._check_tile_side(value, "tile_sample_size")

    @property
    def tile_sample_min_size(self) -> int:
        """AutoencoderKL's name of :attr:`tile_sample_size` (the same setting)."""
        return self._tile_sample_size

    @tile_sample_min_size.setter
    def tile_sample_min_size(self, value: int) -> None:
        self._tile_sample_size = self._check_tile_side(value, "tile_sample_min_size")

    @property
    def tile_latent_min_size(self) -> int:
        """AutoencoderKL's latent tile side: ``tile_sample_size // latent_factor`` (``2 ** (len(block_out_channels) -
        1)``) for the primary latent. Setting it sets ``tile_sample_size = value * latent_factor`` (a decoder entry
        at another factor ``f`` uses ``tile_sample_size // f``)."""
        return self._tile_sample_size // self.config.latent_factor

    @tile_latent_min_size.setter
    def tile_latent_min_size(self, value: int) -> None:
        self._tile_sample_size = self._check_tile_side(value, "tile_latent_min_size", self.config.latent_factor)

    @property
    def tile_overlap_factor(self) -> float:
        """Overlap of neighbouring tiles as a fraction of the tile side, in [0, 1) (default: the config's)."""
        return self._tile_overlap_factor

    @tile_overlap_factor.setter
    def tile_overlap_factor(self, value: float) -> None:
        self._tile_overlap_factor = self._check_overlap(value)

    def enable_tiling(
        self, use_tiling: bool = True, tile_sample_size: int | None = None, tile_overlap_factor: float | None = None,
        *, tile_sample_min_height: int | None = None, tile_sample_min_width: int | None = None,
        tile_sample_stride_height: int | None = None, tile_sample_stride_width: int | None = None,
    ) -> None:
        """Encode/decode images larger than ``tile_sample_size`` (default ``sample_size``) tile by tile.

        Takes diffusers' call styles: ``enable_tiling()``, ``enable_tiling(True)`` / ``enable_tiling(False)`` (older
        diffusers' ``use_tiling``), ``enable_tiling(tile_sample_size=256, tile_overlap_factor=0.25)`` and the newer
        VAEs' ``tile_sample_min_height/width`` (square tiles) with ``tile_sample_stride_height/width`` (overlap =
        1 - stride / tile). AutoencoderKL's attributes set directly do the same: ``vae.use_tiling = True``,
        ``vae.tile_sample_min_size = 256`` (= ``tile_sample_size``), ``vae.tile_latent_min_size = 32`` (the same
        side in latent pixels), ``vae.tile_overlap_factor = 0.25``. Settings last for this model object; ``config``
        (and ``save_pretrained``) keep the defaults.
        """
        if not isinstance(use_tiling, bool):
            raise TypeError(f"enable_tiling's first argument is use_tiling (a bool), got {use_tiling!r}; pass the "
                            "tile side as tile_sample_size=...")
        heights = {v for v in (tile_sample_min_height, tile_sample_min_width) if v is not None}
        strides = {v for v in (tile_sample_stride_height, tile_sample_stride_width) if v is not None}
        if len(heights) > 1 or len(strides) > 1:
            raise ValueError("LoopVAE tiles are square: give equal tile_sample_min_height/width and equal "
                             "tile_sample_stride_height/width")
        if heights:
            if tile_sample_size is not None and tile_sample_size != next(iter(heights)):
                raise ValueError("give the tile side once: tile_sample_size or tile_sample_min_height/width")
            tile_sample_size = next(iter(heights))
        if strides:
            side = tile_sample_size or self.tile_sample_size
            stride = next(iter(strides))
            if not 0 < stride <= side:
                raise ValueError(f"tile_sample_stride {stride} must be in (0, tile side {side}]")
            tile_overlap_factor = 1 - stride / side
        # validate everything before changing anything
        side = self._check_tile_side(tile_sample_size, "tile_sample_size") if tile_sample_size is not None else None
        overlap = self._check_overlap(tile_overlap_factor) if tile_overlap_factor is not None else None
        if side is not None:
            self._tile_sample_size = side
        if overlap is not None:
            self._tile_overlap_factor = overlap
        self.use_tiling = use_tiling

    def _tile_geometry(self, factor: int) -> tuple[int, int]:
        tile = self._tile_sample_size
        overlap = round(tile * self._tile_overlap_factor) // factor * factor
        return tile, overlap

    def _check_image(self, x: torch.Tensor, factor: int) -> None:
        if x.ndim != 4 or x.shape[1] != self.config.in_channels:
            raise ValueError(
                f"LoopVAE.encode expects (B, {self.config.in_channels}, H, W) images in [-1, 1], got {tuple(x.shape)}"
            )
        if x.shape[-2] % factor or x.shape[-1] % factor:
            raise ValueError(
                f"image size {tuple(x.shape[-2:])} is not divisible by the latent factor {factor}: "
                f"crop or pad H and W to multiples of {factor}"
            )

    def _factor_of(self, z: torch.Tensor, latent_factor: int | None) -> int:
        if z.ndim != 4:
            raise ValueError(f"LoopVAE.decode expects (B, C, h, w) latents, got shape {tuple(z.shape)}")
        if latent_factor is not None:
            expected = self.latent_channels_by_factor.get(latent_factor)
            if expected is None:
                have = sorted(self.latent_channels_by_factor)
                raise ValueError(f"no decoder entry at factor {latent_factor}; have {have}")
            if z.shape[1] != expected:
                raise ValueError(f"latent at factor {latent_factor} must have {expected} channels, got {z.shape[1]}")
            return latent_factor
        for factor, channels in self.latent_channels_by_factor.items():
            if channels == z.shape[1]:
                return factor
        raise ValueError(
            f"latent has {z.shape[1]} channels; this LoopVAE decodes {self.latent_channels_by_factor} "
            "(factor: channels)"
        )

    # -- encode ----------------------------------------------------------------------------------
    def _encode(self, x: torch.Tensor, factor: int) -> torch.Tensor:
        tile, overlap = self._tile_geometry(factor)
        if self.use_tiling and (x.shape[-2] > tile or x.shape[-1] > tile):
            return tiled_apply(lambda t: self.encoder(t, [factor])[factor], x, tile, overlap, 1.0 / factor)
        return self.encoder(x, [factor])[factor]

    def encode(
        self, x: torch.Tensor, return_dict: bool = True, latent_factor: int | None = None
    ) -> AutoencoderKLOutput | tuple[DiagonalGaussianDistribution]:
        """Encode ``(B, 3, H, W)`` images in [-1, 1] into a diagonal Gaussian over ``(B, z, H/f, W/f)``.

        ``latent_factor`` picks a posterior head of a multi-resolution model (default: the primary one).
        """
        factor = latent_factor or self.config.latent_factor
        if factor not in self.latent_channels_by_factor:
            raise ValueError(f"no posterior head at factor {factor}; have {sorted(self.latent_channels_by_factor)}")
        self._check_image(x, factor)
        if self.use_slicing and x.shape[0] > 1:
            moments = torch.cat([self._encode(xs, factor) for xs in x.split(1)])
        else:
            moments = self._encode(x, factor)
        posterior = DiagonalGaussianDistribution(moments)
        return AutoencoderKLOutput(latent_dist=posterior) if return_dict else (posterior,)

    def encode_all(self, x: torch.Tensor) -> dict[int, DiagonalGaussianDistribution]:
        """Posteriors at every head ``{factor: distribution}`` from one encoder pass (no tiling)."""
        factors = sorted(self.latent_channels_by_factor)
        self._check_image(x, max(factors))
        return {f: DiagonalGaussianDistribution(m) for f, m in self.encoder(x, factors).items()}

    # -- decode ----------------------------------------------------------------------------------
    def _decode(self, z: torch.Tensor, factor: int) -> torch.Tensor:
        tile, overlap = self._tile_geometry(factor)
        ltile, loverlap = tile // factor, overlap // factor
        if self.use_tiling and (z.shape[-2] > ltile or z.shape[-1] > ltile):
            return tiled_apply(lambda t: self.decoder(t, factor), z, ltile, loverlap, float(factor))
        return self.decoder(z, factor)

    def decoder_schedule_hooks(self, decoder_passes: Sequence[int] | None) -> lc.LoopHooks | None:
        """Validate an any-time ``decoder_passes`` schedule and return the prefix hooks that run it.

        ``decoder_passes`` has one entry per decoder stage, coarse to fine (the layout of
        ``config.decoder_passes``), each in ``1..trained`` passes of that stage. ``None`` or the trained
        schedule itself give ``None``: no hooks, so the plain forward runs unchanged.
        """
        if decoder_passes is None:
            return None
        trained = [int(p) for p in self.config.decoder_passes]
        try:
            wanted = [int(p) for p in decoder_passes]
        except (TypeError, ValueError):
            raise ValueError(f"decoder_passes must be a list of integers, got {decoder_passes!r}") from None
        if len(wanted) != len(trained) or any(not 1 <= w <= t for w, t in zip(wanted, trained, strict=False)):
            raise ValueError(
                f"decoder_passes {wanted} does not fit the trained decoder schedule {trained} (coarse to fine): give "
                f"{len(trained)} entries, each between 1 and the trained passes of its stage"
            )
        prefix = {s: w for s, (w, t) in enumerate(zip(wanted, trained, strict=True)) if w < t}
        return lc.LoopHooks(prefix=prefix) if prefix else None

    def decode(
        self, z: torch.Tensor, return_dict: bool = True, generator: torch.Generator | None = None,
        latent_factor: int | None = None, decoder_passes: Sequence[int] | None = None,
    ) -> DecoderOutput | tuple[torch.Tensor]:
        """Decode latents ``(B, z, h, w)`` into images ``(B, 3, f h, f w)`` (about [-1, 1], unclipped).

        The entry point of a multi-resolution decoder follows from the latent's channel count.
        ``decoder_passes`` (any-time decoding) runs only the first ``k_s`` passes of each decoder stage,
        coarse to fine, e.g. ``[1, 2, 1]`` on a model trained with ``[1, 2, 4]``: less decode time for
        some quality (see :meth:`decoder_schedule_hooks`; models trained with deep supervision degrade
        gracefully, plain ones do not). Stages a multi-resolution entry skips ignore their entry.
        """
        factor = self._factor_of(z, latent_factor)
        hooks = self.decoder_schedule_hooks(decoder_passes)
        if hooks is not None and self.decoder.core.hooks is not None:
            raise ValueError("decoder_passes cannot be combined with hooks installed on the decoder core; "
                             "put the prefix into those hooks instead")
        with self.decoder.core.use_hooks(hooks) if hooks is not None else contextlib.nullcontext():
            if self.use_slicing and z.shape[0] > 1:
                sample = torch.cat([self._decode(zs, factor) for zs in z.split(1)])
            else:
                sample = self._decode(z, factor)
        return DecoderOutput(sample=sample) if return_dict else (sample,)

    def decode_passes(self, z: torch.Tensor, latent_factor: int | None = None) -> DecoderPasses:
        """Decode and also map every pass of the finest decoder stage through the output head."""
        return self.decoder(z, self._factor_of(z, latent_factor), return_passes=True)

    def forward(
        self, sample: torch.Tensor, sample_posterior: bool = False, return_dict: bool = True,
        generator: torch.Generator | None = None, decoder_passes: Sequence[int] | None = None,
    ) -> DecoderOutput | tuple[torch.Tensor]:
        """Reconstruct ``sample`` through the posterior mode (or a posterior sample); ``decoder_passes`` as in
        :meth:`decode`."""
        posterior = self.encode(sample).latent_dist
        z = posterior.sample(generator=generator) if sample_posterior else posterior.mode()
        return self.decode(z, return_dict=return_dict, decoder_passes=decoder_passes)


def register_with_diffusers() -> None:
    """Make ``diffusers.AutoModel.from_pretrained`` resolve a ``config.json`` naming ``LoopVAE``.

    ``AutoModel`` looks a standalone folder's ``_class_name`` up as an attribute of the ``diffusers`` package
    (its only other route is ``auto_map`` + ``trust_remote_code=True``, which needs a Python file in every
    model folder), so importing :mod:`loopvae` puts :class:`LoopVAE` there; without the import it raises
    "`diffusers` has no class `LoopVAE`". A ``LoopVAE`` that diffusers itself defines is left alone.
    """
    import diffusers

    current = getattr(diffusers, "LoopVAE", None)
    if current is None or getattr(current, "__module__", None) == __name__:  # also after a reload of this module
        diffusers.LoopVAE = LoopVAE
    else:
        warnings.warn(f"diffusers defines its own LoopVAE ({current.__module__}); diffusers.AutoModel will load that "
                      "class, not loopvae.LoopVAE: use loopvae.LoopVAE.from_pretrained", stacklevel=2)


def warn_on_autoencoderkl_loading_a_loopvae() -> None:
    """Make ``diffusers.AutoencoderKL.from_pretrained`` warn when the folder it is given holds a ``LoopVAE``.

    diffusers does not fail there: it builds an ``AutoencoderKL`` from the config keys the two share and leaves
    every weight random, only logging that the checkpoint's tensors were unused. Once :mod:`loopvae` is imported
    that call warns (``UserWarning`` naming the folder and the loader to use) and otherwise behaves exactly as
    before; folders of other classes are not touched.
    """
    from diffusers import AutoencoderKL

    original = AutoencoderKL.from_pretrained.__func__
    if getattr(original, "_warns_on_loopvae", False):
        return

    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):  # noqa: ANN001, ANN202
        folder = Path(str(pretrained_model_name_or_path)) / (kwargs.get("subfolder") or "")
        config = folder / "config.json"
        if cls.__name__ == "AutoencoderKL" and config.is_file():
            try:
                class_name = json.loads(config.read_text()).get("_class_name")
            except (OSError, ValueError, AttributeError):
                class_name = None
            if class_name == "LoopVAE":
                warnings.warn(f"{folder} holds a LoopVAE: AutoencoderKL.from_pretrained builds an AutoencoderKL "
                              "with random weights from it. Load it with loopvae.LoopVAE.from_pretrained (or "
                              "diffusers.AutoModel.from_pretrained after import loopvae)", UserWarning, stacklevel=2)
        return original(cls, pretrained_model_name_or_path, *args, **kwargs)

    from_pretrained._warns_on_loopvae = True  # type: ignore[attr-defined]
    AutoencoderKL.from_pretrained = classmethod(from_pretrained)


register_with_diffusers()
warn_on_autoencoderkl_loading_a_loopvae()
