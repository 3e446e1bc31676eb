"""The recurrence study on the shared CIFAR-10 shards -> ``docs/study_recursion.md`` (+ plots).

Arms (every one trained at several seeds; seed = initialisation and data order):

1. SR-ViT R = 1, 2, 4 x SoftMoR ``fusion_mode`` in {last (plain recursion), mean (equal weights), global (one
   learned weight per step), token, query}; ``mean`` and ``global`` are the controls that tell token-wise routing
   from averaging the steps.
2. bViT (T = 12) with and without stage-wise deep supervision, evaluated at every step 1..T and at 1x..4x the
   training horizon.
3. bViT through Euler (h = 1), Heun at matched *steps* (T = 12, h = 1: twice the block evaluations) and at
   matched *block evaluations* (T = 6, h = 2: the same 12 evaluations and the same integration time), and the
   black-box field ``z' = F(z)``, whose state norm per step is recorded beside Euler's. The trained Euler and
   Heun bViTs are also evaluated with the *other* solver at the same integration time (:func:`swapped_solvers`).
4. bViT (Euler) at T = 3 and T = 5 beside T = 12: does depth matter at this budget?

The learning rate is not assumed: a short sweep per depth group (R = 1, R = 2, R = 4, bViT, and plain recursion at
R = 2 and 4 on its own: R2-last, R4-last) trains seed 0 at each lr of the grid, and the lr with the lowest final
training loss is used for every arm and seed of that group (the sweep's seed-0 run at the picked lr *is* that arm's
seed-0 run). The fused arms (mean, global, token, query) use the lr picked for query at their depth. The picks, the
losses behind them, the loss curves, the router entropies logged during training and everything else land in
``result.json`` per run; the report module (:mod:`study_recursion_report`) turns them into tables, plots and a
reading computed from the numbers.

Usage: ``python benchmarks/study_recursion.py --out docs/study_recursion.md`` (``make study``: 3 seeds) or
``--quick`` (``make study-quick``: 1 seed, a third of the steps, 2,000 test images; writes into the runs folder, not
docs). Runs live in ``--runs``; a run whose ``result.json`` exists (with the same settings) is reused, so an
interrupted study resumes where it stopped; a stored result that lacks a measurement this version takes
(:func:`missing_measurements`) is measured again from its weights, or retrained when they are gone; ``--fresh``
retrains everything. ``--jobs`` runs that many trainings side by side, each on ``cores / jobs`` threads (two
single-threaded runs beat one two-threaded run on a 2-core machine for these small matrices).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from study_recursion_measure import logged_history, probe, spread, summarise_history, test_images  # noqa: E402

# The study's model: the DeiT-Ti block at half width (96 channels, 3 heads of 32), 12 blocks, 8x8 patches of the
# 32x32 images (16 tokens + class token); the width keeps 3 seeds x 12 arms + the lr sweep inside ~2 hours of
# 2 CPU cores at a budget where the training losses flatten.
STUDY_MODEL: dict[str, Any] = {"patch_size": 8, "embed_dim": 96, "num_heads": 3}
HORIZON_MULTIPLES = (1.0, 1.5, 2.0, 3.0, 4.0)  # bViT evaluation depth as multiples of its training T


@dataclass
class Arm:
    """One configuration, trained once per seed.

    ``group``: the lr-sweep group whose picked lr it uses; ``model``: ``model_overrides`` on top of
    :data:`STUDY_MODEL`; ``extra``: further ``key=value`` config overrides.
    """

    name: str
    section: str  # fusion | supervision | solver
    preset: str
    group: str
    model: dict[str, Any]
    extra: tuple[str, ...] = ()

    @property
    def horizon(self) -> int:
        """Training steps per block (R for SR-ViT, T for bViT)."""
        return int(self.model.get("recursion", 12 if self.preset.startswith("cifar10-bvit") else 1))

    @property
    def block_evaluations(self) -> int:
        """Block evaluations of one forward at the training horizon (the study's unit of arithmetic)."""
        per_step = {"heun": 2, "rk4": 4}.get(self.model.get("solver", "euler"), 1)
        depth = 1 if self.preset.startswith("cifar10-bvit") else 12
        return depth * self.horizon * per_step

    def horizon_steps(self) -> tuple[int, ...]:
        """Evaluation depths ``T x`` :data:`HORIZON_MULTIPLES` (bViT only; empty for SR-ViT)."""
        if not self.preset.startswith("cifar10-bvit"):
            return ()
        return tuple(sorted({max(1, round(m * self.horizon)) for m in HORIZON_MULTIPLES}))

    def eval_steps(self) -> tuple[int, ...]:
        """Evaluation depths (bViT only): every step ``1..T`` inside the horizon and :meth:`horizon_steps` beyond
        it (one trajectory gives them all)."""
        if not self.preset.startswith("cifar10-bvit"):
            return ()
        return tuple(sorted(set(self.horizon_steps()) | set(range(1, self.horizon + 1))))


FUSION_MODES = ("last", "mean", "global", "token", "query")


def study_arms() -> list[Arm]:
    """Every arm of the study, in report order (``bvit-euler`` serves the supervision, solver and depth sections).

    Plain recursion (``last``) has its own lr sweep per depth (groups ``R2-last``, ``R4-last``); the fused arms
    use the lr picked for ``query`` at their depth.
    """
    arms = [Arm("srvit-R1-last", "fusion", "cifar10-srvit-ti", "R1", {"recursion": 1, "fusion_mode": "last"})]
    for r in (2, 4):
        for mode in FUSION_MODES:
            arms.append(Arm(f"srvit-R{r}-{mode}", "fusion", "cifar10-srvit-ti", f"R{r}-last" if mode == "last"
                            else f"R{r}", {"recursion": r, "fusion_mode": mode}))
    bvit = "cifar10-bvit-ti"
    arms += [
        Arm("bvit-euler", "supervision", bvit, "bvit", {}),
        Arm("bvit-euler-ds3", "supervision", bvit, "bvit", {}, ("deep_supervision_every=3",)),
        Arm("bvit-heun", "solver", bvit, "bvit", {"solver": "heun"}),
        Arm("bvit-heun-T6h2", "solver", bvit, "bvit", {"solver": "heun", "recursion": 6, "step_size": 2.0}),
        Arm("bvit-blackbox", "solver", bvit, "bvit", {"solver": "blackbox"}),
        Arm("bvit-T3", "depth", bvit, "bvit", {"recursion": 3}),
        Arm("bvit-T5", "depth", bvit, "bvit", {"recursion": 5}),
    ]
    return arms


SWEEP_ARMS = {"R1": "srvit-R1-last", "R2": "srvit-R2-query", "R4": "srvit-R4-query", "bvit": "bvit-euler",
              "R2-last": "srvit-R2-last", "R4-last": "srvit-R4-last"}


def swapped_solvers(arm: Arm) -> list[tuple[str, float, int]]:
    """The other-solver evaluations of a trained Euler / Heun bViT at its integration time ``T x h``:
    ``(solver, h, steps)`` at matched steps and at matched block evaluations (Heun costs two per step)."""
    if not arm.preset.startswith("cifar10-bvit") or arm.section == "depth" or arm.extra:
        return []  # the depth arms and deep supervision are not part of the solver comparison
    method = arm.model.get("solver", "euler")
    steps, h = arm.horizon, float(arm.model.get("step_size", 1.0))
    if method == "euler":
        return [("heun", h, steps), ("heun", 2 * h, steps // 2)]
    if method == "heun":
        return [("euler", h, steps), ("euler", h / 2, 2 * steps)]
    return []


def missing_measurements(result: dict[str, Any], arm: Arm) -> list[str]:
    """What a stored result lacks of the measurements this version of the study takes for ``arm`` (an older
    result is re-measured, or retrained when its weights are gone)."""
    if result.get("diverged"):
        return []
    missing = []
    if arm.preset.startswith("cifar10-bvit"):
        if any(str(t) not in result.get("by_steps", {}) for t in range(1, arm.horizon + 1)):
            missing.append("by_steps 1..T")
        if swapped_solvers(arm) and "swapped" not in result:
            missing.append("swapped")
    return missing


@dataclass
class Settings:
    """What every run shares; stored in each ``result.json`` so a changed study never reuses stale runs."""

    steps: int = 600
    seeds: tuple[int, ...] = (0, 1, 2)
    lr_grid: tuple[float, ...] = (5e-4, 1e-3, 2e-3)
    max_extensions: int = 2  # a pick at the grid's edge extends the sweep by halving / doubling, at most this often
    eval_images: int | None = None  # None: all 10,000 test images
    probe_images: int = 256  # class-balanced test images for state norms and router weights

    def run_key(self) -> dict[str, Any]:
        return {"steps": self.steps, "eval_images": self.eval_images, "probe_images": self.probe_images,
                "model": STUDY_MODEL}


QUICK = Settings(steps=200, seeds=(0,), eval_images=2000)


@dataclass
class Task:
    arm: Arm
    lr: float
    seed: int

    @property
    def name(self) -> str:
        return f"{self.arm.name}-lr{self.lr:g}-s{self.seed}"

    @property
    def cost(self) -> int:
        return self.arm.block_evaluations


@dataclass
class Paths:
    train: str
    test: str
    runs: Path
    threads: int = 1
    settings: Settings = field(default_factory=Settings)


# -- one run (in a worker process) -----------------------------------------------------------------------
def execute(task: Task, paths: Paths) -> dict[str, Any]:
    """Train ``task`` (or resume it), evaluate the EMA weights, probe them; return (and store) the result.

    A run whose weights and result are on disk but whose result lacks this study's newer measurements
    (:func:`missing_measurements`) is measured again without retraining.
    """
    import torch

    from srvit.train_config import load_train_config
    from srvit.trainer import NonFiniteLossError, train

    torch.set_num_threads(paths.threads)
    settings, run_dir = paths.settings, paths.runs / task.name
    overrides = [
        f"model_overrides={json.dumps({**STUDY_MODEL, **task.arm.model})}", f"max_steps={settings.steps}",
        f"lr={task.lr}", f"seed={task.seed}", "progress_bar=false", "checkpoint_every=200", "keep_checkpoints=1",
        "log_every=1",  # every step's loss reaches TensorBoard, the run's durable record (logged_history)
        *task.arm.extra,
    ]
    config = load_train_config(task.arm.preset, overrides)
    stored = run_dir / "result.json"
    if stored.is_file() and (run_dir / "release").is_dir():
        previous = json.loads(stored.read_text())
        if previous.get("settings") == settings.run_key() and not previous.get("diverged"):
            result = {**previous, **measure(task, paths, config.resolution)}
            stored.write_text(json.dumps(result, indent=1))
            return result
    base = {"name": task.name, "arm": task.arm.name, "group": task.arm.group, "lr": task.lr, "seed": task.seed,
            "overrides": overrides, "settings": settings.run_key()}
    start = time.perf_counter()
    try:
        trained = train(config, paths.train, run_dir)
    except NonFiniteLossError as error:  # a diverged lr is a result of the sweep, not a crash of the study
        result = {**base, "diverged": True, "error": str(error).splitlines()[0],
                  "train_seconds": round(time.perf_counter() - start, 1)}
        stored.write_text(json.dumps(result, indent=1))
        return result
    train_s = time.perf_counter() - start
    if trained.stopped_by:
        raise RuntimeError(f"{task.name}: training stopped early ({trained.stopped_by}); rerun the study to resume")
    result = {**base, "diverged": False, "steps": trained.step,
              "epochs": trained.step / epoch_batches(config, paths.train), "train_seconds": round(train_s, 1),
              **summarise_history(logged_history(run_dir)), **measure(task, paths, config.resolution)}
    stored.write_text(json.dumps(result, indent=1))
    return result


def measure(task: Task, paths: Paths, resolution: int) -> dict[str, Any]:
    """Evaluate a finished run's EMA weights (top-1/top-5, top-1 at every :meth:`Arm.eval_steps` depth, the
    other solver at equal integration time) and probe them."""
    import torch

    from srvit.evaluate import Counts, batch_counts
    from srvit.loading import load_classifier

    settings = paths.settings
    model = load_classifier(paths.runs / task.name / "release").model.eval()
    start = time.perf_counter()
    images, labels = test_images(paths.test, resolution)
    chosen = spread(len(labels), settings.eval_images)

    def count(steps: tuple[int, ...]) -> Counts:
        counts = Counts()
        with torch.no_grad():
            for i in range(0, len(chosen), 250):
                part = chosen[i:i + 250]
                counts = counts.merge(batch_counts(model, images[part], labels[part], steps, False))
        return counts

    counts = count(task.arm.eval_steps())
    n = counts.num_images
    swapped = []
    trained = (model.solver.method, model.solver.step_size)
    for method, h, steps in swapped_solvers(task.arm):
        model.use_solver(method, h)
        other = count((steps,))
        swapped.append({"solver": method, "step_size": h, "steps": steps, "time": steps * h,
                        "block_evaluations": steps * {"heun": 2, "rk4": 4}.get(method, 1),
                        "top1": other.by_steps[steps] / other.num_images})
    model.use_solver(*trained)
    result = {
        "parameters": sum(p.numel() for p in model.parameters()), "block_evaluations": task.arm.block_evaluations,
        "top1": counts.top1 / n, "top5": counts.top5 / n, "num_images": n,
        "by_steps": {str(k): v / n for k, v in sorted(counts.by_steps.items())},
        **({"swapped": swapped} if swapped else {}),
        **probe(model, images[spread(len(labels), settings.probe_images)], task.arm),
    }
    result["eval_seconds"] = round(time.perf_counter() - start, 1)
    return result


def epoch_batches(config, train_urls: str) -> int:
    """Optimizer steps per epoch of the training shards at the config's batch size (as the trainer plans them)."""
    import loopdata

    loader = loopdata.make_loader(train_urls, task="classification", train=True, batch_size=config.batch_size,
                                  num_workers=0, resolution=config.resolution, **config.data_options())
    return max(loader.num_batches, 1)


# -- the study ------------------------------------------------------------------------------------------
def cached(task: Task, paths: Paths) -> dict[str, Any] | None:
    """The stored result of ``task`` if it was produced with the current settings."""
    file = paths.runs / task.name / "result.json"
    if not file.is_file():
        return None
    result = json.loads(file.read_text())
    if result.get("settings") != paths.settings.run_key():
        sys.exit(f"{file} was produced with other settings ({result.get('settings')}); rerun with --fresh "
                 "or point --runs at a new folder")
    return result


def pick_lr(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The sweep's decision for one group: the lr of lowest final training loss (diverged runs never win)."""
    losses = {str(r["lr"]): (None if r["diverged"] else r["final_train_loss"]) for r in results}
    finite = [r for r in results if not r["diverged"]]
    if not finite:
        raise RuntimeError(f"every lr of the sweep diverged for {results[0]['arm']}: {sorted(losses)}")
    best = min(finite, key=lambda r: r["final_train_loss"])
    grid = sorted(r["lr"] for r in results)
    return {"lr": best["lr"], "arm": best["arm"], "losses": losses,
            "top1": {str(r["lr"]): r.get("top1") for r in results},
            "edge": len(grid) > 1 and best["lr"] in (grid[0], grid[-1]), "tried": grid}


def next_lr(pick: dict[str, Any], tried: list[float], settings: Settings) -> float | None:
    """The lr to add when ``pick`` lies at the edge of what was tried (half the smallest / twice the largest),
    while fewer than ``settings.max_extensions`` were added; else ``None``."""
    extensions = len(tried) - len(settings.lr_grid)
    if not pick["edge"] or extensions >= settings.max_extensions:
        return None
    return min(tried) / 2 if pick["lr"] == min(tried) else max(tried) * 2


def shared_lr_tasks(picks: dict[str, dict], arms: dict[str, Arm], settings: Settings) -> list[Task]:
    """Plain recursion also at the lr its fused arms use (every seed), when its own sweep picked another one: the
    control that shows how much of a fused - plain difference is the lr."""
    tasks = []
    for group, pick in picks.items():
        base = group.removesuffix("-last")
        if base != group and base in picks and picks[base]["lr"] != pick["lr"]:
            tasks += [Task(arms[SWEEP_ARMS[group]], picks[base]["lr"], seed) for seed in settings.seeds]
    return tasks


def run_study(paths: Paths, jobs: int) -> tuple[dict[str, dict], dict[str, dict]]:
    """Run the sweep, then every arm x seed at its group's picked lr; ``(results by run name, picks by group)``.

    A group's main runs are queued as soon as its own sweep is done, so the workers never wait on other groups.
    When a group's best lr is the smallest or largest tried, its sweep first extends by halving / doubling
    (:func:`next_lr`, at most ``settings.max_extensions`` times), so the pick is bracketed where it can be.
    """
    settings = paths.settings
    arms = {a.name: a for a in study_arms()}
    groups = sorted(SWEEP_ARMS, key=lambda g: -arms[SWEEP_ARMS[g]].block_evaluations)
    sweep = {g: [Task(arms[SWEEP_ARMS[g]], lr, settings.seeds[0]) for lr in settings.lr_grid] for g in groups}
    results: dict[str, dict] = {}
    picks: dict[str, dict] = {}
    context = multiprocessing.get_context("spawn")
    pool = cf.ProcessPoolExecutor(jobs, mp_context=context, max_tasks_per_child=1) if jobs > 1 else None
    pending: dict[cf.Future, Task] = {}
    queued: set[str] = set()

    def submit(task: Task, main: bool = False) -> None:
        # A main run needs every measurement; a sweep run only its training loss (the seed-0 sweep run at the
        # picked lr is resubmitted as a main run and re-measured if an older study stored it).
        if task.name in queued and not (main and task.name in results
                                        and missing_measurements(results[task.name], task.arm)):
            return
        queued.add(task.name)
        future: cf.Future = cf.Future()
        done = cached(task, paths)
        if done is not None and not (main and missing_measurements(done, task.arm)):
            future.set_result(done)
        elif pool is None:
            future.set_result(execute(task, paths))
        else:
            future = pool.submit(execute, task, paths)
        pending[future] = task

    def release_group(group: str) -> None:
        pick = pick_lr([results[t.name] for t in sweep[group]])
        extra = next_lr(pick, [t.lr for t in sweep[group]], settings)
        if extra is not None:  # the optimum is not bracketed yet: sweep one lr further out first
            task = Task(arms[SWEEP_ARMS[group]], extra, settings.seeds[0])
            sweep[group].append(task)
            submit(task)
            return
        picks[group] = pick
        main = [Task(a, picks[group]["lr"], s) for a in arms.values() if a.group == group for s in settings.seeds]
        for task in sorted(main, key=lambda t: -t.cost):
            submit(task, main=True)
        for task in shared_lr_tasks(picks, arms, settings):
            submit(task)

    try:
        for group in groups:
            for task in sweep[group]:
                submit(task)
        while pending:
            finished, _ = cf.wait(list(pending), return_when=cf.FIRST_COMPLETED)
            for future in finished:
                task = pending.pop(future)
                result = future.result()
                results[task.name] = result
                state = "diverged" if result["diverged"] else f"top-1 {100 * result['top1']:.2f}%"
                print(f"[{time.strftime('%H:%M:%S')}] {task.name}: {state} "
                      f"({result['train_seconds']:.0f} s training)", flush=True)
                for group in groups:
                    if group not in picks and all(t.name in results for t in sweep[group]):
                        release_group(group)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return results, picks


def main(argv: list[str] | None = None) -> int:
    from study_recursion_report import write_report

    import loopdata

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="report path (default docs/study_recursion.md; with --quick "
                                                    "RUNS/study_recursion.md)")
    parser.add_argument("--runs", default=None, help="run folder (default runs/study, runs/study-quick with --quick)")
    parser.add_argument("--data", default=None, help="directory with cifar10-{train,test}-000000.tar")
    parser.add_argument("--quick", action="store_true", help="1 seed, 200 steps, 2,000 test images (a check)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="trainings side by side (default: 2, or 1 on a 1-core machine)")
    parser.add_argument("--fresh", action="store_true", help="delete earlier runs first")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run (overrides the default)")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds, e.g. 0,1,2 (the first one sweeps)")
    parser.add_argument("--lr-grid", default=None, help="comma-separated learning rates of the sweep")
    parser.add_argument("--eval-images", type=int, default=None, help="test images to evaluate (default: all)")
    parser.add_argument("--report-only", action="store_true",
                        help="re-render the report and plots from its committed results.json (no training)")
    args = parser.parse_args(argv)
    if args.report_only:
        out = Path(args.out or "docs/study_recursion.md")
        saved = json.loads((out.with_suffix("") / "results.json").read_text())
        write_report(saved["runs"], saved["picks"], study_arms(), saved["settings"], out, "make study",
                     saved["run_info"])
        print(f"wrote {out} from {out.with_suffix('') / 'results.json'}")
        return 0
    data = Path(args.data) if args.data else (loopdata.find_shared_data() or Path("missing")) / "cifar10"
    train_urls, test_urls = data / "cifar10-train-000000.tar", data / "cifar10-test-000000.tar"
    if not train_urls.is_file() or not test_urls.is_file():
        sys.exit(f"CIFAR-10 shards not found in {data}; pass --data DIR (with cifar10-train/test-000000.tar)")
    if args.jobs < 1:
        sys.exit(f"--jobs must be >= 1, got {args.jobs}")
    settings = replace(QUICK if args.quick else Settings())
    try:
        if args.steps is not None:
            settings.steps = args.steps
        if args.seeds is not None:
            settings.seeds = tuple(int(v) for v in args.seeds.split(","))
        if args.lr_grid is not None:
            settings.lr_grid = tuple(float(v) for v in args.lr_grid.split(","))
    except ValueError as error:
        sys.exit(f"--seeds / --lr-grid take comma-separated numbers: {error}")
    if args.eval_images is not None:
        settings.eval_images = args.eval_images
    if settings.steps < 1 or not settings.seeds or not settings.lr_grid:
        sys.exit(f"need --steps >= 1, at least one seed and one lr (got {settings})")
    runs = Path(args.runs or ("runs/study-quick" if args.quick else "runs/study"))
    out = Path(args.out or (runs / "study_recursion.md" if args.quick else "docs/study_recursion.md"))
    if args.fresh and runs.exists():
        shutil.rmtree(runs)
    runs.mkdir(parents=True, exist_ok=True)
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    paths = Paths(str(train_urls), str(test_urls), runs, threads, settings)
    start = time.perf_counter()
    results, picks = run_study(paths, args.jobs)
    wall = time.perf_counter() - start
    command = "make study-quick" if args.quick else "make study"
    write_report(results, picks, study_arms(), asdict(settings), out, command,
                 {"jobs": args.jobs, "threads": threads, "wall_seconds": round(wall, 1)})
    print(f"wrote {out} ({wall / 60:.1f} min this invocation)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
