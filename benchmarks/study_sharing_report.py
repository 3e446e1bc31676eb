"""The sharing study's page, computed from its committed result files -> ``docs/study_sharing.md``.

Every number comes from ``docs/study_sharing/runs/*.json`` (and the pre-registration beside them); the verdicts
from :func:`looprun.study_page.primary_family` under the pre-registered rules. ``results.json`` holds what the page
shows (``primaries``, ``runs`` with every per-image number), so each number can be recomputed from it alone.
Runs without a result file are listed as missing, never filled in; a primary is read only when its whole Holm
family is complete.

Usage: ``python benchmarks/study_sharing_report.py`` (``make study-sharing-report``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import study_sharing as ss  # noqa: E402

from looprun.statistics import paired_difference  # noqa: E402
from looprun.study_page import (  # noqa: E402
    divergent_seeds,
    interval,
    md_table,
    mean_sd,
    primaries_table,
    primary_family,
    signed,
)

ARMS = ("global", "scale", "none", "dcae")
LABELS = {"global": "`global` (tied everywhere)", "scale": "`scale` (tied within a scale)",
          "none": "`none` (untied)", "dcae": "`dcae-tiny` (AutoencoderDC)"}
PRIMARIES = [
    {"id": "Q1", "a": "global@1500", "b": "none@1500", "seeds": list(ss.SHORT_SEEDS), "margin": 0.2},
    {"id": "Q2", "a": "global@4500", "b": "none@4500", "seeds": list(ss.LONG_SEEDS), "margin": 0.2},
    {"id": "P2-long", "a": "global@4500", "b": "dcae@4500", "seeds": list(ss.LONG_SEEDS), "margin": None},
]
PRIMARY_LABELS = {"Q1": "tied − untied, 1,500 steps", "Q2": "tied − untied, 4,500 steps",
                  "P2-long": "tied LoopVAE − dcae-tiny, 4,500 steps"}
SECONDARIES = [("scale − none, 1,500 steps", "scale@1500", "none@1500", list(ss.SHORT_SEEDS)),
               ("global − scale, 1,500 steps", "global@1500", "scale@1500", list(ss.SHORT_SEEDS))]


def load_runs(docs: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((docs / "runs").glob("*.json"))}


def run_row(r: dict[str, Any]) -> dict[str, Any]:
    """A main run as results.json records it: held-out means, CPU-seconds and every per-image number."""
    ev = r["evaluation"]
    images = ev["imagenet"]
    return {"arm": r["arm"], "seed": r["seed"], "steps": r["steps"], "name": r["name"],
            "psnr": statistics.fmean(i["psnr"] for i in images), "ssim": statistics.fmean(i["ssim"] for i in images),
            "kodak_psnr": statistics.fmean(i["psnr"] for i in ev["kodak"]),
            "train_seconds": r["train_seconds"], "cpu_ms_per_image": 1000 * r["train_seconds"] / (r["steps"] * 8),
            "params": ev["arch"]["params"], "gmacs": ev["arch"]["gmacs"], "recipe": r["recipe"],
            "lr": r.get("lr"), "code": r["code"]["commit"], "preregistration_sha256": r.get("preregistration_sha256"),
            "curve": [{k: p.get(k) for k in ("step", "images_seen", "train_seconds", "psnr", "ssim")}
                      for p in r["curve"]],
            "per_image": [{k: i[k] for k in ("key", "shard", "psnr", "ssim", "bicubic_psnr")} for i in images]}


def by_arm(rows: list[dict[str, Any]], metric: str = "psnr") -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for r in rows:
        out.setdefault(f"{r['arm']}@{r['steps']}", {})[r["seed"]] = r[metric]
    return out


def planned_names() -> list[str]:
    names = [f"main-{a}-{ss.SHORT}-s{s}" for s in ss.SHORT_SEEDS for a in ss.SHARING]
    names += [f"main-{a}-{ss.LONG}-s{s}" for s in ss.LONG_SEEDS for a in (*ss.LONG_ARMS, "dcae")]
    return names


# -- sections ------------------------------------------------------------------------------------------
def lr_section(runs: dict[str, dict[str, Any]]) -> list[str]:
    lrs = sorted({r["lr"] for r in runs.values() if r.get("phase") == "lrcheck"})
    if not lrs:
        return ["## 1. Learning-rate check", "", "No learning-rate run has finished yet.", ""]
    body = []
    for arm in ss.SHARING:
        cells: list[Any] = [LABELS[arm]]
        scores = {}
        for lr in lrs:
            r = runs.get(f"{ss.lr_run_name(arm, lr)}-s0")
            if r is None:
                cells.append("–")
                continue
            score = r["curve"][-1]["psnr"] if r["status"] == "finished" and r["curve"] else None
            scores[lr] = score
            cells.append("failed" if score is None else f"{score:.2f}")
        pick = ss.lr_pick(arm)
        cells.append("waiting" if pick is None else f"**{pick:.0e}**")
        body.append(cells)
    commits = sorted({r["code"]["commit"][:10] for r in runs.values() if r.get("phase") == "lrcheck"})
    return ["## 1. Learning-rate check (seed 0, 500 steps, validation PSNR at 256²)", "",
            "The pick rule was written down before these runs (pre-registration above): the best validation PSNR "
            "at step 500; a pick at the grid's edge extends the grid by a factor of 2 that way.", "",
            *md_table(["arm", *[f"lr {lr:.0e}" for lr in lrs], "pick"], body), "",
            f"Training code: commit {', '.join(f'`{c}`' for c in commits)} (the seeded runs go on from a worktree of "
            "the same commit; `plan.json` pins it at the first seeded run).", ""]


def runs_section(rows: list[dict[str, Any]]) -> list[str]:
    out = ["## 2. Every seeded run (40 held-out ImageNet images at 256²)", ""]
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["arm"], r["steps"]), []).append(r)
    body = []
    for (arm, steps), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], ARMS.index(kv[0][0]))):
        rs = sorted(rs, key=lambda r: r["seed"])
        body.append([LABELS[arm], f"{steps:,}", f"{rs[0]['params']:,}", f"{rs[0]['gmacs']:.2f}",
                     f"{rs[0]['lr']:.0e}" if rs[0]["lr"] else " ".join(rs[0]["recipe"]),
                     " / ".join(f"{r['psnr']:.2f}" for r in rs), mean_sd([r["psnr"] for r in rs]),
                     mean_sd([r["ssim"] for r in rs], 3),
                     mean_sd([r["cpu_ms_per_image"] for r in rs], 1)])
    out += md_table(["arm", "steps", "parameters", "GMACs (256²)", "lr", "PSNR per seed", "PSNR (mean ± sd)",
                     "SSIM", "training CPU ms / image"], body, "lrrrrrrrr")
    out += ["", "PSNR and SSIM: per image on the clipped, uint8-quantised reconstruction (EMA weights, posterior "
            "mode), averaged over the 40 images; the seed mean ± sd is over seeds. CPU ms / image: the training "
            "loop's process CPU time over the images seen (one thread per run, two runs at a time).", ""]
    return out


def primaries_section(rows: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    prims, missing = primary_family(PRIMARIES, by_arm(rows))
    out = ["## 3. Primaries (pre-registered; Holm over Q1, Q2, P2-long)", ""]
    if missing:
        out += [f"Not read yet: the family is read whole, and {len(missing)} of its runs are missing "
                f"({', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}).", ""]
        return out, []
    out += primaries_table(prims, PRIMARY_LABELS)
    out += ["", "The *95% interval* is the unadjusted paired t-interval; the *Holm-level interval* is the same "
            "interval at the confidence Holm's step-down gives that primary, and the verdict is read from it. "
            "Q1/Q2: *within margin* = the Holm-level lower bound is above −0.20 dB (sharing costs < 0.2 dB); "
            "*worse* = its upper bound is below 0 (sharing costs); both = *worse, within margin*.", ""]
    return out, prims


def secondary_section(rows: list[dict[str, Any]]) -> list[str]:
    psnr, ssim, kodak = by_arm(rows), by_arm(rows, "ssim"), by_arm(rows, "kodak_psnr")
    pairs = [(f"{p['id']} ({PRIMARY_LABELS[p['id']]})", p["a"], p["b"], p["seeds"]) for p in PRIMARIES]
    body = []
    for label, a, b, seeds in [*SECONDARIES, *pairs]:
        if not all(s in psnr.get(a, {}) and s in psnr.get(b, {}) for s in seeds):
            body.append([label, "–", "–", "–", "waiting"])
            continue
        cells = [label]
        for _metric, values, digits in (("PSNR", psnr, 2), ("SSIM", ssim, 3), ("Kodak PSNR", kodak, 2)):
            d = paired_difference([values[a][s] for s in seeds], [values[b][s] for s in seeds])
            cells.append(f"{signed(d.mean, digits)} {interval([d.low, d.high], digits)}")
        cells.append(str(len(seeds)))
        body.append(cells)
    return ["## 4. Secondaries (exploratory: descriptive 95% paired intervals, no verdicts)", "",
            *md_table(["contrast", "PSNR (dB)", "SSIM", "kodim21-24 PSNR (dB)", "seeds"], body), ""]


def divergence_section(rows: list[dict[str, Any]]) -> list[str]:
    flagged = divergent_seeds(by_arm(rows))
    out = ["## 5. Diverging seeds", ""]
    if not flagged:
        spreads = {a: max(v.values()) - min(v.values()) for a, v in by_arm(rows).items() if len(v) > 1}
        widest = max(spreads.items(), key=lambda kv: kv[1]) if spreads else None
        out.append("None: no seed lies more than max(0.5 dB, 5 × the other arms' largest spread) from the median "
                   "of its arm's other seeds" + (f" (widest spread: {widest[0]}, {widest[1]:.2f} dB)." if widest
                                                else "."))
    for f in flagged:
        out.append(f"- **{f['arm']} seed {f['seed']}**: {f['value']:.2f} dB against {f['median']:.2f} dB for its "
                   f"other seeds (threshold {f['threshold']:.2f} dB); the verdicts above include it.")
    return [*out, ""]


def conclusion_section(rows: list[dict[str, Any]], prims: list[dict[str, Any]]) -> list[str]:
    out = ["## 6. Conclusion (computed from the numbers above)", ""]
    arms = {f"{r['arm']}@{r['steps']}": r for r in rows}
    g, n = arms.get(f"global@{ss.SHORT}"), arms.get(f"none@{ss.SHORT}")
    if g and n:
        tied = 1 - g["params"] / n["params"]
        out.append(f"- Tying every core block (`global` against `none`) removes {tied:.0%} of the model's stored "
                   f"weights ({n['params']:,} → {g['params']:,} parameters) at the same {g['gmacs']:.2f} GMACs.")
    if not prims:
        return [*out, "- The primaries are not read yet (their family is incomplete).", ""]
    ssim = by_arm(rows, "ssim")
    for p in prims:
        seeds = next(s["seeds"] for s in PRIMARIES if s["id"] == p["id"])
        ds = paired_difference([ssim[p["a"]][s] for s in seeds], [ssim[p["b"]][s] for s in seeds])
        out.append(f"- **{p['id']}** ({PRIMARY_LABELS[p['id']]}): {p['diff']:+.2f} dB PSNR, 95% interval "
                   f"{interval(p['ci'])}, SSIM {ds.mean:+.3f} {interval([ds.low, ds.high], 3)}, n = {p['n']} seeds: "
                   f"**{p['verdict']}**.")
    return [*out, ""]


def cost_section(rows: list[dict[str, Any]]) -> list[str]:
    ms: dict[str, list[float]] = {}
    for r in rows:
        ms.setdefault(r["arm"], []).append(r["cpu_ms_per_image"])
    if not ms:
        return []
    ref = statistics.fmean(ms["global"]) if "global" in ms else None
    body = [[LABELS[a], mean_sd(v, 1), f"{statistics.fmean(v) / ref:.2f}×" if ref else "–", len(v)]
            for a, v in sorted(ms.items(), key=lambda kv: ARMS.index(kv[0]))]
    return ["## 7. Training cost (measured)", "", *md_table(["arm", "CPU ms / image (mean ± sd over runs)",
                                                             "vs global", "runs"], body), ""]


def plot_curves(rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colours = {"global": "C0", "scale": "C1", "none": "C2", "dcae": "C3"}
    for r in rows:
        pts = [p for p in r["curve"] if p.get("psnr") is not None]
        style = "-" if r["steps"] == ss.LONG else "--"
        label = f"{r['arm']} {r['steps']}" if r["seed"] == 0 else None
        axes[0].plot([p["images_seen"] for p in pts], [p["psnr"] for p in pts], style, color=colours[r["arm"]],
                     alpha=0.7, label=label)
        axes[1].plot([p["train_seconds"] for p in pts], [p["psnr"] for p in pts], style, color=colours[r["arm"]],
                     alpha=0.7)
    axes[0].set(xlabel="training crops seen (64²)", ylabel="validation PSNR (dB, 40 images, 256²)")
    axes[1].set(xlabel="training CPU-seconds (one thread)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Sharing study: validation curves, every seed (dashed: 1,500 steps; solid: 4,500)")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def first_commit(path: Path) -> str:
    out = subprocess.run(["git", "log", "--diff-filter=A", "--format=%h %ad", "--date=short", "--", str(path)],
                         capture_output=True, text=True, check=False).stdout.strip().splitlines()
    return out[-1] if out else "not committed yet"


def render(docs: Path, page: Path, command: str = "make study-sharing") -> dict[str, Any]:
    ss.DOCS = docs
    import study_fair as sf

    sf.DOCS, sf.RESULTS = docs, docs / "runs"
    runs = load_runs(docs)
    rows = [run_row(r) for r in runs.values() if r.get("phase") == "main" and r["status"] == "finished"]
    failed = [r["name"] for r in runs.values() if r.get("phase") == "main" and r["status"] != "finished"]
    missing = [n for n in planned_names() if n not in runs]
    prereg = docs / "preregistration.md"
    digest = hashlib.sha256(prereg.read_bytes()).hexdigest()
    stale = sorted({r["name"] for r in rows if r["preregistration_sha256"] != digest})
    lines = ["# What sharing itself costs: tied against untied weights at one architecture", "",
             f"*Generated by `{command}` (re-render: `make study-sharing-report`) from `docs/study_sharing/runs/`. "
             f"Pre-registration sha256 `{digest[:16]}`, first committed {first_commit(prereg)}; every main run "
             f"records the hash it ran under" + (f" (these differ: {', '.join(stale)})" if stale else "") + ".*", "",
             f"Runs finished: {len(rows)} of {len(planned_names())}" + (f"; failed: {', '.join(failed)}" if failed
                                                                        else "") +
             (f"; still to run: {len(missing)}." if missing else "."), "",
             prereg.read_text().strip(), ""]
    lines += lr_section(runs)
    lines += runs_section(rows)
    prim_lines, prims = primaries_section(rows)
    lines += prim_lines + secondary_section(rows) + divergence_section(rows) + conclusion_section(rows, prims)
    lines += cost_section(rows)
    if rows:
        plot_curves(rows, docs / "curves.png")
        lines += ["## 8. Learning curves", "", "![validation curves](study_sharing/curves.png)", ""]
    page.write_text("\n".join(lines).rstrip() + "\n")
    results = {"preregistration_sha256": digest, "primaries": prims,
               "runs": sorted(rows, key=lambda r: (r["steps"], ARMS.index(r["arm"]), r["seed"])),
               "lrcheck": [{"arm": r["arm"], "lr": r["lr"], "status": r["status"],
                            "psnr": r["curve"][-1]["psnr"] if r["curve"] else None, "train_seconds": r["train_seconds"]}
                           for r in runs.values() if r.get("phase") == "lrcheck"],
               "missing": missing, "failed": failed}
    (docs / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", default="docs/study_sharing")
    parser.add_argument("--out", default="docs/study_sharing.md")
    args = parser.parse_args()
    render(Path(args.docs), Path(args.out))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
