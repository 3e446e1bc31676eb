"""``loopvae encode``: a data set's latents as WebDataset shards, the hand-off to latent-diffusion training.

What DiT's / LightningDiT's ``extract_features`` step does, for any loopvae tokenizer: every image is
resized (shorter side) and centre-cropped to ``resolution`` as ``loopvae eval`` does, encoded, and its
posterior mean (or, with ``sample``, one posterior sample seeded by the image key) written as
``<key>.latent.npy``; with ``flip`` the horizontally flipped image's latent too (``.latent_flip.npy``).
The source sample's other members (``.cls``, ``.json``, ...) are copied unchanged. Format and reader:
:mod:`loopdata.latents`.

Input shard ``i`` (in the order ``--data`` expands to) becomes ``latents-<i>.tar``; under torchrun rank
``r`` of ``W`` encodes the shards with ``i % W == r``, so every image is encoded exactly once. A shard
is written to a temporary name and renamed when complete, so a rerun skips finished shards and redoes
interrupted ones (resumable). ``latents.json`` (written last, by rank 0) records the tokenizer, the
preprocessing, the latent normalisation and each output shard's sample count; it is checked against the
input counts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from loopdata.decode import DecodeError, decode_image
from loopdata.folders import is_folder_url, parse_folder_url
from loopdata.identity import first_difference, source_identity
from loopdata.latents import FLIP_EXT, LATENT_EXT, METADATA_NAME, npy_bytes
from loopdata.shards import expand_urls, file_digest, image_member, iter_samples, shard_counts
from loopdata.transforms import build_transforms, describe_preprocessing, make_options
from loopdata.writer import TarShardWriter
from looprun.checkpoint import OutputWriteError, is_write_failure, write_atomic, write_failure
from looprun.distributed import (
    RemoteRankError,
    barrier,
    gather_objects,
    init_distributed,
    raise_if_any_rank_failed,
    reported_failure,
)
from looprun.output_dir import prepare_output_dir
from looprun.run_lock import RunLock

from .autoencoders import check_resolution, encode_mode, has_posterior
from .loading import load_tokenizer

log = logging.getLogger("loopvae")


@dataclass
class EncodeOptions:
    """Options of :func:`encode_dataset` (the ``loopvae encode`` flags)."""

    resolution: int = 256
    batch_size: int = 16
    sample: bool = False  # a posterior sample (seeded by the image key) instead of the mean
    flip: bool = False  # also the horizontally flipped image's latent
    dtype: str = "float32"  # of the stored latents: float32 | float16
    weights: str = "ema"
    device: str = "auto"
    skip_corrupt: bool = False  # skip (and list) undecodable images instead of failing
    preprocess: str = "resize-crop"  # or "adm" (ADM's center_crop_arr); JPEGs are decoded fully
    moments: bool = False  # store the posterior's mean and log-variance (2C, h, w); the reader samples per access


def output_name(index: int) -> str:
    return f"latents-{index:06d}.tar"


def shard_key(key: str) -> str:
    """A key the shard writer takes (no ``.`` or ``/``): source keys with sub-folders become ``a_b``."""
    return key.replace("/", "_").replace(".", "_")


def run_identity(loaded, options: EncodeOptions) -> dict[str, Any]:
    """What an output shard depends on: the tokenizer's weights and the options that change the latents. A
    rerun into the same folder reuses a finished shard only when these are equal."""
    return {"weights_sha256": loaded.weights_sha256, "resolution": options.resolution, "sample": options.sample,
            "flip": options.flip, "dtype": options.dtype, "weights": options.weights,
            "preprocess": options.preprocess, "moments": options.moments}


def _key_generator(key: str, device: torch.device) -> torch.Generator:
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
    return torch.Generator(device=device).manual_seed(seed)


def _latents(model: torch.nn.Module, images: torch.Tensor, keys: list[str], sample: bool,
             moments: bool = False) -> torch.Tensor:
    if not has_posterior(model):  # a deterministic autoencoder: its latent is the mean and the only sample
        return encode_mode(model, images)
    dist = model.encode(images).latent_dist
    if moments:  # MAR / REPA style: cache the distribution, sample at training time
        return torch.cat([dist.mean, dist.logvar], dim=1)
    if not sample:
        return dist.mean
    # one generator per image: the same key gets the same sample whatever the batch or rank
    noise = torch.stack([torch.randn(dist.mean.shape[1:], generator=_key_generator(k, images.device),
                                     device=images.device) for k in keys])
    return dist.mean + dist.std * noise


@torch.no_grad()
def encode_shard(url: str, target: Path, model: torch.nn.Module, options: EncodeOptions,
                 device: torch.device, identity: dict[str, Any] | None = None, ctx=None) -> dict[str, Any]:
    """Encode one input shard into ``target`` (written under a temporary name, then renamed)."""
    source = source_identity(url)  # taken before reading: a file changed meanwhile makes the next run redo this shard
    transforms = build_transforms("reconstruction", False, options.resolution,
                                  make_options("reconstruction", preprocess=options.preprocess))
    dtype = {"float32": np.float32, "float16": np.float16}[options.dtype]
    tmp = target.parent / f".tmp-{target.stem}"
    shutil.rmtree(tmp, ignore_errors=True)
    skipped: list[str] = []
    count = 0
    shape = None
    pending: list[tuple[str, torch.Tensor, dict[str, bytes]]] = []
    sources: dict[str, str] = {}  # output key -> the input key it came from (sanitising may merge two keys)

    def flush(writer: TarShardWriter) -> None:
        nonlocal count, shape
        keys = [k for k, _, _ in pending]
        images = transforms.normalize(torch.stack([img for _, img, _ in pending])).to(device)
        z = _latents(model, images, keys, options.sample, options.moments).float().cpu().numpy().astype(dtype)
        zf = (_latents(model, torch.flip(images, dims=[-1]), [f"{k}/flip" for k in keys], options.sample,
                       options.moments).float().cpu().numpy().astype(dtype) if options.flip else None)
        # the latent a model sees: moments hold 2C channels (mean, log-variance) for C latent channels
        shape = [z.shape[1] // 2, *z.shape[2:]] if options.moments else list(z.shape[1:])
        for i, (key, _, rest) in enumerate(pending):
            members = dict(rest)
            if shard_key(key) != key:
                members["source_key.txt"] = key.encode()
            members[LATENT_EXT] = npy_bytes(z[i])
            if zf is not None:
                members[FLIP_EXT] = npy_bytes(zf[i])
            writer.add(shard_key(key), members)
        count += len(pending)
        pending.clear()

    try:
        with TarShardWriter(tmp, "part", max_count=10**9, max_size=2**62) as writer:
            for sample in iter_samples(url):
                if ctx is not None and reported_failure(ctx) is not None:
                    raise RemoteRankError(f"stopped: {reported_failure(ctx)}")
                key = sample["__key__"]
                ext = image_member(sample)
                try:
                    if ext is None:
                        raise DecodeError(f"no image member (members: {sorted(k for k in sample if k[0] != '_')})")
                    image = transforms.sample(decode_image(sample[ext], transforms.draft_size,
                                                           resize_side=transforms.resize_side))
                except DecodeError as err:
                    if not options.skip_corrupt:
                        raise DecodeError(f"{url}: sample {key!r}: {err} (pass --skip-corrupt to skip and list it)") \
                            from None
                    log.warning("%s: skipping %r: %s", url, key, err)
                    skipped.append(f"{url}#{key}")
                    continue
                rest = {k: v for k, v in sample.items() if not k.startswith("__") and k != ext}
                out_key = shard_key(key)
                if out_key in sources:
                    raise ValueError(f"{url}: samples {sources[out_key]!r} and {key!r} both become the key {out_key!r} "
                                     "in the latent shard ('/' and '.' turn into '_'); rename one of them in the input")
                sources[out_key] = key
                pending.append((key, image, rest))
                if len(pending) == options.batch_size:
                    flush(writer)
            if pending:
                flush(writer)
        parts = list(tmp.glob("part-*.tar"))
        if count == 0:  # every image of the shard was skipped (--skip-corrupt): an empty shard keeps the numbering
            tmp.mkdir(parents=True, exist_ok=True)
            part = tmp / "part-000000.tar"
            tarfile.open(part, "w").close()
        else:
            (part,) = parts
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed shard leaves no partial files behind
        if is_write_failure(err):
            raise OutputWriteError(f"{write_failure(target, err)}; the partial shard was removed and the finished "
                                   "ones are kept: free space and rerun the same command to resume") from err
        raise
    record = {"input": url, "output": target.name, "count": count, "skipped": skipped, "latent_shape": shape,
              "sha256": file_digest(part)[1], "source": source, **(identity or {})}
    # The record goes down before the shard's rename: a shard that exists always has its record.
    write_atomic(_record_path(target), json.dumps(record, allow_nan=False))
    os.replace(part, target)
    shutil.rmtree(tmp, ignore_errors=True)
    return record


def remove_stale_temporaries(out: Path) -> list[Path]:
    """Delete what a killed earlier run left in ``out``: ``.tmp-latents-*`` folders and ``.<file>.tmp-<pid>`` files
    of processes that no longer run (a live process's files are kept). Returns what was removed."""
    removed = []
    for path in out.glob(".*"):
        pid = path.name.rsplit(".tmp-", 1)[1] if ".tmp-" in path.name else None
        if path.name.startswith(".tmp-latents-"):
            shutil.rmtree(path, ignore_errors=True)
        elif pid and pid.isdigit() and not _alive(int(pid)):
            path.unlink(missing_ok=True)
        else:
            continue
        removed.append(path)
    if removed:
        log.info("removed %d temporary file(s) of an earlier, killed run: %s", len(removed),
                 [p.name for p in removed[:5]])
    return removed


def remove_outputs_beyond(out: Path, count: int) -> list[str]:
    """Delete the latent shards (and their records) of an earlier run whose input no longer exists (the data now
    has ``count`` shards or folder chunks): a latent set holds only what its latents.json lists."""
    removed = []
    for path in sorted(out.glob("latents-*.tar")):
        index = path.stem.rsplit("-", 1)[-1]
        if index.isdigit() and int(index) >= count:
            path.unlink()
            _record_path(path).unlink(missing_ok=True)
            removed.append(path.name)
    if removed:
        log.info("removed %d latent shard(s) of inputs that no longer exist: %s", len(removed), removed[:5])
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _record_path(target: Path) -> Path:
    return target.with_name(target.name + ".json")


def _same_chunk(recorded: Any, url: str) -> bool:
    """Whether ``recorded`` and ``url`` are the same chunk of the same image folder whose image count changed
    (``folder:D#0-3`` then, ``folder:D#0-4`` now: an image was added): the chunk is re-encoded, not refused."""
    if not (isinstance(recorded, str) and is_folder_url(recorded) and is_folder_url(url)):
        return False
    try:
        (old_root, old_start, _), (root, start, _) = parse_folder_url(recorded), parse_folder_url(url)
    except ValueError:
        return False
    return (old_root, old_start) == (root, start)


def _finished_shard(target: Path, url: str, identity: dict[str, Any]) -> dict[str, Any] | None:
    """The record of a complete output of an earlier run for the same input and settings, or ``None`` (to be
    (re)done); a finished shard made from other data, weights or options is an error, never silently reused."""
    if not (target.is_file() and _record_path(target).is_file()):
        return None
    record = _read_record(target)
    if record is None:
        return None
    if record.get("input") != url and _same_chunk(record.get("input"), url):
        log.info("%s: its folder chunk now holds other images (%s then, %s now); encoding it again", target.name,
                 record.get("input"), url)
        return None
    if record.get("input") != url:
        raise ValueError(f"{target} was encoded from {record.get('input')}, not {url}: --data changed since the "
                         "earlier run; use a new --out")
    # the same input URL may now hold other files (a folder chunk after a rename, an added or deleted image, a
    # rewritten shard): such a shard is encoded again, never reused
    source = source_identity(url)
    difference = ("it records no input identity (written by an older loopvae encode)" if "source" not in record
                  else first_difference(record["source"], source))
    if difference is not None:
        log.info("%s: its input changed since it was encoded (%s); encoding it again", target.name, difference)
        return None
    changed = sorted(k for k, v in identity.items() if record.get(k) != v)
    if changed:
        raise ValueError(f"{target} was encoded with other {', '.join(changed)} ("
                         + ", ".join(f"{k}: {record.get(k)!r} then, {identity[k]!r} now" for k in changed)
                         + "); use a new --out or the earlier settings")
    damage = _shard_damage(target, record)
    if damage is not None:
        log.warning("%s: %s since it was written; encoding it again", target.name, damage)
        return None
    return {**record, "resumed": True}


def _read_record(target: Path) -> dict[str, Any] | None:
    """The ``<shard>.json`` record of a finished shard, or ``None`` (with a warning naming the file, so that the
    shard is encoded again) when it is unreadable or lacks what a record holds."""
    path = _record_path(target)
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        log.warning("%s is unreadable (%s); encoding %s again", path, err, target.name)
        return None
    problem = None
    skipped = record.get("skipped", []) if isinstance(record, dict) else []
    if not isinstance(record, dict):
        problem = f"holds a {type(record).__name__}, not a mapping"
    elif not (isinstance(record.get("count"), int) and not isinstance(record["count"], bool) and record["count"] >= 0):
        problem = f"has no valid count ({record.get('count')!r})"
    elif not isinstance(skipped, list) or not all(isinstance(k, str) for k in skipped):
        problem = "has no valid list of skipped samples"
    elif not (isinstance(record.get("sha256"), str) and len(record["sha256"]) == 64):
        problem = f"has no valid sha256 ({record.get('sha256')!r:.80})"
    if problem is not None:
        log.warning("%s %s; encoding %s again", path, problem, target.name)
        return None
    return record


def _shard_damage(target: Path, record: dict[str, Any]) -> str | None:
    """How the finished shard ``target`` disagrees with its record (checksum, or sample count), or ``None``."""
    size, digest = file_digest(target)
    if digest != record["sha256"]:
        return f"its sha256 is {digest[:12]}... ({size} bytes), its record says {record['sha256'][:12]}...: it changed"
    try:
        with tarfile.open(target) as tar:
            keys = {name.split(".", 1)[0] for name in tar.getnames()}
    except (tarfile.TarError, OSError) as err:
        return f"it is not a readable tar ({err})"
    if len(keys) != record["count"]:
        return f"it holds {len(keys)} samples, its record {_record_path(target).name} says {record['count']}"
    return None


def encode_dataset(checkpoint: str | Path, data: str, out_dir: str | Path, options: EncodeOptions,
                   held_lock: RunLock | None = None) -> dict[str, Any]:
    """Encode every image of ``data`` into latent shards in ``out_dir`` and write ``latents.json``.

    Returns the metadata. Under torchrun every rank encodes its own input shards (``i % world_size ==
    rank``); rank 0 writes the metadata after all ranks finished and checks the sample counts. ``held_lock``:
    ``out``'s run lock, already taken by the caller (the command line takes it before its heavy imports).
    """
    ctx = init_distributed(options.device)
    out = Path(out_dir)
    # an existing --out is locked before anything is loaded: a second encode into a busy folder fails at once,
    # while the first is still running (a new --out is created and locked only after the checks below)
    early = held_lock
    if early is None and ctx.is_main and out.is_dir() and os.access(out, os.W_OK):
        early = RunLock(out, "loopvae encode")
    try:
        return _encode_checked(ctx, checkpoint, data, out, options, early)
    finally:
        if early is not None and held_lock is None:  # a lock the caller holds is the caller's to release
            early.release()


def _encode_checked(ctx, checkpoint: str | Path, data: str, out: Path, options: EncodeOptions,
                    early: RunLock | None) -> dict[str, Any]:
    """:func:`encode_dataset` after an existing ``out`` was locked (``early``)."""
    # the checkpoint and the data are checked before --out is created: a failed start leaves nothing behind
    loaded = load_tokenizer(checkpoint, options.weights)
    model = loaded.model.to(ctx.device).eval()
    check_resolution(model, options.resolution)
    urls = expand_urls(data)
    if not urls:
        raise ValueError(f"--data {data!r} names no shards or images")
    if options.moments and (options.sample or not has_posterior(model)):
        raise ValueError("--moments stores the posterior's mean and log-variance for sampling at training time: "
                         + ("drop --sample (the reader draws the samples)" if options.sample else
                            f"a {type(model).__name__} has no posterior (its latent is deterministic); drop --moments"))
    lock = None
    if ctx.is_main and early is None:
        prepare_output_dir(out)  # a read-only or full --out: one line, not a traceback
        lock = RunLock(out, "loopvae encode")  # one encode per --out: a second one would delete our temporaries
    try:
        return _encode_locked(ctx, loaded, model, data, urls, out, options)
    finally:
        if lock is not None:
            lock.release()


def _encode_locked(ctx, loaded, model: torch.nn.Module, data: str, urls: list[str], out: Path,
                   options: EncodeOptions) -> dict[str, Any]:
    """:func:`encode_dataset` once the main rank holds ``out``'s lock."""
    if ctx.is_main:
        remove_stale_temporaries(out)
    barrier(ctx)  # no rank starts a shard while rank 0 is still cleaning up
    started = time.perf_counter()
    identity = run_identity(loaded, options)
    records = []
    error: BaseException | None = None
    try:
        for index, url in enumerate(urls):
            if index % ctx.world_size != ctx.rank:
                continue
            target = out / output_name(index)
            done = _finished_shard(target, url, identity)
            if done is not None:
                log.info("%s: already encoded (%d samples), skipped", target.name, done["count"])
                records.append(done)
                continue
            record = encode_shard(url, target, model, options, ctx.device, identity, ctx)
            log.info("%s -> %s: %d latents", url, target.name, record["count"])
            records.append(record)
    except Exception as err:  # noqa: BLE001 - re-raised below, after telling the other ranks
        error = err
    raise_if_any_rank_failed(error, "encoding", ctx)
    all_records = sorted((r for part in gather_objects(records, ctx) for r in part), key=lambda r: r["output"])
    if sum(r["count"] for r in all_records) == 0:  # on every rank, so none waits for the others
        skipped = [s for r in all_records for s in r.get("skipped", [])]
        raise ValueError(f"no image of {data} could be encoded ({len(skipped)} skipped as undecodable, e.g. "
                         f"{skipped[:3]}); no {METADATA_NAME} written to {out}")
    meta: dict[str, Any] = {}
    if ctx.is_main:
        remove_outputs_beyond(out, len(urls))
        meta = _metadata(loaded, model, data, urls, all_records, options, time.perf_counter() - started, out)
        write_atomic(out / METADATA_NAME, json.dumps(meta, indent=2, allow_nan=False))
    barrier(ctx)
    return meta if ctx.is_main else json.loads((out / METADATA_NAME).read_text())


def _metadata(loaded, model, data: str, urls: list[str], records: list[dict[str, Any]], options: EncodeOptions,
              seconds: float, out_dir: Path) -> dict[str, Any]:
    expected = dict(zip(urls, shard_counts(urls), strict=True))
    skipped = [s for r in records for s in r.get("skipped", [])]
    written = sum(r["count"] for r in records)
    if written + len(skipped) != sum(expected.values()):
        raise RuntimeError(f"encoded {written} + skipped {len(skipped)} samples, but the input holds "
                           f"{sum(expected.values())}: the split over ranks is broken")
    for r in records:
        if r["count"] > expected[r["input"]]:
            raise RuntimeError(f"{r['output']} holds {r['count']} latents, more than the {expected[r['input']]} "
                               f"images of {r['input']}")
    config = getattr(model, "config", {})
    shapes = {tuple(r["latent_shape"]) for r in records if r.get("latent_shape")}
    if len(shapes) > 1:
        raise RuntimeError(f"the shards hold latents of different shapes {sorted(shapes)}")
    shape = list(shapes.pop()) if shapes else None
    return {
        "format": "loopvision latent shards v1", "tokenizer": loaded.source, "tokenizer_kind": loaded.kind,
        "tokenizer_class": type(model).__name__, "weights_sha256": loaded.weights_sha256,
        "data": data, "num_samples": written, "skipped": skipped, "latent_shape": shape,
        "posterior": "moments" if options.moments else "sample" if options.sample else "mean", "flip": options.flip,
        # with moments each member holds [mean; log-variance] (2C, h, w); readers draw z = mean + std * eps
        "moments": options.moments,
        "scaling_factor": float(config.get("scaling_factor", 1.0) or 1.0),
        "shift_factor": float(config.get("shift_factor", 0.0) or 0.0),
        "latents_mean": config.get("latents_mean"), "latents_std": config.get("latents_std"),
        "shards": [r["output"] for r in records], "shard_counts": [r["count"] for r in records],
        # checked by the latent reader with verify=True (and by `loopdata check` on the folder)
        "shard_sha256": {r["output"]: r.get("sha256") or file_digest(Path(out_dir) / r["output"])[1]
                         for r in records},
        "resumed_shards": [r["output"] for r in records if r.get("resumed")],
        "inputs": {r["output"]: r["input"] for r in records},
        # what each shard was made from (a folder chunk's files with size and mtime; a shard's size and mtime)
        # (compact: a folder chunk's file list as a digest; each shard's .json record keeps the full list)
        "sources": {r["output"]: {k: v for k, v in (r.get("source") or {}).items() if k != "files"}
                    for r in records},
        "options": asdict(options), "seconds": round(seconds, 2), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "preprocessing": describe_preprocessing(make_options("reconstruction", preprocess=options.preprocess),
                                                options.resolution),
    }
