"""Where should the loops go? The matched-budget schedule study -> ``docs/study_schedule.md``.

Every arm trains the bundled model's recipe (preset ``release-tiny``: ``loopvae-cnn-tiny`` with the shortcuts,
lr 2e-3, L1 + 10 MSE, 8 crops of 64^2, EMA 0.999) for the same :data:`STUDY_STEPS` steps (the same images
seen) and changes only where the passes go:

* ``paper``: encoder [1, 2, 4], decoder [1, 2, 4] (decoder order 8x -> 4x -> 2x), the paper's schedule;
* ``dec-1-2-1`` / ``dec-1-2-2``: the decoder's finest stage cut to 1 / 2 passes;
* ``dec-4-2-1``: coarse-heavy decoder; ``dec-2-2-2``: uniform decoder;
* ``dec-2-4-1``: deeper coarse (our arm: the paper's 7 decoder passes, the finest stage's moved to 8x / 4x);
* ``paper-ds``: the paper's schedule with light deep supervision of the decoder's finest-stage passes
  (``deep_supervision_weight`` 0.25: the full-depth loss dominates), for any-time decoding;
* ``flux-vae-tiny``: the reference, diffusers ``AutoencoderKL`` in the FLUX layout, same recipe and images seen.

The arms the dominance question rests on (``paper``, ``dec-1-2-1``, the reference) have three seeds,
``dec-1-2-2`` two, the others one. A run
is one job: train, evaluate at 256^2 on kodim21-24 and the 40 held-out ImageNet images (per image), and,
for LoopVAEs, the interventions (prefix truncation and single-pass bypass per image, 16 images); two jobs
run at a time, one thread each. The report (``--report``, also run at the end) adds parameters, counted
GMACs and CPU ms/image measured side by side, the paired verdicts, the frontier plot with its Pareto set,
the dominance statement and the any-time decoding table; it is rendered by ``study_schedule_report.py``.

Usage: ``python benchmarks/study_schedule.py --out docs/study_schedule.md`` (``make study-schedule``; about
1.5 h on 2 cores). Finished jobs in ``--runs`` (default ``runs/study-schedule``) are reused.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from study_loopvae import Timings  # noqa: E402
from study_vae_data import StudyData, release_data  # noqa: E402

PRESET = "release-tiny"
STUDY_STEPS = 1500  # a fifth of the release run: the 15 runs fit ~1.75 h of two-job CPU time
REFERENCE = "flux-vae-tiny"
ENCODER_PAPER = (1, 2, 4)


@dataclass(frozen=True)
class ScheduleArm:
    """One schedule: a ``name``, what it changes, pass counts per stage, its seeds and extra overrides."""

    name: str
    change: str
    encoder_passes: tuple[int, ...] | None  # None for the reference VAE
    decoder_passes: tuple[int, ...] | None
    seeds: tuple[int, ...] = (0,)
    extra: tuple[str, ...] = ()
    deep_supervision: bool = False

    @property
    def is_loopvae(self) -> bool:
        return self.encoder_passes is not None

    def model_overrides(self) -> dict[str, Any]:
        if not self.is_loopvae:
            return {}
        return {"shortcuts": True, "encoder_passes": list(self.encoder_passes),
                "decoder_passes": list(self.decoder_passes)}

    def model_name(self) -> str:
        return "loopvae-cnn-tiny" if self.is_loopvae else REFERENCE

    def run_name(self, seed: int) -> str:
        return f"{self.name}-s{seed}"

    def overrides(self, seed: int, steps: int) -> list[str]:
        every = max(1, min(500, steps // 2))
        model = self.model_overrides()
        flow = "{" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in model.items()) + "}"
        return [f"seed={seed}", f"model={self.model_name()}", f"model_overrides={flow}", f"max_steps={steps}",
                f"checkpoint_every={every}", f"image_every={steps}", f"log_every={max(1, min(50, steps // 10))}",
                "eval_every=0", *(["warmup_steps=1"] if steps < 200 else []), *self.extra]


def schedule_arms() -> list[ScheduleArm]:
    """The study's arms (longest runs first, so the two job slots finish together)."""
    two, three = (0, 1), (0, 1, 2)
    return [
        ScheduleArm("paper-ds", "paper schedule + deep supervision 0.25 of the finest decoder passes",
                    ENCODER_PAPER, (1, 2, 4), extra=("deep_supervision_weight=0.25",), deep_supervision=True),
        ScheduleArm("paper", "paper: decoder 8x/4x/2x = 1/2/4", ENCODER_PAPER, (1, 2, 4), seeds=three),
        ScheduleArm("dec-2-2-2", "uniform decoder 2/2/2", ENCODER_PAPER, (2, 2, 2)),
        ScheduleArm("dec-1-2-2", "finest stage cut to 2 passes", ENCODER_PAPER, (1, 2, 2), seeds=two),
        ScheduleArm("dec-2-4-1", "deeper coarse: 2/4/1 (7 passes, finest moved to 8x/4x)", ENCODER_PAPER, (2, 4, 1)),
        ScheduleArm("dec-4-2-1", "coarse-heavy decoder 4/2/1", ENCODER_PAPER, (4, 2, 1)),
        ScheduleArm("dec-1-2-1", "finest stage cut to 1 pass", ENCODER_PAPER, (1, 2, 1), seeds=three),
        ScheduleArm(REFERENCE, "reference AutoencoderKL (FLUX layout)", None, None, seeds=three),
    ]


# -- jobs ------------------------------------------------------------------------------------------
def _done(run: Path, arm: ScheduleArm) -> bool:
    needed = [run / "eval-kodak" / "metrics.json", run / "eval-imagenet" / "metrics.json"]
    if arm.is_loopvae:
        needed.append(run / "interventions" / "interventions.json")
    return all(p.is_file() for p in needed)


def job_commands(arm: ScheduleArm, seed: int, steps: int, runs: Path, data: StudyData, lpips_net: str,
                 eval_limit: int | None = None) -> list[list[str]]:
    """Train -> evaluate both held-out sets -> interventions (LoopVAEs): one job's commands, in order."""
    run = runs / arm.run_name(seed)
    py = [sys.executable, "-m", "loopvae"]
    cmds = []
    if not (run / "release").is_dir():
        cmds.append([*py, "train", "--config", PRESET, "--data", data.train, "--out", str(run),
                     "--set", "progress_bar=false", *arm.overrides(seed, steps)])
    for split, urls in (("kodak", data.kodak_val), ("imagenet", data.imagenet_holdout)):
        if not (run / f"eval-{split}" / "metrics.json").is_file():
            cmds.append([*py, "eval", "--checkpoint", str(run / "release"), "--data", urls, "--out",
                         str(run / f"eval-{split}"), "--resolution", "256", "--batch-size", "4", "--num-workers",
                         "0", "--lpips-net", lpips_net, "--no-progress",
                         *([] if eval_limit is None else ["--limit", str(eval_limit)])])
    if arm.is_loopvae and not (run / "interventions" / "interventions.json").is_file():
        cmds.append([*py, "intervene", "--checkpoint", str(run / "release"), "--data",
                     f"{data.kodak_val},{data.imagenet_holdout}", "--out", str(run / "interventions"),
                     "--limit", str(16 if eval_limit is None else eval_limit), "--resolution", "256"])
    return cmds


def run_jobs(jobs: list[tuple[str, list[list[str]]]], runs: Path, parallel: int, timings: Timings) -> None:
    """Run each job's commands in order, ``parallel`` jobs at a time with one thread each; stop all on a failure."""
    pending = [j for j in jobs if j[1]]
    running: list[tuple[str, list[list[str]], subprocess.Popen, float, Any]] = []
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    started, wall_before = time.perf_counter(), timings.data["train_wall"]

    def launch(name: str, cmds: list[list[str]], start: float) -> None:
        log = open(runs / f"{name}.log", "a")  # noqa: SIM115 (closed when the job ends)
        log.write(f"$ {' '.join(cmds[0])}\n")
        log.flush()
        print(f"{name}: {' '.join(cmds[0][2:5])} ...", flush=True)
        running.append((name, cmds[1:], subprocess.Popen(cmds[0], stdout=log, stderr=subprocess.STDOUT, env=env),
                        start, log))

    while pending or running:
        while pending and len(running) < parallel:
            name, cmds = pending.pop(0)
            launch(name, cmds, time.perf_counter() - timings.data["train"].get(name, 0.0))
        time.sleep(5)
        timings.data["train_wall"] = wall_before + time.perf_counter() - started
        for item in list(running):
            name, rest, proc, start, log = item
            timings.data["train"][name] = round(time.perf_counter() - start, 1)
            if proc.poll() is None:
                continue
            log.close()
            running.remove(item)
            if proc.returncode != 0:
                for *_, other, _, _ in running:
                    other.terminate()
                sys.exit(f"{name}: a command failed (exit {proc.returncode}); see {runs / name}.log")
            if rest:
                launch(name, rest, start)
            else:
                print(f"  {name} done in {time.perf_counter() - start:.0f} s", flush=True)
        timings.save()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/study_schedule.md")
    parser.add_argument("--runs", default="runs/study-schedule")
    parser.add_argument("--data-dir", default="runs/release-vae/data", help="the release's data split (made once)")
    parser.add_argument("--shared", default=None)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=STUDY_STEPS, help="training steps of every arm")
    parser.add_argument("--only", nargs="*", default=None,
                        help="arm names (default: all; 'paper' and the reference are always kept: the report "
                             "compares against them)")
    parser.add_argument("--eval-limit", type=int, default=None,
                        help="images per held-out set (smoke runs; the study's figures use all 44 and 16)")
    parser.add_argument("--train-only", action="store_true", help="run the jobs, skip the report")
    parser.add_argument("--report", action="store_true", help="only measure and render from finished jobs")
    parser.add_argument("--render-only", action="store_true",
                        help="re-render the page and plots from the committed results.json (no training or measuring)")
    args = parser.parse_args()
    if args.render_only:
        from study_schedule_report import render_from_results

        render_from_results(Path(args.out))
        return 0
    runs = Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    data = release_data(args.shared, Path(args.data_dir), "the schedule study")
    arms = [a for a in schedule_arms() if args.only is None or a.name in {*args.only, "paper", REFERENCE}]
    timings = Timings(runs / "timings.json")
    from loopvae.perceptual import default_backbone_path

    lpips_net = "alex" if default_backbone_path("alex").is_file() else "none"
    if not args.report:
        jobs = [(a.run_name(s), job_commands(a, s, args.steps, runs, data, lpips_net, args.eval_limit))
                for a in arms for s in a.seeds]
        run_jobs(jobs, runs, args.jobs, timings)
    if args.train_only:
        return 0
    from study_schedule_report import measure_and_render

    measure_and_render(arms, runs, data, Path(args.out), timings, args.steps, lpips_net, args.eval_limit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
