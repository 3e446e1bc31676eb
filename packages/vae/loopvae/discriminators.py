"""GAN discriminators for stage-2 tokenizer training, and the lazy R1 penalty.

* :class:`PatchGANDiscriminator` -- the NLayer PatchGAN of pix2pix / taming / LDM (3 layers), with
  GroupNorm instead of BatchNorm so that DDP needs no buffer synchronisation (DDP-safe).
* :class:`DinoDiscriminator` -- LoopVAE's main discriminator: frozen DINOv2-small features (timm's
  ``vit_small_patch14_dinov2``) from several depths, each scored per token by a small trainable head.
* :func:`r1_penalty` -- the R1 gradient penalty on real images, taken on each sample's mean logit so that
  its gamma does not depend on how many patch / token logits the discriminator outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class PatchGANDiscriminator(nn.Module):
    """NLayer PatchGAN: ``(B, 3, H, W)`` in [-1, 1] -> patch logits ``(B, 1, H/8 - 2, W/8 - 2)``.

    Args:
        in_channels: image channels.
        base_channels: width of the first layer (64).
        num_layers: stride-2 layers after the first (3 in LoopVAE / LDM).
    """

    def __init__(self, in_channels: int = 3, base_channels: int = 64, num_layers: int = 3) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(in_channels, base_channels, 4, stride=2, padding=1), nn.LeakyReLU(0.2, True)
        ]
        width = base_channels
        for n in range(1, num_layers + 1):
            out = base_channels * min(2**n, 8)
            stride = 2 if n < num_layers else 1
            layers += [
                nn.Conv2d(width, out, 4, stride=stride, padding=1, bias=False),
                nn.GroupNorm(32 if out % 32 == 0 else 1, out),
                nn.LeakyReLU(0.2, True),
            ]
            width = out
        layers.append(nn.Conv2d(width, 1, 4, stride=1, padding=1))
        self.net = nn.Sequential(*layers)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, 0.0, 0.02)
            elif isinstance(m, nn.GroupNorm):
                nn.init.normal_(m.weight, 1.0, 0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _weights_problem(err: BaseException) -> str:
    """One line for a failed weights load: counts of missing / unexpected / misshapen tensors from
    ``load_state_dict``'s message, else its first line."""
    import re

    text = str(err)
    parts = []
    for label, pattern in (("missing", r"Missing key\(s\) in state_dict: ([^\n]*)"),
                           ("unknown", r"Unexpected key\(s\) in state_dict: ([^\n]*)")):
        match = re.search(pattern, text)
        if match:
            keys = re.findall(r'"([^"]+)"', match.group(1))
            parts.append(f"{len(keys)} tensors {label} (e.g. {keys[0]})" if keys else f"tensors {label}")
    mismatched = len(re.findall(r"size mismatch for ", text))
    if mismatched:
        parts.append(f"{mismatched} tensors of another shape")
    if parts:
        return "; ".join(parts)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else type(err).__name__
    return first if len(first) <= 160 else first[:157] + "..."


class DinoDiscriminator(nn.Module):
    """Frozen DINOv2-small backbone + trainable per-token heads on several of its blocks.

    Args:
        weights_path: a timm / original DINOv2-small checkpoint (``.pth`` or ``.safetensors``). Required
            unless ``random_backbone`` (tests only: the features are then meaningless).
        feature_blocks: indices of the transformer blocks whose tokens are scored.
        image_size: side the [-1, 1] input is resized to (multiple of the 14-px patch).
        head_channels: hidden width of each head.

    Output: logits ``(B, len(feature_blocks) * num_tokens)``. The backbone is frozen
    (``requires_grad=False``, eval mode) but differentiable, so the generator gets gradients.
    """

    def __init__(
        self, weights_path: str | Path | None = None, feature_blocks: Sequence[int] = (2, 5, 8, 11),
        image_size: int = 224, head_channels: int = 128, random_backbone: bool = False,
    ) -> None:
        super().__init__()
        import timm

        if image_size % 14:
            raise ValueError(f"DINOv2 image_size must be a multiple of its 14-px patch, got {image_size}")
        kwargs = dict(img_size=image_size, num_classes=0, dynamic_img_size=False)
        if random_backbone:
            backbone = timm.create_model("vit_small_patch14_dinov2", pretrained=False, **kwargs)
            self.weights_sha256 = None
        else:
            if weights_path is None or not Path(weights_path).is_file():
                raise FileNotFoundError(
                    f"the DINOv2 discriminator needs DINOv2-small weights (timm vit_small_patch14_dinov2.lvd142m, "
                    f"or the original dinov2_vits14 .pth); got {weights_path!r}. Pass dino_weights=PATH; "
                    f"no download is attempted."
                )
            from looprun.checkpoint import sha256_file

            try:  # timm reads the file with torch.load(weights_only=True) or safetensors: no pickled code runs
                backbone = timm.create_model(
                    "vit_small_patch14_dinov2", pretrained=True,
                    pretrained_cfg_overlay=dict(file=str(weights_path)), **kwargs,
                )
            except Exception as err:  # noqa: BLE001 - only the weights file varies here: name it, in one line
                raise ValueError(
                    f"dino_weights {weights_path}: not DINOv2-small weights ({_weights_problem(err)}); expected "
                    "timm's vit_small_patch14_dinov2.lvd142m (.safetensors / .pth) or the original dinov2_vits14 .pth"
                ) from None
            self.weights_sha256 = sha256_file(weights_path)
        self.backbone = backbone.eval().requires_grad_(False)
        self.feature_blocks = tuple(feature_blocks)
        self.image_size = image_size
        dim = backbone.embed_dim
        self.heads = nn.ModuleList(
            nn.Sequential(
                nn.LayerNorm(dim), nn.Linear(dim, head_channels), nn.LeakyReLU(0.2, True), nn.Linear(head_channels, 1)
            )
            for _ in self.feature_blocks
        )
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def train(self, mode: bool = True) -> DinoDiscriminator:
        super().train(mode)
        self.backbone.eval()  # frozen features: no dropout / drop-path changes
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x + 1) / 2
        x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear", antialias=True,
                          align_corners=False)
        x = (x - self.mean) / self.std
        feats = self.backbone.forward_intermediates(
            x, indices=list(self.feature_blocks), output_fmt="NLC", intermediates_only=True
        )
        logits = [head(f).squeeze(-1) for head, f in zip(self.heads, feats)]
        return torch.cat(logits, dim=1)


def r1_penalty(real: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """R1 = ``E_x ||grad_x mean_patches D(x)||^2`` for ``real`` with ``requires_grad`` and ``logits = D(real)``.

    ``logits`` is ``(B,)`` or ``(B, ...)``: one logit per sample, or a map of patch / token logits
    (PatchGAN ``(B, 1, h, w)``, DINO ``(B, N)``). Each sample's logits are averaged before the
    gradient is taken, the same average :func:`loopvae.losses.hinge_d_loss` takes, so ``r1_gamma``
    means the same for a discriminator with one logit and for one with many: a map that replicates one
    logit ``N`` times has the penalty of that logit. (The gradient of the *sum* of the logits would
    scale the penalty by ``N^2`` for such a map, and in general make the effective gamma grow with the
    number of logits, i.e. with the image resolution.)
    The squared gradient norm is summed over pixels and channels and averaged over the batch.

    Uses ``create_graph=True``: the penalty is itself differentiated.
    """
    per_sample = logits.reshape(logits.shape[0], -1).mean(dim=1)
    (grad,) = torch.autograd.grad(per_sample.sum(), real, create_graph=True)
    return grad.pow(2).flatten(1).sum(1).mean()


def build_discriminator(kind: str, dino_weights: str | None = None, random_backbone: bool = False) -> nn.Module:
    """``patchgan`` or ``dino`` (see the classes above)."""
    if kind == "patchgan":
        return PatchGANDiscriminator()
    if kind == "dino":
        return DinoDiscriminator(dino_weights, random_backbone=random_backbone)
    raise ValueError(f"unknown discriminator {kind!r}; choose patchgan or dino")
