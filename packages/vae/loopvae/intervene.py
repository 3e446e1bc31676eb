"""``loopvae intervene``: loop-truncation, single-pass bypass and relative-update analysis.

For every stage of both branches: prefix truncation (run only the first k of its L passes, everything
else as trained), bypass of each single pass (its output replaced by its pre-injection input, later
loop indices unchanged), and the per-pass relative update ``RMS(h_{t+1} - h_t) / RMS(h_t)``. Each
intervention is scored per image on the float output ``u`` in [0, 1] (the paper's protocol, not uint8):
PSNR and SSIM of ``clip(u)``, raw PSNR and SSIM of ``u``, the out-of-range fraction and the clipping
displacement (:func:`loopvae.metrics.range_statistics`). Running the full prefix must reproduce the
unmodified model bit-for-bit; that is asserted at run time.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

import loopcore as lc
import loopdata
from looprun.checkpoint import write_atomic
from looprun.output_dir import prepare_output_dir
from looprun.plotting import plot_or_warn, pyplot
from looprun.run_logger import setup_run_logging, teardown_run_logging
from looprun.speed import prepare_for_speed, to_memory_format

from .loading import load_tokenizer
from .metrics import range_statistics
from .model import LoopVAE

log = logging.getLogger("loopvae.intervene")

METRICS = ("psnr", "raw_psnr", "ssim", "raw_ssim", "out_of_range", "clip_displacement")


def score(recon: torch.Tensor, target: torch.Tensor) -> dict[str, list[float]]:
    """Per-image intervention metrics (:data:`METRICS`) of an unclipped reconstruction ``(B, 3, H, W)``
    against references, both in the [-1, 1] convention; computed in float64 on [0, 1]."""
    values = range_statistics(recon, target)
    return {k: [float(v) for v in values[k]] for k in METRICS}


def _summary(per_image: dict[str, list[float]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: sum(v) / len(v) for k, v in per_image.items()}
    out["per_image"] = per_image
    return out


def _stage_names(model: LoopVAE) -> dict[str, list[str]]:
    return {
        "encoder": [f"{f}x" for f in model.encoder.factors],
        "decoder": [f"{f}x" for f in model.decoder.factors],
    }


def count_runs(model: LoopVAE) -> int:
    """Forward passes :func:`run_interventions` makes: baseline, recording, and per stage L prefixes + L bypasses."""
    return 2 + sum(2 * n for core in (model.encoder.core, model.decoder.core) for n in core.passes)


@torch.no_grad()
def run_interventions(
    model: LoopVAE, images: torch.Tensor, batch_size: int = 8, progress: bool = False
) -> dict[str, Any]:
    """All interventions on ``images`` ``(N, 3, H, W)`` in [-1, 1]; returns the ``interventions.json`` dict.

    The model may be bf16 (images are cast to its dtype); every metric is computed in float64.
    ``progress`` shows a bar over the :func:`count_runs` forward passes on stderr.
    """
    enc, dec = model.encoder.core, model.decoder.core
    images = images.float()  # the references stay float; the model's input takes its dtype
    bar = tqdm(total=count_runs(model), desc="intervene", unit="run", disable=not progress, dynamic_ncols=True)
    chunks = images.to(next(model.parameters()).dtype).split(batch_size)
    latents = [model.encode(x).latent_dist.mode() for x in chunks]  # decoder interventions reuse these

    def run(branch: str | None = None, hooks: lc.LoopHooks | None = None) -> torch.Tensor:
        bar.update(1)
        core = {"encoder": enc, "decoder": dec}.get(branch)
        with core.use_hooks(hooks) if core is not None else contextlib.nullcontext():
            if branch == "decoder":
                return torch.cat([model.decode(z).sample.float() for z in latents])
            return torch.cat([model.decode(model.encode(x).latent_dist.mode()).sample.float() for x in chunks])

    baseline = run()
    recorders = {"encoder": lc.LoopHooks(record=True), "decoder": lc.LoopHooks(record=True)}
    with enc.use_hooks(recorders["encoder"]), dec.use_hooks(recorders["decoder"]):
        recorded = run()
    if not torch.equal(recorded, baseline):
        raise RuntimeError("recording hooks changed the model output; hooks must be exact no-ops")
    names = _stage_names(model)
    stages = []
    for branch, core in (("encoder", enc), ("decoder", dec)):
        for s, n_passes in enumerate(core.passes):
            prefix = []
            for k in range(1, n_passes + 1):
                out = run(branch, lc.LoopHooks(prefix={s: k}))
                if k == n_passes and not torch.equal(out, baseline):
                    raise RuntimeError(f"full prefix of {branch} {names[branch][s]} differs from the baseline")
                prefix.append({"passes": k, **_summary(score(out, images))})
            bypass = [
                {"pass": t, **_summary(score(run(branch, lc.LoopHooks(bypass={(s, t)})), images))}
                for t in range(n_passes)
            ]
            updates = []
            for t in range(n_passes):
                records = recorders[branch].records
                values = torch.cat([r.relative_update for r in records if (r.scale, r.loop) == (s, t)])
                updates.append(float(values.mean()))
            stages.append({"branch": branch, "scale": names[branch][s], "stage_index": s, "passes": n_passes,
                           "prefix": prefix, "bypass": bypass, "relative_update": updates})
    bar.close()
    return {"num_images": images.shape[0], "baseline": _summary(score(baseline, images)), "stages": stages,
            "full_prefix_reproduces_baseline": True}


def render_markdown(result: dict[str, Any]) -> str:
    """The paper's Table-7 layout: per stage, PSNR (clipped / raw) after k retained passes, and bypasses."""
    base = result["baseline"]
    width = max(s["passes"] for s in result["stages"])
    lines = [
        "# Loop interventions", "",
        f"{result['num_images']} images, posterior mode. Baseline: PSNR {base['psnr']:.2f} dB (raw "
        f"{base['raw_psnr']:.2f}), SSIM {base['ssim']:.4f}, out of range {100 * base['out_of_range']:.1f}%.", "",
        "## Prefix truncation (PSNR clipped / raw, dB; out-of-range %)", "",
        "| branch | scale | L | " + " | ".join(f"k={k}" for k in range(1, 1 + width)) + " |",
        "|---|---|---:|" + "---:|" * width,
    ]
    for st in result["stages"]:
        cells = [f"{p['psnr']:.2f} / {p['raw_psnr']:.2f} ({100 * p['out_of_range']:.1f}%)" for p in st["prefix"]]
        cells += [""] * (width - len(cells))
        lines.append(f"| {st['branch']} | {st['scale']} | {st['passes']} | " + " | ".join(cells) + " |")
    lines += ["", "## Single-pass bypass (PSNR change vs baseline, dB) and relative update per pass", "",
              "| branch | scale | " + " | ".join(f"pass {t + 1}" for t in range(width)) + " |",
              "|---|---|" + "---:|" * width]
    for st in result["stages"]:
        cells = [f"{b['psnr'] - base['psnr']:+.2f} (r={u:.3f})" for b, u in zip(st["bypass"], st["relative_update"])]
        cells += [""] * (width - len(cells))
        lines.append(f"| {st['branch']} | {st['scale']} | " + " | ".join(cells) + " |")
    lines += ["", "Full prefixes reproduce the baseline bit-for-bit (checked at run time).", "",
              "![PSNR vs retained passes](psnr_vs_passes.png)", "", "![bypass loss](bypass_loss.png)", "",
              "![relative update](relative_update.png)", ""]
    return "\n".join(lines)


def plot(result: dict[str, Any], out: Path) -> list[Path]:
    """PSNR vs retained passes (clipped and raw), bypass loss per pass, relative update per pass."""
    plt = pyplot()

    base = result["baseline"]
    label = lambda st: f"{st['branch']} {st['scale']}"
    paths = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)
        paths.append(out / name)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=False)
    for ax, key, title in ((axes[0], "psnr", "clipped PSNR"), (axes[1], "raw_psnr", "raw PSNR (no clipping)")):
        for st in result["stages"]:
            ax.plot([p["passes"] for p in st["prefix"]], [p[key] for p in st["prefix"]], marker="o", label=label(st))
        ax.set(xlabel="retained passes k", ylabel="dB", title=title)
    axes[0].legend(fontsize=7)
    save(fig, "psnr_vs_passes.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    for st in result["stages"]:
        ax.plot([b["pass"] + 1 for b in st["bypass"]], [base["psnr"] - b["psnr"] for b in st["bypass"]],
                marker="s", label=label(st))
    ax.set(xlabel="bypassed pass", ylabel="PSNR loss (dB)", title="single-pass bypass")
    ax.legend(fontsize=7)
    save(fig, "bypass_loss.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    for st in result["stages"]:
        ax.plot(range(1, st["passes"] + 1), st["relative_update"], marker="^", label=label(st))
    ax.set(xlabel="pass", ylabel="RMS(h_{t+1}-h_t)/RMS(h_t)", title="relative update", yscale="log")
    ax.legend(fontsize=7)
    save(fig, "relative_update.png")
    return paths


def intervene(
    checkpoint: str | Path, data: str, out_dir: str | Path, limit: int = 16, resolution: int = 256,
    device: str = "cpu", weights: str = "ema", dtype: str = "fp32", progress: bool = True,
    memory_format: str = "contiguous",
) -> dict[str, Any]:
    """Load, read ``limit`` images, run :func:`run_interventions`, write json / md / plots and ``intervene.log``.

    ``weights`` picks ``ema`` or ``model`` weights of a training run directory; ``dtype`` (``fp32`` or
    ``bf16``) the model's compute dtype (metrics stay float64); ``memory_format`` the torch layout the
    model runs in (see :mod:`looprun.speed`).
    """
    from .evaluate import to_compute

    # the checkpoint and the data are checked before --out is created: a failed start leaves no files
    loaded = load_tokenizer(checkpoint, weights)
    if not isinstance(loaded.model, LoopVAE):
        raise ValueError(f"interventions need a LoopVAE; {checkpoint} is a {type(loaded.model).__name__}")
    loader = loopdata.make_loader(data, task="reconstruction", train=False, batch_size=limit, num_workers=0,
                                  resolution=resolution, rank=0, world_size=1)
    out = prepare_output_dir(out_dir, "--out")
    setup_run_logging("loopvae", out, True, 0, log_file="intervene.log")
    try:
        model = prepare_for_speed(to_compute(loaded.model, device, dtype), memory_format)
        images, keys = [], []
        for batch in loader:
            images.append(batch["image"])
            keys.extend(batch["key"])
            if len(keys) >= limit:
                break
        if not keys:
            raise ValueError(f"no images in {data}")
        x = to_memory_format(torch.cat(images)[:limit].to(device), memory_format)
        log.info("intervening on %d images from %s with %s (%s, %s weights)", len(keys[:limit]), data,
                 loaded.source, dtype, weights if loaded.kind == "run-checkpoint" else "release")
        result = run_interventions(model, x, progress=progress)
        result.update(keys=keys[:limit], model=str(loaded.source), data=data, resolution=resolution, dtype=dtype,
                      weights=weights if loaded.kind == "run-checkpoint" else "release")
        write_atomic(out / "interventions.json", json.dumps(result, indent=2, allow_nan=False))
        write_atomic(out / "interventions.md", render_markdown(result))
        plot_or_warn(plot, result, out, log=log)
        log.info("wrote %s", out / "interventions.md")
        return result
    finally:
        teardown_run_logging("loopvae")
