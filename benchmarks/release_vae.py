"""Train and release the bundled CPU tokenizer (``make release-vae``) -> ``assets/models/loopvae-cnn-tiny``.

1. Trains ``loopvae-cnn-tiny`` with the release recipe (preset ``release-tiny``, chosen by
   ``make recipe-search-vae``) and, in parallel on the other core, the reference ``flux-vae-tiny`` with
   the same recipe and the same images seen (same steps x batch x crop). Validation PSNR on 40 images
   disjoint from training and from the reported sets is logged every ``eval_every`` steps (the learning
   curve). Rerunning the command resumes both runs exactly from their newest checkpoints.
2. ``loopvae latent-stats`` on the training images writes measured ``scaling_factor`` / ``shift_factor``
   into the release's ``config.json``.
3. Evaluates both models at 256^2 on kodim21-24 and the 40 held-out ImageNet images, per image, and
   compares them paired by image (LoopVAE - reference, LoopVAE - bicubic at >= equal values per pixel).
4. Runs the interventions (prefix truncation, bypass) on the release, 16 images.
5. Bundles the release (EMA weights, config with latent statistics, card with the measured table,
   sha256, producing command, CPU-hours) and writes ``docs/study_loopvae/release.json`` + plots, which
   ``docs/study_loopvae.md`` renders.

Usage: ``python benchmarks/release_vae.py`` (``make release-vae``; ~2 h on 2 cores).
``--steps N`` shortens both runs (a smoke test; the bundle is then not overwritten unless ``--bundle`` is
given explicitly).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paired_stats import paired_difference  # noqa: E402
from study_loopvae import (  # noqa: E402
    Arm,
    Timings,
    evaluate_arm,
    intervention_images,
    keep_freed_memory_mapped,
    model_counts,
    run_interventions_on,
    train_arms,
)
from study_vae_data import release_data  # noqa: E402

import loopdata  # noqa: E402

PRESET = "release-tiny"
LOOPVAE, REFERENCE = "loopvae-s0", "flux-vae-tiny-s0"
COMMAND = "make release-vae"


def release_arms(steps: int | None) -> list[Arm]:
    extra = [] if steps is None else [f"max_steps={steps}", f"eval_every={max(1, steps // 4)}",
                                      f"checkpoint_every={max(1, steps // 2)}", f"image_every={steps}",
                                      f"log_every={max(1, steps // 10)}", "warmup_steps=1"]
    return [Arm(LOOPVAE, "release", ["seed=0", *extra]),
            Arm(REFERENCE, "reference", ["seed=0", "model=flux-vae-tiny", "model_overrides={}", *extra])]


def per_image(run: Path, split: str) -> list[dict[str, Any]]:
    rows = json.loads((run / f"eval-{split}" / "per_image.json").read_text())
    return sorted(rows, key=lambda r: (r["shard"], r["key"]))


def comparisons(runs: Path) -> dict[str, Any]:
    """Per split: LoopVAE - reference and LoopVAE - bicubic, paired by image (PSNR and SSIM)."""
    out: dict[str, Any] = {}
    for split in ("kodak", "imagenet"):
        ours, ref = per_image(runs / LOOPVAE, split), per_image(runs / REFERENCE, split)
        if [r["key"] for r in ours] != [r["key"] for r in ref]:
            raise RuntimeError(f"{split}: the two evaluations saw different images")
        out[split] = {
            "vs_reference_psnr": paired_difference([r["psnr"] for r in ours], [r["psnr"] for r in ref]).as_dict(),
            "vs_reference_ssim": paired_difference([r["ssim"] for r in ours], [r["ssim"] for r in ref]).as_dict(),
            "vs_bicubic_psnr": paired_difference([r["psnr"] for r in ours],
                                                 [r["bicubic_psnr"] for r in ours]).as_dict(),
            "margin_over_bicubic": (sum(r["psnr"] - r["bicubic_psnr"] for r in ours) / len(ours)),
        }
    return out


def write_latent_stats(release: Path, data: str, timings: Timings, limit: int | None = None) -> dict[str, Any]:
    from loopvae.latent_stats import STATS_FILE

    if not (release / STATS_FILE).is_file():
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "loopvae", "latent-stats", "--checkpoint", str(release), "--data", data,
                        "--resolution", "256", "--num-workers", "0", "--no-progress",
                        *([] if limit is None else ["--limit", str(limit)])], check=True)
        timings.record("post", "latent-stats", time.perf_counter() - start)
    return json.loads((release / STATS_FILE).read_text())


def heldout_latent_moments(release: Path, urls: str) -> dict[str, float]:
    """Mean and s.d. of the normalised posterior samples on held-out images (should be ~0 and ~1)."""
    import torch

    from loopvae.loading import load_artifact

    model = load_artifact(release).eval()
    loader = loopdata.make_loader(urls, task="reconstruction", train=False, batch_size=8, num_workers=0,
                                  resolution=256, rank=0, world_size=1)
    gen = torch.Generator().manual_seed(0)
    values = []
    with torch.no_grad():
        for batch in loader:
            z = model.encode(batch["image"]).latent_dist.sample(generator=gen)
            values.append(((z - model.config.shift_factor) * model.config.scaling_factor).flatten())
    z = torch.cat(values).double()
    return {"mean": float(z.mean()), "std": float(z.std()), "num_values": z.numel()}


def learning_curves(runs: Path) -> dict[str, list[dict[str, Any]]]:
    return {name: json.loads((runs / name / "validation.json").read_text()) for name in (LOOPVAE, REFERENCE)}


def plot_curves(curves: dict[str, list[dict[str, Any]]], bicubic: float | None, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, pts in curves.items():
        axes[0].plot([p["images_seen"] / 1e3 for p in pts], [p["psnr"] for p in pts], marker="o", label=name)
        axes[1].plot([p["train_seconds"] / 60 for p in pts], [p["psnr"] for p in pts], marker="o", label=name)
    for ax, xlabel in ((axes[0], "training crops seen (thousands)"), (axes[1], "CPU-minutes of training (1 thread)")):
        if bicubic is not None:
            ax.axhline(bicubic, color="C3", ls="--", label=f"bicubic on the held-out ImageNet images {bicubic:.2f} dB")
        ax.set(xlabel=xlabel, ylabel="validation PSNR at 256² (dB)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Release run: validation PSNR (40 images disjoint from training and the reported sets)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


REFERENCES_FILE = Path("docs/study_loopvae/references.json")


def tuned_references() -> dict[str, dict[str, Any]]:
    """The tuned references bundled beside the model (``make release-references``), by name; the card compares
    against them. A release made before they exist says how to make them."""
    if not REFERENCES_FILE.is_file():
        raise SystemExit(f"{REFERENCES_FILE} is missing: run `make release-references` first; the bundled model's "
                         "card compares it with the tuned references")
    return json.loads(REFERENCES_FILE.read_text())["references"]


def write_card(target: Path, r: dict[str, Any]) -> None:
    """The bundled model's README: what it is, how it was made, what it measures."""
    ev, ls = r["eval"][LOOPVAE], r["latent_stats"]
    dec = next(s for s in r["interventions"]["stages"] if s["branch"] == "decoder" and s["scale"] == "2x")
    refs = tuned_references()
    rows = []
    for split, label in (("kodak", "kodim21–24"), ("imagenet", f"{r['num_holdout']} held-out ImageNet")):
        cells = [f"{ref_eval['eval'][split]['psnr']:.2f} / {ref_eval['eval'][split]['ssim']:.3f}"
                 for ref_eval in refs.values()]
        rows.append(f"| {label} | {ev[split]['psnr']:.2f} | {ev[split]['ssim']:.4f} | "
                    f"{ev[split]['baseline']['psnr']:.2f} | " + " | ".join(cells) + " |")
    ref_header = " | ".join(f"`{n}` ({v['class']}, {v['params'] / 1e6:.2f}M, {v['gmacs']:.2f} GMACs), PSNR / SSIM"
                            for n, v in refs.items())
    from looprun.release import card_front_matter

    results = []
    for split, dataset in (("kodak", "kodim21-24 (Kodak)"), ("imagenet", f"{r['num_holdout']} held-out ImageNet-sample "
                                                                          "images")):
        for metric, name in (("psnr", "PSNR"), ("ssim", "SSIM")):
            results.append({"task": "image-to-image", "dataset": f"{dataset}, 256²", "type": metric, "name": name,
                            "value": ev[split][metric]})
    front = card_front_matter("loopvae-cnn-tiny", "diffusers", ["loopvision", "loopvae", "vae", "image-tokenizer"],
                              results)
    text = front + f"""# loopvae-cnn-tiny, trained (bundled with loopvision)

A CPU-scale LoopVAE: `loopvae-cnn-tiny` (width 48, K = 2 ConvNeXt adaLN-Zero blocks per branch, passes
[1, 2, 4] per branch, global sharing, f8 with 16 latent channels) **with the parameter-free shortcuts**
(`shortcuts: true`, our addition to the paper's architecture; see `loopvae/layers.py`).
{r['params'][LOOPVAE]:,} parameters, {r['gmacs'][LOOPVAE]:.2f} GMACs per 256² reconstruction.

## How it was made

* command: `{COMMAND}` (`benchmarks/release_vae.py`), preset `{PRESET}`
  (`packages/vae/loopvae/configs/{PRESET}.yaml`; chosen by `make recipe-search-vae`)
* data: {r['num_train']} training images (the shared ImageNet sample minus {r['num_holdout']} held-out and
  {r['num_validation']} validation images, plus kodim01–20 from `assets/kodak`), random 64² crops
* {r['steps']:,} steps × {r['batch_size']} crops = {r['images_seen']:,} crops seen;
  {r['train_seconds'][LOOPVAE] / 3600:.2f} CPU-hours of optimisation on one core
  ({r['wall_seconds'][LOOPVAE] / 60:.0f} min wall including validation)
* weights: EMA ({r['ema_decay']}); fp32
* kodim21–24 at 256²: PSNR {ev['kodak']['psnr']:.2f} dB, SSIM {ev['kodak']['ssim']:.4f} (bicubic at ≥ equal
  values per pixel: {ev['kodak']['baseline']['psnr']:.2f} dB); held-out ImageNet: {ev['imagenet']['psnr']:.2f} dB
* latent normalisation measured by `loopvae latent-stats` on {ls['num_images']} training images at 256²
  (posterior samples): `shift_factor` {ls['shift_factor']:.6f}, `scaling_factor` {ls['scaling_factor']:.6f};
  on the 40 held-out ImageNet images the normalised latents have mean {r['heldout_latents']['mean']:+.3f} and
  s.d. {r['heldout_latents']['std']:.3f}; on kodim21–24 (4 photos of another collection) mean
  {r['kodak_latents']['mean']:+.3f}, s.d. {r['kodak_latents']['std']:.3f}

## Measured (256², posterior mode, uint8 outputs; PSNR per image averaged, SSIM Gaussian 11×11 σ = 1.5)

| images | PSNR | SSIM | bicubic (≥ equal values/px) | {ref_header} |
|---|---:|---:|---:|{"---:|" * len(refs)}
{chr(10).join(rows)}

The references are the tuned ones bundled next to this model (`make release-references`): each trained at
the recipe its own search picked, for the same {r['images_seen']:,} crops on the same images, one run per model,
so the table describes runs and carries no verdict. The seed-level comparisons are `docs/study_fair.md`
(LoopVAE against these two families) and `docs/study_sharing.md` (this model tied against untied weights, and
`dcae-tiny` at a longer budget).

Decoder finest stage, PSNR with k = 1..4 retained passes (16 images):
{' → '.join(f"{p['psnr']:.2f}" for p in dec['prefix'])} dB. Full analysis: `docs/study_loopvae.md`.

`diffusion_pytorch_model.safetensors` sha256: `{r['sha256']}`

Load: `loopvae.LoopVAE.from_pretrained("assets/models/loopvae-cnn-tiny")`; every `loopvae` command takes
the folder as `--checkpoint`.
"""
    (target / "README.md").write_text(text)


def rewrite_card(target: Path = Path("assets/models/loopvae-cnn-tiny"),
                 results: Path = Path("docs/study_loopvae/release.json")) -> None:
    """Re-render the bundled model's card from the committed release results (no training)."""
    write_card(target, json.loads(results.read_text()))


def bundle(release: Path, target: Path, r: dict[str, Any]) -> None:
    from looprun.release import WEIGHTS_NAME, release_weights_file

    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for name in ("config.json", "release.json", "latent_stats.json"):
        shutil.copy2(release / name, target / name)
    shutil.copy2(release_weights_file(release), target / WEIGHTS_NAME)
    write_card(target, r)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="runs/release-vae")
    parser.add_argument("--shared", default=None)
    parser.add_argument("--bundle", default=None, help="where to copy the release (default: assets/models/"
                                                       "loopvae-cnn-tiny for full runs, nowhere with --steps)")
    parser.add_argument("--docs", default="docs/study_loopvae", help="folder for release.json and plots")
    parser.add_argument("--steps", type=int, default=None, help="shorten both runs (smoke test)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--card-only", action="store_true",
                        help="re-render the bundled model's README.md from docs/study_loopvae/release.json and stop")
    args = parser.parse_args()
    if args.card_only:
        rewrite_card()
        return 0
    runs = Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    data = release_data(args.shared, runs / "data", "the release")
    arms = release_arms(args.steps)
    timings = Timings(runs / "timings.json")
    train_arms(arms, data, runs, args.jobs, 1, timings, preset=PRESET, extra_args=("--val-data", data.validation))

    import torch

    from looprun.checkpoint import sha256_file
    from looprun.release import release_weights_file
    from loopvae.perceptual import default_backbone_path
    from loopvae.train_config import load_train_config

    keep_freed_memory_mapped()
    torch.set_num_threads(2)
    release = runs / LOOPVAE / "release"
    stats = write_latent_stats(release, data.train, timings, None if args.steps is None else 16)
    lpips_net = "alex" if default_backbone_path("alex").is_file() else "none"
    evals = {a.name: evaluate_arm(runs / a.name, data, lpips_net, timings) for a in arms}
    images, keys = intervention_images(data.kodak_val, data.imagenet_holdout)
    interventions = run_interventions_on(runs / LOOPVAE, images, keys, timings)
    cfg = load_train_config(PRESET, arms[0].overrides)
    summaries = {a.name: json.loads((runs / a.name / "train_summary.json").read_text()) for a in arms}
    counts = {LOOPVAE: model_counts("loopvae-cnn-tiny", dict(cfg.model_overrides)),
              REFERENCE: model_counts("flux-vae-tiny", {})}
    curves = learning_curves(runs)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "command": COMMAND, "preset": PRESET, "runs": str(runs),
        "overrides": {a.name: a.overrides for a in arms}, "steps": cfg.max_steps, "batch_size": cfg.batch_size,
        "resolution": cfg.resolution, "ema_decay": cfg.ema_decay, "images_seen": cfg.max_steps * cfg.batch_size,
        "num_train": data.num_train, "num_holdout": data.num_holdout, "num_validation": data.num_validation,
        "lpips_net": lpips_net,
        "params": {k: v[0] for k, v in counts.items()}, "gmacs": {k: v[1] for k, v in counts.items()},
        "train_seconds": {k: s["train_seconds"] for k, s in summaries.items()},
        "wall_seconds": {k: timings.data["train"][k] for k in summaries},
        "latent_stats": {k: stats[k] for k in ("shift_factor", "scaling_factor", "num_images", "resolution",
                                                "posterior")},
        "heldout_latents": heldout_latent_moments(release, data.imagenet_holdout),
        "kodak_latents": heldout_latent_moments(release, data.kodak_val),
        "eval": evals, "comparisons": comparisons(runs), "interventions": interventions, "curves": curves,
        "sha256": sha256_file(release_weights_file(release)), "timings": timings.data,
    }
    docs = Path(args.docs)
    docs.mkdir(parents=True, exist_ok=True)
    plot_curves(curves, evals[LOOPVAE]["imagenet"]["baseline"]["psnr"], docs / "release_curve.png")
    from loopvae.intervene import plot as plot_interventions

    plot_interventions(interventions, runs / LOOPVAE / "interventions")
    for name in ("psnr_vs_passes.png", "bypass_loss.png"):
        shutil.copy2(runs / LOOPVAE / "interventions" / name, docs / f"release-{name}")
    (docs / "release.json").write_text(json.dumps(result, indent=1))
    target = args.bundle or (None if args.steps is not None else "assets/models/loopvae-cnn-tiny")
    if target:
        bundle(release, Path(target), result)
        print(f"bundled {release} -> {target}")
    print(f"wrote {docs / 'release.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
