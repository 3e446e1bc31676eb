"""srvit's classifiers in timm's registry: ``timm.create_model("srvit_s")``, ``timm.list_models("*srvit*")``.

Importing :mod:`srvit` registers, for every srvit name ``<family>-<size>`` (``vit``, ``bvit``, ``srvit`` x
``ti``, ``s``, ``b``), two timm entry points, under prefixed names only (timm's registry is global: a generic
name such as ``vit_s`` could collide with a user's own model or a future timm one):

* ``<prefix>_<size>`` (``srvit_s``, ``bvit_ti``, ``loopvision_vit_b``, ...; the plain ViT baseline takes the
  project's prefix): the ImageNet geometry (224², 16-px patches, 1000 classes, ImageNet mean/std, crop 0.875),
  as ``srvit.create_model(name)`` builds it;
* ``<prefix>_<size>_cifar`` (e.g. ``loopvision_vit_ti_cifar``): the CIFAR-10 geometry of ``srvit train
  --config cifar10-*`` on a GPU (32², 4-px patches, 10 classes, CIFAR-10 mean/std, no crop).

Every entry point builds through timm's ``build_model_with_cfg`` with a default cfg registered by
``generate_default_cfgs``, as timm's own ViTs do, so timm's arguments mean what they mean there:
``timm.get_pretrained_cfg(name)`` returns the cfg (input size, mean/std, crop, classes; no URL and no hub id:
nothing is downloadable), ``pretrained_cfg`` / ``pretrained_cfg_overlay`` are resolved into
``model.pretrained_cfg``, ``in_chans`` / ``img_size`` / ``num_classes`` (0: no classifier) reach the model, and
``features_only=True`` (with ``out_indices``, default the last 3) wraps it in timm's ``FeatureGetterNet`` over
``forward_intermediates``. The model's ``data_mean`` / ``data_std`` / ``crop_pct`` follow the resolved cfg, so
``save_pretrained`` / ``from_pretrained`` keep the normalisation; since no weights exist, explicit model
arguments (``img_size``, ``in_chans``, ``num_classes``, ``data_mean``, ...) are written into the cfg too, which
thus describes the model built and keeps ``timm.data.resolve_data_config(model=model)`` right.

Other keyword arguments override the architecture as in ``srvit.create_model`` (``in_channels`` is accepted for
timm's ``in_chans``); timm's ``checkpoint_path`` loads a local file (timm's own loading). ``pretrained=True``
raises: there is no weight hub.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from timm.models import (
    PretrainedCfg,
    build_model_with_cfg,
    generate_default_cfgs,
    register_model,
    resolve_pretrained_cfg,
)

from .model import RecursiveViT
from .registry import CIFAR10_MEAN, CIFAR10_STD, CIFAR_GEOMETRY, FAMILY_DEFAULTS, SIZES, create_model
from .timm_surface import TIMM_PREFIXES, timm_model_name

__all__ = ["CIFAR10_MEAN", "CIFAR10_STD", "CIFAR_GEOMETRY", "TIMM_NAMES", "TIMM_PREFIXES", "default_cfgs",
           "register_with_timm", "timm_name"]

# RecursiveViT's defaults: the ImageNet geometry the un-suffixed names build
_MODEL_DEFAULTS = {name: p.default for name, p in inspect.signature(RecursiveViT.__init__).parameters.items()
                   if p.default is not inspect.Parameter.empty}
# model arguments a pretrained cfg states too: model argument -> cfg field (kept equal both ways)
_CFG_FIELDS = (("data_mean", "mean"), ("data_std", "std"), ("crop_pct", "crop_pct"))
# timm's default for a ViT's features_only extractor: the last 3 blocks
DEFAULT_OUT_INDICES = 3


def timm_name(srvit_name: str, cifar: bool = False) -> str:
    """``srvit-s`` -> ``srvit_s``, ``vit-ti`` -> ``loopvision_vit_ti`` (``..._cifar`` with ``cifar``)."""
    return timm_model_name(srvit_name, cifar)


def _srvit_names() -> list[tuple[str, bool]]:
    return [(f"{family}-{size}", cifar) for family in FAMILY_DEFAULTS for size in SIZES for cifar in (False, True)]


def _default_cfg(srvit_name: str, cifar: bool) -> dict[str, Any]:
    """The registered cfg: what the entry point builds by default (no weights: ``url`` is empty, no hub id)."""
    g = {**_MODEL_DEFAULTS, **(CIFAR_GEOMETRY if cifar else {})}
    return dict(
        url="", num_classes=g["num_classes"], input_size=(g["in_channels"], g["img_size"], g["img_size"]),
        pool_size=None, crop_pct=g["crop_pct"], interpolation="bicubic", fixed_input_size=True,
        mean=tuple(g["data_mean"]), std=tuple(g["data_std"]), first_conv="patch_embed.proj", classifier="head",
        description=f"loopvision srvit {srvit_name!r} ({'CIFAR-10' if cifar else 'ImageNet'} geometry); no "
                    "pretrained weights are published (load a local file with checkpoint_path)",
    )


# read by timm's register_model (module attribute `default_cfgs`, keyed by the entry point's name)
default_cfgs = generate_default_cfgs({timm_name(n, cifar): _default_cfg(n, cifar) for n, cifar in _srvit_names()})


def _square(img_size: int | Sequence[int], variant: str) -> int:
    """timm's ``img_size`` (an int or ``(H, W)``, as its cfg's ``input_size`` gives it) -> srvit's side."""
    if isinstance(img_size, int):
        return img_size
    sizes = tuple(img_size)
    if len(sizes) != 2 or sizes[0] != sizes[1]:
        raise ValueError(f"{variant} takes square images; got img_size={img_size!r}")
    return int(sizes[0])


def _build_model(srvit_name: str, variant: str, architecture: dict[str, Any], in_chans: int | None = None,
                 img_size: int | Sequence[int] | None = None, device: Any = None, dtype: Any = None,
                 **kwargs: Any) -> RecursiveViT:
    """``model_cls`` for ``build_model_with_cfg``: timm's argument names -> ``srvit.create_model``'s."""
    if in_chans is not None:
        kwargs["in_channels"] = in_chans
    if img_size is not None:
        kwargs["img_size"] = _square(img_size, variant)
    model = create_model(srvit_name, **{**architecture, **kwargs})
    return model.to(device=device, dtype=dtype) if device is not None or dtype is not None else model


def _resolve_cfg(variant: str, pretrained_cfg: Any, overlay: dict | None, kwargs: dict[str, Any]) -> PretrainedCfg:
    """timm's resolution (registered cfg, ``pretrained_cfg``, ``pretrained_cfg_overlay``), then what the explicit
    model arguments change: srvit publishes no weights, so the cfg describes the model that is built, and
    ``resolve_data_config(model=model)`` stays right for another ``img_size`` / ``in_chans`` / normalisation.

    An entry the overlay sets explicitly is kept (timm's source-versus-model pattern for ``input_size`` and
    ``num_classes``); for mean / std / crop, which only describe the data, a disagreement raises.
    """
    overlay = dict(overlay or {})
    cfg = resolve_pretrained_cfg(variant, pretrained_cfg=pretrained_cfg, pretrained_cfg_overlay=overlay)
    changes: dict[str, Any] = {}
    for arg, key in _CFG_FIELDS:
        if arg in kwargs:
            value = kwargs[arg] if key == "crop_pct" else tuple(kwargs[arg])
            given = overlay.get(key)
            if given is not None and (given if key == "crop_pct" else tuple(given)) != value:
                raise ValueError(f"{variant}: {arg}={kwargs[arg]!r} and pretrained_cfg_overlay {key}={given!r} "
                                 "disagree (both describe the input normalisation / crop)")
            changes[key] = value
    if "input_size" not in overlay and ("in_chans" in kwargs or "img_size" in kwargs):
        channels, *size = cfg.input_size
        if "img_size" in kwargs:
            size = [_square(kwargs["img_size"], variant)] * 2
        changes["input_size"] = (kwargs.get("in_chans", channels), *size)
    if "num_classes" not in overlay and "num_classes" in kwargs:
        changes["num_classes"] = kwargs["num_classes"]
    return dataclasses.replace(cfg, **changes)


def _entrypoint(srvit_name: str, cifar: bool) -> Callable[..., Any]:
    variant = timm_name(srvit_name, cifar)
    # the architecture of the geometry where the cfg says nothing (img_size / num_classes come from the cfg)
    architecture = {k: CIFAR_GEOMETRY[k] for k in ("img_size", "patch_size", "num_classes")} if cifar else {}

    def build(pretrained: bool = False, pretrained_cfg: Any = None, pretrained_cfg_overlay: dict | None = None,
              **kwargs: Any):
        if pretrained:
            raise ValueError(
                f"timm.create_model({variant!r}, pretrained=True): srvit downloads no weights (there is no weight "
                "hub and no network access); pass checkpoint_path='path/to/weights.safetensors' (or .pth) to load "
                "a local file"
            )
        global_pool = kwargs.pop("global_pool", None)
        if global_pool not in (None, "", "token"):
            raise ValueError(f"{variant} pools the class token only; got global_pool={global_pool!r}")
        drop_rate = kwargs.pop("drop_rate", None)
        if drop_rate:
            raise ValueError(f"{variant} has no classifier dropout; got drop_rate={drop_rate} "
                             "(drop_path_rate is supported)")
        if "in_channels" in kwargs:  # srvit's spelling of timm's in_chans
            in_channels = kwargs.pop("in_channels")
            if kwargs.setdefault("in_chans", in_channels) != in_channels:
                raise ValueError(f"{variant}: in_chans={kwargs['in_chans']} and in_channels={in_channels} disagree")
        cfg = _resolve_cfg(variant, pretrained_cfg, pretrained_cfg_overlay, kwargs)
        for arg, key in _CFG_FIELDS:  # the model's normalisation / crop are the cfg's
            kwargs.setdefault(arg, getattr(cfg, key))
        out_indices = kwargs.pop("out_indices", DEFAULT_OUT_INDICES)
        return build_model_with_cfg(
            partial(_build_model, srvit_name, variant, architecture), variant, pretrained=False, pretrained_cfg=cfg,
            feature_cfg=dict(out_indices=out_indices, feature_cls="getter"), **kwargs,
        )

    build.__name__ = build.__qualname__ = variant
    build.__module__ = __name__
    build.__doc__ = (f"srvit ``{srvit_name}`` ({'CIFAR-10' if cifar else 'ImageNet'} geometry) for "
                     "timm.create_model (built by timm's build_model_with_cfg).")
    return build


def register_with_timm() -> list[str]:
    """Register every entry point (idempotent: a second call registers nothing new) and return their names.

    Only prefixed names (:data:`srvit.timm_surface.TIMM_PREFIXES`) are registered; the former generic names of
    the ViT baseline (``vit_ti``, ``vit_s_cifar``, ...) are not, and ``timm.create_model`` no longer finds them
    here (``srvit.create_model`` still accepts them, with a deprecation warning).
    """
    import timm

    module_globals = globals()
    names = []
    for srvit_name, cifar in _srvit_names():
        name = timm_name(srvit_name, cifar)
        names.append(name)
        ours = module_globals.get(name)
        if ours is not None and timm.is_model(name) and timm.models.model_entrypoint(name) is ours:
            continue
        fn = _entrypoint(srvit_name, cifar)
        module_globals[name] = fn
        register_model(fn)
    return names


TIMM_NAMES = register_with_timm()
