"""The bundled release's section of ``docs/study_loopvae.md``, computed from ``docs/study_loopvae/release.json``
(written by ``benchmarks/release_vae.py``), and the recipe search's section (``recipe_search.md``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paired_stats import PairedDifference
from study_loopvae_report import anytime_reading, per_image_criteria, stage

LOOPVAE, REFERENCE = "loopvae-s0", "flux-vae-tiny-s0"


def _diff(d: dict[str, Any], unit: str = "dB", digits: int = 2) -> str:
    """A by-image difference between single runs: descriptive, without a verdict word."""
    return PairedDifference(**d).describe(unit=unit, digits=digits, verdict=False)


def recipe_section(folder: Path) -> list[str]:
    """``recipe_search.md`` (vae_recipe_search.py) with its headings one level down, if it exists."""
    path = folder / "recipe_search.md"
    if not path.is_file():
        return []
    body = path.read_text().splitlines()[1:]
    body = [("#" + line) if line.startswith("#") else line for line in body]
    body = [line.replace("](recipe_search.png)", f"]({folder.name}/recipe_search.png)") for line in body]
    return ["## Recipe search for the bundled model (`make recipe-search-vae`)", *body, ""]


def release_section(r: dict[str, Any], folder: Path) -> list[str]:
    """The measured release: table, paired verdicts, learning curve, latent statistics, interventions."""
    ev, cmp = r["eval"], r["comparisons"]
    hours = r["train_seconds"][LOOPVAE] / 3600
    lines = [
        "## The bundled model: `assets/models/loopvae-cnn-tiny` (`make release-vae`)", "",
        f"Produced by `{r['command']}` on {r['date']}: `loopvae-cnn-tiny` with the shortcuts, preset `{r['preset']}`, "
        f"{r['steps']:,} steps × {r['batch_size']} crops of {r['resolution']}² = {r['images_seen']:,} crops seen "
        f"(≈ {r['images_seen'] / 17_600:.1f}× the study budget above), {hours:.2f} CPU-hours of optimisation "
        f"({r['wall_seconds'][LOOPVAE] / 60:.0f} min wall on one core, validation included). The reference "
        f"`flux-vae-tiny` trained with the same recipe on the same images seen: "
        f"{r['train_seconds'][REFERENCE] / 3600:.2f} CPU-hours ({r['wall_seconds'][REFERENCE] / 60:.0f} min wall). "
        f"Data: {r['num_train']} training images; model selection (the recipe search, the learning curve) used "
        f"only the {r['num_validation']} validation images, disjoint from training and from the reported sets.", "",
        "| model | params | GMACs @256² | kodim21–24 PSNR | SSIM | held-out ImageNet PSNR | SSIM |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, label in ((LOOPVAE, "LoopVAE (bundled)"), (REFERENCE, "flux-vae-tiny (reference)")):
        lines.append(f"| {label} | {r['params'][name] / 1e6:.3f}M | {r['gmacs'][name]:.2f} | "
                     f"{ev[name]['kodak']['psnr']:.2f} | {ev[name]['kodak']['ssim']:.4f} | "
                     f"{ev[name]['imagenet']['psnr']:.2f} | {ev[name]['imagenet']['ssim']:.4f} |")
    kb, ib = ev[LOOPVAE]["kodak"]["baseline"], ev[LOOPVAE]["imagenet"]["baseline"]
    lines += [f"| bicubic via {kb['low_resolution'][0]}×{kb['low_resolution'][1]} | 0 | – | {kb['psnr']:.2f} | "
              f"{kb['ssim']:.4f} | {ib['psnr']:.2f} | {ib['ssim']:.4f} |", "",
              "Paired by image (95% t-interval), one run per model: the intervals cover images, not training "
              "runs, so they are descriptive and carry no verdict. The seed-level comparison against tuned "
              "references is in [study_fair.md](study_fair.md).", ""]
    for split, label in (("kodak", "kodim21–24"), ("imagenet", f"{r['num_holdout']} held-out ImageNet images")):
        c = cmp[split]
        bar = "met" if c["margin_over_bicubic"] >= 1.0 else "not met"
        lines += [f"- {label}: LoopVAE − bicubic {_diff(c['vs_bicubic_psnr'])} (the bar, ≥ +1.0 dB: {bar}); "
                  f"LoopVAE − reference PSNR {_diff(c['vs_reference_psnr'])}; SSIM "
                  f"{_diff(c['vs_reference_ssim'], unit='', digits=4)}."]
    ls, hl = r["latent_stats"], r["heldout_latents"]
    lines += [
        f"- Latent normalisation (`loopvae latent-stats`, {ls['num_images']} training images, posterior "
        f"{ls['posterior']}s at {ls['resolution']}²): shift_factor {ls['shift_factor']:.4f}, scaling_factor "
        f"{ls['scaling_factor']:.4f}; normalised latents of the held-out ImageNet images: mean {hl['mean']:+.3f}, "
        f"s.d. {hl['std']:.3f}"
        + (f"; of kodim21–24: mean {r['kodak_latents']['mean']:+.3f}, s.d. {r['kodak_latents']['std']:.3f} (4 photos "
           "of another collection, less varied than the training images)." if "kodak_latents" in r else "."), "",
        f"![learning curves]({folder.name}/release_curve.png)", "",
    ]
    iv = r["interventions"]
    lines += [f"**Interventions on the bundled model** ({iv['num_images']} images: kodim21–24 + held-out ImageNet; "
              "float output, clipped / raw PSNR):", "",
              "| branch | scale | L | prefix k = 1..L (mean dB) | monotone (images) | bypass hurts, pass 1..L | worst "
              "bypass (images) |", "|---|---|---:|---|---:|---|---|"]
    for st in iv["stages"]:
        seq = " → ".join(f"{p['psnr']:.2f}" for p in st["prefix"])
        if st["passes"] < 2:
            base_img, byp_img = iv["baseline"]["per_image"]["psnr"], st["bypass"][0]["per_image"]["psnr"]
            hurt = sum(b < a for a, b in zip(base_img, byp_img))
            lines.append(f"| {st['branch']} | {st['scale']} | 1 | {seq} | – | {hurt}/{iv['num_images']} | – |")
            continue
        c = per_image_criteria(iv, st)
        worst = ", ".join(f"pass {t + 1}: {w}" for t, w in enumerate(c["worst"]) if w)
        hurts = ", ".join(f"{h}/{c['n']}" for h in c["bypass_hurts"])
        lines.append(f"| {st['branch']} | {st['scale']} | {st['passes']} | {seq} | {c['monotone']}/{c['n']} | "
                     f"{hurts} | {worst} |")
    dec = stage(iv, "decoder", "2x")
    one = dec["prefix"][0]
    base = iv["baseline"]["psnr"]
    lines += ["", f"- Decoder-finest 1-pass truncation costs {base - one['psnr']:.2f} dB (paper 17.74; our target "
                  f"≥ 5 dB: {'met' if base - one['psnr'] >= 5 else 'not met'}); at one pass "
                  f"{100 * one['out_of_range']:.1f}% of pixels are out of range, raw PSNR {one['raw_psnr']:.2f} dB.",
              f"- Any-time: {anytime_reading(iv)}", "",
              f"![prefix truncation]({folder.name}/release-psnr_vs_passes.png)", ""]
    return lines


def references_section(refs: dict[str, Any], release: dict[str, Any] | None,
                       heading: str = "## The tuned references bundled next to it (`make release-references`)",
                       searches: str = "[study_fair.md](study_fair.md), section 2",
                       seeds: str = "seeds: [study_fair.md](study_fair.md)") -> list[str]:
    """The tuned references trained to the bundled model's crops seen (``references.json``, written by
    ``benchmarks/release_references.py``): one run each, so the numbers are descriptive; the seed-level comparison
    is ``study_fair.md``. ``searches`` and ``seeds`` say where the recipe searches and the seed-level comparison
    are, as seen from the page the section goes into."""
    lines = [heading, "",
             f"Produced by `{refs['command']}` on {refs['date']}: each reference at the recipe its own search picked "
             f"({searches}), for the crops the bundled LoopVAE saw, on the same "
             "training and validation images; bundled only if it beats bicubic on the held-out images. One training "
             f"run per model: these numbers describe runs and carry no verdict ({seeds}).",
             "", "| model | class | params | GMACs @256² | crops seen | training CPU-hours | recipe | kodim21–24 "
             "PSNR / SSIM | held-out ImageNet PSNR / SSIM | bicubic (held-out) | bundled |",
             "|---|---|---:|---:|---:|---:|---|---|---|---:|---|"]
    if release is not None:
        ev, name = release["eval"][LOOPVAE], LOOPVAE
        lines.append(f"| `loopvae-cnn-tiny` + shortcuts (the bundled LoopVAE) | LoopVAE | "
                     f"{release['params'][name] / 1e6:.3f}M | {release['gmacs'][name]:.2f} | "
                     f"{release['images_seen']:,} | {release['train_seconds'][name] / 3600:.2f} | release-tiny | "
                     f"{ev['kodak']['psnr']:.2f} / {ev['kodak']['ssim']:.4f} | {ev['imagenet']['psnr']:.2f} / "
                     f"{ev['imagenet']['ssim']:.4f} | {ev['imagenet']['baseline']['psnr']:.2f} | yes |")
    for model, r in refs["references"].items():
        ev = r["eval"]
        lines.append(f"| `{model}` | {r['class']} | {r['params'] / 1e6:.3f}M | {r['gmacs']:.2f} | "
                     f"{r['images_seen']:,} | {r['train_seconds'] / 3600:.2f} | {r['recipe_arm']} | "
                     f"{ev['kodak']['psnr']:.2f} / {ev['kodak']['ssim']:.4f} | {ev['imagenet']['psnr']:.2f} / "
                     f"{ev['imagenet']['ssim']:.4f} | {ev['imagenet']['baseline']['psnr']:.2f} | "
                     f"{'yes' if r.get('bundled') else 'no: ' + r.get('refused', 'not bundled')} |")
    curves = {"the bundled LoopVAE": release["curves"][LOOPVAE]} if release is not None else {}
    curves.update({f"`{model}`": r["curve"] for model, r in refs["references"].items()})
    lines += ["", "Validation PSNR (40 validation images, EMA weights) over the last three evaluations, and what the "
              "last fifth of the steps added (a run still gaining has not flattened):", ""]
    for label, curve in curves.items():
        last = curve[-1]
        fifth = min(curve, key=lambda p: abs(p["step"] - 0.8 * last["step"]))
        values = " → ".join(f"{p['psnr']:.2f}" for p in curve[-3:])
        steps = ", ".join(f"{p['step']:,}" for p in curve[-3:])
        lines.append(f"- {label}: {values} dB at steps {steps}; steps {fifth['step']:,} → {last['step']:,}: "
                     f"{last['psnr'] - fifth['psnr']:+.2f} dB.")
    return [*lines, ""]
