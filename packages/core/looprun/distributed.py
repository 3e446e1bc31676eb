"""Process-group set-up for single-process, torchrun and multi-node runs.

Without ``torchrun`` (no ``WORLD_SIZE`` in the environment) everything runs in one process with no
process group. Under ``torchrun`` we initialise ``gloo`` on CPU and ``nccl`` on CUDA from the
environment variables torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ...).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistributedContext:
    """Where this process sits: ``rank`` of ``world_size``, its ``device``, and whether it logs."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(preference: str = "auto", local_rank: int = 0) -> torch.device:
    """``auto`` -> ``cuda:<local_rank>`` when CUDA is available, else ``cpu``; ``cpu``/``cuda`` force it."""
    if preference == "auto":
        preference = "cuda" if torch.cuda.is_available() else "cpu"
    if preference == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' was requested but torch.cuda.is_available() is False")
        return torch.device("cuda", local_rank)
    if preference == "cpu":
        return torch.device("cpu")
    raise ValueError(f"unknown device {preference!r}; choose auto, cpu or cuda")


def init_distributed(device: str = "auto", timeout_s: float = 1800.0) -> DistributedContext:
    """Initialise the default process group when launched by torchrun; no-op otherwise.

    Returns the :class:`DistributedContext` of this process. Safe to call when a group already exists.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank)
    if world_size > 1:
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        if not dist.is_initialized():
            backend = "nccl" if dev.type == "cuda" else "gloo"
            dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
        rank, world_size = dist.get_rank(), dist.get_world_size()
    return DistributedContext(rank, world_size, local_rank, dev)


def shutdown_distributed() -> None:
    """Destroy the process group if one exists."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def any_rank(flag: bool, ctx: DistributedContext) -> bool:
    """True on every rank if ``flag`` is true on any rank (so all ranks take the same branch)."""
    if not ctx.distributed:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def sum_across_ranks(value: int, ctx: DistributedContext) -> int:
    """The sum of an integer over ranks, on every rank."""
    if not ctx.distributed:
        return value
    t = torch.tensor([value], device=ctx.device, dtype=torch.int64)
    dist.all_reduce(t)
    return int(t.item())


def mean_across_ranks(values: dict[str, float], ctx: DistributedContext) -> dict[str, float]:
    """Average scalar metrics over ranks (for logging)."""
    if not ctx.distributed or not values:
        return values
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], device=ctx.device, dtype=torch.float64)
    dist.all_reduce(t)
    t /= ctx.world_size
    return dict(zip(keys, t.tolist()))


def barrier(ctx: DistributedContext) -> None:
    if ctx.distributed:
        dist.barrier()


def average_gradients(params: list[torch.nn.Parameter], ctx: DistributedContext) -> None:
    """All-reduce-average ``.grad`` of ``params`` over ranks (for modules not wrapped in DDP, e.g. a
    discriminator trained with an R1 double-backward that DDP's reducer does not support)."""
    if not ctx.distributed:
        return
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= ctx.world_size


def gather_objects(obj: object, ctx: DistributedContext) -> list[object]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank."""
    if not ctx.distributed:
        return [obj]
    out: list[object] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


_FAILURE_KEY = "loopvision/failure"


class RemoteRankError(RuntimeError):
    """Another rank failed; the message carries its rank and one-line error."""


def _store(ctx: DistributedContext):
    if not ctx.distributed:
        return None
    getter = getattr(dist.distributed_c10d, "_get_default_store", None)
    return getter() if getter is not None else None


def report_failure(ctx: DistributedContext, message: str) -> None:
    """Tell the other ranks, without a collective, that this rank failed (see :func:`reported_failure`)."""
    store = _store(ctx)
    if store is not None:
        store.set(_FAILURE_KEY, f"rank {ctx.rank}: {message}")


def reported_failure(ctx: DistributedContext) -> str | None:
    """The failure another rank reported with :func:`report_failure`, or ``None``; never blocks.

    Ranks with different amounts of work (evaluation splits) cannot all-reduce inside their loops; they
    poll this between batches instead, so one rank's error stops every rank promptly.
    """
    store = _store(ctx)
    if store is None or not store.check([_FAILURE_KEY]):
        return None
    return store.get(_FAILURE_KEY).decode()


def raise_if_any_rank_failed(error: BaseException | None, what: str, ctx: DistributedContext) -> None:
    """Collective, called by every rank after its share of work: when any rank failed, every rank raises.

    The failing rank reports its one-line error (:func:`report_failure`) and re-raises ``error``; the others raise
    :class:`RemoteRankError` ("``what`` failed on another rank: rank N: ..."), so no rank waits in a later
    collective for a peer that is gone.
    """
    if error is not None:
        text = str(error).strip()
        report_failure(ctx, text.splitlines()[-1] if text else type(error).__name__)
    if any_rank(error is not None, ctx):
        if error is not None:
            raise error
        raise RemoteRankError(f"{what} failed on another rank: {reported_failure(ctx) or 'see its log'}")
