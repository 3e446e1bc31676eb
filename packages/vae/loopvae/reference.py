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

Weights are not bundled: pass a local diffusers folder (``config.json`` + safetensors) as
``pretrained=PATH`` to :func:`loopvae.create_model`.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import AutoencoderKL

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
