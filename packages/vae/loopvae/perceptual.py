"""LPIPS perceptual distance with offline backbone weights and NaN-safe feature normalisation.

The ``lpips`` wheel ships the calibrated linear heads; the VGG16 / AlexNet backbones are
torchvision ImageNet weights that cannot be downloaded here. We look for them where torchvision
caches them (``$TORCH_HOME/hub/checkpoints/vgg16-397923af.pth`` or ``alexnet-owt-7be5be79.pth``) or
take an explicit path, and fail with a message saying where to put the file. ``random_backbone=True``
builds the same architecture with random weights (tests, plumbing).

``lpips.normalize_tensor`` divides by ``sqrt(sum x^2) + eps``; where a feature vector is all zero
its backward pass produces ``0 * inf = NaN``. Our forward uses the package's scaling layer, backbone
and linear heads but normalises with ``x * rsqrt(sum x^2 + eps^2)``, which has finite gradients
everywhere and equals the original to ~1e-10.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

BACKBONE_FILES = {"vgg": "vgg16-397923af.pth", "alex": "alexnet-owt-7be5be79.pth"}


def default_backbone_path(net: str) -> Path:
    """Where torchvision caches the ImageNet backbone of ``net`` (``vgg`` or ``alex``)."""
    return Path(torch.hub.get_dir()) / "checkpoints" / BACKBONE_FILES[net]


def _normalize(features: torch.Tensor, eps: float = 1e-10) -> torch.Tensor:
    return features * torch.rsqrt(features.pow(2).sum(dim=1, keepdim=True) + eps * eps)


class PerceptualLoss(nn.Module):
    """LPIPS distance between images in [-1, 1]: ``(B, 3, H, W) x 2 -> (B,)``.

    Args:
        net: ``vgg`` (default, as in the LoopVAE recipe) or ``alex`` (the usual evaluation net).
        weights_path: backbone file; default: the torchvision cache path (see module docstring).
        random_backbone: random backbone weights instead of ImageNet ones (no file needed).
        options_hint: what the calling command offers instead, named in the missing-file error (the flags of
            ``loopvae eval`` differ from the config keys of ``loopvae train``).

    Always in eval mode with frozen parameters; never part of a model's state dict or EMA.
    ``weights_sha256`` records the backbone file used (``None`` for a random backbone).
    """

    def __init__(self, net: str = "vgg", weights_path: str | Path | None = None, random_backbone: bool = False,
                 options_hint: str = "pass its path, or do without LPIPS") -> None:
        super().__init__()
        import lpips

        if net not in BACKBONE_FILES:
            raise ValueError(f"unknown LPIPS net {net!r}; choose one of {sorted(BACKBONE_FILES)}")
        self.net_name = net
        self.weights_path: Path | None = None
        self.weights_sha256: str | None = None
        if not random_backbone:
            path = Path(weights_path) if weights_path is not None else default_backbone_path(net)
            if not path.is_file():
                raise FileNotFoundError(
                    f"LPIPS-{net} needs the torchvision ImageNet backbone file {BACKBONE_FILES[net]}, not found at "
                    f"{path}. Copy it there (or into $TORCH_HOME/hub/checkpoints/), or {options_hint}."
                )
            self.weights_path = path
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torchvision's 'pretrained' deprecation inside lpips
            self.lpips = lpips.LPIPS(net=net, pnet_rand=True, verbose=False)
        if self.weights_path is not None:
            self._load_backbone(self.weights_path)
        self.requires_grad_(False)
        self.eval()

    def _load_backbone(self, path: Path) -> None:
        from looprun.checkpoint import sha256_file

        from .metrics import load_tensor_file

        expected = f"torchvision's {BACKBONE_FILES[self.net_name]}"
        state = load_tensor_file(path, f"LPIPS-{self.net_name} backbone weights", expected)
        target = {}
        for name, tensor in self.lpips.net.state_dict().items():
            # lpips keeps torchvision's feature indices: "slice2.5.weight" <- "features.5.weight"
            _, index, kind = name.split(".")
            source = f"features.{index}.{kind}"
            if source not in state:
                raise ValueError(f"LPIPS-{self.net_name} backbone weights {path}: not a torchvision "
                                 f"{self.net_name} state dict ({source} is missing); expected {expected}")
            if state[source].shape != tensor.shape:
                raise ValueError(f"LPIPS-{self.net_name} backbone weights {path}: {source} has shape "
                                 f"{tuple(state[source].shape)}, expected {tuple(tensor.shape)}; expected {expected}")
            target[name] = state[source]
        self.lpips.net.load_state_dict(target)
        self.weights_sha256 = sha256_file(path)

    def train(self, mode: bool = True) -> PerceptualLoss:
        return super().train(False)  # metric networks never train (dropout off)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-image LPIPS distance ``(B,)`` for ``x``, ``y`` in [-1, 1], computed in fp32."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            m = self.lpips
            fx = m.net(m.scaling_layer(x.float()))
            fy = m.net(m.scaling_layer(y.float()))
            total = 0.0
            for level, lin in enumerate(m.lins):
                diff = (_normalize(fx[level]) - _normalize(fy[level])).pow(2)
                total = total + lin(diff).mean(dim=(2, 3))
            return total.flatten()
