"""timm's classifier surface for :class:`srvit.RecursiveViT`: feature sizes, the classifier and its reset,
the parameters DeiT exempts from weight decay. A mixin over a model with ``config.num_classes``,
``config.embed_dim``, a ``head``, a ``norm`` (for the device and dtype) and an optional ``step_embedding``."""

from __future__ import annotations

import torch
from torch import nn

# timm's IMAGENET_DEFAULT_MEAN / STD (what DeiT weights expect)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class TimmClassifierSurface:
    """``num_classes``, ``num_features``, ``head_hidden_size``, ``get_classifier``, ``reset_classifier``,
    ``no_weight_decay`` with timm's semantics."""

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
