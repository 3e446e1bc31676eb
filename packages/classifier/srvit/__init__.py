"""srvit: recursive ViT classifiers built from loopcore parts -- the DeiT baseline (``vit-*``), bViT
(``bvit-*``, one block applied T times) and SR-ViT (``srvit-*``, every block applied R times with SoftMoR
fusion) -- with DeiT / CIFAR training and step-sweep evaluation (``srvit train``, ``srvit eval``).
"""

from .model import FAMILIES, PatchEmbed, RecursionTrace, RecursiveViT
from .registry import create_model, list_models, model_arguments

__all__ = ["FAMILIES", "PatchEmbed", "RecursionTrace", "RecursiveViT", "create_model", "list_models",
           "model_arguments"]
__version__ = "0.1.0"
