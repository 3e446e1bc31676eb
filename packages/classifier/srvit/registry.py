"""Model registry: ``srvit.create_model(name, pretrained=False, checkpoint_path=None, **overrides)`` and
``srvit.list_models()``, timm style.

Names: ``vit-ti|s|b`` (DeiT), ``bvit-ti|s|b`` (one block, ``steps`` applications), ``srvit-ti|s|b``
(``recursion=R``, SoftMoR ``fusion_mode``, default R=4 and ``query``). Overrides replace any
:class:`srvit.RecursiveViT` argument; ``steps`` is bViT's name for its recursion. No weights are ever
downloaded: ``pretrained=True`` raises, ``checkpoint_path`` loads a local file.

The baselines' former timm names (``vit_ti|s|b`` and ``vit_ti|s|b_cifar``, now ``loopvision_vit_*`` in timm) are
still accepted here, with a ``FutureWarning``, and build what they built before.
"""

from __future__ import annotations

import fnmatch
import os
import warnings
from collections.abc import Callable
from typing import Any

from looprun.import_hooks import after_import

from .model import RecursiveViT
from .timm_compat import load_checkpoint
from .timm_surface import timm_model_name

# DeiT widths / heads; all use 12 blocks (vit, srvit) of MLP ratio 4 on 16x16 patches of 224x224 images.
SIZES: dict[str, dict[str, int]] = {
    "ti": dict(embed_dim=192, num_heads=3),
    "s": dict(embed_dim=384, num_heads=6),
    "b": dict(embed_dim=768, num_heads=12),
}
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "vit": dict(depth=12, recursion=1, fusion_mode="last"),
    "bvit": dict(depth=1, recursion=12, fusion_mode="last"),
    "srvit": dict(depth=12, recursion=4, fusion_mode="query"),
}

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
# The CIFAR-10 geometry of `srvit train --config cifar10-*` on a GPU (the `*_cifar` timm names).
CIFAR_GEOMETRY: dict[str, Any] = dict(img_size=32, patch_size=4, num_classes=10, data_mean=CIFAR10_MEAN,
                                      data_std=CIFAR10_STD, crop_pct=1.0)

_REGISTRY: dict[str, Callable[..., RecursiveViT]] = {}
# timm names registered before the baselines got the `loopvision_` prefix -> (srvit name, CIFAR geometry)
DEPRECATED_NAMES: dict[str, tuple[str, bool]] = {
    f"vit_{size}" + ("_cifar" if cifar else ""): (f"vit-{size}", cifar) for size in SIZES for cifar in (False, True)
}


def list_models(pattern: str | None = None) -> list[str]:
    """Registered names, optionally filtered by a shell-style ``pattern`` (e.g. ``"bvit-*"``)."""
    names = sorted(_REGISTRY)
    return [n for n in names if fnmatch.fnmatch(n, pattern)] if pattern else names


def create_model(
    name: str, pretrained: bool = False, checkpoint_path: str | os.PathLike | None = None, **overrides: Any
) -> RecursiveViT:
    """Build the registered model ``name`` with keyword ``overrides`` (e.g. ``recursion=2, num_classes=10``).

    Args:
        name: a name of :func:`list_models` (or a former timm name, ``vit_s`` / ``vit_s_cifar`` ...: deprecated,
            it warns and builds what it built before).
        pretrained: timm's flag; srvit has no weight hub and never uses the network, so ``True`` raises
            (pass ``checkpoint_path`` instead).
        checkpoint_path: a local ``.safetensors`` or ``.pth`` / ``.pt`` state dict (possibly nested under
            ``model`` / ``state_dict`` / ``model_ema``, as timm's ``load_checkpoint`` reads it) loaded strictly
            into the built model (:func:`srvit.load_checkpoint`; EMA weights first when the file has them).
        **overrides: :class:`RecursiveViT` arguments.

    Works under ``with torch.device("meta"):`` for free parameter / MAC counts of the large models.
    """
    if name in DEPRECATED_NAMES:
        name, cifar = _deprecated_name(name)
        if cifar:
            overrides = {**CIFAR_GEOMETRY, **overrides}
    if name not in _REGISTRY:
        raise KeyError(f"unknown model {name!r}; available: {', '.join(list_models())}")
    if pretrained:
        raise ValueError(
            f"create_model({name!r}, pretrained=True): srvit downloads no weights (there is no weight hub and no "
            "network access); pass checkpoint_path='path/to/weights.safetensors' (or .pth) to load a local file"
        )
    model = _REGISTRY[name](**overrides)
    if checkpoint_path is not None:
        load_checkpoint(model, checkpoint_path)
    return model


def _deprecated_name(name: str) -> tuple[str, bool]:
    """Warn about a former timm name and return ``(srvit name, CIFAR geometry)``."""
    srvit_name, cifar = DEPRECATED_NAMES[name]
    geometry = " with the CIFAR-10 geometry (img_size=32, patch_size=4, num_classes=10, CIFAR-10 mean/std)"
    warnings.warn(
        f"model name {name!r} is deprecated: it was srvit's timm name, and timm now knows this model only as "
        f"{timm_model_name(srvit_name, cifar)!r} (generic names could collide in timm's registry); use "
        f"srvit.create_model({srvit_name!r}){geometry if cifar else ''} or "
        f"timm.create_model({timm_model_name(srvit_name, cifar)!r})",
        FutureWarning, stacklevel=3,
    )
    return srvit_name, cifar


def model_arguments(name: str, **overrides: Any) -> dict[str, Any]:
    """The full :class:`RecursiveViT` keyword arguments of ``name`` with ``overrides`` applied."""
    family, _, size = name.partition("-")
    if family not in FAMILY_DEFAULTS or size not in SIZES:
        raise KeyError(f"unknown model {name!r}; available: {', '.join(list_models())}")
    # a run's config.yaml written before a key was renamed still builds its model (with a warning)
    overrides = RecursiveViT.upgrade_config(overrides, "model overrides")
    if "steps" in overrides:
        if family != "bvit":
            raise TypeError(f"'steps' is bViT's option; {name} takes recursion=R")
        overrides["recursion"] = overrides.pop("steps")
    if family == "vit" and overrides.get("recursion", 1) != 1:
        raise TypeError(f"{name} is the non-recursive baseline; use srvit-{size} for recursion > 1")
    return {**SIZES[size], **FAMILY_DEFAULTS[family], "family": family, **overrides}


def _register(name: str) -> None:
    _REGISTRY[name] = lambda **overrides: RecursiveViT(**model_arguments(name, **overrides))


for _family in FAMILY_DEFAULTS:
    for _size in SIZES:
        _register(f"{_family}-{_size}")


# srvit registers its classifiers with timm once both are loaded (see srvit/__init__.py); when timm was imported
# while this package was still loading, this is where that happens
after_import("timm", "srvit.timm_registration")
