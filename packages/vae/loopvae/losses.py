"""Tokenizer training objectives (kept outside the model, as in latent-diffusion).

Stage 1: ``L1 + w_p * LPIPS + w_kl * KL`` (plus an optional ``w_mse * MSE``) with the reconstruction
averaged over pixels and the KL averaged over latent elements and the batch. Stage 2 adds a hinge GAN
whose generator term is weighted by the LDM adaptive ratio ``||grad nll|| / ||grad g||`` at the decoder's last layer
(clipped at ``adaptive_weight_max``, times ``gan_weight``) and switched on from ``gan_start_step``.
Every loss is computed in fp32, also under bf16 autocast.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

from .perceptual import PerceptualLoss


def kl_per_element(posterior: DiagonalGaussianDistribution) -> torch.Tensor:
    """KL(q || N(0, I)) averaged over latent elements and batch (a scalar, fp32)."""
    mean, logvar = posterior.mean.float(), posterior.logvar.float()
    return 0.5 * (mean.pow(2) + logvar.exp() - 1.0 - logvar).mean()


def noisy_posterior_sample(
    posterior: DiagonalGaussianDistribution, noise_std: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """A posterior sample plus N(0, noise_std^2) noise (LoopVAE's latent regulariser during training)."""
    z = posterior.sample(generator=generator)
    if noise_std > 0:
        z = z + noise_std * torch.randn(z.shape, generator=generator, device=z.device, dtype=z.dtype)
    return z


def hinge_d_loss(real_logits: torch.Tensor, fake_logits: torch.Tensor) -> torch.Tensor:
    """``0.5 * (E relu(1 - D(x)) + E relu(1 + D(G)))``."""
    return 0.5 * (F.relu(1.0 - real_logits.float()).mean() + F.relu(1.0 + fake_logits.float()).mean())


def hinge_g_loss(fake_logits: torch.Tensor) -> torch.Tensor:
    """``-E D(G)``."""
    return -fake_logits.float().mean()


def adaptive_gan_weight(
    nll: torch.Tensor, g_loss: torch.Tensor, last_layer: torch.Tensor, max_weight: float = 1e4
) -> torch.Tensor:
    """LDM's ``||d nll / d W_last|| / (||d g / d W_last|| + 1e-4)``, clipped to ``[0, max_weight]``, detached."""
    (nll_grad,) = torch.autograd.grad(nll, last_layer, retain_graph=True)
    (g_grad,) = torch.autograd.grad(g_loss, last_layer, retain_graph=True)
    weight = nll_grad.float().norm() / (g_grad.float().norm() + 1e-4)
    return weight.clamp(0.0, max_weight).detach()


@dataclass
class LossWeights:
    l1: float = 1.0
    mse: float = 0.0  # L2 on the [-1, 1] scale: the term PSNR measures (recipe search, docs/study_loopvae.md)
    perceptual: float = 1.0
    kl: float = 1e-6
    gan: float = 0.5
    gan_start_step: int = 5000
    adaptive_weight_max: float = 1e4
    deep_supervision: float = 0.0


@dataclass
class LossTerms:
    """Scalar terms of one generator step; ``total`` is what is back-propagated."""

    total: torch.Tensor
    logs: dict[str, float] = field(default_factory=dict)


class ReconstructionObjective(torch.nn.Module):
    """Generator-side objective of both stages.

    Args:
        weights: the loss weights and the GAN schedule.
        perceptual: an LPIPS module, or ``None`` when ``weights.perceptual == 0``.
    """

    def __init__(self, weights: LossWeights, perceptual: PerceptualLoss | None = None) -> None:
        super().__init__()
        if weights.perceptual > 0 and perceptual is None:
            raise ValueError("perceptual weight > 0 needs a PerceptualLoss module")
        self.weights = weights
        self.perceptual = perceptual

    def pixel_terms(self, target: torch.Tensor, recon: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``w_l1 * L1 + w_mse * MSE + w_p * LPIPS`` for images in [-1, 1] (fp32), plus its parts."""
        target, recon = target.float(), recon.float()
        l1 = (recon - target).abs().mean()
        parts = {"l1": l1}
        nll = self.weights.l1 * l1
        if self.weights.mse > 0:
            mse = (recon - target).pow(2).mean()
            parts["mse"] = mse
            nll = nll + self.weights.mse * mse
        if self.weights.perceptual > 0:
            lp = self.perceptual(recon, target).mean()
            parts["lpips"] = lp
            nll = nll + self.weights.perceptual * lp
        return nll, parts

    def forward(
        self, target: torch.Tensor, recon: torch.Tensor, posterior: DiagonalGaussianDistribution | None,
        step: int, fake_logits: torch.Tensor | None = None, last_layer: torch.Tensor | None = None,
        pass_recons: list[torch.Tensor] | None = None,
    ) -> LossTerms:
        """Total generator loss.

        Args:
            target, recon: ``(B, 3, H, W)`` in [-1, 1].
            posterior: the encoder's distribution (for the KL term); ``None`` for a deterministic
                autoencoder (no KL term).
            step: stage-local optimizer step (gates the GAN term).
            fake_logits: ``D(recon)`` in stage 2, else ``None``.
            last_layer: decoder's last-layer weight (adaptive GAN weight).
            pass_recons: images decoded from the finest stage's earlier passes (deep supervision).
        """
        w = self.weights
        nll, parts = self.pixel_terms(target, recon)
        total = nll
        logs = {k: float(v.detach()) for k, v in parts.items()}
        logs["nll"] = float(nll.detach())
        if posterior is not None:
            kl = kl_per_element(posterior)
            total = total + w.kl * kl
            logs["kl"] = float(kl.detach())
        if pass_recons and w.deep_supervision > 0:
            # earlier passes weigh less: pass k of n gets k / n
            n = len(pass_recons) + 1
            extra = sum((k + 1) / n * self.pixel_terms(target, r)[0] for k, r in enumerate(pass_recons))
            total = total + w.deep_supervision * extra / len(pass_recons)
            logs["deep_supervision"] = float(extra.detach()) / len(pass_recons)
        if fake_logits is not None:
            g_loss = hinge_g_loss(fake_logits)
            logs["g_loss"] = float(g_loss.detach())
            if step >= w.gan_start_step:
                if last_layer is None:
                    raise ValueError("the adaptive GAN weight needs the decoder's last layer")
                if torch.is_grad_enabled():
                    adaptive = adaptive_gan_weight(nll, g_loss, last_layer, w.adaptive_weight_max)
                else:
                    adaptive = torch.ones((), device=nll.device)
                total = total + w.gan * adaptive * g_loss
                logs["adaptive_weight"] = float(adaptive)
                logs["gan_factor"] = 1.0
            else:
                logs["adaptive_weight"] = 0.0
                logs["gan_factor"] = 0.0
        logs["total"] = float(total.detach())
        return LossTerms(total, logs)
