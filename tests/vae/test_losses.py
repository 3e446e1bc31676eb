"""Loss terms, LPIPS, discriminators, DiffAugment and R1, checked against references and formulas."""

import lpips
import pytest
import torch
from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

from loopvae.diffaugment import diff_augment
from loopvae.discriminators import DinoDiscriminator, PatchGANDiscriminator, r1_penalty
from loopvae.losses import (
    LossWeights,
    ReconstructionObjective,
    adaptive_gan_weight,
    hinge_d_loss,
    hinge_g_loss,
    kl_per_element,
)
from loopvae.perceptual import PerceptualLoss


def test_kl_is_averaged_over_latent_elements_and_batch() -> None:
    moments = torch.randn(2, 8, 4, 4)
    posterior = DiagonalGaussianDistribution(moments)
    expected = posterior.kl().sum() / (2 * 4 * 4 * 4)  # diffusers sums over C,H,W per sample
    torch.testing.assert_close(kl_per_element(posterior), expected)


def test_lpips_matches_the_lpips_package_and_has_finite_gradients() -> None:
    ours = PerceptualLoss("vgg", random_backbone=True)
    ref = lpips.LPIPS(net="vgg", pnet_rand=True, verbose=False)
    ref.net.load_state_dict(ours.lpips.net.state_dict())
    x, y = torch.rand(2, 3, 64, 64) * 2 - 1, torch.rand(2, 3, 64, 64) * 2 - 1
    torch.testing.assert_close(ours(x, y), ref(x, y).flatten(), rtol=1e-5, atol=1e-6)
    # all-zero features (a constant black image through ReLUs) give NaN gradients in lpips itself
    x = torch.full((1, 3, 32, 32), -1.0, requires_grad=True)
    ours(x, torch.full((1, 3, 32, 32), -1.0)).sum().backward()
    assert torch.isfinite(x.grad).all()
    assert ours.weights_sha256 is None and not any(p.requires_grad for p in ours.parameters())


def test_lpips_without_backbone_weights_fails_clearly(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="vgg16-397923af.pth, not found at .*Copy it there"):
        PerceptualLoss("vgg", weights_path=tmp_path / "vgg16-397923af.pth")


def test_train_lpips_message_names_set_keys(tmp_path) -> None:
    """``loopvae train`` has no --lpips-weights flag: its message names the config keys it does take."""
    import loopdata
    from loopvae.train_config import load_train_config
    from loopvae.trainer import train

    config = load_train_config("tiny-stage1", ["perceptual_weight=1.0", f"lpips_weights={tmp_path / 'vgg.pth'}",
                                               "max_steps=1", "progress_bar=false"])
    with pytest.raises(FileNotFoundError) as err:
        train(config, [str(u) for u in loopdata.bundled_kodak_urls("train")], tmp_path / "run")
    text = str(err.value)
    assert "--set lpips_weights=PATH" in text and "--set perceptual_weight=0" in text
    assert "--lpips-weights" not in text


def test_lpips_loads_a_torchvision_backbone_file(tmp_path) -> None:
    import torchvision

    vgg = torchvision.models.vgg16()
    path = tmp_path / "vgg16-397923af.pth"
    torch.save(vgg.state_dict(), path)
    loss = PerceptualLoss("vgg", weights_path=path)
    torch.testing.assert_close(getattr(loss.lpips.net.slice3, "10").weight, vgg.features[10].weight)
    assert len(loss.weights_sha256) == 64


def test_hinge_losses_and_adaptive_weight_formula() -> None:
    real, fake = torch.tensor([2.0, 0.5]), torch.tensor([-2.0, 0.0])
    assert float(hinge_d_loss(real, fake)) == pytest.approx(0.5 * (0.25 + 0.5))
    assert float(hinge_g_loss(fake)) == pytest.approx(1.0)
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    nll, g = (3 * w).sum(), (w * w).sum()
    # grads: 3*(1,1) -> norm 3*sqrt(2); 2w = (2,4) -> norm sqrt(20)
    expected = 3 * 2**0.5 / (20**0.5 + 1e-4)
    assert float(adaptive_gan_weight(nll, g, w)) == pytest.approx(expected, rel=1e-6)
    assert float(adaptive_gan_weight(1e9 * w.sum(), g, w, max_weight=1e4)) == 1e4


def test_objective_gates_the_gan_term_by_step() -> None:
    torch.manual_seed(0)
    last = torch.nn.Parameter(torch.randn(3, 3, 3, 3))
    x = torch.rand(2, 3, 16, 16) * 2 - 1
    recon = torch.nn.functional.conv2d(x, last, padding=1)
    posterior = DiagonalGaussianDistribution(torch.randn(2, 8, 2, 2))
    fake_logits = (recon * 0.3).mean(dim=(1, 2, 3))
    objective = ReconstructionObjective(LossWeights(perceptual=0.0, gan_start_step=10))
    before = objective(x, recon, posterior, step=9, fake_logits=fake_logits, last_layer=last)
    after = objective(x, recon, posterior, step=10, fake_logits=fake_logits, last_layer=last)
    assert before.logs["gan_factor"] == 0.0 and after.logs["gan_factor"] == 1.0
    assert before.logs["adaptive_weight"] == 0.0 and after.logs["adaptive_weight"] > 0
    gan = 0.5 * after.logs["adaptive_weight"] * after.logs["g_loss"]
    assert after.logs["total"] == pytest.approx(before.logs["total"] + gan, rel=1e-5)
    with pytest.raises(ValueError, match="needs a PerceptualLoss"):
        ReconstructionObjective(LossWeights(perceptual=1.0))


def test_diffaugment_properties() -> None:
    torch.manual_seed(0)
    x = torch.rand(64, 3, 40, 40, requires_grad=True)
    assert torch.equal(diff_augment(x, p=0.0), x)
    out = diff_augment(x, policy=("cutout",), cutout=0.2)
    zero_fraction = (out == 0).all(dim=1).float().mean()
    assert 0.02 < float(zero_fraction) <= 0.04 + 1e-6  # an 8x8 square (clipped at borders) of 40x40
    moved = diff_augment(torch.arange(16.0).view(1, 1, 4, 4).expand(8, 1, 4, 4), policy=("translation",))
    for img in moved:  # translation only shifts content (zero fill): every value stays in place or vanishes
        kept = img[img != 0]
        assert set(kept.tolist()) <= set(range(16))
    out = diff_augment(x)
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    with pytest.raises(ValueError, match="unknown DiffAugment policy"):
        diff_augment(x, policy=("blur",))


def test_r1_penalty_matches_the_analytic_gradient() -> None:
    """R1 = E_x ||grad_x mean_patches D(x)||^2: with patch logits D_p(x) = <x, w_p> + |x|^2 the gradient of
    the per-sample mean is mean_p(w_p) + 2x."""
    torch.manual_seed(0)
    w = torch.randn(5, 3, 8, 8)  # 5 patch logits, each its own linear term
    real = torch.randn(4, 3, 8, 8, requires_grad=True)
    logits = torch.einsum("bchw,pchw->bp", real, w) + (real**2).sum(dim=(1, 2, 3))[:, None]
    penalty = r1_penalty(real, logits)
    expected = (w.mean(0, keepdim=True) + 2 * real).pow(2).flatten(1).sum(1).mean()
    torch.testing.assert_close(penalty, expected)
    penalty.backward()  # differentiable (create_graph)
    assert real.grad is not None


def test_r1_penalty_gamma_does_not_depend_on_the_number_of_patch_logits() -> None:
    """A PatchGAN-shaped map that replicates one logit over 6x6 patches has the penalty of that logit
    (the gradient of the logits' sum would be 36x larger, the penalty 36^2x)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Tanh(), torch.nn.Flatten(),
                              torch.nn.Linear(4 * 14 * 14, 1))
    real = torch.randn(3, 3, 16, 16, requires_grad=True)
    single = net(real).squeeze(1)  # (B,): one logit per sample
    patch_map = single[:, None, None, None].expand(-1, 1, 6, 6)  # (B, 1, 6, 6) PatchGAN shape
    one = r1_penalty(real, single)
    many = r1_penalty(real, patch_map)
    assert float(one.detach()) > 0
    torch.testing.assert_close(many, one)
    (grad,) = torch.autograd.grad(single.sum(), real, retain_graph=True)
    torch.testing.assert_close(one, grad.pow(2).flatten(1).sum(1).mean())  # the single-logit R1 itself
    # the same holds for token logits (B, N), the DINO discriminator's output shape
    torch.testing.assert_close(r1_penalty(real, single[:, None].expand(-1, 10)), one)
    # a real PatchGAN output: mean over its 6x6 logits, checked against an explicit per-sample mean
    patch = PatchGANDiscriminator(base_channels=32)
    x = torch.randn(2, 3, 64, 64, requires_grad=True)
    logits = patch(x)
    assert logits.shape == (2, 1, 6, 6)
    (ref_grad,) = torch.autograd.grad(logits.mean(dim=(1, 2, 3)).sum(), x, retain_graph=True)
    torch.testing.assert_close(r1_penalty(x, logits), ref_grad.pow(2).flatten(1).sum(1).mean())


def test_discriminators_shapes_frozen_backbone_and_generator_gradients() -> None:
    patch = PatchGANDiscriminator()
    assert patch(torch.zeros(2, 3, 64, 64)).shape == (2, 1, 6, 6)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in patch.modules())  # DDP-safe norm
    dino = DinoDiscriminator(random_backbone=True, feature_blocks=(2, 5), image_size=112)
    x = (torch.rand(2, 3, 64, 64) * 2 - 1).requires_grad_(True)
    logits = dino(x)
    assert logits.shape == (2, 2 * 64)
    logits.sum().backward()
    assert x.grad.abs().sum() > 0  # the generator gets gradients through the frozen features
    assert all(p.grad is None for p in dino.backbone.parameters())
    dino.train()
    assert not dino.backbone.training and dino.heads.training
    with pytest.raises(FileNotFoundError, match="needs DINOv2-small weights"):
        DinoDiscriminator(weights_path=None)
