"""srvit: recursive ViT classifiers built from loopcore parts -- the DeiT baseline (``vit-*``), bViT
(``bvit-*``, one block applied T times) and SR-ViT (``srvit-*``, every block applied R times with SoftMoR
fusion) -- with DeiT / CIFAR training and step-sweep evaluation (``srvit train``, ``srvit eval``), timm's
``create_model(name, pretrained=False, checkpoint_path=None, **kw)`` surface and a checked recipe for timm DeiT
weights (:mod:`srvit.timm_compat`). Importing it registers the classifiers with timm under prefixed names only
(``timm.create_model("srvit_s")``, ``"bvit_ti"``, ``"loopvision_vit_ti_cifar"``, ...; built by timm's
``build_model_with_cfg``, so ``features_only``, ``in_chans``, ``pretrained_cfg_overlay`` and
``timm.get_pretrained_cfg`` work as for timm's ViTs; :mod:`srvit.timm_registration`).
"""

from .model import FAMILIES, PatchEmbed, RecursionTrace, RecursiveViT
from .registry import create_model, list_models, model_arguments
from .timm_compat import (
    CheckpointLoadError,
    convert_timm_vit_state_dict,
    load_checkpoint,
    load_timm_vit_state_dict,
    read_checkpoint,
)
from .timm_registration import TIMM_NAMES, register_with_timm

__all__ = ["FAMILIES", "CheckpointLoadError", "PatchEmbed", "RecursionTrace", "RecursiveViT",
           "convert_timm_vit_state_dict", "create_model", "list_models", "load_checkpoint",
           "load_timm_vit_state_dict", "model_arguments", "read_checkpoint", "register_with_timm", "TIMM_NAMES"]
__version__ = "0.1.0"
