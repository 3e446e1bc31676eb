"""Reference VAEs: diffusers ``AutoencoderKL`` with the exact published configurations.

* ``sd-vae``: Stable Diffusion's f8c4 KL-VAE (blocks 128/256/512/512, 2 layers, 4 latent channels,
  with quant convs), 83.65M parameters.
* ``flux-vae``: the FLUX.1 / SD3 f8c16 layout (same blocks, 16 latent channels, no quant convs),
  83.82M parameters, 447.62 GMACs at 256^2.
* ``flux-vae-tiny``: the FLUX layout scaled to the CPU demo (blocks 14/28/56/56, i.e. 14/128 of the
  width, GroupNorm(7) so every width divides, 2 layers, f8, 16 latent channels), 1.03M parameters:
  2.94x ``loopvae-cnn-tiny``'s, the paper's 84M : 29M ratio. The LoopVAE study trains it as the
  matched-budget reference (``docs/study_loopvae.md``); its posterior log-variance starts at -6 as
  LoopVAE's does (:func:`init_posterior_logvar`).
* ``flux-vae-small``: the FLUX layout at 48/96/192/192 (GroupNorm(16)), 11.86M parameters: 2.82x
  ``loopvae-cnn-small``'s 4.21M, the GPU-budget release's reference (``make release-vae-gpu``).

Reshaped CPU references (the fair-comparison study, ``docs/study_fair.md``): ``flux-vae-tiny`` is a poor shape
at 1M parameters (2 channels per GroupNorm group in 11 norm layers, 14 channels at full resolution, a
global-attention mid-block trained on 8x8 latent tokens and evaluated on 32x32). The shape sweep's candidates,
each ~1.0M parameters, f8, 16 latent channels, >= 4 channels per GroupNorm group everywhere and no mid-block
attention (``mid_block_add_attention=True`` puts it back, for measuring the mismatch):

* ``klvae-tiny-w32``: blocks 32/32/64/64, 1 layer per block, GroupNorm(8): 1.02M, 7.81 GMACs;
* ``klvae-tiny-w24``: blocks 24/32/64/64, 1 layer per block, GroupNorm(4): 0.99M;
* ``klvae-tiny-d2``: blocks 16/32/48/56, 2 layers per block (FLUX's depth), GroupNorm(4): 0.97M;
* ``klvae-tiny-w32-attn``: ``klvae-tiny-w32`` with its global-attention mid-block, 1.05M: the sweep's pick (it
  scored best at 256^2 although trained on 64^2 crops).

``dcae-tiny``: diffusers ``AutoencoderDC`` (the deep-compression autoencoder: space-to-channel shortcuts around
every down/up-sampling, a deterministic latent) at f8 with 16 latent channels: channels 16/32/64/128, one ResBlock
per stage, no attention, 1.23M parameters, 3.64 GMACs. The shortcut-equipped reference of the library.

Weights are not bundled: pass a local diffusers folder (``config.json`` + safetensors) as
``pretrained=PATH`` to :func:`loopvae.create_model`.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import AutoencoderDC, AutoencoderKL

_BLOCKS = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    block_out_channels=(128, 256, 512, 512),
    layers_per_block=2,
    act_fn="silu",
    norm_num_groups=32,
)

SD_VAE_CONFIG: dict[str, Any] = dict(
    _BLOCKS, latent_channels=4, sample_size=512, scaling_factor=0.18215, use_quant_conv=True, use_post_quant_conv=True
)
FLUX_VAE_CONFIG: dict[str, Any] = dict(
    _BLOCKS, latent_channels=16, sample_size=1024, scaling_factor=0.3611, shift_factor=0.1159,
    use_quant_conv=False, use_post_quant_conv=False,
)

FLUX_VAE_TINY_CONFIG: dict[str, Any] = dict(
    FLUX_VAE_CONFIG, block_out_channels=(14, 28, 56, 56), norm_num_groups=7, sample_size=256,
    scaling_factor=1.0, shift_factor=0.0,
)

FLUX_VAE_SMALL_CONFIG: dict[str, Any] = dict(
    FLUX_VAE_CONFIG, block_out_channels=(48, 96, 192, 192), norm_num_groups=16, sample_size=256,
    scaling_factor=1.0, shift_factor=0.0,
)



def _kl_tiny(blocks: tuple[int, ...], layers: int, groups: int) -> dict[str, Any]:
    return dict(FLUX_VAE_CONFIG, block_out_channels=blocks, layers_per_block=layers, norm_num_groups=groups,
                sample_size=256, scaling_factor=1.0, shift_factor=0.0, mid_block_add_attention=False)


KLVAE_TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "klvae-tiny-w32": _kl_tiny((32, 32, 64, 64), 1, 8),
    "klvae-tiny-w24": _kl_tiny((24, 32, 64, 64), 1, 4),
    "klvae-tiny-d2": _kl_tiny((16, 32, 48, 56), 2, 4),
}

DCAE_TINY_CONFIG: dict[str, Any] = dict(
    in_channels=3, latent_channels=16, attention_head_dim=8,
    encoder_block_types="ResBlock", decoder_block_types="ResBlock",
    encoder_block_out_channels=(16, 32, 64, 128), decoder_block_out_channels=(16, 32, 64, 128),
    encoder_layers_per_block=(1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1),
    encoder_qkv_multiscales=((), (), (), ()), decoder_qkv_multiscales=((), (), (), ()),
    upsample_block_type="pixel_shuffle", downsample_block_type="pixel_unshuffle", scaling_factor=1.0,
)


def dc_autoencoder(config: dict[str, Any], **overrides: Any) -> AutoencoderDC:
    """Build an ``AutoencoderDC`` from ``config`` (+ overrides); local weights as for :func:`reference_vae`."""
    return AutoencoderDC(**{**config, **overrides})


def init_posterior_logvar(vae: AutoencoderKL, value: float) -> AutoencoderKL:
    """Start the encoder's log-variance output at ``value`` everywhere (zero weights, constant bias).

    diffusers' default init starts it near 0 (sigma ~ 1), which drowns the first steps of training in
    sampling noise; LoopVAE's posterior head starts at -6 (sigma ~ 0.05), and a comparison between the
    two trains both from the same posterior scale.
    """
    conv = vae.encoder.conv_out
    half = conv.out_channels // 2
    with torch.no_grad():
        conv.weight[half:].zero_()
        conv.bias[half:].fill_(value)
    return vae


def reference_vae(config: dict[str, Any], initial_logvar: float | None = None, **overrides: Any) -> AutoencoderKL:
    """Build an ``AutoencoderKL`` from ``config`` (+ overrides); local weights come through
    ``create_model(name, checkpoint_path=...)`` or ``AutoencoderKL.from_pretrained(folder)``.

    ``initial_logvar`` re-initialises the posterior log-variance (see :func:`init_posterior_logvar`); ``None``
    keeps diffusers' initialisation.
    """
    vae = AutoencoderKL(**{**config, **overrides})
    return vae if initial_logvar is None else init_posterior_logvar(vae, initial_logvar)
