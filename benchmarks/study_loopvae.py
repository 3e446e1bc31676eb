"""The LoopVAE study at CPU scale -> ``docs/study_loopvae.md`` (+ plots, results.json, the bundled model).

Does LoopVAE's recurrence do work, and what do fewer stored weights buy? Every arm trains with one
budget (the ``study-tiny`` preset: same steps, batch, crops, optimizer and schedule; seeds from one
set) on the shared ImageNet sample minus 40 held-out images plus the bundled Kodak crops kodim01-20,
and is evaluated at 256^2 on kodim21-24 and on the 40 held-out ImageNet images:

* tiny LoopVAE (``loopvae-cnn-tiny``, no shortcuts), sharing ``global`` (2 seeds), ``scale``, ``none``;
* ``flux-vae-tiny``: diffusers ``AutoencoderKL`` in the FLUX layout at 2.94x the LoopVAE's parameters
  (the paper's 84M : 29M), f8, 16 latent channels (2 seeds);
* the tiny LoopVAE with the parameter-free shortcuts (ablation) and the bicubic baseline at >= the
  latent's values per pixel;
* beyond the paper: the global LoopVAE with deep supervision on the decoder's finest-stage passes.

Then ``loopvae intervene`` on the best global LoopVAE (and the deeply supervised one): prefix
truncation, single-pass bypass, raw PSNR, out-of-range fraction, clipping displacement, next to the
paper's Table 7. Training throughput of every architecture is measured side by side in one process.

Usage: ``python benchmarks/study_loopvae.py --out docs/study_loopvae.md`` (``make study-vae``; about
two hours on 2 CPU cores, two training runs at a time). Finished runs in ``--runs`` (default
``runs/study-vae``) are reused; ``--fresh`` retrains. ``--bundle DIR`` copies the best global LoopVAE's
release there (``make study-vae`` bundles it as ``assets/models/loopvae-cnn-tiny``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import loopdata
from loopcore.flops import count_macs, count_parameters
from looprun.checkpoint import sha256_file
from looprun.release import WEIGHTS_NAME, release_weights_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from study_loopvae_report import PRESET, plots, render, write_model_card  # noqa: E402
from study_vae_data import StudyData, prepare_study_data  # noqa: E402


@dataclass
class Arm:
    """One training run: ``name``, the arm it belongs to, and its ``--set`` overrides on the preset."""

    name: str
    group: str
    overrides: list[str] = field(default_factory=list)

    @property
    def seed(self) -> int:
        return int(self.name.rsplit("-s", 1)[1])


def arms() -> list[Arm]:
    """The study's runs, longest first (two run at a time)."""
    tiny = "model=loopvae-cnn-tiny"
    return [
        Arm("global-ds-s0", "deep-supervision", [tiny, "seed=0", "deep_supervision_weight=1.0"]),
        Arm("global-s0", "global", [tiny, "seed=0"]),
        Arm("global-s1", "global", [tiny, "seed=1"]),
        Arm("scale-s0", "scale", [tiny, "seed=0", "model_overrides={sharing: scale}"]),
        Arm("none-s0", "none", [tiny, "seed=0", "model_overrides={sharing: none}"]),
        Arm("shortcuts-s0", "shortcuts", [tiny, "seed=0", "model_overrides={shortcuts: true}"]),
        Arm("flux-vae-tiny-s0", "reference", ["model=flux-vae-tiny", "seed=0"]),
        Arm("flux-vae-tiny-s1", "reference", ["model=flux-vae-tiny", "seed=1"]),
    ]


class Timings:
    """Wall seconds of every phase, kept in ``runs/timings.json`` so a rerun that reuses finished work
    still reports what that work cost: ``train_wall`` (summed over invocations that trained), ``train``
    per run, and ``post`` per measured item (throughput, each evaluation, each intervention set). Training
    times are saved every few seconds, so a killed invocation's work stays counted when a rerun resumes it; an
    ``interrupted`` entry (a ``note`` added by hand after such a kill) is quoted in the report."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = json.loads(path.read_text()) if path.is_file() else {"train_wall": 0.0, "train": {}, "post": {}}

    def record(self, section: str, key: str, seconds: float) -> None:
        self.data[section][key] = round(seconds, 1)
        self.save()

    def save(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=2))

    def total(self) -> float:
        return self.data["train_wall"] + sum(self.data["post"].values())


# -- training --------------------------------------------------------------------------------------
def _finished(run: Path) -> bool:
    summary = run / "train_summary.json"
    if not summary.is_file():
        return False
    data = json.loads(summary.read_text())
    return data["stopped_by"] is None and data["step"] == data["total_steps"] and (run / "release").is_dir()


def train_arms(selected: list[Arm], data: StudyData, runs: Path, jobs: int, threads: int, timings: Timings,
               preset: str = PRESET, extra_args: tuple[str, ...] = (),
               on_done: Callable[[Arm, int], None] | None = None) -> None:
    """Train every unfinished arm, ``jobs`` at a time (``threads`` each), recording wall seconds.

    ``preset`` is the recipe every arm starts from; ``extra_args`` go to every ``loopvae train`` (e.g.
    ``--val-data``). Without ``on_done`` a failed run stops everything; with it, ``on_done(arm, exit_code)`` is
    called as each run ends (0: finished) and a failed run (e.g. a diverged one) is recorded, not fatal."""
    pending = [a for a in selected if not _finished(runs / a.name)]
    if not pending:
        return
    started, wall_before = time.perf_counter(), timings.data["train_wall"]
    running: list[tuple[Arm, subprocess.Popen, float, Any]] = []
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    while pending or running:
        while pending and len(running) < jobs:
            arm = pending.pop(0)
            log = open(runs / f"{arm.name}.log", "w")  # noqa: SIM115 (closed when the run ends)
            cmd = [sys.executable, "-m", "loopvae", "train", "--config", preset, "--data", data.train,
                   "--out", str(runs / arm.name), *extra_args, "--set", "progress_bar=false", *arm.overrides]
            print(f"train {arm.name}: {' '.join(cmd[1:])}", flush=True)
            # A run with checkpoints resumes: its earlier invocations' seconds stay counted.
            earlier = timings.data["train"].get(arm.name, 0.0) if (runs / arm.name / "checkpoints").is_dir() else 0.0
            running.append((arm, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env),
                            time.perf_counter() - earlier, log))
        time.sleep(5)
        # Saved every poll, so an invocation that is killed still leaves what its training cost.
        timings.data["train_wall"] = wall_before + time.perf_counter() - started
        for item in list(running):
            arm, proc, start, log = item
            timings.data["train"][arm.name] = round(time.perf_counter() - start, 1)
            if proc.poll() is None:
                continue
            log.close()
            running.remove(item)
            failed = proc.returncode != 0 or not _finished(runs / arm.name)
            if on_done is not None:
                timings.record("train", arm.name, time.perf_counter() - start)
                on_done(arm, proc.returncode if failed and proc.returncode else (1 if failed else 0))
                continue
            if failed:
                for _, other, _, _ in running:
                    other.terminate()
                sys.exit(f"{arm.name}: training failed (exit {proc.returncode}); see {runs / arm.name}.log")
            timings.record("train", arm.name, time.perf_counter() - start)
            print(f"  {arm.name} done in {time.perf_counter() - start:.0f} s", flush=True)
        timings.save()
    timings.data["train_wall"] = wall_before + time.perf_counter() - started
    timings.save()


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/study_loopvae.md")
    parser.add_argument("--runs", default="runs/study-vae")
    parser.add_argument("--shared", default=None, help="the shared data directory (default: ../shared/data)")
    parser.add_argument("--jobs", type=int, default=2, help="training runs at a time")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per training run")
    parser.add_argument("--bundle", default=None, help="copy the best global LoopVAE's release into this folder")
    parser.add_argument("--fresh", action="store_true", help="delete earlier runs first")
    parser.add_argument("--report-only", action="store_true",
                        help="re-render the page from the committed results.json (and the release / recipe-search "
                             "results beside it) without training or measuring")
    parser.add_argument("--steps", type=int, default=None,
                        help="override the preset's max_steps (smoke runs; the study's figures use the preset)")
    args = parser.parse_args()
    if args.report_only:
        out = Path(args.out)
        result = json.loads((out.with_suffix("") / "results.json").read_text())
        out.write_text(render(result, "make study-vae", out.with_suffix("")))
        print(f"wrote {out} from {out.with_suffix('') / 'results.json'}")
        return 0
    shared = Path(args.shared) if args.shared else loopdata.find_shared_data()
    if shared is None:
        sys.exit("the study needs the shared data (ImageNet sample): pass --shared DIR or set LOOPVISION_SHARED_DATA")
    runs = Path(args.runs)
    if args.fresh and runs.exists():
        shutil.rmtree(runs)
    runs.mkdir(parents=True, exist_ok=True)
    data = prepare_study_data(shared, runs / "data")
    selected = arms()
    if args.steps is not None:
        every = max(1, args.steps // 2)
        for arm in selected:
            arm.overrides += [f"max_steps={args.steps}", f"checkpoint_every={every}", f"image_every={every}",
                              f"log_every={max(1, args.steps // 10)}"]
    timings = Timings(runs / "timings.json")
    train_arms(selected, data, runs, args.jobs, args.threads, timings)

    from loopvae.perceptual import default_backbone_path
    from loopvae.train_config import load_train_config

    keep_freed_memory_mapped()

    torch.set_num_threads(2)
    lpips_net = "alex" if default_backbone_path("alex").is_file() else "none"
    preset = load_train_config(PRESET, [f"max_steps={args.steps}"] if args.steps is not None else [])
    groups: dict[str, list[str]] = {}
    for arm in selected:
        groups.setdefault(arm.group, []).append(arm.name)
    representative = {"global": ("loopvae-cnn-tiny", {}, False),
                      "scale": ("loopvae-cnn-tiny", {"sharing": "scale"}, False),
                      "none": ("loopvae-cnn-tiny", {"sharing": "none"}, False),
                      "reference": ("flux-vae-tiny", {}, False),
                      "shortcuts": ("loopvae-cnn-tiny", {"shortcuts": True}, False),
                      "deep-supervision": ("loopvae-cnn-tiny", {}, True)}
    counted = {g: model_counts(name, over) for g, (name, over, _) in representative.items()}
    print("measuring training throughput side by side", flush=True)
    start = time.perf_counter()
    throughput = train_throughput(representative, preset.batch_size, preset.resolution)
    timings.record("post", "throughput", time.perf_counter() - start)
    print("evaluating", flush=True)
    evals = {arm.name: evaluate_arm(runs / arm.name, data, lpips_net, timings) for arm in selected}
    # Fixed in advance: choosing the higher-PSNR seed on the reported images would select on the test set.
    best = "global-s0"
    images, keys = intervention_images(data.kodak_val, data.imagenet_holdout)
    print("interventions", flush=True)
    interventions = {name: run_interventions_on(runs / name, images, keys, timings)
                     for name in dict.fromkeys([best, "global-s0", "global-ds-s0"])}
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "runs": str(runs), "jobs": args.jobs, "threads": args.threads,
        "preset": {k: getattr(preset, k) for k in ("max_steps", "batch_size", "resolution", "scale_jitter", "lr",
                                                  "warmup_steps", "min_lr_ratio", "kl_weight", "latent_noise_std",
                                                  "ema_decay")},
        "num_train": data.num_train, "num_holdout": data.num_holdout, "lpips_net": lpips_net, "groups": groups,
        "params": {g: c[0] for g, c in counted.items()}, "gmacs": {g: c[1] for g, c in counted.items()},
        "throughput": throughput, "eval": evals, "interventions": interventions,
        "curves": {arm.name: l1_curve(runs / arm.name) for arm in selected}, "timings": timings.data,
    }
    release = runs / best / "release"
    bundle_path = args.bundle or str(release)
    result["bundled"] = {"name": best, "path": bundle_path, "params": counted["global"][0],
                         "sha256": sha256_file(release_weights_file(release)),
                         "overrides": next(a.overrides for a in selected if a.name == best)}
    result["train_s"] = timings.data["train_wall"]
    result["post_s"] = sum(timings.data["post"].values())
    result["runtime_s"] = timings.total()
    command = "make study-vae"
    out = Path(args.out)
    plots(result, out.with_suffix(""))
    if args.bundle:
        target = Path(args.bundle)
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for name in ("config.json", "release.json"):
            shutil.copy2(release / name, target / name)
        shutil.copy2(release_weights_file(release), target / WEIGHTS_NAME)  # runs may predate the diffusers name
        info = json.loads((target / "release.json").read_text())
        info["weights_file"] = WEIGHTS_NAME
        (target / "release.json").write_text(json.dumps(info, indent=2, sort_keys=True))
        write_model_card(target, result, command)
    for name in ("psnr_vs_passes.png", "bypass_loss.png", "relative_update.png", "interventions.md"):
        shutil.copy2(runs / best / "interventions" / name, out.with_suffix("") / f"{best}-{name}")
    out.write_text(render(result, command, out.with_suffix("")))
    slim = {k: v for k, v in result.items() if k != "curves"}
    (out.with_suffix("") / "results.json").write_text(json.dumps(slim, indent=1, default=str))
    print(f"wrote {out} ({result['runtime_s'] / 60:.0f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
