"""The single loader entry point for reconstruction and classification: :func:`make_loader`."""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import signal
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader

from .dataset import ShardDataset
from .distributed import RankShare, eval_plan, resolve_rank, split_evenly
from .repeated import RepeatedAugDataset, train_repeats
from .shards import expand_urls, shard_counts
from .transforms import build_transforms, make_options

logger = logging.getLogger("loopdata")


def ignore_stop_signals(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: workers ignore SIGTERM and SIGINT.

    torchrun's agent (and Ctrl-C in a terminal) signals the whole process group. The main process turns
    the signal into a checkpoint and a clean exit; a worker that died of it first would make the
    DataLoader raise ``worker ... killed by signal`` before the main process could save.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


_live_iterators: weakref.WeakSet[Any] = weakref.WeakSet()


def _value(counter: Any) -> int:
    """A shared worker counter's value (0 when the dataset keeps none)."""
    return int(counter.value) if counter is not None else 0


def _shut_down(batches: Any) -> None:
    """Stop the worker processes of a DataLoader iterator (a no-op for ``num_workers=0``)."""
    _live_iterators.discard(batches)
    shutdown = getattr(batches, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


@atexit.register
def _shut_down_live_iterators() -> None:
    # Registered after multiprocessing's own exit hook, so it runs first: a loader abandoned mid-epoch
    # (its consumer raised) has its workers stopped before multiprocessing joins them.
    for batches in list(_live_iterators):
        _shut_down(batches)


class ShardLoader:
    """Batches of one rank; a thin wrapper around :class:`torch.utils.data.DataLoader`.

    Batches are dicts:

    * ``"image"``: float32 (N, 3, R, R); in [-1, 1] for reconstruction, mean/std-normalised for
      classification;
    * ``"key"``: list of N sample keys (str);
    * ``"shard"``: list of N shard URLs the samples came from (keys are unique per shard set, not globally);
    * ``"label"``: int64 (N,) when every sample of the batch has a ``.cls``, or float32 (N, K) soft
      targets when classification training uses Mixup/CutMix;
    * ``"skipped"`` (evaluation with ``skip_corrupt``, when samples were skipped): a list of ``{"key", "shard",
      "reason", "after"}``, ``after`` = how many of the batch's images came before the skipped sample. A worker
      whose every sample was undecodable yields one batch of N = 0 images carrying them.

    Epochs: each complete iteration advances :attr:`epoch` by one. :meth:`set_epoch` (or
    :meth:`load_state_dict` with the dict from :meth:`state_dict`) selects the epoch and the first batch
    of the next iteration, for deterministic resume. A new DataLoader (and new workers) is made per
    iteration so that workers always see the current epoch.
    """

    def __init__(
        self,
        dataset: ShardDataset,
        num_workers: int,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
    ) -> None:
        self.dataset = dataset
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.prefetch_factor = prefetch_factor
        self._next_batch = 0
        self._corrupt_offset = 0  # skipped before this loader was made (restored from a checkpoint)
        self.epoch_corrupt = 0  # distinct samples skipped in the last complete iteration (first pass only)

    # ------------------------------------------------------------------ sizes
    @property
    def train(self) -> bool:
        """Whether this is a training loader."""
        return self.dataset.train

    @property
    def total_samples(self) -> int:
        """Samples in the whole split (all ranks)."""
        return self.dataset.num_samples

    def plan(self) -> list[RankShare]:
        """Per-rank ``(num_samples, num_batches)`` of one epoch, index = rank.

        Training: identical for every rank. Evaluation: each sample goes to exactly one rank; ranks may
        differ by a few batches (gather metrics after the loop, not per batch).
        """
        d = self.dataset
        if d.train:
            workers = max(self.num_workers, 1)
            per_worker = tuple(
                split_evenly(d.steps_per_epoch, workers, w) * d.batch_size for w in range(workers)
            )
            return [
                RankShare(r, d.steps_per_epoch * d.batch_size, d.steps_per_epoch, per_worker)
                for r in range(d.world_size)
            ]
        return eval_plan(d.num_samples, d.world_size, self.num_workers, d.batch_size)

    @property
    def num_batches(self) -> int:
        """Batches this rank yields in a full epoch (``steps_per_epoch`` in training)."""
        return self.plan()[self.dataset.rank].num_batches

    @property
    def num_samples(self) -> int:
        """Samples this rank yields in a full epoch."""
        return self.plan()[self.dataset.rank].num_samples

    def __len__(self) -> int:
        """Batches the next iteration yields (a resumed epoch yields ``num_batches - start_batch``)."""
        return max(self.num_batches - self.dataset.start_batch, 0)

    # ------------------------------------------------------------------ position
    @property
    def epoch(self) -> int:
        """The epoch the next iteration runs."""
        return self.dataset.epoch

    @property
    def corrupt_count(self) -> int:
        """Samples (or shard remainders) skipped as undecodable by this rank, all workers, over the whole
        run (a resumed loader continues the count saved in :meth:`state_dict`)."""
        return self._corrupt_offset + _value(self.dataset.corrupt_counter)

    @property
    def excluded_samples(self) -> int:
        """Samples left out of the training epoch plan because they were found undecodable."""
        return self.dataset.excluded_samples

    def exclude_corrupt(self, count: int) -> None:
        """Plan later training epochs without ``count`` known-undecodable samples (summed over ranks).

        An epoch is planned as ``floor(usable samples / (world_size * batch_size))`` batches; with corrupt
        samples still counted, the end of every epoch would repeat good ones to fill the plan. The training
        loop passes the corrupt samples all ranks skipped in the first epoch; the count is saved and
        restored with :meth:`state_dict`, so a resumed run plans its epochs the same way.
        """
        if not self.dataset.train or count <= self.dataset.excluded_samples:
            return
        self.dataset.set_excluded(count)
        logger.info("loopdata: %d undecodable sample(s) left out of the epoch plan: %d batches per epoch and rank",
                    count, self.dataset.steps_per_epoch)

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Select the epoch (and the first batch within it) of the next iteration.

        ``start_batch`` skips that many batches of this rank's epoch without augmenting them; the
        batches that follow are identical to those of an uninterrupted run with the same seed and
        process layout (same world size and ``num_workers``).
        """
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if start_batch < 0 or start_batch > self.num_batches:
            raise ValueError(
                f"start_batch must be in [0, {self.num_batches}] for this loader, got {start_batch}"
            )
        if start_batch and not self.dataset.train:
            raise ValueError("start_batch is only meaningful for training loaders")
        self.dataset.epoch = epoch
        self.dataset.start_batch = start_batch
        self._next_batch = start_batch

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "batch", "seed", "corrupt", "excluded"}``: where the data stream is (``batch`` = next
        batch to yield), this rank's corrupt-sample count and the samples left out of the epoch plan."""
        return {"epoch": self.dataset.epoch, "batch": self._next_batch, "seed": self.dataset.seed,
                "corrupt": self.corrupt_count, "excluded": self.dataset.excluded_samples}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume from :meth:`state_dict`; the seed must match the one this loader was made with."""
        if int(state.get("seed", self.dataset.seed)) != self.dataset.seed:
            raise ValueError(
                f"data state was saved with seed {state['seed']} but this loader uses seed "
                f"{self.dataset.seed}; resume with the same seed for an identical data stream"
            )
        if self.dataset.train:
            self.dataset.set_excluded(int(state.get("excluded", 0)))
        self._corrupt_offset = int(state.get("corrupt", 0)) - _value(self.dataset.corrupt_counter)
        self.set_epoch(int(state["epoch"]), int(state["batch"]))

    # ------------------------------------------------------------------ iteration
    def _make_dataloader(self) -> DataLoader:
        kwargs: dict[str, Any] = {}
        if self.num_workers > 0 and self.prefetch_factor is not None:
            kwargs["prefetch_factor"] = self.prefetch_factor
        # batch_size=None: the dataset batches inside each worker (full batches, per-batch Mixup).
        # Our own generator: the DataLoader draws its worker base seed from it, so iterating never
        # consumes the caller's global torch RNG (all data randomness is seeded explicitly anyway).
        return DataLoader(
            self.dataset,
            batch_size=None,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=False,
            generator=torch.Generator().manual_seed(self.dataset.seed),
            worker_init_fn=ignore_stop_signals if self.num_workers > 0 else None,
            **kwargs,
        )

    def _first_pass_count(self) -> int:
        return _value(self.dataset.first_pass_counter)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        skipped_before = self.corrupt_count
        first_pass_before = self._first_pass_count()
        self._next_batch = self.dataset.start_batch
        batches = iter(self._make_dataloader())
        _live_iterators.add(batches)
        try:
            for batch in batches:
                self._next_batch += 1
                yield batch
        finally:
            # The workers ignore SIGTERM (see ignore_stop_signals), so they must be told to stop: an
            # error's traceback keeps this iterator alive, and multiprocessing would otherwise wait at exit
            # for workers that never exit.
            _shut_down(batches)
        skipped = self.corrupt_count - skipped_before
        self.epoch_corrupt = self._first_pass_count() - first_pass_before
        if skipped:
            logger.warning(
                "loopdata: rank %d skipped %d corrupt sample(s) in epoch %d",
                self.dataset.rank,
                skipped,
                self.dataset.epoch,
            )
        if self.dataset.train:
            self.set_epoch(self.dataset.epoch + 1)
        else:
            self.set_epoch(self.dataset.epoch)


def make_loader(
    urls: str | os.PathLike | Sequence[str | os.PathLike],
    task: str = "reconstruction",
    train: bool = False,
    batch_size: int = 32,
    num_workers: int = 2,
    resolution: int = 256,
    rank: int | None = None,
    world_size: int | None = None,
    seed: int = 0,
    *,
    epoch: int = 0,
    start_batch: int = 0,
    resampled: bool = False,
    shuffle_buffer: int = 1000,
    skip_corrupt: bool = False,
    max_pixels: int | None = None,
    pin_memory: bool = False,
    prefetch_factor: int | None = None,
    **task_options: Any,
) -> ShardLoader:
    """Make the batch loader of one rank for reconstruction or classification.

    Args:
        urls: shards, as accepted by :func:`loopdata.expand_urls` (brace patterns, globs, directories,
            comma/space separated lists). Their order defines the evaluation sample order.
        task: ``"reconstruction"`` or ``"classification"``.
        train: training (augmented, shuffled, fixed epoch length, corrupt samples skipped and counted)
            or evaluation (deterministic, every sample exactly once across ranks and workers).
        batch_size: samples per batch and rank.
        num_workers: DataLoader worker processes (0 = load in this process).
        resolution: output height and width R.
        rank, world_size: default to the torch.distributed group, then ``RANK``/``WORLD_SIZE``, then 0/1.
        seed: base seed; the same seed and layout give the same batches.
        epoch, start_batch: position of the first iteration (see :meth:`ShardLoader.set_epoch`).
        resampled: training draws shards with replacement (instead of a per-epoch permutation).
        shuffle_buffer: training shuffle-buffer size in samples.
        skip_corrupt: evaluation skips undecodable samples (counted and logged) instead of raising
            :class:`loopdata.CorruptSampleError`.
        max_pixels: decompression-bomb guard: images with more pixels are treated as undecodable (skipped
            and counted in training, named in evaluation); default ``$LOOPDATA_MAX_PIXELS`` or 64 Mi.
        pin_memory, prefetch_factor: passed to the DataLoader.
        **task_options: :class:`loopdata.ReconstructionOptions` or :class:`loopdata.ClassificationOptions`
            fields, e.g. ``scale=(1.0, 1.25)``, ``protocol="cifar"``, ``mixup_alpha=0.0``.

    Returns:
        A :class:`ShardLoader` yielding dicts with ``"image"`` float32 (N, 3, R, R), ``"key"`` and
        ``"label"`` when present.

    Raises:
        ValueError: bad arguments, missing shards, an empty split, or a training split too small to give
            every rank one full batch.
    """
    if task not in ("reconstruction", "classification"):
        raise ValueError(f"unknown task {task!r}; choose 'reconstruction' or 'classification'")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be an integer >= 0, got {num_workers!r}")
    rank, world_size = resolve_rank(rank, world_size)
    options = make_options(task, **task_options)
    transforms = build_transforms(task, train, resolution, options)
    shard_urls = expand_urls(urls)
    counts = shard_counts(shard_urls)
    if sum(counts) == 0:
        raise ValueError(f"the shards hold no samples: {shard_urls}")
    slots = world_size * max(num_workers, 1)
    if len(shard_urls) < slots:
        logger.info(
            "loopdata: %d shard(s) < %d ranks x workers: each worker reads every shard and keeps its own "
            "samples (correct, but more I/O; write more shards for large data)",
            len(shard_urls),
            slots,
        )
    counter = multiprocessing.get_context().Value("q", 0)
    first_pass = multiprocessing.get_context().Value("q", 0)
    repeats = train_repeats(options, train)  # repeated augmentation (loopdata.repeated), classification training
    dataset = (RepeatedAugDataset if repeats > 1 else ShardDataset)(
        shard_urls,
        counts,
        transforms,
        train=train,
        batch_size=batch_size,
        rank=rank,
        world_size=world_size,
        seed=seed,
        resampled=resampled,
        shuffle_buffer=shuffle_buffer,
        skip_corrupt=skip_corrupt,
        corrupt_counter=counter,
        max_pixels=max_pixels,
        first_pass_counter=first_pass,
        **({"repeats": repeats} if repeats > 1 else {}),
    )
    if repeats > 1:
        dataset.warn_if_poorly_spread(num_workers)
    loader = ShardLoader(dataset, num_workers, pin_memory=pin_memory, prefetch_factor=prefetch_factor)
    loader.set_epoch(epoch, start_batch)
    return loader
