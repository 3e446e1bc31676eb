"""Tables, plots and the computed reading of the recurrence study (``benchmarks/study_recursion.py``).

:func:`summarise` turns the per-run ``result.json`` records into per-arm seed statistics; :func:`reading` writes
every sentence from those statistics with its condition stated, so different numbers give different sentences
(``tests/classifier/test_study_recursion.py`` checks that). Arms share seeds (initialisation and data order), so a
comparison pairs them by seed: the mean of the per-seed differences with a 95% t-interval, df = seeds - 1
(:func:`paired_stats.paired_difference`, the helper the LoopVAE study reports use too), and a verdict: better,
worse or inconclusive. An inconclusive difference is never read as equality.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paired_stats import PairedDifference, paired_difference  # noqa: E402

FLAT_FRACTION = 0.10  # a loss curve counts as flattened when its last 20% of steps make < 10% of its total decrease
CHANCE = 10.0  # CIFAR-10 top-1 (%) of a constant guess
NEAR_CHANCE = 15.0  # "collapse to near chance": top-1 below this
SPARSE_STEPS = (0, 1, 2, 3, 6, 12, 24, 48)
ROUTER_MARGIN = 0.05  # a router "favours" a step when that step's mean weight exceeds uniform (1/R) by this
FUSION_ORDER = ("query", "token", "global", "mean", "last")
WITHIN = 1.0  # "reaches its horizon accuracy": the step's mean top-1 is within this many points of step T's


# -- statistics -----------------------------------------------------------------------------------------
@dataclass
class Stat:
    """Seed values of one quantity (``seeds``: which seed each came from; default 0, 1, ...); ``mean`` and the
    sample s.d. (0 for one seed)."""

    values: list[float]
    seeds: list[int] = field(default_factory=list)

    def by_seed(self) -> dict[int, float]:
        return dict(zip(self.seeds or range(self.n), self.values, strict=True))

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return sum(self.values) / self.n if self.values else math.nan

    @property
    def sd(self) -> float:
        if self.n < 2:
            return 0.0
        m = self.mean
        return math.sqrt(sum((v - m) ** 2 for v in self.values) / (self.n - 1))

    def fmt(self, digits: int = 2) -> str:
        if not self.values:
            return "–"
        return f"{self.mean:.{digits}f} ± {self.sd:.{digits}f}" if self.n > 1 else f"{self.mean:.{digits}f}"


@dataclass
class Comparison:
    """``a - b`` paired by seed: the mean difference, its 95% t-interval and the verdict."""

    paired: PairedDifference

    @property
    def delta(self) -> float:
        return self.paired.mean

    @property
    def verdict(self) -> str:
        return self.paired.verdict

    @property
    def called(self) -> bool:
        """The interval excludes 0 (better or worse)."""
        return self.paired.verdict != "inconclusive"

    def text(self, unit: str = " points", words: tuple[str, str] = ("better", "worse")) -> str:
        """``words``: what ``a - b > 0`` and ``< 0`` mean for this quantity (``("higher", "lower")`` for a loss)."""
        p = self.paired
        if p.low is None:
            why = "one seed pair" if p.n < 2 else "zero spread between seeds, degenerate"
            return f"{p.mean:+.2f}{unit} ({why}, no interval: inconclusive)"
        verdict = {"better": words[0], "worse": words[1]}.get(p.verdict, p.verdict)
        return (f"{p.mean:+.2f}{unit} [{p.low:+.2f}, {p.high:+.2f}] (paired by seed, 95% t, n = {p.n}; "
                f"{p.wins}/{p.n} higher: {verdict})")


def compare(a: Stat, b: Stat) -> Comparison:
    """``a - b`` paired over the seeds both have (see the module docstring)."""
    x, y = a.by_seed(), b.by_seed()
    shared = sorted(set(x) & set(y))
    if not shared:
        raise ValueError("the two arms share no seed: nothing to pair")
    return Comparison(paired_difference([x[s] for s in shared], [y[s] for s in shared]))


def order(stats: list[Stat]) -> str:
    """``rises`` / ``falls`` when the means are monotone (non-strictly) and the last differs from the first
    (paired: better / worse); ``mixed`` when they differ but the means are not monotone; else ``flat`` (the
    ends are inconclusive, which is not the same as equal)."""
    means = [s.mean for s in stats]
    ends = compare(stats[-1], stats[0])
    if not ends.called:
        return "flat"
    if ends.verdict == "better" and all(b >= a for a, b in zip(means, means[1:])):
        return "rises"
    if ends.verdict == "worse" and all(b <= a for a, b in zip(means, means[1:])):
        return "falls"
    return "mixed"


# -- per-arm summary ------------------------------------------------------------------------------------
def flattening(curve: list[list[float]], steps: int) -> float:
    """Share of a loss curve's total decrease made in its last 20% of steps (window means; see module)."""
    def window(lo: float, hi: float) -> float:
        values = [loss for step, loss in curve if lo * steps < step <= hi * steps]
        if not values:  # a short run: the point nearest the window's end
            values = [min(curve, key=lambda p: abs(p[0] - hi * steps))[1]]
        return sum(values) / len(values)

    first, late, last = curve[0][1], window(0.7, 0.8), window(0.9, 1.0)
    return (late - last) / max(first - last, 1e-9)


def summarise(results: dict[str, dict], picks: dict[str, dict], arms: list, settings: dict) -> dict[str, Any]:
    """Per arm (at its group's picked lr, over the seeds): stats of every reported quantity."""
    summary: dict[str, Any] = {}
    for arm in arms:
        lr = picks[arm.group]["lr"]
        runs = [results[f"{arm.name}-lr{lr:g}-s{seed}"] for seed in settings["seeds"]]
        good = [r for r in runs if not r["diverged"]]
        seeds = [int(r["seed"]) for r in good]
        stat = lambda values, seeds=seeds: Stat(values, list(seeds))  # values in the order of `good`

        entry: dict[str, Any] = {"arm": arm.name, "section": arm.section, "group": arm.group, "lr": lr,
                                 "model": arm.model, "extra": list(arm.extra), "horizon": arm.horizon,
                                 "block_evaluations": arm.block_evaluations, "diverged": len(runs) - len(good),
                                 "seeds": len(good)}
        if good:
            entry.update({
                "parameters": good[0]["parameters"], "epochs": good[0]["epochs"],
                "top1": stat([100 * r["top1"] for r in good]), "top5": stat([100 * r["top5"] for r in good]),
                "final_loss": stat([r["final_train_loss"] for r in good]),
                "flattening": stat([flattening(r["loss_curve"], r["steps"]) for r in good]),
                "train_seconds": stat([r["train_seconds"] for r in good]),
                "loss_curve": mean_curve([r["loss_curve"] for r in good]),
                # depths every seed was evaluated at (an older result may lack the in-horizon steps)
                "by_steps": {k: stat([100 * r["by_steps"][k] for r in good])
                             for k in sorted(set.intersection(*(set(r["by_steps"]) for r in good)), key=int)},
                "horizon_steps": [str(k) for k in arm.horizon_steps()],
            })
            if all("swapped" in r for r in good):
                entry["swapped"] = [{**{k: v for k, v in sw.items() if k != "top1"},
                                     "top1": stat([100 * r["swapped"][i]["top1"] for r in good])}
                                    for i, sw in enumerate(good[0]["swapped"])]
            shared = arm.group.removesuffix("-last")
            if shared != arm.group and shared in picks and picks[shared]["lr"] != lr:
                # plain recursion at the lr the fused arms of its depth use (the study's earlier protocol)
                other = [results.get(f"{arm.name}-lr{picks[shared]['lr']:g}-s{seed}") for seed in settings["seeds"]]
                other = [r for r in other if r is not None and not r["diverged"]]
                if other:
                    entry["top1_at_shared_lr"] = Stat([100 * r["top1"] for r in other], [int(r["seed"]) for r in other])
                    entry["shared_lr"] = picks[shared]["lr"]
            for key in ("state_norms", "direction_change", "router_entropy"):
                if key in good[0]:
                    entry[key] = [stat([r[key][i] for r in good]) for i in range(len(good[0][key]))]
            if "router_weights" in good[0]:
                entry["router_weights"] = [[stat([r["router_weights"][j][i] for r in good])
                                            for i in range(len(good[0]["router_weights"][j]))]
                                           for j in range(len(good[0]["router_weights"]))]
            if good[0].get("entropy_curve"):
                entry["entropy_curve"] = mean_curve([[[s, sum(e) / len(e)] for s, e in r["entropy_curve"]]
                                                     for r in good])
        summary[arm.name] = entry
    return summary


def mean_curve(curves: list[list[list[float]]]) -> list[list[float]]:
    """Pointwise mean of curves sampled at the same steps."""
    return [[points[0][0], sum(p[1] for p in points) / len(points)] for points in zip(*curves)]


def growth_per_step(norms: list[float], horizon: int) -> float:
    """Geometric-mean factor by which the state norm grows per step over steps 1..``horizon``."""
    return (norms[horizon] / norms[1]) ** (1 / max(horizon - 1, 1))


def turning_stops(turns: list[float], tolerance: float = 0.01) -> int | None:
    """First step after which every later step turns the unit state by less than ``tolerance`` (or None)."""
    for t in range(len(turns)):
        if all(v < tolerance for v in turns[t:]):
            return t + 1
    return None


# -- reading --------------------------------------------------------------------------------------------
def coin_toss(pick: dict[str, Any], noise: Stat | None) -> tuple[float, float, float] | None:
    """``(runner-up lr, its loss gap, the seed s.d.)`` when the sweep's runner-up is behind the pick by less than the
    seed s.d. of the arm's final loss (the pick is then a coin toss between the two); else None."""
    finite = sorted((v, float(lr)) for lr, v in pick["losses"].items() if v is not None)
    if len(finite) > 1 and noise is not None and noise.n > 1 and finite[1][0] - finite[0][0] < noise.sd:
        return finite[1][1], finite[1][0] - finite[0][0], noise.sd
    return None


def at_other_lr(s: dict[str, Any], picks: dict[str, dict], arm: str, r1: Stat) -> str:
    """For an arm also trained at another depth group's lr (plain recursion at the fused arms' lr): its R - R=1
    comparison there too, with its own lr pick flagged when that pick was a coin toss."""
    e = s.get(arm, {})
    if "top1_at_shared_lr" not in e:
        return ""
    pick = picks[e["group"]]
    toss = coin_toss(pick, e.get("final_loss"))
    flag = (f", an lr picked over {toss[0]:g} on a {toss[1]:.3f} loss gap, less than the seed s.d. ({toss[2]:.3f}): "
            "a coin toss" if toss is not None else "")
    return (f" at its own lr {e['lr']:g}{flag}; at {e['shared_lr']:g}, R=4 − R=1 is "
            f"{compare(e['top1_at_shared_lr'], r1).text()}")


def reading(summary: dict[str, Any], picks: dict[str, dict], settings: dict, lr_grid: list[float]) -> list[str]:
    """Every sentence of the report's reading, each decided by the numbers (see module docstring)."""
    s = summary
    lines = ["## Reading (computed from the tables above; chance is 10%)", ""]
    seeds = min(e["seeds"] for e in s.values())
    lines.append(f"- **Statistics.** {seeds} seed(s) per arm, shared by every arm (the same initialisation seed and "
                 "data order), so every comparison is paired by seed: the mean of the per-seed differences with a "
                 f"95% t-interval (df = {seeds - 1}) and a verdict, better / worse when the interval excludes 0, else "
                 "inconclusive. Inconclusive means the data cannot tell, not that the arms are equal; with "
                 f"{seeds} seeds only consistent differences several times the seed-to-seed wobble are resolved. "
                 "No comparison was written down before the runs and none is corrected for multiplicity over the "
                 "page's dozens of comparisons: every verdict here is exploratory.")
    # learning rates
    parts = []
    for group, pick in picks.items():
        losses = ", ".join(f"{float(lr):g}: " + ("diverged" if v is None else f"{v:.3f}")
                           for lr, v in sorted(pick["losses"].items(), key=lambda kv: float(kv[0])))
        edge = (" — still at the edge after extending the grid, so a better lr may lie outside it"
                if pick["edge"] else "")
        toss = coin_toss(pick, s.get(pick["arm"], {}).get("final_loss"))
        if toss is not None:
            edge += (f" — the runner-up {toss[0]:g} is only {toss[1]:.3f} behind, less than "
                     f"the seed s.d. of this arm's final loss ({toss[2]:.3f}): a coin toss between the two")
        parts.append(f"{group} ({pick['arm']}) {pick['lr']:g} [{losses}]{edge}")
    lines.append("- **Learning rates.** Picked per depth group by the lowest final training loss of seed 0 over "
                 f"the grid {{{', '.join(f'{v:g}' for v in lr_grid)}}}, extended by halving / doubling while the "
                 "best lr was the smallest / largest tried: " + "; ".join(parts) + ".")
    # budget
    flat = {name: s[name]["flattening"] for name in ("srvit-R1-last", "srvit-R4-query", "bvit-euler")
            if "top1" in s[name]}
    described = ", ".join(f"{name} {100 * st.mean:.1f}%" for name, st in flat.items())
    still = [name for name, st in flat.items() if st.mean >= FLAT_FRACTION]
    verdict = ("all have flattened by that rule" if not still else
               f"still falling by that rule: {', '.join(still)}, so the budget under-trains them")
    lines.append(f"- **Budget.** {settings['steps']} steps (≈{s['srvit-R1-last']['epochs']:.1f} epochs). Share of "
                 f"the training loss's total decrease made in the last 20% of steps (flattened below "
                 f"{100 * FLAT_FRACTION:.0f}%): {described}; {verdict}. The cosine schedule ends at 2% of the peak "
                 "lr, which flattens every curve's tail by itself; compare the final losses across depths below.")
    loss_r = [s[f"srvit-R{r}-query" if r > 1 else "srvit-R1-last"]["final_loss"] for r in (1, 2, 4)]
    trend = order(loss_r)
    lines.append(
        f"- **Training loss vs R** (query fusion; R=1 {loss_r[0].fmt(3)}, R=2 {loss_r[1].fmt(3)}, R=4 "
        f"{loss_r[2].fmt(3)}): " + {
            "rises": "it rises with R (R=4 − R=1 paired: higher): the deeper unrolled nets fit the training set worse "
                     "in this budget.",
            "falls": "it falls with R (R=4 − R=1 paired: lower): the deeper unrolled nets fit the training set "
                     "better.",
            "mixed": "R=4 differs from R=1 (paired) but not monotonically.",
            "flat": "R=4 − R=1 is inconclusive (paired by seed)."}[trend]
        + f" R=4 − R=1: {compare(loss_r[2], loss_r[0]).text(unit='', words=('higher', 'lower'))}.")
    # SR-ViT accuracy
    r1 = s["srvit-R1-last"]["top1"]
    modes = [m for m in FUSION_ORDER if "top1" in s.get(f"srvit-R2-{m}", {}) and "top1" in s.get(f"srvit-R4-{m}", {})]
    sentences = []
    for mode in modes:
        stats = [r1, s[f"srvit-R2-{mode}"]["top1"], s[f"srvit-R4-{mode}"]["top1"]]
        sentences.append(f"`{mode}` {stats[1].fmt()} / {stats[2].fmt()} at R=2/4: " + {
            "rises": "rises with R", "falls": "falls with R", "mixed": "not monotone in R",
            "flat": "R=4 − R=1 inconclusive"}[order(stats)] + f" (R=4 − R=1 {compare(stats[2], r1).text()})"
            + at_other_lr(s, picks, f"srvit-R4-{mode}", r1))
    lines.append(f"- **Top-1 vs R** (R=1 {r1.fmt()}%): " + "; ".join(sentences) + ". The paper reports SR-ViT-S "
                 "rising 79.83 → 82.48 on ImageNet-1K for R = 1 → 4.")
    own_lr = [f"R={r} {picks[f'R{r}-last']['lr']:g} (query's: {picks[f'R{r}']['lr']:g})" for r in (2, 4)
              if f"R{r}-last" in picks and f"R{r}" in picks]
    if own_lr:
        shifted = []
        for r in (2, 4):
            e = s[f"srvit-R{r}-last"]
            if "top1_at_shared_lr" in e:
                gain = compare(e["top1"], e["top1_at_shared_lr"])
                against = ", ".join(f"{m} − last {compare(s[f'srvit-R{r}-{m}']['top1'], e['top1_at_shared_lr']).text()}"
                                    for m in modes if m != "last")
                shifted.append(f"R={r}: at its own lr − at query's lr {gain.text()}; against `last` at query's lr "
                               f"({e['shared_lr']:g}) instead: {against}")
        lines.append("- **Plain recursion at its own lr.** `last` has its own sweep per depth: " + ", ".join(own_lr)
                     + ". " + ("; ".join(shifted) + "." if shifted else
                               "The sweep picked the same lr as `query`'s, so the earlier comparison stands.")
                     + " Every comparison with `last` below uses its own pick.")
    fusion = []
    for r in (2, 4):
        last = s[f"srvit-R{r}-last"]["top1"]
        fusion.append(f"R={r}: " + ", ".join(f"{m} − last {compare(s[f'srvit-R{r}-{m}']['top1'], last).text()}"
                                             for m in modes if m != "last"))
    lines.append("- **Fused vs plain recursion** (same R and budget; fused arms at `query`'s lr). " + "; ".join(fusion)
                 + ".")
    routed_gain = None
    if "mean" in modes:
        routing, credited, open_ = [], [], []
        for r in (2, 4):
            mean = s[f"srvit-R{r}-mean"]["top1"]
            for m in ("token", "query", "global"):
                if m in modes:
                    c = compare(s[f"srvit-R{r}-{m}"]["top1"], mean)
                    routing.append(f"R={r} {m} − mean {c.text()}")
                    if c.verdict == "better":
                        credited.append(f"{m} at R={r}")
                    elif not c.called and c.paired.low is not None and c.paired.high > c.paired.low:
                        open_.append((c.paired.high - c.paired.low, f"R={r} {m} − mean [{c.paired.low:+.2f}, "
                                                                     f"{c.paired.high:+.2f}]"))
        routed_gain = credited
        if credited:
            verdict = f"A learned router beats plain averaging for {', '.join(credited)}."
        else:
            verdict = ("No router is shown to beat `mean` fusion"
                       + (f"; the intervals are too wide to call them equal (the widest, {max(open_)[1]}): "
                          "inconclusive, not a match" if open_ else "")
                       + ". So what the fused arms gain over `last` cannot be credited to (token-wise) routing at "
                       "this budget, nor shown to come from averaging alone.")
        lines.append("- **Routing vs averaging the steps** (`mean`: equal weights, no parameters; `global`: one "
                     "learned weight per step, shared by all tokens): " + "; ".join(routing) + ". " + verdict)
    routers = []
    for name in ("srvit-R4-query", "srvit-R4-token", "srvit-R2-query", "srvit-R2-token"):
        e = s[name]
        if "router_weights" not in e:
            continue
        r = len(e["router_weights"][0])
        heaviest = [max(w, key=lambda x: x.mean) for w in e["router_weights"]]
        favoured = [max(range(r), key=lambda i: w[i].mean) + 1 for w in e["router_weights"]]
        top = max(set(favoured), key=favoured.count)
        share = sum(h.mean for h, f in zip(heaviest, favoured) if f == top) / favoured.count(top)
        ent = sum(x.mean for x in e["router_entropy"]) / len(e["router_entropy"])
        if share < 1 / r + ROUTER_MARGIN:
            routers.append(f"{name}: near uniform (the heaviest step's mean weight is below {1 / r:.2f} + "
                           f"{ROUTER_MARGIN:.2f} in the blocks; entropy {ent:.2f} of ln {r} = {math.log(r):.2f} nats)")
        else:
            routers.append(f"{name}: step {top} is the heaviest in {favoured.count(top)} of {len(favoured)} blocks "
                           f"(mean weight there {share:.2f}, uniform = {1 / r:.2f}); entropy {ent:.2f} of "
                           f"ln {r} = {math.log(r):.2f} nats")
    if routers:
        uniform = [r.split(":")[0] for r in routers if "near uniform" in r]
        tail = ""
        if uniform:
            tail = (f" Near-uniform routers ({', '.join(uniform)}) weigh every step about equally: their weights "
                    "are close to `mean` fusion's (whether they also score like `mean` is the previous item's "
                    "question), so a gain of these arms over `last` cannot be credited to token-wise routing "
                    + ("unless they beat the `mean` arm (previous item)." if routed_gain is not None else
                       "unless a `mean` (and `global`) arm at the same budget is run beside them."))
        lines.append("- **What the trained routers favour** (test images, all tokens): " + "; ".join(routers) + "."
                     + tail)
    # deep supervision
    plain, deep = s["bvit-euler"]["by_steps"], s["bvit-euler-ds3"]["by_steps"]
    at, far = str(s["bvit-euler"]["horizon"]), s["bvit-euler"]["horizon_steps"][-1]
    drop_plain = Stat([a - b for a, b in zip(plain[at].values, plain[far].values)], plain[at].seeds)
    drop_deep = Stat([a - b for a, b in zip(deep[at].values, deep[far].values)], deep[at].seeds)
    graceful = compare(drop_plain, drop_deep)
    lines.append(
        f"- **Deep supervision** (bViT, T={at}). At the horizon: {compare(deep[at], plain[at]).text()} (the paper: "
        f"no nominal gain). Run to {far} steps the plain bViT loses {drop_plain.fmt()} points and the supervised "
        f"one {drop_deep.fmt()} (plain's drop − supervised's drop {graceful.text(words=('larger', 'smaller'))}): "
        + ("graceful degradation appears (the supervised one loses less)." if graceful.verdict == "better" else
           "inconclusive whether supervision changes the degradation." if not graceful.called else
           "the supervised one degrades more.")
        + (f" The paper's collapse to near chance without supervision appears ({plain[far].fmt()}% at {far} steps)."
           if plain[far].mean < NEAR_CHANCE else
           f" The paper's collapse to near chance without supervision does not appear ({plain[far].fmt()}% at "
           f"{far} steps)."))
    # solvers
    euler = s["bvit-euler"]["top1"]
    heun, matched, black = s["bvit-heun"]["top1"], s["bvit-heun-T6h2"]["top1"], s["bvit-blackbox"]["top1"]
    lines.append(
        f"- **Euler vs Heun.** At matched steps (T=12, h=1; Heun uses 2× the block evaluations) Heun − Euler "
        f"{compare(heun, euler).text()}; at matched block evaluations and integration time (Heun T=6, h=2) "
        f"{compare(matched, euler).text()}.")
    swaps = []
    for name in ("bvit-euler", "bvit-heun", "bvit-heun-T6h2"):
        e = s.get(name, {})
        for sw in e.get("swapped", []):
            c = compare(sw["top1"], e["top1"])
            swaps.append((c, f"{name} with {sw['solver']} (h={sw['step_size']:g}, {sw['steps']} steps, "
                             f"{sw['block_evaluations']} evaluations) − with its own {c.text()}"))
    if swaps:
        verdicts = []
        for name in ("bvit-euler", "bvit-heun", "bvit-heun-T6h2"):
            own = [c for c, text in swaps if text.startswith(name + " with")]
            if not own:
                continue
            worse = sum(c.verdict == "worse" for c in own)
            better = sum(c.verdict == "better" for c in own)
            verdicts.append(f"{name}: {worse} of {len(own)} worse, {better} better" + (
                " (tied to the discretisation it was trained with)" if worse == len(own) else
                " (no swap is worse; inconclusive is not equal)" if worse == 0 else " (partly tied)"))
        lines.append(
            "- **Swapped solvers** (trained weights, the other solver at the same integration time T·h = 12): "
            + "; ".join(text for _, text in swaps) + ". Per trained arm: " + "; ".join(verdicts) + ". A solver swap "
            "that costs accuracy means the weights fit their discretisation rather than a field that any accurate "
            "solver integrates to the same answer.")
    inside = []
    for name in ("bvit-euler", "bvit-euler-ds3", "bvit-blackbox"):
        e = s.get(name, {})
        horizon = e.get("horizon")
        steps = e.get("by_steps", {})
        if "top1" not in e or any(str(t) not in steps for t in range(1, horizon + 1)):
            continue
        final = steps[str(horizon)].mean
        reach = next(t for t in range(1, horizon + 1)
                     if all(steps[str(u)].mean >= final - WITHIN for u in range(t, horizon + 1)))
        curve = [steps[str(t)].mean for t in range(1, horizon + 1)]
        shape = "rising at every step" if all(b >= a for a, b in zip(curve, curve[1:])) else "not monotone"
        peak = max(range(horizon), key=lambda i: curve[i])
        top = "" if peak == horizon - 1 else f", peak {curve[peak]:.1f}% at step {peak + 1}"
        inside.append((name, f"{name} {curve[0]:.1f}% at step 1 → {final:.1f}% at step {horizon} ({shape}{top}), "
                             f"within {WITHIN:g} point of it from step {reach} on"))
    if inside:
        text = "; ".join(t for _, t in inside)
        names = {n for n, _ in inside}
        if {"bvit-euler", "bvit-euler-ds3"} <= names:
            mid = str(s["bvit-euler"]["horizon"] // 2)
            c = compare(s["bvit-euler-ds3"]["by_steps"][mid], s["bvit-euler"]["by_steps"][mid])
            text += (f". At step {mid}, half the horizon, deep supervision − plain {c.text()}"
                     + (": the supervised states are usable early (any-time prediction)." if c.verdict == "better"
                        else "."))
        lines.append(f"- **Inside the horizon** (top-1 at every step 1..T, seed means): {text}")
    depths = [n for n in ("bvit-T3", "bvit-T5", "bvit-euler") if "top1" in s.get(n, {})]
    if len(depths) == 3:
        stats = [s[n]["top1"] for n in depths]
        horizons = [s[n]["horizon"] for n in depths]
        trend = order(stats)
        deep = [f"T={h} − T={horizons[0]} {compare(st, stats[0]).text()}"
                for h, st in zip(horizons[1:], stats[1:])]
        lines.append(
            f"- **Depth at this budget** (bViT, Euler h=1, T = {', '.join(map(str, horizons))} block evaluations; "
            f"top-1 {' / '.join(st.fmt() for st in stats)}): " + "; ".join(deep) + ". "
            + {"rises": "Accuracy rises with T: depth pays at this budget.",
               "falls": "Accuracy falls with T: more steps of the shared block hurt at this budget.",
               "mixed": "Not monotone in T.",
               "flat": f"T={horizons[-1]} − T={horizons[0]} is inconclusive: this budget cannot show that "
                       "depth matters, so depth trends of the papers cannot be tested with it."}[trend])
    norms = [st.mean for st in s["bvit-blackbox"]["state_norms"]]
    euler_norms = [st.mean for st in s["bvit-euler"]["state_norms"]]
    turns = [st.mean for st in s["bvit-blackbox"]["direction_change"]]
    growth, euler_growth = growth_per_step(norms, 12), growth_per_step(euler_norms, 12)
    stops = turning_stops(turns[:12])
    cost = compare(euler, black)
    lines.append(
        f"- **Black-box field.** Euler − black-box {cost.text()}"
        + (": the paper's few-point cost of `z' = F(z)` appears." if cost.verdict == "better" else
           ": inconclusive whether the paper's few-point cost of `z' = F(z)` is there." if not cost.called else
           ": black-box is better here, unlike the paper.")
        + f" Its state norm grows ×{growth:.2f} per step over the 12 training steps (Euler: ×{euler_growth:.2f}), "
        f"from {norms[1]:.3g} to {norms[12]:.3g}; "
        + (f"from step {stops} on, each step turns the normalised state by < 1% (the final LayerNorm sees only the "
           "direction), so the later steps barely act and the arm is effectively shallower."
           if stops is not None and stops < 12 else
           "every training step still turns the normalised state by ≥ 1%.")
    )
    # matched FLOPs: a 12-block ViT and bViT's one block applied 12 times cost the same block evaluations
    vit, bvit = s["srvit-R1-last"], s["bvit-euler"]
    if "top1" in vit and "top1" in bvit:
        flops = compare(vit["top1"], bvit["top1"])
        lines.append(
            f"- **Matched FLOPs** ({vit['block_evaluations']} block evaluations "
            f"each): the 12-block ViT − bViT (Euler, T=12) {flops.text()}; the ViT stores "
            f"{vit['parameters'] / bvit['parameters']:.1f}× the parameters. "
            + ("Standard ViTs win at matched FLOPs, as Training Crossroads finds." if flops.verdict == "better" else
               "bViT wins at matched FLOPs here, unlike Training Crossroads." if flops.called else
               "Inconclusive at matched FLOPs."))
    # what this budget can and cannot test
    r4 = s["srvit-R4-query"]["top1"]
    missing = [label for label, present in (
        ("`mean` / `global` fusion", "top1" in s.get("srvit-R4-mean", {})),
        ("bViT at other T", "top1" in s.get("bvit-T3", {})),
        ("the trained Euler and Heun bViTs evaluated with the other solver", "swapped" in s.get("bvit-euler", {})),
    ) if not present]
    lines.append(
        f"- **What this budget can and cannot test.** At top-1 ≈ {r1.mean:.0f}% (R=1) after "
        f"{settings['steps']} steps (≈{s['srvit-R1-last']['epochs']:.0f} epochs of 5,000 images), the study "
        f"compares arms early in training: it can test which arm learns faster at equal steps (R=4 query − R=1 "
        f"{compare(r4, r1).text()}) and what the trained weights do inside (routers, state norms, solvers), not the "
        "papers' converged ImageNet-1K / CIFAR-100 accuracies, nor whether recursion's gains there appear only "
        "after hundreds of epochs."
        + (f" Not run here: {', '.join(missing)}; conclusions that need them are not drawn above." if missing else ""))
    return lines + [""]


# -- report ---------------------------------------------------------------------------------------------
def write_report(results: dict[str, dict], picks: dict[str, dict], arms: list, settings: dict, out: Path,
                 command: str, run_info: dict[str, Any]) -> None:
    """Write ``out`` (markdown) and its plots into ``out`` without suffix / (``<name>/*.png``)."""
    summary = summarise(results, picks, arms, settings)
    plots = out.with_suffix("")
    plots.mkdir(parents=True, exist_ok=True)
    rel = plots.name
    compute = sum(r.get("train_seconds", 0) + r.get("eval_seconds", 0) for r in results.values())
    import torch

    s = summary
    e0 = s["srvit-R1-last"]
    lines = [
        "# Recurrence study (CIFAR-10 at CPU scale)", "",
        f"Produced by `{command}` ({time.strftime('%Y-%m-%d')}, torch {torch.__version__}, {run_info['jobs']} "
        f"trainings side by side on {run_info['threads']} thread(s) each). {len(results)} runs, "
        f"{compute / 3600:.2f} job-hours of training and evaluation in all, so about "
        f"{compute / run_info['jobs'] / 60:.0f} minutes of wall time with {run_info['jobs']} jobs side by side "
        "(per-run times as measured; a run that overlapped other work on the machine counts its slower time). "
        + (f"The last invocation took {run_info['wall_seconds'] / 60:.0f} minutes" if run_info["wall_seconds"] >= 60
           else "The last invocation trained nothing new")
        + " (finished runs are reused, so an interrupted study resumes).", "",
        "**Data and protocol.** The shared CIFAR-10 shards: 5,000 training images (500 per class, JPEG q75 copies "
        "of the originals) and all 10,000 test images"
        + (f" (an evenly spread, class-balanced {settings['eval_images']:,} of them here)"
           if settings["eval_images"] else "")
        + ". The papers' protocol (Training crossroads) is CIFAR-100: 100 classes and 50,000 training images. "
        "So this study has 10× fewer classes, 10× fewer training images, a much shorter budget, 8×8 patches "
        "(16 tokens + class token) and a half-width ViT-Ti (96 channels, 3 heads, 12 blocks for SR-ViT; one "
        "such block for bViT). The accuracies are not comparable to the papers'; the comparisons between arms are "
        "what the study measures.", "",
        f"**Recipe.** The `cifar10-*` presets (AdamW, batch 64, warm-up 0.5 epochs then cosine to 2%, weight decay "
        f"0.05, label smoothing 0.1, pad-crop + flip, EMA 0.99 evaluated), {settings['steps']} steps "
        f"(≈{e0['epochs']:.1f} epochs), seeds {', '.join(map(str, settings['seeds']))} (initialisation and data "
        "order). Tables give the mean ± sample s.d. over seeds.", "",
    ]
    lines += lr_table(results, picks, settings)
    lines += [f"![training loss](./{rel}/loss_curves.png)", ""]
    lines += ["## 1. SR-ViT: SoftMoR (token, query), uniform (mean), per-step (global) and plain recursion (last)",
              "", "`last` uses the lr of its own sweep at each depth (groups R2-last, R4-last); the fused arms use the "
              "lr picked for `query` at their depth.", "",
              "| arm | R | fusion_mode | params | block evals | top-1 (%) | top-5 (%) | final train loss | "
              "last-20% share | train s |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for a in arms:
        if a.section == "fusion":
            e = s[a.name]
            lines.append(f"| {a.name} | {a.horizon} | {a.model['fusion_mode']} | {e['parameters'] / 1e6:.3f}M | "
                         f"{a.block_evaluations} | {e['top1'].fmt()} | {e['top5'].fmt()} | {e['final_loss'].fmt(3)} | "
                         f"{100 * e['flattening'].mean:.1f}% | {e['train_seconds'].mean:.0f} |")
    lines += ["", f"![top-1 vs R](./{rel}/fusion.png) ![routers](./{rel}/routers.png)", ""]
    lines += router_table(s)
    lines += bvit_tables(s, arms)
    lines += [f"![deep supervision](./{rel}/supervision.png) ![solvers](./{rel}/solver.png) "
              f"![state norms](./{rel}/state_norms.png) ![top-1 after every step](./{rel}/per_step.png)", ""]
    lines += reading(summary, picks, settings, list(settings["lr_grid"]))
    lines += ["## Raw results", "",
              f"Every run's `result.json` (loss and entropy curves, state norms, router weights, accuracies), the lr "
              f"picks and the settings: [{rel}/results.json](./{rel}/results.json).", ""]
    if (plots / "study.log").is_file():  # kept beside the report when the study is committed
        lines += ["The console output of the invocations that trained these runs: "
                  f"[{rel}/study.log](./{rel}/study.log).", ""]
    out.write_text("\n".join(lines))
    (plots / "results.json").write_text(json.dumps({"settings": settings, "picks": picks, "run_info": run_info,
                                                    "runs": dict(sorted(results.items()))}, separators=(",", ":")))
    from study_recursion_plots import plot_all

    plot_all(summary, results, picks, settings, plots)


def lr_table(results: dict[str, dict], picks: dict[str, dict], settings: dict) -> list[str]:
    grid = sorted({float(lr) for pick in picks.values() for lr in pick["losses"]})
    lines = ["## Learning-rate sweep (seed 0; pick = lowest final training loss)", "",
             "| group | arm | " + " | ".join(f"lr {v:g}: loss / top-1" for v in grid) + " | pick |",
             "| --- | --- | " + " | ".join("---" for _ in grid) + " | --- |"]
    for group, pick in picks.items():
        cells = []
        for v in grid:
            r = results.get(f"{pick['arm']}-lr{v:g}-s{settings['seeds'][0]}")
            if r is None:
                cells.append("–")
            else:
                cells.append("diverged" if r["diverged"] else f"{r['final_train_loss']:.3f} / {100 * r['top1']:.2f}%")
        lines.append(f"| {group} | {pick['arm']} | " + " | ".join(cells) + f" | {pick['lr']:g} |")
    return lines + [""]


def router_table(s: dict[str, Any]) -> list[str]:
    lines = ["Mean SoftMoR weight per step (test images, all tokens; seed mean) and entropy (nats), per block:", "",
             "| block | " + " | ".join(f"{n} weights" for n in ("srvit-R4-token", "srvit-R4-query")) +
             " | entropy token / query |", "| --- | --- | --- | --- |"]
    tok, qry = s["srvit-R4-token"], s["srvit-R4-query"]
    if "router_weights" not in tok or "router_weights" not in qry:
        return []
    def cell(e: dict, j: int) -> str:
        return " ".join(f"{w.mean:.2f}" for w in e["router_weights"][j])

    for j in range(len(tok["router_weights"])):
        lines.append(f"| {j} | {cell(tok, j)} | {cell(qry, j)} | {tok['router_entropy'][j].mean:.2f} / "
                     f"{qry['router_entropy'][j].mean:.2f} |")
    return lines + [""]


def bvit_tables(s: dict[str, Any], arms: list) -> list[str]:
    lines = ["## 2–4. bViT: deep supervision, solvers and fields, depth; inside and beyond the training horizon",
             "",
             "Top-1 (%) when run for 1×, 1.5×, 2×, 3× and 4× the training steps T:", "",
             "| arm | solver | T | h | block evals | 1× | 1.5× | 2× | 3× | 4× | final train loss |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for a in arms:
        if s.get(a.name, {}).get("horizon_steps") and "by_steps" in s[a.name]:
            e = s[a.name]
            cells = " | ".join(e["by_steps"][k].fmt() if k in e["by_steps"] else "–" for k in e["horizon_steps"])
            name = a.name + (" (deep supervision every 3)" if a.extra else "")
            lines.append(f"| {name} | {a.model.get('solver', 'euler')} | {a.horizon} | "
                         f"{a.model.get('step_size', 1.0):g} | {a.block_evaluations} | {cells} | "
                         f"{e['final_loss'].fmt(3)} |")
    lines += in_horizon_table(s, arms)
    lines += swapped_table(s)
    lines += ["", "State norm (mean L2 norm of a token) after step t, on 256 class-balanced test images "
              "(t = 0: the embedding):", "",
              "| arm | " + " | ".join(f"t={t}" for t in SPARSE_STEPS) + " |",
              "| --- | " + " | ".join("---" for _ in SPARSE_STEPS) + " |"]
    for a in arms:
        if "state_norms" in s.get(a.name, {}):
            norms = s[a.name]["state_norms"]
            lines.append(f"| {a.name} | " + " | ".join(f"{norms[t].mean:.3g}" if t < len(norms) else "–"
                                                        for t in SPARSE_STEPS) + " |")
    return lines + [""]


def in_horizon_table(s: dict[str, Any], arms: list) -> list[str]:
    """Top-1 at every step ``1..T`` of each bViT arm evaluated there (seed mean ± s.d.)."""
    rows = [a for a in arms if a.preset.startswith("cifar10-bvit") and "by_steps" in s.get(a.name, {})
            and all(str(t) in s[a.name]["by_steps"] for t in range(1, a.horizon + 1))]
    if not rows:
        return []
    width = max(a.horizon for a in rows)
    lines = ["", "Top-1 (%) at every step inside the training horizon (the same trajectory, read out by the shared "
             "head after each step):", "", "| arm | T | " + " | ".join(f"t={t}" for t in range(1, width + 1)) + " |",
             "| --- | --- | " + " | ".join("---" for _ in range(width)) + " |"]
    for a in rows:
        steps = s[a.name]["by_steps"]
        cells = [steps[str(t)].fmt(1) if t <= a.horizon else "" for t in range(1, width + 1)]
        lines.append(f"| {a.name} | {a.horizon} | " + " | ".join(cells) + " |")
    return lines


def swapped_table(s: dict[str, Any]) -> list[str]:
    """Each Euler / Heun bViT with its own solver and with the other one at the same integration time."""
    rows = [(name, s[name]) for name in ("bvit-euler", "bvit-heun", "bvit-heun-T6h2") if "swapped" in s.get(name, {})]
    if not rows:
        return []
    lines = ["", "Swapped solvers: the trained weights run with the other solver at the same integration time "
             "T·h (`srvit eval --solver S --step-size H --steps N` does the same on any checkpoint):", "",
             "| trained arm | trained solver, h, T | top-1 own (%) | evaluated with | h | steps | block evals | "
             "top-1 (%) | swapped − own (paired by seed) |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, e in rows:
        trained = f"{e['model'].get('solver', 'euler')}, {e['model'].get('step_size', 1.0):g}, {e['horizon']}"
        for sw in e["swapped"]:
            lines.append(f"| {name} | {trained} | {e['top1'].fmt()} | {sw['solver']} | {sw['step_size']:g} | "
                         f"{sw['steps']} | {sw['block_evaluations']} | {sw['top1'].fmt()} | "
                         f"{compare(sw['top1'], e['top1']).text()} |")
    return lines
