"""``loopvae eval``: rFID / PSNR / SSIM / LPIPS of a tokenizer on WebDataset shards.

Protocol (see :mod:`loopvae.metrics`): posterior mode, one decode, reconstructions clamped and
quantised to uint8, compared with the same centre-cropped references. Under torchrun every image is
evaluated exactly once (loopdata's evaluation split) and the per-image results are gathered on rank 0.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torchvision
from PIL import Image
from tqdm import tqdm

import loopdata
from loopdata import one_line
from loopdata.identity import data_identity
from loopdata.keys import path_for_key
from loopdata.shards import canonical_urls
from loopdata.transforms import describe_preprocessing, make_options
from looprun.checkpoint import OutputWriteError, is_write_failure, write_atomic, write_failure
from looprun.distributed import (
    DistributedContext,
    RemoteRankError,
    gather_objects,
    init_distributed,
    raise_if_any_rank_failed,
    reported_failure,
    sum_across_ranks,
)
from looprun.output_dir import prepare_output_dir
from looprun.run_logger import setup_run_logging, teardown_run_logging
from looprun.speed import prepare_for_speed, to_memory_format

from .autoencoders import latent_values_per_pixel, reconstruct_mode
from .loading import LoadedTokenizer, load_tokenizer
from .metrics import bicubic_baseline, build_fid, psnr_per_image, ssim_per_image, to_uint8
from .npz_batches import merge_parts, save_part, write_keys
from .perceptual import PerceptualLoss

log = logging.getLogger("loopvae.eval")


@dataclass
class EvalOptions:
    resolution: int = 256
    limit: int | None = None
    batch_size: int = 8
    num_workers: int = 2
    fid_weights: str | None = None
    require_fid: bool = False  # missing Inception weights: fail instead of reporting rfid: null
    lpips_net: str = "alex"  # or "none": skip LPIPS (reported as null with the reason)
    lpips_weights: str | None = None
    require_lpips: bool = False  # missing LPIPS backbone weights: fail instead of reporting lpips: null
    lpips_random_backbone: bool = False  # tests and plumbing only: numbers are not LPIPS
    save_images: bool = False
    grid_images: int = 8
    device: str = "auto"
    skip_corrupt: bool = False  # skip (count and report) undecodable images instead of stopping
    weights: str = "ema"  # for training run directories: "ema" or "model"
    dtype: str = "fp32"  # "fp32" or "bf16": the tokenizer's compute dtype (metrics are always float64)
    progress: bool = True  # a progress bar on stderr (rank 0)
    memory_format: str = "contiguous"  # or "channels_last" (faster convolutions; see looprun.speed)
    compile: bool = False  # torch.compile the tokenizer (first batch compiles)
    preprocess: str = "resize-crop"  # or "adm" (ADM's center_crop_arr); JPEGs are always decoded fully
    save_npz: bool = False  # also OUT/npz/{reconstructions,references}.npz (uint8, N x H x W x 3: ADM's layout)


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def compute_dtype(name: str) -> torch.dtype:
    """``"fp32"`` / ``"bf16"`` -> the torch dtype; ``ValueError`` naming the value otherwise."""
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


def to_compute(model: torch.nn.Module, device: torch.device | str, dtype: str) -> torch.nn.Module:
    """``model`` on ``device`` in the compute dtype named ``dtype`` (``fp32`` / ``bf16``).

    ``nn.Module.to`` rather than diffusers' override: ours keep no fp32-only modules, and diffusers warns
    on every dtype cast of a model loaded without ``torch_dtype``.
    """
    return torch.nn.Module.to(model, device=device, dtype=compute_dtype(dtype))


@torch.no_grad()
def reconstruct(model: torch.nn.Module, images: torch.Tensor, memory_format: str = "contiguous") -> torch.Tensor:
    """Posterior mode (a deterministic autoencoder's latent) -> decode (``(B,3,H,W)`` in [-1, 1] -> unclipped
    float32 reconstruction).

    The images are cast to the model's dtype (bf16 models compute in bf16) and ``memory_format``."""
    images = to_memory_format(images.to(next(model.parameters()).dtype), memory_format)
    return reconstruct_mode(model, images).float()


def _rank_limit(limit: int | None, ctx: DistributedContext) -> int | None:
    if limit is None:
        return None
    return limit // ctx.world_size + (1 if ctx.rank < limit % ctx.world_size else 0)


def _save_png(array: torch.Tensor, path: Path) -> None:
    try:
        Image.fromarray(array.permute(1, 2, 0).cpu().numpy()).save(path)
    except OSError as err:
        path.unlink(missing_ok=True)  # PIL leaves a truncated file behind
        if is_write_failure(err):
            raise OutputWriteError(write_failure(path, err)) from err
        raise


OUTPUT_SET = ("metrics.json", "per_image.json", "report.md", "grid.png", "images", "npz", "eval.log")
# what the evaluation in a folder wrote there: the only entries of OUTPUT_SET a rerun removes
OUTPUTS_RECORD = "eval-outputs.json"
# the entries an evaluation writes into images/ and npz/ (besides hidden temporaries): how an older eval's folders are
# recognised
_FOLDER_LAYOUT = {"images": ("reconstruction", "reference"),
                  "npz": ("reconstructions.npz", "references.npz", "keys.json")}


def _looks_written_by_eval(path: Path, name: str) -> bool:
    if name not in _FOLDER_LAYOUT:
        return path.is_file() and not path.is_symlink()
    return path.is_dir() and not path.is_symlink() and all(
        child.name in _FOLDER_LAYOUT[name] or child.name.startswith(".") for child in path.iterdir())


def owned_outputs(out: Path) -> set[str]:
    """The entries of :data:`OUTPUT_SET` that an earlier evaluation in ``out`` recorded as its own
    (:data:`OUTPUTS_RECORD`). An evaluation by an older loopvae kept no record: its ``metrics.json`` identifies it,
    and its ``images/`` / ``npz/`` count only when they hold nothing but what eval writes there."""
    record = out / OUTPUTS_RECORD
    if record.is_file():
        try:
            names = json.loads(record.read_text())["outputs"]
            if not isinstance(names, list):
                raise TypeError("outputs is not a list")
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{record} is damaged ({one_line(err)}); it says which files of {out} an earlier "
                             "`loopvae eval` wrote: remove them and it, or choose another --out") from None
        return {n for n in names if n in OUTPUT_SET}
    try:
        old = json.loads((out / "metrics.json").read_text())
    except (OSError, ValueError):
        return set()
    if not (isinstance(old, dict) and {"psnr", "weights_sha256", "baseline"} <= set(old)):
        return set()
    return {n for n in OUTPUT_SET if _looks_written_by_eval(out / n, n)}


def remove_outputs(out: Path, names: Sequence[str], keep_log: bool = False) -> None:
    """Remove the entries ``names`` (of :data:`OUTPUT_SET`) from ``out``, metrics first, so a rerun never leaves
    a mix (``keep_log``: all but ``eval.log``, after a failed write). A symlink is removed, not followed."""
    for name in OUTPUT_SET:
        if name not in names or (keep_log and name == "eval.log"):
            continue
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def claim_outputs(out: Path, options: EvalOptions) -> list[str]:
    """Make ``out`` ready for an evaluation: refuse it when it holds an entry of :data:`OUTPUT_SET` that no earlier
    evaluation wrote (a user's ``images/``, ``report.md``, ...: eval never deletes those), remove the earlier
    evaluation's outputs, and record in :data:`OUTPUTS_RECORD` the entries this one writes (returned)."""
    owned = owned_outputs(out)
    present = [n for n in OUTPUT_SET if (out / n).exists() or (out / n).is_symlink()]
    foreign = [n for n in present if n not in owned]
    if foreign:
        shown = ", ".join(f"{n}/" if (out / n).is_dir() else n for n in foreign)
        raise FileExistsError(
            f"--out {out} already holds {shown}, which no earlier `loopvae eval` wrote there (no {OUTPUTS_RECORD} "
            f"names it) and which an evaluation would replace: choose another --out or move "
            f"{'it' if len(foreign) == 1 else 'them'} away")
    remove_outputs(out, present)
    names = [n for n in OUTPUT_SET if (n != "images" or options.save_images) and (n != "npz" or options.save_npz)]
    write_atomic(out / OUTPUTS_RECORD, json.dumps({"written_by": "loopvae eval", "outputs": names}, indent=1))
    return names


def eval_settings(options: EvalOptions, kind: str, device: str) -> dict[str, Any]:
    """Everything but the weights and the images that an evaluation's numbers depend on, recorded in
    ``metrics.json`` as ``settings`` (``loopvae compare`` reuses an evaluation only when they are the same).
    ``weights`` is ``ema`` / ``model`` for a training run directory (``kind`` ``run-checkpoint``), else
    ``release``; ``device`` the device type the evaluation ran on."""
    return {"resolution": options.resolution, "limit": options.limit, "batch_size": options.batch_size,
            "num_workers": options.num_workers, "skip_corrupt": options.skip_corrupt,
            "preprocess": options.preprocess, "lpips_net": options.lpips_net,
            "lpips_random_backbone": options.lpips_random_backbone,
            "weights": options.weights if kind == "run-checkpoint" else "release", "dtype": options.dtype,
            "memory_format": options.memory_format, "compile": options.compile, "device": device}


def evaluate(checkpoint: str | Path, data: str, out_dir: str | Path, options: EvalOptions) -> dict[str, Any]:
    """Evaluate and write ``metrics.json``, ``report.md``, ``grid.png`` (+ images) to ``out_dir``.

    A rerun replaces the set an earlier evaluation wrote (listed in :data:`OUTPUTS_RECORD`); entries of that set
    it did not write are never removed: the evaluation refuses to start (``FileExistsError``). Every file is
    written atomically. An unwritable ``out_dir`` (read-only, no permission) is an ``OutputWriteError`` naming it.
    Under torchrun a rank that fails stops the others promptly with its message.
    """
    if not Path(checkpoint).exists():  # before --out is created: a mistyped path or a Hub id leaves nothing behind
        from looprun.release import missing_artifact_message

        raise FileNotFoundError(missing_artifact_message(checkpoint, "tokenizer"))
    ctx = init_distributed(options.device)
    out = Path(out_dir)
    written: list[str] = []
    lock = None
    if ctx.is_main:
        prepare_output_dir(out, "--out")
        from looprun.run_lock import LOCK_NAME, RunLock

        fresh = not (out / LOCK_NAME).exists()
        lock = RunLock(out, "loopvae eval")  # a second eval (or compare) into this --out fails at once
        try:
            written = claim_outputs(out, options)
        except BaseException:  # refused: leave the folder exactly as it was
            lock.release()
            if fresh:
                (out / LOCK_NAME).unlink(missing_ok=True)
            raise
    setup_run_logging("loopvae", out, ctx.is_main, ctx.rank, log_file="eval.log")
    try:
        return _evaluate(checkpoint, data, out, options, ctx, written)
    finally:
        teardown_run_logging("loopvae")
        if lock is not None:
            lock.release()


def build_lpips(options: EvalOptions, device: torch.device) -> tuple[PerceptualLoss | None, str | None]:
    """``(metric, unavailable_reason)``: LPIPS per ``options``, ``None`` with the reason when skipped or
    when its backbone weights are missing (unless ``require_lpips``, which raises instead)."""
    if options.lpips_net == "none":
        return None, "LPIPS skipped (--lpips-net none)"
    try:
        model = PerceptualLoss(options.lpips_net, options.lpips_weights, options.lpips_random_backbone,
                               options_hint="pass --lpips-weights PATH, or --lpips-net none to skip LPIPS")
    except FileNotFoundError as err:
        if options.require_lpips:
            raise
        return None, f"{err} (pass --require-lpips to make this an error)"
    return model.to(device), None


def _evaluate(checkpoint: str | Path, data: str, out: Path, options: EvalOptions, ctx,
              written: Sequence[str] = OUTPUT_SET) -> dict[str, Any]:
    # what the images are (shard sizes and times, folder file lists), taken before they are read: a comparison
    # reuses this evaluation only while the data still has this identity
    identity = data_identity(canonical_urls(data)) if ctx.is_main else None
    loaded: LoadedTokenizer = load_tokenizer(checkpoint, options.weights)
    model = prepare_for_speed(to_compute(loaded.model, ctx.device, options.dtype), options.memory_format,
                              options.compile)
    lpips_model, lpips_reason = build_lpips(options, ctx.device)
    if lpips_reason and options.lpips_net != "none":
        log.warning("LPIPS unavailable: %s", lpips_reason)
    fid, fid_reason, fid_path = build_fid(options.fid_weights)
    if fid is None and options.require_fid:
        raise FileNotFoundError(fid_reason)
    if fid is None:
        log.warning("rFID unavailable: %s (pass --require-fid to make this an error)", fid_reason)
    else:
        fid = fid.to(ctx.device)
    vpp = latent_values_per_pixel(model)
    loader = loopdata.make_loader(
        data, task="reconstruction", train=False, batch_size=options.batch_size, num_workers=options.num_workers,
        resolution=options.resolution, rank=ctx.rank, world_size=ctx.world_size, skip_corrupt=options.skip_corrupt,
        preprocess=options.preprocess,
    )
    quota = _rank_limit(options.limit, ctx)
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []  # undecodable images met before the limit (--skip-corrupt)
    grid_ref, grid_rec = [], []
    npz: dict[str, list] | None = {"rec": [], "ref": [], "keys": []} if options.save_npz else None
    baseline_size = None
    error: BaseException | None = None
    try:
        baseline_size = _evaluate_batches(loader, model, lpips_model, fid, vpp, quota, options, out, ctx, rows,
                                          grid_ref, grid_rec, skipped, npz)
        if npz is not None:  # each rank's part; rank 0 merges them below
            (out / "npz").mkdir(parents=True, exist_ok=True)
            for kind in ("rec", "ref"):
                save_part(npz[kind], out / "npz" / f".part-{kind}-{ctx.rank:05d}.npy")
    except Exception as err:  # noqa: BLE001 - re-raised below, after telling the other ranks
        error = err
        if is_write_failure(err):  # --save-images on a full disk: no half-written image set stays
            shutil.rmtree(out / "images", ignore_errors=True)
            error = OutputWriteError(f"{write_failure(out / 'images', err)}; the partial images were removed: free "
                                     "space or drop --save-images, and rerun")
    raise_if_any_rank_failed(error, "evaluation", ctx)
    total = sum_across_ranks(len(rows), ctx)
    rfid = float(fid.compute()) if fid is not None and total > 1 else None  # compute() is a collective
    if fid is not None and rfid is None:
        fid_reason = "FID needs at least 2 images"
    all_rows = [r for part in gather_objects(rows, ctx) for r in part]
    seen: dict[tuple[str, str], int] = {}
    for r in all_rows:
        seen[(r["shard"], r["key"])] = seen.get((r["shard"], r["key"]), 0) + 1
    twice = [f"{key} ({shard})" for (shard, key), n in seen.items() if n > 1]
    if twice:
        raise RuntimeError(f"{len(twice)} image(s) were evaluated more than once across ranks: {twice[:5]}; "
                           "the evaluation split is broken")
    if not all_rows:
        raise ValueError(f"no images were evaluated from {data}")
    all_skipped = sorted((e for part in gather_objects(skipped, ctx) for e in part),
                         key=lambda e: (e["shard"], e["key"]))
    metrics = _summarise(all_rows, rfid, fid_reason, loaded, lpips_model, fid_path, options, data, baseline_size,
                         lpips_reason)
    metrics["data"]["identity"] = identity
    metrics["settings"] = eval_settings(options, loaded.kind, ctx.device.type)
    # counted like the evaluated images: those met before --limit, named with the reason
    metrics["skipped_corrupt"] = len(all_skipped)
    metrics["skipped"] = all_skipped
    if npz is not None:
        all_keys = [k for part in gather_objects(npz["keys"], ctx) for k in part]  # in rank order, as the parts
        if ctx.is_main:
            for kind, name in (("rec", "reconstructions.npz"), ("ref", "references.npz")):
                parts = [out / "npz" / f".part-{kind}-{r:05d}.npy" for r in range(ctx.world_size)]
                metrics.setdefault("npz", {})[name] = list(merge_parts(parts, out / "npz" / name))
            write_keys(out / "npz" / "keys.json", all_keys)
    if ctx.is_main:
        try:
            _write_outputs(out, all_rows, metrics, grid_ref, grid_rec)
        except OutputWriteError:
            remove_outputs(out, written, keep_log=True)  # nothing half-written: the set is complete or absent
            raise
    return metrics


def _write_outputs(out: Path, all_rows: list[dict[str, Any]], metrics: dict[str, Any], grid_ref: list,
                   grid_rec: list) -> None:
    """per_image.json, grid.png, report.md, then metrics.json (last: its presence means the set is complete)."""
    write_atomic(out / "per_image.json", json.dumps(all_rows, indent=2, allow_nan=False))
    if grid_ref:
        grid = torchvision.utils.make_grid(torch.stack(grid_ref + grid_rec), nrow=len(grid_ref))
        _save_png(grid, out / "grid.png")
    write_atomic(out / "report.md", render_report(metrics, has_grid=bool(grid_ref)))
    write_atomic(out / "metrics.json", json.dumps(metrics, indent=2, allow_nan=False))


def _evaluate_batches(loader, model, lpips_model, fid, vpp, quota, options, out, ctx, rows, grid_ref, grid_rec,
                      skipped, npz=None):
    """The per-batch loop of :func:`evaluate` (no collectives: ranks may run different batch counts)."""
    baseline_size = None
    total = len(loader) if quota is None else min(len(loader), -(-quota // options.batch_size))
    bar = tqdm(total=total, desc="eval", unit="batch", disable=not (options.progress and ctx.is_main),
               dynamic_ncols=True)
    for batch in loader:
        bar.update(1)
        peer = reported_failure(ctx)
        if peer is not None:
            raise RemoteRankError(f"stopping: another rank failed ({peer})")
        images, keys, shards = batch["image"], list(batch["key"]), list(batch["shard"])
        room = None if quota is None else quota - len(rows)
        if room is not None and room <= 0:
            break
        # a skipped sample counts when it came before the last image evaluated (or the limit is not reached)
        taken = len(keys) if room is None else min(room, len(keys))
        skipped.extend({k: e[k] for k in ("key", "shard", "reason")} for e in batch.get("skipped", [])
                       if e["after"] < taken or (e["after"] == taken and (room is None or room > taken)))
        if room is not None:
            images, keys, shards = images[:room], keys[:room], shards[:room]
        if not keys:
            continue
        images = images.to(ctx.device)
        recon = reconstruct(model, images, options.memory_format)
        ref_u8, rec_u8 = to_uint8(images), to_uint8(recon)
        psnr, ssim = psnr_per_image(rec_u8, ref_u8), ssim_per_image(rec_u8, ref_u8)
        lp = (lpips_model(rec_u8.float() / 127.5 - 1, ref_u8.float() / 127.5 - 1) if lpips_model is not None
              else [None] * len(keys))
        bic, baseline_size = bicubic_baseline(images, vpp)
        bic_u8 = to_uint8(bic)
        bic_psnr, bic_ssim = psnr_per_image(bic_u8, ref_u8), ssim_per_image(bic_u8, ref_u8)
        if fid is not None:
            fid.update(ref_u8, real=True)
            fid.update(rec_u8, real=False)
        for i, key in enumerate(keys):
            rows.append({"key": key, "shard": shards[i], "psnr": float(psnr[i]), "ssim": float(ssim[i]),
                         "lpips": None if lp[i] is None else float(lp[i]),
                         "bicubic_psnr": float(bic_psnr[i]), "bicubic_ssim": float(bic_ssim[i])})
        if options.save_images:
            for i, key in enumerate(keys):
                for kind, array in (("reconstruction", rec_u8[i]), ("reference", ref_u8[i])):
                    # one folder per shard: two shard sets may share a key (kodak-val and kodak-full)
                    folder = out / "images" / kind / shard_folder(shards[i])
                    path = path_for_key(folder, key, ".png")  # never outside --out
                    path.parent.mkdir(parents=True, exist_ok=True)
                    _save_png(array, path)
        if npz is not None:
            npz["rec"].append(rec_u8.permute(0, 2, 3, 1).cpu().numpy())
            npz["ref"].append(ref_u8.permute(0, 2, 3, 1).cpu().numpy())
            npz["keys"].extend(zip(shards, keys))
        if len(grid_ref) < options.grid_images:
            grid_ref.extend(ref_u8[: options.grid_images - len(grid_ref)].cpu())
            grid_rec.extend(rec_u8[: options.grid_images - len(grid_rec)].cpu())
    bar.close()
    return baseline_size


def shard_folder(url: str) -> str:
    """The folder name of a shard's saved images: its file name without ``.tar`` (e.g. ``kodak-val-000000``)."""
    import re

    name = url.rstrip("/").rsplit("/", 1)[-1]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", name[: -len(".tar")] if name.endswith(".tar") else name)
    return name if name.strip(".") else "shard"


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


PUBLISHED_RFID_IMAGES = 50_000  # ImageNet val: the set published rFID figures are computed on


def rfid_sample_warning(num_images: int) -> str:
    """Why an rFID from ``num_images`` (< 50,000) images is not comparable with published figures."""
    return (f"rFID from {num_images:,} images, not the 50,000 ImageNet validation images published figures use: "
            "FID is biased upwards on small samples (the bias shrinks with the image count), so this number is "
            "comparable only with rFIDs computed on the same images, never with a paper's")


def _summarise(rows, rfid, fid_reason, loaded, lpips_model, fid_path, options, data, baseline_size,
               lpips_reason=None) -> dict[str, Any]:
    from looprun.checkpoint import sha256_file

    weights = {f"model/{k}": v for k, v in loaded.weights_sha256.items()}
    if lpips_model is not None and lpips_model.weights_sha256:
        weights[f"lpips/{lpips_model.weights_path.name}"] = lpips_model.weights_sha256
    if fid_path is not None:
        weights[f"inception/{fid_path.name}"] = sha256_file(fid_path)
    metrics: dict[str, Any] = {
        "psnr": _mean(rows, "psnr"), "ssim": _mean(rows, "ssim"),
        "lpips": None if lpips_model is None else _mean(rows, "lpips"), "rfid": rfid,
        "num_images": len(rows),
        "model": {"source": loaded.source, "kind": loaded.kind, "class": type(loaded.model).__name__,
                  "step": loaded.step, "weights": options.weights if loaded.kind == "run-checkpoint" else "release",
                  "dtype": options.dtype},
        "data": {"urls": data, "resolution": options.resolution, "limit": options.limit},
        # how the references were made (comparable numbers need the same crop and decode)
        "preprocessing": describe_preprocessing(make_options("reconstruction", preprocess=options.preprocess),
                                                options.resolution),
        "lpips_net": options.lpips_net + (" (random backbone: not LPIPS)" if options.lpips_random_backbone else ""),
        "weights_sha256": weights,
        "baseline": {
            "name": "bicubic down/up-sampling",
            "low_resolution": list(baseline_size) if baseline_size else None,
            "psnr": _mean(rows, "bicubic_psnr"), "ssim": _mean(rows, "bicubic_ssim"),
        },
    }
    if rfid is None:
        metrics["rfid_unavailable_reason"] = fid_reason
    elif len(rows) < PUBLISHED_RFID_IMAGES:
        metrics["rfid_warning"] = rfid_sample_warning(len(rows))
    if lpips_model is None:
        metrics["lpips_unavailable_reason"] = lpips_reason or "LPIPS skipped (--lpips-net none)"
    return metrics


def render_report(metrics: dict[str, Any], has_grid: bool = True) -> str:
    """Markdown summary of :func:`evaluate`'s metrics."""
    rfid = "n/a" if metrics["rfid"] is None else f"{metrics['rfid']:.3f}"
    lpips = "n/a" if metrics["lpips"] is None else f"{metrics['lpips']:.4f}"
    base = metrics["baseline"]
    lines = [
        "# Tokenizer evaluation", "",
        f"Model: `{metrics['model']['source']}` ({metrics['model']['class']}, {metrics['model']['kind']})  ",
        f"Data: `{metrics['data']['urls']}` at {metrics['data']['resolution']}², {metrics['num_images']} images "
        f"evaluated" + (f", {metrics['skipped_corrupt']} skipped as undecodable (listed below)"
                        if metrics.get("skipped_corrupt") else "") + "  ",
        f"LPIPS net: {metrics['lpips_net']}", "",
        "| method | rFID | PSNR (dB) | SSIM | LPIPS |", "|---|---:|---:|---:|---:|",
        f"| tokenizer | {rfid} | {metrics['psnr']:.2f} | {metrics['ssim']:.4f} | {lpips} |",
        f"| {base['name']} via {base['low_resolution'][0]}×{base['low_resolution'][1]} | – | {base['psnr']:.2f} | "
        f"{base['ssim']:.4f} | – |",
        "",
    ]
    if metrics["rfid"] is None:
        lines += [f"rFID unavailable: {metrics['rfid_unavailable_reason']}", ""]
    elif metrics.get("rfid_warning"):
        lines += [f"**Warning:** {metrics['rfid_warning']}.", ""]
    pre = metrics.get("preprocessing", {})
    lines += ["Protocol: posterior mode, reconstructions clamped and quantised to uint8; PSNR = mean of per-image "
              "PSNR (capped at 120 dB); SSIM Gaussian 11×11, σ=1.5; the bicubic baseline keeps at least as many "
              "values per pixel as the latent. References: "
              f"`{pre.get('method', 'resize-crop')}` ({pre.get('resample', '')}, centre crop), JPEG draft decoding "
              f"{'on' if pre.get('jpeg_draft') else 'off'}.", ""]
    if metrics.get("skipped"):
        lines += ["Skipped (undecodable, `--skip-corrupt`):", ""]
        lines += [f"- `{e['key']}` in `{e['shard']}`: {e['reason']}" for e in metrics["skipped"]] + [""]
    if has_grid:
        lines += ["![references (top) and reconstructions (bottom)](grid.png)", ""]
    return "\n".join(lines)
