"""The GPU-budget release (``make release-vae-gpu``): ``loopvae-cnn-small`` and ``flux-vae-small`` in one device call.

Three steps, the middle one on the GPU machine:

``prepare`` (here, on CPU): re-encodes the release's training images (the ImageNet sample minus the
held-out and validation images, plus kodim01-20) as one compact shard (shorter side 256 px, JPEG
quality 90, about 20 MB) and copies the 40 held-out ImageNet images unchanged, into a folder that
``.git/info/exclude`` ignores (``gpu-data/`` by default), to be named in the device call's ``carry``.

``run`` (on the device, ``--device cuda``): calibrates the LoopVAE's steps per second in a short probe,
sizes both runs to ``--budget-s`` seconds of LoopVAE training at the same images seen (same steps,
batch and 128^2 crops; bf16 autocast), trains ``loopvae-cnn-small`` then ``flux-vae-small`` with the
preset ``release-small-gpu``, evaluates both at 256^2 on kodim21-24 and the held-out images (per image),
runs the interventions on the LoopVAE and writes everything to ``--out`` (``$OUT``): releases with their
weights in safetensors shards of at most 15 MB, ``results.json``.

``bundle`` (here): copies the LoopVAE release that came back into ``assets/models/loopvae-cnn-small``
with a model card, and the results into ``docs/study_loopvae/release_gpu.json``.

The device call (one, <= 9 minutes)::

    python3 benchmarks/release_vae_gpu.py run --data gpu-data --out $OUT --device cuda --budget-s 170

On CPU the same code runs with ``--device cpu --steps 2`` (``tests/vae/test_release_gpu_script.py``).
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paired_stats import paired_difference  # noqa: E402
from study_loopvae import intervention_images  # noqa: E402

PRESET = "release-small-gpu"
MODELS = {"loopvae": "loopvae-cnn-small", "reference": "flux-vae-small"}
SHARD_LIMIT = "15MB"


# -- prepare ---------------------------------------------------------------------------------------
def reencode(data: bytes, short_side: int = 256, quality: int = 90) -> bytes:
    """JPEG bytes of ``data`` (any PIL-readable image, EXIF orientation applied) with the shorter side at
    most ``short_side`` px."""
    from PIL import Image, ImageOps

    with Image.open(io.BytesIO(data)) as img:
        img = ImageOps.exif_transpose(img).convert("RGB")
        scale = short_side / min(img.size)
        if scale < 1:
            img = img.resize((round(img.width * scale), round(img.height * scale)), Image.Resampling.BICUBIC)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def prepare(train_urls: str, holdout_urls: str, out: Path) -> dict[str, Any]:
    """Write ``out/train-000000.tar`` (re-encoded) and ``out/holdout-000000.tar`` (bytes unchanged)."""
    from loopdata.shards import expand_urls, iter_samples
    from loopdata.writer import TarShardWriter

    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for prefix, urls, convert in (("train", train_urls, True), ("holdout", holdout_urls, False)):
        for old in out.glob(f"{prefix}-*.tar"):
            old.unlink()
        n = 0
        with TarShardWriter(out, prefix, max_size=38 * 2**20) as writer:
            for url in expand_urls(urls):
                for sample in iter_samples(url):
                    image_ext = next(e for e in ("jpg", "jpeg", "png", "webp") if e in sample)
                    members = {k: v for k, v in sample.items() if not k.startswith("__") and k != image_ext}
                    members["jpg" if convert else image_ext] = (reencode(sample[image_ext]) if convert
                                                                else sample[image_ext])
                    writer.add(sample["__key__"], members)
                    n += 1
        counts[prefix] = n
    sizes = {p.name: p.stat().st_size for p in out.glob("*.tar")}
    info = {"counts": counts, "bytes": sizes}
    (out / "prepared.json").write_text(json.dumps(info, indent=2))
    return info


# -- run (on the device) ---------------------------------------------------------------------------
def train_command(model: str, data: str, out: Path, device: str, overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "loopvae", "train", "--config", PRESET, "--data", data, "--out", str(out),
            "--set", "progress_bar=false", f"model={model}", f"device={device}", *overrides]


def calibrate(data: str, work: Path, device: str, probe_steps: int, overrides: list[str]) -> float:
    """LoopVAE optimisation steps per second, from a probe run (its first steps, warm-up included: an
    underestimate, so the sized run ends inside the budget)."""
    probe = work / "probe"
    subprocess.run(train_command(MODELS["loopvae"], data, probe, device,
                                 [f"max_steps={probe_steps}", f"checkpoint_every={probe_steps}", *overrides]),
                   check=True)
    seconds = json.loads((probe / "train_summary.json").read_text())["train_wall_seconds"]
    return probe_steps / max(seconds, 1e-6)


def evaluate_release(release: Path, urls: dict[str, str], out: Path, device: str, resolution: int = 256
                     ) -> dict[str, Any]:
    from loopvae.evaluate import EvalOptions, evaluate

    result = {}
    for split, data in urls.items():
        metrics = evaluate(release, data, out / f"eval-{split}", EvalOptions(
            resolution=resolution, batch_size=8, num_workers=0, lpips_net="none", device=device, grid_images=4,
            progress=False))
        rows = json.loads((out / f"eval-{split}" / "per_image.json").read_text())
        result[split] = {"psnr": metrics["psnr"], "ssim": metrics["ssim"], "baseline": metrics["baseline"],
                         "per_image": sorted(rows, key=lambda r: (r["shard"], r["key"]))}
    return result


def copy_release(release: Path, dest: Path) -> None:
    """``release`` into ``dest`` with the weights in safetensors shards of at most :data:`SHARD_LIMIT`."""
    from loopvae.loading import load_artifact

    dest.mkdir(parents=True, exist_ok=True)
    load_artifact(release).save_pretrained(dest, max_shard_size=SHARD_LIMIT, safe_serialization=True)
    for name in ("release.json", "README.md", "latent_stats.json"):
        if (release / name).is_file():
            shutil.copy2(release / name, dest / name)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from loopvae.intervene import run_interventions
    from loopvae.loading import load_artifact

    data = Path(args.data)
    train = str(data / "train-000000.tar")
    import loopdata

    kodak = ",".join(str(u) for u in loopdata.bundled_kodak_urls("val"))
    urls = {"kodak": kodak, "imagenet": ",".join(str(p) for p in sorted(data.glob("holdout-*.tar")))}
    out, work = Path(args.out), Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    overrides = list(args.set)
    started = time.perf_counter()
    if args.steps is None:
        rate = calibrate(train, work, args.device, args.probe_steps, [*overrides, *args.loopvae_set])
        steps = max(10, int(rate * args.budget_s))
    else:
        rate, steps = None, args.steps
    schedule = [f"max_steps={steps}", f"checkpoint_every={steps}", f"image_every={steps}",
                f"log_every={max(1, steps // 20)}"]
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else args.device,
                              "torch": torch.__version__, "preset": PRESET, "steps": steps, "probe_rate": rate,
                              "budget_s": args.budget_s, "overrides": overrides, "models": {}}
    role_sets = {"loopvae": list(args.loopvae_set), "reference": list(args.reference_set)}
    for role, model in MODELS.items():
        run_dir = work / role
        start = time.perf_counter()
        subprocess.run(train_command(model, train, run_dir, args.device, [*schedule, *overrides, *role_sets[role]]),
                       check=True)
        summary = json.loads((run_dir / "train_summary.json").read_text())
        release = run_dir / "release"
        model_obj = load_artifact(release)
        entry = {"name": model, "params": sum(p.numel() for p in model_obj.parameters()),
                 "wall_s": round(time.perf_counter() - start, 1), "train_wall_seconds": summary["train_wall_seconds"],
                 "images_seen": steps * _batch_size(run_dir)}
        entry["eval"] = evaluate_release(release, urls, run_dir, args.device, args.eval_resolution)
        if role == "loopvae":
            images, _ = intervention_images(urls["kodak"], urls["imagenet"], args.intervention_images,
                                            args.eval_resolution)
            entry["interventions"] = run_interventions(model_obj.to(args.device), images.to(args.device))
        copy_release(release, out / role)
        result["models"][role] = entry
        print(f"{role}: {model} trained {steps} steps in {entry['wall_s']:.0f} s", flush=True)
    result["comparisons"] = {
        split: paired_difference([r["psnr"] for r in result["models"]["loopvae"]["eval"][split]["per_image"]],
                                 [r["psnr"] for r in result["models"]["reference"]["eval"][split]["per_image"]]
                                 ).as_dict()
        for split in urls}
    result["total_s"] = round(time.perf_counter() - started, 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def _batch_size(run_dir: Path) -> int:
    import yaml

    return int(yaml.safe_load((run_dir / "config.yaml").read_text())["batch_size"])


# -- bundle (here) ---------------------------------------------------------------------------------
def bundle(source: Path, target: Path, docs: Path) -> None:
    """The LoopVAE release from a device run's files into ``target`` (with a card), results into ``docs``."""
    results = json.loads((source / "results.json").read_text())
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source / "loopvae", target)
    ours, ref = results["models"]["loopvae"], results["models"]["reference"]
    lines = [f"# loopvae-cnn-small, trained on one GPU ({results['device']})", "",
             f"`make release-vae-gpu`: {results['steps']:,} steps of preset `{PRESET}` (bf16, 128² crops), "
             f"{ours['images_seen']:,} crops seen in {ours['wall_s']:.0f} s; reference `flux-vae-small` "
             f"({ref['params']:,} parameters) at the same images seen in {ref['wall_s']:.0f} s.", "",
             "| images | PSNR | SSIM | bicubic | flux-vae-small | LoopVAE − reference (paired by image) |",
             "|---|---:|---:|---:|---:|---|"]
    for split, cmp in results["comparisons"].items():
        e, r = ours["eval"][split], ref["eval"][split]
        lines.append(f"| {split} | {e['psnr']:.2f} | {e['ssim']:.4f} | {e['baseline']['psnr']:.2f} | "
                     f"{r['psnr']:.2f} | {cmp['mean']:+.2f} dB, {cmp['verdict']} |")
    (target / "README.md").write_text("\n".join(lines) + "\n")
    docs.mkdir(parents=True, exist_ok=True)
    slim = json.loads(json.dumps(results))
    for entry in slim["models"].values():
        for split in entry["eval"].values():
            split.pop("per_image", None)
    (docs / "release_gpu.json").write_text(json.dumps(slim, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="compact training shard + held-out shard (here, CPU)")
    p.add_argument("--shared", default=None)
    p.add_argument("--train", default=None, help="training shards (default: the release's, from --shared)")
    p.add_argument("--holdout", default=None, help="held-out shards (default: the release's)")
    p.add_argument("--out", default="gpu-data")
    p = sub.add_parser("run", help="train, evaluate and export both models (the device call)")
    p.add_argument("--data", default="gpu-data")
    p.add_argument("--out", required=True)
    p.add_argument("--work", default="runs/release-vae-gpu")
    p.add_argument("--device", default="cuda")
    p.add_argument("--budget-s", type=float, default=170.0, help="LoopVAE training seconds (the reference gets the "
                                                                 "same steps)")
    p.add_argument("--probe-steps", type=int, default=40)
    p.add_argument("--steps", type=int, default=None, help="fixed steps instead of calibrating (CPU tests)")
    p.add_argument("--set", nargs="*", default=[], help="extra key=value overrides for both runs")
    p.add_argument("--loopvae-set", nargs="*", default=[], help="overrides for the LoopVAE run only")
    p.add_argument("--reference-set", nargs="*", default=[], help="overrides for the reference run only")
    p.add_argument("--eval-resolution", type=int, default=256)
    p.add_argument("--intervention-images", type=int, default=16)
    p = sub.add_parser("bundle", help="bundle a device run's LoopVAE release (here)")
    p.add_argument("--source", required=True, help="the folder the device run's $OUT files came back to")
    p.add_argument("--target", default="assets/models/loopvae-cnn-small")
    p.add_argument("--docs", default="docs/study_loopvae")
    args = parser.parse_args()
    if args.command == "prepare":
        if args.train is None or args.holdout is None:
            from study_vae_data import release_data

            data = release_data(args.shared, Path("runs/release-vae/data"), "prepare (or pass --train and --holdout)")
            args.train, args.holdout = args.train or data.train, args.holdout or data.imagenet_holdout
        print(json.dumps(prepare(args.train, args.holdout, Path(args.out)), indent=1))
    elif args.command == "run":
        run(args)
    else:
        bundle(Path(args.source), Path(args.target), Path(args.docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
