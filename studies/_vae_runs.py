"""The LoopVAE studies' shared machinery: their data split, one ``loopvae train`` run as the study engine runs it,
and the measurements every LoopVAE study takes (evaluation, interventions, parameters / MACs, training throughput).

Data: the shared ImageNet sample (800 images, one per class, ``../shared/data/imagenet-sample``) is split by
sorted key: every ``holdout_every``-th image is held out of training (40 of 800 by default) and evaluated at
256^2; the rest train, together with the bundled Kodak crops kodim01-20. kodim21-24 (the bundled ``kodak-val``)
are never trained on. With ``validation_offset`` a further ``1 / holdout_every`` of the images leaves training
as a *validation* split (what model selection may look at), disjoint from both reported sets.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import loopdata
from loopcore.flops import count_macs, count_parameters
from loopdata.shards import expand_urls, iter_samples
from loopdata.writer import TarShardWriter


@dataclass
class StudyData:
    """Comma-separated shard lists of the study's splits."""

    train: str  # ImageNet-sample minus the held-out images, plus kodim01-20
    kodak_val: str  # kodim21-24
    imagenet_holdout: str  # every holdout_every-th ImageNet-sample image by sorted key
    num_train: int
    num_holdout: int
    validation: str = ""  # every holdout_every-th image at validation_offset (empty without one)
    num_validation: int = 0


def prepare_study_data(shared: Path, out: Path, holdout_every: int = 20, validation_offset: int | None = None
                       ) -> StudyData:
    """Write (once) ``out/imagenet-train-*.tar``, ``out/imagenet-holdout-*.tar`` (and, with
    ``validation_offset``, ``out/imagenet-val-*.tar``) from ``shared``."""
    if validation_offset is not None and not 0 < validation_offset < holdout_every:
        raise ValueError(f"validation_offset must be in 1..{holdout_every - 1}, got {validation_offset}")
    source = shared / "imagenet-sample"
    urls = expand_urls(str(source / "*.tar"))
    if not urls:
        raise FileNotFoundError(
            f"no ImageNet-sample shards in {source}; the study needs ../shared/data (or LOOPVISION_SHARED_DATA)"
        )
    done = out / "DONE"
    if not done.is_file():
        samples = sorted((s for url in urls for s in iter_samples(url)), key=lambda s: s["__key__"])
        with (TarShardWriter(out, "imagenet-train") as train, TarShardWriter(out, "imagenet-holdout") as hold,
              TarShardWriter(out, "imagenet-val") as val):
            for i, sample in enumerate(samples):
                members = {k: v for k, v in sample.items() if not k.startswith("__")}
                split = hold if i % holdout_every == 0 else val if i % holdout_every == validation_offset else train
                split.add(sample["__key__"], members)
        done.write_text(f"{len(samples)} samples, holdout_every={holdout_every}, "
                        f"validation_offset={validation_offset}\n")
    train_urls = expand_urls(str(out / "imagenet-train-*.tar"))
    hold_urls = expand_urls(str(out / "imagenet-holdout-*.tar"))
    val_urls = expand_urls(str(out / "imagenet-val-*.tar"))
    kodak_train = [str(u) for u in loopdata.bundled_kodak_urls("train")]
    n_train = sum(1 for u in train_urls for _ in iter_samples(u))
    n_hold = sum(1 for u in hold_urls for _ in iter_samples(u))
    return StudyData(
        train=",".join(train_urls + kodak_train),
        kodak_val=",".join(str(u) for u in loopdata.bundled_kodak_urls("val")),
        imagenet_holdout=",".join(hold_urls), num_train=n_train + 20, num_holdout=n_hold,
        validation=",".join(val_urls), num_validation=sum(1 for u in val_urls for _ in iter_samples(u)),
    )


RELEASE_VALIDATION_OFFSET = 10  # ImageNet-sample image i is validation when i % 20 == 10 (held out: i % 20 == 0)


def release_data(shared: str | None, out: Path, purpose: str) -> StudyData:
    """The release's data (the study's split plus the validation images) from ``shared`` (default: found);
    exits naming ``purpose`` when the shared ImageNet sample is not there."""
    root = Path(shared) if shared else loopdata.find_shared_data()
    if root is None:
        raise SystemExit(f"{purpose} needs the shared data (ImageNet sample): pass --shared DIR")
    return prepare_study_data(root, out, validation_offset=RELEASE_VALIDATION_OFFSET)


class Timings:
    """Wall seconds of each measurement after training (``post``: throughput, each evaluation, each intervention
    set), kept in a JSON file so that a rerun that reuses finished work still reports what that work cost."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = json.loads(path.read_text()) if path.is_file() else {"post": {}}

    def record(self, section: str, key: str, seconds: float) -> None:
        self.data[section][key] = round(seconds, 1)
        self.path.write_text(json.dumps(self.data, indent=2))


# -- training --------------------------------------------------------------------------------------
def run_finished(run: Path) -> bool:
    """A ``loopvae train`` run that reached its last step and wrote its release."""
    summary = run / "train_summary.json"
    if not summary.is_file():
        return False
    data = json.loads(summary.read_text())
    return data["stopped_by"] is None and data["step"] == data["total_steps"] and (run / "release").is_dir()


def keep_freed_memory_mapped() -> None:
    """Stop glibc from unmapping and re-faulting every large activation (inference at 256^2, batch 8).

    With the defaults, each freed tensor above the mmap threshold goes back to the kernel and the next
    one is page-faulted in again: measured here, a 256^2 reconstruction of 16 images spent 12 of 24 s
    in the kernel; with a fixed 32 MiB mmap threshold and no trimming it takes 4.1 s instead of 7.3 s.
    Process-wide, so the study calls it once, after training (the training runs are separate processes).
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return
    libc = ctypes.CDLL(name)
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    libc.mallopt(m_mmap_threshold, 32 * 2**20)
    libc.mallopt(m_trim_threshold, 2**30)
    libc.mallopt(m_top_pad, 256 * 2**20)


# -- measurements ----------------------------------------------------------------------------------
def model_counts(name: str, overrides: dict[str, Any]) -> tuple[int, float]:
    """``(parameters, GMACs at 256^2)``, counted on the meta device."""
    import loopvae

    with torch.device("meta"):
        model = loopvae.create_model(name, **overrides)
        x = torch.empty(1, 3, 256, 256)
    from loopvae.autoencoders import encode_mode

    return count_parameters(model), count_macs(lambda: model.decode(encode_mode(model, x))) / 1e9


def train_throughput(architectures: dict[str, tuple[str, dict[str, Any], bool]], batch: int, resolution: int,
                     rounds: int = 5, steps: int = 5) -> dict[str, float]:
    """Training images/s of each architecture, side by side in this process (alternating rounds, median).

    One step is what ``loopvae train`` does: encode, noisy posterior sample, decode (every finest-stage
    pass through the head with deep supervision), L1 + KL, backward, AdamW.
    """
    import loopvae
    from loopvae.losses import LossWeights, ReconstructionObjective
    from loopvae.trainer import ReconstructionStep

    torch.manual_seed(0)
    x = (torch.rand(batch, 3, resolution, resolution) * 2 - 1).contiguous(memory_format=torch.channels_last)
    setups = {}
    for label, (name, overrides, deep) in architectures.items():
        vae = loopvae.create_model(name, **overrides).to(memory_format=torch.channels_last).train()
        step = ReconstructionStep(vae, 0.05, deep)
        objective = ReconstructionObjective(LossWeights(perceptual=0.0, deep_supervision=1.0 if deep else 0.0))
        setups[label] = (vae, step, objective, torch.optim.AdamW(vae.parameters(), 1e-4))

    def run(label: str) -> None:
        vae, step, objective, opt = setups[label]
        recon, moments, passes = step(x)
        from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

        posterior = None if moments is None else DiagonalGaussianDistribution(moments)
        loss = objective(x, recon, posterior, 0, pass_recons=passes).total
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    times: dict[str, list[float]] = {label: [] for label in setups}
    for label in setups:
        run(label)  # warm-up
    for _ in range(rounds):
        for label in setups:
            start = time.perf_counter()
            for _ in range(steps):
                run(label)
            times[label].append((time.perf_counter() - start) / steps)
    return {label: batch / statistics.median(t) for label, t in times.items()}


def evaluate_arm(run: Path, data: StudyData, lpips_net: str, timings: Timings) -> dict[str, Any]:
    from loopvae.evaluate import EvalOptions, evaluate

    results = {}
    for split, urls in (("kodak", data.kodak_val), ("imagenet", data.imagenet_holdout)):
        out = run / f"eval-{split}"
        if (out / "metrics.json").is_file():
            results[split] = json.loads((out / "metrics.json").read_text())
            continue
        start = time.perf_counter()
        results[split] = evaluate(run / "release", urls, out, EvalOptions(
            resolution=256, batch_size=4, num_workers=0, lpips_net=lpips_net, device="cpu", grid_images=4))
        timings.record("post", f"eval {run.name} {split}", time.perf_counter() - start)
    return results


def l1_curve(run: Path) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tb")).Reload()
    # A resumed run logs the steps after its checkpoint again: keep the last value written for each step.
    by_step = {e.step: e.value for e in sorted(events.Scalars("train/l1"), key=lambda e: e.wall_time)}
    return sorted(by_step.items())


def intervention_images(kodak_val: str, imagenet_holdout: str, count: int = 16, resolution: int = 256
                        ) -> tuple[torch.Tensor, list[str]]:
    """kodim21-24 then held-out ImageNet images, ``count`` in all, at ``resolution``^2 in [-1, 1]."""
    images, keys = [], []
    for urls in (kodak_val, imagenet_holdout):
        loader = loopdata.make_loader(urls, task="reconstruction", train=False, batch_size=8, num_workers=0,
                                      resolution=resolution, rank=0, world_size=1)
        for batch in loader:
            images.append(batch["image"])
            keys.extend(batch["key"])
    return torch.cat(images)[:count], keys[:count]


def run_interventions_on(run: Path, images: torch.Tensor, keys: list[str], timings: Timings) -> dict[str, Any]:
    from loopvae.intervene import plot, render_markdown, run_interventions
    from loopvae.loading import load_artifact

    out = run / "interventions"
    if (out / "interventions.json").is_file():
        return json.loads((out / "interventions.json").read_text())
    start = time.perf_counter()
    result = run_interventions(load_artifact(run / "release"), images)
    result.update(keys=keys, model=str(run / "release"), resolution=256)
    out.mkdir(parents=True, exist_ok=True)
    (out / "interventions.json").write_text(json.dumps(result, indent=2))
    (out / "interventions.md").write_text(render_markdown(result))
    plot(result, out)
    timings.record("post", f"interventions {run.name}", time.perf_counter() - start)
    return result


# -- one run, as the study engine runs it ---------------------------------------------------------------
def evaluate_per_image(run: Path, data: StudyData) -> dict[str, Any]:
    """Per image on the 40 held-out ImageNet images and kodim21-24 at 256^2: PSNR, SSIM, bicubic, and the error
    diagnosis (:func:`diagnose`); plus the architecture facts ``loopvae compare`` records."""
    import torch

    from loopvae.compare import _architecture
    from loopvae.evaluate import EvalOptions, evaluate
    from loopvae.loading import load_tokenizer

    torch.set_num_threads(1)
    release = run / "release"
    model = load_tokenizer(release).model
    out: dict[str, Any] = {"arch": {k: v for k, v in _architecture(str(release), 256, "ema").items()
                                    if k != "config"}}
    for split, urls in (("imagenet", data.imagenet_holdout), ("kodak", data.kodak_val)):
        metrics = evaluate(release, urls, run / f"eval-{split}", EvalOptions(
            resolution=256, batch_size=4, num_workers=0, lpips_net="none", device="cpu", progress=False,
            grid_images=4))
        rows = json.loads((run / f"eval-{split}" / "per_image.json").read_text())
        diag = diagnose(model, urls)
        out[split] = sorted(({"key": r["key"], "shard": Path(r["shard"]).name, "psnr": r["psnr"], "ssim": r["ssim"],
                              "bicubic_psnr": r["bicubic_psnr"], "bicubic_ssim": r["bicubic_ssim"],
                              **diag[r["key"]]} for r in rows), key=lambda r: (r["shard"], r["key"]))
        out[f"{split}_low_resolution"] = metrics["baseline"]["low_resolution"]
    return out


def diagnose(model: Any, urls: str) -> dict[str, dict[str, float]]:
    """Per image, what kind of error a reconstruction makes (images in [0, 1] at 256^2):

    * ``colour_error``: mean over channels of |mean(recon_c) - mean(ref_c)| (a global colour / brightness shift);
    * ``low_freq_rmse`` / ``high_freq_rmse``: RMS error of the 8x8-average-pooled images, and of what remains;
    * ``out_of_range``: fraction of pixels with any channel outside [0, 1] before clipping;
    * ``saturated_ref``: fraction of reference pixels with a channel at 0 or 1 (saturated images are where
      a colour error shows most).
    """
    import torch
    import torch.nn.functional as F

    import loopdata
    from loopvae.autoencoders import reconstruct_mode

    loader = loopdata.make_loader(urls, task="reconstruction", train=False, batch_size=4, num_workers=0,
                                  resolution=256, rank=0, world_size=1)
    out = {}
    with torch.no_grad():
        for batch in loader:
            ref = (batch["image"] + 1) / 2
            rec = (reconstruct_mode(model, batch["image"]).float() + 1) / 2
            err = rec.clamp(0, 1) - ref
            low = F.avg_pool2d(err, 8)
            high = err - F.interpolate(low, scale_factor=8, mode="nearest")
            for i, key in enumerate(batch["key"]):
                out[key] = {
                    "colour_error": float((rec[i].clamp(0, 1).mean((1, 2)) - ref[i].mean((1, 2))).abs().mean()),
                    "low_freq_rmse": float(low[i].pow(2).mean().sqrt()),
                    "high_freq_rmse": float(high[i].pow(2).mean().sqrt()),
                    "out_of_range": float(((rec[i] < 0) | (rec[i] > 1)).any(0).float().mean()),
                    "saturated_ref": float(((ref[i] <= 0) | (ref[i] >= 1)).any(0).float().mean()),
                }
    return out


def train_overrides(model: str, overrides: str, steps: int, recipe: list[str], seed: int = 0, evals: int = 3,
                    base: tuple[str, ...] = ()) -> list[str]:
    """``loopvae train --set`` items of one run: the model, the budget with ``evals`` validation points and
    checkpoints, ``base`` (a study's base recipe) then ``recipe`` (the run's own items win, being later)."""
    every = max(1, steps // evals)
    return [f"model={model}", f"model_overrides={overrides}", f"seed={seed}", f"max_steps={steps}",
            f"eval_every={every}", f"checkpoint_every={every}", f"image_every={steps}", "log_every=25", *base, *recipe]


def train_and_evaluate(name: str, out: Path, data: StudyData, preset: str, overrides: list[str],
                       evaluate: bool = True) -> dict[str, Any]:
    """Train one run with ``loopvae train`` (one thread, validation on ``data.validation``) into ``out`` and
    read it: ``status``, ``exit_code``, the validation ``curve``, ``train_seconds`` (the training loop's CPU time),
    ``overrides`` and, with ``evaluate``, the per-image ``evaluation`` (:func:`evaluate_per_image`). A run already
    finished in ``out`` (an interrupted study) is read, not retrained; a failed run keeps its log's tail."""
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.parent / f"{name}.log"
    code = 0
    if not run_finished(out):
        cmd = [sys.executable, "-m", "loopvae", "train", "--config", preset, "--data", data.train, "--out", str(out),
               "--val-data", data.validation, "--set", "progress_bar=false", *overrides]
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        with open(log, "w") as sink:
            code = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, check=False).returncode
        code = code or (0 if run_finished(out) else 1)
    summary = json.loads((out / "train_summary.json").read_text()) if (out / "train_summary.json").is_file() else {}
    curve = json.loads((out / "validation.json").read_text()) if (out / "validation.json").is_file() else []
    record: dict[str, Any] = {"status": "finished" if code == 0 else "failed", "exit_code": code, "curve": curve,
                              "train_seconds": summary.get("train_seconds"), "overrides": overrides, "threads": 1}
    if code != 0:
        record["log_tail"] = log.read_text().splitlines()[-12:] if log.is_file() else []
    elif evaluate:
        record["evaluation"] = evaluate_per_image(out, data)
    return record


def copy_bundle(release: Path, target: Path, names: tuple[str, ...] = ("config.json", "latent_stats.json")) -> None:
    """A fresh bundle folder ``target``: ``names`` from the release folder ``release`` and its EMA weights."""
    import shutil

    from looprun.release import WEIGHTS_NAME, release_weights_file

    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for name in names:
        shutil.copy2(release / name, target / name)
    shutil.copy2(release_weights_file(release), target / WEIGHTS_NAME)
