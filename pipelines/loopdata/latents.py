"""Latent shards: what ``loopvae encode`` writes and a latent-diffusion trainer reads.

A latent shard set is a directory of WebDataset shards plus ``latents.json``. Each sample holds
``<key>.latent.npy`` (the tokenizer's posterior mean, or one posterior sample, ``(C, h, w)`` float32 or
float16), optionally ``<key>.latent_flip.npy`` (the same for the horizontally flipped image), and the
source sample's other non-image members unchanged (``.cls``, ``.json``, ...). ``latents.json`` records
the tokenizer, the preprocessing and the normalisation a diffusion model trains with:

* per-channel ``latents_mean`` / ``latents_std`` when the tokenizer has them:
  ``z_model = (z - mean_c) * scaling_factor / std_c`` (diffusers' convention);
* otherwise ``shift_factor`` / ``scaling_factor``: ``z_model = (z - shift) * scale`` (SD3 / FLUX).

:class:`LatentDataset` yields normalised latents for training (shards split across ranks and
workers, shuffled per epoch, a random choice between the latent and its flip) or every sample exactly
once, in order, for evaluation; :func:`denormalize` undoes the normalisation before ``vae.decode``.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .distributed import slot_range
from .shards import expand_urls, iter_samples, shard_counts

LATENT_EXT = "latent.npy"
FLIP_EXT = "latent_flip.npy"
METADATA_NAME = "latents.json"


def npy_bytes(array: np.ndarray) -> bytes:
    """``np.save`` of ``array`` into bytes (what a ``.npy`` tar member holds)."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def load_npy(data: bytes, where: str) -> np.ndarray:
    """The array of a ``.npy`` member; a clear error naming ``where`` for anything else."""
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise ValueError(f"{where}: not a readable .npy latent ({err})") from None


@dataclass(frozen=True)
class LatentNormalization:
    """``z_model = (z - shift) * scale`` per channel (``shift``/``scale`` broadcast over ``(C, h, w)``)."""

    shift: torch.Tensor  # (C, 1, 1)
    scale: torch.Tensor  # (C, 1, 1)

    @classmethod
    def from_metadata(cls, meta: dict[str, Any], where: str = METADATA_NAME) -> LatentNormalization:
        """From ``latents.json``'s fields (checked: numbers, ``latents_std`` > 0, one entry per channel)."""
        shape = meta.get("latent_shape")
        if not (isinstance(shape, list) and len(shape) == 3 and all(isinstance(n, int) and n > 0 for n in shape)):
            raise ValueError(f"{where}: latent_shape is {shape!r}; expected [channels, height, width] (positive "
                             "integers), as loopvae encode writes it")
        channels = shape[0]
        scaling = _number(meta, "scaling_factor", 1.0, where)
        if scaling == 0:
            raise ValueError(f"{where}: scaling_factor is 0; the latents would all become 0")
        mean, std = meta.get("latents_mean"), meta.get("latents_std")
        if mean is not None and std is not None:
            for name, values in (("latents_mean", mean), ("latents_std", std)):
                if not isinstance(values, list) or len(values) != channels:
                    raise ValueError(f"{where}: {name} needs {channels} entries (one per latent channel), got "
                                     f"{values!r}")
                _numbers(values, name, where)
            bad = [(c, v) for c, v in enumerate(std) if not v > 0]
            if bad:
                raise ValueError(f"{where}: latents_std must be > 0 in every channel; channel {bad[0][0]} is "
                                 f"{bad[0][1]!r} (it would divide the latents by zero or flip their sign)")
            shift = torch.tensor(mean, dtype=torch.float32)
            scale = scaling / torch.tensor(std, dtype=torch.float32)
        else:
            shift = torch.full((channels,), _number(meta, "shift_factor", 0.0, where))
            scale = torch.full((channels,), scaling)
        return cls(shift.view(-1, 1, 1), scale.view(-1, 1, 1))

    def normalize(self, z: torch.Tensor) -> torch.Tensor:
        """``(..., C, h, w)`` tokenizer latents -> what the diffusion model sees."""
        return (z - self.shift) * self.scale

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`normalize`: diffusion-model latents -> ``vae.decode`` input."""
        return z / self.scale.to(z) + self.shift.to(z)


def _number(meta: dict[str, Any], key: str, default: float, where: str) -> float:
    value = meta.get(key, default)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) == float("inf"):
        raise ValueError(f"{where}: {key} is {value!r}; expected a finite number")
    return float(value)


def _numbers(values: list[Any], key: str, where: str) -> None:
    for c, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or abs(v) == float("inf"):
            raise ValueError(f"{where}: {key}[{c}] is {v!r}; expected a finite number")


def read_metadata(source: str | Path) -> dict[str, Any]:
    """``latents.json`` of a latent shard directory (``source`` is the directory or one of its shards), checked:
    valid JSON, the fields a reader needs (``shards``, ``shard_counts``, ``latent_shape``, the normalisation) of
    the right types, and at least one latent. Every error names the file, the key and the value."""
    path = Path(source)
    folder = path if path.is_dir() else path.parent
    meta_path = folder / METADATA_NAME
    if not meta_path.is_file():
        raise FileNotFoundError(f"{meta_path}: no latent metadata; latent shards are written by `loopvae encode`")
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{meta_path}: not valid JSON ({err}); rerun `loopvae encode` into a new --out") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{meta_path}: expected a JSON object, got {type(meta).__name__}")
    for key in ("shards", "latent_shape"):
        if key not in meta:
            raise ValueError(f"{meta_path}: no {key!r} entry; it is not a complete `loopvae encode` output")
    shards, counts = meta["shards"], meta.get("shard_counts")
    if not isinstance(shards, list) or not all(isinstance(n, str) and n for n in shards):
        raise ValueError(f"{meta_path}: shards is {shards!r}; expected a list of shard file names")
    outside = [n for n in shards if n in (".", "..") or "/" in n or "\0" in n]
    if outside:
        raise ValueError(f"{meta_path}: shards lists {outside[0]!r}, which is not a plain file name in the folder: a "
                         "latent set's shards live next to its latents.json (no paths); fix the entry or re-encode")
    if counts is not None and (not isinstance(counts, list) or len(counts) != len(shards)
                               or not all(isinstance(c, int) and c >= 0 for c in counts)):
        raise ValueError(f"{meta_path}: shard_counts is {counts!r}; expected one count per shard ({len(shards)})")
    if not shards or (counts is not None and sum(counts) == 0) or meta.get("latent_shape") is None:
        raise ValueError(f"{meta_path}: holds no latents (every image was skipped?); nothing to read")
    LatentNormalization.from_metadata(meta, str(meta_path))  # checks the normalisation fields
    return meta


def verify_latent_shards(folder: str | Path, meta: dict[str, Any] | None = None, checksums: bool = True
                         ) -> list[int]:
    """Check a latent shard set against its ``latents.json``: every shard present, its sample count as recorded
    (always) and, with ``checksums``, its sha256 as recorded. Returns the counts; ``ValueError`` names the shard,
    the recorded and the found value."""
    from .shards import file_digest

    folder = Path(folder)
    meta = read_metadata(folder) if meta is None else meta
    urls = [folder / name for name in meta["shards"]]
    missing = [str(u) for u in urls if not u.is_file()]
    if missing:
        raise ValueError(f"{folder / METADATA_NAME} lists {missing[0]}, which is missing"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    counts = shard_counts([str(u) for u in urls])
    for url, recorded, found in zip(urls, meta.get("shard_counts") or counts, counts, strict=True):
        if recorded != found:
            raise ValueError(f"{url}: holds {found} samples but {METADATA_NAME} records {recorded}: the shard is "
                             "truncated or was changed; rerun `loopvae encode` for it (delete it and rerun)")
    if checksums:
        digests = meta.get("shard_sha256")
        if not digests:
            raise ValueError(f"{folder / METADATA_NAME}: records no shard_sha256 (written by an older loopvae "
                             "encode); re-encode to verify checksums")
        for url in urls:
            found = file_digest(url)[1]
            if digests.get(url.name) != found:
                raise ValueError(f"{url}: sha256 {found[:16]}... differs from the recorded "
                                 f"{str(digests.get(url.name))[:16]}...: the shard was modified or corrupted")
    return counts


def check_latent_set(folder: str | Path) -> dict[str, Any]:
    """``loopdata check`` on a latent shard set: ``latents.json`` readable; every shard present with its recorded
    sample count and sha256 (when recorded); every sample holding a readable ``.latent.npy`` (and ``.latent_flip.npy``
    when the set has flips) of the recorded shape with finite values. Returns ``{"folder", "num_samples",
    "num_shards", "checksums", "problems": [...]}``; an empty ``problems`` list means the set is sound."""
    folder = Path(folder)
    report: dict[str, Any] = {"folder": str(folder), "num_samples": 0, "num_shards": 0, "checksums": False,
                              "problems": []}
    try:
        meta = read_metadata(folder)
    except (ValueError, FileNotFoundError) as err:
        report["problems"].append(str(err))
        return report
    report["num_shards"] = len(meta["shards"])
    report["checksums"] = bool(meta.get("shard_sha256"))
    try:
        verify_latent_shards(folder, meta, checksums=report["checksums"])
    except ValueError as err:
        report["problems"].append(str(err))
    shape = tuple(meta["latent_shape"])
    if meta.get("moments"):
        shape = (2 * shape[0], *shape[1:])
    members = [LATENT_EXT] + ([FLIP_EXT] if meta.get("flip") else [])
    for name in meta["shards"]:
        url = folder / name
        if not url.is_file():
            continue
        try:
            for sample in iter_samples(str(url)):
                report["num_samples"] += 1
                where = f"{url}: sample {sample['__key__']!r}"
                for ext in members:
                    if ext not in sample:
                        report["problems"].append(f"{where}: no .{ext} member")
                        continue
                    try:
                        array = load_npy(sample[ext], where)
                    except ValueError as err:
                        report["problems"].append(str(err))
                        continue
                    if tuple(array.shape) != shape:
                        report["problems"].append(f"{where}: .{ext} has shape {tuple(array.shape)}, latents.json "
                                                  f"records {list(shape)}")
                    elif not np.isfinite(array).all():
                        report["problems"].append(f"{where}: .{ext} holds NaN or infinite values")
        except Exception as err:  # noqa: BLE001 - a damaged tar is a finding, not a crash
            report["problems"].append(f"{url}: unreadable ({err})")
    return report


def denormalize(z: torch.Tensor, meta: dict[str, Any]) -> torch.Tensor:
    """Diffusion-model latents ``(B, C, h, w)`` -> the tokenizer's latent space (``vae.decode`` input)."""
    return LatentNormalization.from_metadata(meta).denormalize(z)


class LatentDataset(IterableDataset):
    """Normalised latents from a ``loopvae encode`` shard directory.

    Yields ``{"latent": (C, h, w) float32, "key": str, "label": int (when the samples have .cls),
    "flipped": bool}``.

    Args:
        source: the shard directory (or a shard spec within it: glob, brace pattern, comma list). A directory's
            shards are checked against ``latents.json``: each shard's sample count always, its sha256 with
            ``verify=True`` (:func:`verify_latent_shards`).
        train: shuffle shards per epoch (seeded), split them over ranks x workers (each a disjoint set),
            shuffle samples in a ``shuffle_buffer`` and pick the flipped latent with probability
            ``flip_prob`` (when the shards hold one). Every rank and worker yields the same number of samples
            per epoch (the smallest share; the rest of the larger shares is left for later epochs' orders), so
            DDP ranks run the same number of steps. ``False``: every sample exactly once over ranks x workers,
            in order, unflipped.
        rank, world_size: this process's place (torchrun); a training set needs shards >= ranks x workers.
        normalize: apply the recorded normalisation (``False``: raw tokenizer latents).
    """

    def __init__(self, source: str | Path, train: bool = True, rank: int = 0, world_size: int = 1,
                 seed: int = 0, flip_prob: float = 0.5, shuffle_buffer: int = 1000, normalize: bool = True,
                 verify: bool = False) -> None:
        super().__init__()
        src = Path(source)
        folder = src if src.is_dir() else Path(expand_urls(str(source))[0]).parent
        self.meta = read_metadata(folder)
        self.urls = [str(folder / name) for name in self.meta["shards"]] if src.is_dir() else expand_urls(str(source))
        if not self.urls:
            raise ValueError(f"{source}: no latent shards")
        if src.is_dir():  # counts always; checksums on request (verify=True)
            self.counts = verify_latent_shards(folder, self.meta, checksums=verify)
        else:
            self.counts = shard_counts(self.urls)
        self.shape = tuple(self.meta["latent_shape"])
        self.moments = bool(self.meta.get("moments"))
        self.stored_shape = (2 * self.shape[0], *self.shape[1:]) if self.moments else self.shape
        self.train, self.rank, self.world_size, self.seed = train, rank, world_size, seed
        self.flip_prob = flip_prob if self.meta.get("flip") else 0.0
        self.shuffle_buffer = shuffle_buffer
        self.norm = LatentNormalization.from_metadata(self.meta, str(folder / METADATA_NAME)) if normalize else None
        self.epoch = 0

    def _draw(self, moments: torch.Tensor, key: str, flip: bool) -> torch.Tensor:
        """A latent from cached moments ``[mean; log-variance]``: in training a fresh sample per epoch and key
        (``z = mean + exp(logvar / 2) * eps``, ``eps`` seeded by ``(seed, epoch, key, flip)``: reproducible, and
        different every epoch, as MAR / REPA resample their cached moments); in evaluation the mean."""
        mean, logvar = moments.chunk(2, dim=0)
        if not self.train:
            return mean
        digest = hashlib.sha256(f"{self.seed}-{self.epoch}-{key}-{int(flip)}".encode()).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
        std = torch.exp(0.5 * logvar.clamp(-30.0, 20.0))  # the clamp diffusers' DiagonalGaussianDistribution uses
        return mean + std * torch.randn(mean.shape, generator=generator)

    def set_epoch(self, epoch: int) -> None:
        """Training: the shard order and the shuffles of the next iteration depend on ``epoch``."""
        self.epoch = epoch

    def __len__(self) -> int:
        """Samples this rank yields per epoch: all of its share in evaluation; in training the balanced share
        of one worker per rank (with several workers, see :meth:`samples_per_slot`)."""
        if not self.train:
            return len(range(*slot_range(sum(self.counts), self.world_size, self.rank)))
        return self.samples_per_slot(self.world_size)

    def _order(self) -> list[int]:
        order = list(range(len(self.urls)))
        random.Random(f"{self.seed}-{self.epoch}").shuffle(order)  # the same order on every rank and worker
        return order

    def samples_per_slot(self, slots: int) -> int:
        """Training: what each of ``slots`` (ranks x workers) yields this epoch, the smallest share of samples."""
        order = self._order()
        return min(sum(self.counts[i] for i in order[s::slots]) for s in range(slots))

    def _item(self, url: str, sample: dict[str, Any], flip: bool) -> dict[str, Any]:
        where = f"{url}: sample {sample['__key__']!r}"
        ext = FLIP_EXT if flip else LATENT_EXT
        if ext not in sample:
            raise ValueError(f"{where} has no .{ext} member (members: {sorted(k for k in sample if k[0] != '_')})")
        array = load_npy(sample[ext], where)
        if tuple(array.shape) != self.stored_shape:
            raise ValueError(f"{where}: .{ext} has shape {tuple(array.shape)}, but {METADATA_NAME} records "
                             f"latent_shape {list(self.shape)}{' as moments' if self.moments else ''}: the shard set "
                             "mixes latents of different tokenizers or resolutions")
        z = torch.from_numpy(array.astype(np.float32))
        if self.moments:
            z = self._draw(z, sample["__key__"], flip)
        item: dict[str, Any] = {"latent": self.norm.normalize(z) if self.norm is not None else z,
                                "key": sample["__key__"], "flipped": flip}
        if "cls" in sample:
            item["label"] = int(sample["cls"].decode().strip())
        return item

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        slots, slot = self.world_size * workers, self.rank * workers + worker
        if not self.train:
            start, stop = slot_range(len(self), slots, slot)
            offset = 0
            for url, count in zip(self.urls, self.counts, strict=True):
                if offset + count > start and offset < stop:
                    for i, sample in enumerate(iter_samples(url)):
                        if start <= offset + i < stop:
                            yield self._item(url, sample, False)
                offset += count
            return
        if len(self.urls) < slots:
            raise ValueError(f"{len(self.urls)} latent shard(s) cannot feed {self.world_size} rank(s) x {workers} "
                             "worker(s) disjoint shards in training: pass num_workers=0 (or fewer workers), or encode "
                             "more shards (loopvae encode writes one latent shard per input shard: split the images "
                             "with loopdata write --max-count N first)")
        rng = random.Random(f"{self.seed}-{self.epoch}-{slot}")
        order = self._order()
        budget = self.samples_per_slot(slots)
        buffer: list[dict[str, Any]] = []
        read = 0
        for index in order[slot::slots]:
            for sample in iter_samples(self.urls[index]):
                if read == budget:
                    break
                read += 1
                buffer.append(self._item(self.urls[index], sample, rng.random() < self.flip_prob))
                if len(buffer) >= self.shuffle_buffer:
                    yield buffer.pop(rng.randrange(len(buffer)))
        rng.shuffle(buffer)
        yield from buffer


def make_latent_loader(source: str | Path, batch_size: int, train: bool = True, num_workers: int = 0,
                       rank: int = 0, world_size: int = 1, seed: int = 0, flip_prob: float = 0.5,
                       normalize: bool = True) -> DataLoader:
    """A ``DataLoader`` over :class:`LatentDataset` batches ``{"latent": (B, C, h, w), "key", "label", ...}``."""
    dataset = LatentDataset(source, train=train, rank=rank, world_size=world_size, seed=seed, flip_prob=flip_prob,
                            normalize=normalize)
    return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, drop_last=train,
                      persistent_workers=False)
