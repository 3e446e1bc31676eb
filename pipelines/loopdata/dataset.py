"""The batching IterableDataset behind :func:`loopdata.make_loader`.

Each DataLoader worker computes its share of the data from ``(rank, world_size, worker, num_workers)``
(see :mod:`loopdata.distributed`), so no sampler, node splitter or worker splitter from outside is
involved and nothing can silently duplicate or drop samples.

Training stream of one (rank, worker role), for epoch ``e``:

* pass ``p = 0, 1, ...``: the shard list is permuted with ``seed(seed, e, p)`` (identical on every
  rank); with at least ``world_size * num_workers`` shards each slot reads every ``S``-th shard of the
  permutation, otherwise every slot reads all shards and keeps every ``S``-th sample (slot numbers are
  worker-major so that every worker that owes a batch owns at least one sample);
* or, with ``resampled=True``, shards drawn with replacement with ``seed(seed, e, rank, worker)``;
* a shuffle buffer (webdataset's) seeded by ``(seed, e, rank, worker)``, applied pass by pass;
* every sample's random augmentation seeded by ``(seed, e, rank, worker, sample index)`` and every
  batch's Mixup/CutMix by ``(seed, e, rank, worker, batch index)``, so the same seed gives the same
  batches whatever the process layout, and skipping the first batches (resume) does not change the
  ones after them.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import webdataset as wds
from torch.utils.data import IterableDataset, get_worker_info

from .decode import DecodeError, decode_image, decode_pil
from .distributed import (
    derive_seed,
    slot_range,
    split_evenly,
    train_steps_per_epoch,
    worker_role,
)
from .errors import CorruptSampleError, NoUsableSamplesError, ShardCountError
from .keys import check_key
from .shards import INFO_NAME, ShardReadError, image_member, iter_samples
from .transforms import TaskTransforms

logger = logging.getLogger("loopdata")


class _Corrupt(Exception):
    """Internal: this sample is unusable, with the reason."""


@dataclass
class _Item:
    image: torch.Tensor
    key: str
    label: int | None
    shard: str


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Run torch's CPU RNG from ``seed`` without disturbing the caller's RNG stream."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class ShardDataset(IterableDataset):
    """Yields ready batches ``{"image", "key", "label"?}`` for one rank (use with ``batch_size=None``).

    Args:
        urls: shard URLs, in the order that defines the evaluation sample order.
        counts: samples per shard (from ``_info.json`` or counted).
        transforms: the task's sample/batch transforms.
        train: training (fixed-length, shuffled, corrupt samples skipped) or evaluation (every sample
            exactly once across ranks and workers, in shard order).
        batch_size: samples per batch (training batches are always full).
        rank, world_size: this process's place in the job.
        seed: base seed of all randomness.
        resampled: draw training shards with replacement instead of permuting them per pass.
        shuffle_buffer: samples held by the training shuffle buffer (<= 1 disables it).
        skip_corrupt: in evaluation, skip (and count) undecodable samples instead of raising.
        corrupt_counter: a shared ``multiprocessing.Value`` incremented for every skipped sample.
        max_pixels: images with more pixels count as undecodable (default
            :func:`loopdata.decode.default_max_pixels`).
        first_pass_counter: like ``corrupt_counter``, for samples met in the first pass of a training epoch
            only (each distinct corrupt sample once per epoch).
    """

    def __init__(
        self,
        urls: Sequence[str],
        counts: Sequence[int],
        transforms: TaskTransforms,
        *,
        train: bool,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int = 0,
        resampled: bool = False,
        shuffle_buffer: int = 1000,
        skip_corrupt: bool = False,
        corrupt_counter: Any = None,
        max_pixels: int | None = None,
        first_pass_counter: Any = None,
    ) -> None:
        super().__init__()
        if len(urls) != len(counts):
            raise ValueError(f"{len(urls)} shards but {len(counts)} counts")
        self.urls = list(urls)
        self.counts = [int(c) for c in counts]
        self.num_samples = sum(self.counts)
        self.transforms = transforms
        self.train = train
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.resampled = resampled
        self.shuffle_buffer = shuffle_buffer
        self.skip_corrupt = skip_corrupt
        self._skipped: list[dict[str, Any]] = []  # evaluation: skipped samples not yet handed out with a batch
        self.corrupt_counter = corrupt_counter
        self.first_pass_counter = first_pass_counter
        self.max_pixels = max_pixels
        self.epoch = 0
        self.start_batch = 0
        self.excluded_samples = 0
        if train:
            self.steps_per_epoch = train_steps_per_epoch(self.num_samples, world_size, batch_size)

    def set_excluded(self, count: int) -> None:
        """Plan training epochs over ``num_samples - count`` samples (``count`` known to be undecodable)."""
        usable = self.num_samples - count
        if usable < self.world_size * self.batch_size:
            raise RuntimeError(
                f"{count} of the {self.num_samples} training samples are undecodable: too few usable ones left for "
                f"one batch of {self.batch_size} on each of {self.world_size} rank(s); run `loopdata check` on "
                f"{self.urls[:2]}{'...' if len(self.urls) > 2 else ''}"
            )
        self.excluded_samples = count
        self.steps_per_epoch = train_steps_per_epoch(usable, self.world_size, self.batch_size)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if self.train:
            return self._train_batches(worker, num_workers)
        return self._eval_batches(worker, num_workers)

    # ---------------------------------------------------------------- sample handling
    def _report(self, url: str, key: str, reason: str, fatal: bool, first_pass: bool = True,
                count: bool = True) -> None:
        """Raise (``fatal``) or log and count an unusable sample.

        ``first_pass``: the sample was met in the first pass over this epoch's data (later passes of a
        training epoch meet the same samples again), counted in ``first_pass_counter`` too; ``count=False``:
        already counted before a resume (the walk over the batches a resumed epoch skips).
        """
        if fatal:
            raise CorruptSampleError(
                f"{url}: sample {key!r}: {reason}. Fix or remove it (`loopdata check {url}` lists all "
                "problems), or skip undecodable samples (`--skip-corrupt`, or skip_corrupt=True in make_loader)"
            )
        if not count:
            return
        total = 0
        if self.corrupt_counter is not None:
            with self.corrupt_counter.get_lock():
                self.corrupt_counter.value += 1
                total = self.corrupt_counter.value
        if first_pass and self.first_pass_counter is not None:
            with self.first_pass_counter.get_lock():
                self.first_pass_counter.value += 1
        logger.warning(
            "loopdata: skipped corrupt sample %r in %s: %s (%d skipped so far)", key, url, reason, total
        )
        if not self.train:  # named in the evaluation's batches (see _eval_batches)
            self._skipped.append({"key": key, "shard": url, "reason": reason, "after": None})

    def _parse(self, url: str, sample: dict[str, Any]) -> tuple[bytes, int | None]:
        check_key(sample["__key__"], url)  # fatal in training too: a hostile shard is not data to skip
        ext = image_member(sample)
        if ext is None:
            members = sorted(k for k in sample if not k.startswith("__"))
            raise _Corrupt(f"no image member (members: {members})")
        label = None
        if "cls" in sample:
            text = sample["cls"].decode("utf-8", "replace").strip()
            try:
                label = int(text)
            except ValueError:
                raise _Corrupt(f".cls is not an integer: {text[:40]!r}") from None
        if self.transforms.needs_label and label is None:
            raise _Corrupt("no .cls label, but the classification task needs one")
        num_classes = self.transforms.num_classes
        if label is not None and num_classes is not None and not 0 <= label < num_classes:
            raise ValueError(
                f"{url}: sample {sample['__key__']!r} has label {label}, outside "
                f"[0, num_classes={num_classes}); pass the right num_classes=... task option"
            )
        return sample[ext], label

    def _load(self, url: str, sample: dict[str, Any], seed: int | None) -> _Item:
        data, label = self._parse(url, sample)
        try:
            image = decode_image(data, self.transforms.draft_size, self.max_pixels, self.transforms.resize_side)
        except DecodeError as exc:
            raise _Corrupt(str(exc)) from None
        if seed is None:
            out = self.transforms.sample(image)
        else:
            with _seeded(seed):
                out = self.transforms.sample(image)
        return _Item(out, sample["__key__"], label, url)

    def _validate(self, url: str, sample: dict[str, Any]) -> None:
        """Fail when :meth:`_load` would: same parsing, same decoder, but JPEGs at 1/8 scale (cheap).

        A 1/8-scale decode still reads every entropy-coded byte, so truncation is caught as in a full decode.
        """
        data, _ = self._parse(url, sample)
        try:
            decode_pil(data, 1, self.max_pixels, self.transforms.resize_side)
        except DecodeError as exc:
            raise _Corrupt(str(exc)) from None

    def _collate(self, items: list[_Item], batch_seed: int | None) -> dict[str, Any]:
        images = self.transforms.normalize(torch.stack([item.image for item in items]))
        batch: dict[str, Any] = {"image": images, "key": [item.key for item in items],
                                 "shard": [item.shard for item in items]}
        if all(item.label is not None for item in items):
            batch["label"] = torch.tensor([item.label for item in items], dtype=torch.int64)
        if batch_seed is not None and (
            self.transforms.erase is not None or self.transforms.batch is not None
        ):
            with _seeded(batch_seed):
                if self.transforms.erase is not None:
                    for i in range(images.shape[0]):
                        images[i] = self.transforms.erase(images[i])
                if self.transforms.batch is not None:
                    batch["image"], batch["label"] = self.transforms.batch(images, batch["label"])
        return batch

    def _read(self, url: str, fatal: bool) -> Iterator[dict[str, Any]]:
        try:
            yield from iter_samples(url)
        except ShardReadError as exc:
            if fatal:
                raise
            self._report(url, "<rest of shard>", str(exc), fatal=False)

    # ---------------------------------------------------------------- evaluation
    def _eval_range(self, start: int, stop: int) -> Iterator[tuple[str, dict[str, Any]]]:
        """Samples ``[start, stop)`` of the ordered split; verifies shard counts at every shard end read."""
        offset = 0
        for url, count in zip(self.urls, self.counts):
            lo, hi = max(start, offset) - offset, min(stop, offset + count) - offset
            offset += count
            if lo >= hi:
                continue
            seen, damaged = 0, False
            try:
                for sample in iter_samples(url):
                    if seen >= hi:
                        if hi == count:
                            raise ShardCountError(
                                f"{url}: holds more than the {count} samples the split was planned with; "
                                f"update {INFO_NAME} with `loopdata info --write --split NAME {url}`"
                            )
                        break
                    if seen >= lo:
                        yield url, sample
                    seen += 1
            except ShardReadError as exc:
                if not self.skip_corrupt:
                    raise
                self._report(url, "<rest of shard>", str(exc), fatal=False)
                damaged = True
            if seen < hi and not damaged:
                raise ShardCountError(
                    f"{url}: holds only {seen} samples but the split was planned with {count}; "
                    f"update {INFO_NAME} with `loopdata info --write --split NAME {url}`"
                )

    def _eval_batches(self, worker: int, num_workers: int) -> Iterator[dict[str, Any]]:
        start, stop = slot_range(
            self.num_samples, self.world_size * num_workers, self.rank * num_workers + worker
        )
        items: list[_Item] = []
        # skipped samples travel with the batch they were met in (``"skipped"``: key, shard, reason and
        # ``after``, the number of the batch's images read before it), so an evaluation can name them and
        # count only those before its --limit; those after a worker's last image go with its last batch, and a
        # worker that read no image at all yields one batch of 0 images carrying them
        self._skipped = []
        held: dict[str, Any] | None = None  # the last full batch, held back until the next one or the end
        for url, sample in self._eval_range(start, stop):
            self._place_skipped(len(items))  # a damaged shard's remainder, reported inside _eval_range
            try:
                items.append(self._load(url, sample, None))
            except _Corrupt as exc:
                self._report(url, sample["__key__"], str(exc), fatal=not self.skip_corrupt)
                self._place_skipped(len(items))
                continue
            if len(items) == self.batch_size:
                if held is not None:
                    yield held
                held, items = self._with_skipped(self._collate(items, None)), []
        self._place_skipped(len(items))
        if items:
            if held is not None:
                yield held
            yield self._with_skipped(self._collate(items, None))
        elif held is not None:  # skipped after the last full batch: they travel with it, after its last image
            for entry in self._skipped:
                entry["after"] = len(held["key"])
            held.setdefault("skipped", []).extend(self._skipped)
            self._skipped = []
            yield held
        elif self._skipped:  # this worker read no image at all: one empty batch carries the names
            yield self._with_skipped(self._empty_batch())

    def _place_skipped(self, after: int) -> None:
        for entry in self._skipped:
            if entry["after"] is None:
                entry["after"] = after

    def _with_skipped(self, batch: dict[str, Any]) -> dict[str, Any]:
        if self._skipped:
            batch["skipped"], self._skipped = self._skipped, []
        return batch

    def _empty_batch(self) -> dict[str, Any]:
        """A batch of no images (the shapes of a real one), to carry skipped samples."""
        shape = self.transforms.sample(torch.zeros(3, 8, 8, dtype=torch.uint8)).shape
        batch: dict[str, Any] = {"image": self.transforms.normalize(torch.zeros(1, *shape, dtype=torch.uint8))[:0],
                                 "key": [], "shard": []}
        if self.transforms.needs_label:
            batch["label"] = torch.zeros(0, dtype=torch.int64)
        return batch

    # ---------------------------------------------------------------- training
    def _pass_samples(
        self, role: int, num_workers: int, pass_index: int
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """This slot's samples of one pass over the data (unshuffled within shards)."""
        slots = self.world_size * num_workers
        # Worker-major slot numbering: with few samples, the workers that owe a batch (low roles, see
        # split_evenly) get the low slot numbers, which always own a sample.
        slot = role * self.world_size + self.rank
        order = list(range(len(self.urls)))
        random.Random(derive_seed(self.seed, self.epoch, pass_index, "shards")).shuffle(order)
        if len(self.urls) >= slots:
            for i in order[slot::slots]:
                for sample in self._read(self.urls[i], fatal=False):
                    yield self.urls[i], sample
            return
        index = 0
        for i in order:
            for sample in self._read(self.urls[i], fatal=False):
                if index % slots == slot:
                    yield self.urls[i], sample
                index += 1

    def _resampled_samples(self, role: int) -> Iterator[tuple[str, dict[str, Any]]]:
        """Endless samples of shards drawn with replacement, seeded per (epoch, rank, worker)."""
        rng = random.Random(derive_seed(self.seed, self.epoch, self.rank, role, "resample"))
        empty_reads = 0
        while True:
            url = self.urls[rng.randrange(len(self.urls))]
            got = False
            for sample in self._read(url, fatal=False):
                got = True
                yield url, sample
            empty_reads = 0 if got else empty_reads + 1
            if empty_reads > 4 * len(self.urls) + 10:
                raise RuntimeError(
                    f"rank {self.rank}: {empty_reads} resampled shards in a row held no samples"
                )

    def _train_stream(self, role: int, num_workers: int) -> Iterator[tuple[str, dict[str, Any], bool]]:
        """The endless, shuffled sample stream of one (rank, worker role) for the current epoch.

        Permuted passes are shuffled pass by pass, so a small data set is a full permutation per pass
        rather than a buffer mixing several passes (which would repeat samples within an epoch).
        """
        rng = random.Random(derive_seed(self.seed, self.epoch, self.rank, role, "buffer"))

        def shuffled(stream: Iterator[tuple[str, dict[str, Any]]]) -> Iterator[tuple[str, dict[str, Any]]]:
            if self.shuffle_buffer <= 1:
                return stream
            return wds.shuffle(self.shuffle_buffer, initial=self.shuffle_buffer, rng=rng)(stream)

        if self.resampled:  # no passes: every draw counts as new
            for url, sample in shuffled(self._resampled_samples(role)):
                yield url, sample, True
            return
        for pass_index in itertools.count():
            got = False
            for url, sample in shuffled(self._pass_samples(role, num_workers, pass_index)):
                got = True
                yield url, sample, pass_index == 0
            if not got:
                raise NoUsableSamplesError(
                    f"rank {self.rank} worker {role}: a full pass over its shards yielded no samples "
                    f"(shards: {self.urls[:3]}{'...' if len(self.urls) > 3 else ''}); "
                    "check them with `loopdata check`"
                )

    def _train_batches(self, worker: int, num_workers: int) -> Iterator[dict[str, Any]]:
        role = worker_role(worker, num_workers, self.start_batch)
        n_batches = split_evenly(self.steps_per_epoch, num_workers, role)
        batch_index = split_evenly(min(self.start_batch, self.steps_per_epoch), num_workers, role)
        if batch_index >= n_batches:
            return
        stream = self._train_stream(role, num_workers)
        to_skip = batch_index * self.batch_size
        produced, failures = 0, 0
        items: list[_Item] = []
        for raw_index, (url, sample, first_pass) in enumerate(stream):
            skipping = produced < to_skip
            try:
                if skipping:
                    # Resuming: walk the same stream, checking decodability without augmenting, so the
                    # corrupt samples (and hence the batch boundaries) match the uninterrupted run.
                    self._validate(url, sample)
                    produced += 1
                    failures = 0
                    continue
                seed = derive_seed(self.seed, self.epoch, self.rank, role, raw_index)
                items.append(self._load(url, sample, seed))
            except _Corrupt as exc:
                self._report(url, sample["__key__"], str(exc), fatal=False, first_pass=first_pass, count=not skipping)
                failures += 1
                if failures > self.num_samples:
                    raise NoUsableSamplesError(
                        f"rank {self.rank} worker {role}: {failures} consecutive samples failed to decode; "
                        "the shards hold no usable image, run `loopdata check` on them"
                    ) from None
                continue
            failures = 0
            produced += 1
            if len(items) == self.batch_size:
                batch_seed = derive_seed(self.seed, self.epoch, self.rank, role, "batch", batch_index)
                yield self._collate(items, batch_seed)
                items = []
                batch_index += 1
                if batch_index >= n_batches:
                    return
