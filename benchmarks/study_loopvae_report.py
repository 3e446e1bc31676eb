"""The LoopVAE study's report: statistics, the computed reading, plots, the markdown page and the bundled model's
card, all from the ``result`` dict that ``study_loopvae.py`` measures (also saved as ``results.json``).

Every sentence of the reading is computed from the numbers and states the condition it was decided by;
the paper's figures it is set against are the constants below.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import torch
from paired_stats import PairedDifference, paired_difference, seeds_disagree

from looprun.release import WEIGHTS_NAME

PRESET = "study-tiny"
PAPER_PREFIX_DEC2X = [14.54, 15.26, 19.36, 32.28]  # paper Table 7: decoder 2x stage, k = 1..4 retained passes
PAPER_RAW_1PASS = -1.04  # raw PSNR (dB) with one decoder-2x pass
PAPER_OUT_OF_RANGE_1PASS = 0.967
PAPER_BYPASS_RANGE = (3.7, 13.2)  # PSNR lost by single-pass bypasses (dB)
PAPER_SHARING = {"global": (31.163, 0.0852), "scale": (30.412, 0.0841), "none": (31.043, 0.0797)}


# -- statistics and the reading --------------------------------------------------------------------
def mean_sd(values: list[float]) -> tuple[float, float | None]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def fmt(values: list[float], digits: int = 2) -> str:
    m, sd = mean_sd(values)
    return f"{m:.{digits}f}" + (f" ± {sd:.{digits}f}" if sd is not None else "")


# An added pass "contributes" when it raises mean PSNR by more than this; an early exit is "usable" when it
# costs less than the margin against full depth. Both are stated in the report wherever they decide a sentence.
PASS_GAIN_DB = 0.05
EXIT_MARGIN_DB = 1.0


def seed_of(name: str) -> int:
    return int(name.rsplit("-s", 1)[1])


def by_seed(names: list[str]) -> dict[int, str]:
    return {seed_of(n): n for n in names}


def paired_by_seed(r: dict[str, Any], a: str, b: str, split: str, metric: str = "psnr") -> PairedDifference:
    """Arm ``a`` minus arm ``b`` on ``split``, paired by seed (the seeds both arms ran)."""
    ev, sa, sb = r["eval"], by_seed(r["groups"][a]), by_seed(r["groups"][b])
    seeds = sorted(set(sa) & set(sb))
    return paired_difference([ev[sa[k]][split][metric] for k in seeds], [ev[sb[k]][split][metric] for k in seeds])


def stage(result: dict[str, Any], branch: str, scale: str) -> dict[str, Any]:
    return next(s for s in result["stages"] if s["branch"] == branch and s["scale"] == scale)


def per_image_criteria(iv: dict[str, Any], st: dict[str, Any]) -> dict[str, Any]:
    """The paper's per-image counts for one multi-pass stage of an intervention result.

    ``monotone``: images whose prefix PSNR rises strictly with every retained pass; ``bypass_hurts[t]``: images
    whose PSNR drops when pass ``t + 1`` is bypassed; ``worst[t]``: images whose most damaging bypass is pass
    ``t + 1``; ``n``: images.
    """
    base = iv["baseline"]["per_image"]["psnr"]
    prefix = [p["per_image"]["psnr"] for p in st["prefix"]]
    bypass = [b["per_image"]["psnr"] for b in st["bypass"]]
    n = len(base)
    monotone = sum(all(prefix[k + 1][i] > prefix[k][i] for k in range(len(prefix) - 1)) for i in range(n))
    hurts = [sum(b[i] < base[i] for i in range(n)) for b in bypass]
    worst = [0] * len(bypass)
    for i in range(n):
        worst[min(range(len(bypass)), key=lambda t: bypass[t][i])] += 1
    return {"n": n, "monotone": monotone, "bypass_hurts": hurts, "worst": worst}


def core_work(iv: dict[str, Any]) -> dict[tuple[str, str], float]:
    """Share of the looped cores' spatially-linear work per stage (passes x pixels; 2x = 1, 4x = 1/4, ...)."""
    work = {(st["branch"], st["scale"]): st["passes"] / (int(st["scale"].rstrip("x")) // 2) ** 2 for st in iv["stages"]}
    total = sum(work.values())
    return {k: v / total for k, v in work.items()}


def anytime_reading(iv: dict[str, Any]) -> str:
    """Whether the decoder's finest stage is an any-time decoder: quality that rises with every retained pass
    (each adds > PASS_GAIN_DB on average) *and* a one-pass exit that costs < EXIT_MARGIN_DB; otherwise which
    passes stopped contributing and what share of the cores' work they are."""
    dec = stage(iv, "decoder", "2x")
    means = [p["psnr"] for p in dec["prefix"]]
    gains = [b - a for a, b in zip(means, means[1:])]
    idle = [k + 2 for k, g in enumerate(gains) if g <= PASS_GAIN_DB]
    exit_cost = means[-1] - means[0]
    per_pass = core_work(iv)[("decoder", "2x")] / dec["passes"]
    seq = " → ".join(f"{m:.3f}" for m in means)
    if not idle and exit_cost < EXIT_MARGIN_DB:
        return (f"decoder-2x prefixes {seq} dB: every pass adds more than {PASS_GAIN_DB} dB and one pass costs "
                f"{exit_cost:.2f} dB (< {EXIT_MARGIN_DB} dB): an any-time decoder.")
    if idle:
        return (f"decoder-2x prefixes {seq} dB (gains {', '.join(f'{g:+.3f}' for g in gains)}): pass(es) "
                f"{', '.join(map(str, idle))} add at most {PASS_GAIN_DB} dB each — they stopped contributing, "
                f"{100 * per_pass * len(idle):.0f}% of the cores' work idle. Not an any-time decoder (quality does "
                "not rise with compute).")
    return (f"decoder-2x prefixes {seq} dB: every pass adds more than {PASS_GAIN_DB} dB, but one pass costs "
            f"{exit_cost:.2f} dB (≥ {EXIT_MARGIN_DB} dB): a usable early exit does not appear.")


def _counts(values: list[int], n: int) -> str:
    return ", ".join(f"{v}/{n}" for v in values)


def reading(r: dict[str, Any]) -> list[str]:
    """Sentences computed from the measured numbers, each with the rule it was decided by."""
    ev, groups, params, gmacs = r["eval"], r["groups"], r["params"], r["gmacs"]
    wall = r.get("timings", {}).get("train", {})

    def values(group: str, split: str) -> list[float]:
        return [ev[n][split]["psnr"] for n in groups[group]]

    lines = ["## Reading (computed from the tables above)", "",
             "Every comparison is paired (by seed between arms, by image within a model), with a 95% t-interval "
             "(df = pairs − 1). The seed is the unit of every verdict: a comparison paired by seed gets one of three, "
             "**better** / **worse** (the interval excludes 0) or **inconclusive** (it does not, or there is one "
             "pair and no interval), never \"equal\". Pairs by image compare single runs, one per model: their "
             "interval covers image-to-image variation, not seed-to-seed, so it is descriptive and carries no "
             "verdict.",
             ""]
    spread = max(max(values("global", s)) - min(values("global", s)) for s in ("kodak", "imagenet"))
    budget = f"{r['preset']['max_steps'] * r['preset']['batch_size']:,} crops of {r['preset']['resolution']}² each"
    for split, label in (("kodak", "kodim21-24"), ("imagenet", f"{r['num_holdout']} held-out ImageNet images")):
        ref = values("reference", split)
        d = paired_by_seed(r, "global", "reference", split)
        flag = ""
        if seeds_disagree(ref, spread):
            flag = (f" ⚠ The reference's seeds differ by {max(ref) - min(ref):.2f} dB (the LoopVAE's by "
                    f"{spread:.2f}): one of them is likely a failed run, so its mean is not a reliable reference.")
        lines.append(
            f"- **Weights vs quality ({label}).** Global LoopVAE ({params['global'] / 1e6:.2f}M parameters, "
            f"{gmacs['global']:.2f} GMACs) {fmt(values('global', split))} dB, FLUX-layout reference "
            f"({params['reference'] / 1e6:.2f}M, {gmacs['reference']:.2f} GMACs) {fmt(ref)} dB; LoopVAE − reference "
            f"paired by seed: {d.describe()}." + flag)
    if wall:
        g_wall = [wall[n] for n in groups["global"] if n in wall]
        r_wall = [wall[n] for n in groups["reference"] if n in wall]
        if g_wall and r_wall:
            lines.append(f"- **Matched budget.** Both arms saw the same images ({budget}); in wall time the LoopVAE "
                         f"runs took {statistics.fmean(g_wall):.0f} s and the reference's "
                         f"{statistics.fmean(r_wall):.0f} s ({statistics.fmean(g_wall) / statistics.fmean(r_wall):.1f}×"
                         ", one core each): matched in images seen, not in time.")
    bic = statistics.fmean(ev[n]["kodak"]["baseline"]["psnr"] for n in groups["global"])
    best = r["bundled"]["name"]
    margin = ev[best]["kodak"]["psnr"] - bic
    lines.append(f"- **Against bicubic (kodim21-24).** {best} is {margin:+.2f} dB from the bicubic baseline "
                 f"({bic:.2f} dB at ≥ equal values per pixel; mean over images); the project's target is ≥ +1.0 dB: "
                 f"{'met' if margin >= 1.0 else 'not met'}.")
    sharing = {g: statistics.fmean(values(g, "imagenet")) for g in ("global", "scale", "none")}
    paper_order = sorted(PAPER_SHARING, key=lambda g: -PAPER_SHARING[g][0])
    lines.append(
        "- **Sharing.** Held-out ImageNet PSNR: " + ", ".join(f"{g} {v:.2f} dB" for g, v in sharing.items())
        + f" ({params['global'] / 1e6:.2f}M / {params['scale'] / 1e6:.2f}M / {params['none'] / 1e6:.2f}M parameters, "
        "equal MACs). scale and none ran one seed each, so every sharing comparison is **inconclusive** (one pair, "
        f"no interval); no order is claimed. The paper (Transformer, stage 1) orders them {' > '.join(paper_order)}.")
    d = paired_by_seed(r, "shortcuts", "global", "imagenet")
    lines.append(f"- **Shortcuts (our addition).** Shortcuts − plain on held-out ImageNet, paired by seed: "
                 f"{d.describe()} (one seed; the release below measures the shortcut model per image).")
    iv = r["interventions"][best]
    base = iv["baseline"]["psnr"]
    lines.append(f"- **Interventions, per image as the paper counts them** ({best}, {iv['num_images']} images; the "
                 f"paper: 64/64 monotone, 224/224 bypasses hurt):")
    for st in iv["stages"]:
        if st["passes"] < 2:
            continue
        c = per_image_criteria(iv, st)
        seq = " → ".join(f"{p['psnr']:.2f}" for p in st["prefix"])
        worst = max(range(len(c["worst"])), key=c["worst"].__getitem__)
        lines.append(f"  - {st['branch']} {st['scale']}: prefixes {seq} dB (means), monotone on {c['monotone']}/"
                     f"{c['n']} images; bypassing pass 1..{st['passes']} lowers PSNR on "
                     f"{_counts(c['bypass_hurts'], c['n'])}"
                     f" images; the worst bypass is pass {worst + 1} on {c['worst'][worst]}/{c['n']} images "
                     f"({'the last pass' if worst + 1 == st['passes'] else 'not the last pass, as in the paper'}).")
    one = stage(iv, "decoder", "2x")["prefix"][0]
    lines += [
        f"- **Truncation.** One decoder-2x pass costs {base - one['psnr']:.2f} dB (target ≥ 5 dB: "
        f"{'met' if base - one['psnr'] >= 5 else 'not met'}; paper 17.74).",
        f"- **Out-of-range colours at an early exit.** With one decoder-2x pass {100 * one['out_of_range']:.1f}% "
        f"of pixels are out of range (full depth {100 * iv['baseline']['out_of_range']:.1f}%; paper 96.7%), raw PSNR "
        f"{one['raw_psnr']:.2f} dB against {one['psnr']:.2f} clipped (paper −1.04 raw), clipping displacement "
        f"{one['clip_displacement']:.4f} (full depth {iv['baseline']['clip_displacement']:.4f}).",
    ]
    if "global-ds-s0" in r["interventions"] and "global-s0" in r["interventions"]:
        ds, plain = r["interventions"]["global-ds-s0"], r["interventions"]["global-s0"]
        ds_dec, plain_dec = stage(ds, "decoder", "2x"), stage(plain, "decoder", "2x")
        exits = [paired_difference(d["per_image"]["psnr"], p["per_image"]["psnr"])
                 for d, p in zip(ds_dec["prefix"], plain_dec["prefix"])]
        lines.append(
            "- **Deep supervision (beyond the paper).** Deeply supervised − plain (seed 0 of each, one run per "
            f"model: descriptive), paired by image, with k = 1..{len(exits)} decoder-2x passes: "
            + "; ".join(f"k={k + 1}: {e.describe(verdict=False)}" for k, e in enumerate(exits)) + ". "
            + anytime_reading(ds))
    return lines + [""]


# -- report ----------------------------------------------------------------------------------------
def plots(r: dict[str, Any], folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    ev, groups = r["eval"], r["groups"]
    order = ["global", "scale", "none", "reference", "shortcuts", "deep-supervision"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, split, title in ((axes[0], "kodak", "kodim21-24"), (axes[1], "imagenet", "held-out ImageNet")):
        for i, g in enumerate(order):
            vals = [ev[n][split]["psnr"] for n in groups[g]]
            ax.bar(i, statistics.fmean(vals), color="C0" if g != "reference" else "C1", alpha=0.6)
            ax.scatter([i] * len(vals), vals, color="k", s=12, zorder=3)
        bic = statistics.fmean(ev[n][split]["baseline"]["psnr"] for n in groups["global"])
        ax.axhline(bic, color="C3", ls="--", label=f"bicubic {bic:.2f} dB")
        ax.set_xticks(range(len(order)), order, rotation=25, ha="right")
        low = min(ev[n][split]["psnr"] for g in order for n in groups[g])
        ax.set_ylim(min(low, bic) - 1.0, None)
        ax.set(ylabel="PSNR (dB) at 256²", title=f"{title} (points: seeds)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(folder / "psnr.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, curve in r["curves"].items():
        steps, vals = zip(*curve)
        k = 5
        smooth = [statistics.fmean(vals[max(0, i - k):i + 1]) for i in range(len(vals))]
        ax.plot(steps, smooth, label=name, lw=1)
    ax.set(xlabel="step", ylabel="training L1 (running mean of 6 logs)", yscale="log", title="training curves")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "training_l1.png", dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, iv in r["interventions"].items():
        dec = stage(iv, "decoder", "2x")
        ks = [p["passes"] for p in dec["prefix"]]
        axes[0].plot(ks, [p["psnr"] for p in dec["prefix"]], marker="o", label=f"{name} clipped")
        axes[0].plot(ks, [p["raw_psnr"] for p in dec["prefix"]], marker="x", ls=":", label=f"{name} raw")
    axes[0].plot(range(1, 5), PAPER_PREFIX_DEC2X, marker="s", color="gray", label="paper (clipped)")
    axes[0].set(xlabel="retained decoder-2x passes k", ylabel="PSNR (dB)", title="prefix truncation, decoder 2x")
    axes[0].legend(fontsize=7)
    best = r["interventions"][r["bundled"]["name"]]
    width = 0.8 / max(1, sum(st["passes"] > 1 for st in best["stages"]))
    j = 0
    for st in best["stages"]:
        if st["passes"] < 2:
            continue
        xs = [t + 1 + (j - 2) * width for t in range(st["passes"])]
        axes[1].bar(xs, [best["baseline"]["psnr"] - b["psnr"] for b in st["bypass"]], width,
                    label=f"{st['branch']} {st['scale']}")
        j += 1
    axes[1].set(xlabel="bypassed pass", ylabel="PSNR loss (dB)", title=f"single-pass bypass ({r['bundled']['name']})")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "interventions.png", dpi=120)
    plt.close(fig)


def render(r: dict[str, Any], command: str, folder: Path | None = None) -> str:
    """The study page; with ``folder`` (the page's asset folder) also the recipe search and release sections."""
    ev, groups = r["eval"], r["groups"]
    lpips_note = "LPIPS (AlexNet)" if r["lpips_net"] != "none" else "LPIPS: not computed (AlexNet weights absent)"
    lines = [
        "# LoopVAE at CPU scale: does the recurrence do work?", "",
        f"Produced by `{command}` on {r['date']} (2-core CPU, torch {torch.__version__}); whole study "
        f"{r['runtime_s'] / 60:.0f} min: {r['train_s'] / 60:.0f} min of training ({r['jobs']} runs at a time with "
        f"{r['threads']} thread(s) each; per-run wall times in `study_loopvae/results.json`) and "
        f"{r['post_s'] / 60:.0f} min of throughput measurement, evaluation and interventions."
        + (f" Interrupted once: {r['timings']['interrupted']['note']}." if "interrupted" in r["timings"] else ""),
        "",
        f"**Budget (every arm):** preset `{PRESET}` (`packages/vae/loopvae/configs/{PRESET}.yaml`): "
        f"{r['preset']['max_steps']} AdamW steps of {r['preset']['batch_size']} random "
        f"{r['preset']['resolution']}² crops (shorter side resized to {r['preset']['scale_jitter']}× the crop first), "
        f"lr {r['preset']['lr']} ({r['preset']['warmup_steps']} warm-up steps, cosine to "
        f"{r['preset']['min_lr_ratio']}×), L1 + {r['preset']['kl_weight']} KL, latent noise "
        f"{r['preset']['latent_noise_std']}, EMA {r['preset']['ema_decay']} (evaluated), fp32. "
        f"**Data:** {r['num_train']} training images (the shared ImageNet sample without the "
        f"{r['num_holdout']} held-out images — every 20th by sorted key — plus kodim01–20 from `assets/kodak`); "
        "evaluation at 256² (shorter side resized, centre crop) on kodim21–24 and the held-out ImageNet images, "
        "posterior mode, "
        f"uint8 outputs ([metric protocol](evaluation.md)). {lpips_note}. rFID is not reported: 4 or 40 images cannot "
        "estimate it.", "",
        "## Reconstruction at a matched budget", "",
        "Mean ± seed s.d. where an arm has two seeds. *train img/s*: training images per second of each "
        "architecture measured side by side in one process (batch and crops of the budget, 2 threads).", "",
        "| arm | runs | params | GMACs @256² | train img/s | kodim21–24 PSNR | SSIM | held-out ImageNet PSNR | SSIM |"
        + (" LPIPS |" if r["lpips_net"] != "none" else ""),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if r["lpips_net"] != "none" else ""),
    ]
    for g in ("global", "scale", "none", "reference", "shortcuts", "deep-supervision"):
        names = groups[g]
        cells = [fmt([ev[n]["kodak"]["psnr"] for n in names]), fmt([ev[n]["kodak"]["ssim"] for n in names], 4),
                 fmt([ev[n]["imagenet"]["psnr"] for n in names]), fmt([ev[n]["imagenet"]["ssim"] for n in names], 4)]
        if r["lpips_net"] != "none":
            cells.append(fmt([ev[n]["imagenet"]["lpips"] for n in names], 4))
        lines.append(f"| {g} | {', '.join(names)} | {r['params'][g] / 1e6:.3f}M | {r['gmacs'][g]:.2f} | "
                     f"{r['throughput'][g]:.1f} | " + " | ".join(cells) + " |")
    n0 = groups["global"][0]
    for split, label in (("kodak", "kodim21–24"), ("imagenet", "held-out ImageNet")):
        b = ev[n0][split]["baseline"]
        lines.append(f"| bicubic via {b['low_resolution'][0]}×{b['low_resolution'][1]} ({label}) | – | 0 | – | – | "
                     + (f"{b['psnr']:.2f} | {b['ssim']:.4f} | – | – |" if split == "kodak"
                        else f"– | – | {b['psnr']:.2f} | {b['ssim']:.4f} |") + (" – |" if r["lpips_net"] != "none"
                                                                              else ""))
    vpp = 3 * ev[n0]["kodak"]["baseline"]["low_resolution"][0] ** 2 / 256**2
    lines += ["", f"The bicubic baseline keeps {vpp:.3f} values per pixel, the f8 16-channel latents 0.250.", "",
              "![PSNR per arm](study_loopvae/psnr.png)", "", "![training curves](study_loopvae/training_l1.png)", "",
              "## Interventions (paper Table 7 side by side)", "",
              f"On `{r['bundled']['name']}` (seed 0 of the global arm, fixed in advance rather than picked on the "
              f"reported images), {r['interventions'][r['bundled']['name']]['num_images']} images "
              "(kodim21–24 + held-out ImageNet), posterior mode. PSNR clipped / raw (dB) on the float output u in "
              "[0, 1] (clip(u) / u, the paper's protocol, not uint8), out-of-range pixels.", "",
              "| branch | scale | L | k=1 | k=2 | k=3 | k=4 | bypass loss per pass (dB) |",
              "|---|---|---:|---|---|---|---|---|"]
    iv = r["interventions"][r["bundled"]["name"]]
    base = iv["baseline"]["psnr"]
    for st in iv["stages"]:
        cells = [f"{p['psnr']:.2f} / {p['raw_psnr']:.2f} ({100 * p['out_of_range']:.1f}%)" for p in st["prefix"]]
        cells += [""] * (4 - len(cells))
        byp = ", ".join(f"{base - b['psnr']:.2f}" for b in st["bypass"])
        lines.append(f"| {st['branch']} | {st['scale']} | {st['passes']} | " + " | ".join(cells) + f" | {byp} |")
    one = stage(iv, "decoder", "2x")["prefix"][0]
    lines += [
        f"| **paper** decoder | 2x | 4 | {PAPER_PREFIX_DEC2X[0]} / {PAPER_RAW_1PASS} "
        f"({100 * PAPER_OUT_OF_RANGE_1PASS:.1f}%) | {PAPER_PREFIX_DEC2X[1]} | {PAPER_PREFIX_DEC2X[2]} | "
        f"{PAPER_PREFIX_DEC2X[3]} | {PAPER_BYPASS_RANGE[0]}–{PAPER_BYPASS_RANGE[1]} (all stages) |", "",
        f"Baseline {base:.2f} dB (raw {iv['baseline']['raw_psnr']:.2f}), {100 * iv['baseline']['out_of_range']:.2f}% "
        f"out of range, clipping displacement {iv['baseline']['clip_displacement']:.4f}; one decoder-2x pass: "
        f"displacement {one['clip_displacement']:.4f}. Relative updates per pass are in "
        f"`{r['runs']}/{r['bundled']['name']}/interventions/interventions.md`.", "",
        "![interventions](study_loopvae/interventions.png)", "",
    ]
    if "global-ds-s0" in r["interventions"]:
        lines += ["### Deep supervision on the decoder's finest-stage passes (beyond the paper)", "",
                  "`deep_supervision_weight=1.0`: every earlier decoder-2x pass is also decoded by the output head "
                  "and given the L1 loss (pass k of 4 weighted k/4). Decoder-2x prefix, clipped / raw PSNR "
                  "(out of range):", "",
                  "| run | k=1 | k=2 | k=3 | k=4 (full) |", "|---|---|---|---|---|"]
        for name in ("global-s0", "global-ds-s0"):
            dec = stage(r["interventions"][name], "decoder", "2x")
            cells = [f"{p['psnr']:.2f} / {p['raw_psnr']:.2f} ({100 * p['out_of_range']:.1f}%)" for p in dec["prefix"]]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += reading(r)
    b = r["bundled"]
    lines += ["## The study's model", "",
              f"`{b['name']}` (EMA weights, {b['params']:,} parameters, `{WEIGHTS_NAME}` sha256 `{b['sha256']}`) was "
              "the bundled model until `make release-vae` replaced it (below). Reproduce it: `"
              f"{command}`, or the single run: `loopvae train --config {PRESET} --data <the study's training shards> "
              f"--out RUN --set {' '.join(b['overrides'])}`.", ""]
    if folder is not None:
        from release_vae_report import recipe_section, references_section, release_section

        lines += recipe_section(folder)
        release = json.loads((folder / "release.json").read_text()) if (folder / "release.json").is_file() else None
        if release is not None:
            lines += release_section(release, folder)
        if (folder / "references.json").is_file():
            lines += references_section(json.loads((folder / "references.json").read_text()), release)
    return "\n".join(lines)


def write_model_card(folder: Path, r: dict[str, Any], command: str) -> None:
    b, ev = r["bundled"], r["eval"][r["bundled"]["name"]]
    iv = r["interventions"][b["name"]]
    dec = stage(iv, "decoder", "2x")
    text = f"""# loopvae-cnn-tiny, trained (bundled with loopvision)

A CPU-scale LoopVAE (`loopvae-cnn-tiny`: width 48, K = 2 ConvNeXt adaLN-Zero blocks per branch, passes
[1, 2, 4] per branch, global sharing, no shortcuts, f8 with 16 latent channels), trained by
`{command}` as study run `{b['name']}`.

* parameters: {b['params']:,}; {r['gmacs']['global']:.2f} GMACs per 256² reconstruction
* training: preset `{PRESET}`, {r['preset']['max_steps']} steps × {r['preset']['batch_size']} crops of
  {r['preset']['resolution']}², {r['num_train']} images (shared ImageNet sample minus {r['num_holdout']} held out,
  plus kodim01–20); EMA weights
* kodim21–24 at 256²: PSNR {ev['kodak']['psnr']:.2f} dB, SSIM {ev['kodak']['ssim']:.4f} (bicubic at ≥ equal
  values per pixel: {ev['kodak']['baseline']['psnr']:.2f} dB); held-out ImageNet: {ev['imagenet']['psnr']:.2f} dB
* decoder finest stage, PSNR with k = 1..4 passes: {' → '.join(f"{p['psnr']:.2f}" for p in dec['prefix'])} dB
  (the study's {len(iv['keys'])} intervention images: kodim21–24 and held-out ImageNet)
* protocol: posterior mode, uint8 outputs, PSNR per image averaged, SSIM Gaussian 11×11 σ = 1.5
* `diffusion_pytorch_model.safetensors` sha256: `{b['sha256']}`

Load: `loopvae.LoopVAE.from_pretrained("{b['path']}")`; every `loopvae` command takes the folder as
`--checkpoint`. Details: `docs/study_loopvae.md`.
"""
    (folder / "README.md").write_text(text)
