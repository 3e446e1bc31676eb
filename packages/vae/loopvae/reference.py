"""Reference VAEs: diffusers ``AutoencoderKL`` with the exact published configurations.

* ``sd-vae``: Stable Diffusion's f8c4 KL-VAE (blocks 128/256/512/512, 2 layers, 4 latent channels,
  with quant convs), 83.65M parameters.
* ``flux-vae``: the FLUX.1 / SD3 f8c16 layout (same blocks, 16 latent channels, no quant convs),
  83.82M parameters, 447.62 GMACs at 256^2.

Weights are not bundled: pass a local diffusers folder (``config.json`` + safetensors) as
``pretrained=PATH`` to :func:`loopvae.create_model`.
"""

from __future__ import annotations

from typing import Any

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


def reference_vae(config: dict[str, Any], pretrained: str | None = None, **overrides: Any) -> AutoencoderKL:
    """Build an ``AutoencoderKL`` from ``config`` (+ overrides), or load it from a local folder."""
    if pretrained is not None:
        return AutoencoderKL.from_pretrained(pretrained, local_files_only=True, **overrides)
    return AutoencoderKL(**{**config, **overrides})
