"""The LoopVAE study's report: statistics, the computed reading, plots, the markdown page and the bundled model's
card, all from the ``result`` dict that ``study_loopvae.py`` measures (also saved as ``results.json``).

Every sentence of the reading is computed from the numbers and states the condition it was decided by;
the paper's figures it is set against are the constants below.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import torch

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


def compare(a: list[float], b: list[float], noise: float) -> str:
    """'higher' / 'lower' / 'within noise' for mean(a) vs mean(b), ``noise`` the smallest gap that counts."""
    diff = statistics.fmean(a) - statistics.fmean(b)
    if abs(diff) <= noise:
        return "within noise of"
    return "above" if diff > 0 else "below"


def early_exit_verdict(gains: list[float], noise: float) -> str:
    """Which truncated decoder-2x depths deep supervision improves by more than ``noise`` dB."""
    better = [k for k, g in enumerate(gains, 1) if g > noise]
    if len(better) == len(gains):
        return f"every early exit improves by more than the seed noise ({noise:.2f} dB): an any-time decoder."
    if not better:
        return f"no early exit improves by more than the seed noise ({noise:.2f} dB)."
    return (f"the exits after {', '.join(map(str, better))} pass(es) improve by more than the seed noise "
            f"({noise:.2f} dB), the others do not.")


def stage(result: dict[str, Any], branch: str, scale: str) -> dict[str, Any]:
    return next(s for s in result["stages"] if s["branch"] == branch and s["scale"] == scale)


def reading(r: dict[str, Any]) -> list[str]:
    """Sentences computed from the measured numbers, each with the condition it was decided by."""
    ev, groups = r["eval"], r["groups"]

    def psnr(group: str, split: str) -> list[float]:
        return [ev[n][split]["psnr"] for n in groups[group]]

    def seed_noise(group: str) -> float:
        """The group's largest seed s.d. over both splits; one-seed LoopVAE variants borrow the global arm's."""
        sds = [mean_sd(psnr(group, s))[1] for s in ("kodak", "imagenet")]
        if None in sds:
            return seed_noise("global") if group != "global" else 0.05
        return max(max(sds), 0.05)

    def noise(*compared: str) -> float:
        return max(seed_noise(g) for g in compared)

    lines = ["## Reading (computed from the tables above)", "",
             f"Seed noise: a gap counts only when it exceeds the larger seed s.d. of the two arms compared (global "
             f"LoopVAE {seed_noise('global'):.2f} dB, FLUX-layout reference {seed_noise('reference'):.2f} dB; "
             "arms with one seed are LoopVAE variants and borrow the global arm's).", ""]
    params, gmacs = r["params"], r["gmacs"]
    for split, label in (("kodak", "kodim21-24"), ("imagenet", f"{r['num_holdout']} held-out ImageNet images")):
        g, ref = psnr("global", split), psnr("reference", split)
        verdict = compare(g, ref, noise("global", "reference"))
        lines.append(
            f"- **Weights vs quality ({label}).** The global LoopVAE ({params['global'] / 1e6:.2f}M parameters, "
            f"{gmacs['global']:.2f} GMACs) reaches {fmt(g)} dB, {verdict} the FLUX-layout reference "
            f"({params['reference'] / 1e6:.2f}M, {gmacs['reference']:.2f} GMACs) at {fmt(ref)} dB "
            f"({statistics.fmean(g) - statistics.fmean(ref):+.2f} dB). "
            + ("The paper's claim (about a third of the weights for comparable quality) holds at this budget."
               if verdict != "below" else
               "The paper's parity at a third of the weights does not appear at this budget.")
        )
    bic = statistics.fmean(ev[n]["kodak"]["baseline"]["psnr"] for n in groups["global"])
    best = r["bundled"]["name"]
    margin = ev[best]["kodak"]["psnr"] - bic
    lines.append(f"- **Against bicubic (kodim21-24).** The best global LoopVAE ({best}) is {margin:+.2f} dB from the "
                 f"bicubic baseline ({bic:.2f} dB at ≥ equal values per pixel); the project's target is ≥ +1.0 dB: "
                 f"{'met' if margin >= 1.0 else 'not met'}.")
    order = sorted(("global", "scale", "none"), key=lambda g: -statistics.fmean(psnr(g, "imagenet")))
    spread = statistics.fmean(psnr(order[0], "imagenet")) - statistics.fmean(psnr(order[-1], "imagenet"))
    paper_order = sorted(PAPER_SHARING, key=lambda g: -PAPER_SHARING[g][0])
    lines.append(
        f"- **Sharing.** Held-out ImageNet PSNR orders the rules {' > '.join(order)} (spread {spread:.2f} dB, "
        f"{'beyond' if spread > noise('global', 'scale', 'none') else 'within'} the seed noise) with "
        f"{params['scale'] / 1e6:.2f}M / "
        f"{params['none'] / 1e6:.2f}M parameters for scale / none against global's {params['global'] / 1e6:.2f}M at "
        f"equal MACs. The paper (Transformer, stage 1) orders them {' > '.join(paper_order)} in PSNR."
    )
    sc = psnr("shortcuts", "imagenet")
    shortcut_verdict = compare(sc, psnr("global", "imagenet"), noise("global", "shortcuts"))
    lines.append(f"- **Shortcuts (our addition).** With the parameter-free shortcuts the tiny LoopVAE scores "
                 f"{fmt(sc)} dB on held-out ImageNet, {shortcut_verdict} the "
                 f"plain-conv model ({fmt(psnr('global', 'imagenet'))} dB).")
    iv = r["interventions"][best]
    base = iv["baseline"]["psnr"]
    monotone, bypass_all, worst = [], [], []
    for st in iv["stages"]:
        if st["passes"] < 2:
            continue
        seq = [p["psnr"] for p in st["prefix"]]
        monotone.append((f"{st['branch']} {st['scale']}", all(b > a for a, b in zip(seq, seq[1:]))))
        losses = [base - b["psnr"] for b in st["bypass"]]
        bypass_all.append(all(v > 0 for v in losses))
        worst.append((f"{st['branch']} {st['scale']}", 1 + max(range(len(losses)), key=losses.__getitem__),
                      st["passes"]))
    dec = stage(iv, "decoder", "2x")
    one = dec["prefix"][0]
    dec2x_seq = " → ".join(f"{p['psnr']:.2f}" for p in dec["prefix"])
    not_mono = [n for n, ok in monotone if not ok]
    lines += [
        f"- **Completing the recurrence.** Prefix PSNR rises strictly with every retained pass in "
        f"{sum(ok for _, ok in monotone)} of {len(monotone)} multi-pass stages"
        + (f" (not in: {', '.join(not_mono)})." if not_mono else "."),
        f"  Decoder 2x: {dec2x_seq} dB (paper "
        f"{' → '.join(map(str, PAPER_PREFIX_DEC2X))}); truncating it to one pass costs {base - one['psnr']:.2f} dB "
        f"(target ≥ 5 dB: {'met' if base - one['psnr'] >= 5 else 'not met'}; paper 17.74).",
        f"- **Bypass.** Every single-pass bypass lowers PSNR in {sum(bypass_all)} of {len(bypass_all)} multi-pass "
        f"stages; the most damaging bypass is the last pass in "
        f"{sum(w == n for _, w, n in worst)} of {len(worst)} of them "
        f"({', '.join(f'{s}: pass {w} of {n}' for s, w, n in worst)}; the paper: not the last).",
        f"- **Out-of-range colours at an early exit.** With one decoder-2x pass {100 * one['out_of_range']:.1f}% "
        f"of pixels are out of range (full depth {100 * iv['baseline']['out_of_range']:.1f}%; paper 96.7%), raw PSNR "
        f"{one['raw_psnr']:.2f} dB against {one['psnr']:.2f} clipped (paper −1.04 raw), clipping displacement "
        f"{one['clip_displacement']:.4f} (full depth {iv['baseline']['clip_displacement']:.4f}).",
    ]
    if "global-ds-s0" in r["interventions"]:
        ds = stage(r["interventions"]["global-ds-s0"], "decoder", "2x")
        plain = stage(r["interventions"]["global-s0"], "decoder", "2x")
        full_change = r["interventions"]["global-ds-s0"]["baseline"]["psnr"] - r["interventions"]["global-s0"][
            "baseline"]["psnr"]
        gains = [d["psnr"] - p["psnr"] for d, p in zip(ds["prefix"][:-1], plain["prefix"][:-1])]
        lines.append(
            f"- **Deep supervision (beyond the paper).** Against the same-seed global run it changes full-depth PSNR "
            f"by {full_change:+.2f} dB and PSNR at 1–{len(gains)} decoder-2x passes by "
            f"{', '.join(f'{g:+.2f}' for g in gains)} dB (out of range at one pass "
            f"{100 * ds['prefix'][0]['out_of_range']:.1f}% vs {100 * plain['prefix'][0]['out_of_range']:.1f}%): "
            + early_exit_verdict(gains, noise("global", "deep-supervision"))
        )
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


def render(r: dict[str, Any], command: str) -> str:
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
        f"uint8 outputs (README metric protocol). {lpips_note}. rFID is not reported: 4 or 40 images cannot "
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
              f"On `{r['bundled']['name']}` (the best global LoopVAE by held-out ImageNet PSNR; bundled as "
              f"`{r['bundled']['path']}`), {r['interventions'][r['bundled']['name']]['num_images']} images "
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
    lines += ["## The bundled model", "",
              f"`{b['path']}` = the release of `{b['name']}` (EMA weights, {b['params']:,} parameters), "
              f"`{WEIGHTS_NAME}` sha256 `{b['sha256']}`. Reproduce: `{command}` (it retrains and re-bundles), "
              "or "
              f"the single run: `loopvae train --config {PRESET} --data <the study's training shards> --out RUN "
              f"--set {' '.join(b['overrides'])}`.", ""]
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
