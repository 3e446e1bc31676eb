"""``make demo`` / ``loopvae demo``: the main job on the bundled Kodak images, in minutes on a CPU.

1. a short ``tiny-stage1`` training run of ``loopvae-cnn-tiny`` on ``kodak-train`` (kodim01-20), to show
   the training pipeline (rerunning resumes or reuses it);
2. evaluate the **bundled trained model** (``assets/models/loopvae-cnn-tiny``, trained by
   ``make release-vae``) and the demo's own short run on ``kodak-val`` (kodim21-24, never trained on) at
   256^2 next to the bicubic baseline;
3. run the loop interventions on the bundled model;
4. compare the bundled model with the tuned references bundled beside it (``loopvae compare``: one table,
   one picture of the three on the same images) and time the three architectures side by side on the CPU;
   count the paper models' parameters and MACs;
5. write ``report.md`` with the tables, the pictures and the plots, naming the model of every section.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import loopdata
from loopdata.assets import repo_root
from looprun.release import WEIGHTS_NAME

from .evaluate import EvalOptions, evaluate
from .intervene import intervene
from .perceptual import default_backbone_path
from .profile import plot as plot_profile
from .profile import profile_model
from .profile import render_markdown as render_profile
from .train_config import load_train_config
from .trainer import train

PAPER_MODELS = ("loopvae-cnn-f8d16", "loopvae-vit-f8d16", "loopvae-multi", "sd-vae", "flux-vae")
# the bundled models' architectures: the LoopVAE and the two tuned references trained beside it
TIMED_MODELS = ("loopvae-cnn-tiny-sc", "klvae-tiny-w32-attn", "dcae-tiny")
REFERENCES = ("klvae-tiny-w32-attn", "dcae-tiny")
DEMO_TRAIN_STEPS = 200


def bundled_model_dir() -> Path:
    """The trained tiny LoopVAE committed with the repository (``assets/models/loopvae-cnn-tiny``)."""
    path = repo_root() / "assets" / "models" / "loopvae-cnn-tiny"
    if not (path / "config.json").is_file() or not (path / WEIGHTS_NAME).is_file():
        raise FileNotFoundError(
            f"the bundled model is missing from {path} (config.json + {WEIGHTS_NAME}); restore it with "
            "`git checkout -- assets/models` or rebuild it with `make release-vae`"
        )
    return path


def train_short_run(out: Path, overrides: list[str] | None, train_steps: int):
    """Train (or reuse, when ``out/train`` already holds the finished run) the demo's short run.

    Returns ``(TrainResult, config)``; a reused run's result has an empty ``history``.
    """
    config = load_train_config("tiny-stage1", [f"max_steps={train_steps}", "progress_bar=true", *(overrides or [])])
    train_urls = [str(u) for u in loopdata.bundled_kodak_urls("train")]
    return train(config, train_urls, out / "train"), config


def run_demo(
    out_dir: str | Path = "runs/demo", overrides: list[str] | None = None, log=print,
    train_steps: int = DEMO_TRAIN_STEPS, profile_iters: int = 3,
) -> Path:
    """Run the whole demo into ``out_dir``; returns the path of ``report.md``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bundled = bundled_model_dir()
    val_urls = ",".join(str(u) for u in loopdata.bundled_kodak_urls("val"))
    timings = {}

    log(f"[1/5] a {train_steps}-step training run of loopvae-cnn-tiny (tiny-stage1) on the bundled kodak-train images")
    start = time.perf_counter()
    result, config = train_short_run(out, overrides, train_steps)
    timings["train"] = time.perf_counter() - start

    log(f"[2/5] evaluating the bundled model ({bundled}) and the short run on kodak-val at 256x256")
    start = time.perf_counter()
    lpips_net = "alex" if default_backbone_path("alex").is_file() else "none"
    options = EvalOptions(resolution=256, batch_size=4, num_workers=0, lpips_net=lpips_net, device="cpu")
    metrics = {"bundled": evaluate(bundled, val_urls, out / "eval", options),
               "short_run": evaluate(out / "train", val_urls, out / "eval-short-run", options)}
    if lpips_net == "none":
        reason = f"LPIPS backbone weights not found at {default_backbone_path('alex')} (no download attempted)"
        for name, folder in (("bundled", "eval"), ("short_run", "eval-short-run")):
            metrics[name]["lpips_unavailable_reason"] = reason
            (out / folder / "metrics.json").write_text(json.dumps(metrics[name], indent=2, allow_nan=False))
    timings["eval"] = time.perf_counter() - start

    log("[3/5] the bundled model beside the tuned references bundled with it (loopvae compare, one run each)")
    start = time.perf_counter()
    from .compare import CompareOptions, compare

    arms = {"loopvae": [str(bundled)], **{name: [str(bundled.parent / name)] for name in REFERENCES
                                          if (bundled.parent / name / "config.json").is_file()}}
    comparison = compare(arms, val_urls, out / "compare", CompareOptions(
        resolution=256, batch_size=4, num_workers=0, lpips_net="none", device="cpu", progress=False))
    timings["compare"] = time.perf_counter() - start

    log("[4/5] loop interventions on the bundled model (prefix truncation, bypass, relative updates)")
    start = time.perf_counter()
    interventions = intervene(bundled, val_urls, out / "interventions", limit=16, resolution=256)
    timings["interventions"] = time.perf_counter() - start

    log(f"[5/5] profile: {', '.join(TIMED_MODELS)} timed side by side on the CPU, paper models counted")
    start = time.perf_counter()
    rows = [row for name in TIMED_MODELS
            for row in profile_model(name, batch=1, resolution=256, warmup=1, iters=profile_iters,
                                     memory_format="channels_last")]
    rows += [row for name in PAPER_MODELS for row in profile_model(name, resolution=256, macs_only=True)]
    (out / "profile").mkdir(exist_ok=True)
    (out / "profile" / "profile.json").write_text(json.dumps(rows, indent=2, allow_nan=False))
    (out / "profile" / "profile.md").write_text(render_profile(rows, reference=REFERENCES[-1]))
    plot_profile(rows, out / "profile" / "profile.png")
    timings["profile"] = time.perf_counter() - start

    report = out / "report.md"
    report.write_text(render_demo_report(result, metrics, interventions, rows, timings, config, bundled, comparison))
    return report


def _shortcuts_note(bundled: Path) -> str:
    config = json.loads((bundled / "config.json").read_text())
    return "with the parameter-free shortcuts" if config.get("shortcuts") else "no shortcuts"


def _bundled_provenance(bundled: Path) -> str:
    info = bundled / "release.json"
    if not info.is_file():
        return ""
    data = json.loads(info.read_text())
    return f", {data['step']} training steps" if "step" in data else ""


def _comparison_lines(comparison: dict) -> list[str]:
    """The bundled models on kodim21-24 (``loopvae compare``'s numbers; one run each, so no verdicts)."""
    lines = ["## The bundled model beside the tuned references", "",
             "`loopvae compare` on kodim21–24 at 256², one trained run per model: the table describes three runs "
             "and carries no verdict (the seed-level comparisons are docs/study_fair.md and docs/study_sharing.md). "
             "Each reference was trained at the recipe its own search picked, for the same 60,000 crops.", "",
             "| model | class | params | GMACs @256² | PSNR (dB) | SSIM |", "|---|---|---:|---:|---:|---:|"]
    for a in comparison["arms"]:
        lines.append(f"| {a['name']} (`{Path(a['checkpoints'][0]).name}`) | {a['class']} | {a['params'] / 1e6:.2f}M | "
                     f"{a['gmacs']:.2f} | {a['psnr']:.2f} | {a['ssim']:.4f} |")
    b = comparison["bicubic"]
    lines += [f"| bicubic ({b['values_per_pixel']:g} values/px) | – | 0 | – | {b['psnr']:.2f} | {b['ssim']:.4f} |", "",
              "Centre crops of each image: reference, then every model (full tables: "
              "[compare/compare.md](compare/compare.md)):", "", "![side by side](compare/side_by_side.png)", ""]
    return lines


def render_demo_report(result, metrics, interventions, rows, timings, config, bundled: Path,
                       comparison: dict | None = None) -> str:
    main, short = metrics["bundled"], metrics["short_run"]
    base = main["baseline"]
    low = base["low_resolution"]
    lp = lambda m: "n/a" if m["lpips"] is None else f"{m['lpips']:.4f}"
    rel = bundled.relative_to(repo_root()) if bundled.is_relative_to(repo_root()) else bundled
    lines = [
        "# loopvision demo report", "",
        "Every section names its model. **Bundled model**: "
        f"`{rel}` (`loopvae-cnn-tiny`, {rows[0]['params'] / 1e6:.2f}M parameters, "
        f"{_shortcuts_note(bundled)}, trained by "
        f"`make release-vae`{_bundled_provenance(bundled)}; see its README.md). **Short run**: `loopvae-cnn-tiny` "
        f"trained here for {result.step} steps of `tiny-stage1` on kodim01–20 (64×64 crops, batch "
        f"{config.batch_size}) to show the training pipeline. Evaluation on kodim21–24 (never trained on) at 256×256.",
        "",
        "## Reconstruction", "",
        "| model | values / pixel | PSNR (dB) | SSIM | LPIPS |", "|---|---:|---:|---:|---:|",
        f"| bundled LoopVAE tiny (f8, 16 latent channels) | 0.250 | {main['psnr']:.2f} | {main['ssim']:.4f} | "
        f"{lp(main)} |",
        f"| short run ({result.step} steps) | 0.250 | {short['psnr']:.2f} | {short['ssim']:.4f} | {lp(short)} |",
        f"| bicubic down/up via {low[0]}×{low[1]} | {3 * low[0] * low[1] / 256**2:.3f} | {base['psnr']:.2f} | "
        f"{base['ssim']:.4f} | – |", "",
        f"**The bundled tokenizer {'beats' if main['psnr'] > base['psnr'] else 'does NOT beat'} the bicubic "
        f"baseline** ({main['psnr'] - base['psnr']:+.2f} dB PSNR) while the baseline keeps at least as many values "
        "per pixel as the latent.",
    ]
    if main.get("lpips_unavailable_reason"):
        lines.append(f"LPIPS: {main['lpips_unavailable_reason']}.")
    lines += [f"rFID: not computed ({main.get('rfid_unavailable_reason', 'n/a')}); "
              "FID on 4 images would not be meaningful anyway." if main["rfid"] is None
              else f"rFID: {main['rfid']:.3f}", "",
              "Bundled model, references (top) and reconstructions (bottom):", "",
              "![references (top) and reconstructions (bottom)](eval/grid.png)", ""]
    if comparison is not None:
        lines += _comparison_lines(comparison)
    lines += ["## Loop interventions (bundled model)", ""]
    b = interventions["baseline"]
    lines.append(f"{interventions['num_images']} images. Baseline PSNR {b['psnr']:.2f} dB "
                 f"(raw {b['raw_psnr']:.2f} dB), "
                 f"{100 * b['out_of_range']:.2f}% pixels out of range.")
    lines += ["",
              "| branch | scale | L | PSNR with k = 1..L retained passes (dB) | raw PSNR at k=1 | "
              "out of range at k=1 | PSNR change per bypassed pass (dB) |",
              "|---|---|---:|---|---:|---:|---|"]
    for st in interventions["stages"]:
        seq = " → ".join(f"{p['psnr']:.2f}" for p in st["prefix"])
        byp = ", ".join(f"{x['psnr'] - b['psnr']:+.2f}" for x in st["bypass"])
        lines.append(f"| {st['branch']} | {st['scale']} | {st['passes']} | {seq} | {st['prefix'][0]['raw_psnr']:.2f} | "
                     f"{100 * st['prefix'][0]['out_of_range']:.1f}% | {byp} |")
    lines += ["", "Full table: [interventions/interventions.md](interventions/interventions.md). "
              "Full prefixes reproduce the baseline bit-for-bit (checked). The paper's trained LoopVAE-CNN goes "
              "14.54 → 15.26 → 19.36 → 32.28 dB over its decoder's 2x passes (raw −1.04 dB and 96.7% of pixels out "
              "of range at one pass).", "",
              "![PSNR vs retained passes](interventions/psnr_vs_passes.png)", "",
              "![bypass loss](interventions/bypass_loss.png)", "",
              "## Weights vs arithmetic", "",
              f"{', '.join(f'`{m}`' for m in TIMED_MODELS)} (the bundled models' architectures, random weights: "
              "time does not depend on them) timed side by side on this CPU, batch 1, 256², encode → decode; the "
              "paper models counted only.", "",
              "| model | params (M) | GMACs @256² | ms / image (CPU, batch 1) |", "|---|---:|---:|---:|"]
    for r in rows:
        ms = "–" if r["ms_per_image"] is None else f"{r['ms_per_image']:.1f}"
        lines.append(f"| {r['model']} | {r['params'] / 1e6:.2f} | {r['gmacs']:.2f} | {ms} |")
    loop = rows[0]
    ratios = "; ".join(f"against `{ref['model']}`: {loop['params'] / ref['params']:.2f}× the weights, "
                       f"{loop['gmacs'] / ref['gmacs']:.2f}× the MACs, "
                       f"{loop['ms_per_image'] / ref['ms_per_image']:.2f}× the time"
                       for ref in rows[1:len(TIMED_MODELS)])
    lines += ["", f"`{loop['model']}` {ratios} (the paper, full size on a GPU against the FLUX VAE: 0.35×, 1.57×, "
              "2.85×).", "",
              "![params vs MACs and time](profile/profile.png)", "",
              "## Run", ""]
    if result.history:
        origin = f"resumed from {result.resumed_from}" if result.resumed_from else "fresh run"
        run_line = f"Short run: {result.step} steps, final loss {result.history[-1]['total']:.4f} ({origin})."
    else:
        run_line = f"Short run: reused the finished {result.step}-step run."
    lines.append(run_line + " Wall time per phase: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()) + ".")
    lines += ["", "Reproduce: `make demo` (or `loopvae demo --out runs/demo`). Each phase alone:", "",
              "```bash",
              f"loopvae train --config tiny-stage1 --data assets/kodak/kodak-train-000000.tar --out runs/demo/train "
              f"--set max_steps={result.step}",
              f"loopvae eval --checkpoint {rel} --data assets/kodak/kodak-val-000000.tar --out runs/demo/eval",
              f"loopvae intervene --checkpoint {rel} --data assets/kodak/kodak-val-000000.tar "
              "--out runs/demo/interventions",
              f"loopvae profile --models {','.join(TIMED_MODELS)} --out runs/demo/profile",
              "loopvae profile --models loopvae-cnn-f8d16,sd-vae,flux-vae --macs-only --out runs/demo/profile-paper",
              "```", ""]
    return "\n".join(lines)
