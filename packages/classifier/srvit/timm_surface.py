"""timm's classifier surface for :class:`srvit.RecursiveViT`: feature sizes, the classifier and its reset,
the parameters DeiT exempts from weight decay, ``feature_info`` (for ``features_only``) and ``pretrained_cfg``.
A mixin over a model with ``config`` (``num_classes``, ``embed_dim``, ``in_channels``, ``patch_size``, ...), a
``head``, a ``norm`` (for the device and dtype), an optional ``step_embedding`` and ``trajectory_length()``."""

from __future__ import annotations

import torch
from torch import nn

# timm's IMAGENET_DEFAULT_MEAN / STD (what DeiT weights expect)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# The prefix of each family's names in timm's global registry. The plain ViT baseline gets the project's prefix:
# generic names like ``vit_s`` would collide with users' own or timm's future models.
TIMM_PREFIXES = {"vit": "loopvision_vit", "bvit": "bvit", "srvit": "srvit"}


def timm_model_name(srvit_name: str, cifar: bool = False) -> str:
    """srvit's name -> its timm name: ``srvit-s`` -> ``srvit_s``, ``vit-ti`` -> ``loopvision_vit_ti``;
    ``cifar`` appends ``_cifar`` (the CIFAR-10 geometry)."""
    family, _, size = srvit_name.partition("-")
    if family not in TIMM_PREFIXES or not size:
        raise KeyError(f"not a srvit model name: {srvit_name!r} (expected <family>-<size>, e.g. 'srvit-s')")
    return f"{TIMM_PREFIXES[family]}_{size}" + ("_cifar" if cifar else "")


class TimmClassifierSurface:
    """``num_classes``, ``num_features``, ``head_hidden_size``, ``in_chans``, ``get_classifier``,
    ``reset_classifier``, ``no_weight_decay``, ``feature_info``, ``prune_intermediate_layers`` and
    ``pretrained_cfg`` with timm's semantics."""

    @property
    def num_classes(self) -> int:
        """Classifier outputs (0: no classifier); always equal to ``config.num_classes``."""
        return self.config.num_classes

    @property
    def num_features(self) -> int:
        """Width ``d`` of the pooled features the head reads (timm's ``num_features``)."""
        return self.config.embed_dim

    @property
    def head_hidden_size(self) -> int:
        """Width of the head's input (timm's ``head_hidden_size``; no pre-logits layer, so ``d``)."""
        return self.config.embed_dim

    @property
    def in_chans(self) -> int:
        """Input image channels (timm's ``in_chans``; ``config.in_channels``)."""
        return self.config.in_channels

    @property
    def feature_info(self) -> list[dict]:
        """timm's feature metadata, one entry per trajectory state (what ``forward_intermediates`` indexes): the
        stored blocks' outputs, or every step of a single-block bViT (at the training recursion), each a
        ``(B, embed_dim, H/p, W/p)`` map at reduction ``patch_size``. ``timm.create_model(name, features_only=True)``
        reads it (``feature_info.channels()`` / ``reduction()`` of the extractor)."""
        c = self.config
        return [dict(module=f"blocks.{0 if c.depth == 1 else i}", num_chs=c.embed_dim, reduction=c.patch_size)
                for i in range(self.trajectory_length())]

    def prune_intermediate_layers(
        self, indices: int | list[int] | tuple[int, ...] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """timm's hook for ``features_only``: the absolute trajectory indices of ``indices`` (``n`` = the last ``n``,
        a list may count from the end), and with ``prune_head`` the classifier removed (``reset_classifier(0)``).

        Unlike timm's ViT the trunk is kept whole (every stored block is a stage of the recursion engine) and so is
        the final norm (``prune_norm`` is accepted and ignored; the feature maps do not read it unless asked).
        """
        length = self.trajectory_length()
        if isinstance(indices, int):
            if not 1 <= indices <= length:
                raise ValueError(f"indices={indices} asks for the last {indices} of {length} states")
            take = list(range(length - indices, length))
        else:
            if not indices or any(not -length <= i < length for i in indices):
                raise ValueError(f"indices {list(indices)} out of range for {length} states (select at least one)")
            take = sorted({i % length for i in indices})  # the order forward_intermediates returns
        if prune_head:
            self.reset_classifier(0)
        return take

    @property
    def pretrained_cfg(self) -> dict:
        """timm's pretrained config of these weights (input size, normalisation, crop, classifier names).

        A model built by ``timm.create_model`` carries the config timm resolved for it (the registered default
        cfg with any ``pretrained_cfg_overlay``, as for timm's own models); one built otherwise
        (``srvit.create_model``, ``from_pretrained``) derives it from ``config`` (``data_mean`` / ``data_std`` /
        ``crop_pct``, which ``srvit train`` records). ``timm.data.resolve_data_config(model=model)`` reads it.
        """
        cfg = self.__dict__.get("_timm_pretrained_cfg")
        if cfg is not None:
            return cfg
        c = self.config
        size = {192: "ti", 384: "s", 768: "b"}.get(c.embed_dim)
        name = timm_model_name(f"{c.family}-{size}", cifar=c.img_size == 32) if size else c.family
        return {"architecture": name, "input_size": (c.in_channels, c.img_size, c.img_size),
                "mean": tuple(c.data_mean), "std": tuple(c.data_std), "crop_pct": c.crop_pct,
                "interpolation": "bicubic", "num_classes": c.num_classes, "first_conv": "patch_embed.proj",
                "classifier": "head", "fixed_input_size": True}

    @pretrained_cfg.setter
    def pretrained_cfg(self, cfg: dict | None) -> None:
        # timm's build_model_with_cfg assigns the resolved cfg; None goes back to the config-derived one
        self.__dict__["_timm_pretrained_cfg"] = cfg

    @property
    def default_cfg(self) -> dict:
        """timm's older name of :attr:`pretrained_cfg`."""
        return self.pretrained_cfg

    @default_cfg.setter
    def default_cfg(self, cfg: dict | None) -> None:
        self.pretrained_cfg = cfg

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        """The classifier, ``nn.Linear(d, num_classes)`` or ``nn.Identity`` when ``num_classes == 0`` (timm)."""
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the classifier by a freshly initialised one with ``num_classes`` outputs (timm's semantics).

        ``num_classes=0`` removes it (``nn.Identity``: the forward returns the pooled ``(B, d)`` features). The new
        ``nn.Linear`` is initialised as in the constructor (truncated normal 0.02, zero bias) on the device and dtype
        of the model, and ``config.num_classes`` is updated, so ``save_pretrained`` / ``from_pretrained`` round-trip.

        Args:
            num_classes: outputs of the new head, ``>= 0``.
            global_pool: ``None`` (keep) or ``"token"``, the only pooling this model has (the class token).
        """
        if global_pool is not None and global_pool != "token":
            raise ValueError(
                f"RecursiveViT pools the class token only; global_pool={global_pool!r} is not supported "
                "(pass None or 'token')"
            )
        if not isinstance(num_classes, int) or num_classes < 0:
            raise ValueError(f"num_classes must be an integer >= 0 (0 = remove the classifier), got {num_classes!r}")
        if num_classes == 0:
            self.head = nn.Identity()
        else:
            ref = self.norm.weight
            head = nn.Linear(self.config.embed_dim, num_classes, device=ref.device, dtype=ref.dtype)
            nn.init.trunc_normal_(head.weight, std=0.02)
            nn.init.zeros_(head.bias)
            self.head = head
        self.register_to_config(num_classes=num_classes)

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Parameters to exclude from weight decay besides norms and biases (DeiT: embeddings)."""
        names = {"pos_embed", "cls_token"}
        if self.step_embedding is not None:
            names.add("step_embedding.weight")
        return names
