"""loopvae: LoopVAE recurrent image tokenizers (arXiv 2609.11516) and the reference VAEs.

``create_model(name, **overrides)`` builds any of ``list_models()``: ``loopvae-cnn-f8d16`` (paper
main), ``loopvae-vit-f8d16``, ``loopvae-multi``, ``loopvae-cnn-tiny`` (CPU demo), ``sd-vae`` and
``flux-vae`` (diffusers ``AutoencoderKL`` with the exact published configs), the CPU-scale references
(``klvae-tiny-*``, ``dcae-tiny``, ``flux-vae-tiny``).

Importing ``loopvae`` makes ``LoopVAE`` loadable by diffusers' generic loaders: ``diffusers.AutoModel.from_pretrained``
on a LoopVAE folder (``LoopVAE`` is registered where ``AutoModel`` looks a ``config.json``'s ``_class_name`` up)
and ``DiffusionPipeline.from_pretrained`` on a pipeline whose ``model_index.json`` names ``loopvae.model``
(diffusers resolves that module only if it is already imported). Import it first.

The package's names load on first use (PEP 562), so ``import loopvae`` and ``loopvae --help`` import no torch or
diffusers; the registration still happens, at once when diffusers is already imported, otherwise right after it
is (:func:`looprun.import_hooks.after_import`).
"""

from looprun.import_hooks import after_import, lazy_exports

_EXPORTS = {
    "DecoderPasses": "branches", "LoopDecoder": "branches", "LoopEncoder": "branches",
    "EncodeOptions": "encode_latents", "encode_dataset": "encode_latents",
    "run_interventions": "intervene",
    "LoopVAE": "model",
    "create_model": "registry", "list_models": "registry", "register_model": "registry",
    "tile_starts": "tiling", "tiled_apply": "tiling",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
after_import("diffusers", "loopvae.model")  # registers LoopVAE with diffusers' generic loaders
