"""srvit: recursive ViT classifiers built from loopcore parts -- the DeiT baseline (``vit-*``), bViT
(``bvit-*``, one block applied T times) and SR-ViT (``srvit-*``, every block applied R times with SoftMoR
fusion) -- with DeiT / CIFAR training and step-sweep evaluation (``srvit train``, ``srvit eval``), timm's
``create_model(name, pretrained=False, checkpoint_path=None, **kw)`` surface and a checked recipe for timm DeiT
weights (:mod:`srvit.timm_compat`). Importing it registers the classifiers with timm under prefixed names only
(``timm.create_model("srvit_s")``, ``"bvit_ti"``, ``"loopvision_vit_ti_cifar"``, ...; built by timm's
``build_model_with_cfg``, so ``features_only``, ``in_chans``, ``pretrained_cfg_overlay`` and
``timm.get_pretrained_cfg`` work as for timm's ViTs; :mod:`srvit.timm_registration`).

The names load on first use (PEP 562), so ``srvit --help`` imports no torch or timm; the timm registration still
happens, at once when timm is already imported, otherwise right after it is.
"""

from looprun.import_hooks import after_import, lazy_exports

_EXPORTS = {
    "FAMILIES": "model", "PatchEmbed": "model", "RecursionTrace": "model", "RecursiveViT": "model",
    "create_model": "registry", "list_models": "registry", "model_arguments": "registry",
    "CheckpointLoadError": "timm_compat", "convert_timm_vit_state_dict": "timm_compat",
    "load_checkpoint": "timm_compat", "load_timm_vit_state_dict": "timm_compat", "read_checkpoint": "timm_compat",
    "TIMM_NAMES": "timm_registration", "register_with_timm": "timm_registration",
}
__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
after_import("timm", "srvit.timm_registration")  # registers the classifiers under timm's generic create_model
