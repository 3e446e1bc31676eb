"""The LoopVAE study at CPU scale: does the recurrence do work? -> ``docs/study_loopvae.md`` (``make study-vae``).

Every arm trains with one budget (preset ``study-tiny``) and is evaluated at 256^2 on kodim21-24 and 40 held-out
ImageNet images: ``loopvae-cnn-tiny`` at sharing ``global`` (2 seeds) / ``scale`` / ``none``, ``flux-vae-tiny`` (2
seeds), with the shortcuts, with deep supervision; ``loopvae intervene`` on seed 0 of ``global`` and of the deeply
supervised arm (fixed in advance); phase ``throughput`` times every architecture side by side. The page also shows
the release (``release_vae.py``). ``loopvae study vae --jobs 2`` (~2 h on 2 cores); options ``steps=N``, ``shared=DIR``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import _loopvae_pages as lp
import _vae_runs as vr
import release_vae

from looprun.statistics import paired_difference, seeds_disagree
from looprun.study import Arm, Budget, Metric, Phase, PlannedRun, RunContext, Study
from looprun.study import page as std
from looprun.study.page import Page
from looprun.study.tables import md_table, mean_sd

PRESET, BEST, DS = "study-tiny", "global-s0", "global-ds-s0"  # BEST: the run the interventions read, fixed in advance
PRESET_KEYS = ("max_steps", "batch_size", "resolution", "scale_jitter", "lr", "warmup_steps", "min_lr_ratio",
               "kl_weight", "latent_noise_std", "ema_decay")
PAPER_PREFIX_DEC2X = [14.54, 15.26, 19.36, 32.28]  # paper Table 7: decoder 2x stage, k = 1..4 retained passes
PAPER_SHARING_ORDER = "global > none > scale"  # paper, Transformer stage 1: 31.163 > 31.043 > 30.412 dB


def arm(name: str, prefix: str, model: str, seeds: tuple[int, ...] = (0,), overrides: dict[str, Any] | None = None,
        deep: bool = False) -> Arm:
    """An arm whose runs ``<prefix>-s<seed>`` train ``model`` with ``overrides`` (and deep supervision)."""
    extra = ([f"model_overrides={{{', '.join(f'{k}: {str(v).lower()}' for k, v in overrides.items())}}}"]
             if overrides else []) + (["deep_supervision_weight=1.0"] if deep else [])
    return Arm(name, settings={"prefix": prefix, "model": model, "seeds": seeds, "extra": extra,
                               "counted": (model, overrides or {}, deep)})


ARMS = [arm("global", "global", "loopvae-cnn-tiny", (0, 1)),
        arm("scale", "scale", "loopvae-cnn-tiny", overrides={"sharing": "scale"}),
        arm("none", "none", "loopvae-cnn-tiny", overrides={"sharing": "none"}),
        arm("reference", "flux-vae-tiny", "flux-vae-tiny", (0, 1)),
        arm("shortcuts", "shortcuts", "loopvae-cnn-tiny", overrides={"shortcuts": True}),
        arm("deep-supervision", "global-ds", "loopvae-cnn-tiny", deep=True)]


def plan(study: Study, records: dict[str, dict[str, Any]]) -> list[PlannedRun]:
    return [PlannedRun(f"{a.settings['prefix']}-s{s}", "study", a.name, PRESET, s,
                       {"overrides": [f"model={a.settings['model']}", f"seed={s}", *a.settings["extra"]],
                        "interventions": f"{a.settings['prefix']}-s{s}" in (BEST, DS)})
            for a in study.arms for s in a.settings["seeds"]]


def run(planned: PlannedRun, context: RunContext) -> dict[str, Any]:
    """Train and measure one run (one thread), or (``throughput``) time every architecture side by side."""
    import torch

    from looprun.checkpoint import sha256_file
    from looprun.release import release_weights_file
    from loopvae.perceptual import default_backbone_path
    from loopvae.train_config import load_train_config

    steps, data, out = context.options.get("steps"), vr.StudyData(**context.options["data"]), context.workdir
    preset = load_train_config(PRESET, [] if steps is None else [f"max_steps={steps}"])
    timings, started = vr.Timings(out.parent / f"{planned.id}.timings.json"), time.perf_counter()
    facts = {"preset": {k: getattr(preset, k) for k in PRESET_KEYS}, "num_train": data.num_train,
             "num_holdout": data.num_holdout, "torch": torch.__version__,
             "lpips_net": "alex" if default_backbone_path("alex").is_file() else "none"}
    if planned.phase == "throughput":
        torch.set_num_threads(2)
        speed = vr.train_throughput({a.name: a.settings["counted"] for a in STUDY.arms}, preset.batch_size,
                                    preset.resolution)
        return {"throughput": speed, "post_seconds": {"throughput": time.perf_counter() - started}, **facts}
    schedule = [] if steps is None else [f"max_steps={steps}", f"checkpoint_every={max(1, steps // 2)}",
                                         f"image_every={max(1, steps // 2)}", f"log_every={max(1, steps // 10)}"]
    record = vr.train_and_evaluate(planned.id, out, data, PRESET, [*planned.settings["overrides"], *schedule],
                                   evaluate=False)  # the study's data has no validation split: no curve
    if record["status"] != "finished":
        return record
    wall = time.perf_counter() - started
    vr.keep_freed_memory_mapped()
    measured = {"eval": vr.evaluate_arm(out, data, facts["lpips_net"], timings), **facts,
                "sha256": sha256_file(release_weights_file(out / "release")),
                "l1_curve": [{"step": s, "l1": v} for s, v in vr.l1_curve(out)]}
    if planned.settings["interventions"]:
        images, keys = vr.intervention_images(data.kodak_val, data.imagenet_holdout)
        measured["interventions"] = vr.run_interventions_on(out, images, keys, timings)
    params, gmacs = vr.model_counts(*STUDY.arm(planned.arm).settings["counted"][:2])
    return {**record, **measured, "params": params, "gmacs": gmacs, "train_wall_seconds": wall,
            "post_seconds": {k.replace(f" {planned.id}", ""): v for k, v in timings.data["post"].items()}}


def prepare(context: RunContext) -> dict[str, Any]:
    import loopdata

    shared = context.options.get("shared") or loopdata.find_shared_data()
    if shared is None:
        raise SystemExit("the study needs the shared data (ImageNet sample): --option shared=DIR")
    return {"data": asdict(vr.prepare_study_data(Path(shared), context.workdir / "data"))}


# -- the page ------------------------------------------------------------------------------------------
def row(r: dict[str, Any]) -> dict[str, Any] | None:
    if r.get("phase") != "study" or r.get("status") != "finished":
        return None
    return {"arm": r["arm"], "budget": r["budget"], "seed": r["seed"], "curve": r.get("l1_curve"),
            **{f"{split}_{m}": r["eval"][split][m] for split in ("kodak", "imagenet") for m in ("psnr", "ssim")}}


def view(page: Page) -> dict[str, Any] | None:
    """The study as one dict: ``eval`` / ``interventions`` by run, ``params`` / ``gmacs`` / ``throughput`` by arm,
    each arm's runs in ``groups``; ``None`` until every planned run has finished."""
    runs, speed = lp.finished(page, "study"), lp.finished(page, "throughput")
    if page.missing or page.failed:
        return None
    groups: dict[str, list[str]] = {a.name: [] for a in page.study.arms}
    for name, r in runs.items():
        groups[r["arm"]].append(name)
    return {"eval": {k: r["eval"] for k, r in runs.items()}, "groups": groups,
            **{k: {r["arm"]: r[k] for r in runs.values()} for k in ("params", "gmacs")},
            "throughput": speed["throughput"]["throughput"],
            "post_s": sum(v for r in [*runs.values(), *speed.values()] for v in r["post_seconds"].values()),
            "interventions": {k: r["interventions"] for k, r in runs.items() if "interventions" in r},
            "timings": {"train": {k: r["train_wall_seconds"] for k, r in runs.items()}},
            "bundled": {"name": BEST, **{k: runs[BEST][k] for k in ("params", "sha256")},
                        "overrides": runs[BEST]["settings"]["overrides"]},
            **{k: runs[BEST].get(k) for k in ("preset", "num_train", "num_holdout", "lpips_net", "torch", "date")},
            "invocation": lp.invocation(page, "study", {**runs, **speed})}


def body(page: Page) -> list[str]:
    """The study's sections, once every planned run has finished."""
    if (r := view(page)) is None:
        return ["The tables below wait for every run of the study (see the count above).", ""]
    return [*intro(r), *reconstruction(page, r), *interventions(page, r), *reading(r), *model(r)]


def intro(r: dict[str, Any]) -> list[str]:
    p, inv = r["preset"], r["invocation"] or {"command": "loopvae study vae", **r,
                                               "train_wall": sum(r["timings"]["train"].values())}
    how = f"{inv['jobs']} runs at a time with {inv['threads']} thread(s) each" if "jobs" in inv else "summed over runs"
    note = f" Interrupted once: {inv['interrupted']['note']}." if "interrupted" in inv else ""
    lpips = "not computed (AlexNet weights absent)" if r["lpips_net"] == "none" else "(AlexNet) in the result files"
    return [
        f"Produced by `{inv['command']}` on {inv['date'][:10]} (2-core CPU, torch {inv['torch']}); whole study "
        f"{(inv['train_wall'] + r['post_s']) / 60:.0f} min: {inv['train_wall'] / 60:.0f} min of training "
        f"({how}; per-run wall times in `study_loopvae/runs/`) and {r['post_s'] / 60:.0f} min of throughput "
        f"measurement, evaluation and interventions.{note}", "",
        f"**Budget (every arm):** preset `{PRESET}` (`packages/vae/loopvae/configs/{PRESET}.yaml`): {p['max_steps']} "
        f"AdamW steps of {p['batch_size']} random {p['resolution']}² crops (shorter side resized to "
        f"{p['scale_jitter']}× the crop first), lr {p['lr']} ({p['warmup_steps']} warm-up steps, cosine to "
        f"{p['min_lr_ratio']}×), L1 + {p['kl_weight']} KL, latent noise {p['latent_noise_std']}, EMA {p['ema_decay']} "
        f"(evaluated), fp32. **Data:** {r['num_train']} training images (the shared ImageNet sample without the "
        f"{r['num_holdout']} held-out images — every 20th by sorted key — plus kodim01–20 from `assets/kodak`); "
        "evaluation at 256² (shorter side resized, centre crop) on kodim21–24 and the held-out ImageNet images, "
        f"posterior mode, uint8 outputs ([metric protocol](evaluation.md)). LPIPS: {lpips}. rFID is not reported: 4 "
        "or 40 images cannot estimate it.", ""]


def reconstruction(page: Page, r: dict[str, Any]) -> list[str]:
    ev, groups, n0 = r["eval"], r["groups"], r["groups"]["global"][0]
    body = [[g, ", ".join(names), f"{r['params'][g] / 1e6:.3f}M", f"{r['gmacs'][g]:.2f}", f"{r['throughput'][g]:.1f}",
             *[mean_sd([ev[n][s][m] for n in names], 2 if m == "psnr" else 4) for s in ("kodak", "imagenet")
               for m in ("psnr", "ssim")]] for g, names in groups.items()]
    for split, label in (("kodak", "kodim21–24"), ("imagenet", "held-out ImageNet")):
        b = ev[n0][split]["baseline"]
        cells, blank = [f"{b['psnr']:.2f}", f"{b['ssim']:.4f}"], ["–", "–"]
        body.append([f"bicubic via {b['low_resolution'][0]}×{b['low_resolution'][1]} ({label})", "–", "0", "–", "–",
                     *(cells + blank if split == "kodak" else blank + cells)])
    vpp = 3 * ev[n0]["kodak"]["baseline"]["low_resolution"][0] ** 2 / 256**2
    return ["## Reconstruction at a matched budget", "",
            "Mean ± seed s.d. where an arm has two seeds. *train img/s*: training images per second of each "
            "architecture measured side by side in one process (batch and crops of the budget, 2 threads).", "",
            *md_table(["arm", "runs", "params", "GMACs @256²", "train img/s", "kodim21–24 PSNR", "SSIM",
                       "held-out ImageNet PSNR", "SSIM"], body, "llrrrrrrr"), "",
            f"The bicubic baseline keeps {vpp:.3f} values per pixel, the f8 16-channel latents 0.250.", "",
            *(std.curves(page, y="l1", name="training_l1.png") or  # the migrated runs kept no curve: the old figure
              ["## Learning curves", "", "![training L1](study_loopvae/training_l1.png)", ""])]


def interventions(page: Page, r: dict[str, Any]) -> list[str]:
    iv, folder = r["interventions"][BEST], page.store.docs / BEST
    if page.draw:
        from loopvae.intervene import plot, render_markdown

        folder.mkdir(exist_ok=True)
        plot(iv, folder)
        (folder / "interventions.md").write_text(render_markdown(iv))
    base, one = iv["baseline"], lp.stage(iv, "decoder", "2x")["prefix"][0]
    paper = ["**paper** decoder", "2x", 4, f"{PAPER_PREFIX_DEC2X[0]} / -1.04 (96.7%)", *PAPER_PREFIX_DEC2X[1:],
             "3.7–13.2 (all stages)", "64/64 (all stages)", "224/224 (all stages)", "–"]
    lines = ["## Interventions (paper Table 7 side by side)", "",
             f"On `{BEST}` (seed 0 of the global arm, fixed in advance rather than picked on the reported images), "
             f"{iv['num_images']} images (kodim21–24 + held-out ImageNet), posterior mode. PSNR clipped / raw (dB) on "
             "the float output u in [0, 1] (clip(u) / u, the paper's protocol, not uint8), out-of-range pixels; the "
             "last three columns count images, as the paper does.", "", *lp.interventions_table(iv, [paper]), "",
             f"Baseline {base['psnr']:.2f} dB (raw {base['raw_psnr']:.2f}), {100 * base['out_of_range']:.2f}% out of "
             f"range, clipping displacement {base['clip_displacement']:.4f}; one decoder-2x pass: displacement "
             f"{one['clip_displacement']:.4f}. Relative updates per pass: [{BEST}/interventions.md]"
             f"(study_loopvae/{BEST}/interventions.md).", "",
             f"![prefix truncation](study_loopvae/{BEST}/psnr_vs_passes.png)", "",
             f"![bypass loss](study_loopvae/{BEST}/bypass_loss.png)", ""]
    if DS not in r["interventions"]:
        return lines
    return [*lines, "### Deep supervision on the decoder's finest-stage passes (beyond the paper)", "",
            "`deep_supervision_weight=1.0`: every earlier decoder-2x pass is also decoded by the output head and "
            "given the L1 loss (pass k of 4 weighted k/4). Decoder-2x prefix, clipped / raw PSNR (out of range):", "",
            *md_table(["run", "k=1", "k=2", "k=3", "k=4 (full)"], [[n, *lp.prefix_cells(lp.stage(
                r["interventions"][n], "decoder", "2x"))] for n in (BEST, DS)], "lllll"), ""]


def reading(r: dict[str, Any]) -> list[str]:
    """Sentences computed from the measured numbers (``r``: :func:`view`), each with the rule it was decided by."""
    ev, groups, params, gmacs, wall, best = r["eval"], r["groups"], r["params"], r["gmacs"], r["timings"]["train"], \
        r["bundled"]["name"]

    def values(group: str, split: str) -> list[float]:
        return [ev[n][split]["psnr"] for n in groups[group]]

    def by_seed(a: str, b: str, split: str) -> str:
        """Arm ``a`` minus arm ``b`` (PSNR), paired by the seeds both ran."""
        sa, sb = ({int(n.rsplit("-s", 1)[1]): n for n in groups[g]} for g in (a, b))
        seeds = sorted(set(sa) & set(sb))
        return paired_difference([ev[sa[k]][split]["psnr"] for k in seeds],
                                 [ev[sb[k]][split]["psnr"] for k in seeds]).describe()

    lines = ["## Reading (computed from the tables above)", "",
             "Every comparison is paired (by seed between arms, by image within a model), with a 95% t-interval "
             "(df = pairs − 1). The seed is the unit of every verdict: a comparison paired by seed gets one of three, "
             "**better** / **worse** (the interval excludes 0) or **inconclusive** (it does not, or there is one "
             "pair and no interval), never \"equal\". Pairs by image compare single runs, one per model: their "
             "interval covers image-to-image variation, not seed-to-seed, so it is descriptive and carries no "
             "verdict.", ""]
    spread = max(max(values("global", s)) - min(values("global", s)) for s in ("kodak", "imagenet"))
    for split, label in (("kodak", "kodim21-24"), ("imagenet", f"{r['num_holdout']} held-out ImageNet images")):
        ref = values("reference", split)
        lines.append(
            f"- **Weights vs quality ({label}).** Global LoopVAE ({params['global'] / 1e6:.2f}M parameters, "
            f"{gmacs['global']:.2f} GMACs) {mean_sd(values('global', split))} dB, FLUX-layout reference "
            f"({params['reference'] / 1e6:.2f}M, {gmacs['reference']:.2f} GMACs) {mean_sd(ref)} dB; LoopVAE − "
            f"reference paired by seed: {by_seed('global', 'reference', split)}."
            + (f" ⚠ The reference's seeds differ by {max(ref) - min(ref):.2f} dB (the LoopVAE's by {spread:.2f}): one "
               "of them is likely a failed run, so its mean is not a reliable reference.")
            * seeds_disagree(ref, spread))
    g_wall, r_wall = ([wall[n] for n in groups[g] if n in wall] for g in ("global", "reference"))
    if g_wall and r_wall:
        g, f, p = statistics.fmean(g_wall), statistics.fmean(r_wall), r["preset"]
        lines.append(f"- **Matched budget.** Both arms saw the same images ({p['max_steps'] * p['batch_size']:,} crops "
                     f"of {p['resolution']}² each); in wall time the LoopVAE runs took {g:.0f} s and the reference's "
                     f"{f:.0f} s ({g / f:.1f}×, one core each): matched in images seen, not in time.")
    bic = statistics.fmean(ev[n]["kodak"]["baseline"]["psnr"] for n in groups["global"])
    margin, iv = ev[best]["kodak"]["psnr"] - bic, r["interventions"][best]
    sharing = ", ".join(f"{g} {statistics.fmean(values(g, 'imagenet')):.2f} dB" for g in ("global", "scale", "none"))
    one, base, looped = lp.stage(iv, "decoder", "2x")["prefix"][0], iv["baseline"]["psnr"], [
        st for st in iv["stages"] if st["passes"] > 1]
    last = [f"{st['branch']} {st['scale']}" for st in looped
            if (w := lp.per_image_criteria(iv, st)["worst"]).index(max(w)) == st["passes"] - 1]
    lines += [
        f"- **Against bicubic (kodim21-24).** {best} is {margin:+.2f} dB from the bicubic baseline ({bic:.2f} dB at "
        f"≥ equal values per pixel; mean over images); the project's target is ≥ +1.0 dB: "
        f"{'met' if margin >= 1.0 else 'not met'}.",
        f"- **Sharing.** Held-out ImageNet PSNR: {sharing} ({params['global'] / 1e6:.2f}M / "
        f"{params['scale'] / 1e6:.2f}M / {params['none'] / 1e6:.2f}M parameters, equal MACs). scale and none ran one "
        "seed each, so every sharing comparison is **inconclusive** (one pair, no interval); no order is claimed. "
        f"The paper (Transformer, stage 1) orders them {PAPER_SHARING_ORDER}.",
        f"- **Shortcuts (our addition).** Shortcuts − plain on held-out ImageNet, paired by seed: "
        f"{by_seed('shortcuts', 'global', 'imagenet')} (one seed; the release below measures the shortcut model per "
        "image).",
        f"- **Interventions, per image as the paper counts them** ({best}, {iv['num_images']} images; the table's last "
        f"three columns): the worst bypass is the last pass in {len(last)} of the {len(looped)} looped stages "
        f"({', '.join(last) or 'none'}); the paper's is not the last pass.",
        f"- **Truncation.** One decoder-2x pass costs {base - one['psnr']:.2f} dB (target ≥ 5 dB: "
        f"{'met' if base - one['psnr'] >= 5 else 'not met'}; paper 17.74).",
        f"- **Out-of-range colours at an early exit.** With one decoder-2x pass {100 * one['out_of_range']:.1f}% of "
        f"pixels are out of range (full depth {100 * iv['baseline']['out_of_range']:.1f}%; paper 96.7%), raw PSNR "
        f"{one['raw_psnr']:.2f} dB against {one['psnr']:.2f} clipped (paper −1.04 raw), clipping displacement "
        f"{one['clip_displacement']:.4f} (full depth {iv['baseline']['clip_displacement']:.4f})."]
    if DS in r["interventions"] and best in r["interventions"]:
        ds, plain = (lp.stage(r["interventions"][n], "decoder", "2x")["prefix"] for n in (DS, best))
        exits = [paired_difference(d["per_image"]["psnr"], p["per_image"]["psnr"]) for d, p in zip(ds, plain)]
        lines.append("- **Deep supervision (beyond the paper).** Deeply supervised − plain (seed 0 of each, one run per"
                     f" model: descriptive), paired by image, with k = 1..{len(exits)} decoder-2x passes: "
                     + "; ".join(f"k={k + 1}: {e.describe(verdict=False)}" for k, e in enumerate(exits)) + ". "
                     + lp.anytime_reading(r["interventions"][DS]))
    return [*lines, ""]


def model(r: dict[str, Any]) -> list[str]:
    b = r["bundled"]
    return ["## The study's model", "",
            f"`{b['name']}` (EMA weights, {b['params']:,} parameters, `diffusion_pytorch_model.safetensors` sha256 "
            f"`{b['sha256']}`) was the bundled model until `make release-vae` replaced it (below). Reproduce it: "
            f"`make study-vae`, or the single run: `loopvae train --config {PRESET} --data <the study's training "
            f"shards> --out RUN --set {' '.join(b['overrides'])}`.", ""]


STUDY = Study(
    name="vae", title="LoopVAE at CPU scale: does the recurrence do work?", docs="docs/study_loopvae",
    page="docs/study_loopvae.md", arms=ARMS, budgets=[Budget(PRESET, seeds=(0, 1), steps=2200)],
    metric=Metric("imagenet_psnr", "dB"), run=run, row=row, prepare=prepare, preregistration=None,
    phases=[Phase("study", plan, registered=False), Phase("throughput", lambda study, records: [
        PlannedRun("throughput", "throughput", "throughput", PRESET, 0)], registered=False)],
    sections=[std.header, body, lambda page: lp.included(release_vae.STUDY, page)],
    command="make study-vae",
)
