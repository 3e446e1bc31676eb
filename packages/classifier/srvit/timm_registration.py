"""srvit's classifiers in timm's registry: ``timm.create_model("srvit_s")``, ``timm.list_models("*srvit*")``.

Importing :mod:`srvit` registers, for every srvit name ``<family>-<size>`` (``vit``, ``bvit``, ``srvit`` x
``ti``, ``s``, ``b``), two timm entry points:

* ``<family>_<size>`` (e.g. ``srvit_s``, ``vit_ti``): the ImageNet geometry (224², 16-px patches, 1000
  classes, ImageNet mean/std, crop 0.875), as ``srvit.create_model(name)`` builds it;
* ``<family>_<size>_cifar`` (e.g. ``vit_ti_cifar``): the CIFAR-10 geometry of ``srvit train --config
  cifar10-*`` on a GPU (32², 4-px patches, 10 classes, CIFAR-10 mean/std, no crop).

Keyword arguments override the architecture as in ``srvit.create_model``; timm's ``checkpoint_path`` loads a
local file (timm's own loading). ``pretrained=True`` raises: there is no weight hub. Every model carries its
``pretrained_cfg`` (input size, mean, std, crop), so ``timm.data.resolve_data_config(model=model)`` is right.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from timm.models import register_model

from .registry import FAMILY_DEFAULTS, SIZES, create_model

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR_GEOMETRY: dict[str, Any] = dict(img_size=32, patch_size=4, num_classes=10, data_mean=CIFAR10_MEAN,
                                      data_std=CIFAR10_STD, crop_pct=1.0)


def timm_name(srvit_name: str, cifar: bool = False) -> str:
    """``srvit-s`` -> ``srvit_s`` (``srvit_s_cifar`` with ``cifar``)."""
    return srvit_name.replace("-", "_") + ("_cifar" if cifar else "")


def _entrypoint(srvit_name: str, cifar: bool) -> Callable[..., Any]:
    defaults = CIFAR_GEOMETRY if cifar else {}

    def build(pretrained: bool = False, pretrained_cfg: Any = None, pretrained_cfg_overlay: Any = None,
              cache_dir: Any = None, drop_rate: float | None = None, global_pool: str | None = None,
              device: Any = None, dtype: Any = None, **kwargs: Any):
        # timm passes its cfg and hub arguments; our pretrained_cfg comes from the model's config instead
        if global_pool not in (None, "", "token"):
            raise ValueError(f"{timm_name(srvit_name, cifar)} pools the class token only; got global_pool="
                             f"{global_pool!r}")
        if drop_rate:
            raise ValueError(f"{timm_name(srvit_name, cifar)} has no classifier dropout; got drop_rate={drop_rate} "
                             "(drop_path_rate is supported)")
        model = create_model(srvit_name, pretrained=pretrained, **{**defaults, **kwargs})
        return model.to(device=device, dtype=dtype) if device is not None or dtype is not None else model

    build.__name__ = build.__qualname__ = timm_name(srvit_name, cifar)
    build.__module__ = __name__
    build.__doc__ = f"srvit ``{srvit_name}`` ({'CIFAR-10' if cifar else 'ImageNet'} geometry) for timm.create_model."
    return build


def register_with_timm() -> list[str]:
    """Register every entry point (idempotent: a second call registers nothing new) and return their names."""
    import timm

    module = sys.modules[__name__]
    names = []
    for family in FAMILY_DEFAULTS:
        for size in SIZES:
            for cifar in (False, True):
                name = timm_name(f"{family}-{size}", cifar)
                names.append(name)
                if name in timm.list_models(name) and getattr(module, name, None) is not None:
                    continue
                fn = _entrypoint(f"{family}-{size}", cifar)
                setattr(module, name, fn)
                register_model(fn)
    return names


TIMM_NAMES = register_with_timm()
