"""Held-out PSNR during training (``loopvae train --val-data``): the learning curve a tokenizer run reports.

The protocol is :func:`loopvae.evaluate.evaluate`'s (posterior mode, one decode, uint8 outputs, mean of
per-image PSNR), on the first ``limit`` images of the validation shards, split exactly once across ranks.
So the last validation of a run equals ``loopvae eval`` of its release on the same images.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

import loopdata
from looprun.distributed import DistributedContext, gather_objects

from .autoencoders import reconstruct_mode
from .metrics import psnr_per_image, to_uint8


@dataclass
class ValidationSet:
    """Validation shards and how much of them to read.

    Args:
        urls: WebDataset shards or an image folder (anything :func:`loopdata.make_loader` takes).
        resolution: evaluation side (shorter side resized, centre crop), e.g. 256.
        limit: at most this many images in total over ranks (the first ones in shard order).
        batch_size: images per forward.
    """

    urls: Any
    resolution: int = 256
    limit: int = 40
    batch_size: int = 4


@torch.no_grad()
def validation_psnr(model: torch.nn.Module, data: ValidationSet, ctx: DistributedContext) -> dict[str, Any]:
    """Mean per-image PSNR (dB, uint8 protocol) of ``model`` on ``data``, gathered from every rank.

    Returns ``{"psnr", "num_images", "eval_seconds"}``; the model is put in eval mode and left there.
    """
    start = time.perf_counter()
    quota = data.limit // ctx.world_size + (1 if ctx.rank < data.limit % ctx.world_size else 0)
    loader = loopdata.make_loader(data.urls, task="reconstruction", train=False, batch_size=data.batch_size,
                                  num_workers=0, resolution=data.resolution, rank=ctx.rank,
                                  world_size=ctx.world_size)
    model.eval()
    device = next(model.parameters()).device
    values: list[float] = []
    for batch in loader:
        if len(values) >= quota:
            break
        images = batch["image"][: quota - len(values)].to(device)
        recon = reconstruct_mode(model, images)
        values.extend(psnr_per_image(to_uint8(recon), to_uint8(images)).tolist())
    every = [v for part in gather_objects(values, ctx) for v in part]
    if not every:
        raise ValueError(f"no validation images were read from {data.urls}")
    return {"psnr": sum(every) / len(every), "num_images": len(every),
            "eval_seconds": round(time.perf_counter() - start, 2)}
