"""The schedule study's measurements and report: params, counted GMACs, CPU ms/image side by side, paired
verdicts, the weights x arithmetic x quality frontier with its Pareto set, the computed dominance statement,
per-image intervention summaries and the any-time decoding table -> ``docs/study_schedule.md``.

The seed is the unit of every verdict (better / worse / inconclusive). Intervals paired by image compare single
runs (or seed means): they cover images, not training runs, so the page shows them as descriptive numbers without
a verdict word, next to the same comparison between two seeds of one configuration (:func:`same_configuration_pairs`).

Every sentence of the reading is computed from ``results.json`` (written next to the page), so
``python benchmarks/study_schedule.py --report`` re-renders the page from finished runs.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from paired_stats import paired_difference

HELD_OUT = ("kodak", "imagenet")  # kodim21-24, then the 40 held-out ImageNet-sample images
WEIGHT_CAP = 1 / 3  # the dominance criterion: <= 1/3 of the reference's weights
# Any-time decoding schedules measured on the paper-schedule models (coarse -> fine).
ANYTIME_SCHEDULES = ([1, 2, 4], [1, 2, 3], [1, 2, 2], [1, 2, 1], [1, 1, 1])
TIMING_ROUNDS, TIMING_ITERS = 7, 2


# -- reading the runs ------------------------------------------------------------------------------
def per_image_rows(run: Path) -> list[dict[str, Any]]:
    """Per-image evaluation rows of one run over both held-out sets, in a fixed order (set, shard, key)."""
    rows = []
    for split in HELD_OUT:
        part = json.loads((run / f"eval-{split}" / "per_image.json").read_text())
        rows += [dict(r, split=split) for r in sorted(part, key=lambda r: (r["shard"], r["key"]))]
    return rows


def arm_quality(runs: Path, arm) -> dict[str, Any]:
    """Per seed: pooled / per-set PSNR and SSIM and the per-image rows; plus seed means."""
    seeds: dict[int, Any] = {}
    for seed in arm.seeds:
        rows = per_image_rows(runs / arm.run_name(seed))
        seeds[seed] = {
            "psnr": statistics.fmean(r["psnr"] for r in rows), "ssim": statistics.fmean(r["ssim"] for r in rows),
            **{f"psnr_{s}": statistics.fmean(r["psnr"] for r in rows if r["split"] == s) for s in HELD_OUT},
            "keys": [f"{r['split']}/{r['key']}" for r in rows],
            "per_image_psnr": [r["psnr"] for r in rows], "per_image_ssim": [r["ssim"] for r in rows],
            "bicubic_psnr": statistics.fmean(r["bicubic_psnr"] for r in rows),
        }
    vals = [s["psnr"] for s in seeds.values()]
    sd = statistics.stdev(vals) if len(vals) > 1 else None
    return {"seeds": seeds, "psnr": statistics.fmean(vals), "psnr_sd": sd,
            "ssim": statistics.fmean(s["ssim"] for s in seeds.values()),
            **{f"psnr_{s}": statistics.fmean(x[f"psnr_{s}"] for x in seeds.values()) for s in HELD_OUT}}


def seed_averaged_images(quality: dict[str, Any], metric: str = "per_image_psnr") -> list[float]:
    seeds = list(quality["seeds"].values())
    return [statistics.fmean(s[metric][i] for s in seeds) for i in range(len(seeds[0][metric]))]


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """``a - b``: by seed (seeds both arms ran; seed-pooled PSNR/SSIM) and by image (each arm's seed mean)."""
    keys = {tuple(s["keys"]) for q in (a, b) for s in q["seeds"].values()}
    if len(keys) != 1:
        raise RuntimeError("the arms' seeds were evaluated on different images; paired comparisons need the same ones")
    shared = sorted(set(a["seeds"]) & set(b["seeds"]))
    out = {"seeds": shared}
    for metric in ("psnr", "ssim"):
        out[f"by_seed_{metric}"] = paired_difference([a["seeds"][s][metric] for s in shared],
                                                     [b["seeds"][s][metric] for s in shared]).as_dict()
        out[f"by_image_{metric}"] = paired_difference(seed_averaged_images(a, f"per_image_{metric}"),
                                                      seed_averaged_images(b, f"per_image_{metric}")).as_dict()
    return out


# -- interventions ---------------------------------------------------------------------------------
def intervention_summary(result: dict[str, Any]) -> dict[str, Any]:
    """Decoder finest stage (2x): PSNR per retained passes, raw PSNR / out-of-range with one pass, and per image
    how many images improve at every added pass and are hurt by every bypass (over all multi-pass stages)."""
    base = result["baseline"]["per_image"]["psnr"]
    n = len(base)
    fine = next(s for s in result["stages"] if s["branch"] == "decoder" and s["scale"] == "2x")
    prefix = [p["per_image"]["psnr"] for p in fine["prefix"]]
    monotone = sum(all(prefix[k + 1][i] > prefix[k][i] for k in range(len(prefix) - 1)) for i in range(n))
    bypasses = [(s, b) for s in result["stages"] if s["passes"] > 1 for b in s["bypass"]]
    all_hurt = sum(all(b["per_image"]["psnr"][i] < base[i] for _, b in bypasses) for i in range(n))
    worst = max(bypasses, key=lambda sb: result["baseline"]["psnr"] - sb[1]["psnr"], default=None)
    return {
        "images": n, "baseline_psnr": result["baseline"]["psnr"],
        "fine_passes": fine["passes"], "fine_prefix_psnr": [p["psnr"] for p in fine["prefix"]],
        "fine_prefix_raw_psnr": [p["raw_psnr"] for p in fine["prefix"]],
        "fine_one_pass_out_of_range": fine["prefix"][0]["out_of_range"],
        "images_rising_at_every_fine_pass": monotone if fine["passes"] > 1 else None,
        "bypasses": len(bypasses), "images_hurt_by_every_bypass": all_hurt if bypasses else None,
        "worst_bypass": None if worst is None else {
            "stage": f"{worst[0]['branch']} {worst[0]['scale']}", "pass": worst[1]["pass"] + 1,
            "psnr_loss": result["baseline"]["psnr"] - worst[1]["psnr"]},
        "last_pass_is_worst": None if worst is None else worst[1]["pass"] + 1 == worst[0]["passes"],
    }


# -- measurements ----------------------------------------------------------------------------------
def load_release_folder(folder: Path) -> torch.nn.Module:
    """A release / diffusers folder, prepared for inference as ``loopvae profile`` times models."""
    from loopcore.modulation import set_fused_blocks
    from looprun.speed import prepare_for_speed
    from loopvae.loading import load_artifact

    return set_fused_blocks(prepare_for_speed(load_artifact(folder).eval(), "contiguous"), True)


def load_release(run: Path) -> torch.nn.Module:
    return load_release_folder(run / "release")


def time_side_by_side(fns: dict[str, Any], rounds: int = TIMING_ROUNDS, iters: int = TIMING_ITERS
                      ) -> dict[str, dict[str, float]]:
    """Median (and min/max over rounds) ms per call of each function, alternating in rounds in one process."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    with torch.no_grad():
        for fn in fns.values():
            fn()  # warm-up
        for _ in range(rounds):
            for name, fn in fns.items():
                start = time.perf_counter()
                for _ in range(iters):
                    fn()
                times[name].append(1000 * (time.perf_counter() - start) / iters)
    return {k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in times.items()}


def held_out_images(data, limit: int | None = None) -> tuple[torch.Tensor, list[str]]:
    """kodim21-24 then the held-out ImageNet images at 256^2 in [-1, 1] (``limit`` per set), with their keys."""
    import loopdata

    images, keys = [], []
    for split, urls in (("kodak", data.kodak_val), ("imagenet", data.imagenet_holdout)):
        loader = loopdata.make_loader(urls, task="reconstruction", train=False, batch_size=8, num_workers=0,
                                      resolution=256, rank=0, world_size=1)
        part = [b for b in loader]
        images.append(torch.cat([b["image"] for b in part])[:limit])
        keys += [f"{split}/{k}" for b in part for k in b["key"]][:limit]
    return torch.cat(images), keys


@torch.no_grad()
def anytime_table(models: dict[str, torch.nn.Module], images: torch.Tensor) -> dict[str, Any]:
    """Per model and decoder schedule: held-out PSNR (uint8, per image), decode GMACs and CPU ms (side by side)."""
    from loopcore.flops import count_macs
    from loopvae.metrics import psnr_per_image, to_uint8

    target = to_uint8(images)
    out: dict[str, Any] = {}
    one = images[:1]
    fns = {}
    for name, model in models.items():
        z = torch.cat([model.encode(x).latent_dist.mode() for x in images.split(8)])
        z1 = model.encode(one).latent_dist.mode()
        rows = []
        for schedule in ANYTIME_SCHEDULES:
            recon = torch.cat([model.decode(zs, decoder_passes=schedule).sample for zs in z.split(8)])
            psnr = psnr_per_image(to_uint8(recon), target)
            macs = count_macs(lambda m=model, s=schedule, z=z1: m.decode(z, decoder_passes=s))
            rows.append({"decoder_passes": schedule, "psnr": float(psnr.mean()), "per_image_psnr": psnr.tolist(),
                         "decode_gmacs": macs / 1e9})
            fns[f"{name} {schedule}"] = lambda m=model, s=schedule, z=z1: m.decode(z, decoder_passes=s)
        out[name] = rows
    timed = time_side_by_side(fns)
    for name, rows in out.items():
        for row in rows:
            row["decode_ms"] = timed[f"{name} {row['decoder_passes']}"]
    return out


def measure(arms, runs: Path, data, timings, steps: int, eval_limit: int | None = None) -> dict[str, Any]:
    """Everything the page reports, from the finished runs (``eval_limit``: images per held-out set, smoke runs)."""
    from study_loopvae import keep_freed_memory_mapped, model_counts

    keep_freed_memory_mapped()
    torch.set_num_threads(2)
    reference = next(a for a in arms if not a.is_loopvae)
    quality = {a.name: arm_quality(runs, a) for a in arms}
    counts = {a.name: model_counts(a.model_name(), a.model_overrides()) for a in arms}
    start = time.perf_counter()
    x = torch.rand(1, 3, 256, 256) * 2 - 1
    models = {a.name: load_release(runs / a.run_name(a.seeds[0])) for a in arms}
    cpu = time_side_by_side({n: lambda m=m: m.decode(m.encode(x).latent_dist.mode()) for n, m in models.items()})
    timings.record("post", "cpu timing", time.perf_counter() - start)
    start = time.perf_counter()
    images, _ = held_out_images(data, eval_limit)
    anytime_models = {a.run_name(0): models[a.name] for a in arms if a.name in ("paper", "paper-ds")}
    from loopvae.demo import bundled_model_dir

    # the bundled model (7,500 steps, no deep supervision): what a user decodes with today
    anytime_models["bundled loopvae-cnn-tiny"] = load_release_folder(bundled_model_dir())
    anytime = anytime_table(anytime_models, images)
    timings.record("post", "any-time decoding", time.perf_counter() - start)
    interventions = {}
    for a in arms:
        if a.is_loopvae:
            interventions[a.name] = {
                s: intervention_summary(json.loads((runs / a.run_name(s) / "interventions" / "interventions.json")
                                                   .read_text())) for s in a.seeds}
    summaries = {a.run_name(s): json.loads((runs / a.run_name(s) / "train_summary.json").read_text())
                 for a in arms for s in a.seeds}
    rows = {}
    for a in arms:
        rows[a.name] = {
            "model": a.model_name(), "model_overrides": a.model_overrides(),
            "change": a.change, "encoder_passes": a.encoder_passes, "decoder_passes": a.decoder_passes,
            "seeds": list(a.seeds), "params": counts[a.name][0], "gmacs": counts[a.name][1],
            "cpu_ms": cpu[a.name], "quality": quality[a.name],
            "train_seconds": statistics.fmean(summaries[a.run_name(s)]["train_seconds"] for s in a.seeds),
            "vs_reference": None if a is reference else compare(quality[a.name], quality[reference.name]),
        }
    paper = quality["paper"]
    for a in arms:
        if a.is_loopvae and a.name != "paper":
            rows[a.name]["vs_paper"] = compare(quality[a.name], paper)
    return {"date": time.strftime("%Y-%m-%d"), "reference": reference.name, "steps": steps, "rows": rows,
            "anytime": anytime, "interventions": interventions, "num_images": len(images),
            "timings": timings.data}


# -- the frontier and the reading ------------------------------------------------------------------
def pareto_set(rows: dict[str, Any]) -> list[str]:
    """Arms no other arm matches or beats on (fewer params, fewer GMACs, higher mean PSNR), strictly on one."""
    from loopvae.profile import pareto_front

    return pareto_front({n: (r["params"], r["gmacs"], r["quality"]["psnr"]) for n, r in rows.items()})


def dominance(rows: dict[str, Any], reference: str) -> dict[str, Any]:
    """Per LoopVAE arm: the three criteria against the reference, each decided from the numbers."""
    ref = rows[reference]
    out = {}
    for name, r in rows.items():
        if name == reference:
            continue
        by_seed = r["vs_reference"]["by_seed_psnr"]
        by_image = r["vs_reference"]["by_image_psnr"]
        out[name] = {
            "weights_ratio": r["params"] / ref["params"], "weights_ok": r["params"] <= WEIGHT_CAP * ref["params"],
            "macs_ratio": r["gmacs"] / ref["gmacs"], "macs_ok": r["gmacs"] <= ref["gmacs"],
            "time_ratio": r["cpu_ms"]["median"] / ref["cpu_ms"]["median"],
            # by image: descriptive only (the images of one run per seed), so no verdict is stored for it
            "psnr_by_seed": by_seed["verdict"], "psnr_by_image_mean": by_image["mean"],
            # "paired, not inconclusive": the seed-paired interval decides (it carries the training noise);
            # the image-paired one alone ignores that a second seed may land elsewhere.
            "psnr_ok": by_seed["verdict"] == "better",
        }
        d = out[name]
        d["dominates"] = d["weights_ok"] and d["macs_ok"] and d["psnr_ok"]
        d["dominates_but_weights"] = d["macs_ok"] and d["psnr_ok"]
    return out


def plot_frontier(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, pareto, ref = result["rows"], set(result["pareto"]), result["reference"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    panels = (("gmacs", "GMACs per 256² reconstruction", lambda r: r["gmacs"]),
              ("params", "parameters (thousands)", lambda r: r["params"] / 1e3),
              ("cpu", "CPU ms per 256² image (2 threads, side by side)", lambda r: r["cpu_ms"]["median"]))
    for ax, (_, label, xof) in zip(axes, panels, strict=True):
        for i, (name, r) in enumerate(rows.items()):
            q = r["quality"]
            color = "C3" if name == ref else f"C{i % 10}"
            ax.errorbar(xof(r), q["psnr"], yerr=q["psnr_sd"] or 0, fmt="s" if name == ref else "o", color=color,
                        capsize=3, zorder=3)
            for s in q["seeds"].values():
                ax.scatter(xof(r), s["psnr"], color=color, s=8, alpha=0.5, zorder=2)
            if name in pareto:
                ax.scatter(xof(r), q["psnr"], s=160, facecolors="none", edgecolors="k", zorder=4)
            ax.annotate(name, (xof(r), q["psnr"]), xytext=(5, 4), textcoords="offset points", fontsize=7, color=color)
        r0 = rows[ref]
        ax.axhline(r0["quality"]["psnr"], color="C3", ls=":", lw=1)
        ax.axvline(xof(r0), color="C3", ls=":", lw=1)
        ax.set(xlabel=label, ylabel="held-out PSNR (dB), mean over seeds")
        ax.grid(alpha=0.3)
    axes[1].axvline(rows[ref]["params"] / 3e3, color="k", ls="--", lw=1, label="1/3 of the reference's weights")
    axes[1].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Schedule frontier at {result['steps']:,} steps (circled: Pareto set on params × GMACs × PSNR; "
                 "dotted: the reference)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_anytime(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, rows in result["anytime"].items():
        axes[0].plot([r["decode_gmacs"] for r in rows], [r["psnr"] for r in rows], marker="o", label=name)
        axes[1].plot([r["decode_ms"]["median"] for r in rows], [r["psnr"] for r in rows], marker="o", label=name)
        for r in rows:
            axes[0].annotate(str(r["decoder_passes"]), (r["decode_gmacs"], r["psnr"]), fontsize=6,
                             xytext=(3, -9), textcoords="offset points")
    axes[0].set(xlabel="decode GMACs (256²)", ylabel="held-out PSNR (dB)", title="any-time decoding: arithmetic")
    axes[1].set(xlabel="decode CPU ms (256², side by side)", ylabel="held-out PSNR (dB)", title="... and time")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _fmt_diff(d: dict[str, Any], unit: str = "dB", digits: int = 2, verdict: bool = True) -> str:
    """A paired difference; ``verdict=False`` for a descriptive one (paired by image: no verdict word)."""
    if d["low"] is None:
        return f"{d['mean']:+.{digits}f} {unit} (n = {d['n']}, no interval)" + (f": {d['verdict']}" if verdict else "")
    text = (f"{d['mean']:+.{digits}f} [{d['low']:+.{digits}f}, {d['high']:+.{digits}f}] (n = {d['n']}; "
            f"{d['wins']}/{d['n']} higher)")
    return text + (f": **{d['verdict']}**" if verdict else "")


def _by_image(d: dict[str, Any]) -> str:
    """A by-image difference, descriptive: its interval covers the images of single runs, not seeds."""
    return _fmt_diff(d, verdict=False) + ", descriptive"


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:+.2f}" if f"{lo:+.2f}" == f"{hi:+.2f}" else f"{lo:+.2f} to {hi:+.2f}"


def same_configuration_pairs(rows: dict[str, Any]) -> list[dict[str, Any]]:
    """Null rows: every pair of seeds of one arm, paired by image (what a by-image interval between two runs of
    the *same* configuration looks like)."""
    out = []
    for name, r in rows.items():
        seeds = r["quality"]["seeds"]
        for i, a in enumerate(sorted(seeds, key=int)):
            for b in sorted(seeds, key=int)[i + 1:]:
                d = paired_difference(seeds[a]["per_image_psnr"], seeds[b]["per_image_psnr"]).as_dict()
                out.append({"arm": name, "a": a, "b": b, "diff": d, "loopvae": r["encoder_passes"] is not None})
    return out


def null_rows_sentence(rows: dict[str, Any]) -> str | None:
    """How often two seeds of one configuration, compared by image, give an interval that excludes 0."""
    pairs = same_configuration_pairs(rows)
    if not pairs:
        return None
    loop = [p for p in pairs if p["loopvae"]]
    decided = lambda ps: sum(p["diff"]["verdict"] != "inconclusive" for p in ps)
    widest = max(loop or pairs, key=lambda p: abs(p["diff"]["mean"]))
    counts = (f"{decided(loop)} of {len(loop)} LoopVAE seed pairs"
              + (f" ({decided(pairs)} of {len(pairs)} with the reference's)" if len(pairs) > len(loop) else "")
              if loop else f"{decided(pairs)} of {len(pairs)} seed pairs")
    return (f"- **By image, one run per model: descriptive.** Two seeds of the *same* configuration, paired by image "
            f"the same way, give an interval that excludes 0 in {counts}; the largest, {widest['arm']} "
            f"s{widest['a']} − s{widest['b']}, is {_fmt_diff(widest['diff'], verdict=False)}. A by-image interval "
            "between two runs covers the images of those runs, not the training noise (the images are "
            "pseudo-replicates of one run), so the by-image differences on this page are descriptive and carry "
            "no verdict; verdicts are paired by seed.")


def pareto_sentences(rows: dict[str, Any], pareto: list[str]) -> list[str]:
    """Which mean-PSNR margins decide the Pareto membership, and whether a seed-paired comparison resolves them.

    An arm Y at most as costly as X on both costs decides X's membership by PSNR alone: X is off the set when Y's
    mean PSNR is at least X's, on it only while X's is higher. The margin is resolved when Y - X (or X - Y) is
    *better* paired by seed; otherwise the membership rests on a difference within seed noise."""
    def cheaper(y: dict[str, Any], x: dict[str, Any]) -> bool:
        return y["params"] <= x["params"] and y["gmacs"] <= x["gmacs"]

    def resolved(hi: str, lo: str) -> bool:
        a, b = rows[hi]["quality"], rows[lo]["quality"]
        if not set(a["seeds"]) & set(b["seeds"]):
            return False
        return compare(a, b)["by_seed_psnr"]["verdict"] == "better"

    psnr = {n: r["quality"]["psnr"] for n, r in rows.items()}
    noisy, settled, by_cost = [], [], []
    for name, r in rows.items():
        others = [y for y in rows if y != name and cheaper(rows[y], r)]
        if name in pareto:
            if not others:
                by_cost.append(name)
                continue
            margins = [psnr[name] - psnr[y] for y in others]
            text = f"{name} on it by {_span(margins)} dB (over {', '.join(others)})"
            (settled if all(resolved(name, y) for y in others) else noisy).append(text)
        else:
            above = [y for y in others if psnr[y] >= psnr[name]]
            if not above:  # not dominated on these three axes (a set computed elsewhere): nothing to qualify
                continue
            margins = [psnr[y] - psnr[name] for y in above]
            by_seed = [y for y in above if resolved(y, name)]
            if by_seed:
                settled.append(f"{name} off it (behind {', '.join(by_seed)}, better paired by seed)")
            else:
                noisy.append(f"{name} off it by {_span(margins)} dB (behind {', '.join(above)})")
    sds = [r["quality"]["psnr_sd"] for n, r in rows.items() if r["quality"]["psnr_sd"] is not None
           and r["encoder_passes"] is not None]
    lines = []
    if by_cost:
        lines.append(f"  - On it by cost alone (no arm is as cheap on both params and GMACs): {', '.join(by_cost)}.")
    if settled:
        lines.append("  - Resolved by seed: " + "; ".join(settled) + ".")
    if noisy:
        noise = (f"; the LoopVAE arms' seed s.d. is {min(sds):.2f}–{max(sds):.2f} dB where an arm has several seeds"
                 if sds else "")
        lines.append("  - Decided by mean PSNR alone: " + "; ".join(noisy) + ". No seed-paired comparison resolves "
                     f"these margins (each is inconclusive{noise}): these Pareto membership differences are within "
                     "seed noise, so the set is not a ranking of the schedules' quality.")
    return lines


def _passes(r: dict[str, Any]) -> str:
    if r["encoder_passes"] is None:
        return "–"
    return f"{list(r['encoder_passes'])} / {list(r['decoder_passes'])}"


def tuned_reference_note(rows: dict[str, Any], arms: list[str]) -> str:
    """How the arms' MACs compare with the tuned AutoencoderDC reference of the fair study (its committed results),
    which reconstructs better than this study's reference at fewer MACs."""
    fair = Path(__file__).resolve().parent.parent / "docs/study_fair/results.json"
    if not fair.is_file():
        return "the tuned references are compared in docs/study_fair.md."
    costs = json.loads(fair.read_text())["computed"]["conclusion"]["costs"]
    dcae = costs["dcae@img"]["gmacs"]
    ratios = ", ".join(f"{n} {rows[n]['gmacs'] / dcae:.2f}×" for n in arms)
    return (f"the tuned `dcae-tiny` ([study_fair.md](study_fair.md)) does {dcae:.2f} GMACs, so against it these "
            f"arms cost {ratios} its MACs and would miss the MAC criterion too.")


def reading(result: dict[str, Any]) -> list[str]:
    rows, ref, dom = result["rows"], result["reference"], result["dominance"]
    lines = []
    winners = [n for n, d in dom.items() if d["dominates"]]
    two_axis = [n for n, d in dom.items() if d["dominates_but_weights"]]
    cap = rows[ref]["params"] * WEIGHT_CAP
    if winners:
        lines.append(f"- **Dominance reached**: {', '.join(winners)} store ≤ 1/3 of `{ref}`'s weights, cost ≤ its MACs "
                     "and reconstruct better, paired by seed.")
    else:
        lines.append(f"- **No arm dominates `{ref}` on all three axes as the criterion is written.**")
        lightest = min(dom, key=lambda n: dom[n]["weights_ratio"])
        lines.append(f"  - Weights: 1/3 of the reference is {cap:,.0f} parameters; every LoopVAE arm stores "
                     f"{min(d['weights_ratio'] for d in dom.values()):.3f}–"
                     f"{max(d['weights_ratio'] for d in dom.values()):.3f}× "
                     f"(lightest: {lightest}), the tiny model's fixed width and K = 2 blocks, like the paper's "
                     "29.07M / 83.82M = 0.347×. Schedules move only the per-stage injections and loop embeddings, "
                     "a few thousand parameters, so no schedule crosses the cap by itself.")
        if two_axis:
            lines.append(f"  - On the other two axes: {', '.join(two_axis)} cost ≤ the reference's MACs and "
                         "reconstruct "
                         "better paired by seed, at "
                         + ", ".join(f"{dom[n]['weights_ratio']:.3f}×" for n in two_axis)
                         + f" its weights. That is against `{ref}`, an untuned reference at LoopVAE's recipe, not a "
                         "verdict on the idea: " + tuned_reference_note(rows, two_axis))
        else:
            cheap = [n for n, d in dom.items() if d["macs_ok"]]
            lines.append("  - No arm meets even the MACs and PSNR criteria together: "
                         + (f"the arms at ≤ the reference's MACs ({', '.join(cheap)}) do not reconstruct better "
                            "paired by seed." if cheap else "every arm costs more MACs than the reference."))
    for name, d in dom.items():
        r = rows[name]
        lines.append(f"  - {name}: weights {d['weights_ratio']:.3f}× ({'ok' if d['weights_ok'] else 'over'}), "
                     f"MACs {d['macs_ratio']:.2f}× ({'ok' if d['macs_ok'] else 'over'}), "
                     f"CPU time {d['time_ratio']:.2f}×, "
                     f"PSNR vs reference by seed {_fmt_diff(r['vs_reference']['by_seed_psnr'])}, by image "
                     f"{r['vs_reference']['by_image_psnr']['mean']:+.2f} dB (descriptive).")
    lines.append(f"- Pareto set on (params, GMACs, PSNR): {', '.join(result['pareto'])}.")
    lines += pareto_sentences(rows, result["pareto"])
    null = null_rows_sentence(rows)
    if null is not None:
        lines.append(null)
    paper = rows["paper"]
    for name, r in rows.items():
        if "vs_paper" not in r:
            continue
        v = r["vs_paper"]
        lines.append(f"- {name} vs paper: {r['gmacs'] / paper['gmacs']:.2f}× the MACs, PSNR by seed "
                     f"{_fmt_diff(v['by_seed_psnr'])}; by image {_by_image(v['by_image_psnr'])}.")
    return lines


def anytime_lines(result: dict[str, Any]) -> list[str]:
    lines = ["| model | decoder passes | decode GMACs | decode CPU ms (median [min, max]) | held-out PSNR |",
             "|---|---|---:|---:|---:|"]
    for name, rows in result["anytime"].items():
        for r in rows:
            ms = r["decode_ms"]
            lines.append(f"| {name} | {r['decoder_passes']} | {r['decode_gmacs']:.2f} | {ms['median']:.0f} "
                         f"[{ms['min']:.0f}, {ms['max']:.0f}] | {r['psnr']:.2f} |")
    lines.append("")
    for name, rows in result["anytime"].items():
        psnrs = [r["psnr"] for r in rows]  # full schedule first, then fewer passes
        rising = all(a > b for a, b in zip(psnrs, psnrs[1:], strict=False))
        full, cut = rows[0], next(r for r in rows if r["decoder_passes"] == [1, 2, 1])
        d = paired_difference(cut["per_image_psnr"], full["per_image_psnr"]).as_dict()
        lines.append(f"- {name} (one trained model): quality {'rises' if rising else 'does not rise'} monotonically "
                     f"with retained passes ({' ← '.join(f'{p:.2f}' for p in psnrs)} dB, full schedule first); the "
                     f"early exit [1, 2, 1] changes PSNR by {cut['psnr'] - full['psnr']:+.2f} dB (by image "
                     f"{_by_image(d)}) for {cut['decode_gmacs'] / full['decode_gmacs']:.2f}× the decode MACs and "
                     f"{cut['decode_ms']['median'] / full['decode_ms']['median']:.2f}× the decode time.")
    lines += trained_at_exit_lines(result)
    ds = result["rows"].get("paper-ds")
    if ds is not None:
        v = ds["vs_paper"]["by_image_psnr"]
        paper_pairs = [p["diff"]["mean"] for p in same_configuration_pairs({"paper": result["rows"]["paper"]})]
        spread = (f"; two seeds of the plain paper schedule differ by image by up to "
                  f"{max(abs(m) for m in paper_pairs):.2f} dB" if paper_pairs else "")
        lines.append(f"- What deep supervision costs at full depth (paper-ds vs paper, seed 0 vs the paper seeds' "
                     f"mean, by image): {_by_image(v)}, from {len(ds['seeds'])} deep-supervised seed{spread}; "
                     f"training time {ds['train_seconds'] / result['rows']['paper']['train_seconds']:.2f}× "
                     "the plain run's.")
    return lines


def trained_at_exit_lines(result: dict[str, Any]) -> list[str]:
    """Each early exit against the arm *trained* at that decoder schedule (the same decode arithmetic): does stopping
    a deeper model early give what training at the cheap schedule gives? Each exit is one trained model, so the
    comparison is of means against the trained arm's seeds, without a seed-paired interval."""
    lines = []
    for arm, r in result["rows"].items():
        if r["decoder_passes"] is None:
            continue
        schedule = list(r["decoder_passes"])
        exits = {}
        for name, rows in result["anytime"].items():
            row = next((x for x in rows[1:] if list(x["decoder_passes"]) == schedule), None)  # rows[0]: full depth
            if row is not None:
                exits[name] = row
        if not exits:
            continue
        q = r["quality"]
        seeds = [s["psnr"] for s in q["seeds"].values()]
        below = [name for name, x in exits.items() if x["psnr"] < min(seeds)]
        parts = ", ".join(f"{name} {x['psnr']:.2f} dB ({x['psnr'] - q['psnr']:+.2f})" for name, x in exits.items())
        sd = "" if q["psnr_sd"] is None else f", s.d. {q['psnr_sd']:.2f}"
        line = (f"- Trained at {schedule} instead of stopped there: {arm} ({len(seeds)} seed"
                f"{'s' if len(seeds) > 1 else ''}{sd}) reaches {q['psnr']:.2f} dB with the same decoder schedule, so "
                f"the same decode arithmetic; the early exits at {schedule} reach {parts}. ")
        if len(below) == len(exits):
            line += (f"Every early exit at {schedule} scores below every seed of the model trained at it (each exit "
                     "is one trained model, so no seed-paired interval): at this cost a model trained at the cheap "
                     "schedule scores higher than a deeper one stopped early, and any-time decoding buys a choice "
                     "of depth at run time, not quality at a given depth.")
        else:
            line += (f"Below every seed of the model trained at {schedule}: {', '.join(below) or 'none'}; the others "
                     "fall within its seeds' range (each exit is one trained model, so no seed-paired interval).")
        lines.append(line)
    return lines


def release_curve_sentence(result: dict[str, Any]) -> str:
    """What the bundled model's validation curve did over its last quarter (from docs/study_loopvae/release.json)."""
    curve = result.get("release_curve") or []
    if len(curve) < 2:
        return "(The release run's learning curve was not found.)"
    last = curve[-1]
    earlier = min(curve, key=lambda p: abs(p["step"] - 0.75 * last["step"]))
    return (f"The release run's validation PSNR went {earlier['psnr']:.2f} → {last['psnr']:.2f} dB from step "
            f"{earlier['step']:,} to {last['step']:,} (docs/study_loopvae.md).")


def render(result: dict[str, Any], command: str) -> str:
    rows, ref = result["rows"], result["reference"]
    t = result["timings"]
    lines = [
        "# Where should the loops go? The matched-budget schedule study", "",
        f"Produced by `{command}` (`benchmarks/study_schedule.py`) on {result['date']}: "
        f"{t['train_wall'] / 60:.0f} min of two-job training, evaluation and interventions, "
        f"{sum(t['post'].values()) / 60:.0f} min of measurement. Every arm trains the bundled model's recipe "
        f"(preset `release-tiny`: `loopvae-cnn-tiny` with the shortcuts, lr 2e-3, L1 + 10 MSE, 8 crops of 64², EMA "
        f"0.999) for {result['steps']:,} steps (the same {result['steps'] * 8:,} crops seen; "
        f"{result['steps'] / result['release_steps']:.0%} of the release run) and changes only the pass schedule; "
        "the reference `flux-vae-tiny` trains the same recipe. "
        f"Evaluation: {result['num_images']} held-out images at 256² (kodim21–24 and the 40 held-out ImageNet-sample "
        "images), EMA weights, posterior mode, uint8 PSNR per image; SSIM Gaussian 11×11, σ 1.5.", "",
        "Statistics: *by seed* pairs each arm's seed with the same seed of the other arm (pooled PSNR over the "
        "held-out images), 95% t-interval with df = seeds − 1; *by image* pairs the held-out images, each arm "
        "averaged over its seeds. Verdicts: better / worse / inconclusive (never \"equal\"), by seed only: the seed "
        "is the unit of every verdict. A by-image interval covers the images of single runs (one run per model for "
        "a one-seed arm), not the training noise, so it is descriptive and carries no verdict word. No comparison "
        "was written down before the runs and none is corrected for multiplicity, so every verdict on this page is "
        "exploratory. The reference is `flux-vae-tiny` trained at LoopVAE's recipe at an untuned shape (2 channels "
        "per GroupNorm group) with one seed far below the others, so the Δ column measures the schedules against "
        "that baseline only; LoopVAE against references tuned on their own terms, seed-level with pre-registered, "
        "Holm-corrected comparisons, is [study_fair.md](study_fair.md). Encoder passes "
        "are fine → coarse (2x, 4x, 8x), decoder passes coarse → fine (8x, 4x, 2x).", "",
        "## The arms", "",
        "| arm | passes enc / dec | seeds | params | GMACs | CPU ms/img | PSNR (sd) | PSNR kodak | PSNR ImageNet | "
        "SSIM | Δ vs reference by seed |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in rows.items():
        q = r["quality"]
        sd = "–" if q["psnr_sd"] is None else f"{q['psnr_sd']:.2f}"
        vs = "–" if r["vs_reference"] is None else _fmt_diff(r["vs_reference"]["by_seed_psnr"])
        lines.append(f"| {name} | {_passes(r)} | {len(r['seeds'])} | {r['params']:,} | {r['gmacs']:.2f} | "
                     f"{r['cpu_ms']['median']:.0f} | {q['psnr']:.2f} ({sd}) | {q['psnr_kodak']:.2f} | "
                     f"{q['psnr_imagenet']:.2f} | {q['ssim']:.4f} | {vs} |")
    bic = statistics.fmean(s["bicubic_psnr"] for s in rows["paper"]["quality"]["seeds"].values())
    lines += ["", f"Bicubic at ≥ the latent's values per pixel on the same images: {bic:.2f} dB. CPU ms: median over "
              f"{TIMING_ROUNDS} alternating rounds of encode → mode → decode at 256², batch 1, 2 threads, all arms "
              "timed side by side in one process.", "",
              f"![frontier]({result['folder']}/frontier.png)", "", "## Dominance and the frontier (computed)", "",
              *reading(result), "", "## Any-time decoding: `LoopVAE.decode(z, decoder_passes=[...])`", "",
              "The decoder runs only the first k passes of each stage (coarse → fine), validated against the "
              "trained schedule; measured on the paper-schedule models of this study (seed 0, with and without deep "
              "supervision) and on the bundled model over the held-out images, decode alone timed side by side at "
              "256², batch 1.", "", *anytime_lines(result), "",
              f"![any-time decoding]({result['folder']}/anytime.png)", "",
              "## Interventions per arm (16 images; seeds averaged where several)", "",
              "| arm | seeds | decoder-2x PSNR with k = 1.. passes | raw PSNR, 1 pass | out of range, 1 pass | images "
              "rising at every finest pass | images hurt by every bypass | worst bypass (last pass?) |",
              "|---|---:|---|---:|---:|---:|---:|---|"]
    for name, per_seed in result["interventions"].items():
        s = list(per_seed.values())
        prefix = [statistics.fmean(x["fine_prefix_psnr"][k] for x in s) for k in range(len(s[0]["fine_prefix_psnr"]))]
        raw1 = statistics.fmean(x["fine_prefix_raw_psnr"][0] for x in s)
        oor = statistics.fmean(x["fine_one_pass_out_of_range"] for x in s)
        rising = "–" if s[0]["images_rising_at_every_fine_pass"] is None else \
            "/".join(str(x["images_rising_at_every_fine_pass"]) for x in s)
        hurt = "/".join(str(x["images_hurt_by_every_bypass"]) for x in s)
        worst = "; ".join(f"{x['worst_bypass']['stage']} pass {x['worst_bypass']['pass']} "
                          f"({-x['worst_bypass']['psnr_loss']:+.2f} dB{', last' if x['last_pass_is_worst'] else ''})"
                          for x in s)
        lines.append(f"| {name} | {len(s)} | {' → '.join(f'{p:.2f}' for p in prefix)} | {raw1:.2f} | "
                     f"{100 * oor:.1f}% | {rising} (of {s[0]['images']}) | {hurt} (of {s[0]['images']}) | {worst} |")
    lines += ["", "Per-image columns list one count per seed.", "",
              "## What this budget can and cannot say", "",
              f"- {result['steps']:,} steps are {result['steps'] / result['release_steps']:.0%} of the bundled model's "
              f"{result['release_steps']:,}: the schedules are ranked early in training, when a cheaper schedule may "
              "still be catching up or already saturated. " + release_curve_sentence(result),
              f"- The tiny model (width 48, K = 2) is not the paper's 29M model; its weight ratio to the reference "
              f"({rows['paper']['params'] / rows[ref]['params']:.3f}×) is close to the paper's 0.347×, its MAC ratio "
              f"({rows['paper']['gmacs'] / rows[ref]['gmacs']:.2f}× for the paper schedule) is below the paper's "
              "1.57×.",
              "- No GPU was lent to this session, so the full-size (`loopvae-cnn-f8d16`) schedule timings in bf16 "
              "are not measured; `make bench-gpu` holds the protocol.", ""]
    return "\n".join(lines)


def measure_and_render(arms, runs: Path, data, out: Path, timings, steps: int, lpips_net: str,
                       eval_limit: int | None = None) -> dict[str, Any]:
    """Measure, write ``<out>`` (+ ``<out stem>/results.json``, ``frontier.png``, ``anytime.png``)."""
    from loopvae.train_config import load_train_config

    result = measure(arms, runs, data, timings, steps, eval_limit)
    result["lpips_net"] = lpips_net
    result["release_steps"] = load_train_config("release-tiny").max_steps
    release = Path("docs/study_loopvae/release.json")
    result["release_curve"] = json.loads(release.read_text())["curves"]["loopvae-s0"] if release.is_file() else []
    result["pareto"] = pareto_set(result["rows"])
    result["dominance"] = dominance(result["rows"], result["reference"])
    result["timings"] = timings.data
    folder = out.with_suffix("")
    folder.mkdir(parents=True, exist_ok=True)
    result["folder"] = folder.name
    plot_frontier(result, folder / "frontier.png")
    plot_anytime(result, folder / "anytime.png")
    (folder / "results.json").write_text(json.dumps(result, indent=1, default=list))
    out.write_text(render(result, "make study-schedule"))
    print(f"wrote {out}")
    return result


def render_from_results(out: Path) -> None:
    """Re-draw the plots and re-render ``out`` from ``<out stem>/results.json`` (no measuring)."""
    folder = out.with_suffix("")
    result = json.loads((folder / "results.json").read_text())
    plot_frontier(result, folder / "frontier.png")
    plot_anytime(result, folder / "anytime.png")
    out.write_text(render(result, "make study-schedule"))
    print(f"wrote {out} from {folder / 'results.json'}")
