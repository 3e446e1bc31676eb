"""The bundled CPU tokenizer: its recipe search, release run and bundle -> ``assets/models/loopvae-cnn-tiny``,
``docs/study_loopvae/release.md``, shown in ``docs/study_loopvae.md`` (``make recipe-search-vae``, ``release-vae``),
and the tuned references bundled beside it (``make release-references``).

Phases: ``search`` (one-change arms at :data:`BASE_RECIPE`, scored by validation PSNR at the CPU time every arm
reached), ``release`` (``loopvae-cnn-tiny`` and ``flux-vae-tiny`` at the same images seen), ``bundle`` (latent
statistics, both models paired by image, interventions, the bundle and its card) and ``references`` (the
AutoencoderKL and AutoencoderDC references at their fair-study picks, each measured and bundled in
``assets/models/<model>``, or refused: see :func:`reference_run`). Options: ``scale=F`` (search), ``steps=N``
(release, references; bundles only to ``bundle=DIR``: the LoopVAE's folder, the references' parent folder),
``shared=DIR``. ``python studies/release_vae.py card``: the bundled models' cards again. Prose:
``docs/study_loopvae/text.md``.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import _fair as sf
import _loopvae_pages as lp
import _vae_runs as vr
import torch
from _fair import psnr_at  # the search's score, as the fair study's searches read theirs
from _loopvae_pages import text

import loopdata
from loopdata.assets import portable_text
from looprun.checkpoint import sha256_file
from looprun.release import card_front_matter, release_weights_file
from looprun.statistics import PairedDifference, paired_difference
from looprun.study import Arm, Budget, Metric, Phase, PlannedRun, ResultStore, RunContext, Study
from looprun.study import page as std
from looprun.study.page import Page
from looprun.study.tables import md_table
from loopvae.compare import _architecture
from loopvae.latent_stats import STATS_FILE
from loopvae.loading import load_artifact
from loopvae.train_config import load_train_config

PRESET, COMMAND, DOCS = "release-tiny", "make release-vae", lp.RELEASE_DOCS
LOOPVAE, REFERENCE, BUNDLE = "loopvae-s0", "flux-vae-tiny-s0", "assets/models/loopvae-cnn-tiny"
REFERENCES_COMMAND, MODELS = "make release-references", "assets/models"  # the tuned references' target and folder
ROOT = Path(__file__).resolve().parents[1]
FAIR_DOCS = ROOT / "docs/study_fair"  # the references' recipe picks (studies/fair.py, section 2)
RELEASE_STEPS = 7500  # the bundled LoopVAE's steps x 8 crops of 64^2: the references see as many pixels
BASE_STEPS = 500  # ~6.5 minutes of one core (two runs sharing the machine) at 8 crops of 64^2
# Pinned here so that the preset can carry the search's outcome: release-tiny's lr and loss before the search.
BASE_RECIPE = ("warmup_steps=50", "lr=1.0e-3", "mse_weight=0.0")


def search_arm(name: str, change: str, overrides: tuple[str, ...] = (), steps: int = BASE_STEPS) -> Arm:
    return Arm(name, settings={"change": change, "set": list(overrides), "steps": steps})


ARMS = [  # the search, most expensive first (two run at a time), then the release's two runs
    # width 96 is the next width at which every shortcut applies (a multiple of 12, 16 and 3); ~3x the cost
    search_arm("width96", "width 96 (K=2)", ("model_overrides={shortcuts: true, width: 96, norm_num_groups: 16}",),
               BASE_STEPS // 2),
    search_arm("base", "base recipe (lr 1e-3, 8 x 64², L1, EMA 0.999, modulation x10)"),
    search_arm("lr2e-3", "lr 2e-3", ("lr=2.0e-3",)),
    search_arm("b32-c32", "32 crops of 32² (same pixels per step; images resized 6-8x the crop)",
               ("batch_size=32", "resolution=32", "scale_jitter=[6.0,8.0]")),
    search_arm("b4-c96", "4 crops of 96² (1.1x the pixels per step; images resized 2-2.67x the crop)",
               ("batch_size=4", "resolution=96", "scale_jitter=[2.0,2.667]"),
               round(BASE_STEPS * 8 * 64**2 / (4 * 96**2))),
    search_arm("l1+mse", "L1 + 10 MSE (MSE's gradient is ~1/10 of L1's at the errors here)", ("mse_weight=10.0",)),
    search_arm("ema0.99", "EMA decay 0.99", ("ema_decay=0.99",)),
    # the two largest single-change gains together (added once lr2e-3 and l1+mse had both beaten base)
    search_arm("lr2e-3+mse", "lr 2e-3 and L1 + 10 MSE together", ("lr=2.0e-3", "mse_weight=10.0")),
    search_arm("mod1", "modulation_lr_scale 1 (one learning rate)", ("modulation_lr_scale=1.0",)),
    Arm("loopvae", "LoopVAE (bundled)", {"id": LOOPVAE, "overrides": ["seed=0"]}),
    Arm("reference", "flux-vae-tiny (reference)",
        {"id": REFERENCE, "overrides": ["seed=0", "model=flux-vae-tiny", "model_overrides={}"]})]


def plan(phase: str) -> Phase:
    """The search's arms, the release's two runs, or the bundle once both have finished."""
    def runs(study: Study, records: dict[str, dict[str, Any]]) -> list[PlannedRun]:
        if phase == "bundle":
            done = all(records.get(k, {}).get("status") == "finished" for k in (LOOPVAE, REFERENCE))
            return [PlannedRun("bundle", "bundle", "bundle", PRESET, 0)] if done else []
        release = phase == "release"  # the release's arms name their run; the search's are search-<arm>-s0
        return [PlannedRun(a.settings.get("id", f"search-{a.name}-s0"), phase, a.name, PRESET if release else "search",
                           0, {k: v for k, v in a.settings.items() if k != "id"})
                for a in study.arms if ("id" in a.settings) == release]
    return Phase(phase, runs, registered=False)


def plan_references(study: Study, records: Mapping[str, dict[str, Any]]) -> list[PlannedRun]:
    """One run per tuned reference at the recipe its own search picked (``FAIR_DOCS``), for the bundled LoopVAE's
    pixels seen (:data:`RELEASE_STEPS` scaled by the pick's pixels per step)."""
    fair, out = sf.load_records(FAIR_DOCS), []
    for family in lp.REFERENCE_FAMILIES:
        picked, chosen = sf.pick(fair, family, FAIR_DOCS), sf.family_model(family, fair)
        if picked is None or chosen is None:
            raise LookupError(f"{family}: its recipe search is not finished ({FAIR_DOCS}/runs): run `loopvae study "
                              "fair --phase shapes search` first")
        recipe = next(a for a in sf.search_arms(family) if a.name == picked["arm"])
        name = sf.registered_name(*chosen)
        out.append(PlannedRun(f"{name}-s0", "references", family, PRESET, 0, {
            "family": family, "model": name, "train_model": chosen[0], "model_overrides": chosen[1],
            "recipe_arm": picked["arm"], "recipe": list(recipe.overrides),
            "steps": max(4, round(RELEASE_STEPS * recipe.pixel_factor))}))
    return out


def reference_items(settings: Mapping[str, Any], steps: int) -> list[str]:
    """``loopvae train --set`` items of a reference run (:func:`plan_references`' settings) at ``steps``."""
    return [f"model={settings['train_model']}", f"model_overrides={settings['model_overrides']}", "seed=0",
            f"max_steps={steps}", f"eval_every={max(1, steps // 10)}", f"checkpoint_every={max(1, steps // 15)}",
            f"image_every={steps}", "log_every=50", *sf.BASE_RECIPE, *settings["recipe"]]


def run(planned: PlannedRun, context: RunContext) -> dict[str, Any]:
    """Train one search arm or release run (one thread, validation curve), make the bundle, or release a
    reference."""
    s, data, steps = planned.settings, vr.StudyData(**context.options["data"]), context.options.get("steps")
    if planned.phase == "bundle":
        return bundle_run(context, data, steps)
    if planned.phase == "references":
        return reference_run(planned, context, data, steps)
    if planned.phase == "search":
        n = max(4, round(s["steps"] * float(context.options.get("scale", 1.0))))
        items = vr.train_overrides("loopvae-cnn-tiny", "{shortcuts: true}", n, s["set"], 0, 3, BASE_RECIPE)
    else:
        items = [*s["overrides"], *([] if steps is None else [
            f"max_steps={steps}", f"eval_every={max(1, steps // 4)}", f"checkpoint_every={max(1, steps // 2)}",
            f"image_every={steps}", f"log_every={max(1, steps // 10)}", "warmup_steps=1"])]
    start, cfg = time.perf_counter(), load_train_config(PRESET, items)
    record = vr.train_and_evaluate(planned.id, context.workdir, data, PRESET, items, evaluate=False)
    facts = {"steps": cfg.max_steps, "num_train": data.num_train, "num_validation": data.num_validation}
    if planned.phase == "search" or record["status"] != "finished":
        return {**record, **facts, "change": s.get("change"), "batch": cfg.batch_size, "crop": cfg.resolution}
    timings = vr.Timings(context.workdir.parent / f"{planned.id}.timings.json")
    params, gmacs = vr.model_counts(cfg.model, dict(cfg.model_overrides))
    return {**record, **facts, "wall_seconds": time.perf_counter() - start, "params": params, "gmacs": gmacs,
            "eval": vr.evaluate_arm(context.workdir, data, "none", timings), "post_seconds": timings.data["post"],
            "preset": PRESET, "batch_size": cfg.batch_size, "resolution": cfg.resolution, "ema_decay": cfg.ema_decay,
            "images_seen": cfg.max_steps * cfg.batch_size, "num_holdout": data.num_holdout, "lpips_net": "none"}


def write_latent_stats(release: Path, data: str, timings: vr.Timings, limit: int | None = None) -> dict[str, Any]:
    """``loopvae latent-stats`` on ``data`` into ``release`` (once; timed), and what it measured."""
    if not (release / STATS_FILE).is_file():
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "loopvae", "latent-stats", "--checkpoint", str(release), "--data", data,
                        "--resolution", "256", "--num-workers", "0", "--no-progress",
                        *([] if limit is None else ["--limit", str(limit)])], check=True)
        timings.record("post", "latent-stats", time.perf_counter() - start)
    return json.loads((release / STATS_FILE).read_text())


def latent_moments(release: Path, urls: str) -> dict[str, float]:
    """Mean and s.d. of the normalised posterior samples of ``urls`` at 256^2 (~0 and ~1 when the stats hold)."""
    model, gen, values = load_artifact(release).eval(), torch.Generator().manual_seed(0), []
    with torch.no_grad():
        for batch in loopdata.make_loader(urls, task="reconstruction", train=False, batch_size=8, num_workers=0,
                                          resolution=256, rank=0, world_size=1):
            z = model.encode(batch["image"]).latent_dist.sample(generator=gen)
            values.append(((z - model.config.shift_factor) * model.config.scaling_factor).flatten())
    z = torch.cat(values).double()
    return {"mean": float(z.mean()), "std": float(z.std()), "num_values": z.numel()}


def comparisons(runs: Path) -> dict[str, Any]:
    """Per split: LoopVAE - reference and LoopVAE - bicubic, paired by image (PSNR and SSIM)."""
    out: dict[str, Any] = {}
    for split in ("kodak", "imagenet"):
        ours, ref = (sorted(json.loads((runs / n / f"eval-{split}" / "per_image.json").read_text()),
                            key=lambda r: (r["shard"], r["key"])) for n in (LOOPVAE, REFERENCE))
        if [r["key"] for r in ours] != [r["key"] for r in ref]:
            raise RuntimeError(f"{split}: the two evaluations saw different images")
        col = {k: [r[k] for r in ours] for k in ("psnr", "ssim", "bicubic_psnr")}
        out[split] = {"vs_reference_psnr": paired_difference(col["psnr"], [r["psnr"] for r in ref]).as_dict(),
                      "vs_reference_ssim": paired_difference(col["ssim"], [r["ssim"] for r in ref]).as_dict(),
                      "vs_bicubic_psnr": paired_difference(col["psnr"], col["bicubic_psnr"]).as_dict(),
                      "margin_over_bicubic": sum(a - b for a, b in zip(col["psnr"], col["bicubic_psnr"])) / len(ours)}
    return out


def bundle_run(context: RunContext, data: vr.StudyData, steps: int | None) -> dict[str, Any]:
    """The bundle phase, on the two finished release runs beside this one (``<workdir>/<run id>``)."""
    runs = context.workdir.parent
    release, timings = runs / LOOPVAE / "release", vr.Timings(runs / "bundle.timings.json")
    vr.keep_freed_memory_mapped()
    stats = write_latent_stats(release, data.train, timings, None if steps is None else 16)
    images, keys = vr.intervention_images(data.kodak_val, data.imagenet_holdout)
    made = {"latent_stats": {k: stats[k] for k in ("shift_factor", "scaling_factor", "num_images", "resolution",
                                                   "posterior")},
            "heldout_latents": latent_moments(release, data.imagenet_holdout),
            "kodak_latents": latent_moments(release, data.kodak_val), "comparisons": comparisons(runs),
            "interventions": vr.run_interventions_on(runs / LOOPVAE, images, keys, timings),
            "sha256": sha256_file(release_weights_file(release)), "post_seconds": timings.data["post"]}
    if target := context.options.get("bundle", None if steps is not None else BUNDLE):
        vr.copy_bundle(release, context.root / target, ("config.json", "release.json", "latent_stats.json"))
        write_card(context.root / target, view({**ResultStore(context.root, DOCS).all(), "bundle": made}),
                   context.root)
    return made


def reference_run(planned: PlannedRun, context: RunContext, data: vr.StudyData, steps: int | None
                  ) -> dict[str, Any]:
    """Train one tuned reference (``steps``: a smoke run's, else the planned), then its latent statistics,
    architecture, evaluation at 256^2 and bundle. One not above bicubic on the held-out images is not bundled: its
    numbers stay in its result file with status ``refused`` (a raised error would keep only the error), the other
    reference still gets its bundle, ``--retry-failed`` runs it again and ``make release-references`` fails on
    it. Smoke runs are never refused and bundle only to the ``bundle`` option."""
    s, total = planned.settings, planned.settings["steps"] if steps is None else steps
    items = reference_items(s, total)
    record = vr.train_and_evaluate(planned.id, context.workdir, data, PRESET, items, evaluate=False)
    if record["status"] != "finished":
        return record
    release, timings = context.workdir / "release", vr.Timings(context.workdir.parent / f"{planned.id}.timings.json")
    vr.keep_freed_memory_mapped()
    stats = write_latent_stats(release, data.train, timings, None if steps is None else 16)
    arch = _architecture(str(release), 256, "ema")
    dc = arch["class"] == "AutoencoderDC"
    shift = (f" (AutoencoderDC has no shift_factor key; the measured shift {stats['shift_factor']:.6f} is in "
             "latent_stats.json)" if dc else f", shift_factor {stats['shift_factor']:.6f}")
    r = {**record, **{k: s[k] for k in ("family", "model", "model_overrides", "recipe_arm", "recipe")},
         "steps": total, **{k: arch[k] for k in ("class", "params", "gmacs")}, "num_train": data.num_train,
         "images_seen": total * load_train_config(PRESET, items).batch_size,
         "eval": vr.evaluate_arm(context.workdir, data, "none", timings),
         "sha256": sha256_file(release_weights_file(release)), "command": REFERENCES_COMMAND,
         "latent_note": f"scaling_factor {stats['scaling_factor']:.6f}{shift}", "bundled": False}
    heldout, bicubic = r["eval"]["imagenet"]["psnr"], r["eval"]["imagenet"]["baseline"]["psnr"]
    if steps is None and heldout <= bicubic:
        return {**r, "status": "refused", "refused": portable_text(
            f"{s['model']}: {heldout:.2f} dB on the held-out images is not above bicubic ({bicubic:.2f} dB): a "
            f"reference below bicubic is broken, not a baseline; not bundled (see {context.workdir}.log and its "
            "validation.json)")}
    if target := context.options.get("bundle", None if steps is not None else MODELS):
        r["bundled"] = True
        bundle_reference(release, context.root / target / s["model"], r)
    return r


def bundle_reference(release: Path, target: Path, r: dict[str, Any]) -> None:
    """Copy a reference's config, latent statistics and EMA weights to ``target`` with release.json and its card."""
    vr.copy_bundle(release, target)
    info = json.loads((release / "release.json").read_text()) | {
        "command": REFERENCES_COMMAND, "recipe_arm": r["recipe_arm"], "images_seen": r["images_seen"],
        "train_cpu_hours": round(r["train_seconds"] / 3600, 3)}
    (target / "release.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    reference_card(target, r)


def prepare(context: RunContext) -> dict[str, Any]:
    data = vr.release_data(context.options.get("shared"), context.workdir / "data", "the release")
    return {"data": dataclasses.asdict(data)}


# -- the page ------------------------------------------------------------------------------------------
def row(r: dict[str, Any]) -> dict[str, Any] | None:
    if r.get("phase") not in ("search", "release") or r.get("status") != "finished" or not r["curve"]:
        return None
    scores = {f"{s}_{m}": r["eval"][s][m] for s in ("kodak", "imagenet") for m in ("psnr", "ssim")} if "eval" in r \
        else {}
    return {"arm": r["arm"], "budget": r["budget"], "seed": r["seed"], "final_psnr": r["curve"][-1]["psnr"],
            **scores, "curve": [{"minutes": p["train_seconds"] / 60, "psnr": p["psnr"]} for p in r["curve"]]}


def curves(page: Page, budget: str, name: str) -> list[str]:
    """The validation curves of one budget's runs (``search`` / ``release-tiny``) in ``name``."""
    sub = dataclasses.replace(page, rows=[r for r in page.rows if r["budget"] == budget])
    return std.curves(sub, x="minutes", y="psnr", xlabel="CPU-minutes of training (1 thread)", name=name)[2:]


def search_section(page: Page) -> list[str]:
    """The search's table (arms by PSNR at the CPU time every arm reached), its curves and its reading."""
    runs = {r["arm"]: r for r in lp.finished(page, "search").values() if r["curve"]}
    runs = {a.name: runs[a.name] for a in page.study.arms if a.name in runs}  # the spec's order
    if "base" not in runs:
        return [*text("release-search-missing"), ""]
    seconds = min(r["curve"][-1]["train_seconds"] for r in runs.values())
    at, inv = {n: psnr_at(r["curve"], seconds) for n, r in runs.items()}, lp.invocation(page, "recipe-search", runs)
    how = (f"{inv['runtime_min']:.0f} min wall with {inv['jobs']} runs at a time, one thread each" if inv else
           f"{sum(r['train_seconds'] for r in runs.values()) / 60:.0f} CPU-min of training, one thread per run")
    body = [[n, r["change"], f"{r['steps']} × {r['batch']} × {r['crop']}²", f"{r['curve'][-1]['images_seen']:,}",
             f"{r['curve'][-1]['train_seconds'] / 60:.1f}", f"{r['curve'][-1]['psnr']:.2f}",
             "–" if at[n] is None else f"{at[n]:.2f}"]
            for n, r in sorted(runs.items(), key=lambda kv: -(at[kv[0]] or 0))]
    steps = runs["base"]["steps"]
    return [*text("release-search", command=inv["command"] if inv else COMMAND, how=how, preset=PRESET,
                  date=max(r["date"] for r in runs.values())[:10], first=runs["base"], minutes=seconds / 60,
                  curves=curves(page, "search", "search_curves.png"), table=md_table(
                      ["arm", "change", "steps × batch × crop", "images seen", "CPU-min", "final PSNR",
                       "at matched time"], body, "lllrrrr"),
                  gains=[f"- {n}: {at[n] - at['base']:+.2f} dB against base at matched CPU time." for n in runs
                         if n != "base" and at[n] is not None and at["base"] is not None],
                  best=max(runs, key=lambda n: at[n] or -1.0), cap=(1 + steps) / (10 + steps), steps=steps), ""]


def view(records: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The release as one dict (the two runs' numbers by run id, the bundle's beside them); ``None`` until the
    two runs and the bundle have finished."""
    ours, ref, made = (records.get(k) for k in (LOOPVAE, REFERENCE, "bundle"))
    if not (ours and ref and made) or any(r.get("status", "finished") != "finished" for r in (ours, ref, made)):
        return None
    return {**ours, **made, "curves": {LOOPVAE: ours["curve"], REFERENCE: ref["curve"]}, "command": COMMAND,
            **{k: {LOOPVAE: ours[k], REFERENCE: ref[k]} for k in ("eval", "params", "gmacs", "train_seconds",
                                                                  "wall_seconds")},
            "date": (made.get("date") or time.strftime("%Y-%m-%d"))[:10]}


def _diff(d: dict[str, Any], unit: str = "dB", digits: int = 2) -> str:
    """A by-image difference between single runs: descriptive, without a verdict word."""
    return PairedDifference(**d).describe(unit=unit, digits=digits, verdict=False)


def release_section(page: Page) -> list[str]:
    """The measured release: table, by-image differences, latent statistics, interventions, learning curves."""
    if (r := view(page.records)) is None:
        return [*text("release-missing"), ""]
    ev, iv = r["eval"], r["interventions"]
    body = [[page.study.arm(a).title, f"{r['params'][n] / 1e6:.3f}M", f"{r['gmacs'][n]:.2f}",
             *[f"{ev[n][s][m]:{f}}" for s in ("kodak", "imagenet") for m, f in (("psnr", ".2f"), ("ssim", ".4f"))]]
            for a, n in (("loopvae", LOOPVAE), ("reference", REFERENCE))]
    kb, ib = ev[LOOPVAE]["kodak"]["baseline"], ev[LOOPVAE]["imagenet"]["baseline"]
    body.append([f"bicubic via {kb['low_resolution'][0]}×{kb['low_resolution'][1]}", "0", "–", f"{kb['psnr']:.2f}",
                 f"{kb['ssim']:.4f}", f"{ib['psnr']:.2f}", f"{ib['ssim']:.4f}"])
    by_image = []
    for split, label in (("kodak", "kodim21–24"), ("imagenet", f"{r['num_holdout']} held-out ImageNet images")):
        c = r["comparisons"][split]
        by_image += text("release-by-image", label=label, bicubic=_diff(c["vs_bicubic_psnr"]),
                         met="met" if c["margin_over_bicubic"] >= 1.0 else "not met",
                         psnr=_diff(c["vs_reference_psnr"]), ssim=_diff(c["vs_reference_ssim"], unit="", digits=4))
    one = lp.stage(iv, "decoder", "2x")["prefix"][0]
    loss = iv["baseline"]["psnr"] - one["psnr"]
    if page.draw:
        from loopvae.intervene import plot

        plot(iv, page.store.docs)
    return [*text("release", r=r, budgets=r["images_seen"] / 17_600, ls=r["latent_stats"], iv=iv, one=one, loss=loss,
                  hours=[r["train_seconds"][n] / 3600 for n in (LOOPVAE, REFERENCE)], by_image=by_image,
                  wall=[r["wall_seconds"][n] / 60 for n in (LOOPVAE, REFERENCE)],
                  table=md_table(["model", "params", "GMACs @256²", "kodim21–24 PSNR", "SSIM", "held-out ImageNet PSNR",
                                  "SSIM"], body), curves=curves(page, PRESET, "release_curves.png"),
                  interventions=lp.interventions_table(iv), loss_met="met" if loss >= 5 else "not met",
                  one_range=100 * one["out_of_range"], anytime=lp.anytime_reading(iv)), ""]


def references_lines(refs: dict[str, dict[str, Any]], release: dict[str, Any] | None) -> list[str]:
    """The tuned references (:func:`_loopvae_pages.references`; one run each: descriptive; seeds:
    ``study_fair.md``), with the bundled LoopVAE (``release``: :func:`view`) first: the table and how their
    validation curves end."""
    models = [(f"`{m}`", f"`{m}`", r) for m, r in refs.items()]
    if release is not None:
        models.insert(0, ("`loopvae-cnn-tiny` + shortcuts (the bundled LoopVAE)", "the bundled LoopVAE", {
            "class": "LoopVAE", "recipe_arm": PRESET, "bundled": True, "images_seen": release["images_seen"],
            **{k: release[k if k != "curve" else "curves"][LOOPVAE] for k in ("params", "gmacs", "train_seconds",
                                                                               "eval", "curve")}}))
    body = [[label, r["class"], f"{r['params'] / 1e6:.3f}M", f"{r['gmacs']:.2f}", f"{r['images_seen']:,}",
             f"{r['train_seconds'] / 3600:.2f}", r["recipe_arm"],
             *[f"{r['eval'][s]['psnr']:.2f} / {r['eval'][s]['ssim']:.4f}" for s in ("kodak", "imagenet")],
             f"{r['eval']['imagenet']['baseline']['psnr']:.2f}",
             "yes" if r.get("bundled") else "no: " + r.get("refused", "not bundled")] for label, _, r in models]
    ends = []
    for _, label, r in models:
        curve, last = r["curve"][-3:], r["curve"][-1]
        fifth = min(r["curve"], key=lambda p: abs(p["step"] - 0.8 * last["step"]))
        ends += text("release-reference-curve", label=label, values=" → ".join(f"{p['psnr']:.2f}" for p in curve),
                     steps=", ".join(f"{p['step']:,}" for p in curve), fifth=fifth, last=last,
                     gain=last["psnr"] - fifth["psnr"])
    date = max(r["date"] for r in refs.values())[:10]
    return [*text("release-references", command=REFERENCES_COMMAND, date=date, curves=ends, table=md_table(
        ["model", "class", "params", "GMACs @256²", "crops seen", "training CPU-hours", "recipe",
         "kodim21–24 PSNR / SSIM", "held-out ImageNet PSNR / SSIM", "bicubic (held-out)", "bundled"], body,
        "llrrrrlllrl")), ""]


def references_section(page: Page) -> list[str]:
    refs = lp.references(page.store.root)
    return references_lines(refs, view(page.records)) if refs else []


def write_card(target: Path, r: dict[str, Any], root: Path = ROOT) -> None:
    """The bundled model's README (``r``: :func:`view`): what it is, how it was made and what it measures, beside the
    tuned references released under ``root`` (one run each: numbers, no verdict). ``tests/vae/test_bundled_model.py``
    reads its phrases and table."""
    ev, refs = r["eval"][LOOPVAE], lp.references(root)
    held = f"{r['num_holdout']} held-out ImageNet"
    sets = (("kodak", "kodim21–24", "kodim21-24 (Kodak)"), ("imagenet", held, f"{held}-sample images"))
    front = card_front_matter("loopvae-cnn-tiny", "diffusers", ["loopvision", "loopvae", "vae", "image-tokenizer"], [
        {"task": "image-to-image", "dataset": f"{name}, 256²", "type": m, "name": m.upper(), "value": ev[s][m]}
        for s, _, name in sets for m in ("psnr", "ssim")])
    heads = [f"`{n}` ({v['class']}, {v['params'] / 1e6:.2f}M, {v['gmacs']:.2f} GMACs), PSNR / SSIM"
             for n, v in refs.items()]
    table = md_table(["images", "PSNR", "SSIM", "bicubic (≥ equal values/px)", *heads], [
        [label, f"{ev[s]['psnr']:.2f}", f"{ev[s]['ssim']:.4f}", f"{ev[s]['baseline']['psnr']:.2f}",
         *[f"{v['eval'][s]['psnr']:.2f} / {v['eval'][s]['ssim']:.3f}" for v in refs.values()]] for s, label, _ in sets])
    lines = text("card-loopvae", r=r, ev=ev, ls=r["latent_stats"], table=table, command=COMMAND, preset=PRESET,
                 bundle=BUNDLE, params=r["params"][LOOPVAE], gmacs=r["gmacs"][LOOPVAE],
                 hours=r["train_seconds"][LOOPVAE] / 3600, wall=r["wall_seconds"][LOOPVAE] / 60, decoder=" → ".join(
                     f"{p['psnr']:.2f}" for p in lp.stage(r["interventions"], "decoder", "2x")["prefix"]))
    (target / "README.md").write_text(front + "\n".join(lines) + "\n")


def reference_card(target: Path, r: dict[str, Any]) -> None:
    """A reference bundle's README (``r``: its result record): the training command, crops seen, CPU-hours, sha256
    and the measured table."""
    ev, dc = r["eval"], r["class"] == "AutoencoderDC"
    splits = (("kodak", "kodim21–24", "kodim21-24 (Kodak), 256²"),
              ("imagenet", "40 held-out ImageNet", "40 held-out ImageNet-sample images, 256²"))
    results = [{"task": "image-to-image", "dataset": dataset, "type": m, "name": m.upper(), "value": ev[split][m]}
               for split, _, dataset in splits for m in ("psnr", "ssim")]
    card = text("card-reference", r=r, command=REFERENCES_COMMAND, preset=PRESET, hours=r["train_seconds"] / 3600,
                shortcuts="shortcut-equipped " if dc else "", recipe=" ".join(r["recipe"]) or "the base recipe",
                base=" ".join(sf.BASE_RECIPE), latent="the deterministic latent" if dc else "posterior mode",
                rows=[f"| {label} | {ev[s]['psnr']:.2f} | {ev[s]['ssim']:.4f} | {ev[s]['baseline']['psnr']:.2f} |"
                      for s, label, _ in splits])
    front = card_front_matter(r["model"], "diffusers", ["loopvision", "vae", "reference", r["class"]], results)
    (target / "README.md").write_text(front + "\n".join(card) + "\n")


STUDY = Study(
    name="release-vae", title="The bundled CPU tokenizer: its recipe search and its release", docs=DOCS,
    page="docs/study_loopvae/release.md", arms=ARMS, budgets=[Budget("search", (0,)), Budget(PRESET, (0,))],
    metric=Metric("final_psnr", "dB", label="validation PSNR at 256² (dB)"), run=run, row=row, prepare=prepare,
    phases=[plan("search"), plan("release"), plan("bundle"), Phase("references", plan_references, registered=False)],
    preregistration=None, command=COMMAND,
    sections=[std.header, search_section, release_section, references_section],
)

if __name__ == "__main__":  # python studies/release_vae.py card: the cards again from the committed result files
    if sys.argv[1:] != ["card"]:
        sys.exit("usage: python studies/release_vae.py card")
    write_card(ROOT / BUNDLE, view(ResultStore(ROOT, DOCS).all()))  # type: ignore[arg-type]
    for name, reference in lp.references(ROOT).items():
        if reference.get("bundled"):
            reference_card(ROOT / MODELS / name, reference)
