"""What the LoopVAE studies, the bundled model's release and its cards share: their prose (``docs/study_loopvae/
text.md``, filled by :func:`fill`), the reading of an intervention result (``loopvae intervene``), a sub-study's page
inside another's, the facts of the invocation that made the migrated result files (``migration.json``) and the
tuned references released beside the bundled LoopVAE (:func:`references`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from _text import section

from looprun.study import ResultStore, Study
from looprun.study.page import Page, build_page
from looprun.study.tables import md_table

# An added pass "contributes" when it raises mean PSNR by more than this; an early exit is "usable" when it costs
# less than the margin against full depth. Both are stated wherever they decide a sentence.
PASS_GAIN_DB, EXIT_MARGIN_DB = 0.05, 1.0
TEXT = Path(__file__).resolve().parents[1] / "docs/study_loopvae/text.md"  # the LoopVAE pages' and cards' prose
RELEASE_DOCS = "docs/study_loopvae/release"  # the release's result files (studies/release_vae.py)
REFERENCE_FAMILIES = ("klvae", "dcae")  # the tuned references it releases, in the order the pages list them


def fill(path: Path, name: str, /, **values: Any) -> list[str]:
    """Section ``name`` of the prose file ``path`` (:func:`_text.section`), its ``{fields}`` filled from ``values``
    (``str.format``); a line that is just ``{field}`` of a list value becomes that list's lines."""
    out: list[str] = []
    for line in section(path, name):
        listed = values.get(line[1:-1]) if line.startswith("{") and line.endswith("}") else None
        out += listed if isinstance(listed, list) else [line.format(**values)]
    return out


def text(name: str, /, **values: Any) -> list[str]:
    """:func:`fill` of the LoopVAE pages' and cards' prose (``docs/study_loopvae/text.md``)."""
    return fill(TEXT, name, **values)


def stage(result: dict[str, Any], branch: str, scale: str) -> dict[str, Any]:
    return next(s for s in result["stages"] if s["branch"] == branch and s["scale"] == scale)


def per_image_criteria(iv: dict[str, Any], st: dict[str, Any]) -> dict[str, Any]:
    """The paper's per-image counts for one stage of an intervention result: ``monotone``: images whose prefix
    PSNR rises strictly with every retained pass; ``bypass_hurts[t]``: images whose PSNR drops when pass ``t + 1``
    is bypassed; ``worst[t]``: images whose most damaging bypass is pass ``t + 1``; ``n``: images."""
    base = iv["baseline"]["per_image"]["psnr"]
    prefix = [p["per_image"]["psnr"] for p in st["prefix"]]
    bypass = [b["per_image"]["psnr"] for b in st["bypass"]]
    n, worst = len(base), [0] * len(bypass)
    for i in range(n):
        worst[min(range(len(bypass)), key=lambda t: bypass[t][i])] += 1
    return {"n": n, "monotone": sum(all(prefix[k + 1][i] > prefix[k][i] for k in range(len(prefix) - 1))
                                    for i in range(n)),
            "bypass_hurts": [sum(b[i] < base[i] for i in range(n)) for b in bypass], "worst": worst}


def core_work(iv: dict[str, Any]) -> dict[tuple[str, str], float]:
    """Share of the looped cores' spatially-linear work per stage (passes x pixels; 2x = 1, 4x = 1/4, ...)."""
    work = {(st["branch"], st["scale"]): st["passes"] / (int(st["scale"].rstrip("x")) // 2) ** 2 for st in iv["stages"]}
    return {k: v / sum(work.values()) for k, v in work.items()}


def anytime_reading(iv: dict[str, Any]) -> str:
    """Whether the decoder's finest stage is an any-time decoder: quality that rises with every retained pass
    (each adds > PASS_GAIN_DB on average) *and* a one-pass exit that costs < EXIT_MARGIN_DB; otherwise which
    passes stopped contributing and what share of the cores' work they are."""
    dec = stage(iv, "decoder", "2x")
    means = [p["psnr"] for p in dec["prefix"]]
    gains = [b - a for a, b in zip(means, means[1:])]
    idle, cost = [k + 2 for k, g in enumerate(gains) if g <= PASS_GAIN_DB], means[-1] - means[0]
    seq = f"decoder-2x prefixes {' → '.join(f'{m:.3f}' for m in means)} dB"
    if idle:
        share = core_work(iv)[("decoder", "2x")] / dec["passes"] * len(idle)
        return (f"{seq} (gains {', '.join(f'{g:+.3f}' for g in gains)}): pass(es) {', '.join(map(str, idle))} add at "
                f"most {PASS_GAIN_DB} dB each — they stopped contributing, {100 * share:.0f}% of the cores' work idle. "
                "Not an any-time decoder (quality does not rise with compute).")
    if cost < EXIT_MARGIN_DB:
        return (f"{seq}: every pass adds more than {PASS_GAIN_DB} dB and one pass costs {cost:.2f} dB "
                f"(< {EXIT_MARGIN_DB} dB): an any-time decoder.")
    return (f"{seq}: every pass adds more than {PASS_GAIN_DB} dB, but one pass costs {cost:.2f} dB "
            f"(≥ {EXIT_MARGIN_DB} dB): a usable early exit does not appear.")


def prefix_cells(st: dict[str, Any], width: int = 4) -> list[str]:
    """``clipped / raw (out of range)`` PSNR per retained-pass prefix, padded to ``width`` cells."""
    cells = [f"{p['psnr']:.2f} / {p['raw_psnr']:.2f} ({100 * p['out_of_range']:.1f}%)" for p in st["prefix"]]
    return cells + [""] * (width - len(cells))


def interventions_table(iv: dict[str, Any], extra: list[list[Any]] = ()) -> list[str]:  # type: ignore[assignment]
    """Per looped stage: prefix truncation, the PSNR each single-pass bypass loses, and the paper's per-image
    counts (images rising with every pass, images each bypass hurts, whose worst bypass is which pass)."""
    body = []
    for st in iv["stages"]:
        c, looped = per_image_criteria(iv, st), st["passes"] > 1
        body.append([st["branch"], st["scale"], st["passes"], *prefix_cells(st),
                     ", ".join(f"{iv['baseline']['psnr'] - b['psnr']:.2f}" for b in st["bypass"]),
                     f"{c['monotone']}/{c['n']}" if looped else "–",
                     ", ".join(f"{h}/{c['n']}" for h in c["bypass_hurts"]),
                     ", ".join(f"pass {t + 1}: {w}" for t, w in enumerate(c["worst"]) if w) if looped else "–"])
    return md_table(["branch", "scale", "L", "k=1", "k=2", "k=3", "k=4", "bypass loss per pass (dB)",
                     "monotone (images)", "bypass hurts, pass 1..L (images)", "worst bypass (images)"],
                    [*body, *extra], "llrllllllll")


def finished(page: Page, phase: str) -> dict[str, dict[str, Any]]:
    return {k: r for k, r in page.records.items() if r.get("phase") == phase and r.get("status") == "finished"}


def invocation(page: Page, key: str, runs: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The migrated invocation's facts (``docs/study_loopvae/invocations.json``: its wall time, jobs ...) while every
    one of ``runs`` still comes from it; ``None`` once the engine made one of them."""
    path = page.store.root / "docs/study_loopvae/invocations.json"
    ok = runs and path.is_file() and all(r.get("migrated_from") for r in runs.values())
    return json.loads(path.read_text())[key] if ok else None


def references(root: Path) -> dict[str, dict[str, Any]]:
    """The measured tuned references (``release_vae.py``'s phase ``references``) under the repository ``root`` by
    model name, AutoencoderKL first: bundled or refused; a run whose training failed (no evaluation) is left out."""
    runs = [r for r in ResultStore(root, RELEASE_DOCS).all().values() if r.get("phase") == "references" and "eval" in r]
    return {r["model"]: r for r in sorted(runs, key=lambda r: REFERENCE_FAMILIES.index(r["family"]))}


def included(study: Study, page: Page) -> list[str]:
    """``study``'s page without its header and with its links made relative to ``page``'s: a sub-study shown on the
    page of the study it serves."""
    sub = build_page(study, page.store.root, draw=page.draw)
    prefix = os.path.relpath(Path(study.page).parent, Path(page.study.page).parent) + "/"
    return [line.replace("](", f"]({prefix}", 1) if line.startswith("![") else line
            for section in study.sections[1:] for line in section(sub)]
