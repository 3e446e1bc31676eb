"""What sharing itself costs: tied against untied weights at one architecture -> ``docs/study_sharing.md``.

``loopvae-cnn-tiny`` with shortcuts at ``sharing=global`` / ``scale`` / ``none`` (same graph, MACs, blocks, widths,
data order, crops and budget; only the number of stored blocks differs), and ``dcae-tiny`` at the longer budget.
The pre-registration (``docs/study_sharing/preregistration.md``) was committed before any run.

Phases: ``lrcheck`` (every arm at lr 1e-3 / 2e-3 / 4e-3 for 500 steps, seed 0, scored by validation PSNR at step
500; a pick at the grid's edge extends the grid by a factor of 2 that way) and ``main`` (registered: 1,500 steps x
seeds 0-4 of the three arms; 4,500 steps x seeds 0-2 of ``global``, ``none`` and ``dcae-tiny`` at its fair-study
pick including the review's correction arm), each main run evaluated per image on the 40 held-out ImageNet images
and kodim21-24 at 256².

The runs train through the same machinery as the fair study (``studies/_vae_runs.py``), so the two studies' numbers
come from one trainer and one evaluation. ``loopvae study sharing`` (``make study-sharing``).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

from _vae_runs import StudyData, release_data, train_and_evaluate, train_overrides

from looprun.study import Arm, Budget, Comparison, Metric, Phase, PlannedRun, RunContext, Study
from looprun.study import page as std
from looprun.study.page import Page
from looprun.study.tables import interval, md_table, mean_sd
from looprun.study.verdicts import difference, group_values

DOCS = "docs/study_sharing"
SHARING = ("global", "scale", "none")
BASE_RECIPE = ("lr=1.0e-3", "mse_weight=0.0", "warmup_steps=50")  # the fair study's search base (lr: each arm's pick)
RECIPE = ["mse_weight=10.0"]
LR_GRID, LR_STEPS, LR_BOUNDS = (1.0e-3, 2.0e-3, 4.0e-3), 500, (1.0e-4, 3.2e-2)
EVALS = {"1500": 6, "4500": 9}  # validation points per main run (the learning curves)
# Q1 / Q2's verdict words as the pre-registration wrote them (keyed by the engine's verdict)
SHARING_WORDS = {"within margin": "sharing costs < 0.2 dB", "worse": "sharing costs",
                 "worse, within margin": "sharing costs, less than 0.2 dB", "better": "sharing better"}


def overrides(sharing: str) -> str:
    return f"{{shortcuts: true, sharing: {sharing}}}"


def lr_tag(lr: float) -> str:
    return f"{lr:.1e}".replace(".0e", "e").replace("e-0", "e-")


# -- the learning-rate check ---------------------------------------------------------------------------
def lr_scores(sharing: str, grid: list[float], records: dict[str, dict[str, Any]]) -> dict[float, float | None]:
    """Validation PSNR at the last step of each lr's run (``None``: not run yet; a failed run scores -inf)."""
    out: dict[float, float | None] = {}
    for lr in grid:
        r = records.get(f"lr-{sharing}-{lr_tag(lr)}-s0")
        out[lr] = None if r is None else r["curve"][-1]["psnr"] if r["status"] == "finished" and r["curve"] \
            else float("-inf")
    return out


def lr_grid(sharing: str, records: dict[str, dict[str, Any]]) -> list[float]:
    """The lrs this arm's check needs: the base grid, extended by a factor of 2 beyond an edge pick."""
    grid = list(LR_GRID)
    while True:
        scores = lr_scores(sharing, grid, records)
        if any(s is None for s in scores.values()):
            return grid
        best = max(grid, key=lambda lr: scores[lr])
        if best == min(grid) and best / 2 >= LR_BOUNDS[0]:
            grid.insert(0, best / 2)
        elif best == max(grid) and best * 2 <= LR_BOUNDS[1]:
            grid.append(best * 2)
        else:
            return grid


def lr_pick(sharing: str, records: dict[str, dict[str, Any]]) -> float | None:
    grid = lr_grid(sharing, records)
    scores = lr_scores(sharing, grid, records)
    return None if any(s is None for s in scores.values()) else max(grid, key=lambda lr: scores[lr])


def plan_lrcheck(study: Study, records: dict[str, dict[str, Any]]) -> list[PlannedRun]:
    return [PlannedRun(f"lr-{arm}-{lr_tag(lr)}-s0", "lrcheck", arm, "lr500", 0,
                       {"model": "loopvae-cnn-tiny", "model_overrides": overrides(arm), "steps": LR_STEPS, "lr": lr,
                        "recipe": [f"lr={lr:.2e}", *RECIPE], "evals": 3})
            for arm in SHARING for lr in lr_grid(arm, records)]


def dcae_recipe() -> dict[str, Any] | None:
    """``dcae-tiny``'s pick in the fair study's search, the review's correction arm included."""
    from fair import pick_recipe

    return pick_recipe("dcae", corrected=True, docs=Path(__file__).resolve().parents[1] / "docs/study_fair")


def plan_main(study: Study, records: dict[str, dict[str, Any]]) -> list[PlannedRun]:
    def settings(arm: Arm, budget: Budget) -> dict[str, Any] | None:
        if arm.name == "dcae":
            pick = dcae_recipe()
            return None if pick is None else {"recipe": pick["overrides"], "recipe_arm": pick["arm"],
                                              "evals": EVALS[budget.name]}
        lr = lr_pick(arm.name, records)
        return None if lr is None else {"lr": lr, "recipe": [f"lr={lr:.2e}", *RECIPE], "evals": EVALS[budget.name]}

    return study.grid("main", settings)


def run(planned: PlannedRun, context: RunContext) -> dict[str, Any]:
    s = planned.settings
    steps = max(4, round(s["steps"] * float(context.options.get("scale", 1.0))))
    items = train_overrides(s["model"], s["model_overrides"], steps, s["recipe"], planned.seed, s["evals"],
                            BASE_RECIPE)
    record = train_and_evaluate(planned.id, context.workdir, StudyData(**context.options["data"]), "release-tiny",
                                items, evaluate=planned.phase == "main")
    return {**record, "name": planned.id, "model": s["model"], "model_overrides": s["model_overrides"],
            "steps": steps, "lr": s.get("lr"), "recipe": s["recipe"]}


def prepare(context: RunContext) -> dict[str, Any]:
    data = release_data(context.options.get("shared"), context.workdir / "data", "the sharing study")
    return {"data": asdict(data)}


# -- the page ------------------------------------------------------------------------------------------
def row(r: dict[str, Any]) -> dict[str, Any] | None:
    """A finished main run: held-out means, CPU cost and every per-image number (``per_image``: the contract's
    list for results.json; ``per_unit``: the same PSNRs keyed by image, which the engine's null rows pair)."""
    if r.get("phase") != "main" or r["status"] != "finished":
        return None
    images, ev = r["evaluation"]["imagenet"], r["evaluation"]
    # the earlier driver's records carry no budget: their step count is its name
    return {"arm": r["arm"], "budget": r.get("budget", str(r["steps"])), "seed": r["seed"], "steps": r["steps"],
            "name": r["name"],
            "psnr": statistics.fmean(i["psnr"] for i in images), "ssim": statistics.fmean(i["ssim"] for i in images),
            "kodak_psnr": statistics.fmean(i["psnr"] for i in ev["kodak"]), "train_seconds": r["train_seconds"],
            "cpu_ms_per_image": 1000 * r["train_seconds"] / (r["steps"] * 8), "params": ev["arch"]["params"],
            "gmacs": ev["arch"]["gmacs"], "lr": recipe_lr(r["recipe"]), "recipe": r["recipe"],
            "code": r["code"]["commit"],
            "curve": [{k: p.get(k) for k in ("step", "images_seen", "train_seconds", "psnr", "ssim")}
                      for p in r["curve"]],
            "per_image": [{k: i[k] for k in ("key", "shard", "psnr", "ssim", "bicubic_psnr")} for i in images],
            "per_unit": {"psnr": {f"{i['shard']}/{i['key']}": i["psnr"] for i in images}}}


def lr_section(page: Page) -> list[str]:
    runs = {k: r for k, r in page.records.items() if r.get("phase") == "lrcheck"}
    lrs = sorted({r["lr"] for r in runs.values()})
    if not lrs:
        return ["## Learning-rate check", "", "No learning-rate run has finished yet.", ""]
    body = []
    for arm in SHARING:
        scores = lr_scores(arm, lrs, page.records)
        pick = lr_pick(arm, page.records)
        body.append([page.study.arm(arm).title, *["–" if scores[lr] is None else "failed" if scores[lr] == float(
            "-inf") else f"{scores[lr]:.2f}" for lr in lrs], "waiting" if pick is None else f"**{pick:.0e}**"])
    commits = sorted({r["code"]["commit"][:10] for r in runs.values()})
    return ["## Learning-rate check (seed 0, 500 steps, validation PSNR at 256²)", "",
            "The pick rule was written down before these runs (pre-registration above): the best validation PSNR "
            "at step 500; a pick at the grid's edge extends the grid by a factor of 2 that way.", "",
            *md_table(["arm", *[f"lr {lr:.0e}" for lr in lrs], "pick"], body), "",
            f"Training code: commit {', '.join(f'`{c}`' for c in commits)}; the seeded runs: "
            f"{', '.join(f'`{c}`' for c in sorted({r['code'][:10] for r in page.rows})) or 'none yet'} (`plan.json` "
            "pins the commit at the first seeded run; runs in later sittings went on from a worktree of it).", ""]


def recipe_lr(recipe: list[str]) -> float:
    """The learning rate a run trained at: the last ``lr=`` of the base recipe followed by the run's own recipe."""
    return [float(x.split("=", 1)[1]) for x in (*BASE_RECIPE, *recipe) if x.startswith("lr=")][-1]


def lr_cell(row: dict[str, Any]) -> str:
    """A run's learning rate: its arm's pick, or (``dcae-tiny``) the base recipe's lr under its fair-study pick."""
    return f"{row['lr']:.0e}" + (f" (fair pick: {' '.join(row['recipe'])})" if row["arm"] not in SHARING else "")


def core_weights(sharing: str) -> int:
    """Stored parameters of the looped cores (encoder and decoder) of ``loopvae-cnn-tiny`` at ``sharing``: the
    part of the model that tying shares (stems, resamplers and heads are never shared)."""
    from loopvae import create_model  # torch: imported only when a page reads the conclusion

    model = create_model(TINY, shortcuts=True, sharing=sharing)
    return sum(p.numel() for name, p in model.named_parameters() if name.split(".")[1] == "core")


def runs_section(page: Page) -> list[str]:
    if not page.rows:
        return ["## Every seeded run", "", "No seeded run has finished yet.", ""]
    body = []
    for group in page.groups():
        rs = sorted((r for r in page.rows if f"{r['arm']}@{r['budget']}" == group), key=lambda r: r["seed"])
        first = rs[0]
        body.append([page.study.arm(first["arm"]).title, f"{int(first['budget']):,}", f"{first['params']:,}",
                     f"{first['gmacs']:.2f}", lr_cell(first),
                     " / ".join(f"{r['psnr']:.2f}" for r in rs), mean_sd([r["psnr"] for r in rs]),
                     mean_sd([r["ssim"] for r in rs], 3), mean_sd([r["cpu_ms_per_image"] for r in rs], 1)])
    return ["## Every seeded run (40 held-out ImageNet images at 256²)", "",
            *md_table(["arm", "steps", "parameters", "GMACs (256²)", "lr", "PSNR per seed", "PSNR (mean ± sd)",
                       "SSIM", "training CPU ms / image"], body), "",
            "PSNR and SSIM: per image on the clipped, uint8-quantised reconstruction (EMA weights, posterior mode), "
            "averaged over the 40 images; the seed mean ± sd is over seeds. CPU ms / image: the training loop's "
            "process CPU time over the images seen (one thread per run, two runs at a time).", ""]


def computed(page: Page) -> dict[str, Any]:
    """The conclusion rule's numbers (results.json ``conclusion``; README's sharing line reads them): the weights
    tying removes, each arm's lr pick, and per primary its PSNR and SSIM difference and verdict (once the family is
    read)."""
    if "conclusion" in page.readings:
        return page.readings["conclusion"]
    first = {f"{r['arm']}@{r['budget']}": r for r in page.rows}
    g, n = first.get("global@1500"), first.get("none@1500")
    ssim = group_values(page.rows, "ssim")
    out = page.readings["conclusion"] = {
        "weights": g and n and {"global": g["params"], "none": n["params"], "removed": 1 - g["params"] / n["params"],
                                "gmacs": g["gmacs"], "core": (core := {a: core_weights(a) for a in ("global", "none")}),
                                "core_removed": 1 - core["global"] / core["none"]},
        "lr_picks": {arm: lr_pick(arm, page.records) for arm in SHARING},
        "seeded_runs": {"finished": len(page.rows), "planned": sum(p.phase == "main" for p in page.planned)},
        "primaries": [{"id": p["id"], "label": p["label"], "n": p["n"], "psnr": {"diff": p["diff"], "ci": p["ci"]},
                       "ssim": {"diff": ds.mean, "ci": [ds.low, ds.high]}, "verdict": p["verdict"]}
                      for p, c in zip(page.primaries, page.study.primaries, strict=True)
                      for ds in [difference(page.study, c, ssim)]] if page.primaries else []}
    return out


def conclusion(page: Page) -> list[str]:
    out, done = ["## Conclusion (computed from the numbers above)", ""], computed(page)
    if w := done["weights"]:
        core = w["core"]
        out.append(f"- Tying every core block (`global` against `none`) removes {w['core_removed']:.0%} of the looped "
                   f"cores' stored weights ({core['none']:,} → {core['global']:,} parameters) and {w['removed']:.0%} "
                   f"of the model's ({w['none']:,} → {w['global']:,}: stems, resamplers and heads are never shared) "
                   f"at the same {w['gmacs']:.2f} GMACs.")
    if not done["primaries"]:
        return [*out, "- The primaries are not read yet (their family is incomplete).", ""]
    for p in done["primaries"]:
        out.append(f"- **{p['id']}** ({p['label']}): {p['psnr']['diff']:+.2f} dB PSNR, 95% interval "
                   f"{interval(p['psnr']['ci'])}, SSIM {p['ssim']['diff']:+.3f} {interval(p['ssim']['ci'], 3)}, "
                   f"n = {p['n']} seeds: **{p['verdict']}**.")
    return [*out, ""]


def cost_section(page: Page) -> list[str]:
    ms: dict[str, list[float]] = {}
    for r in page.rows:
        ms.setdefault(r["arm"], []).append(r["cpu_ms_per_image"])
    if not ms:
        return []
    ref = statistics.fmean(ms["global"]) if "global" in ms else None
    order = [a.name for a in page.study.arms]
    body = [[page.study.arm(a).title, mean_sd(v, 1), f"{statistics.fmean(v) / ref:.2f}×" if ref else "–", len(v)]
            for a, v in sorted(ms.items(), key=lambda kv: order.index(kv[0]))]
    wide = max(ms, key=lambda a: max(ms[a]) - min(ms[a]))
    return ["## Training cost (measured)", "",
            *md_table(["arm", "CPU ms / image (mean ± sd over runs)", "vs global", "runs"], body), "",
            "Process CPU time of each run's training loop (one thread). The two cores were not reserved for the two "
            "jobs: during some runs the test suite or other checks ran beside them (not recorded per run), which "
            f"inflates CPU time; the runs of one arm ({wide}) span {min(ms[wide]):.1f}–{max(ms[wide]):.1f} ms / "
            "image, so these ratios are descriptive.", ""]


def curves(page: Page) -> list[str]:
    """Validation PSNR against training crops seen and against training CPU-seconds (both pre-registered)."""
    seen = std.curves(page, x="images_seen", xlabel="training crops seen (64²)")
    cpu = std.curves(page, x="train_seconds", xlabel="training CPU-seconds (one thread; the trainer's counter, "
                     "cumulative over resumes)", name="curves_cpu.png")
    return [*seen[:-1], *cpu[2:-1], "Validation PSNR on the 40-image validation split (not the held-out images); "
            "solid lines: 1,500-step runs, dashed: 4,500-step runs.", ""] if seen and cpu else seen


def extra_results(page: Page) -> dict[str, Any]:
    return {"conclusion": computed(page), "lrcheck": [{"arm": r["arm"], "lr": r["lr"], "status": r["status"],
                         "psnr": r["curve"][-1]["psnr"] if r["curve"] else None, "train_seconds": r["train_seconds"]}
                        for r in page.records.values() if r.get("phase") == "lrcheck"]}


TINY = "loopvae-cnn-tiny"
STUDY = Study(
    name="sharing",
    title="What sharing itself costs: tied against untied weights at one architecture",
    docs=DOCS,
    page="docs/study_sharing.md",
    command="make study-sharing",
    arms=[Arm("global", "`global` (tied everywhere)", {"model": TINY, "model_overrides": overrides("global")}),
          Arm("scale", "`scale` (tied within a scale)", {"model": TINY, "model_overrides": overrides("scale")}),
          Arm("none", "`none` (untied)", {"model": TINY, "model_overrides": overrides("none")}),
          Arm("dcae", "`dcae-tiny` (AutoencoderDC)", {"model": "dcae-tiny", "model_overrides": "{}"})],
    budgets=[Budget("1500", (0, 1, 2, 3, 4), SHARING, steps=1500),
             Budget("4500", (0, 1, 2), ("global", "none", "dcae"), steps=4500)],
    metric=Metric("psnr", "dB", label="PSNR"),
    secondary_metrics=[Metric("ssim", "", 3, "SSIM"), Metric("kodak_psnr", "dB", label="kodim21-24 PSNR")],
    primaries=[Comparison("Q1", "global@1500", "none@1500", "tied − untied, 1,500 steps", 0.2, words=SHARING_WORDS),
               Comparison("Q2", "global@4500", "none@4500", "tied − untied, 4,500 steps", 0.2, words=SHARING_WORDS),
               Comparison("P2-long", "global@4500", "dcae@4500", "tied LoopVAE − dcae-tiny, 4,500 steps")],
    smoke_options=("scale",),
    secondaries=[Comparison("S1", "scale@1500", "none@1500", "scale − none, 1,500 steps"),
                 Comparison("S2", "global@1500", "scale@1500", "global − scale, 1,500 steps")],
    run=run,
    prepare=prepare,
    row=row,
    phases=[Phase("lrcheck", plan_lrcheck, registered=False), Phase("main", plan_main)],
    sections=[std.header, std.preregistration, lr_section, runs_section, std.primaries, std.secondaries,
              std.null_rows_section, std.divergence, conclusion, cost_section, curves],
    run_id="main-{arm}-{budget}-s{seed}",
    extra_results=extra_results,
)
