"""Held-out metrics during training (``loopvae train --val-data``): the learning curve a tokenizer run reports.

The protocol is :func:`loopvae.evaluate.evaluate`'s (posterior mode, one decode, uint8 outputs, mean of
per-image PSNR and SSIM; LPIPS and rFID when their weights are present, stated as unavailable otherwise), on
the first ``limit`` images of the validation shards, split exactly once across ranks. So the last validation of
a run equals ``loopvae eval`` of its release on the same images.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

import loopdata
from looprun.distributed import DistributedContext, gather_objects

from .autoencoders import reconstruct_mode
from .metrics import psnr_per_image, ssim_per_image, to_uint8


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


@dataclass
class ValidationMetrics:
    """The metric models validation uses beyond PSNR/SSIM: LPIPS and FID when their weights are present
    (``None`` with the reason otherwise, as in ``loopvae eval``)."""

    lpips: Any = None
    lpips_reason: str | None = "LPIPS skipped"
    fid_weights: str | None = None
    fid_reason: str | None = None
    fid: Any = None  # the FID metric, built once (Inception loaded once per run) and reset per validation

    @classmethod
    def build(cls, lpips_net: str, lpips_weights: str | None, fid_weights: str | None,
              device: torch.device) -> ValidationMetrics:
        from .evaluate import EvalOptions, build_lpips
        from .metrics import build_fid

        lpips, reason = build_lpips(EvalOptions(lpips_net=lpips_net, lpips_weights=lpips_weights), device)
        fid, fid_reason, fid_path = build_fid(fid_weights)
        return cls(lpips, reason, str(fid_path) if fid is not None else None, fid_reason,
                   None if fid is None else fid.to(device))


@torch.no_grad()
def validation_psnr(model: torch.nn.Module, data: ValidationSet, ctx: DistributedContext,
                    metrics: ValidationMetrics | None = None) -> dict[str, Any]:
    """``loopvae eval``'s metrics of ``model`` on ``data`` during training, gathered from every rank: mean per-image
    PSNR (dB, uint8 protocol) and SSIM, and LPIPS and rFID when ``metrics`` has their weights (``None`` with the
    reason otherwise). Returns ``{"psnr", "ssim", "lpips", "rfid", "num_images", "eval_seconds", ...}``; the model
    is put in eval mode and left there.
    """
    start = time.perf_counter()
    metrics = metrics or ValidationMetrics()
    quota = data.limit // ctx.world_size + (1 if ctx.rank < data.limit % ctx.world_size else 0)
    loader = loopdata.make_loader(data.urls, task="reconstruction", train=False, batch_size=data.batch_size,
                                  num_workers=0, resolution=data.resolution, rank=ctx.rank,
                                  world_size=ctx.world_size)
    model.eval()
    device = next(model.parameters()).device
    if metrics.fid is None and metrics.fid_weights is not None:
        from .metrics import build_fid

        metrics.fid = build_fid(metrics.fid_weights)[0].to(device)
    fid = metrics.fid
    if fid is not None:
        fid.reset()  # this validation's images only
    values: list[tuple[float, float, float | None]] = []
    for batch in loader:
        if len(values) >= quota:
            break
        images = batch["image"][: quota - len(values)].to(device)
        recon = reconstruct_mode(model, images)
        ref_u8, rec_u8 = to_uint8(images), to_uint8(recon)
        psnr, ssim = psnr_per_image(rec_u8, ref_u8).tolist(), ssim_per_image(rec_u8, ref_u8).tolist()
        lp = ([None] * len(psnr) if metrics.lpips is None else
              metrics.lpips(rec_u8.float() / 127.5 - 1, ref_u8.float() / 127.5 - 1).flatten().tolist())
        if fid is not None:
            fid.update(ref_u8, real=True)
            fid.update(rec_u8, real=False)
        values.extend(zip(psnr, ssim, lp, strict=True))
    every = [v for part in gather_objects(values, ctx) for v in part]
    if not every:
        raise ValueError(f"no validation images were read from {data.urls}")
    rfid = float(fid.compute()) if fid is not None and len(every) > 1 else None  # a collective under DDP
    out: dict[str, Any] = {
        "psnr": sum(v[0] for v in every) / len(every), "ssim": sum(v[1] for v in every) / len(every),
        "lpips": None if metrics.lpips is None else sum(v[2] for v in every) / len(every), "rfid": rfid,
        "num_images": len(every), "eval_seconds": round(time.perf_counter() - start, 2)}
    if metrics.lpips is None:
        out["lpips_unavailable_reason"] = metrics.lpips_reason
    if rfid is None:
        out["rfid_unavailable_reason"] = metrics.fid_reason or "FID needs at least 2 images"
    return out
