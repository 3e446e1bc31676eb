"""Plots of the recurrence study (``benchmarks/study_recursion.py``): one PNG per figure of the report."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(plt, fig, axes: list, path: Path, legend_size: int = 7) -> None:
    """Grid on every axis, a legend on the first, then save ``path`` and free the figure."""
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_all(summary: dict[str, Any], results: dict[str, dict], picks: dict[str, dict], settings: dict,
             folder: Path) -> None:
    """Write ``loss_curves``, ``fusion``, ``routers``, ``supervision``, ``solver``, ``state_norms`` and ``per_step``
    PNGs."""
    plot_losses(summary, results, picks, settings, folder / "loss_curves.png")
    plot_fusion(summary, folder / "fusion.png")
    plot_routers(summary, folder / "routers.png")
    plot_horizon(summary, ["bvit-euler", "bvit-euler-ds3"], folder / "supervision.png", "bViT: deep supervision")
    plot_horizon(summary, ["bvit-euler", "bvit-heun", "bvit-heun-T6h2", "bvit-blackbox"], folder / "solver.png",
                 "bViT: solvers and fields")
    plot_norms(summary, folder / "state_norms.png")
    plot_steps(summary, ["bvit-euler", "bvit-euler-ds3", "bvit-blackbox", "bvit-heun", "bvit-T3", "bvit-T5"],
               folder / "per_step.png")


def plot_losses(summary, results, picks, settings, path: Path) -> None:
    """Training loss (10-step window means) of each sweep arm: picked lr seed mean solid, other lrs dashed."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for i, pick in enumerate(picks.values()):
        color = f"C{i}"
        curve = summary[pick["arm"]]["loss_curve"]
        ax.plot(*zip(*curve), color=color, lw=1.8, label=f"{pick['arm']} lr {pick['lr']:g} (seed mean)")
        for lr in sorted(float(v) for v in pick["losses"]):
            if lr == pick["lr"]:
                continue
            run = results[f"{pick['arm']}-lr{lr:g}-s{settings['seeds'][0]}"]
            if not run["diverged"]:
                ax.plot(*zip(*run["loss_curve"]), color=color, lw=0.8, ls="--" if lr < pick["lr"] else ":",
                        alpha=0.7)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (label-smoothed CE)")
    ax.set_title("Loss curves (dashed: lower lr, dotted: higher lr; seed 0)")
    _finish(plt, fig, [ax], path)


def plot_fusion(summary, path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=120)
    base = summary["srvit-R1-last"]["top1"]
    modes = [m for m in ("token", "query", "global", "mean", "last")
             if "top1" in summary.get(f"srvit-R2-{m}", {}) and "top1" in summary.get(f"srvit-R4-{m}", {})]
    for k, mode in enumerate(modes):
        stats = [base, summary[f"srvit-R2-{mode}"]["top1"], summary[f"srvit-R4-{mode}"]["top1"]]
        offset = 0.04 * (k - (len(modes) - 1) / 2)
        xs = [1 + offset, 2 + offset, 4 + offset]
        ax.errorbar(xs, [s.mean for s in stats], yerr=[s.sd for s in stats], marker="o", capsize=3,
                    label=f"fusion_mode={mode}")
    ax.set_xticks([1, 2, 4])
    ax.set_xlabel("recursion R (every block applied R times)")
    ax.set_ylabel("CIFAR-10 top-1 (%), mean ± s.d.")
    ax.set_title("SR-ViT (half-width Ti)")
    _finish(plt, fig, [ax], path, legend_size=9)


def plot_routers(summary, path: Path) -> None:
    """Heatmaps of the trained R=4 routers' mean weight per block and step, and entropy during training."""
    plt = _pyplot()
    names = [n for n in ("srvit-R4-token", "srvit-R4-query") if "router_weights" in summary[n]]
    fig, axes = plt.subplots(1, len(names) + 1, figsize=(4 * (len(names) + 1), 3.8), dpi=120)
    for ax, name in zip(axes, names):
        grid = [[w.mean for w in block] for block in summary[name]["router_weights"]]
        image = ax.imshow(grid, vmin=0, vmax=max(0.5, max(map(max, grid))), cmap="viridis", aspect="auto")
        for j, row in enumerate(grid):
            for i, w in enumerate(row):
                ax.text(i, j, f"{w:.2f}", ha="center", va="center", fontsize=6, color="white" if w < 0.4 else "black")
        ax.set_xticks(range(len(grid[0])), [str(i + 1) for i in range(len(grid[0]))])
        ax.set_xlabel("recursion step")
        ax.set_ylabel("block")
        ax.set_title(f"{name}: mean weight")
        fig.colorbar(image, ax=ax, fraction=0.046)
    ax = axes[-1]
    for name in ("srvit-R2-token", "srvit-R2-query", "srvit-R4-token", "srvit-R4-query"):
        curve = summary[name].get("entropy_curve")
        if curve:
            r = summary[name]["horizon"]
            ax.plot([p[0] for p in curve], [p[1] / math.log(r) for p in curve], label=name)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("mean router entropy / ln R")
    ax.set_title("router entropy in training")
    _finish(plt, fig, [ax], path)


def plot_horizon(summary, names: list[str], path: Path, title: str) -> None:
    """Top-1 vs evaluation depth as a multiple of each arm's training horizon T."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=120)
    for name in names:
        e = summary[name]
        if "by_steps" not in e:
            continue
        keys = [k for k in e["horizon_steps"] if k in e["by_steps"]]
        ax.errorbar([int(k) / e["horizon"] for k in keys], [e["by_steps"][k].mean for k in keys],
                    yerr=[e["by_steps"][k].sd for k in keys], marker="o", capsize=3, label=name)
    ax.axvline(1.0, color="grey", ls=":", lw=1)
    ax.set_xlabel("evaluation steps / training steps T")
    ax.set_ylabel("CIFAR-10 top-1 (%), mean ± s.d.")
    ax.set_title(title)
    _finish(plt, fig, [ax], path)


def plot_norms(summary, path: Path) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), dpi=120)
    for name, e in summary.items():
        if "state_norms" not in e:
            continue
        axes[0].semilogy(range(len(e["state_norms"])), [s.mean for s in e["state_norms"]], label=name)
        axes[1].semilogy(range(1, len(e["direction_change"]) + 1), [max(s.mean, 1e-8) for s in e["direction_change"]],
                         label=name)
    axes[0].set_xlabel("step t")
    axes[0].set_ylabel("mean token state norm")
    axes[1].set_xlabel("step t")
    axes[1].set_ylabel("|u_t - u_(t-1)| of unit states")
    for ax in axes:
        ax.axvline(12, color="grey", ls=":", lw=1)
    fig.suptitle("bViT state growth per step (run to 4x the horizon)")
    _finish(plt, fig, list(axes), path)


def plot_steps(summary, names: list[str], path: Path) -> None:
    """Top-1 at every evaluated step (absolute steps, inside and beyond each arm's horizon T; T marked)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4), dpi=120)
    for i, name in enumerate(names):
        e = summary.get(name, {})
        if "by_steps" not in e:
            continue
        keys = sorted(e["by_steps"], key=int)
        ax.plot([int(k) for k in keys], [e["by_steps"][k].mean for k in keys], marker=".", color=f"C{i}",
                label=f"{name} (T={e['horizon']})")
        ax.axvline(e["horizon"], color=f"C{i}", ls=":", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("evaluation step t (log scale; dotted: each arm's T)")
    ax.set_ylabel("CIFAR-10 top-1 (%), seed mean")
    ax.set_title("bViT: top-1 after every step")
    _finish(plt, fig, [ax], path)
