"""Train and bundle the tuned CPU references next to the bundled LoopVAE (``make release-vae`` / ``make
release-references``) -> ``assets/models/<model>`` for the AutoencoderKL and AutoencoderDC references.

Each reference trains at the recipe its own search picked (``docs/study_fair.md``, section 2: the best of 9 arms
at the same CPU budget per arm as LoopVAE's search) for the images the bundled LoopVAE saw (7,500 steps x 8
crops of 64^2 = 60,000 crops; a recipe with other crops keeps the pixels), on the same 740 training images, with
the validation curve on the same 40 validation images. Then ``loopvae latent-stats`` on the training images,
evaluation at 256^2 on kodim21-24 and the 40 held-out ImageNet images, and a bundle of a few MB each: EMA
weights (``_class_name`` AutoencoderKL / AutoencoderDC, loadable with that diffusers class's ``from_pretrained``),
``release.json`` with paths relative to the repository or data root, ``latent_stats.json``, and a model card with
the training command, images seen, CPU-hours, sha256 and the measured table.

With the three bundled models, ``loopvae compare`` runs from a fresh clone on ``assets/`` alone (one seed per
arm there: descriptive, no verdicts; the seed-level study is ``docs/study_fair.md``).

Usage: ``python benchmarks/release_references.py`` (~45 min on 2 cores; rerunning resumes). ``--steps N`` makes
a smoke run that bundles nothing unless ``--bundle-dir`` is given.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import study_fair as sf  # noqa: E402
from release_vae import write_latent_stats  # noqa: E402
from study_loopvae import Arm, Timings, evaluate_arm, keep_freed_memory_mapped, train_arms  # noqa: E402
from study_vae_data import release_data  # noqa: E402

PRESET = "release-tiny"
RELEASE_STEPS = 7500  # the bundled LoopVAE's steps x 8 crops of 64^2
COMMAND = "make release-references"
REFERENCES = ("klvae", "dcae")


def reference_arm(key: str, steps: int | None) -> tuple[Arm, dict[str, Any]]:
    """The training run of one reference at its search's pick, and what it records."""
    family = sf.FAMILIES[key]
    pick, chosen = sf.pick_recipe(key), sf.family_model(family)
    if pick is None or chosen is None:
        raise SystemExit(f"{key}: its recipe search is not finished (docs/study_fair/runs); run "
                         "`python benchmarks/study_fair.py --phase shapes search` first")
    model, overrides = chosen
    recipe = next(a for a in sf.search_arms(family) if a.name == pick["arm"])
    total = steps if steps is not None else max(4, round(RELEASE_STEPS * recipe.pixel_factor))
    every = max(1, total // 10)
    arm = Arm(f"{sf.registered_name(model, overrides)}-s0", key, [
        f"model={model}", f"model_overrides={overrides}", "seed=0", f"max_steps={total}",
        f"eval_every={every}", f"checkpoint_every={max(1, total // 15)}", f"image_every={total}",
        "log_every=50", *sf.BASE_RECIPE, *recipe.overrides])
    return arm, {"family": key, "model": sf.registered_name(model, overrides), "model_overrides": overrides,
                 "recipe_arm": pick["arm"],
                 "recipe": recipe.overrides, "steps": total}


def write_card(target: Path, r: dict[str, Any]) -> None:
    from looprun.release import card_front_matter

    ev = r["eval"]
    results = [{"task": "image-to-image", "dataset": dataset, "type": m, "name": m.upper(), "value": ev[split][m]}
               for split, dataset in (("kodak", "kodim21-24 (Kodak), 256²"),
                                      ("imagenet", "40 held-out ImageNet-sample images, 256²"))
               for m in ("psnr", "ssim")]
    front = card_front_matter(r["model"], "diffusers", ["loopvision", "vae", "reference", r["class"]], results)
    rows = "\n".join(
        f"| {label} | {ev[split]['psnr']:.2f} | {ev[split]['ssim']:.4f} | {ev[split]['baseline']['psnr']:.2f} |"
        for split, label in (("kodak", "kodim21–24"), ("imagenet", "40 held-out ImageNet")))
    text = front + f"""# {r['model']}, trained (a tuned CPU reference bundled with loopvision)

diffusers `{r['class']}` (`loopvae.create_model("{r['model']}")`), {r['params']:,} parameters,
{r['gmacs']:.2f} GMACs per 256² reconstruction: the
{'shortcut-equipped ' if r['class'] == 'AutoencoderDC' else ''}reference of loopvision's fair-comparison study
(`docs/study_fair.md`), trained at the recipe its own search picked.

## How it was made

* command: `{COMMAND}` (`benchmarks/release_references.py`), preset `{PRESET}` with the search's pick
  **{r['recipe_arm']}** (`{' '.join(r['recipe']) or 'the base recipe'}` on top of `{' '.join(sf.BASE_RECIPE)}`)
* data: {r['num_train']} training images (the shared ImageNet sample minus 40 held-out and 40 validation images,
  plus kodim01–20), the images the bundled `loopvae-cnn-tiny` saw
* {r['steps']:,} steps, {r['images_seen']:,} crops seen; {r['train_seconds'] / 3600:.2f} CPU-hours of optimisation on
  one core
* weights: EMA (0.999), fp32; `diffusion_pytorch_model.safetensors` sha256 `{r['sha256']}`
* latent statistics (`loopvae latent-stats`, training images at 256²): {r['latent_note']}

## Measured

256², {'the deterministic latent' if r['class'] == 'AutoencoderDC' else 'posterior mode'}, uint8 outputs; one
training run, so these numbers are descriptive: the seed-level comparison is `docs/study_fair.md`.

| images | PSNR | SSIM | bicubic (≥ equal values/px) |
|---|---:|---:|---:|
{rows}

Load: `diffusers.{r['class']}.from_pretrained("assets/models/{r['model']}")`; every `loopvae` command takes the
folder as `--checkpoint`; `loopvae compare --arm loopvae=assets/models/loopvae-cnn-tiny --arm
ref=assets/models/{r['model']} --data assets/kodak/kodak-val-000000.tar --out runs/compare` compares it with the
bundled LoopVAE.
"""
    (target / "README.md").write_text(text)


def bundle(release: Path, target: Path, r: dict[str, Any]) -> None:
    from looprun.release import WEIGHTS_NAME, release_weights_file

    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    shutil.copy2(release / "config.json", target / "config.json")
    shutil.copy2(release / "latent_stats.json", target / "latent_stats.json")
    shutil.copy2(release_weights_file(release), target / WEIGHTS_NAME)
    info = json.loads((release / "release.json").read_text())
    info.update(command=COMMAND, recipe_arm=r["recipe_arm"], images_seen=r["images_seen"],
                train_cpu_hours=round(r["train_seconds"] / 3600, 3))
    (target / "release.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    write_card(target, r)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="runs/release-references")
    parser.add_argument("--shared", default=None)
    parser.add_argument("--steps", type=int, default=None, help="shorten both runs (smoke test; bundles nothing "
                                                                 "unless --bundle-dir is given)")
    parser.add_argument("--bundle-dir", default=None, help="where the bundles go (default: assets/models)")
    parser.add_argument("--docs", default="docs/study_loopvae", help="folder for references.json")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--study", default="docs/study_fair", help="the study's result folder (the searches' picks)")
    parser.add_argument("--cards-only", action="store_true",
                        help="rewrite the bundled references' README.md from references.json and stop (no training)")
    args = parser.parse_args()
    sf.DOCS, sf.RESULTS = Path(args.study), Path(args.study) / "runs"
    if args.cards_only:
        recorded = json.loads((Path(args.docs) / "references.json").read_text())["references"]
        for name, r in recorded.items():
            if r.get("bundled"):
                write_card(Path(args.bundle_dir or "assets/models") / name, r)
                print(f"card rewritten: {Path(args.bundle_dir or 'assets/models') / name / 'README.md'}")
        return 0
    from loopdata.assets import portable_text
    from looprun.checkpoint import sha256_file
    from looprun.release import release_weights_file
    from loopvae.compare import _architecture

    runs = Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    data = release_data(args.shared, runs / "data", "the references' release")
    planned = {key: reference_arm(key, args.steps) for key in REFERENCES}
    timings = Timings(runs / "timings.json")
    train_arms([arm for arm, _ in planned.values()], data, runs, args.jobs, 1, timings, preset=PRESET,
               extra_args=("--val-data", data.validation))
    keep_freed_memory_mapped()
    import torch

    torch.set_num_threads(2)
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "command": COMMAND, "references": {}}
    refused: list[str] = []
    for arm, record in planned.values():
        run = runs / arm.name
        release = run / "release"
        stats = write_latent_stats(release, data.train, timings, None if args.steps is None else 16)
        arch = _architecture(str(release), 256, "ema")
        summary = json.loads((run / "train_summary.json").read_text())
        cfg_batch = next((int(o.split("=")[1]) for o in arm.overrides if o.startswith("batch_size=")), 8)
        r = dict(record, **{k: arch[k] for k in ("class", "params", "gmacs")},
                 num_train=data.num_train, images_seen=record["steps"] * cfg_batch,
                 train_seconds=summary["train_seconds"], eval=evaluate_arm(run, data, "none", timings),
                 sha256=sha256_file(release_weights_file(release)),
                 curve=json.loads((run / "validation.json").read_text()),
                 latent_note=(f"scaling_factor {stats['scaling_factor']:.6f}" + (
                     f", shift_factor {stats['shift_factor']:.6f}" if arch["class"] != "AutoencoderDC" else
                     f" (AutoencoderDC has no shift_factor key; the measured shift {stats['shift_factor']:.6f} is in "
                     "latent_stats.json)")))
        out["references"][record["model"]] = r
        heldout, bicubic = r["eval"]["imagenet"]["psnr"], r["eval"]["imagenet"]["baseline"]["psnr"]
        r["bundled"] = False
        if args.steps is None and heldout <= bicubic:
            # One broken reference must not keep the other from its bundle nor lose its numbers: record the refusal
            # (references.json keeps every measured figure for the diagnosis) and fail at the end.
            refused.append(f"{record['model']}: {heldout:.2f} dB on the held-out images is not above bicubic "
                           f"({bicubic:.2f} dB): a reference below bicubic is broken, not a baseline; not bundled "
                           f"(see {run}.log and its validation.json)")
            r["refused"] = refused[-1]
            print(refused[-1], flush=True)
            continue
        target_root = args.bundle_dir or (None if args.steps is not None else "assets/models")
        if target_root:
            r["bundled"] = True
            bundle(release, Path(target_root) / record["model"], r)
            print(f"bundled {release} -> {Path(target_root) / record['model']}", flush=True)
    docs = Path(args.docs)
    docs.mkdir(parents=True, exist_ok=True)
    name = "references.json" if args.steps is None else "references-smoke.json"
    # every path in it (shard lists, model sources, the reasons a metric was skipped) relative to the repository,
    # the data root or the home folder: the file is committed
    (docs / name).write_text(portable_text(json.dumps(out, indent=1)) + "\n")
    print(f"wrote {docs / name}")
    if refused:
        raise SystemExit("\n".join(refused))
    return 0


if __name__ == "__main__":
    sys.exit(main())
