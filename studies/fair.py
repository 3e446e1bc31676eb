"""A fair fight: LoopVAE against AutoencoderKL / AutoencoderDC references on equal terms -> ``docs/study_fair.md``.

Phases ``shapes`` (the AutoencoderKL shape sweep), ``search`` (9 recipe arms per family at one CPU budget each)
and ``main`` (each family at its pick, seeds 0-2, equal images and equal CPU-seconds; the pre-registered extra
seeds); arms, picks and plan in ``_fair.py``, the page's prose in ``docs/study_fair/text.md``. Verdicts: seed-level,
Holm over P1-P4, through ``loopvae compare``'s :func:`~loopvae.compare.summarise`.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import _fair as sf
import numpy as np
import yaml
from _fair import BASE_RECIPE, PRIMARY, SECONDARY, comparison, pick_recipe
from _loopvae_pages import fill, references
from _vae_runs import StudyData, release_data, train_and_evaluate, train_overrides
from scipy import stats

from looprun import statistics as st
from looprun.study import Arm, Budget, Metric, Phase, PlannedRun, RunContext, Study
from looprun.study import page as std
from looprun.study.tables import md_table
from loopvae import create_model

__all__ = ["BASE_RECIPE", "STUDY", "pick_recipe"]  # what the sharing study reads: dcae-tiny's pick
DOCS = Path(__file__).resolve().parents[1] / "docs/study_fair"  # probe.json and plan.json: the plan's inputs
text = partial(fill, Path(__file__).resolve().parents[1] / "docs/study_fair/text.md")  # the page's prose
FLAT_DB = 0.10  # a curve whose last validation interval gains less than this (dB, mean over seeds) is flat
Runs = dict[str, list[dict[str, Any]]]  # group family@img / family@cpu -> its runs' result records


def run(planned: PlannedRun, context: RunContext) -> dict[str, Any]:
    """Train one run (one thread; option ``scale`` shortens it for a smoke run), evaluate a main run per image;
    the record is what the plan set, the validation curve, the training CPU-seconds and the evaluation."""
    s, scale = dict(planned.settings), float(context.options.get("scale", 1.0))
    s["steps"] = s["steps"] if scale == 1 else max(4, round(scale * s["steps"]))
    items = train_overrides(s["model"], s["model_overrides"], s["steps"], s["recipe"], planned.seed, s.pop("evals"),
                            tuple(BASE_RECIPE))
    measured = train_and_evaluate(planned.id, context.workdir / "run", StudyData(**context.options["data"]),
                                  sf.PRESET, items, evaluate=planned.phase == "main")
    return {**s, "name": planned.id, "seed": planned.seed, **measured}


def prepare(context: RunContext) -> dict[str, Any]:
    """The release split every run trains and validates on (written once; option ``shared``: the data root)."""
    return {"data": asdict(release_data(context.options.get("shared"), context.workdir / "data", "the fair study"))}


def _mean(run: dict[str, Any], key: str = "psnr", split: str = "imagenet") -> float:
    """A run's mean over the images of ``split`` (40 held-out ImageNet images / kodim21-24) of ``key``."""
    return statistics.fmean(x[key] for x in run["evaluation"][split])


def row(record: dict[str, Any]) -> dict[str, Any] | None:
    """A finished main run: its group, seed, held-out PSNR (dB) / SSIM and training CPU-seconds."""
    if record.get("phase") != "main" or record.get("status") != "finished" or "evaluation" not in record:
        return None
    return {"arm": record["family"], "budget": "img" if "images" in record["budget"] else "cpu", "seed": record["seed"],
            "name": record["name"], "psnr": _mean(record), "ssim": _mean(record, "ssim"),
            "train_seconds": record["train_seconds"]}


def reading(page: std.Page) -> dict[str, Any]:
    """Everything the main sections print, computed once per page (the seed rule, both families, the conclusion)."""
    if "fair" not in page.readings:
        docs, records = page.store.docs, page.records
        arms, rule, planned = sf.extra_seed_rule(records, sf.costs(docs, main=True), docs)
        missing = [p.id for p in planned if p.seed in sf.MAIN_SEEDS and records.get(p.id, {}).get("status") !=
                   "finished"]
        primary, secondary = sf.family_summary(arms, PRIMARY), sf.family_summary(arms, SECONDARY)
        conclusion, computed = conclusion_lines(arms, primary, secondary, missing + rule["missing"])
        page.readings["fair"] = {
            "plan": json.loads((docs / "plan.json").read_text()) if (docs / "plan.json").is_file() else {},
            "arms": arms, "rule": rule, "missing": missing, "primary": primary, "secondary": secondary,
            "stage1": sum(p.seed in sf.MAIN_SEEDS for p in planned), "conclusion": conclusion, "computed": {
                "arms": {k: [r["name"] for r in v] for k, v in arms.items()}, "extra_seed_rule": rule,
                "vs_bicubic": {k: st.paired_difference(p, [_mean(v[0], "bicubic_psnr")] * len(p)).as_dict()
                               for k, v in sorted(arms.items()) for p in [[_mean(r) for r in v]]},
                "primary": primary, "secondary": secondary, "flattening": flattening(arms),
                "conclusion": computed} if arms else {}}
    return page.readings["fair"]


def _names(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


# -- sections 1 and 2: the shape sweep and the recipe searches ---------------------------------------------------
def intro(page: std.Page) -> list[str]:
    ips = ", ".join(f"{k} {v:.1f}" for k, v in sf.costs(page.store.docs).items())
    return [*text("intro", ips=ips), "", (page.store.docs / "preregistration.md").read_text().strip(), ""]


def _end(r: dict[str, Any], key: str = "psnr", scale: float = 1.0, digits: int = 2) -> str:
    return f"{r['curve'][-1][key] / scale:.{digits}f}" if r.get("curve") else "nan"


def _score(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def shapes_section(page: std.Page) -> list[str]:
    rows = {label: page.records.get(f"shape-{label}-s0") for label, _, _ in sf.SHAPES}
    scores = sf.matched_scores({k: v for k, v in rows.items() if v is not None})
    body = [[label, f"`{model}` {ovr}", "–", "–", "–", "*missing*", "–"] if (r := rows[label]) is None else [
        label, f"`{model}` {ovr if ovr != '{}' else ''}",
        f"{sum(p.numel() for p in create_model(model, **(yaml.safe_load(ovr) or {})).parameters()):,}", r["steps"],
        f"{(r['train_seconds'] or 0) / 60:.1f}", _end(r), _score(scores.get(label))] for label, model, ovr in sf.SHAPES]
    lines = [*text("shapes"), "", *md_table(["shape", "model", "params", "steps", "CPU-min", "final PSNR",
                                             "at matched CPU time"], body, "llrrrrr")]
    winner, attn, plain = sf.shape_winner(page.records), scores.get("w32-attn"), scores.get("w32")
    if winner is not None:
        lines += ["", *text("picked", winner=winner)]
    if winner is not None and attn is not None and plain is not None:
        lines += text("attention", attn=attn, plain=plain, diff=attn - plain,
                      keeps="keeps" if winner[0] == "w32-attn" else "drops")
    return [*lines, ""]


def search_section(page: std.Page) -> list[str]:
    docs, records, lines = page.store.docs, page.records, [*text("search"), ""]
    for key, family in sf.FAMILIES.items():
        rows, model, extra = sf.search_rows(records, key, docs), sf.family_model(key, records), sf.CORRECTION_ARM.name
        # the pre-registered arms are scored among themselves (the pick's rule), the correction arm among all ten
        scores = sf.matched_scores({k: v for k, v in rows.items() if k != extra})
        scores[extra] = sf.matched_scores(rows).get(extra)
        body = [[a.name, a.change, "–", "–", "–", "–", "*missing*"] if (r := rows.get(a.name)) is None else [
            a.name, a.change, r["steps"], _end(r, "train_seconds", 60, 1), _end(r), _score(scores.get(a.name)),
            r["status"] + (" (earlier search)" if "source" in r else "")] for a in sf.search_arms(key, True)]
        lines += [f"### {family.label} (`{key}`{', ' + sf.registered_name(*model) if model else ''})", "",
                  *md_table(["arm", "change", "steps", "CPU-min", "final PSNR", "at matched time", "status"], body,
                            "llrrrrl")]
        if (p := sf.pick(records, key, docs)) is not None:
            toss = " — **coin toss** (gap < 0.1 dB, within one seed's noise)" * _toss(p["gap"])
            lines += ["", *text("pick", p=p, minutes=p["matched_seconds"] / 60, toss=toss)]
        if key in sf.CORRECTED_FAMILIES:
            lines += ["", *correction_lines(records, key, docs)]
        total = sum(r["curve"][-1]["train_seconds"] for r in rows.values() if r.get("curve"))
        lines += ["", f"CPU spent on this search: {total / 60:.0f} CPU-minutes over {len(rows)} arms.", ""]
    return lines


def _toss(gap: float | None) -> bool:
    """A pick whose gap to the runner-up is under 0.1 dB (one seed per arm): a coin toss."""
    return gap is not None and gap < 0.1


def correction_lines(records: sf.Records, key: str, docs: Path) -> list[str]:
    """What the review's lr-5e-4 arm (``corrections.md``, written before it ran) did to a family's pick."""
    first, c, name = sf.pick(records, key, docs), sf.pick(records, key, docs, True), sf.CORRECTION_ARM.name
    if c is None:
        return text("correction-missing", name=name)
    toss = " (by less than 0.1 dB on one seed: a coin toss, so lr 1e-3 is bracketed only narrowly)" * _toss(c["gap"])
    return text("correction-moves" if first is not None and c["arm"] != first["arm"] else "correction-stays",
                name=name, c=c, minutes=c["matched_seconds"] / 60, toss=toss)


# -- section 3: the 2 x 2 at each arm's pick ---------------------------------------------------------------------
def main_section(page: std.Page) -> list[str]:
    f = reading(page)
    plan, arms, missing = f["plan"], f["arms"], f["missing"]
    lines = ["## 3. The 2 × 2 at each arm's own recipe", ""]
    if plan:
        lines += text("main-commit", commit=plan["main_commit"][:10],
                      others=other_commits_note(page.records, plan["main_commit"]))
    if plan.get("probe"):
        lines += text("main-probe", date=plan["probe"]["date"], ips=", ".join(
            f"{k} {v:.1f}" for k, v in plan["probe"]["images_per_second"].items()))
    if missing:
        lines += ["", *text("not-yet-run", count=len(missing), planned=f["stage1"], names=_names(missing))]
    if not arms:
        return [*lines, "", "No main run has finished yet.", ""]
    body = [[name, f"{len(runs)} ({', '.join(str(r['seed']) for r in runs)})", runs[0]["steps"],
             f"{runs[0]['evaluation']['arch']['params']:,}", f"{runs[0]['evaluation']['arch']['gmacs']:.2f}",
             f"{statistics.fmean(r['train_seconds'] or 0 for r in runs) / 60:.1f}", f"{statistics.fmean(psnrs):.2f}",
             f"{statistics.stdev(psnrs):.3f}" if len(psnrs) > 1 else "–", describe(f["computed"]["vs_bicubic"][name]),
             f"{statistics.fmean(_mean(r, 'ssim') for r in runs):.4f}",
             f"{statistics.fmean(_mean(r, split='kodak') for r in runs):.2f}"]
            for name, runs in sorted(arms.items()) for psnrs in [[_mean(r) for r in runs]]]
    first = next(iter(arms.values()))[0]
    low = first["evaluation"].get("imagenet_low_resolution")
    body.append(["bicubic (0.25 values/px)", "–", "–", 0, "–", "–", f"{_mean(first, 'bicubic_psnr'):.2f}", "–", "–",
                 f"{_mean(first, 'bicubic_ssim'):.4f}", "–"])
    lines += ["", *md_table(["arm", "runs (seeds)", "steps", "params", "GMACs", "CPU-min / run", "PSNR (40 ImageNet)",
                             "seed s.d.", "− bicubic [95% CI, seeds] (exploratory)", "SSIM", "kodim21–24 PSNR"], body,
                            "llrrrrrrlrr"), "",
              *(text("bicubic", low=low, vpp=3 * low[0] * low[1] / 256**2,
                     tokens=first["evaluation"]["arch"]["values_per_pixel"]) if low else text("bicubic-plain")), ""]
    for title, fam, summ in (("Primary comparisons (pre-registered, Holm over the four, PSNR)", PRIMARY, f["primary"]),
                             ("Exploratory comparisons", SECONDARY, f["secondary"])):
        lines += [f"### {title}", "", *comparison_table(fam, summ, fam is PRIMARY), "",
                  *text("holm", levels=holm_intervals(summ, fam)), ""]
    # null rows: each distinct pair of seeds once (the two families share groups)
    nulls = list({tuple(sorted((str(n["a"]), str(n["b"])))): n for summ in (f["primary"], f["secondary"]) if summ
                  for n in summ["null_rows"]}.values())
    if nulls:
        lines += [*text("null-rows", excluding=sum(n["excludes_zero"] for n in nulls), pairs=len(nulls),
                        largest=max(abs(n["diff"]) for n in nulls)), ""]
    lines += sensitivity_lines(arms) + divergence_lines(arms, f["primary"] is not None and f["secondary"] is not None)
    lines += extra_seed_lines(f["rule"]) + cpu_budget_lines(arms) + flattening_lines(f["computed"]["flattening"])
    return [*lines, f"![validation PSNR against images seen and CPU-seconds]({plot_curves(page)})", ""]


def describe(d: dict[str, Any]) -> str:
    """A seed-level difference: ``+x [lo, hi] (n = k): verdict``, or the mean alone with one seed."""
    if d["low"] is None:
        return f"{d['mean']:+.2f} (one seed)"
    return f"{d['mean']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}] (n = {d['n']}): {d['verdict']}"


def _diff(c: dict[str, Any], digits: int = 2) -> str:
    ci = "no interval" if c["ci"][0] is None else f"[{c['ci'][0]:+.{digits}f}, {c['ci'][1]:+.{digits}f}]"
    return f"{c['diff']:+.{digits}f} {ci}"


def comparison_table(fam: list[tuple[str, str, str, str]], summ: dict[str, Any] | None, primary: bool) -> list[str]:
    body: list[list[Any]] = []
    for pid, question, a, b in fam:
        c, s = comparison(summ, a, b), comparison(summ, a, b, "ssim")
        body.append([pid, question, f"{a} − {b}", "*not run yet*", *[""] * 6] if c is None or s is None else [
            pid, question, f"{a} − {b}", _diff(c), c["test"], f"{c['n_a']} vs {c['n_b']}",
            "–" if c["p"] is None else f"{c['p']:.3g}", "–" if c["p_holm"] is None else f"{c['p_holm']:.3g}",
            f"**{c['verdict']}{'' if primary else ' (exploratory)'}**", _diff(s, 4)])
    return md_table(["id", "question", "a − b", "PSNR diff [95% CI, unadjusted]", "test", "seeds", "p", "p (Holm)",
                     "verdict (from Holm p)", "SSIM diff [95% CI, unadjusted] (exploratory)"], body, "llllllrrll")


def holm_levels(summ: dict[str, Any] | None, fam: list[tuple[str, str, str, str]]) -> list[st.Primary]:
    """Each PSNR comparison's interval at the confidence Holm's step-down gives it (the k-th smallest p of m at
    1 - 0.05 / (m - k + 1)): :func:`looprun.statistics.margin_family` over the same seed-level differences."""
    seeds = {a["name"]: [s["psnr"] for s in a["per_seed"]] for a in (summ or {}).get("arms", [])}
    test = {"paired t": st.paired_difference, "Welch t": st.welch_difference}
    return st.margin_family([st.Primary(pid, test[c["test"]](seeds[a], seeds[b])) for pid, _, a, b in fam
                             if (c := comparison(summ, a, b)) is not None and c.get("p") is not None])


def holm_intervals(summ: dict[str, Any] | None, fam: list[tuple[str, str, str, str]]) -> str:
    return "; ".join(sorted(f"{p.id} [{p.ci_holm[0]:+.2f}, {p.ci_holm[1]:+.2f}] ({100 * p.confidence_holm:.1f}%)"
                            for p in holm_levels(summ, fam) if p.ci_holm and p.confidence_holm)) or "none computed"


def primaries(page: std.Page) -> list[dict[str, Any]]:
    """P1-P4 in the engine's ``results.json`` form: ``loopvae compare``'s rows with id, label, Holm-level interval."""
    summ = reading(page)["primary"]
    levels = {p.id: {"confidence_holm": p.confidence_holm, "ci_holm": list(p.ci_holm) if p.ci_holm else None}
              for p in holm_levels(summ, PRIMARY)}
    return [dict(c, id=pid, label=question, margin=None, **levels.get(pid, {"confidence_holm": None, "ci_holm": None}))
            for pid, question, a, b in PRIMARY if (c := comparison(summ, a, b)) is not None]


def sensitivity_lines(arms: Runs) -> list[str]:
    """The primaries under Welch's t instead of the paired t (Holm over the same four): what rests on the pairing."""
    if not all(a in arms and b in arms for _, _, a, b in PRIMARY):
        return []
    welch = st.apply_holm([st.welch_difference([_mean(r) for r in arms[a]], [_mean(r) for r in arms[b]])
                           for _, _, a, b in PRIMARY])
    return [*text("sensitivity", parts="; ".join(f"{pid} {d.mean:+.2f} dB, Holm p {d.p_adjusted:.3g}: {d.verdict}"
                                                 for (pid, *_), d in zip(PRIMARY, welch, strict=True))), ""]


def divergence_lines(arms: Runs, with_verdicts: bool = True) -> list[str]:
    """The pre-registered diagnosis of a diverging seed (which images, what kind of error), or the closest call."""
    values = {name: [_mean(r) for r in runs] for name, runs in arms.items()}
    spreads = {name: max(v) - min(v) for name, v in values.items()}
    others = {name: statistics.median([v for k, v in spreads.items() if k != name] or [0.0]) for name in arms}
    lines = []
    for name, runs in arms.items():
        if not st.seeds_disagree(vals := values[name], others[name]):
            continue
        worst = max(range(len(runs)), key=lambda i: abs(vals[i] - statistics.median(vals)))
        bad, rest = runs[worst], [r for i, r in enumerate(runs) if i != worst]
        ref = [statistics.fmean(r["evaluation"]["imagenet"][i]["psnr"] for r in rest)
               for i in range(len(bad["evaluation"]["imagenet"]))]
        deltas = sorted(((x["psnr"] - ref[i], x) for i, x in enumerate(bad["evaluation"]["imagenet"])),
                        key=lambda t: t[0])
        vs = {k: [statistics.fmean(x[k] for r in rs for x in r["evaluation"]["imagenet"]) for rs in ([bad], rest)]
              for k in ("colour_error", "low_freq_rmse", "high_freq_rmse", "out_of_range")}
        kinds = ", ".join(f"{label} {vs[k][0]:.4f} vs {vs[k][1]:.4f}" for k, label in (
            ("colour_error", "colour shift"), ("low_freq_rmse", "low-frequency RMSE"),
            ("high_freq_rmse", "high-frequency RMSE")))
        lines += [*text("diverging", name=bad["name"], group=name, value=vals[worst],
                        others=statistics.fmean(vals[:worst] + vals[worst + 1:]), lower=sum(d < 0 for d, _ in deltas),
                        images=len(deltas), worst=deltas[0][1]["key"], delta=deltas[0][0],
                        saturated=100 * deltas[0][1]["saturated_ref"], kinds=kinds,
                        range_seed=100 * vs["out_of_range"][0], range_others=100 * vs["out_of_range"][1]), ""]
        lines += without_seed_lines(arms, name, bad) if with_verdicts else []
    if not lines and any(len(runs) > 1 for runs in arms.values()):  # the rule was applied and found nothing
        margins = {n: (spreads[n], st.disagreement_threshold(others[n])) for n, v in arms.items() if len(v) > 1}
        widest = max(margins, key=lambda k: margins[k][0] / margins[k][1])
        lines += [*text("no-divergence", group=widest, spread=margins[widest][0], threshold=margins[widest][1]), ""]
    return lines


def said(c: dict[str, Any] | None) -> str:
    """``+0.42 dB [+0.10, +0.74]: **better**`` from a comparison row (its verdict after the family's correction)."""
    if c is None:
        return "not computed (runs missing)"
    ci = "" if c["ci"][0] is None else f" [{c['ci'][0]:+.2f}, {c['ci'][1]:+.2f}]"
    return f"{c['diff']:+.2f} dB{ci}: **{c['verdict']}**"


def without_seed_lines(arms: Runs, name: str, bad: dict[str, Any]) -> list[str]:
    """The comparisons of group ``name`` without the diverging run ``bad`` (and every group's run of that seed, so
    pairs stay paired): the reported verdicts keep all seeds, this is the check."""
    others = {k: [r for r in v if r["seed"] != bad["seed"]] for k, v in arms.items()}
    out = [f"{pid} ({title}) without seed {bad['seed']}: {said(comparison(summ, a, b))}"
           for title, fam in (("primary", PRIMARY), ("exploratory", SECONDARY))
           if any(name in f[2:] for f in fam) for summ in [sf.family_summary(others, fam)]
           for pid, _, a, b in fam if name in (a, b)]
    return [f"Without seed {bad['seed']} (the reported verdicts keep it): " + "; ".join(out) + ".", ""] if out else []


def extra_seed_lines(rule: dict[str, Any]) -> list[str]:
    """What the pre-registered extra-seed rule decided at 3 seeds, which runs that means and whether they ran."""
    if not rule["stage1_complete"]:
        return []
    lines = []
    for pid, _, a, b in PRIMARY:
        if (c := rule["stage1"].get(pid)) is None:
            continue
        holm = f"{c['diff']:+.2f} dB, Holm p {'–' if c.get('p_holm') is None else format(c['p_holm'], '.3g')}"
        names = rule["extra_runs"].get(pid, [])
        todo = [n for n in names if n in rule["missing"]]
        state = text("extra-seeds-to-run", todo=len(todo), runs=len(names))[0] if todo else \
            "done: the verdict above uses seeds 0–4"
        lines += text("extra-seed-added", pid=pid, holm=holm, a=a, b=b, seeds=" and ".join(map(str, sf.EXTRA_SEEDS)),
                      names=_names(names), state=state) if pid in rule["extended"] else \
            text("extra-seed-kept", pid=pid, c=c, holm=holm)
    return [*text("extra-seeds", items=lines, error=optional_stopping_error()), ""]


def optional_stopping_error(n1: int = 3, n2: int = 5, alpha: float = 0.05, sims: int = 200_000) -> float:
    """Per-comparison type-I error of the extra-seed rule (paired t at ``n1`` seeds, if not significant again at
    ``n2``), simulated under the null with normal differences (a fixed seed: the page is reproducible)."""
    d = np.random.default_rng(0).standard_normal((sims, n2))
    significant = lambda x: np.abs(x.mean(1) / (x.std(1, ddof=1) / np.sqrt(x.shape[1]))) > stats.t.ppf(
        1 - alpha / 2, x.shape[1] - 1)
    first = significant(d[:, :n1])
    return float((first | (~first & significant(d))).mean())


def regular(curve: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A curve's validation points at its regular interval: a final validation a few steps after the last regular
    one (steps not divisible by the interval) replaces it rather than forming a tiny last interval."""
    points = [p for p in curve if p.get("psnr") is not None]
    gap = statistics.median(b["images_seen"] - a["images_seen"] for a, b in zip(points, points[1:])) \
        if len(points) >= 3 else 0
    return points[:-2] + points[-1:] if gap and points[-1]["images_seen"] - points[-2]["images_seen"] < gap / 2 \
        else points


def cpu_budget_lines(arms: Runs) -> list[str]:
    """Equal CPU-seconds as measured: per equal-CPU primary, the reference's training CPU against LoopVAE's, and
    the PSNR the excess is worth on the reference's own curve (its last interval's slope times the excess)."""
    lines = []
    for pid, _, a, b in [p for p in PRIMARY if p[2].endswith("@cpu") and p[2] in arms and p[3] in arms]:
        sa, sb = (statistics.fmean(r["train_seconds"] for r in arms[k]) for k in (a, b))
        slopes = [(p[-1]["psnr"] - p[-2]["psnr"]) / (p[-1]["train_seconds"] - p[-2]["train_seconds"])
                  for p in (regular(r["curve"]) for r in arms[b])
                  if len(p) >= 2 and p[-1]["train_seconds"] > p[-2]["train_seconds"]]
        effect = statistics.fmean(slopes) * (sb - sa) if slopes else float("nan")
        lines += text("cpu-budget-item", pid=pid, a=a, b=b, sa=sa, sb=sb, ratio=sb / sa, effect=effect)
    return [*text("cpu-budget", items=lines), ""] if lines else []


def flattening(arms: Runs) -> dict[str, dict[str, Any]]:
    """Per group (mean over seeds): the last validation interval's gain (dB; flat below :data:`FLAT_DB`) and crops,
    and the whole run's gain since its first validation."""
    out = {}
    for name, runs in sorted(arms.items()):
        if curves := [c for c in (regular(r["curve"]) for r in runs) if len(c) >= 3]:
            last = statistics.fmean(c[-1]["psnr"] - c[-2]["psnr"] for c in curves)
            out[name] = {"last_interval_db": last, "run_gain_db": statistics.fmean(c[-1]["psnr"] - c[0]["psnr"]
                                                                                   for c in curves),
                         "last_interval_crops": statistics.fmean(c[-1]["images_seen"] - c[-2]["images_seen"]
                                                                 for c in curves), "flat": last < FLAT_DB}
    return out


def flattening_lines(flat: dict[str, dict[str, Any]]) -> list[str]:
    if not flat:
        return []
    parts = "; ".join(text("flattening-item", name=n, v=v, share=100 * v["last_interval_db"] / v["run_gain_db"],
                           state="flat" if v["flat"] else "still rising")[0] for n, v in flat.items())
    rising = ", ".join(f"`{k}`" for k, v in flat.items() if not v["flat"])
    tail = text("flattening-rising", rising=rising)[0] if rising else ""
    return [*text("flattening", flat=FLAT_DB, parts=parts, tail=tail), ""]


def other_commits_note(records: sf.Records, main_commit: str) -> str:
    """Main runs that recorded another commit than the plan's (the extra seeds ran from a driver-only change)."""
    others: dict[str, list[str]] = {}
    for name, r in records.items():
        if name.startswith("main-") and (commit := (r.get("code") or {}).get("commit", "")) not in ("", main_commit):
            others.setdefault(commit, []).append(name)
    return "".join(text("other-commit", names=_names(sorted(names)), commit=c[:10], main=main_commit[:10])[0]
                   for c, names in sorted(others.items()))


def plot_curves(page: std.Page, name: str = "curves.png") -> str:
    """Every main run's validation PSNR against crops seen and CPU-minutes (drawn only when the page writes)."""
    main = [r for r in page.records.values() if r.get("phase") == "main" and r.get("curve")]
    if page.draw and main:
        from looprun.plotting import pyplot

        plt = pyplot()
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        for r in main:
            for ax, x, scale in ((axes[0], "images_seen", 1e3), (axes[1], "train_seconds", 60)):
                ax.plot([p[x] / scale for p in r["curve"]], [p["psnr"] for p in r["curve"]],
                        "-" if "images" in r["budget"] else "--", color=f"C{list(sf.FAMILIES).index(r['family'])}",
                        alpha=0.8, label=f"{r['family']} {'/'.join(r['budget'])}" if r["seed"] == 0 else None)
        for ax, xlabel in ((axes[0], "crops seen (thousands)"), (axes[1], "CPU-minutes of training (1 thread)")):
            ax.set(xlabel=xlabel, ylabel="validation PSNR at 256² (dB)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle("Main runs: validation PSNR (40 images disjoint from training and the reported sets), every seed")
        fig.tight_layout()
        fig.savefig(page.store.docs / name, dpi=110)
        plt.close(fig)
    return f"{Path(page.study.docs).name}/{name}"


# -- section 4: the conclusion; section 5: the bundled references -------------------------------------------------
def phrase(rows: list[tuple[str, dict[str, Any] | None]]) -> str:
    """How one or two comparisons (labelled by budget) read in one clause, from their verdicts alone."""
    if any(c is None for _, c in rows):
        return "is not computed yet"
    verdicts, diffs = {c["verdict"] for _, c in rows}, " / ".join(f"{c['diff']:+.2f} dB" for _, c in rows)
    where = "at both budgets" if len(rows) > 1 else f"at {rows[0][0]}"
    return {frozenset({"better"}): f"buys quality {where} ({diffs})", frozenset({"worse"}): f"costs quality {where} "
            f"({diffs})", frozenset({"inconclusive"}): f"is not resolved by these seeds "
            f"{'at either budget' if len(rows) > 1 else where} ({diffs})"}.get(frozenset(verdicts)) or \
        "is " + " and ".join(f"{c['verdict']} at {label} ({c['diff']:+.2f} dB)" for label, c in rows)


def arm_costs(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Params, GMACs per 256² reconstruction and measured training CPU-ms per image seen (mean over seeds)."""
    arch = runs[0]["evaluation"]["arch"]
    per_image = [r["train_seconds"] / (r["steps"] * arch["order"].get("batch_size", 8)) for r in runs
                 if r.get("train_seconds")]
    return {"params": arch["params"], "gmacs": arch["gmacs"],
            "train_ms_per_image": 1000 * statistics.fmean(per_image) if per_image else float("nan")}


def conclusion_lines(arms: Runs, primary: dict[str, Any] | None, secondary: dict[str, Any] | None,
                     missing: list[str]) -> tuple[list[str], dict[str, Any]]:
    """The pre-registered conclusion once every planned main run has finished: what recurrence buys (P1-P4), what
    shortcuts buy (S1-S2, exploratory), at what cost in weights, MACs and training CPU-ms per image."""
    if missing or not arms:
        return [*text("conclusion-waiting", missing=len(missing)), ""], {"complete": False}
    lines, said_ = ["## 4. Conclusion (computed from the verdicts above)", ""], {}
    costs = {k: arm_costs(v) for k, v in arms.items()}
    for title, (img, cpu) in (("LoopVAE against AutoencoderKL (neither with shortcuts)", PRIMARY[0::2]),
                              ("LoopVAE with shortcuts against AutoencoderDC", PRIMARY[1::2])):
        fa, fb = (g.split("@")[0] for g in img[2:])
        said_[fa] = [("equal images", comparison(primary, *img[2:])), ("equal CPU-seconds", comparison(primary,
                                                                                                        *cpu[2:]))]
        lines += text("conclusion-primary", title=title, fa=fa, fb=fb, img=img[0], cpu=cpu[0],
                      said_img=said(said_[fa][0][1]), said_cpu=said(said_[fa][1][1]),
                      ratio={k: costs[img[2]][k] / costs[img[3]][k] for k in ("params", "gmacs", "train_ms_per_image")})
    for (sid, _, a, b), title, what in ((SECONDARY[0], "Shortcuts within LoopVAE", "the same model with and without "
                                         "its parameter-free shortcuts"), (SECONDARY[1], "AutoencoderDC against "
                                        "AutoencoderKL", "two different diffusers families: shortcuts are one of "
                                        "several differences")):
        said_[sid] = [("equal images", comparison(secondary, a, b))]
        lines += text("conclusion-secondary", title=title, a=a.split("@")[0], b=b.split("@")[0], what=what, sid=sid,
                      said=said(said_[sid][0][1]))
    span = lambda v: f"{v[0] / 1e6:.2f}M" if len(v) == 1 else f"{v[0] / 1e6:.2f}–{v[-1] / 1e6:.2f}M"
    loop, refs = (sorted({v["params"] for k, v in costs.items() if k.startswith("loopvae") == lv}) for lv in (1, 0))
    summary = text("conclusion-summary", loop=span(loop), refs=span(refs), steps=sf.MAIN_STEPS,
                   p1=phrase(said_["loopvae"]), p2=phrase(said_["loopvae-sc"]), s1=phrase(said_["S1"]),
                   s2=phrase(said_["S2"]))[0]
    return [*lines, "", summary, "", *text("conclusion-families"), ""], {
        "complete": True, "costs": costs, "summary": summary.replace("**", "")}


def bundled_references(page: std.Page) -> list[str]:
    """Section 5: where the references trained at this study's picks for the bundled LoopVAE's crops are and where
    their numbers are (one table, in ``study_loopvae.md``; not repeated here)."""
    if not (refs := references(page.store.root)):
        return []
    names = _names([name for name, r in refs.items() if r.get("bundled")])
    return [*text("bundled", names=names, date=max(r["date"] for r in refs.values())[:10]), ""]


STUDY = Study(
    name="fair", title="A fair fight: LoopVAE against references on equal terms", docs="docs/study_fair",
    page="docs/study_fair.md", arms=[Arm(k, f.label) for k, f in sf.FAMILIES.items()],
    budgets=[Budget("img", sf.MAIN_SEEDS), Budget("cpu", sf.MAIN_SEEDS, arms=("loopvae", "klvae", "dcae"))],
    metric=Metric("psnr", "dB", label="held-out PSNR"), run=run, row=row, prepare=prepare,
    preregistration=None,  # the page quotes preregistration.md; plan.json pinned the main commit before the engine
    phases=[Phase("shapes", lambda study, records: sf.plan_shapes(sf.costs(DOCS)), registered=False),
            Phase("search", lambda study, records: sf.plan_search(records, sf.costs(DOCS)), registered=False),
            Phase("main", lambda study, records: sf.extra_seed_rule(records, sf.costs(DOCS, main=True), DOCS)[2])],
    sections=[std.header, intro, shapes_section, search_section, main_section,
              lambda page: reading(page)["conclusion"] if reading(page)["arms"] else [], bundled_references],
    extra_results=lambda page: {"computed": reading(page)["computed"], "primaries": primaries(page)})
