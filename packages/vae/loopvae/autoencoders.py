"""The tokenizer classes loopvae trains, evaluates and encodes with, and one way to get a latent from each.

* :class:`loopvae.LoopVAE` and diffusers' ``AutoencoderKL`` are variational: ``encode(x).latent_dist`` is a
  diagonal Gaussian posterior (evaluation takes its mode, training a sample, the KL term regularises it).
* diffusers' ``AutoencoderDC`` (deep-compression autoencoder, space-to-channel shortcuts) is deterministic:
  ``encode(x).latent`` is the latent itself; there is no posterior, no KL term and nothing to sample.

Every command goes through these helpers instead of reaching for ``latent_dist`` directly, so a model without
a posterior is handled in one place.
"""

from __future__ import annotations

import torch
from diffusers import AutoencoderDC, AutoencoderKL
from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution
from torch import nn

from .model import LoopVAE

TOKENIZER_CLASSES = (LoopVAE, AutoencoderKL, AutoencoderDC)
VARIATIONAL_CLASSES = (LoopVAE, AutoencoderKL)


def has_posterior(model: nn.Module) -> bool:
    """Whether ``model.encode`` returns a posterior (``latent_dist``) rather than a deterministic ``latent``."""
    return not isinstance(model, AutoencoderDC)


def check_resolution(model: nn.Module, resolution: int, what: str = "--resolution") -> int:
    """``resolution`` if the model's latent factor divides it, else a :class:`ValueError` naming both (``what``:
    the flag or key it came from). AutoencoderKL would silently crop (a 60² image makes a 7² latent that
    decodes to 56²) and AutoencoderDC fail deep inside ``pixel_unshuffle``."""
    factor = spatial_factor(model)
    if resolution % factor:
        lower, upper = resolution // factor * factor, (resolution // factor + 1) * factor
        nearest = f"{lower} or {upper}" if lower else str(upper)
        raise ValueError(f"{what}={resolution} is not a multiple of the {type(model).__name__}'s latent factor "
                         f"{factor}: use a multiple of {factor} (e.g. {nearest})")
    return resolution


def check_image_size(model: nn.Module, images: torch.Tensor) -> None:
    """A clear :class:`ValueError` when the latent factor does not divide the images' height and width (LoopVAE's
    own ``encode`` checks this itself; the diffusers classes do not)."""
    if isinstance(model, LoopVAE) or images.ndim != 4:
        return
    factor = spatial_factor(model)
    height, width = images.shape[-2:]
    if height % factor or width % factor:
        raise ValueError(f"image size {(height, width)} is not divisible by the {type(model).__name__}'s latent "
                         f"factor {factor}: use a resolution that is a multiple of {factor}")


def encode_posterior(model: nn.Module, images: torch.Tensor) -> DiagonalGaussianDistribution | None:
    """The posterior of ``images`` ``(B, 3, H, W)`` in [-1, 1], or ``None`` for a deterministic autoencoder."""
    check_image_size(model, images)
    return model.encode(images).latent_dist if has_posterior(model) else None


def encode_mode(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """The latent an evaluation decodes: the posterior mode, or a deterministic autoencoder's latent.

    ``images``: ``(B, 3, H, W)`` in [-1, 1] -> ``(B, c, H / f, W / f)``.
    """
    check_image_size(model, images)
    out = model.encode(images)
    return out.latent_dist.mode() if has_posterior(model) else out.latent


def encode_sample(model: nn.Module, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """A posterior sample (seeded by ``generator``), or a deterministic autoencoder's latent."""
    check_image_size(model, images)
    out = model.encode(images)
    return out.latent_dist.sample(generator=generator) if has_posterior(model) else out.latent


@torch.no_grad()
def reconstruct_mode(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """``decode(encode_mode(images)).sample``: ``(B, 3, H, W)`` in [-1, 1] -> unclipped reconstruction."""
    return model.decode(encode_mode(model, images)).sample


def spatial_factor(model: nn.Module) -> int:
    """The latent's downsampling factor (8 for every f8 model).

    AutoencoderDC halves the size in each ``DCDownBlock2d`` of its encoder: one after every stage but the last
    *that has layers*, plus ``conv_in`` when the first stage has none (the DC-AE f32/f64 layouts), so the factor
    is counted from the encoder rather than assumed to be 2^(stages - 1).
    """
    cfg = model.config
    if isinstance(model, LoopVAE):
        return int(cfg.latent_factor)
    if isinstance(model, AutoencoderDC):
        from diffusers.models.autoencoders.autoencoder_dc import DCDownBlock2d

        return 2 ** sum(isinstance(m, DCDownBlock2d) for m in model.encoder.modules())
    return 2 ** (len(cfg.block_out_channels) - 1)


def latent_values_per_pixel(model: nn.Module) -> float:
    """Numbers per image pixel in the latent the model decodes from (e.g. 16 / 8^2 = 0.25)."""
    return model.config.latent_channels / spatial_factor(model) ** 2


def last_layer(model: nn.Module) -> torch.Tensor:
    """Weight of the decoder's final RGB conv (the LDM adaptive GAN weight's reference layer)."""
    return model.get_last_layer() if isinstance(model, LoopVAE) else model.decoder.conv_out.weight
