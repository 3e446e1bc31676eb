"""The LoopVAE study at CPU scale: does the recurrence do work? -> ``docs/study_loopvae.md`` (``make study-vae``).

Every arm trains at preset ``study-tiny`` (``loopvae-cnn-tiny`` at sharing ``global`` / ``scale`` / ``none``, with
shortcuts, with deep supervision; ``flux-vae-tiny``), is evaluated at 256^2 on kodim21-24 and 40 held-out ImageNet
images and, for two runs fixed in advance, intervened; phase ``throughput`` times every architecture side by side.
The page includes the release's (``release_vae.py``). Options ``steps=N``, ``shared=DIR``; prose in ``text.md``.
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
import torch
from _loopvae_pages import text

import loopdata
from looprun.checkpoint import sha256_file
from looprun.release import release_weights_file
from looprun.statistics import paired_difference, seeds_disagree
from looprun.study import Arm, Budget, Metric, Phase, PlannedRun, RunContext, Study
from looprun.study import page as std
from looprun.study.page import Page
from looprun.study.tables import md_table, mean_sd
from loopvae.perceptual import default_backbone_path
from loopvae.train_config import load_train_config

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
        return [*text("vae-waiting"), ""]
    return [*intro(r), *reconstruction(page, r), *interventions(page, r), *reading(r), *model(r)]


def intro(r: dict[str, Any]) -> list[str]:
    inv = r["invocation"] or {"command": "loopvae study vae", **r, "train_wall": sum(r["timings"]["train"].values())}
    how = f"{inv['jobs']} runs at a time with {inv['threads']} thread(s) each" if "jobs" in inv else "summed over runs"
    return [*text("vae-intro", inv=inv, r=r, p=r["preset"], preset=PRESET, date=inv["date"][:10],
                  total=(inv["train_wall"] + r["post_s"]) / 60, train=inv["train_wall"] / 60, post=r["post_s"] / 60,
                  how=how, note=f" Interrupted once: {inv['interrupted']['note']}." if "interrupted" in inv else "",
                  lpips="not computed (AlexNet weights absent)" if r["lpips_net"] == "none" else
                  "(AlexNet) in the result files"), ""]


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
    table = md_table(["arm", "runs", "params", "GMACs @256²", "train img/s", "kodim21–24 PSNR", "SSIM",
                      "held-out ImageNet PSNR", "SSIM"], body, "llrrrrrrr")
    vpp = 3 * ev[n0]["kodak"]["baseline"]["low_resolution"][0] ** 2 / 256**2
    curves = std.curves(page, y="l1", name="training_l1.png") or [*text("vae-old-curves"), ""]  # migrated: no curve
    return [*text("vae-reconstruction", table=table, vpp=vpp), "", *curves]


def interventions(page: Page, r: dict[str, Any]) -> list[str]:
    iv, folder = r["interventions"][BEST], page.store.docs / BEST
    if page.draw:
        from loopvae.intervene import plot, render_markdown

        folder.mkdir(exist_ok=True)
        plot(iv, folder)
        (folder / "interventions.md").write_text(render_markdown(iv))
    paper = ["**paper** decoder", "2x", 4, f"{PAPER_PREFIX_DEC2X[0]} / -1.04 (96.7%)", *PAPER_PREFIX_DEC2X[1:],
             "3.7–13.2 (all stages)", "64/64 (all stages)", "224/224 (all stages)", "–"]
    lines = [*text("vae-interventions", best=BEST, iv=iv, table=lp.interventions_table(iv, [paper]),
                   base=iv["baseline"], out_of_range=100 * iv["baseline"]["out_of_range"],
                   one=lp.stage(iv, "decoder", "2x")["prefix"][0]), ""]
    if DS not in r["interventions"]:
        return lines
    return [*lines, *text("vae-deep-supervision", table=md_table(["run", "k=1", "k=2", "k=3", "k=4 (full)"], [
        [n, *lp.prefix_cells(lp.stage(r["interventions"][n], "decoder", "2x"))] for n in (BEST, DS)], "lllll")), ""]


def reading(r: dict[str, Any]) -> list[str]:
    """Sentences computed from the measured numbers (``r``: :func:`view`), each with the rule it was decided by."""
    ev, groups, best, m = r["eval"], r["groups"], r["bundled"]["name"], {g: v / 1e6 for g, v in r["params"].items()}

    def values(group: str, split: str) -> list[float]:
        return [ev[n][split]["psnr"] for n in groups[group]]

    def by_seed(a: str, b: str, split: str) -> str:
        """Arm ``a`` minus arm ``b`` (PSNR), paired by the seeds both ran."""
        sa, sb = ({int(n.rsplit("-s", 1)[1]): n for n in groups[g]} for g in (a, b))
        seeds = sorted(set(sa) & set(sb))
        return paired_difference([ev[sa[k]][split]["psnr"] for k in seeds],
                                 [ev[sb[k]][split]["psnr"] for k in seeds]).describe()

    spread, weights = max(max(values("global", s)) - min(values("global", s)) for s in ("kodak", "imagenet")), []
    for split, label in (("kodak", "kodim21-24"), ("imagenet", f"{r['num_holdout']} held-out ImageNet images")):
        ref = values("reference", split)
        warning = text("vae-weights-warning", ref_spread=max(ref) - min(ref), spread=spread)[0]
        weights += text("vae-weights", label=label, m=m, gmacs=r["gmacs"], ours=mean_sd(values("global", split)),
                        ref=mean_sd(ref), diff=by_seed("global", "reference", split),
                        warning=warning * seeds_disagree(ref, spread))
    wall, matched = r["timings"]["train"], []
    g_wall, r_wall = ([wall[n] for n in groups[g] if n in wall] for g in ("global", "reference"))
    if g_wall and r_wall:
        g, f, p = statistics.fmean(g_wall), statistics.fmean(r_wall), r["preset"]
        matched = text("vae-matched", crops=p["max_steps"] * p["batch_size"], p=p, ours=g, ref=f, ratio=g / f)
    bicubic = statistics.fmean(ev[n]["kodak"]["baseline"]["psnr"] for n in groups["global"])
    margin, iv = ev[best]["kodak"]["psnr"] - bicubic, r["interventions"][best]
    one, looped = lp.stage(iv, "decoder", "2x")["prefix"][0], [st for st in iv["stages"] if st["passes"] > 1]
    last = [f"{st['branch']} {st['scale']}" for st in looped
            if (w := lp.per_image_criteria(iv, st)["worst"]).index(max(w)) == st["passes"] - 1]
    deep = []
    if DS in r["interventions"] and best in r["interventions"]:
        ds, plain = (lp.stage(r["interventions"][n], "decoder", "2x")["prefix"] for n in (DS, best))
        exits = [paired_difference(d["per_image"]["psnr"], p["per_image"]["psnr"]) for d, p in zip(ds, plain)]
        deep = text("vae-deep", passes=len(exits), anytime=lp.anytime_reading(r["interventions"][DS]),
                       exits="; ".join(f"k={k + 1}: {e.describe(verdict=False)}" for k, e in enumerate(exits)))
    cost = iv["baseline"]["psnr"] - one["psnr"]
    return [*text("vae-reading", weights=weights, matched=matched, deep=deep, best=best, margin=margin,
                     bicubic=bicubic, margin_met="met" if margin >= 1.0 else "not met", m=m, iv=iv, one=one,
                     sharing=", ".join(f"{g} {statistics.fmean(values(g, 'imagenet')):.2f} dB"
                                       for g in ("global", "scale", "none")), paper_order=PAPER_SHARING_ORDER,
                     shortcuts=by_seed("shortcuts", "global", "imagenet"), last_count=len(last), looped=len(looped),
                     last=", ".join(last) or "none", cost=cost, cost_met="met" if cost >= 5 else "not met",
                     one_range=100 * one["out_of_range"], full_range=100 * iv["baseline"]["out_of_range"]), ""]


def model(r: dict[str, Any]) -> list[str]:
    b = r["bundled"]
    return [*text("vae-model", b=b, preset=PRESET, overrides=" ".join(b["overrides"])), ""]


STUDY = Study(
    name="vae", title="LoopVAE at CPU scale: does the recurrence do work?", docs="docs/study_loopvae",
    page="docs/study_loopvae.md", arms=ARMS, budgets=[Budget(PRESET, seeds=(0, 1), steps=2200)],
    metric=Metric("imagenet_psnr", "dB"), run=run, row=row, prepare=prepare, preregistration=None,
    phases=[Phase("study", plan, registered=False), Phase("throughput", lambda study, records: [
        PlannedRun("throughput", "throughput", "throughput", PRESET, 0)], registered=False)],
    sections=[std.header, body, lambda page: lp.included(release_vae.STUDY, page)],
    command="make study-vae",
)
