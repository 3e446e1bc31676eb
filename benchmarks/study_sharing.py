"""What sharing itself costs: tied against untied weights at one architecture -> ``docs/study_sharing.md``.

``loopvae-cnn-tiny`` with shortcuts at ``sharing=global`` / ``scale`` / ``none`` (same graph, MACs, blocks, widths,
data order, crops and budget; only the number of stored blocks differs), and ``dcae-tiny`` at the longer budget.
The pre-registration (``docs/study_sharing/preregistration.md``) is committed before any run; its sha256 is
recorded in every result file and a main run refuses to start when it differs from the one the first main run saw.

Phases:

1. ``lrcheck``: every arm at lr 1e-3 / 2e-3 / 4e-3 for 500 steps (seed 0), scored on the validation images at
   step 500; a pick at the grid's edge extends the grid by a factor of 2 that way (the rule in the
   pre-registration), for every arm alike.
2. ``main``: 1,500 steps x seeds 0-4 of the three arms; 4,500 steps x seeds 0-2 of ``global`` and ``none``; and
   ``dcae-tiny`` at 4,500 steps x seeds 0-2 at its fair-study pick (with the review's lr-5e-4 arm, which must have
   run: ``python benchmarks/study_fair.py --phase search``). Each run is evaluated per image on the 40 held-out
   ImageNet images and kodim21-24 at 256².

Every finished run writes ``docs/study_sharing/runs/<run>.json`` at once (commit them as they come); a rerun trains
only what is missing. Runs train through the fair study's machinery (``study_fair.run_planned``), so the two
studies' numbers come from one trainer and one evaluation.

Usage: ``python benchmarks/study_sharing.py --phase lrcheck main`` (``make study-sharing`` also renders the page;
``benchmarks/study_sharing_report.py`` renders it from the committed files alone).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import study_fair as sf  # noqa: E402
from study_loopvae import Timings  # noqa: E402
from study_vae_data import release_data  # noqa: E402

DOCS = Path("docs/study_sharing")
PREREGISTRATION = Path(__file__).resolve().parent.parent / "docs/study_sharing/preregistration.md"
MODEL = "loopvae-cnn-tiny"
SHARING = ("global", "scale", "none")
RECIPE = ["mse_weight=10.0"]  # on top of sf.BASE_RECIPE (warm-up 50, cosine); the lr is each arm's pick
LR_GRID = (1.0e-3, 2.0e-3, 4.0e-3)
LR_STEPS = 500
LR_BOUNDS = (1.0e-4, 3.2e-2)  # the extension stops here (never reached in a sane run; a guard, not a rule)
SHORT, LONG = 1500, 4500
SHORT_SEEDS, LONG_SEEDS = (0, 1, 2, 3, 4), (0, 1, 2)
LONG_ARMS = ("global", "none")
EVALS = {SHORT: 6, LONG: 9}  # validation points per run (the learning curves)


def overrides(sharing: str) -> str:
    return f"{{shortcuts: true, sharing: {sharing}}}"


def lr_tag(lr: float) -> str:
    return f"{lr:.1e}".replace(".0e", "e").replace("e-0", "e-")


def preregistration_hash() -> str:
    return hashlib.sha256(PREREGISTRATION.read_bytes()).hexdigest()


# -- the learning-rate check ---------------------------------------------------------------------------
def lr_run_name(sharing: str, lr: float) -> str:
    return f"lr-{sharing}-{lr_tag(lr)}"


def lr_grid(sharing: str) -> list[float]:
    """The lrs this arm's check needs: the base grid, extended by a factor of 2 beyond an edge pick."""
    grid = list(LR_GRID)
    while True:
        scores = lr_scores(sharing, grid)
        if any(s is None for s in scores.values()):
            return grid
        best = max(grid, key=lambda lr: scores[lr])
        if best == min(grid) and best / 2 >= LR_BOUNDS[0]:
            grid.insert(0, best / 2)
        elif best == max(grid) and best * 2 <= LR_BOUNDS[1]:
            grid.append(best * 2)
        else:
            return grid


def lr_scores(sharing: str, grid: list[float]) -> dict[float, float | None]:
    """Validation PSNR at the last step of each lr's run (``None``: not run yet; a failed run scores -inf)."""
    out: dict[float, float | None] = {}
    for lr in grid:
        record = sf.load_result(f"{lr_run_name(sharing, lr)}-s0")
        if record is None:
            out[lr] = None
        elif record["status"] != "finished" or not record["curve"]:
            out[lr] = float("-inf")
        else:
            out[lr] = record["curve"][-1]["psnr"]
    return out


def lr_pick(sharing: str) -> float | None:
    """The arm's pick under the pre-registered rule, once its (possibly extended) grid is complete."""
    grid = lr_grid(sharing)
    scores = lr_scores(sharing, grid)
    if any(s is None for s in scores.values()):
        return None
    return max(grid, key=lambda lr: scores[lr])


def plan_lrcheck() -> list[sf.Planned]:
    out = []
    for sharing in SHARING:
        for lr in lr_grid(sharing):
            name = lr_run_name(sharing, lr)
            arm = sf._train_arm(name, MODEL, overrides(sharing), LR_STEPS, [f"lr={lr:.2e}", *RECIPE])
            out.append(sf.Planned(arm, {"phase": "lrcheck", "arm": sharing, "lr": lr, "model": MODEL,
                                        "model_overrides": overrides(sharing), "steps": LR_STEPS,
                                        "recipe": [f"lr={lr:.2e}", *RECIPE],
                                        "preregistration_sha256": preregistration_hash()}))
    return out


# -- the seeded runs -----------------------------------------------------------------------------------
def dcae_recipe(fair_docs: Path) -> tuple[str, list[str]] | None:
    """``dcae-tiny``'s pick in the fair study's search (result files under ``fair_docs``) including the review's
    correction arm (``None`` while that arm has not run)."""
    saved = sf.DOCS, sf.RESULTS
    sf.DOCS, sf.RESULTS = fair_docs, fair_docs / "runs"
    try:
        pick = sf.pick_recipe("dcae", corrected=True)
    finally:
        sf.DOCS, sf.RESULTS = saved
    if pick is None:
        return None
    arm = next(a for a in sf.all_search_arms("dcae") if a.name == pick["arm"])
    return pick["arm"], arm.overrides


def plan_main(dcae: tuple[str, list[str]] | None) -> list[sf.Planned]:
    """Every seeded run whose recipe is known, ordered by seed (each budget's first seeds finish first);
    ``dcae``: ``dcae-tiny``'s (pick, overrides), ``None`` while unknown."""
    out = []
    prereg = preregistration_hash()
    for steps, seeds, arms in ((SHORT, SHORT_SEEDS, SHARING), (LONG, LONG_SEEDS, LONG_ARMS)):
        for seed in seeds:
            for sharing in arms:
                lr = lr_pick(sharing)
                if lr is None:
                    continue
                recipe = [f"lr={lr:.2e}", *RECIPE]
                train = sf._train_arm(f"main-{sharing}-{steps}", MODEL, overrides(sharing), steps, recipe, seed,
                                      EVALS[steps])
                out.append(sf.Planned(train, {"phase": "main", "arm": sharing, "lr": lr, "model": MODEL,
                                              "model_overrides": overrides(sharing), "steps": steps,
                                              "recipe": recipe, "preregistration_sha256": prereg}))
    if dcae is not None:
        pick, recipe = dcae
        for seed in LONG_SEEDS:
            train = sf._train_arm(f"main-dcae-{LONG}", "dcae-tiny", "{}", LONG, recipe, seed, EVALS[LONG])
            out.append(sf.Planned(train, {"phase": "main", "arm": "dcae", "recipe_arm": pick, "model": "dcae-tiny",
                                          "model_overrides": "{}", "steps": LONG, "recipe": recipe,
                                          "preregistration_sha256": prereg}))
    out.sort(key=lambda p: (p.record["steps"], p.arm.seed))
    return out


def check_preregistration(plan_file: Path) -> dict[str, Any]:
    """The first main run records the pre-registration's sha256 and the training code's commit in ``plan.json``;
    later sittings refuse a changed pre-registration and changed training code (``sf.check_main_code``)."""
    plan = sf.check_main_code(plan_file)
    digest = preregistration_hash()
    if "preregistration_sha256" not in plan:
        plan["preregistration_sha256"] = digest
        plan_file.write_text(json.dumps(plan, indent=1) + "\n")
    elif plan["preregistration_sha256"] != digest:
        raise SystemExit(f"{PREREGISTRATION} differs from the pre-registration the first main run saw "
                         f"(sha256 {plan['preregistration_sha256'][:12]}, now {digest[:12]}); a pre-registration "
                         f"cannot change once main runs exist: restore it (git log -- {PREREGISTRATION.name})")
    return plan


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", nargs="+", default=["lrcheck", "main"], choices=["lrcheck", "main"])
    parser.add_argument("--runs", default="runs/study-sharing")
    parser.add_argument("--shared", default=None)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--docs", default=str(DOCS), help="where result files go (default: docs/study_sharing)")
    parser.add_argument("--fair-docs", default="docs/study_fair",
                        help="the fair study's result files (dcae-tiny's pick; default: docs/study_fair)")
    parser.add_argument("--scale", type=float, default=1.0, help="scale every step count (smoke runs only)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and what it waits for; train nothing")
    args = parser.parse_args()
    global LR_STEPS, SHORT, LONG, EVALS
    if args.scale != 1.0:
        LR_STEPS, SHORT, LONG = (max(4, round(args.scale * s)) for s in (LR_STEPS, SHORT, LONG))
        EVALS = {SHORT: 2, LONG: 2}
    # the fair study's machinery reads and writes result files under these two globals: this study's own
    fair_docs, docs = Path(args.fair_docs), Path(args.docs)
    sf.DOCS, sf.RESULTS = docs, docs / "runs"
    dcae = dcae_recipe(fair_docs)
    if args.dry_run:
        planned = plan_lrcheck() + (plan_main(dcae) if "main" in args.phase else [])
        for p in planned:
            state = "done" if sf.load_result(p.arm.name) else "to run"
            print(f"{p.arm.name:28s} {p.record['steps']:5d} steps  {state}")
        print("dcae pick:", dcae or "waits for the fair study's lr5e-4+mse arm")
        print("lr picks:", {s: lr_pick(s) for s in SHARING})
        return 0
    runs = Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    data = release_data(args.shared, runs / "data", "the sharing study")
    timings = Timings(runs / "timings.json")
    if "lrcheck" in args.phase:
        # an edge pick adds a run to the grid: plan again until every arm's grid is complete
        while True:
            todo = [p for p in plan_lrcheck() if sf.load_result(p.arm.name) is None]
            if not todo:
                break
            sf.run_planned(todo, data, runs, args.jobs, timings)
        print("lr picks:", {s: lr_pick(s) for s in SHARING}, flush=True)
    if "main" in args.phase:
        if dcae is None:
            print("dcae-tiny at 4,500 steps waits for the fair study's lr5e-4+mse arm "
                  "(python benchmarks/study_fair.py --phase search)", flush=True)
        docs.mkdir(parents=True, exist_ok=True)
        check_preregistration(docs / "plan.json")
        sf.run_planned(plan_main(dcae), data, runs, args.jobs, timings)
    print(f"done {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
