"""loopvae: LoopVAE recurrent image tokenizers (arXiv 2609.11516) and the reference VAEs.

``create_model(name, **overrides)`` builds any of ``list_models()``: ``loopvae-cnn-f8d16`` (paper
main), ``loopvae-vit-f8d16``, ``loopvae-multi``, ``loopvae-cnn-tiny`` (CPU demo), ``sd-vae`` and
``flux-vae`` (diffusers ``AutoencoderKL`` with the exact published configs) and ``flux-vae-tiny`` (the
FLUX layout at CPU size, the matched reference of the LoopVAE study).

Importing ``loopvae`` makes ``LoopVAE`` loadable by diffusers' generic loaders: ``diffusers.AutoModel.from_pretrained``
on a LoopVAE folder (the import registers the class where ``AutoModel`` looks a ``config.json``'s ``_class_name``
up) and ``DiffusionPipeline.from_pretrained`` on a pipeline whose ``model_index.json`` names ``loopvae.model``
(diffusers resolves that module only if it is already imported). Import it first.
"""

from .branches import DecoderPasses, LoopDecoder, LoopEncoder
from .encode_latents import EncodeOptions, encode_dataset
from .intervene import run_interventions
from .model import LoopVAE
from .registry import create_model, list_models, register_model
from .tiling import tile_starts, tiled_apply

__all__ = [
    "DecoderPasses", "EncodeOptions", "LoopDecoder", "LoopEncoder", "LoopVAE", "create_model", "encode_dataset",
    "list_models", "register_model", "run_interventions", "tile_starts", "tiled_apply",
]
