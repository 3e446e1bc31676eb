"""A fair fight: LoopVAE against references on equal terms -> ``docs/study_fair.md`` (+ ``docs/study_fair/``).

The question: how much of a tokenizer's computation can share parameters, and what does it cost? The study is
a 2 x 2: recurrence (LoopVAE vs a plain reference) x shortcuts (without: ``loopvae-cnn-tiny`` vs a reshaped
diffusers ``AutoencoderKL``; with: ``loopvae-cnn-tiny`` with its parameter-free shortcuts vs diffusers'
``AutoencoderDC``, whose space-to-channel shortcuts are the library's own). Every arm gets the same tuning effort
before the seeded runs:

1. ``shapes``: the AutoencoderKL reference's shape sweep (:data:`SHAPES`, ~1.0M parameters each, >= 4 channels
   per GroupNorm group, no mid-block attention; the best shape again with attention, which measures the
   train-64^2 / evaluate-256^2 mismatch of a global-attention mid-block), at the search's base recipe.
2. ``search``: one recipe search per family (:data:`FAMILIES`), the same :func:`search_arms` (9 arms: learning
   rate up to 4e-3, L1 + MSE, batch x crop, and one family-specific knob) at the same CPU budget per arm (the
   budget of LoopVAE's earlier search: 500 steps of ``loopvae-cnn-tiny`` with shortcuts, ~5 CPU-minutes; the
   other families' step counts follow from their measured cost per step, ``docs/study_fair/probe.json``),
   validation PSNR at 256^2 on 40 images disjoint from training and from the reported sets. LoopVAE-with-
   shortcuts' arms that its earlier search already ran (``docs/study_loopvae/recipe_search.json``) are reused.
3. ``main``: the four arms, each at its own best recipe, 3 seeds each, at two budgets (equal images seen, and
   equal CPU-seconds), evaluated per image on the 40 held-out ImageNet images and kodim21-24; the verdicts are
   computed by ``loopvae compare`` (seed-level, Holm-corrected over the pre-registered primary family).

Resumable on a fresh machine: every finished run writes ``docs/study_fair/runs/<run>.json`` (curve, CPU-seconds,
code version, and for main runs every per-image number), which is committed; a rerun trains only the runs whose
file is missing.

Usage: ``python benchmarks/study_fair.py --phase shapes search`` (``make study-fair`` runs every phase and
renders the page; ``--render-only`` re-renders it from the committed files).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from study_loopvae import Arm, Timings, _finished, train_arms, train_throughput  # noqa: E402
from study_vae_data import release_data  # noqa: E402

PRESET = "release-tiny"
DOCS = Path("docs/study_fair")
RESULTS = DOCS / "runs"
# The search's base recipe (as in the earlier LoopVAE search): lr 1e-3, L1 only, warm-up 50, cosine.
BASE_RECIPE = ["lr=1.0e-3", "mse_weight=0.0", "warmup_steps=50"]
BASE_PIXELS = 8 * 64 * 64  # per step: 8 crops of 64^2
LOOPVAE_BASE_STEPS = 500  # the earlier search's arms: ~5 CPU-minutes of loopvae-cnn-tiny with shortcuts
EARLIER_SEARCH = Path("docs/study_loopvae/recipe_search.json")


@dataclass(frozen=True)
class Family:
    """One arm of the 2 x 2: its model (``None``: the shape sweep's winner) and ``model_overrides``."""

    name: str
    label: str
    model: str | None
    overrides: str = "{}"
    recurrent: bool = True
    shortcuts: bool = False


FAMILIES = {
    "loopvae": Family("loopvae", "LoopVAE (no shortcuts)", "loopvae-cnn-tiny"),
    "loopvae-sc": Family("loopvae-sc", "LoopVAE with shortcuts", "loopvae-cnn-tiny", "{shortcuts: true}",
                         shortcuts=True),
    "klvae": Family("klvae", "AutoencoderKL reference", None, recurrent=False),
    "dcae": Family("dcae", "AutoencoderDC reference", "dcae-tiny", recurrent=False, shortcuts=True),
}
# The AutoencoderKL shape sweep: (label, model, model_overrides).
SHAPES = [
    ("w32", "klvae-tiny-w32", "{}"),
    ("w24", "klvae-tiny-w24", "{}"),
    ("d2", "klvae-tiny-d2", "{}"),
    ("w32-attn", "klvae-tiny-w32", "{mid_block_add_attention: true}"),
]

# The registered name of a swept (model, overrides) pair (bundles are named by it).
REGISTERED = {("klvae-tiny-w32", "{mid_block_add_attention: true}"): "klvae-tiny-w32-attn",
              ("loopvae-cnn-tiny", "{shortcuts: true}"): "loopvae-cnn-tiny-sc"}


def registered_name(model: str, overrides: str) -> str:
    return REGISTERED.get((model, overrides), model)


@dataclass
class SearchArm:
    """One recipe arm: ``name``, what it changes, its ``--set`` overrides and pixels per step relative to base."""

    name: str
    change: str
    overrides: list[str] = field(default_factory=list)
    pixel_factor: float = 1.0


def search_arms(family: Family) -> list[SearchArm]:
    """The 9 arms every family's search runs. The ninth is family-specific: LoopVAE's separate learning rate for
    its zero-initialised modulation path has no analogue in the references (they have no such path), so theirs
    tests a knob they inherit from LoopVAE's paper recipe instead: the N(0, 0.05^2) latent training noise."""
    arms = [
        SearchArm("base", "base recipe (lr 1e-3, 8 x 64², L1)"),
        SearchArm("lr2e-3", "lr 2e-3", ["lr=2.0e-3"]),
        SearchArm("lr4e-3", "lr 4e-3", ["lr=4.0e-3"]),
        SearchArm("l1+mse", "L1 + 10 MSE", ["mse_weight=10.0"]),
        SearchArm("lr2e-3+mse", "lr 2e-3 and L1 + 10 MSE", ["lr=2.0e-3", "mse_weight=10.0"]),
        SearchArm("lr4e-3+mse", "lr 4e-3 and L1 + 10 MSE", ["lr=4.0e-3", "mse_weight=10.0"]),
        SearchArm("b32-c32", "32 crops of 32² (same pixels per step; images resized 6-8x the crop)",
                  ["batch_size=32", "resolution=32", "scale_jitter=[6.0,8.0]"]),
        SearchArm("b4-c96", "4 crops of 96² (1.1x the pixels per step; images resized 2-2.67x the crop)",
                  ["batch_size=4", "resolution=96", "scale_jitter=[2.0,2.667]"], BASE_PIXELS / (4 * 96 * 96)),
    ]
    if family.recurrent:
        arms.append(SearchArm("mod1", "modulation_lr_scale 1 (one learning rate)", ["modulation_lr_scale=1.0"]))
    else:
        arms.append(SearchArm("noise0", "no latent training noise (latent_noise_std 0)", ["latent_noise_std=0.0"]))
    return arms


# The review's correction (docs/study_fair/corrections.md, written before these runs): the families that picked the
# lowest lr tried get one arm below it. It never changes the pre-registered pick (:func:`pick_recipe` reads the 9
# original arms); ``pick_recipe(key, corrected=True)`` reads all ten, and a family whose pick moves repeats its
# equal-images runs.
CORRECTION_ARM = SearchArm("lr5e-4+mse", "lr 5e-4 and L1 + 10 MSE (review correction)",
                           ["lr=5.0e-4", "mse_weight=10.0"])
CORRECTED_FAMILIES = ("loopvae", "klvae", "dcae")


def all_search_arms(key: str) -> list[SearchArm]:
    """The original 9 arms plus the correction arm for the families that get it."""
    return search_arms(FAMILIES[key]) + ([CORRECTION_ARM] if key in CORRECTED_FAMILIES else [])


# LoopVAE-with-shortcuts arms its earlier search ran with exactly these overrides (reused, not rerun).
REUSED = {"base", "lr2e-3", "l1+mse", "lr2e-3+mse", "b32-c32", "b4-c96", "mod1"}


# -- bookkeeping -------------------------------------------------------------------------------------
def code_version() -> dict[str, Any]:
    """The commit the runs train on, and whether the working tree differed from it."""
    # the checkout this script (and, through PYTHONPATH, the trainer) runs from: a study may run from a fixed
    # worktree while the main checkout moves on
    here = str(Path(__file__).resolve().parent)

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", here, *args], capture_output=True, text=True, check=False).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def result_path(name: str) -> Path:
    return RESULTS / f"{name}.json"


def load_result(name: str) -> dict[str, Any] | None:
    path = result_path(name)
    return json.loads(path.read_text()) if path.is_file() else None


def write_result(name: str, record: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    tmp = result_path(name).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(result_path(name))


# -- the cost probe ------------------------------------------------------------------------------------
def probe(models: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """Training images/s of each ``label: (model, overrides)`` side by side in this process (one thread,
    alternating rounds, median), stored once in ``probe.json`` so a later sitting uses the same step counts."""
    path = DOCS / "probe.json"
    known = json.loads(path.read_text()) if path.is_file() else {"images_per_second": {}}
    missing = {k: v for k, v in models.items() if k not in known["images_per_second"]}
    if missing:
        import torch
        import yaml

        torch.set_num_threads(1)
        # always measured beside the reference point, so every ratio comes from one run
        wanted = {"loopvae-sc": ("loopvae-cnn-tiny", "{shortcuts: true}"), **missing}
        arch = {k: (m, yaml.safe_load(o) or {}, False) for k, (m, o) in wanted.items()}
        measured = train_throughput(arch, 8, 64, rounds=5, steps=3)
        scale = (known["images_per_second"].get("loopvae-sc") or measured["loopvae-sc"]) / measured["loopvae-sc"]
        for k in missing:
            known["images_per_second"][k] = measured[k] * scale
        known["images_per_second"].setdefault("loopvae-sc", measured["loopvae-sc"])
        known.update(batch=8, crop=64, threads=1, date=time.strftime("%Y-%m-%d"), code=code_version(),
                     how="study_loopvae.train_throughput: one training step (encode, noisy sample, decode, L1 + KL, "
                         "backward, AdamW) per call, alternating rounds in one process, median of 5 rounds x 3 steps")
        DOCS.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(known, indent=1) + "\n")
    return known


STEP_SCALE = 1.0  # --scale: smoke runs only (the study's figures use 1)


def base_steps(label: str, costs: dict[str, Any]) -> int:
    """Steps of a base-recipe arm at the search's CPU budget: 500 x (this model's images/s / LoopVAE-sc's)."""
    ips = costs["images_per_second"]
    return max(4, round(STEP_SCALE * LOOPVAE_BASE_STEPS * ips[label] / ips["loopvae-sc"]))


# -- planning ------------------------------------------------------------------------------------------
@dataclass
class Planned:
    """A run to train: its training ``arm`` and what its result file records about it."""

    arm: Arm
    record: dict[str, Any]


def _train_arm(name: str, model: str, overrides: str, steps: int, extra: list[str], seed: int = 0,
               evals: int = 3) -> Arm:
    every = max(1, steps // evals)
    return Arm(f"{name}-s{seed}", name, [
        f"model={model}", f"model_overrides={overrides}", f"seed={seed}", f"max_steps={steps}",
        f"eval_every={every}", f"checkpoint_every={every}", f"image_every={steps}", "log_every=25",
        *BASE_RECIPE, *extra])


def plan_shapes(costs: dict[str, Any]) -> list[Planned]:
    out = []
    for label, model, overrides in SHAPES:
        steps = base_steps(f"shape-{label}", costs)
        arm = _train_arm(f"shape-{label}", model, overrides, steps, [])
        out.append(Planned(arm, {"phase": "shapes", "family": "klvae", "arm": label, "model": model,
                                 "model_overrides": overrides, "steps": steps}))
    return out


def shape_winner() -> tuple[str, str, str] | None:
    """The sweep's best shape at matched CPU time, once every shape has a result (else ``None``)."""
    rows = {label: load_result(f"shape-{label}-s0") for label, _, _ in SHAPES}
    if any(r is None for r in rows.values()):
        return None
    scores = matched_scores({k: r for k, r in rows.items()})
    best = max(scores, key=lambda k: -1e9 if scores[k] is None else scores[k])
    return next(s for s in SHAPES if s[0] == best)


def family_model(family: Family) -> tuple[str, str] | None:
    if family.model is not None:
        return family.model, family.overrides
    winner = shape_winner()
    return None if winner is None else (winner[1], winner[2])


def plan_search(costs: dict[str, Any], families: list[str]) -> list[Planned]:
    out = []
    for key in families:
        family = FAMILIES[key]
        chosen = family_model(family)
        if chosen is None:
            print(f"search {key}: waits for the shape sweep", flush=True)
            continue
        model, overrides = chosen
        cost_label = _cost_label(key, family, chosen)
        steps0 = base_steps(cost_label, costs)
        for sa in all_search_arms(key):
            if key == "loopvae-sc" and sa.name in REUSED:
                continue
            steps = max(4, round(steps0 * sa.pixel_factor))
            arm = _train_arm(f"search-{key}-{sa.name}", model, overrides, steps, sa.overrides)
            out.append(Planned(arm, {"phase": "search", "family": key, "arm": sa.name, "change": sa.change,
                                     "model": model, "model_overrides": overrides, "steps": steps,
                                     "recipe": sa.overrides}))
    return out


# -- the main phase: the 2 x 2 at each arm's own best recipe, 3 seeds, two budgets -----------------------
MAIN_STEPS = 1500  # equal images seen: 1,500 steps x 8 crops of 64^2 (scaled by a recipe's pixels per step)
MAIN_SEEDS = (0, 1, 2)
# Pre-registered: when a primary verdict is inconclusive at 3 seeds, both of its arms get seeds 3 and 4.
EXTRA_SEEDS = (3, 4)
MAIN_EVALS = 6  # validation points per main run (the learning curves)
# The slowest family at equal images defines the equal-CPU budget: every family then trains for the CPU-seconds
# that family's equal-images run takes (estimated from the probe; the page reports the measured seconds).
BUDGET_FAMILY = "loopvae-sc"


def pick_recipe(key: str, corrected: bool = False) -> dict[str, Any] | None:
    """The family's best search arm by validation PSNR at matched CPU time, once all its arms have a result:
    ``{arm, score, runner_up, gap, matched_seconds}`` (``None`` while arms are missing). ``corrected``: over the
    original arms plus the review's correction arm (:data:`CORRECTION_ARM`); otherwise the pre-registered 9."""
    arms = all_search_arms(key) if corrected else search_arms(FAMILIES[key])
    rows = {k: r for k, r in search_rows(key).items() if k in {a.name for a in arms}}
    if len(rows) < len(arms):
        return None
    scores = matched_scores(rows)
    ranked = sorted((k for k in scores if scores[k] is not None), key=lambda k: -scores[k])
    done = [r for r in rows.values() if r.get("status") == "finished" and r["curve"]]
    return {"arm": ranked[0], "score": scores[ranked[0]], "runner_up": ranked[1] if len(ranked) > 1 else None,
            "gap": scores[ranked[0]] - scores[ranked[1]] if len(ranked) > 1 else None,
            "matched_seconds": min(r["curve"][-1]["train_seconds"] for r in done)}


def main_runs(costs: dict[str, Any], seeds: tuple[int, ...] = MAIN_SEEDS) -> list[Planned]:
    """Every main run whose family's recipe is known: ``main-<family>-img-s<k>`` (equal images) and, for the
    families faster than :data:`BUDGET_FAMILY`, ``main-<family>-cpu-s<k>`` (equal CPU-seconds)."""
    ips = costs["images_per_second"]
    budget_seconds = MAIN_STEPS * 8 / ips[BUDGET_FAMILY]
    out = []
    for key, family in FAMILIES.items():
        pick, chosen = pick_recipe(key), family_model(family)
        if pick is None or chosen is None:
            continue
        model, overrides = chosen
        arm = next(a for a in search_arms(family) if a.name == pick["arm"])
        cost_label = _cost_label(key, family, chosen)
        budgets = {"img": max(4, round(STEP_SCALE * MAIN_STEPS * arm.pixel_factor))}
        if key != BUDGET_FAMILY:
            budgets["cpu"] = max(4, round(STEP_SCALE * budget_seconds * ips[cost_label] / 8 * arm.pixel_factor))
        for budget, steps in budgets.items():
            for seed in seeds:
                name = f"main-{key}-{budget}"
                train = _train_arm(name, model, overrides, steps, arm.overrides, seed, MAIN_EVALS)
                out.append(Planned(train, {
                    "phase": "main", "family": key, "budget": ["images", "cpu"] if key == BUDGET_FAMILY and
                    budget == "img" else ["images"] if budget == "img" else ["cpu"], "recipe_arm": pick["arm"],
                    "recipe": arm.overrides, "model": model, "model_overrides": overrides, "steps": steps,
                    "budget_seconds_planned": budget_seconds if budget == "cpu" or key == BUDGET_FAMILY else None}))
    return out


def _cost_label(key: str, family: Family, chosen: tuple[str, str]) -> str:
    """The probe's label of a family's model: the family key, or ``shape-<label>`` for the swept reference."""
    return key if family.model is not None else f"shape-{next(s[0] for s in SHAPES if s[1:] == chosen)}"


def main_cost_labels() -> dict[str, tuple[str, str]]:
    """The main phase's models by cost label (as :func:`main_runs` looks them up): ``label: (model, overrides)``."""
    chosen = {key: (family, family_model(family)) for key, family in FAMILIES.items()}
    return {_cost_label(key, family, c): c for key, (family, c) in chosen.items() if c is not None}


def main_probe() -> dict[str, Any]:
    """Training images/s of the main phase's models, measured side by side at the main phase's commit (one
    thread, alternating rounds, median): the equal-CPU step counts come from the code that actually trains."""
    import torch
    import yaml

    torch.set_num_threads(1)
    arch = {k: (m, yaml.safe_load(o) or {}, False) for k, (m, o) in main_cost_labels().items()}
    return {"images_per_second": train_throughput(arch, 8, 64, rounds=5, steps=3), "batch": 8, "crop": 64,
            "threads": 1, "date": time.strftime("%Y-%m-%d %H:%M"), "code": code_version(),
            "how": "study_loopvae.train_throughput at the main commit, the main models side by side in one process, "
                   "median of 5 rounds x 3 steps (nothing else running)"}


def select_main(planned: list[Planned], families: list[str], budgets: list[str]) -> list[Planned]:
    """The main runs of ``families`` that serve one of ``budgets`` (``img`` / ``cpu``): the slowest family's
    equal-images runs serve the CPU budget too, so they stay in a ``cpu`` selection."""
    wanted = {{"img": "images"}.get(b, b) for b in budgets}
    return [p for p in planned if p.record["family"] in families and wanted & set(p.record["budget"])]


def check_main_code(plan_file: Path) -> dict[str, Any]:
    """Every main run trains on one code version: the first main run records its commit in ``plan.json``, with a
    cost probe measured on that commit (:func:`main_probe`); later sittings must run from a checkout whose training
    code (packages/, pipelines/) equals it."""
    plan = json.loads(plan_file.read_text()) if plan_file.is_file() else {}
    here = code_version()
    if here["dirty"]:
        raise SystemExit("the main phase needs a clean checkout (every run on one committed code version); commit "
                         "or run from a worktree of the study's commit")
    if "main_commit" not in plan:
        plan.update(main_commit=here["commit"], date=time.strftime("%Y-%m-%d %H:%M"), probe=main_probe())
        plan_file.write_text(json.dumps(plan, indent=1) + "\n")
        return plan
    changed = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "diff", "--quiet",
                              plan["main_commit"], here["commit"], "--", "packages", "pipelines"], check=False)
    if changed.returncode != 0:
        raise SystemExit(f"the training code differs from the main phase's commit {plan['main_commit'][:10]} "
                         f"(git diff {plan['main_commit'][:10]} -- packages pipelines); run the main phase from a "
                         f"worktree of it: git worktree add /tmp/study {plan['main_commit'][:10]}")
    return plan


def evaluate_main_run(run: Path, data: Any) -> dict[str, Any]:
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


# -- reading -----------------------------------------------------------------------------------------
def psnr_at(points: list[dict[str, Any]], seconds: float) -> float | None:
    """Validation PSNR linearly interpolated at ``seconds`` of training CPU time (``None`` outside the curve)."""
    for a, b in zip(points, points[1:], strict=False):
        if a["train_seconds"] <= seconds <= b["train_seconds"]:
            t = (seconds - a["train_seconds"]) / max(b["train_seconds"] - a["train_seconds"], 1e-9)
            return a["psnr"] + t * (b["psnr"] - a["psnr"])
    if points and abs(points[-1]["train_seconds"] - seconds) < 1e-6:
        return points[-1]["psnr"]
    return None


def matched_scores(rows: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """Each row's validation PSNR at the CPU time every finished row reached (diverged rows: ``None``)."""
    done = {k: r for k, r in rows.items() if r.get("status") == "finished" and r["curve"]}
    if not done:
        return {k: None for k in rows}
    matched = min(r["curve"][-1]["train_seconds"] for r in done.values())
    return {k: (psnr_at(r["curve"], matched) if k in done else None) for k, r in rows.items()}


def earlier_loopvae_sc() -> dict[str, dict[str, Any]]:
    """LoopVAE-with-shortcuts' arms from its earlier search, as search rows (reused)."""
    data = json.loads(EARLIER_SEARCH.read_text())
    rows = {}
    for name, arm in data["arms"].items():
        if name in REUSED:
            rows[name] = {"phase": "search", "family": "loopvae-sc", "arm": name, "change": arm["change"],
                          "status": "finished", "curve": arm["curve"], "steps": arm["steps"],
                          "source": str(EARLIER_SEARCH), "code": {"commit": "earlier search (2026-12-04)"}}
    return rows


def search_rows(key: str) -> dict[str, dict[str, Any]]:
    rows = earlier_loopvae_sc() if key == "loopvae-sc" else {}
    for sa in all_search_arms(key):
        record = load_result(f"search-{key}-{sa.name}-s0")
        if record is not None:
            rows[sa.name] = record
    return rows


# -- running -----------------------------------------------------------------------------------------
def run_planned(planned: list[Planned], data: Any, runs: Path, jobs: int, timings: Timings,
                collect_only: bool = False) -> None:
    """Train what has no result file yet; each finished (or failed) run writes its result file at once. Runs that
    finished in an earlier, interrupted invocation get their result file first (``collect_only``: nothing else)."""
    todo = [p for p in planned if load_result(p.arm.name) is None]
    by_name = {p.arm.name: p for p in todo}

    def done(arm: Arm, code: int, collected: bool = False) -> None:
        p = by_name[arm.name]
        run = runs / arm.name
        curve_file = run / "validation.json"
        summary = json.loads((run / "train_summary.json").read_text()) if (run / "train_summary.json").is_file() \
            else {}
        log_file = runs / f"{arm.name}.log"
        record = dict(p.record, name=arm.name, seed=arm.seed, overrides=arm.overrides,
                      status="finished" if code == 0 else "failed", exit_code=code,
                      curve=json.loads(curve_file.read_text()) if curve_file.is_file() else [],
                      train_seconds=summary.get("train_seconds"), wall_seconds=timings.data["train"].get(arm.name),
                      date=time.strftime("%Y-%m-%d %H:%M"), threads=1, jobs=jobs,
                      # a run finished by an earlier, interrupted driver: the code it trained on is not known here
                      code=({"commit": "not recorded (finished under an interrupted driver)",
                             "collected_by": code_version()} if collected else code_version()))
        if code != 0 and log_file.is_file():
            record["log_tail"] = log_file.read_text().splitlines()[-12:]
        if code == 0 and p.record["phase"] == "main":
            record["evaluation"] = evaluate_main_run(run, data)
        write_result(arm.name, record)
        print(f"  result {result_path(arm.name)} ({record['status']})", flush=True)

    for p in todo:  # finished in an earlier invocation that stopped before writing the result
        if load_result(p.arm.name) is None and _finished(runs / p.arm.name):
            done(p.arm, 0, collected=True)
    todo = [p for p in todo if load_result(p.arm.name) is None]
    if todo and not collect_only:
        train_arms([p.arm for p in todo], data, runs, jobs, 1, timings, preset=PRESET,
                   extra_args=("--val-data", data.validation), on_done=done)


def main() -> int:
    global DOCS, RESULTS, STEP_SCALE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", nargs="+", default=["shapes", "search"], choices=["shapes", "search", "main"])
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="main phase: these seeds (default 0 1 2; 3 4 are the pre-registered extra seeds)")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--budgets", nargs="+", default=["img", "cpu"], choices=["img", "cpu"],
                        help="main phase: only these budgets (the extra seeds of one inconclusive comparison)")
    parser.add_argument("--runs", default="runs/study-fair")
    parser.add_argument("--shared", default=None)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--docs", default="docs/study_fair", help="where result files go (default: docs/study_fair)")
    parser.add_argument("--scale", type=float, default=1.0, help="scale every step count (smoke runs only)")
    parser.add_argument("--collect-only", action="store_true",
                        help="write the result files of runs that finished in an interrupted invocation; train nothing")
    args = parser.parse_args()
    DOCS, RESULTS, STEP_SCALE = Path(args.docs), Path(args.docs) / "runs", args.scale
    runs = Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    data = release_data(args.shared, runs / "data", "the fair-comparison study")
    timings = Timings(runs / "timings.json")
    models = {f"shape-{label}": (m, o) for label, m, o in SHAPES}
    models.update({k: (f.model, f.overrides) for k, f in FAMILIES.items() if f.model is not None})
    costs = probe(models)
    print("images/s (1 thread):", json.dumps(costs["images_per_second"]), flush=True)
    if "shapes" in args.phase:
        run_planned(plan_shapes(costs), data, runs, args.jobs, timings, args.collect_only)
        print("shape winner:", shape_winner(), flush=True)
    if "search" in args.phase:
        run_planned(plan_search(costs, args.families), data, runs, args.jobs, timings, args.collect_only)
    if "main" in args.phase:
        plan_file = DOCS / "plan.json"
        if not args.collect_only:
            plan = check_main_code(plan_file)
        else:
            plan = json.loads(plan_file.read_text()) if plan_file.is_file() else {}
        # the equal-CPU budgets from the probe on the main commit (the search's probe predates it)
        costs = plan.get("probe", costs)
        print("main phase images/s (1 thread):", json.dumps(costs["images_per_second"]), flush=True)
        planned = select_main(main_runs(costs, tuple(args.seeds) if args.seeds else MAIN_SEEDS), args.families,
                              args.budgets)
        # longest first: the equal-CPU runs, then by seed so that every arm's first seeds finish early
        planned.sort(key=lambda p: (p.arm.seed, -p.record["steps"] / costs["images_per_second"].get(
            p.record["family"], 30.0)))
        run_planned(planned, data, runs, args.jobs, timings, args.collect_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
