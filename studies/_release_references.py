"""Train and bundle the tuned CPU references next to the bundled LoopVAE (``make release-references``) ->
``assets/models/<model>`` and ``docs/study_loopvae/references.json``.

Each reference trains once at the recipe its own search picked (``docs/study_fair.md``, section 2) for the images the
bundled LoopVAE saw, on the fair study's release split; then latent statistics, evaluation at 256^2 and a bundle (EMA
weights, ``release.json``, ``latent_stats.json``, a card). A reference not above bicubic on the held-out images is not
bundled (its numbers are kept) and the command fails at the end. ``python studies/_release_references.py`` (~45 min
on 2 cores; a rerun resumes); ``--steps N``: a smoke run that bundles only to ``--bundle-dir``; ``--cards-only``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import _fair as sf
import _loopvae_pages as lp
import _vae_runs as vr
import torch

from loopdata.assets import portable_text
from looprun.checkpoint import sha256_file
from looprun.release import card_front_matter, release_weights_file
from loopvae.compare import _architecture
from loopvae.latent_stats import STATS_FILE, latent_stats

RELEASE_STEPS = 7500  # the bundled LoopVAE's steps x 8 crops of 64^2
COMMAND = "make release-references"
REFERENCES = ("klvae", "dcae")


def reference_arm(key: str, steps: int | None, docs: Path) -> tuple[vr.Arm, dict[str, Any]]:
    """The training run of one reference at its search's pick, and what references.json records about it."""
    records = sf.load_records(docs)
    picked, chosen = sf.pick(records, key, docs), sf.family_model(key, records)
    if picked is None or chosen is None:
        raise SystemExit(f"{key}: its recipe search is not finished ({docs}/runs): run `loopvae study fair --phase "
                         "shapes search` first")
    recipe = next(a for a in sf.search_arms(key) if a.name == picked["arm"])
    total = steps if steps is not None else max(4, round(RELEASE_STEPS * recipe.pixel_factor))
    items = [f"model={chosen[0]}", f"model_overrides={chosen[1]}", "seed=0", f"max_steps={total}",
             f"eval_every={max(1, total // 10)}", f"checkpoint_every={max(1, total // 15)}", f"image_every={total}",
             "log_every=50", *sf.BASE_RECIPE, *recipe.overrides]
    name = sf.registered_name(*chosen)
    return vr.Arm(f"{name}-s0", key, items), {"family": key, "model": name, "model_overrides": chosen[1],
                                              "recipe_arm": picked["arm"], "recipe": list(recipe.overrides),
                                              "steps": total}


def write_card(target: Path, r: dict[str, Any]) -> None:
    """The bundle's README.md: the training command, images seen, CPU-hours, sha256 and the measured table."""
    ev, dc = r["eval"], r["class"] == "AutoencoderDC"
    splits = (("kodak", "kodim21–24", "kodim21-24 (Kodak), 256²"),
              ("imagenet", "40 held-out ImageNet", "40 held-out ImageNet-sample images, 256²"))
    results = [{"task": "image-to-image", "dataset": dataset, "type": m, "name": m.upper(), "value": ev[split][m]}
               for split, _, dataset in splits for m in ("psnr", "ssim")]
    card = lp.text("card-reference", r=r, command=COMMAND, preset=sf.PRESET, hours=r["train_seconds"] / 3600,
                   shortcuts="shortcut-equipped " if dc else "", recipe=" ".join(r["recipe"]) or "the base recipe",
                   base=" ".join(sf.BASE_RECIPE), latent="the deterministic latent" if dc else "posterior mode",
                   rows=[f"| {label} | {ev[s]['psnr']:.2f} | {ev[s]['ssim']:.4f} | {ev[s]['baseline']['psnr']:.2f} |"
                         for s, label, _ in splits])
    front = card_front_matter(r["model"], "diffusers", ["loopvision", "vae", "reference", r["class"]], results)
    (target / "README.md").write_text(front + "\n".join(card) + "\n")


def bundle(release: Path, target: Path, r: dict[str, Any]) -> None:
    """Copy the release's config, latent statistics and EMA weights to ``target`` with release.json and the card."""
    vr.copy_bundle(release, target)
    info = json.loads((release / "release.json").read_text()) | {
        "command": COMMAND, "recipe_arm": r["recipe_arm"], "images_seen": r["images_seen"],
        "train_cpu_hours": round(r["train_seconds"] / 3600, 3)}
    (target / "release.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    write_card(target, r)


def measure(arm: vr.Arm, record: dict[str, Any], run: Path, data: vr.StudyData, timings: vr.Timings,
            limit: int | None) -> dict[str, Any]:
    """A trained reference's references.json entry: latent statistics, architecture, evaluation, curve, sha256."""
    release = run / "release"
    if not (release / STATS_FILE).is_file():
        latent_stats(release, data.train, limit=limit, num_workers=0, progress=False)
    stats, arch = json.loads((release / STATS_FILE).read_text()), _architecture(str(release), 256, "ema")
    batch = next((int(o.split("=")[1]) for o in arm.overrides if o.startswith("batch_size=")), 8)
    shift = (f", shift_factor {stats['shift_factor']:.6f}" if arch["class"] != "AutoencoderDC" else
             f" (AutoencoderDC has no shift_factor key; the measured shift {stats['shift_factor']:.6f} is in "
             "latent_stats.json)")
    return record | {k: arch[k] for k in ("class", "params", "gmacs")} | {
        "num_train": data.num_train, "images_seen": record["steps"] * batch,
        "train_seconds": json.loads((run / "train_summary.json").read_text())["train_seconds"],
        "eval": vr.evaluate_arm(run, data, "none", timings), "sha256": sha256_file(release_weights_file(release)),
        "curve": json.loads((run / "validation.json").read_text()),
        "latent_note": f"scaling_factor {stats['scaling_factor']:.6f}{shift}", "bundled": False}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="runs/release-references")
    parser.add_argument("--shared", default=None, help="the shared data root (default: found)")
    parser.add_argument("--steps", type=int, default=None, help="shorten both runs (a smoke test; bundles nothing "
                                                                 "unless --bundle-dir is given)")
    parser.add_argument("--bundle-dir", default=None, help="where the bundles go (default: assets/models)")
    parser.add_argument("--docs", default="docs/study_loopvae", help="folder for references.json")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--study", default="docs/study_fair", help="the fair study's result folder (the picks)")
    parser.add_argument("--cards-only", action="store_true",
                        help="rewrite the bundled references' README.md from references.json and stop (no training)")
    args = parser.parse_args()
    bundles, docs = Path(args.bundle_dir or "assets/models"), Path(args.docs)
    if args.cards_only:
        for name, r in json.loads((docs / "references.json").read_text())["references"].items():
            if r.get("bundled"):
                write_card(bundles / name, r)
                print(f"card rewritten: {bundles / name / 'README.md'}")
        return 0
    runs = Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    data = vr.release_data(args.shared, runs / "data", "the references' release")
    planned = [reference_arm(key, args.steps, Path(args.study)) for key in REFERENCES]
    timings = vr.Timings(runs / "timings.json")
    vr.train_arms([arm for arm, _ in planned], data, runs, args.jobs, 1, timings, preset=sf.PRESET,
                  extra_args=("--val-data", data.validation))
    vr.keep_freed_memory_mapped()
    torch.set_num_threads(2)
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "command": COMMAND, "references": {}}
    refused: list[str] = []
    for arm, record in planned:
        r = out["references"][record["model"]] = measure(arm, record, runs / arm.name, data, timings,
                                                         None if args.steps is None else 16)
        heldout, bicubic = r["eval"]["imagenet"]["psnr"], r["eval"]["imagenet"]["baseline"]["psnr"]
        if args.steps is None and heldout <= bicubic:
            # one broken reference must not keep the other from its bundle nor lose its numbers: refuse, fail at the end
            r["refused"] = (f"{record['model']}: {heldout:.2f} dB on the held-out images is not above bicubic "
                            f"({bicubic:.2f} dB): a reference below bicubic is broken, not a baseline; not bundled "
                            f"(see {runs / arm.name}.log and its validation.json)")
            refused.append(r["refused"])
            print(r["refused"], flush=True)
        elif args.bundle_dir or args.steps is None:
            r["bundled"] = True
            bundle(runs / arm.name / "release", bundles / record["model"], r)
            print(f"bundled {runs / arm.name / 'release'} -> {bundles / record['model']}", flush=True)
    docs.mkdir(parents=True, exist_ok=True)
    name = "references.json" if args.steps is None else "references-smoke.json"
    # every path in it relative to the repository, the data root or the home folder: the file is committed
    (docs / name).write_text(portable_text(json.dumps(out, indent=1)) + "\n")
    print(f"wrote {docs / name}")
    if refused:
        raise SystemExit("\n".join(refused))
    return 0


if __name__ == "__main__":  # python studies/_release_references.py: its helpers are beside it, on sys.path
    sys.exit(main())
