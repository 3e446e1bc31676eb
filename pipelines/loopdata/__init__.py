"""loopdata: WebDataset pipelines for ImageNet-256 reconstruction and classification.

Public API:

* :func:`make_loader` - one loader for both tasks, exact DDP semantics (see :mod:`loopdata.distributed`);
* :func:`expand_urls`, :func:`shard_counts` - shard listing and ``_info.json`` sample counts;
* :func:`write_shards`, :func:`check_shards` - shard tooling behind ``loopdata write`` / ``loopdata check``;
* :func:`decode_image` - defensive bytes -> RGB uint8 tensor decoding;
* :class:`LatentDataset`, :func:`make_latent_loader`, :func:`denormalize` - normalised latents from the shards
  ``loopvae encode`` writes (the latent-diffusion hand-off; :mod:`loopdata.latents`);
* :func:`find_shared_data`, :func:`bundled_kodak_urls` - where the data lives.
"""

from .assets import bundled_kodak_urls, find_shared_data
from .checker import CheckReport, check_shards
from .dataset import ShardDataset
from .decode import DecodeError, decode_image
from .distributed import RankShare, eval_plan, train_steps_per_epoch
from .errors import CorruptSampleError, NoUsableSamplesError, ShardCountError, one_line
from .keys import UnsafeKeyError
from .latents import LatentDataset, LatentNormalization, denormalize, make_latent_loader
from .loader import ShardLoader, make_loader
from .shards import ShardReadError, expand_urls, shard_counts
from .transforms import ClassificationOptions, ReconstructionOptions, make_options
from .writer import WriteReport, write_shards

__all__ = [
    "CheckReport",
    "ClassificationOptions",
    "CorruptSampleError",
    "LatentDataset",
    "LatentNormalization",
    "NoUsableSamplesError",
    "UnsafeKeyError",
    "one_line",
    "DecodeError",
    "RankShare",
    "ReconstructionOptions",
    "ShardCountError",
    "ShardDataset",
    "ShardLoader",
    "ShardReadError",
    "WriteReport",
    "bundled_kodak_urls",
    "check_shards",
    "decode_image",
    "denormalize",
    "eval_plan",
    "expand_urls",
    "find_shared_data",
    "make_latent_loader",
    "make_loader",
    "make_options",
    "shard_counts",
    "train_steps_per_epoch",
    "write_shards",
]
