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


def encode_posterior(model: nn.Module, images: torch.Tensor) -> DiagonalGaussianDistribution | None:
    """The posterior of ``images`` ``(B, 3, H, W)`` in [-1, 1], or ``None`` for a deterministic autoencoder."""
    return model.encode(images).latent_dist if has_posterior(model) else None


def encode_mode(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """The latent an evaluation decodes: the posterior mode, or a deterministic autoencoder's latent.

    ``images``: ``(B, 3, H, W)`` in [-1, 1] -> ``(B, c, H / f, W / f)``.
    """
    out = model.encode(images)
    return out.latent_dist.mode() if has_posterior(model) else out.latent


def encode_sample(model: nn.Module, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """A posterior sample (seeded by ``generator``), or a deterministic autoencoder's latent."""
    out = model.encode(images)
    return out.latent_dist.sample(generator=generator) if has_posterior(model) else out.latent


@torch.no_grad()
def reconstruct_mode(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """``decode(encode_mode(images)).sample``: ``(B, 3, H, W)`` in [-1, 1] -> unclipped reconstruction."""
    return model.decode(encode_mode(model, images)).sample


def spatial_factor(model: nn.Module) -> int:
    """The latent's downsampling factor (8 for every f8 model)."""
    cfg = model.config
    if isinstance(model, LoopVAE):
        return int(cfg.latent_factor)
    if isinstance(model, AutoencoderDC):
        return 2 ** (len(cfg.encoder_block_out_channels) - 1)
    return 2 ** (len(cfg.block_out_channels) - 1)


def latent_values_per_pixel(model: nn.Module) -> float:
    """Numbers per image pixel in the latent the model decodes from (e.g. 16 / 8^2 = 0.25)."""
    return model.config.latent_channels / spatial_factor(model) ** 2


def last_layer(model: nn.Module) -> torch.Tensor:
    """Weight of the decoder's final RGB conv (the LDM adaptive GAN weight's reference layer)."""
    return model.get_last_layer() if isinstance(model, LoopVAE) else model.decoder.conv_out.weight
