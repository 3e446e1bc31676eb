"""Classification evaluation: top-1 / top-5 and top-1 as a function of the number of recursion steps.

``by_steps[n]`` is the top-1 accuracy when every block runs ``n`` steps instead of the trained
``recursion`` (``n`` above it = beyond the training horizon), same weights. For a single-block model
without fusion (bViT) the state after ``n`` steps is a prefix of the longest run, so one forward with
the largest ``n`` yields every entry exactly; other models run once per ``n``.

Every image is counted exactly once across ranks (loopdata's evaluation split); counts are summed over
ranks before dividing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

import loopdata
from looprun.checkpoint import write_atomic
from looprun.distributed import gather_objects, init_distributed, sum_across_ranks
from looprun.plotting import plot_or_warn, pyplot
from looprun.speed import compile_in_place

from .loading import load_classifier
from .model import RecursiveViT

log = logging.getLogger("srvit.eval")

DEFAULT_STEPS = (3, 6, 12, 24, 48)


@dataclass
class Counts:
    """Correct predictions (summable across ranks and batches)."""

    num_images: int = 0
    top1: int = 0
    top5: int = 0
    by_steps: dict[int, int] = field(default_factory=dict)

    def merge(self, other: Counts) -> Counts:
        steps = {n: self.by_steps.get(n, 0) + other.by_steps.get(n, 0) for n in {*self.by_steps, *other.by_steps}}
        return Counts(self.num_images + other.num_images, self.top1 + other.top1, self.top5 + other.top5, steps)


def _correct(logits: torch.Tensor, labels: torch.Tensor, k: int) -> int:
    k = min(k, logits.shape[-1])
    return int((logits.topk(k, dim=-1).indices == labels[:, None]).any(dim=-1).sum())


@torch.no_grad()
def batch_counts(
    model: RecursiveViT, images: torch.Tensor, labels: torch.Tensor, steps: Sequence[int] = (),
    autocast: bool = False,
) -> Counts:
    """Counts for one batch: top-1/top-5 at the trained recursion and top-1 at every ``steps`` entry.

    ``images``: ``(B, 3, H, W)`` normalised; ``labels``: int64 ``(B,)`` in ``[0, num_classes)``.
    """
    device_type = images.device.type
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast):
        logits = model(images).float()
        counts = Counts(images.shape[0], _correct(logits, labels, 1), _correct(logits, labels, 5))
        steps = sorted({int(n) for n in steps})
        if not steps:
            return counts
        if model.config.depth == 1 and model.fusions is None:
            per_step = model.forward_steps(images, steps=steps[-1])
            step_logits = {n: per_step[n - 1] for n in steps}
        else:  # the trained recursion's logits are already computed above
            step_logits = {n: logits if n == model.config.recursion else model(images, steps=n) for n in steps}
    counts.by_steps = {n: _correct(out.float(), labels, 1) for n, out in step_logits.items()}
    return counts


def evaluate_model(
    model: RecursiveViT, loader, device: torch.device, steps: Sequence[int] = (), autocast: bool = False,
    limit: int | None = None, ctx=None,
) -> Counts:
    """Accumulate :class:`Counts` over ``loader`` (every rank's share), summed over ranks when ``ctx`` is given."""
    model.eval()
    total = Counts()
    for batch in loader:
        if not batch["key"]:  # an empty batch that only names skipped samples (--skip-corrupt)
            continue
        if "label" not in batch:
            raise ValueError("the evaluation shards have no .cls labels; classification eval needs labelled data")
        images, labels = batch["image"].to(device), batch["label"].to(device)
        if labels.ndim != 1:
            raise ValueError("evaluation got soft labels; build the eval loader with train=False (no mixing)")
        if limit is not None:
            room = limit - total.num_images
            if room <= 0:
                break
            images, labels = images[:room], labels[:room]
        total = total.merge(batch_counts(model, images, labels, steps, autocast))
    if ctx is not None:
        merged = Counts()
        for part in gather_objects(total, ctx):
            merged = merged.merge(part)  # type: ignore[arg-type]
        total = merged
    return total


@dataclass
class EvalOptions:
    steps: tuple[int, ...] = DEFAULT_STEPS
    batch_size: int = 128
    num_workers: int = 2
    resolution: int | None = None  # default: the model's img_size
    protocol: str | None = None  # default: from the run's config, else imagenet
    limit: int | None = None  # per rank
    weights: str = "ema"
    device: str = "auto"
    plot: bool = True
    skip_corrupt: bool = False
    compile: bool = False  # torch.compile the classifier (each evaluated step count compiles once)
    solver: str | None = None  # evaluate with this solver instead of the trained one (euler | heun | rk4 | blackbox)
    step_size: float | None = None  # ... and / or this step size h (integration time = steps x h)


def evaluate(checkpoint: str | Path, data: str | list[str], out_dir: str | Path, options: EvalOptions) -> dict:
    """``srvit eval``: evaluate ``checkpoint`` on ``data``; writes ``metrics.json`` and ``accuracy_vs_steps.png``."""
    ctx = init_distributed(options.device)
    loaded = load_classifier(checkpoint, options.weights)
    model = loaded.model.to(ctx.device)
    trained_solver = (model.config.solver, model.config.step_size)
    if options.solver is not None or options.step_size is not None:
        solver = model.use_solver(options.solver, options.step_size)
        log.info("evaluating with %s, h = %g (trained: %s, h = %g)", solver.method, solver.step_size, *trained_solver)
    if options.compile:
        compile_in_place(model)
    cfg = model.config
    resolution = options.resolution or cfg.img_size
    protocol = options.protocol or loaded.protocol or "imagenet"
    loader = loopdata.make_loader(
        data, task="classification", train=False, batch_size=options.batch_size, num_workers=options.num_workers,
        resolution=resolution, rank=ctx.rank, world_size=ctx.world_size, protocol=protocol,
        num_classes=cfg.num_classes, skip_corrupt=options.skip_corrupt,
    )
    autocast = ctx.device.type == "cuda"
    counts = evaluate_model(model, loader, ctx.device, options.steps, autocast, options.limit, ctx)
    if counts.num_images == 0:
        raise ValueError(f"no images were evaluated from {data}")
    n = counts.num_images
    metrics = {
        "top1": counts.top1 / n,
        "top5": counts.top5 / n,
        "num_images": n,
        "skipped_corrupt": sum_across_ranks(loader.corrupt_count, ctx),
        "steps": cfg.recursion,
        "by_steps": {str(k): counts.by_steps[k] / n for k in sorted(counts.by_steps)},
        "training_horizon": cfg.recursion,
        "model": {"family": cfg.family, "depth": cfg.depth, "embed_dim": cfg.embed_dim, "recursion": cfg.recursion,
                  "fusion_mode": cfg.fusion_mode, "solver": cfg.solver, "step_size": cfg.step_size,
                  "eval_solver": model.solver.method, "eval_step_size": model.solver.step_size,
                  "parameters": sum(p.numel() for p in model.parameters())},
        "checkpoint": loaded.source, "kind": loaded.kind, "weights": loaded.weights, "step": loaded.step,
        "weights_sha256": loaded.weights_sha256,
        "protocol": protocol, "resolution": resolution, "data": data if isinstance(data, str) else list(data),
        "world_size": ctx.world_size, "autocast_bf16": autocast,
    }
    if ctx.is_main:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / "metrics.json", json.dumps(metrics, indent=2))
        if options.plot and metrics["by_steps"]:
            plot_or_warn(plot_accuracy_vs_steps, {"model": metrics["by_steps"]}, cfg.recursion,
                         out / "accuracy_vs_steps.png", log=log)
    return metrics


def plot_accuracy_vs_steps(
    curves: dict[str, dict[str, float]], horizon: int | None, path: str | Path, title: str = "top-1 vs steps"
) -> Path:
    """Plot ``{label: {steps: top1}}`` curves (log-2 step axis), with the training horizon marked."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=120)
    for label, curve in curves.items():
        xs = sorted(int(k) for k in curve)
        ax.plot(xs, [100 * curve[str(x)] for x in xs], marker="o", label=label)
    if horizon is not None:
        ax.axvline(horizon, color="grey", linestyle="--", linewidth=1, label=f"training horizon ({horizon})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("recursion steps at test time")
    ax.set_ylabel("top-1 (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)
