"""Where should the loops go? The matched-budget schedule study -> ``docs/study_schedule.md``.

A *main* run (``runs/<arm>-s<seed>.json``) trains one pass schedule (or the reference) at one seed on the release
recipe, evaluates it per image and intervenes on a LoopVAE; the *measure* run (``runs/measure.json``) then times the
arms side by side and measures any-time decoding. No comparison was pre-registered: every verdict is exploratory.
Options: ``shared``, ``data_dir`` (the data split); ``steps``, ``eval_limit`` (smoke runs: steps, images).
"""

from __future__ import annotations

import functools
import itertools
import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import _vae_runs as vr
import torch
from _text import paragraph

from looprun.statistics import paired_difference
from looprun.study import Arm, Budget, Metric, Phase, PlannedRun, RunContext, Study
from looprun.study import page as std
from looprun.study.tables import md_table

PRESET, STEPS, REFERENCE = "release-tiny", 1500, "flux-vae-tiny"  # 1,500 steps: a fifth of the release run
HELD_OUT = ("kodak", "imagenet")  # kodim21-24, then the 40 held-out ImageNet-sample images
WEIGHT_CAP = 1 / 3  # the dominance criterion: <= 1/3 of the reference's weights
ANYTIME = ([1, 2, 4], [1, 2, 3], [1, 2, 2], [1, 2, 1], [1, 1, 1])  # decoder schedules, full depth first
ROUNDS, ITERS = 7, 2  # side-by-side timing: alternating rounds of ITERS calls each
say = functools.partial(paragraph, Path(__file__).resolve().parents[1] / "docs/study_schedule/text.md")  # prose


def _arm(name: str, label: str, decoder: list[int] | None, seeds: list[int], *extra: str) -> Arm:
    """A LoopVAE arm (encoder passes [1, 2, 4] fine -> coarse, ``decoder`` coarse -> fine) or the reference."""
    model = {} if decoder is None else {"shortcuts": True, "encoder_passes": [1, 2, 4], "decoder_passes": decoder}
    return Arm(name, label, {"model": "loopvae-cnn-tiny" if decoder else REFERENCE, "model_overrides": model,
                             "seeds": seeds, "extra": list(extra)})


# The arms the dominance question rests on (paper, dec-1-2-1, the reference) have three seeds, dec-1-2-2 two.
ARMS = [_arm("paper-ds", "paper schedule + deep supervision 0.25 of the finest decoder passes", [1, 2, 4], [0],
             "deep_supervision_weight=0.25"),
        _arm("paper", "paper: decoder 8x/4x/2x = 1/2/4", [1, 2, 4], [0, 1, 2]),
        _arm("dec-2-2-2", "uniform decoder 2/2/2", [2, 2, 2], [0]),
        _arm("dec-1-2-2", "finest stage cut to 2 passes", [1, 2, 2], [0, 1]),
        _arm("dec-2-4-1", "deeper coarse: 2/4/1 (7 passes, finest moved to 8x/4x)", [2, 4, 1], [0]),
        _arm("dec-4-2-1", "coarse-heavy decoder 4/2/1", [4, 2, 1], [0]),
        _arm("dec-1-2-1", "finest stage cut to 1 pass", [1, 2, 1], [0, 1, 2]),
        _arm(REFERENCE, "reference AutoencoderKL (FLUX layout)", None, [0, 1, 2])]


def overrides(settings: dict[str, Any], seed: int, steps: int) -> list[str]:
    """``loopvae train --set`` items of one run (validation and checkpoints every third of the run)."""
    flow = "{" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in settings["model_overrides"].items()) + "}"
    recipe = [*(["warmup_steps=1"] if steps < 200 else []), *settings["extra"]]
    return vr.train_overrides(settings["model"], flow, steps, recipe, seed)


# -- the runs ----------------------------------------------------------------------------------------
def prepare(context: RunContext) -> dict[str, Any]:
    data_dir = Path(context.options.get("data_dir", "runs/release-vae/data"))
    return {"data": asdict(vr.release_data(context.options.get("shared"), data_dir, "the schedule study"))}


def run(planned: PlannedRun, context: RunContext) -> dict[str, Any]:
    """A main run: train, evaluate per image, count params / GMACs, intervene on a LoopVAE; or the measure run."""
    if planned.phase == "measure":
        return measure(planned, context)
    s, opts, out = planned.settings, context.options, context.workdir / "train"
    data, steps = vr.StudyData(**opts["data"]), int(opts.get("steps", STEPS))
    record = vr.train_and_evaluate("train", out, data, PRESET, overrides(s, planned.seed, steps))
    if record["status"] != "finished":
        return record
    params, gmacs = vr.model_counts(s["model"], s["model_overrides"])
    record.update(quality=seed_quality(record.pop("evaluation")), params=params, gmacs=gmacs)
    if s["model_overrides"]:
        images, keys = vr.intervention_images(data.kodak_val, data.imagenet_holdout, int(opts.get("eval_limit", 16)))
        interventions = vr.run_interventions_on(out, images, keys, vr.Timings(context.workdir / "timings.json"))
        record["interventions"] = intervention_summary(interventions)
    return record


def seed_quality(evaluation: dict[str, Any]) -> dict[str, Any]:
    """One run's held-out PSNR (dB) / SSIM: pooled, per set, per image (kodak, then ImageNet), and bicubic's."""
    rows = [dict(r, split=k) for k in HELD_OUT for r in evaluation[k]]
    mean = lambda key, split=None: statistics.fmean(r[key] for r in rows if split in (None, r["split"]))
    return {"psnr": mean("psnr"), "ssim": mean("ssim"), **{f"psnr_{k}": mean("psnr", k) for k in HELD_OUT},
            "keys": [f"{r['split']}/{r['key']}" for r in rows], "per_image_psnr": [r["psnr"] for r in rows],
            "per_image_ssim": [r["ssim"] for r in rows], "bicubic_psnr": mean("bicubic_psnr")}


def time_side_by_side(fns: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Median / min / max ms per call of each function: a warm-up, then alternating rounds in this process."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for rnd, (name, fn) in itertools.product(range(ROUNDS + 1), fns.items()):  # round 0: the warm-up
        start = time.perf_counter()
        for _ in range(ITERS if rnd else 1):
            fn()
        times[name] += [1000 * (time.perf_counter() - start) / ITERS] if rnd else []
    return {k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in times.items()}


def anytime_table(models: dict[str, Any], images: torch.Tensor) -> dict[str, list[dict[str, Any]]]:
    """Per model and decoder schedule: held-out PSNR (uint8, per image), decode GMACs and CPU ms (side by side)."""
    from loopcore.flops import count_macs
    from loopvae.metrics import psnr_per_image, to_uint8

    out, fns = {}, {}
    for name, model in models.items():
        z = torch.cat([model.encode(x).latent_dist.mode() for x in images.split(8)])
        z1, out[name] = model.encode(images[:1]).latent_dist.mode(), []
        for s in ANYTIME:
            fns[f"{name} {s}"] = lambda m=model, s=s, z=z1: m.decode(z, decoder_passes=s)
            recon = torch.cat([model.decode(x, decoder_passes=s).sample for x in z.split(8)])
            psnr = psnr_per_image(to_uint8(recon), to_uint8(images))
            out[name].append({"decoder_passes": s, "psnr": float(psnr.mean()), "per_image_psnr": psnr.tolist(),
                              "decode_gmacs": count_macs(fns[f"{name} {s}"]) / 1e9})
    timed = time_side_by_side(fns)
    return {n: [{**r, "decode_ms": timed[f"{n} {r['decoder_passes']}"]} for r in rows] for n, rows in out.items()}


@torch.no_grad()
def measure(planned: PlannedRun, context: RunContext) -> dict[str, Any]:
    """What needs every arm at once: CPU ms of encode -> mode -> decode (256^2, batch 1, 2 threads) of each arm's
    first seed side by side; any-time decoding; the arms' mean training seconds; the release run's steps and
    validation curve; dcae-tiny's GMACs (the tuned reference of the fair study)."""
    from loopcore.modulation import set_fused_blocks
    from looprun.speed import prepare_for_speed
    from loopvae.demo import bundled_model_dir
    from loopvae.loading import load_artifact
    from loopvae.train_config import load_train_config

    vr.keep_freed_memory_mapped()
    torch.set_num_threads(2)
    arms, base, opts = planned.settings["arms"], context.workdir.parent, context.options
    load = lambda folder: set_fused_blocks(prepare_for_speed(load_artifact(folder).eval(), "contiguous"), True)
    models = {arm: load(base / ids[0] / "train" / "release") for arm, ids in arms.items()}
    x, start = torch.rand(1, 3, 256, 256) * 2 - 1, time.perf_counter()
    cpu = time_side_by_side({a: lambda m=m: m.decode(m.encode(x).latent_dist.mode()) for a, m in models.items()})
    post, start = {"cpu timing": round(time.perf_counter() - start, 1)}, time.perf_counter()
    data = vr.StudyData(**opts["data"])
    images, _ = vr.intervention_images(data.kodak_val, data.imagenet_holdout, int(opts.get("eval_limit", 10**6)))
    picked = {ids[0]: models[a] for a, ids in arms.items() if a in ("paper-ds", "paper")}
    anytime = anytime_table({**picked, "bundled loopvae-cnn-tiny": load(bundled_model_dir())}, images)
    post["any-time decoding"] = round(time.perf_counter() - start, 1)
    train_s = lambda i: json.loads((base / i / "train" / "train_summary.json").read_text())["train_seconds"]
    release = context.root / "docs/study_loopvae/release/runs/loopvae-s0.json"  # the bundled model's run
    curve = json.loads(release.read_text())["curve"]  # its validation curve (a missing file is an error, not [])
    return {"cpu_ms": cpu, "anytime": anytime, "num_images": len(images), "timings": {"post": post},
            "train_seconds": {a: statistics.fmean(map(train_s, ids)) for a, ids in arms.items()},
            "release_steps": load_train_config(PRESET).max_steps, "release_curve": curve,
            "dcae_tiny_gmacs": vr.model_counts("dcae-tiny", {})[1]}


def plan_main(study: Study, results: dict[str, Any]) -> list[PlannedRun]:
    return [p for p in study.grid() if p.seed in p.settings["seeds"]]


def plan_measure(study: Study, results: dict[str, Any]) -> list[PlannedRun]:
    """The measure run once every main run has finished; its settings: per arm (spec order) its runs by seed."""
    main, arms = plan_main(study, results), {}
    for p in main:  # the grid is seed-major: the arms enter in spec order
        arms.setdefault(p.arm, []).append(p.id)
    done = all(results.get(p.id, {}).get("status") == "finished" for p in main)
    return [PlannedRun("measure", "measure", "measure", study.budgets[0].name, 0, {"arms": arms})] if done else []


# -- readings ----------------------------------------------------------------------------------------
def intervention_summary(result: dict[str, Any]) -> dict[str, Any]:
    """Decoder finest stage (2x): PSNR per retained passes, raw PSNR / out-of-range with one pass; per image, how
    many images improve at every added pass and are hurt by every bypass (over all multi-pass stages)."""
    base, stages, psnr = result["baseline"]["per_image"]["psnr"], result["stages"], result["baseline"]["psnr"]
    fine = next(s for s in stages if s["branch"] == "decoder" and s["scale"] == "2x")
    prefix, n = [p["per_image"]["psnr"] for p in fine["prefix"]], range(len(base))
    bypasses = [(s, b) for s in stages if s["passes"] > 1 for b in s["bypass"]]
    worst = max(bypasses, key=lambda sb: psnr - sb[1]["psnr"], default=None)
    return {"images": len(base), "baseline_psnr": psnr, "fine_passes": fine["passes"],
            "fine_prefix_psnr": [p["psnr"] for p in fine["prefix"]],
            "fine_prefix_raw_psnr": [p["raw_psnr"] for p in fine["prefix"]],
            "fine_one_pass_out_of_range": fine["prefix"][0]["out_of_range"],
            "images_rising_at_every_fine_pass": sum(all(a[i] < b[i] for a, b in zip(prefix, prefix[1:])) for i in n)
            if fine["passes"] > 1 else None, "bypasses": len(bypasses),
            "images_hurt_by_every_bypass": sum(all(b["per_image"]["psnr"][i] < base[i] for _, b in bypasses)
                                               for i in n) if bypasses else None,
            "worst_bypass": worst and {"stage": f"{worst[0]['branch']} {worst[0]['scale']}",
                                       "pass": worst[1]["pass"] + 1, "psnr_loss": psnr - worst[1]["psnr"]},
            "last_pass_is_worst": worst and worst[1]["pass"] + 1 == worst[0]["passes"]}


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """``a - b`` of two arms' qualities: by seed (the seeds both ran) and by image (each arm's mean over seeds)."""
    if len({tuple(s["keys"]) for q in (a, b) for s in q["seeds"].values()}) != 1:
        raise RuntimeError("the arms' seeds were evaluated on different images; paired comparisons need the same ones")
    shared = sorted(set(a["seeds"]) & set(b["seeds"]))
    by_image = lambda q, key: [statistics.fmean(v) for v in zip(*(s[key] for s in q["seeds"].values()))]
    return {"seeds": shared, **{f"by_{how}_{m}": paired_difference(*pair).as_dict() for m in ("psnr", "ssim") for
                                how, pair in (("seed", [[q["seeds"][s][m] for s in shared] for q in (a, b)]),
                                              ("image", [by_image(q, f"per_image_{m}") for q in (a, b)]))}}


def same_configuration_pairs(rows: dict[str, Any]) -> list[dict[str, Any]]:
    """Null rows: every pair of seeds of one arm, paired by image (two runs that differ only in their seed)."""
    return [{"arm": name, "a": a, "b": b, "loopvae": r["encoder_passes"] is not None, "diff": paired_difference(
        r["quality"]["seeds"][a]["per_image_psnr"], r["quality"]["seeds"][b]["per_image_psnr"]).as_dict()}
            for name, r in rows.items() for a, b in itertools.combinations(sorted(r["quality"]["seeds"], key=int), 2)]


def pareto_set(rows: dict[str, Any]) -> list[str]:
    """Arms no other arm matches or beats on (fewer params, fewer GMACs, higher mean PSNR), strictly on one."""
    from loopvae.profile import pareto_front

    return pareto_front({n: (r["params"], r["gmacs"], r["quality"]["psnr"]) for n, r in rows.items()})


def dominance(rows: dict[str, Any], reference: str) -> dict[str, Any]:
    """Per LoopVAE arm, the three criteria against the reference; PSNR counts only *better* paired by seed (the
    seed carries the training noise), the by-image mean is descriptive."""
    ref, out = rows[reference], {}
    for name, r in ((n, r) for n, r in rows.items() if n != reference):
        verdict = r["vs_reference"]["by_seed_psnr"]["verdict"]
        d = {"weights_ratio": r["params"] / ref["params"], "weights_ok": r["params"] <= WEIGHT_CAP * ref["params"],
             "macs_ratio": r["gmacs"] / ref["gmacs"], "macs_ok": r["gmacs"] <= ref["gmacs"],
             "time_ratio": r["cpu_ms"]["median"] / ref["cpu_ms"]["median"], "psnr_by_seed": verdict,
             "psnr_by_image_mean": r["vs_reference"]["by_image_psnr"]["mean"], "psnr_ok": verdict == "better"}
        out[name] = {**d, "dominates": d["weights_ok"] and d["macs_ok"] and d["psnr_ok"],
                     "dominates_but_weights": d["macs_ok"] and d["psnr_ok"]}
    return out


def _fmt_diff(d: dict[str, Any], verdict: bool = True) -> str:
    """A paired difference in dB; ``verdict=False`` for a descriptive one (paired by image: no verdict word)."""
    if d["low"] is None:
        return f"{d['mean']:+.2f} dB (n = {d['n']}, no interval)" + (f": {d['verdict']}" if verdict else "")
    text = f"{d['mean']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}] (n = {d['n']}; {d['wins']}/{d['n']} higher)"
    return text + (f": **{d['verdict']}**" if verdict else "")


_by_image = lambda d: _fmt_diff(d, verdict=False) + ", descriptive"
_span = lambda vs: f"{min(vs):+.2f}" + ("" if f"{min(vs):+.2f}" == f"{max(vs):+.2f}" else f" to {max(vs):+.2f}")


def null_rows_sentence(rows: dict[str, Any]) -> list[str]:
    """How often two seeds of one configuration, compared by image, give an interval that excludes 0."""
    pairs = same_configuration_pairs(rows)
    loop, decided = [p for p in pairs if p["loopvae"]], lambda ps: sum(p["diff"]["verdict"] != "inconclusive"
                                                                       for p in ps)
    if not pairs:
        return []
    widest = max(loop or pairs, key=lambda p: abs(p["diff"]["mean"]))
    counts = (f"{decided(loop)} of {len(loop)} LoopVAE seed pairs" + (
        f" ({decided(pairs)} of {len(pairs)} with the reference's)" if len(pairs) > len(loop) else "")
        if loop else f"{decided(pairs)} of {len(pairs)} seed pairs")
    return [say("null-rows", counts=counts, arm=widest["arm"], a=widest["a"], b=widest["b"],
                diff=_fmt_diff(widest["diff"], verdict=False))]


def pareto_sentences(rows: dict[str, Any], pareto: list[str]) -> list[str]:
    """Which mean-PSNR margins decide the Pareto membership (an arm at most as costly on both costs and at least as
    good on PSNR puts another off the set) and whether a seed-paired *better* resolves them."""
    psnr, q = {n: r["quality"]["psnr"] for n, r in rows.items()}, {n: r["quality"] for n, r in rows.items()}
    resolved = lambda hi, lo: bool(set(q[hi]["seeds"]) & set(q[lo]["seeds"])) and \
        compare(q[hi], q[lo])["by_seed_psnr"]["verdict"] == "better"
    noisy, settled, by_cost = [], [], []
    for name, r in rows.items():
        others = [y for y in rows if y != name and rows[y]["params"] <= r["params"] and rows[y]["gmacs"] <= r["gmacs"]]
        above = [y for y in others if psnr[y] >= psnr[name]]
        if name in pareto and not others:
            by_cost.append(name)
        elif name in pareto:
            text = f"{name} on it by {_span([psnr[name] - psnr[y] for y in others])} dB (over {', '.join(others)})"
            (settled if all(resolved(name, y) for y in others) else noisy).append(text)
        elif by_seed := [y for y in above if resolved(y, name)]:
            settled.append(f"{name} off it (behind {', '.join(by_seed)}, better paired by seed)")
        elif above:  # (off the set with no arm above it: a set computed elsewhere, nothing to qualify)
            noisy.append(f"{name} off it by {_span([psnr[y] - psnr[name] for y in above])} dB "
                         f"(behind {', '.join(above)})")
    sds = [q[n]["psnr_sd"] for n, r in rows.items() if q[n]["psnr_sd"] is not None and r["encoder_passes"]]
    return ([say("pareto-cost", arms=", ".join(by_cost))] * bool(by_cost)
            + [say("pareto-seed", items="; ".join(settled))] * bool(settled)
            + [say("pareto-mean", items="; ".join(noisy), noise=say("pareto-noise", low=min(sds), high=max(sds))
                   if sds else "")] * bool(noisy))


def reading(result: dict[str, Any]) -> list[str]:
    """The dominance statement and each arm's criteria, the Pareto set with its margins, the null rows and each
    LoopVAE arm against the paper schedule (``result``: rows, reference, dominance, pareto, dcae_tiny_gmacs)."""
    rows, ref, dom, dcae = result["rows"], result["reference"], result["dominance"], result["dcae_tiny_gmacs"]
    winners, two_axis = ([n for n, d in dom.items() if d[k]] for k in ("dominates", "dominates_but_weights"))
    ratios, cheap = [d["weights_ratio"] for d in dom.values()], [n for n, d in dom.items() if d["macs_ok"]]
    lines = [say("dominance", arms=", ".join(winners), reference=ref)] if winners else [
        say("no-dominance", reference=ref, cap=rows[ref]["params"] * WEIGHT_CAP, low=min(ratios), high=max(ratios),
            lightest=min(dom, key=lambda n: dom[n]["weights_ratio"])),
        say("two-axes", arms=", ".join(two_axis), reference=ref, dcae=dcae,
            weights=", ".join(format(dom[n]["weights_ratio"], ".3f") + "×" for n in two_axis),
            macs=", ".join(n + " " + format(rows[n]["gmacs"] / dcae, ".2f") + "×" for n in two_axis)) if two_axis
        else say("no-two-axes", why=say("cheap-not-better", arms=", ".join(cheap)) if cheap else say("none-cheap"))]
    lines += [say("criteria", arm=n, **d, weights="ok" if d["weights_ok"] else "over", macs="ok" if d["macs_ok"]
                  else "over", by_seed=_fmt_diff(rows[n]["vs_reference"]["by_seed_psnr"])) for n, d in dom.items()]
    lines += [say("pareto", arms=", ".join(result["pareto"])), *pareto_sentences(rows, result["pareto"]),
              *null_rows_sentence(rows)]
    return lines + [say("vs-paper", arm=n, macs=r["gmacs"] / rows["paper"]["gmacs"], by_image=_by_image(
        r["vs_paper"]["by_image_psnr"]), by_seed=_fmt_diff(r["vs_paper"]["by_seed_psnr"]))
                    for n, r in rows.items() if "vs_paper" in r]


def anytime_lines(result: dict[str, Any]) -> list[str]:
    """Per any-time model: does quality rise with the retained passes, and what the early exit [1, 2, 1] costs;
    each exit against the arm trained at its schedule; what deep supervision costs at full depth."""
    lines = []
    for name, rows in result["anytime"].items():
        psnrs, full = [r["psnr"] for r in rows], rows[0]  # full schedule first, then fewer passes
        cut = next(r for r in rows if r["decoder_passes"] == [1, 2, 1])
        lines.append(say("anytime-model", model=name, psnrs=" ← ".join(f"{p:.2f}" for p in psnrs),
                         rising="rises" if all(a > b for a, b in zip(psnrs, psnrs[1:])) else "does not rise",
                         change=cut["psnr"] - full["psnr"], macs=cut["decode_gmacs"] / full["decode_gmacs"],
                         time=cut["decode_ms"]["median"] / full["decode_ms"]["median"], by_image=_by_image(
                             paired_difference(cut["per_image_psnr"], full["per_image_psnr"]).as_dict())))
    lines += trained_at_exit_lines(result)
    if (ds := result["rows"].get("paper-ds")) is None:
        return lines
    paper = result["rows"]["paper"]
    spread = [abs(p["diff"]["mean"]) for p in same_configuration_pairs({"paper": paper})]
    return lines + [say("deep-supervision", diff=_by_image(ds["vs_paper"]["by_image_psnr"]), seeds=len(ds["seeds"]),
                        spread=say("deep-supervision-spread", spread=max(spread)) if spread else "",
                        time=ds["train_seconds"] / paper["train_seconds"])]


def trained_at_exit_lines(result: dict[str, Any]) -> list[str]:
    """Each early exit against the arm *trained* at that decoder schedule (the same decode arithmetic); each exit is
    one trained model, so it is set against the trained arm's seeds without a seed-paired interval."""
    lines = []
    for arm, r in result["rows"].items():
        q, schedule = r["quality"], list(r["decoder_passes"] or [])
        exits = {n: x for n, rows in result["anytime"].items() for x in rows[1:]  # rows[0] is the full depth
                 if list(x["decoder_passes"]) == schedule}
        seeds = [s["psnr"] for s in q["seeds"].values()]
        below, sd = [n for n, x in exits.items() if x["psnr"] < min(seeds)], q["psnr_sd"]
        lines += [say("trained-at-exit", schedule=schedule, arm=arm, psnr=q["psnr"], seeds=f"{len(seeds)} seed"
                      + "s" * (len(seeds) > 1) + ("" if sd is None else f", s.d. {sd:.2f}"), exits=", ".join(
                          f"{n} {x['psnr']:.2f} dB ({x['psnr'] - q['psnr']:+.2f})" for n, x in exits.items()),
                      verdict=say("exits-all-below" if len(below) == len(exits) else "exits-some-below",
                                  schedule=schedule, below=", ".join(below) or "none"))] * bool(exits)
    return lines


# -- the page ----------------------------------------------------------------------------------------
def arm_row(arm: Arm, runs: list[dict[str, Any]], measured: dict[str, Any]) -> dict[str, Any]:
    """One arm's row from its finished runs (by seed) and the measure run: settings, params / GMACs, CPU ms,
    training seconds, quality per seed (its run's) and over seeds (mean, s.d. of PSNR)."""
    seeds, model = {r["seed"]: r["quality"] for r in runs}, arm.settings["model_overrides"]
    psnrs, mean = [q["psnr"] for q in seeds.values()], lambda k: statistics.fmean(q[k] for q in seeds.values())
    return {"model": arm.settings["model"], "model_overrides": model, "change": arm.label,
            "encoder_passes": model.get("encoder_passes"), "decoder_passes": model.get("decoder_passes"),
            "seeds": list(seeds), "params": runs[0]["params"], "gmacs": runs[0]["gmacs"],
            "cpu_ms": measured["cpu_ms"][arm.name], "train_seconds": measured["train_seconds"][arm.name],
            "quality": {"seeds": seeds, "psnr": mean("psnr"), "psnr_sd": statistics.stdev(psnrs) if len(psnrs) > 1
                        else None, "ssim": mean("ssim"), **{f"psnr_{k}": mean(f"psnr_{k}") for k in HELD_OUT}}}


def result(page: Any) -> dict[str, Any] | None:
    """What the page reads (``None`` until the measure run has its file): the arms' rows in spec order with their
    comparisons against the reference and the paper schedule, the Pareto set and the dominance criteria."""
    m = page.records.get("measure")
    if m is None or m.get("status") != "finished":
        return None
    rows = {arm: arm_row(page.study.arm(arm), [page.records[i] for i in ids], m)
            for arm, ids in m["settings"]["arms"].items()}
    for name, r in rows.items():
        r["vs_reference"] = None if name == REFERENCE else compare(r["quality"], rows[REFERENCE]["quality"])
        if r["encoder_passes"] and name != "paper":
            r["vs_paper"] = compare(r["quality"], rows["paper"]["quality"])
    return {"rows": rows, "reference": REFERENCE, "measure": m, "anytime": m["anytime"], "pareto": pareto_set(rows),
            "dominance": dominance(rows, REFERENCE), "dcae_tiny_gmacs": m["dcae_tiny_gmacs"]}


def _reads_result(section: Any) -> Any:
    """A section of :func:`result`, left out until there is one (the header lists the runs still to come)."""
    return lambda page: [] if (res := result(page)) is None else section(page, res)


def arms_section(page: Any, res: dict[str, Any]) -> list[str]:
    """The setup and its cost, the statistics, the arms table, the frontier plot and the dominance reading."""
    m, rows, t = res["measure"], res["rows"], res["measure"]["timings"]
    wall = sum(r.get("run_wall_seconds", 0) for r in page.records.values() if r.get("phase") == "main")
    took = say("took-jobs", minutes=t["train_wall"] / 60) if "train_wall" in t else say("took-summed",
                                                                                      minutes=wall / 60)
    body = [[n, "–" if r["encoder_passes"] is None else f"{r['encoder_passes']} / {r['decoder_passes']}",
             len(r["seeds"]), f"{r['params']:,}", f"{r['gmacs']:.2f}", f"{r['cpu_ms']['median']:.0f}",
             f"{q['psnr']:.2f} ({'–' if q['psnr_sd'] is None else format(q['psnr_sd'], '.2f')})",
             f"{q['psnr_kodak']:.2f}", f"{q['psnr_imagenet']:.2f}", f"{q['ssim']:.4f}",
             "–" if r["vs_reference"] is None else _fmt_diff(r["vs_reference"]["by_seed_psnr"])]
            for n, r in rows.items() for q in [r["quality"]]]
    if page.draw:  # PSNR against GMACs, parameters and CPU ms, the Pareto set circled
        from loopvae.profile import plot_quality

        plot_quality([{"model": n, "params": r["params"], "gmacs": r["gmacs"], "psnr": r["quality"]["psnr"],
                       "ms_per_image": r["cpu_ms"]["median"]} for n, r in rows.items()],
                     page.store.docs / "frontier.png")
    bicubic = statistics.fmean(s["bicubic_psnr"] for s in rows["paper"]["quality"]["seeds"].values())
    return [say("setup", date=m["date"][:10], took=took, measuring=sum(t["post"].values()) / 60, steps=STEPS,
                crops=STEPS * 8, fraction=STEPS / m["release_steps"], reference=REFERENCE, images=m["num_images"]), "",
            *md_table(["arm", "passes enc / dec", "seeds", "params", "GMACs", "CPU ms/img", "PSNR (sd)", "PSNR kodak",
                       "PSNR ImageNet", "SSIM", "Δ vs reference by seed"], body, "llrrrrrrrrl"), "",
            say("frontier", bicubic=bicubic, rounds=ROUNDS), "", *reading(res), ""]


def anytime_section(page: Any, res: dict[str, Any]) -> list[str]:
    """The any-time decoding table, its reading and its plot (held-out PSNR against decode GMACs and CPU ms)."""
    body = [[name, r["decoder_passes"], f"{r['decode_gmacs']:.2f}", f"{r['decode_ms']['median']:.0f} "
             f"[{r['decode_ms']['min']:.0f}, {r['decode_ms']['max']:.0f}]", f"{r['psnr']:.2f}"]
            for name, rows in res["anytime"].items() for r in rows]
    if page.draw:
        from loopvae.profile import pyplot

        fig, axes = (plt := pyplot()).subplots(1, 2, figsize=(11, 4))
        for name, rows in res["anytime"].items():
            for ax, x in zip(axes, ([r["decode_gmacs"] for r in rows], [r["decode_ms"]["median"] for r in rows])):
                ax.plot(x, [r["psnr"] for r in rows], marker="o", label=name)
            for r in rows:
                axes[0].annotate(str(r["decoder_passes"]), (r["decode_gmacs"], r["psnr"]), fontsize=6,
                                 xytext=(3, -9), textcoords="offset points")
        for ax, x, title in zip(axes, ("decode GMACs (256²)", "decode CPU ms (256², side by side)"),
                                ("any-time decoding: arithmetic", "... and time")):
            ax.set(xlabel=x, ylabel="held-out PSNR (dB)", title=title)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(page.store.docs / "anytime.png", dpi=120)
        plt.close(fig)
    return [say("anytime"), "", *md_table(["model", "decoder passes", "decode GMACs",
                                           "decode CPU ms (median [min, max])", "held-out PSNR"], body, "llrrr"),
            "", *anytime_lines(res), "", say("anytime-figure"), ""]


def intervention_row(arm: str, s: list[dict[str, Any]]) -> list[Any]:
    """One arm's intervention summaries (one per seed): means over seeds; counts and worst bypasses per seed."""
    mean, of = lambda f: statistics.fmean(map(f, s)), f" (of {s[0]['images']})"
    counts = lambda key: "–" + of if s[0][key] is None else "/".join(str(x[key]) for x in s) + of
    prefix = [mean(lambda x, k=k: x["fine_prefix_psnr"][k]) for k in range(len(s[0]["fine_prefix_psnr"]))]
    worst = "; ".join(f"{w['stage']} pass {w['pass']} ({-w['psnr_loss']:+.2f} dB"
                      f"{', last' if x['last_pass_is_worst'] else ''})" for x in s for w in [x["worst_bypass"]])
    return [arm, len(s), " → ".join(f"{p:.2f}" for p in prefix), f"{mean(lambda x: x['fine_prefix_raw_psnr'][0]):.2f}",
            f"{100 * mean(lambda x: x['fine_one_pass_out_of_range']):.1f}%",
            counts("images_rising_at_every_fine_pass"), counts("images_hurt_by_every_bypass"), worst]


def interventions_section(page: Any, res: dict[str, Any]) -> list[str]:
    summaries = {arm: [page.records[i]["interventions"] for i in ids if "interventions" in page.records[i]]
                 for arm, ids in res["measure"]["settings"]["arms"].items()}
    return [say("interventions"), "", *md_table(
        ["arm", "seeds", "decoder-2x PSNR with k = 1.. passes", "raw PSNR, 1 pass", "out of range, 1 pass",
         "images rising at every finest pass", "images hurt by every bypass", "worst bypass (last pass?)"],
        [intervention_row(a, s) for a, s in summaries.items() if s], "lrlrrrrl"), "", say("interventions-note"), ""]


def budget_section(page: Any, res: dict[str, Any]) -> list[str]:
    """What a fifth of the release budget and the tiny model can say (the release run's curve: its last quarter)."""
    m, paper, ref, curve = res["measure"], res["rows"]["paper"], res["rows"][REFERENCE], res["measure"]["release_curve"]
    last = curve[-1] if curve else {"step": 0}
    earlier = min(curve, key=lambda p: abs(p["step"] - 0.75 * last["step"]), default=None)
    trend = say("release-trend", first=earlier["psnr"], last=last["psnr"], first_step=earlier["step"],
                last_step=last["step"]) if len(curve) > 1 else say("release-trend-missing")
    return [say("budget", steps=STEPS, fraction=STEPS / m["release_steps"], release_steps=m["release_steps"],
                trend=trend, weights=paper["params"] / ref["params"], macs=paper["gmacs"] / ref["gmacs"]), ""]


def row(record: dict[str, Any]) -> dict[str, Any] | None:
    """A finished main run's row: its held-out PSNR (dB) and SSIM, pooled and per set."""
    if record.get("phase") != "main" or record.get("status") != "finished":
        return None
    return {**{k: record[k] for k in ("arm", "budget", "seed")},
            **{k: record["quality"][k] for k in ("psnr", "ssim", "psnr_kodak", "psnr_imagenet")}}


def extra_results(page: Any) -> dict[str, Any]:
    """The arms' rows without per-image data (``loopvae profile --quality`` reads their model, model_overrides and
    quality), the Pareto set and the dominance criteria."""
    if (res := result(page)) is None:
        return {}
    rows = {n: {**r, "quality": {k: v for k, v in r["quality"].items() if k != "seeds"}}
            for n, r in res["rows"].items()}
    return {"reference": REFERENCE, "steps": STEPS, "rows": rows, "pareto": res["pareto"],
            "dominance": res["dominance"]}


STUDY = Study(
    name="schedule", title="Where should the loops go? The matched-budget schedule study", docs="docs/study_schedule",
    page="docs/study_schedule.md", arms=ARMS, budgets=[Budget(str(STEPS), seeds=(0, 1, 2), steps=STEPS)],
    metric=Metric("psnr", "dB", label="held-out PSNR"), run=run, row=row, prepare=prepare, run_id="{arm}-s{seed}",
    phases=[Phase("main", plan_main, registered=False), Phase("measure", plan_measure, registered=False)],
    preregistration=None, extra_results=extra_results, sections=[std.header, *map(_reads_result, (
        arms_section, anytime_section, interventions_section, budget_section))])
