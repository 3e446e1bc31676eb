"""Model registry: ``create_model(name, **overrides)`` and ``list_models()``, timm style.

Entry points only choose architecture keyword arguments; overrides replace any of them
(e.g. ``create_model("loopvae-cnn-f8d16", sharing="none")``).
"""

from __future__ import annotations

import fnmatch
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .model import LoopVAE
from .reference import (
    DCAE_TINY_CONFIG,
    FLUX_VAE_CONFIG,
    FLUX_VAE_SMALL_CONFIG,
    FLUX_VAE_TINY_CONFIG,
    KLVAE_TINY_CONFIGS,
    SD_VAE_CONFIG,
    dc_autoencoder,
    reference_vae,
)

_REGISTRY: dict[str, Callable[..., nn.Module]] = {}

# The paper's main model: C=384, K=4, passes [1, 2, 4] per branch, f8d16.
LOOPVAE_CNN_F8D16: dict[str, Any] = dict(
    width=384, num_blocks=4, block_type="conv", latent_channels=16, latent_factor=8,
    encoder_passes=(1, 2, 4), decoder_passes=(1, 2, 4),
)
# Same graph with DiT-style attention blocks (6 heads), 8x8 windows at the 2x and 4x scales.
LOOPVAE_VIT_F8D16: dict[str, Any] = dict(
    LOOPVAE_CNN_F8D16, block_type="attention", num_heads=6,
    encoder_windows=(8, 8, None), decoder_windows=(None, 8, 8),
)
# Five scales 2x..32x, 6 attention blocks of width 768, posterior heads at 8x/16x/32x.
LOOPVAE_MULTI: dict[str, Any] = dict(
    width=768, num_blocks=6, block_type="attention", num_heads=12,
    latent_channels=16, latent_factor=8, extra_latents=((16, 64), (32, 128)),
    encoder_passes=(1, 1, 2, 3, 6), decoder_passes=(6, 3, 2, 1, 1),
    encoder_windows=(8, 8, None, None, None), decoder_windows=(None, None, None, 8, 8),
)
# CPU-sized model for demos, tests and the LoopVAE study: same f8d16 graph, width 48, K=2, no shortcuts
# (48 is a multiple of 12, 16 and 3, so every shortcut of the stem, latent and RGB head applies in the
# shortcuts=True ablation). The bundled trained model (assets/models/loopvae-cnn-tiny) has this config.
LOOPVAE_CNN_TINY: dict[str, Any] = dict(
    width=48, num_blocks=2, block_type="conv", latent_channels=16, latent_factor=8,
    encoder_passes=(1, 2, 4), decoder_passes=(1, 2, 4), sample_size=128, norm_num_groups=8,
)

# GPU-budget release model (make release-vae-gpu): the same graph at width 144, K=4, with the shortcuts
# (144 is a multiple of 48, so every shortcut applies), 4.21M parameters.
LOOPVAE_CNN_SMALL: dict[str, Any] = dict(
    width=144, num_blocks=4, block_type="conv", latent_channels=16, latent_factor=8,
    encoder_passes=(1, 2, 4), decoder_passes=(1, 2, 4), sample_size=128, norm_num_groups=16, shortcuts=True,
)


def register_model(name: str) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator registering a model constructor under ``name``."""

    def wrap(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return wrap


def list_models(pattern: str | None = None) -> list[str]:
    """Registered names, optionally filtered by a shell-style ``pattern`` (e.g. ``"loopvae-*"``)."""
    names = sorted(_REGISTRY)
    return [n for n in names if fnmatch.fnmatch(n, pattern)] if pattern else names


def create_model(name: str, pretrained: bool | str = False, checkpoint_path: str | os.PathLike | None = None,
                 **overrides: Any) -> nn.Module:
    """Build the registered model ``name`` with keyword ``overrides`` applied to its configuration.

    ``pretrained`` and ``checkpoint_path`` mean what they mean in timm and in ``srvit.create_model``: there is
    no weight hub and nothing is downloaded, so ``pretrained=True`` raises; ``checkpoint_path`` loads local
    weights, a diffusers / release folder (``config.json`` + ``diffusion_pytorch_model.safetensors``, whose
    config must build the same architecture) or a ``.safetensors`` state dict, strictly.
    ``pretrained="<folder>"`` (the older spelling for the reference VAEs) still works, with a warning.
    """
    if name not in _REGISTRY:
        raise KeyError(f"unknown model {name!r}; available: {', '.join(list_models())}")
    if isinstance(pretrained, (str, os.PathLike)):
        warnings.warn(f"create_model({name!r}, pretrained=<path>) is deprecated; pass checkpoint_path=<path> "
                      "(pretrained is timm's boolean)", FutureWarning, stacklevel=2)
        checkpoint_path, pretrained = pretrained, False
    if pretrained:
        raise ValueError(f"create_model({name!r}, pretrained=True): loopvae downloads no weights (no hub, no network "
                         "access); pass checkpoint_path='path/to/release-folder' (or a .safetensors file)")
    model = _REGISTRY[name](**overrides)
    if checkpoint_path is not None:
        load_weights(model, checkpoint_path)
    return model


def load_weights(model: nn.Module, path: str | os.PathLike) -> nn.Module:
    """Load local weights into ``model`` strictly: a folder's ``diffusion_pytorch_model.safetensors`` (or a
    release's legacy ``model.safetensors``) or a ``.safetensors`` file; errors name the file and the keys."""
    from safetensors.torch import load_file

    from looprun.release import release_weights_file

    path = Path(path)
    if path.is_dir() and not release_weights_file(path) and (path / "diffusion_pytorch_model.bin").is_file():
        file = path / "diffusion_pytorch_model.bin"  # an older diffusers folder
        return _load_state(model, torch.load(file, map_location="cpu", weights_only=True), file, path)
    if path.is_dir():
        file = release_weights_file(path)
    else:
        file = path if path.is_file() and path.suffix == ".safetensors" else None
    if file is None:
        raise FileNotFoundError(f"checkpoint_path {path}: neither a folder with diffusion_pytorch_model.safetensors "
                                "nor a .safetensors file")
    return _load_state(model, load_file(str(file)), file, path if path.is_dir() else None)


# Config keys that describe the weights' latents, not the architecture: a folder's values come with its weights.
LATENT_CONFIG_KEYS = ("scaling_factor", "shift_factor", "latents_mean", "latents_std", "force_upcast",
                      "latent_statistics")


def _load_state(model: nn.Module, state: dict, file: Path, folder: Path | None) -> nn.Module:
    hint = "build the model with that checkpoint's config (LoopVAE.from_pretrained / AutoencoderKL.from_pretrained)"
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as err:  # shape mismatches
        reason = str(err).splitlines()[1].strip() if len(str(err).splitlines()) > 1 else str(err)
        raise ValueError(f"checkpoint_path {file}: does not match the architecture ({reason}); {hint}") from None
    if missing or unexpected:
        raise ValueError(f"checkpoint_path {file}: does not match the architecture (missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}); {hint}")
    if folder is not None and (folder / "config.json").is_file():
        import json

        saved = json.loads((folder / "config.json").read_text())
        kept = {k: saved[k] for k in LATENT_CONFIG_KEYS if k in saved and k in model.config}
        if kept:
            model.register_to_config(**kept)  # the latent normalisation measured for these weights
    return model


def _loopvae(defaults: dict[str, Any]) -> Callable[..., LoopVAE]:
    # Overrides may use a renamed key (a run's config.yaml written before the rename): read under the new name.
    return lambda **overrides: LoopVAE(**{**defaults, **LoopVAE.upgrade_config(overrides, "model overrides")})


register_model("loopvae-cnn-f8d16")(_loopvae(LOOPVAE_CNN_F8D16))
register_model("loopvae-vit-f8d16")(_loopvae(LOOPVAE_VIT_F8D16))
register_model("loopvae-multi")(_loopvae(LOOPVAE_MULTI))
register_model("loopvae-cnn-tiny")(_loopvae(LOOPVAE_CNN_TINY))
# The bundled tokenizer's architecture (the release-tiny recipe): loopvae-cnn-tiny with its parameter-free
# shortcuts; same parameters and MACs, a few reshapes and adds more (what its training step is timed with).
register_model("loopvae-cnn-tiny-sc")(_loopvae({**LOOPVAE_CNN_TINY, "shortcuts": True}))
register_model("loopvae-cnn-small")(_loopvae(LOOPVAE_CNN_SMALL))
register_model("sd-vae")(lambda **overrides: reference_vae(SD_VAE_CONFIG, **overrides))
register_model("flux-vae")(lambda **overrides: reference_vae(FLUX_VAE_CONFIG, **overrides))
register_model("flux-vae-tiny")(
    lambda **overrides: reference_vae(FLUX_VAE_TINY_CONFIG, **{"initial_logvar": -6.0, **overrides})
)
register_model("flux-vae-small")(
    lambda **overrides: reference_vae(FLUX_VAE_SMALL_CONFIG, **{"initial_logvar": -6.0, **overrides})
)

# The fair-comparison study's reshaped AutoencoderKL candidates (>= 4 channels per GroupNorm group, no mid-block
# attention) and the shortcut-equipped AutoencoderDC reference (see loopvae.reference).
for _name, _config in KLVAE_TINY_CONFIGS.items():
    register_model(_name)(
        lambda _config=_config, **overrides: reference_vae(_config, **{"initial_logvar": -6.0, **overrides})
    )
# The shape sweep's pick (docs/study_fair.md): w32 with its global-attention mid-block, 1.05M parameters.
register_model("klvae-tiny-w32-attn")(
    lambda **overrides: reference_vae(KLVAE_TINY_CONFIGS["klvae-tiny-w32"],
                                      **{"initial_logvar": -6.0, "mid_block_add_attention": True, **overrides})
)
register_model("dcae-tiny")(lambda **overrides: dc_autoencoder(DCAE_TINY_CONFIG, **overrides))
