"""``loopvae profile --breakdown``: where a tokenizer's time goes, by op class, against a roofline.

For each model, two steps are broken down (:mod:`loopcore.op_breakdown`):

* ``forward``: one reconstruction, encoder -> latent sample -> decoder, without gradients (what ``loopvae
  eval`` and ``encode`` run), at the profile's batch and resolution;
* ``train``: one optimisation step as ``loopvae train --config release-tiny`` runs it: noisy posterior sample,
  decode, L1 + 10 MSE + KL, backward, gradient clipping, AdamW (the conditioning path at 10x the rate), EMA
  update; by default on 8 crops of 64^2, the crops every CPU study trains on. The optimizer's, clipping's and
  EMA's ops are filed under ``optimizer``.

Each op class gets its time, MACs, bytes moved, arithmetic intensity and the fraction of this machine's
roofline it reaches (peak FLOP/s and memory bandwidth measured by a short probe, stated in the report).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

from loopcore.op_breakdown import OP_CLASSES, MachinePeaks, attribute_ops_to, breakdown
from looprun.optimization import EMA
from looprun.plotting import pyplot
from looprun.speed import prepare_for_speed, to_memory_format

from .autoencoders import encode_sample
from .losses import LossWeights, ReconstructionObjective
from .registry import create_model
from .train_config import load_train_config
from .trainer import ReconstructionStep, parameter_groups

log = logging.getLogger("loopvae.breakdown")

TRAIN_PRESET = "release-tiny"  # the recipe whose step is profiled (the CPU studies' and the bundled model's)


def forward_step(model: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    """One reconstruction of ``x`` (``(B, 3, H, W)`` in [-1, 1]) without gradients."""

    @torch.no_grad()
    def step() -> None:
        model.decode(encode_sample(model, x))

    return step


def training_step(model: torch.nn.Module, x: torch.Tensor, preset: str = TRAIN_PRESET) -> Callable[[], None]:
    """One optimisation step of ``model`` on ``x`` with the loss, optimizer, clipping and EMA of ``preset``
    (see the module docstring); the model must be in train mode."""
    cfg = load_train_config(preset)
    step_module = ReconstructionStep(model, cfg.latent_noise_std, deep_supervision=False)
    objective = ReconstructionObjective(LossWeights(l1=cfg.l1_weight, mse=cfg.mse_weight, perceptual=0.0,
                                                    kl=cfg.kl_weight, deep_supervision=0.0))
    optimizer = torch.optim.AdamW(parameter_groups(model, cfg.lr, cfg.modulation_lr_scale), lr=cfg.lr,
                                  betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    ema = EMA(model, cfg.ema_decay)
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        recon, moments, passes = step_module(x)
        posterior = None if moments is None else DiagonalGaussianDistribution(moments)
        objective(x, recon, posterior, 0, pass_recons=passes).total.backward()
        with attribute_ops_to("optimizer"):
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
            optimizer.step()
            ema.update(model)

    return step


def breakdown_model(
    name: str, peaks: MachinePeaks, batch: int = 1, resolution: int = 256, train_batch: int = 8,
    train_resolution: int = 64, memory_format: str = "channels_last", repeats: int = 3,
) -> dict[str, Any]:
    """``{"model", "forward": ..., "train": ...}``: :meth:`OpBreakdown.to_json` of both steps of ``name``
    (random-initialised weights, seed 0: time does not depend on trained values)."""
    out: dict[str, Any] = {"model": name, "memory_format": memory_format}
    torch.manual_seed(0)
    model = prepare_for_speed(create_model(name).eval(), memory_format)
    x = to_memory_format(torch.rand(batch, 3, resolution, resolution) * 2 - 1, memory_format)
    out["forward"] = {"batch": batch, "resolution": resolution,
                      **breakdown(forward_step(model, x), peaks, warmup=1, repeats=repeats).to_json()}
    torch.manual_seed(0)
    model = prepare_for_speed(create_model(name).train(), memory_format)
    x = to_memory_format(torch.rand(train_batch, 3, train_resolution, train_resolution) * 2 - 1, memory_format)
    out["train"] = {"batch": train_batch, "resolution": train_resolution, "preset": TRAIN_PRESET,
                    **breakdown(training_step(model, x), peaks, warmup=2, repeats=repeats).to_json()}
    return out


def _fmt(v: float | None, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def render_breakdown(results: list[dict[str, Any]], peaks: MachinePeaks) -> str:
    """Markdown: per step kind, one table per model (class, calls, ms, share, GMACs, MB, FLOP/B, roofline ms,
    achieved), then the classes side by side and the first model's time and MACs against each other's."""
    lines = [
        "## Where the time goes, by op class", "",
        f"Machine peaks (the roofline): {peaks.flops_per_s / 1e9:.1f} GFLOP/s, {peaks.bytes_per_s / 1e9:.1f} GB/s "
        f"({peaks.how}). Per op: time of the kernel call, MACs (torch's formulas; convolution backward with groups), "
        "bytes it must move at least (each distinct input read once, each output written once; views move none), "
        "roofline time = max(FLOPs / peak, bytes / bandwidth); achieved = roofline time / measured time (above "
        "100%: the class beat a ceiling, as elementwise ops do when their operands are still in the caches, which "
        "serve them faster than the DRAM copy that sets the bandwidth ceiling). "
        "`plain` is the step's median wall time without instrumentation; the recorder adds a few µs per op, "
        "shown as time outside ops (Python, autograd, dispatch, the recorder).", "",
    ]
    for kind, title in (("forward", "Reconstruction (no gradients)"), ("train", "Training step")):
        first = results[0][kind]
        what = (f"batch {first['batch']}, {first['resolution']}²" if kind == "forward" else
                f"{first['batch']} crops of {first['resolution']}², the `{first['preset']}` recipe's step "
                "(L1 + MSE + KL, backward, clipping, AdamW, EMA)")
        lines += [f"### {title}: {what}", ""]
        for r in results:
            b = r[kind]
            lines += [f"`{r['model']}`: plain {b['plain_ms']:.1f} ms, {b['gmacs']:.2f} GMACs; instrumented "
                      f"{b['instrumented_ms']:.1f} ms = {b['op_ms']:.1f} ms in ops + {b['outside_ops_ms']:.1f} ms "
                      f"outside; roofline {b['roofline_ms']:.1f} ms ({100 * b['roofline_ms'] / b['op_ms']:.0f}% of "
                      "the op time).", "",
                      "| op class | calls | ms | share | GMACs | MB moved | FLOP / B | roofline ms | achieved |",
                      "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for row in b["rows"]:
                lines.append(f"| {row['class']} | {row['calls']} | {row['ms']:.1f} | {100 * row['share']:.1f}% | "
                             f"{row['gmacs']:.3f} | {row['mb']:.1f} | {_fmt(row['intensity'], '.1f')} | "
                             f"{row['roofline_ms']:.2f} | {_fmt(row['achieved'], '.0%')} |")
            lines.append("")
        if len(results) > 1:
            first = results[0]
            names = [r["model"] for r in results]
            lines += ["Side by side (ms per class):", "",
                      "| op class | " + " | ".join(f"`{n}`" for n in names) + " |",
                      "|---|" + "---:|" * len(names)]
            per = [{row["class"]: row["ms"] for row in r[kind]["rows"]} for r in results]
            for cls in OP_CLASSES:
                if any(cls in p for p in per):
                    lines.append(f"| {cls} | " + " | ".join(f"{p.get(cls, 0.0):.1f}" for p in per) + " |")
            lines.append("| **op total** | " + " | ".join(f"**{r[kind]['op_ms']:.1f}**" for r in results) + " |")
            lines.append("| plain step | " + " | ".join(f"{r[kind]['plain_ms']:.1f}" for r in results) + " |")
            ratios = [f"`{first['model']}` / `{r['model']}`: time "
                      f"{first[kind]['plain_ms'] / r[kind]['plain_ms']:.2f}× (op time "
                      f"{first[kind]['op_ms'] / r[kind]['op_ms']:.2f}×), MACs "
                      f"{first[kind]['gmacs'] / r[kind]['gmacs']:.2f}×" for r in results[1:]]
            lines += ["", "; ".join(ratios) + ".", ""]
    lines += ["![time by op class](breakdown.png)", ""]
    return "\n".join(lines)


def plot_breakdown(results: list[dict[str, Any]], path: Path) -> None:
    """Stacked bars: ms per op class of each model, one panel per step kind, topped by the plain step's time
    outside ops (plain time minus op time; the instrumented overhead is left out)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    for ax, kind in zip(axes, ("forward", "train"), strict=True):
        bottoms = [0.0] * len(results)
        for i, cls in enumerate(OP_CLASSES):
            heights = [next((row["ms"] for row in r[kind]["rows"] if row["class"] == cls), 0.0) for r in results]
            if not any(heights):
                continue
            ax.bar(range(len(results)), heights, bottom=bottoms, label=cls, color=f"C{i % 10}")
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
        outside = [r[kind]["framework_ms"] for r in results]
        ax.bar(range(len(results)), outside, bottom=bottoms, color="lightgrey", hatch="//",
               label="outside ops (plain step − op time)")
        ax.set_xticks(range(len(results)), [r["model"] for r in results], rotation=15, fontsize=8)
        first = results[0][kind]
        ax.set(ylabel="ms per step", title=f"{'reconstruction' if kind == 'forward' else 'training step'}: batch "
                                             f"{first['batch']}, {first['resolution']}²")
        ax.grid(alpha=0.3, axis="y")
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
