"""The GPU-budget release (``make release-vae-gpu``): ``loopvae-cnn-small`` and ``flux-vae-small`` in one device call.

``prepare`` (here): compact training and held-out shards. ``run`` (the device call): both models at the steps a probe
fits into ``--budget-s`` seconds of LoopVAE training, evaluated per image at 256^2, LoopVAE intervened, exported.
``bundle`` (here): ``assets/models/loopvae-cnn-small`` with a card, ``docs/study_loopvae/release_gpu.json``.
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

import torch
import yaml
from PIL import Image, ImageOps

import loopdata
from loopdata.shards import expand_urls, iter_samples
from loopdata.writer import TarShardWriter
from looprun.statistics import paired_difference
from loopvae.evaluate import EvalOptions, evaluate
from loopvae.intervene import run_interventions
from loopvae.loading import load_artifact

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: studies/ holds _vae_runs
import _vae_runs as vr  # noqa: E402
from _loopvae_pages import text  # noqa: E402

PRESET, MODELS = "release-small-gpu", {"loopvae": "loopvae-cnn-small", "reference": "flux-vae-small"}


def reencode(data: bytes, short_side: int = 256, quality: int = 90) -> bytes:
    """JPEG bytes of an image (EXIF orientation applied), its shorter side at most ``short_side`` px."""
    with Image.open(io.BytesIO(data)) as img:
        img = ImageOps.exif_transpose(img).convert("RGB")
        scale, buf = short_side / min(img.size), io.BytesIO()
        if scale < 1:
            img = img.resize((round(img.width * scale), round(img.height * scale)), Image.Resampling.BICUBIC)
        img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def prepare(train_urls: str, holdout_urls: str, out: Path) -> dict[str, Any]:
    """Write ``out/train-000000.tar`` (re-encoded) and ``out/holdout-000000.tar`` (bytes unchanged)."""
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for prefix, urls, convert in (("train", train_urls, True), ("holdout", holdout_urls, False)):
        for old in out.glob(f"{prefix}-*.tar"):
            old.unlink()
        counts[prefix] = 0
        with TarShardWriter(out, prefix, max_size=38 * 2**20) as writer:
            for s in (s for url in expand_urls(urls) for s in iter_samples(url)):
                ext = next(e for e in ("jpg", "jpeg", "png", "webp") if e in s)
                members = {k: v for k, v in s.items() if not k.startswith("__") and k != ext}
                writer.add(s["__key__"], {**members, **({"jpg": reencode(s[ext])} if convert else {ext: s[ext]})})
                counts[prefix] += 1
    info = {"counts": counts, "bytes": {p.name: p.stat().st_size for p in out.glob("*.tar")}}
    (out / "prepared.json").write_text(json.dumps(info, indent=2))
    return info


def train(model: str, data: str, out: Path, device: str, overrides: list[str]) -> dict[str, Any]:
    """``loopvae train`` with the preset on ``device``; its summary."""
    subprocess.run([sys.executable, "-m", "loopvae", "train", "--config", PRESET, "--data", data, "--out", str(out),
                    "--set", "progress_bar=false", f"model={model}", f"device={device}", *overrides], check=True)
    return json.loads((out / "train_summary.json").read_text())


def evaluate_splits(release: Path, urls: dict[str, str], out: Path, device: str, resolution: int) -> dict[str, Any]:
    """Per split: mean PSNR / SSIM, the bicubic baseline and the per-image rows (sorted by shard and key)."""
    result = {}
    for split, data in urls.items():
        m = evaluate(release, data, out / f"eval-{split}", EvalOptions(
            resolution=resolution, batch_size=8, num_workers=0, lpips_net="none", device=device, grid_images=4,
            progress=False))
        rows = json.loads((out / f"eval-{split}" / "per_image.json").read_text())
        result[split] = {"psnr": m["psnr"], "ssim": m["ssim"], "baseline": m["baseline"],
                         "per_image": sorted(rows, key=lambda r: (r["shard"], r["key"]))}
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Calibrate, train both models at the same steps, evaluate, intervene, export; ``results.json`` in ``--out``."""
    data, out, work, started = Path(args.data), Path(args.out), Path(args.work), time.perf_counter()
    train_urls = str(data / "train-000000.tar")
    urls = {"kodak": ",".join(str(u) for u in loopdata.bundled_kodak_urls("val")),
            "imagenet": ",".join(str(p) for p in sorted(data.glob("holdout-*.tar")))}
    sets = {"loopvae": [*args.set, *args.loopvae_set], "reference": [*args.set, *args.reference_set]}
    rate, steps = None, args.steps
    if steps is None:  # the probe's first steps include the warm-up: an underestimate, so the runs end in budget
        n = args.probe_steps
        probe = train(MODELS["loopvae"], train_urls, work / "probe", args.device,
                      [f"max_steps={n}", f"checkpoint_every={n}", *sets["loopvae"]])
        rate = n / max(probe["train_wall_seconds"], 1e-6)
        steps = max(10, int(rate * args.budget_s))
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else args.device,
                              "torch": torch.__version__, "preset": PRESET, "steps": steps, "probe_rate": rate,
                              "budget_s": args.budget_s, "overrides": list(args.set), "models": {}}
    for role, model in MODELS.items():
        run_dir, start = work / role, time.perf_counter()
        summary = train(model, train_urls, run_dir, args.device, [f"max_steps={steps}", f"checkpoint_every={steps}",
                        f"image_every={steps}", f"log_every={max(1, steps // 20)}", *sets[role]])
        net = load_artifact(run_dir / "release")
        batch = yaml.safe_load((run_dir / "config.yaml").read_text())["batch_size"]
        entry = result["models"][role] = {
            "name": model, "params": sum(p.numel() for p in net.parameters()), "images_seen": steps * int(batch),
            "wall_s": round(time.perf_counter() - start, 1), "train_wall_seconds": summary["train_wall_seconds"],
            "eval": evaluate_splits(run_dir / "release", urls, run_dir, args.device, args.eval_resolution)}
        (out / role).mkdir(parents=True, exist_ok=True)  # weights in safetensors shards of at most 15 MB
        net.save_pretrained(out / role, max_shard_size="15MB", safe_serialization=True)
        for name in ("release.json", "README.md", "latent_stats.json"):
            if (run_dir / "release" / name).is_file():
                shutil.copy2(run_dir / "release" / name, out / role / name)
        if role == "loopvae":
            images, _ = vr.intervention_images(urls["kodak"], urls["imagenet"], args.intervention_images,
                                               args.eval_resolution)
            entry["interventions"] = run_interventions(net.to(args.device), images.to(args.device))
        print(f"{role}: {model} trained {steps} steps in {entry['wall_s']:.0f} s", flush=True)
    ours, ref = (result["models"][r]["eval"] for r in MODELS)
    result["comparisons"] = {s: paired_difference([r["psnr"] for r in ours[s]["per_image"]],
                                                  [r["psnr"] for r in ref[s]["per_image"]]).as_dict() for s in urls}
    result["total_s"] = round(time.perf_counter() - started, 1)
    (out / "results.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def bundle(source: Path, target: Path, docs: Path) -> None:
    """The LoopVAE release of a device run's files into ``target`` with a card; the results, without the per-image
    evaluation rows (the interventions keep theirs), into ``docs/release_gpu.json``."""
    results = json.loads((source / "results.json").read_text())
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source / "loopvae", target)
    ours, ref = results["models"]["loopvae"], results["models"]["reference"]
    rows = [f"| {s} | {ours['eval'][s]['psnr']:.2f} | {ours['eval'][s]['ssim']:.4f} | "
            f"{ours['eval'][s]['baseline']['psnr']:.2f} | {ref['eval'][s]['psnr']:.2f} | {c['mean']:+.2f} dB, "
            f"{c['verdict']} |" for s, c in results["comparisons"].items()]
    card = text("card-gpu", results=results, ours=ours, ref=ref, preset=PRESET, rows=rows)
    (target / "README.md").write_text("\n".join(card) + "\n")
    for entry in results["models"].values():
        for split in entry["eval"].values():
            split.pop("per_image", None)
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "release_gpu.json").write_text(json.dumps(results, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="compact training shard + held-out shard (here, CPU)")
    p.add_argument("--shared", default=None)
    p.add_argument("--train", default=None, help="training shards (default: the release's, from --shared)")
    p.add_argument("--holdout", default=None, help="held-out shards (default: the release's)")
    p.add_argument("--out", default="gpu-data")
    p = sub.add_parser("run", help="train, evaluate and export both models (the device call)")
    for flag, default in (("--data", "gpu-data"), ("--out", None), ("--work", "runs/release-vae-gpu"),
                          ("--device", "cuda")):
        p.add_argument(flag, default=default, required=default is None)
    p.add_argument("--budget-s", type=float, default=170.0, help="LoopVAE training seconds (the reference: same steps)")
    p.add_argument("--probe-steps", type=int, default=40)
    p.add_argument("--steps", type=int, default=None, help="fixed steps instead of calibrating (CPU tests)")
    p.add_argument("--eval-resolution", type=int, default=256)
    p.add_argument("--intervention-images", type=int, default=16)
    for flag, what in (("--set", "both runs"), ("--loopvae-set", "the LoopVAE run"),
                       ("--reference-set", "the reference run")):
        p.add_argument(flag, nargs="*", default=[], help=f"extra key=value overrides for {what}")
    p = sub.add_parser("bundle", help="bundle a device run's LoopVAE release (here)")
    p.add_argument("--source", required=True, help="the folder the device run's $OUT files came back to")
    p.add_argument("--target", default="assets/models/loopvae-cnn-small")
    p.add_argument("--docs", default="docs/study_loopvae")
    args = parser.parse_args()
    if args.command == "prepare":
        if args.train is None or args.holdout is None:
            data = vr.release_data(args.shared, Path("runs/release-vae/data"), "prepare (or --train and --holdout)")
            args.train, args.holdout = args.train or data.train, args.holdout or data.imagenet_holdout
        print(json.dumps(prepare(args.train, args.holdout, Path(args.out)), indent=1))
    elif args.command == "run":
        run(args)
    else:
        bundle(Path(args.source), Path(args.target), Path(args.docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
