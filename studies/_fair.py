"""The fair study's arms, recipe searches, picks and main-run plan, read from its result files (used by ``fair.py``,
``release_vae.py``'s references phase and the sharing study). Groups are ``family@img`` (equal images) and
``family@cpu`` (equal CPU-seconds); a primary inconclusive at seeds 0-2 extends its two groups to seeds 3 and 4, once
(pre-registered).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from looprun.study import PlannedRun, ResultStore

Records = dict[str, dict[str, Any]]  # run id -> its result record
PRESET = "release-tiny"
BASE_RECIPE = ["lr=1.0e-3", "mse_weight=0.0", "warmup_steps=50"]  # the searches' base (warm-up 50, cosine)
LOOPVAE_BASE_STEPS = 500  # a search arm's CPU budget: 500 steps of loopvae-cnn-tiny with shortcuts (~5 CPU-min)
MAIN_STEPS, MAIN_EVALS = 1500, 6  # equal images: 1,500 steps x 8 crops of 64^2; validation points per main run
MAIN_SEEDS, EXTRA_SEEDS = (0, 1, 2), (3, 4)
BUDGET_FAMILY = "loopvae-sc"  # the slowest family: its equal-images runs set (and serve) the equal-CPU budget
TAGS = {"img": "images", "cpu": "cpu"}  # a group's budget tag -> the budget name a main record lists


class Family(NamedTuple):
    label: str
    model: str | None  # None: the AutoencoderKL shape sweep's winner
    overrides: str = "{}"


FAMILIES = {"loopvae": Family("LoopVAE (no shortcuts)", "loopvae-cnn-tiny"),
            "loopvae-sc": Family("LoopVAE with shortcuts", "loopvae-cnn-tiny", "{shortcuts: true}"),
            "klvae": Family("AutoencoderKL reference", None), "dcae": Family("AutoencoderDC reference", "dcae-tiny")}
SHAPES = [("w32", "klvae-tiny-w32", "{}"), ("w24", "klvae-tiny-w24", "{}"), ("d2", "klvae-tiny-d2", "{}"),
          ("w32-attn", "klvae-tiny-w32", "{mid_block_add_attention: true}")]  # (label, model, model_overrides)
REGISTERED = {("klvae-tiny-w32", "{mid_block_add_attention: true}"): "klvae-tiny-w32-attn",
              ("loopvae-cnn-tiny", "{shortcuts: true}"): "loopvae-cnn-tiny-sc"}  # bundles are named by these
PRIMARY = [("P1", "recurrence without shortcuts, equal images", "loopvae@img", "klvae@img"),
           ("P2", "recurrence with shortcuts, equal images", "loopvae-sc@img", "dcae@img"),
           ("P3", "recurrence without shortcuts, equal CPU-seconds", "loopvae@cpu", "klvae@cpu"),
           ("P4", "recurrence with shortcuts, equal CPU-seconds", "loopvae-sc@cpu", "dcae@cpu")]
SECONDARY = [("S1", "shortcuts within LoopVAE, equal images", "loopvae-sc@img", "loopvae@img"),
             ("S2", "shortcuts within the references, equal images", "dcae@img", "klvae@img"),
             ("S3", "shortcuts within LoopVAE, equal CPU-seconds", "loopvae-sc@cpu", "loopvae@cpu"),
             ("S4", "shortcuts within the references, equal CPU-seconds", "dcae@cpu", "klvae@cpu")]


class SearchArm(NamedTuple):
    """A recipe arm: what it changes, its ``--set`` items and its pixels per step relative to 8 crops of 64^2."""
    name: str
    change: str
    overrides: tuple[str, ...] = ()
    pixel_factor: float = 1.0


SEARCH = [SearchArm("base", "base recipe (lr 1e-3, 8 x 64², L1)"), SearchArm("lr2e-3", "lr 2e-3", ("lr=2.0e-3",)),
          SearchArm("lr4e-3", "lr 4e-3", ("lr=4.0e-3",)), SearchArm("l1+mse", "L1 + 10 MSE", ("mse_weight=10.0",)),
          SearchArm("lr2e-3+mse", "lr 2e-3 and L1 + 10 MSE", ("lr=2.0e-3", "mse_weight=10.0")),
          SearchArm("lr4e-3+mse", "lr 4e-3 and L1 + 10 MSE", ("lr=4.0e-3", "mse_weight=10.0")),
          SearchArm("b32-c32", "32 crops of 32² (same pixels per step; images resized 6-8x the crop)",
                    ("batch_size=32", "resolution=32", "scale_jitter=[6.0,8.0]")),
          SearchArm("b4-c96", "4 crops of 96² (1.1x the pixels per step; images resized 2-2.67x the crop)",
                    ("batch_size=4", "resolution=96", "scale_jitter=[2.0,2.667]"), 8 * 64 * 64 / (4 * 96 * 96))]
# The ninth arm is family-specific: LoopVAE's separate lr for its zero-initialised modulation path has no analogue in
# the references, so theirs tests a knob they inherit from LoopVAE's recipe: the N(0, 0.05^2) latent training noise.
NINTH = {True: SearchArm("mod1", "modulation_lr_scale 1 (one learning rate)", ("modulation_lr_scale=1.0",)),
         False: SearchArm("noise0", "no latent training noise (latent_noise_std 0)", ("latent_noise_std=0.0",))}
# The review's correction (docs/study_fair/corrections.md, written before its runs): the families that picked the
# lowest lr get one arm below it; the pre-registered pick reads the 9 original arms, corrected=True all ten.
CORRECTION_ARM = SearchArm("lr5e-4+mse", "lr 5e-4 and L1 + 10 MSE (review correction)",
                           ("lr=5.0e-4", "mse_weight=10.0"))
CORRECTED_FAMILIES = ("loopvae", "klvae", "dcae")
REUSED = {"base", "lr2e-3", "l1+mse", "lr2e-3+mse", "b32-c32", "b4-c96", "mod1"}  # from loopvae-sc's earlier search


def registered_name(model: str, overrides: str) -> str:
    return REGISTERED.get((model, overrides), model)


def search_arms(family: str, corrected: bool = False) -> list[SearchArm]:
    """The 9 arms of a family's search (``corrected``: plus the correction arm where the family got it)."""
    extra = [CORRECTION_ARM] if corrected and family in CORRECTED_FAMILIES else []
    return [*SEARCH, NINTH[family.startswith("loopvae")], *extra]


def load_records(docs: Path) -> Records:
    return ResultStore(Path(), docs).all()  # docs: absolute, or relative to the working directory


def psnr_at(points: list[dict[str, Any]], seconds: float) -> float | None:
    """Validation PSNR (dB) linearly interpolated at ``seconds`` of training CPU time (``None`` off the curve)."""
    for a, b in zip(points, points[1:], strict=False):
        if a["train_seconds"] <= seconds <= b["train_seconds"]:
            t = (seconds - a["train_seconds"]) / max(b["train_seconds"] - a["train_seconds"], 1e-9)
            return a["psnr"] + t * (b["psnr"] - a["psnr"])
    return points[-1]["psnr"] if points and abs(points[-1]["train_seconds"] - seconds) < 1e-6 else None


def matched_scores(rows: Records) -> dict[str, float | None]:
    """Each run's validation PSNR at the CPU time every finished run reached (failed runs: ``None``)."""
    done = {k: r for k, r in rows.items() if r.get("status") == "finished" and r["curve"]}
    matched = min((r["curve"][-1]["train_seconds"] for r in done.values()), default=None)
    return {k: psnr_at(r["curve"], matched) if k in done else None for k, r in rows.items()}  # type: ignore[arg-type]


def earlier_search(docs: Path) -> Records:
    """The arms of LoopVAE-with-shortcuts' earlier recipe search by name: ``study_loopvae/recipe_search.json``, or
    the per-run files the LoopVAE study's ``migration.json`` moved its arms to."""
    loopvae = Path(docs).parent / "study_loopvae"
    if (loopvae / "recipe_search.json").is_file():
        return json.loads((loopvae / "recipe_search.json").read_text())["arms"]
    moved = json.loads((loopvae / "migration.json").read_text())["moves"]
    return {m["from"].split("#arms/")[1]: json.loads((Path(docs).parent.parent / m["to"]).read_text())
            for m in moved if m["from"].startswith("docs/study_loopvae/recipe_search.json#arms/")}


def search_rows(records: Records, family: str, docs: Path) -> Records:
    """A family's search records by arm (loopvae-sc's reused arms from its earlier search)."""
    rows = {name: {"phase": "search", "family": family, "arm": name, "change": arm["change"], "status": "finished",
                   "curve": arm["curve"], "steps": arm["steps"], "source": "docs/study_loopvae/recipe_search.json",
                   "code": {"commit": "earlier search (2026-12-04)"}}
            for name, arm in (earlier_search(docs) if family == "loopvae-sc" else {}).items() if name in REUSED}
    return rows | {a.name: records[f"search-{family}-{a.name}-s0"] for a in search_arms(family, corrected=True)
                   if f"search-{family}-{a.name}-s0" in records}


def shape_winner(records: Records) -> tuple[str, str, str] | None:
    """The sweep's best shape at matched CPU time, once every shape has a result."""
    rows = {label: records.get(f"shape-{label}-s0") for label, _, _ in SHAPES}
    if any(r is None for r in rows.values()):
        return None
    scores = matched_scores(rows)  # type: ignore[arg-type]
    return next(s for s in SHAPES if s[0] == max(scores, key=lambda k: -1e9 if scores[k] is None else scores[k]))


def family_model(family: str, records: Records) -> tuple[str, str] | None:
    """``(model, model_overrides)`` of a family (klvae: the sweep's winner, ``None`` before there is one)."""
    f, winner = FAMILIES[family], shape_winner(records)
    return (f.model, f.overrides) if f.model else None if winner is None else (winner[1], winner[2])


def cost_label(family: str, records: Records) -> str:
    """The probe's label of a family's model: the family, or ``shape-<label>`` for the swept reference."""
    winner = shape_winner(records)
    return family if FAMILIES[family].model or winner is None else f"shape-{winner[0]}"


def pick(records: Records, family: str, docs: Path, corrected: bool = False) -> dict[str, Any] | None:
    """The family's best search arm by validation PSNR at matched CPU time, once all its arms have a result:
    ``{arm, score, runner_up, gap, matched_seconds, overrides}``; ``corrected``: with the correction arm."""
    arms = {a.name: a for a in search_arms(family, corrected)}
    rows = {k: r for k, r in search_rows(records, family, docs).items() if k in arms}
    if len(rows) < len(arms):
        return None
    scores = matched_scores(rows)
    ranked = sorted((k for k in scores if scores[k] is not None), key=lambda k: -scores[k])  # type: ignore[operator]
    two = len(ranked) > 1
    return {"arm": ranked[0], "score": scores[ranked[0]], "runner_up": ranked[1] if two else None,
            "gap": scores[ranked[0]] - scores[ranked[1]] if two else None,  # type: ignore[operator]
            "matched_seconds": min(r["curve"][-1]["train_seconds"] for r in rows.values()
                                   if r.get("status") == "finished" and r["curve"]),
            "overrides": list(arms[ranked[0]].overrides)}


def pick_recipe(family: str, corrected: bool = False, docs: Path = Path("docs/study_fair")) -> dict[str, Any] | None:
    """:func:`pick` from the result files under ``docs`` (what a sibling study reads: dcae-tiny's recipe)."""
    return pick(load_records(docs), family, docs, corrected)


def costs(docs: Path, main: bool = False) -> dict[str, float]:
    """Training images/s per probe label (one thread, side by side): ``probe.json`` (the searches'), or with ``main``
    the probe ``plan.json`` recorded on the main commit where it has one (the equal-CPU budgets)."""
    plan = json.loads((Path(docs) / "plan.json").read_text()) if (Path(docs) / "plan.json").is_file() else {}
    probe = plan["probe"] if main and "probe" in plan else json.loads((Path(docs) / "probe.json").read_text())
    return probe["images_per_second"]


def base_steps(label: str, ips: dict[str, float]) -> int:
    """Steps of a base-recipe arm at the search's CPU budget: 500 x (this model's images/s / loopvae-sc's)."""
    if label not in ips:
        raise KeyError(f"probe.json has no images/s for {label}: measure it beside loopvae-sc "
                       "(_vae_runs.train_throughput, one thread) before planning its runs")
    return max(4, round(LOOPVAE_BASE_STEPS * ips[label] / ips["loopvae-sc"]))


def _run(run_id: str, family: str, tag: str, seed: int, model: tuple[str, str], **record: Any) -> PlannedRun:
    """A planned run; its settings (``phase`` from the id, family, model, steps, recipe ...) go into its record."""
    phase = {"shape": "shapes", "search": "search", "main": "main"}[run_id.split("-")[0]]
    return PlannedRun(run_id, phase, family, tag, seed, {"phase": phase, "family": family, "model": model[0],
                                                         "model_overrides": model[1], **record})


def plan_shapes(ips: dict[str, float]) -> list[PlannedRun]:
    """The AutoencoderKL shapes at the base recipe, each for the search's CPU budget."""
    return [_run(f"shape-{label}-s0", "klvae", "shapes", 0, (model, ovr), arm=label,
                 steps=base_steps(f"shape-{label}", ips), recipe=[], evals=3) for label, model, ovr in SHAPES]


def plan_search(records: Records, ips: dict[str, float]) -> list[PlannedRun]:
    """Every family's search arms (klvae's once the sweep has a winner; loopvae-sc only what it did not run)."""
    return [_run(f"search-{family}-{a.name}-s0", family, "search", 0, model, arm=a.name, change=a.change,
                 steps=max(4, round(base_steps(cost_label(family, records), ips) * a.pixel_factor)),
                 recipe=list(a.overrides), evals=3)
            for family in FAMILIES if (model := family_model(family, records)) is not None
            for a in search_arms(family, corrected=True) if family != "loopvae-sc" or a.name not in REUSED]


def main_runs(records: Records, ips: dict[str, float], docs: Path, seeds: tuple[int, ...] = MAIN_SEEDS
              ) -> list[PlannedRun]:
    """The main runs of the families whose pick is known: ``main-<family>-img-s<k>`` and, for the families faster
    than loopvae-sc, ``main-<family>-cpu-s<k>`` (the CPU-seconds its equal-images run takes, from the probe)."""
    budget_seconds, out = MAIN_STEPS * 8 / ips[BUDGET_FAMILY], []
    for family in FAMILIES:
        model, picked = family_model(family, records), pick(records, family, docs)
        if model is None or picked is None:
            continue
        arm = next(a for a in search_arms(family) if a.name == picked["arm"])
        steps = {"img": max(4, round(MAIN_STEPS * arm.pixel_factor))}
        if family != BUDGET_FAMILY:
            steps["cpu"] = max(4, round(budget_seconds * ips[cost_label(family, records)] / 8 * arm.pixel_factor))
        for tag, n in steps.items():
            serves = ["images", "cpu"] if family == BUDGET_FAMILY else [TAGS[tag]]
            out += [_run(f"main-{family}-{tag}-s{seed}", family, tag, seed, model, budget=serves,
                         recipe_arm=arm.name, recipe=list(arm.overrides), steps=n, evals=MAIN_EVALS,
                         budget_seconds_planned=budget_seconds if "cpu" in serves else None) for seed in seeds]
    return out


def main_arms(records: Records) -> dict[str, list[dict[str, Any]]]:
    """``family@img`` / ``family@cpu`` -> its finished main runs by seed (loopvae-sc's serve both budgets)."""
    arms: dict[str, list[dict[str, Any]]] = {}
    for r in records.values():
        if r.get("phase") == "main" and r.get("status") == "finished" and "evaluation" in r:
            for budget in r["budget"]:
                arms.setdefault(f"{r['family']}@{'img' if budget == 'images' else 'cpu'}", []).append(r)
    return {k: sorted(v, key=lambda r: r["seed"]) for k, v in arms.items()}


def family_summary(arms: dict[str, list[dict[str, Any]]], family: list[tuple[str, str, str, str]],
                   split: str = "imagenet") -> dict[str, Any] | None:
    """``loopvae compare``'s seed-level reading (:func:`loopvae.compare.summarise`: paired t by seed where the runs
    share their data order, Welch t otherwise; Holm over the family) of the comparisons whose groups have runs."""
    from loopvae.compare import CompareOptions, SeedEvaluation, summarise

    pairs = [(a, b) for _, _, a, b in family if a in arms and b in arms]
    evaluated = {n: [SeedEvaluation(r["name"], r["evaluation"][split], {
        **r["evaluation"]["arch"], "config": {"model": r["model"], "model_overrides": r["model_overrides"]}}, None,
        r["evaluation"].get(f"{split}_low_resolution")) for r in arms[n]] for n in dict.fromkeys(sum(pairs, ()))}
    return summarise(evaluated, CompareOptions(pairs=pairs), {"data": f"{split} held-out set", "resolution": 256,
                                                              "limit": None}) if pairs else None


def comparison(summary: dict[str, Any] | None, a: str, b: str, metric: str = "psnr") -> dict[str, Any] | None:
    return next((c for c in (summary or {}).get("comparisons", []) if (c["a"], c["b"], c["metric"]) == (a, b, metric)),
                None)


def extra_seed_rule(records: Records, ips: dict[str, float], docs: Path
                    ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any], list[PlannedRun]]:
    """The pre-registered seed rule: every group at seeds 0-2; a primary inconclusive there (Holm over the four)
    extends *its* two groups to seeds 3 and 4 (a group belongs to one primary, so the other comparisons keep
    seeds 0-2 even where a run serves two budgets). Returns the runs every number uses by group, the rule's record
    (``stage1_complete``, ``stage1``, ``extended``, ``extra_runs``, their ``missing``) and every main run planned."""
    planned, arms = main_runs(records, ips, docs), main_arms(records)
    complete = all(records.get(p.id, {}).get("status") == "finished" for p in planned)
    rule: dict[str, Any] = {"stage1_complete": complete, "stage1": {}, "extended": [], "extra_runs": {},
                            "missing": []}
    extended: set[str] = set()
    stage1 = family_summary({k: [r for r in v if r["seed"] in MAIN_SEEDS] for k, v in arms.items()}, PRIMARY) \
        if complete else None
    for pid, _, a, b in PRIMARY if complete else []:
        c = comparison(stage1, a, b)
        rule["stage1"][pid] = None if c is None else {k: c.get(k) for k in ("diff", "ci", "p_holm", "verdict")}
        if c is not None and c["verdict"] == "inconclusive":
            runs = [p for p in main_runs(records, ips, docs, EXTRA_SEEDS) if {a, b} & {
                f"{p.arm}@{tag}" for tag in TAGS if TAGS[tag] in p.settings["budget"]}]
            rule["extended"].append(pid)
            rule["extra_runs"][pid] = [p.id for p in runs]
            rule["missing"] += [p.id for p in runs if records.get(p.id, {}).get("status") != "finished"]
            planned, extended = planned + runs, extended | {a, b}
    final = {k: [r for r in v if r["seed"] in (MAIN_SEEDS + EXTRA_SEEDS if k in extended else MAIN_SEEDS)]
             for k, v in arms.items()}
    return {k: v for k, v in final.items() if v}, rule, planned
