"""``loopvae latent-stats``: estimate a tokenizer's latent ``shift_factor`` and ``scaling_factor``.

Diffusion models are trained on normalised latents ``(z - shift_factor) * scaling_factor`` (the SD3 /
FLUX convention; SD 1.x/2.x/XL use shift 0). We estimate both from data: ``shift_factor`` = the mean of
every latent value, ``scaling_factor`` = 1 / their standard deviation, so that the normalised latents
have mean 0 and variance 1 over the images used. Latents are posterior samples (what diffusion training
encodes, seeded) or, with ``--posterior mode``, the posterior means; statistics are accumulated in
float64 over all images, channels and positions.

The estimate is written into the artifact's ``config.json`` (``scaling_factor``, ``shift_factor``;
for a ``LoopVAE`` also ``latent_statistics``: data, image count, resolution, posterior, seed), and the
full record (per-channel means and deviations, the image keys) into ``latent_stats.json`` beside it.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

import loopdata
from loopdata.assets import portable_text
from looprun.checkpoint import write_atomic
from looprun.release import resolve_artifact

from .autoencoders import encode_mode, encode_sample
from .loading import load_tokenizer

log = logging.getLogger("loopvae.latent_stats")

STATS_FILE = "latent_stats.json"


@dataclass
class LatentStatistics:
    """The estimate and what it was computed from."""

    shift_factor: float
    scaling_factor: float
    num_images: int
    num_values: int
    resolution: int
    posterior: str
    seed: int
    data: str
    preprocess: str = "resize-crop"
    channel_mean: list[float] = field(default_factory=list)
    channel_std: list[float] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)

    def config_record(self) -> dict[str, Any]:
        """What ``config.json``'s ``latent_statistics`` keeps (no per-image keys)."""
        return {"data": self.data, "num_images": self.num_images, "resolution": self.resolution,
                "preprocess": self.preprocess, "posterior": self.posterior, "seed": self.seed, "file": STATS_FILE}


class _Moments:
    """Running float64 sums per channel of a ``(B, C, h, w)`` stream."""

    def __init__(self) -> None:
        self.n = 0
        self.s: torch.Tensor | None = None
        self.ss: torch.Tensor | None = None

    def update(self, z: torch.Tensor) -> None:
        z = z.double().transpose(0, 1).flatten(1)  # (C, B h w)
        s, ss = z.sum(dim=1), z.pow(2).sum(dim=1)
        self.s = s if self.s is None else self.s + s
        self.ss = ss if self.ss is None else self.ss + ss
        self.n += z.shape[1]

    def channel_mean(self) -> torch.Tensor:
        return self.s / self.n

    def channel_var(self) -> torch.Tensor:
        return (self.ss / self.n - self.channel_mean().pow(2)).clamp(min=0)

    def total(self) -> tuple[float, float, int]:
        count = self.n * self.s.numel()
        mean = float(self.s.sum() / count)
        var = max(float(self.ss.sum() / count) - mean * mean, 0.0)
        return mean, var, count


@torch.no_grad()
def estimate_latent_statistics(
    model: torch.nn.Module, data: str, resolution: int = 256, limit: int | None = None, batch_size: int = 8,
    num_workers: int = 2, posterior: str = "sample", seed: int = 0, device: str | torch.device = "cpu",
    progress: bool = True, preprocess: str = "resize-crop",
) -> LatentStatistics:
    """Encode images of ``data`` (shards or an image folder, centre-cropped to ``resolution``) and return
    the latent mean and 1 / standard deviation over every latent value.

    Args:
        posterior: ``sample`` (one seeded posterior sample per image, what diffusion training sees) or
            ``mode`` (the posterior mean).
        limit: use at most this many images (default: all).
    """
    if posterior not in ("sample", "mode"):
        raise ValueError(f"posterior must be 'sample' or 'mode', got {posterior!r}")
    loader = loopdata.make_loader(data, task="reconstruction", train=False, batch_size=batch_size,
                                  num_workers=num_workers, resolution=resolution, rank=0, world_size=1,
                                  preprocess=preprocess)
    generator = torch.Generator(device=device).manual_seed(seed)
    dtype = next(model.parameters()).dtype
    moments, keys = _Moments(), []
    total = len(loader) if limit is None else min(len(loader), math.ceil(limit / batch_size))
    with tqdm(total=total, desc="latent-stats", unit="batch", disable=not progress, dynamic_ncols=True) as bar:
        for batch in loader:
            images, names = batch["image"], list(batch["key"])
            if limit is not None:
                images, names = images[: limit - len(keys)], names[: limit - len(keys)]
            images = images.to(device, dtype)
            z = encode_sample(model, images, generator) if posterior == "sample" else encode_mode(model, images)
            moments.update(z)
            keys.extend(names)
            bar.update(1)
            if limit is not None and len(keys) >= limit:
                break
    if not keys:
        raise ValueError(f"no images in {data}")
    mean, var, count = moments.total()
    if var <= 0:
        raise ValueError(f"the latents of {len(keys)} image(s) from {data} have zero variance; "
                         "scaling_factor is undefined (use more, or more varied, images)")
    return LatentStatistics(
        shift_factor=mean, scaling_factor=1.0 / math.sqrt(var), num_images=len(keys), num_values=count,
        resolution=resolution, posterior=posterior, seed=seed, data=portable_text(data), preprocess=preprocess,
        channel_mean=[float(v) for v in moments.channel_mean()],
        channel_std=[float(v) for v in moments.channel_var().sqrt()], keys=keys,
    )


def write_latent_statistics(folder: str | Path, stats: LatentStatistics, per_channel: bool = False) -> Path:
    """Set ``scaling_factor`` / ``shift_factor`` (and, for a LoopVAE, ``latent_statistics``) in
    ``folder/config.json``, atomically, and write ``folder/latent_stats.json``. Returns the config path.

    ``per_channel`` also writes ``latents_mean`` / ``latents_std`` (diffusers' per-channel normalisation
    ``(z - mean_c) * scaling_factor / std_c``, with ``scaling_factor`` then 1: the per-channel statistics
    already standardise); a LoopVAE config only (``AutoencoderKL`` has no such keys)."""
    config_file = Path(folder) / "config.json"
    config = json.loads(config_file.read_text())
    if per_channel:
        if config.get("_class_name") != "LoopVAE":
            raise ValueError(f"{config_file}: per-channel latents_mean / latents_std are LoopVAE config keys; a "
                             f"{config.get('_class_name')} gets shift_factor / scaling_factor only "
                             "(drop --per-channel)")
        config["latents_mean"], config["latents_std"] = stats.channel_mean, stats.channel_std
    elif config.get("_class_name") == "LoopVAE":
        config["latents_mean"] = config["latents_std"] = None  # an earlier --per-channel estimate no longer holds
    config["scaling_factor"] = 1.0 if per_channel else stats.scaling_factor
    if config.get("_class_name") == "AutoencoderDC":
        # diffusers' AutoencoderDC has scaling_factor only (the Sana convention); the measured shift stays in
        # latent_stats.json
        log.warning("%s: AutoencoderDC has no shift_factor key; the measured shift %.6f is kept in %s only",
                    config_file, stats.shift_factor, STATS_FILE)
    else:
        config["shift_factor"] = stats.shift_factor
    if config.get("_class_name") == "LoopVAE":
        config["latent_statistics"] = stats.config_record()  # AutoencoderKL has no such key: it stays beside
    write_atomic(Path(folder) / STATS_FILE, json.dumps(asdict(stats), indent=2, allow_nan=False))
    write_atomic(config_file, json.dumps(config, indent=2, sort_keys=True) + "\n")
    return config_file


def latent_stats(
    checkpoint: str | Path, data: str, resolution: int = 256, limit: int | None = None, batch_size: int = 8,
    num_workers: int = 2, posterior: str = "sample", seed: int = 0, device: str = "cpu", dtype: str = "fp32",
    write: bool = True, progress: bool = True, per_channel: bool = False, preprocess: str = "resize-crop",
) -> tuple[LatentStatistics, Path | None]:
    """Estimate the statistics of the release / diffusers folder (or run directory's ``release/``)
    ``checkpoint`` and, with ``write``, store them in its ``config.json``. Returns ``(stats, config path)``."""
    from .evaluate import to_compute

    folder = resolve_artifact(checkpoint)
    loaded = load_tokenizer(folder)
    model = to_compute(loaded.model, device, dtype)
    stats = estimate_latent_statistics(model, data, resolution, limit, batch_size, num_workers, posterior, seed,
                                       device, progress, preprocess)
    log.info("latent statistics of %s over %d images: shift_factor %.6f, scaling_factor %.6f", folder,
             stats.num_images, stats.shift_factor, stats.scaling_factor)
    return stats, write_latent_statistics(folder, stats, per_channel) if write else None
