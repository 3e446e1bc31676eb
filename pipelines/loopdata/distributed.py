"""Rank / worker arithmetic for exact distributed data loading.

Everything here is pure integer arithmetic so that every rank and every DataLoader worker can compute
the same plan independently, without communication:

* **Evaluation** splits the ordered sample sequence (shards in the order given, samples in tar order)
  into ``world_size * num_workers`` *contiguous* ranges whose sizes differ by at most one. Slot
  ``s = rank * num_workers + worker`` reads ``[s * N // S, (s + 1) * N // S)``. Every sample is read
  exactly once whatever the shard count (3 ranks over 2 shards works), and each worker only opens the
  shards its range overlaps. Ranks can therefore get different numbers of batches: see :func:`eval_plan`.
* **Training** gives every rank the same number of full batches per epoch,
  ``floor(N / (world_size * batch_size))`` (``drop_last`` semantics), so no rank waits for another at an
  all-reduce. The batches of a rank are dealt round-robin to its workers (batch ``j`` comes from worker
  ``j % num_workers``), which is the order in which :class:`torch.utils.data.DataLoader` returns them.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import torch.distributed as dist


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Return ``(rank, world_size)``, defaulting to the torch.distributed environment.

    Explicit values win. Otherwise the initialised default process group is used, then the ``RANK`` and
    ``WORLD_SIZE`` environment variables set by ``torchrun``, then a single process ``(0, 1)``.
    """
    if rank is None or world_size is None:
        if dist.is_available() and dist.is_initialized():
            env_rank, env_world = dist.get_rank(), dist.get_world_size()
        elif "WORLD_SIZE" in os.environ and "RANK" in os.environ:
            env_rank, env_world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        else:
            env_rank, env_world = 0, 1
        rank = env_rank if rank is None else rank
        world_size = env_world if world_size is None else world_size
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an integer in [0, world_size={world_size}), got {rank!r}")
    return rank, world_size


def split_evenly(total: int, parts: int, index: int) -> int:
    """Size of part ``index`` when ``total`` items are dealt round-robin to ``parts`` parts.

    Equals the number of ``j in range(total)`` with ``j % parts == index``.
    """
    return total // parts + (1 if index < total % parts else 0)


def slot_range(num_samples: int, num_slots: int, slot: int) -> tuple[int, int]:
    """Contiguous sample range ``[start, stop)`` of one (rank, worker) slot in evaluation."""
    return slot * num_samples // num_slots, (slot + 1) * num_samples // num_slots


@dataclass(frozen=True)
class RankShare:
    """What one rank receives from an evaluation loader.

    Attributes:
        rank: the rank.
        num_samples: samples this rank yields (each sample of the split goes to exactly one rank).
        num_batches: batches this rank yields; every worker's last batch may be partial.
        worker_samples: samples per DataLoader worker of this rank.
    """

    rank: int
    num_samples: int
    num_batches: int
    worker_samples: tuple[int, ...]


def eval_plan(num_samples: int, world_size: int, num_workers: int, batch_size: int) -> list[RankShare]:
    """Per-rank sample and batch counts of an evaluation loader (index = rank).

    ``num_workers=0`` (loading in the main process) counts as one worker. Use this to size gathered
    metric buffers: the ranks' ``num_batches`` can differ by a few, so an eval loop must not put
    collectives inside the per-batch loop.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    workers = max(num_workers, 1)
    slots = world_size * workers
    plan = []
    for rank in range(world_size):
        per_worker = []
        for worker in range(workers):
            start, stop = slot_range(num_samples, slots, rank * workers + worker)
            per_worker.append(stop - start)
        batches = sum(-(-n // batch_size) for n in per_worker)
        plan.append(RankShare(rank, sum(per_worker), batches, tuple(per_worker)))
    return plan


def train_steps_per_epoch(num_samples: int, world_size: int, batch_size: int) -> int:
    """Batches every rank yields per training epoch: ``floor(num_samples / (world_size * batch_size))``.

    Floor (not ceil) so that an epoch never needs more distinct samples than the split holds; every
    batch is full. Raises ``ValueError`` when the split cannot fill one batch on every rank.
    """
    steps = num_samples // (world_size * batch_size)
    if steps < 1:
        raise ValueError(
            f"cannot train: {num_samples} samples are fewer than world_size * batch_size = "
            f"{world_size} * {batch_size} = {world_size * batch_size}, so a rank would get no full batch; "
            "use a smaller batch_size or more data"
        )
    return steps


def worker_role(worker: int, num_workers: int, start_batch: int) -> int:
    """Which round-robin role a DataLoader worker plays when an epoch is resumed at ``start_batch``.

    A fresh DataLoader always asks worker 0 first, but batch ``start_batch`` was originally produced by
    role ``start_batch % num_workers``; rotating roles keeps the resumed batch sequence identical.
    """
    return (worker + start_batch) % num_workers


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from a tuple such as ``(seed, epoch, rank, worker, sample_index)``.

    Hash-based so that nearby tuples give unrelated streams (``seed + rank`` style sums collide).
    """
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
