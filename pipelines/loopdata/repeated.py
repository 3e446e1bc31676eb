"""Repeated augmentation for streamed shards: DeiT's ``RASampler`` in streaming form.

DeiT (Touvron et al. 2021, following Hoffer et al. 2020) trains with repeated augmentation, ``r = 3``:
``RASampler`` permutes the ``N`` indices each epoch, repeats every index ``r`` times, deals the list
round-robin to the ranks (so the repeats of an image go to ``r`` different ranks, mostly in the same step)
and truncates every rank to ``N / world_size`` indices: an epoch keeps its length of ``N`` samples but sees
only ``~N / r`` distinct images, each ``r`` times with independent augmentations.

A WebDataset stream has no indices to permute, so :class:`RepeatedAugDataset` does this instead, in every
(rank, worker) slot of :class:`loopdata.ShardDataset`'s training stream:

1. each raw sample of the slot's shard stream is emitted ``r`` times in a row, *before* the shuffle buffer;
2. the shuffle buffer (``shuffle_buffer`` samples, webdataset's) spreads the ``r`` copies apart: each copy
   leaves the buffer after a geometric number of draws of mean ``shuffle_buffer``;
3. every copy is decoded and augmented on its own, from its own seed (``(seed, epoch, rank, worker, stream
   index)``, as for any sample), so the ``r`` views are independent draws of the whole augmentation
   (crop, flip, RandAugment, erasing, and its Mixup/CutMix partner);
4. the epoch plan is unchanged (``floor(N / (world_size * batch_size))`` full batches per rank), so an epoch
   still yields ``~N`` samples but only ``~N / r`` distinct images.

How this differs from ``RASampler``, precisely:

* **Placement**: the copies of an image stay on the rank and DataLoader worker that read it, spread over
  about ``shuffle_buffer`` consecutive samples of that worker's stream (so over a few batches; two copies can
  share a batch, with probability about ``batch_size / shuffle_buffer`` per pair). ``RASampler`` puts them on
  ``r`` different ranks, usually in the same optimizer step. For a model without batch statistics (ViTs use
  LayerNorm) both give the gradient the same ``r`` views per epoch; the copies just meet the weights at
  slightly different steps here.
* **Which images an epoch sees**: ``RASampler`` takes a uniformly random ``N / r`` subset per epoch. Here an
  epoch reads the first ``~1 / r`` of its slot's pass over the data, whose shard order is permuted per epoch
  (identically on every rank): the distinct images of an epoch are whole shards' worth (in tar order within a
  shard) rather than a uniform subset. Over epochs every shard is equally likely to be read; within an epoch an
  image is seen ``r`` times or not at all (up to the boundary effect below).
* **Epoch boundary**: the samples still in the shuffle buffer when an epoch's last batch is full are not
  emitted, so at most ``shuffle_buffer + 1`` images per slot and epoch are seen fewer than ``r`` times (and
  the distinct count is at most ``N / r`` plus that many). The loader logs a warning when the buffer is not
  small against a slot's ``N / (r * world_size * workers)`` distinct images, where this effect would dominate.
* **Corrupt samples** are met (logged and counted) once per copy. The first-pass count the training loop uses to
  shorten the epoch plan (:meth:`loopdata.ShardLoader.exclude_corrupt`) then estimates the data set's corrupt
  samples (``~1 / r`` of them, each counted ``r`` times) rather than counting them.
* I/O and decoding: every copy is decoded separately, as ``RASampler``'s ``dataset[i]`` does, so an epoch costs the
  same decoding work as without repeats while reading ``~1 / r`` of the bytes.

Evaluation loaders never repeat.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, TypeVar

from .dataset import ShardDataset
from .transforms import ClassificationOptions, ReconstructionOptions

logger = logging.getLogger("loopdata")

T = TypeVar("T")


def repeat_each(stream: Iterator[T], repeats: int) -> Iterator[T]:
    """Yield every item of ``stream`` ``repeats`` times in a row (the same object; it is only read afterwards)."""
    for item in stream:
        for _ in range(repeats):
            yield item


def train_repeats(options: ReconstructionOptions | ClassificationOptions, train: bool) -> int:
    """The repeat count a loader uses: ``options.repeated_aug`` for classification training, else 1."""
    return int(getattr(options, "repeated_aug", 1)) if train else 1


class RepeatedAugDataset(ShardDataset):
    """:class:`loopdata.ShardDataset` whose training stream repeats every sample ``repeats`` times (see module).

    Args:
        *args, **kwargs: :class:`loopdata.ShardDataset`'s (``train=True``, ``shuffle_buffer > 1``).
        repeats: ``r >= 2``, the uses of each sample per epoch (DeiT: 3).
    """

    def __init__(self, *args: Any, repeats: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 2:
            raise ValueError(f"RepeatedAugDataset needs repeats >= 2 (use ShardDataset for 1), got {repeats!r}")
        if not self.train:
            raise ValueError("repeated augmentation is for training loaders; evaluation reads every sample once")
        if self.shuffle_buffer <= 1:
            raise ValueError(
                f"repeated_aug={repeats} needs a shuffle buffer to spread the copies of a sample apart; with "
                f"shuffle_buffer={self.shuffle_buffer} they would sit side by side in one batch (and Mixup/CutMix "
                "would pair an image with its own copy): set shuffle_buffer to a few batches or more"
            )
        self.repeats = repeats

    def _pass_samples(self, role: int, num_workers: int, pass_index: int) -> Iterator[tuple[str, dict[str, Any]]]:
        return repeat_each(super()._pass_samples(role, num_workers, pass_index), self.repeats)

    def _resampled_samples(self, role: int) -> Iterator[tuple[str, dict[str, Any]]]:
        return repeat_each(super()._resampled_samples(role), self.repeats)

    def distinct_per_slot(self, num_workers: int) -> int:
        """About how many distinct samples one (rank, worker) slot yields per epoch: ``samples / repeats``."""
        return self.steps_per_epoch * self.batch_size // (max(num_workers, 1) * self.repeats)

    def warn_if_poorly_spread(self, num_workers: int) -> None:
        """Log when the shuffle buffer is too large or too small for the repeats to behave as documented."""
        distinct = self.distinct_per_slot(num_workers)
        if self.shuffle_buffer >= distinct:
            logger.warning(
                "loopdata: repeated_aug=%d with shuffle_buffer=%d >= the ~%d distinct samples each of the %d "
                "rank x worker slots yields per epoch: the epoch ends with many copies still in the buffer, so "
                "images are seen fewer than %d times and more distinct ones appear; use a smaller shuffle_buffer",
                self.repeats, self.shuffle_buffer, distinct, self.world_size * max(num_workers, 1), self.repeats,
            )
        elif self.shuffle_buffer < self.batch_size:
            logger.warning(
                "loopdata: repeated_aug=%d with shuffle_buffer=%d < batch_size=%d: the copies of a sample mostly "
                "land in the same batch; use a shuffle buffer of a few batches",
                self.repeats, self.shuffle_buffer, self.batch_size,
            )
