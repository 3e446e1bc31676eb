"""README's answer section, computed from the studies' committed results -> the ``answer`` block of README.md.

The numbers come from ``docs/study_sharing/results.json`` and ``docs/study_fair/results.json`` (never typed by
hand), so the README cannot drift from the pages: ``tests/test_readme.py`` re-renders the block and compares.
The sharing study's rows say how far it has got until its Holm family is complete.

Usage: ``python benchmarks/readme_answer.py`` (the study reports run it after rendering their pages).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sections import update_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FAIR = [("P1", "LoopVAE − AutoencoderKL (no shortcuts), equal images", "loopvae@img", "klvae@img"),
        ("P2", "LoopVAE − AutoencoderDC (both with shortcuts), equal images", "loopvae-sc@img", "dcae@img"),
        ("P3", "LoopVAE − AutoencoderKL, equal CPU-seconds", "loopvae@cpu", "klvae@cpu"),
        ("P4", "LoopVAE − AutoencoderDC, equal CPU-seconds", "loopvae-sc@cpu", "dcae@cpu")]
SHARING = {"Q1": "tied − untied weights, same model and MACs, 12,000 crops",
           "Q2": "tied − untied weights, same model and MACs, 36,000 crops",
           "P2-long": "LoopVAE (tied) − AutoencoderDC, 36,000 crops"}
SHORT = {"Q1": "tied − untied, 12,000 crops", "Q2": "tied − untied, 36,000 crops",
         "P2-long": "tied − AutoencoderDC, 36,000 crops"}


def _ci(ci: list[float | None] | None) -> str:
    return "–" if not ci or ci[0] is None else f"[{ci[0]:+.2f}, {ci[1]:+.2f}]"


def render(root: Path = ROOT) -> str:
    """The answer block: the sharing study's answer in words, one row per pre-registered primary of the three
    studies, then the cost line."""
    rows = ["| study | primary | seeds | difference [95% CI] | verdict |", "|---|---|---:|---|---|"]
    sharing_file = root / "docs/study_sharing/results.json"
    sharing = json.loads(sharing_file.read_text()) if sharing_file.is_file() else None
    if sharing and sharing.get("primaries"):
        for p in sharing["primaries"]:
            margin = f"; margin {p['margin']:.2f} dB" if p["margin"] else ""
            rows.append(f"| [sharing](docs/study_sharing.md) | {p['id']}: {SHARING[p['id']]} | {p['n']} | "
                        f"{p['diff']:+.2f} dB {_ci(p['ci'])} | **{p['verdict']}** (Holm p {p['p_holm']:.3g}"
                        f"{margin}) |")
    else:
        done = sharing["conclusion"]["seeded_runs"] if sharing else {"finished": 0, "planned": 24}
        for pid, text in SHARING.items():
            rows.append(f"| [sharing](docs/study_sharing.md) | {pid}: {text} | – | running ({done['finished']} of "
                        f"{done['planned']} seeded runs finished) | pre-registered, not read yet |")
    results = json.loads((root / "docs/study_fair/results.json").read_text())
    fair, train_seconds = results["computed"], {r["name"]: r["train_seconds"] for r in results["runs"]}
    comps = {(c["a"], c["b"]): c for c in fair["primary"]["comparisons"] if c["metric"] == "psnr"}

    def seconds(arm: str) -> float:
        names = fair["arms"][arm]
        return sum(train_seconds[n] for n in names) / len(names)

    for pid, text, a, b in FAIR:
        c = comps[(a, b)]
        if a.endswith("@cpu"):  # the budgets were sized by a probe: say what the reference actually got
            text += f" (as measured, the reference trained {seconds(b) / seconds(a):.2f}× as long)"
        rows.append(f"| [fair](docs/study_fair.md) | {pid}: {text} | {c['n']} | {c['diff']:+.2f} dB {_ci(c['ci'])} "
                    f"| **{c['verdict']}** (Holm p {c['p_holm']:.3g}) |")
    rows.append(depth_row(root))
    costs = fair["conclusion"]["costs"]

    def ratio(a: str, b: str, key: str) -> float:
        return costs[a][key] / costs[b][key]

    cost = (f"LoopVAE stores {ratio('loopvae@img', 'klvae@img', 'params'):.2f}× / "
            f"{ratio('loopvae-sc@img', 'dcae@img', 'params'):.2f}× the weights of the AutoencoderKL / "
            f"AutoencoderDC reference, does {ratio('loopvae@img', 'klvae@img', 'gmacs'):.2f}× / "
            f"{ratio('loopvae-sc@img', 'dcae@img', 'gmacs'):.2f}× their MACs per 256² image and takes "
            f"{ratio('loopvae@img', 'klvae@img', 'train_ms_per_image'):.2f}× / "
            f"{ratio('loopvae-sc@img', 'dcae@img', 'train_ms_per_image'):.2f}× their training CPU time per image.")
    # the headline question's answer in words first, then every primary's row, then what the weights cost to run
    return (sharing_line(sharing["conclusion"]) + "\n\n" if sharing else "") + "\n".join(rows) + "\n\n" + cost


def depth_row(root: Path) -> str:
    """The SR-ViT depth study's P1 (R4 − R1, test top-1 points) with its pre-registered interpretation."""
    first = ("| [srvit-depth](docs/study_srvit_depth.md) | P1: SR-ViT R4 − R1 (SoftMoR depth), CIFAR-10 test top-1, "
             "60 epochs")
    results = json.loads((root / "docs/study_srvit_depth/results.json").read_text())
    p = results["primary"]
    if p is None:
        planned = 8 if results["pilot"] and not results["pilot"]["keep"]["seed4"] else 10  # the pilot's fall-back
        state = "running" if results["pilot"] else "not started"
        return (f"{first} | – | {state} ({len(results['runs'])} of {planned} seeded runs finished) | "
                "pre-registered, not read yet |")
    return (f"{first} | {p['n']} | {p['diff']:+.2f} points {_ci(p['ci'])} | **{p['verdict']}** (paired t; "
            f"{results['interpretation']} under the pre-registered rule) |")


def sharing_line(c: dict) -> str:
    """The sharing study's answer in words, from its computed conclusion (results.json ``conclusion``)."""
    w = c["weights"]
    picks = ", ".join(f"`{arm}` {'waiting' if lr is None else format(lr, '.0e').replace('e-0', 'e-')}"
                      for arm, lr in c["lr_picks"].items())
    if not w:
        return "**What sharing itself costs**: no seeded run has finished yet."
    line = (f"**What sharing itself costs** ([docs/study_sharing.md](docs/study_sharing.md)): the same model "
            f"(`loopvae-cnn-tiny` with shortcuts) tied (`global`, {w['global'] / 1e6:.2f}M parameters) against "
            f"untied (`none`, {w['none'] / 1e6:.2f}M), same graph and {w['gmacs']:.2f} GMACs: tying removes "
            f"{w['removed']:.0%} of the stored weights ({w['core_removed']:.0%} of the looped cores'). Each sharing "
            f"rule's learning rate was checked first (picks: {picks}).")
    if not c["primaries"]:
        done = c["seeded_runs"]
        return line + (f" The seeded runs are under way ({done['finished']} of {done['planned']} committed, run by "
                       "run); the rows above fill in when the whole Holm family is in.")
    said = [f"{p['id']} ({SHORT[p['id']]}): PSNR {p['psnr']['diff']:+.2f} dB "
            f"{_ci(p['psnr']['ci'])}, SSIM {p['ssim']['diff']:+.3f}, {p['n']} seeds, **{p['verdict']}**"
            for p in c["primaries"]]
    return line + " On the 40 held-out ImageNet images at 256²: " + "; ".join(said) + "."


def main() -> int:
    update_section(ROOT / "README.md", "answer", render())
    print("README.md: answer block updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
