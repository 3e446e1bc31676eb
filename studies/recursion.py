"""The recurrence study: SR-ViT and bViT on the shared CIFAR-10 shards at 3 seeds -> ``docs/study_recursion.md``.

Arms: SR-ViT R = 1, 2, 4 x SoftMoR ``fusion_mode`` (last = plain recursion, mean, global, token, query); bViT (T =
12) with / without deep supervision, through Euler, Heun at matched steps (T = 12) and block evaluations (T = 6,
h = 2) and the black-box field ``z' = F(z)``; bViT at T = 3 and 5. Phase ``lrcheck``: each depth group's sweep arm
at seed 0 over the lr grid, extended by halving / doubling while the pick (lowest final training loss) is at an
edge; ``main``: every arm and seed at its group's pick (fused arms at ``query``'s), plain recursion also at the
fused arms' lr. ``--option quick=true`` (with ``--docs-root`` elsewhere): 200 steps, 2,000 test images, one seed.
Nothing was pre-registered: every verdict is exploratory. One run: ``_recursion_runs.py``."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import _recursion_runs as runs

from looprun.statistics import Difference, paired_difference
from looprun.study import Arm, Budget, Metric, Phase, PlannedRun, Study
from looprun.study import page as std
from looprun.study.tables import md_table, mean_sd

LR_GRID, MAX_EXTENSIONS, SEEDS, STEPS = (5e-4, 1e-3, 2e-3), 2, (0, 1, 2), 600
FUSION_MODES = ("last", "mean", "global", "token", "query")
FLAT, NEAR_CHANCE, ROUTER_MARGIN, WITHIN = 0.10, 15.0, 0.05, 1.0  # the reading's thresholds (see their use)
Stat = dict[int, float]  # seed -> value
Summary = dict[str, dict[str, Any]]  # arm -> its seed statistics (summarise)
PROTOCOL = Path(__file__).resolve().parents[1] / "docs/study_recursion/protocol.md"  # the page quotes it


def _arm(name: str, section: str, group: str, model: dict[str, Any], extra: tuple[str, ...] = ()) -> Arm:
    preset = "cifar10-bvit-ti" if name.startswith("bvit") else "cifar10-srvit-ti"
    return Arm(name, settings={"section": section, "preset": preset, "group": group, "model": model,
                               "extra": list(extra)})


ARMS = [_arm("srvit-R1-last", "fusion", "R1", {"recursion": 1, "fusion_mode": "last"}),
        *[_arm(f"srvit-R{r}-{m}", "fusion", f"R{r}" + "-last" * (m == "last"), {"recursion": r, "fusion_mode": m})
          for r in (2, 4) for m in FUSION_MODES],
        _arm("bvit-euler", "supervision", "bvit", {}),
        _arm("bvit-euler-ds3", "supervision", "bvit", {}, ("deep_supervision_every=3",)),
        _arm("bvit-heun", "solver", "bvit", {"solver": "heun"}),
        _arm("bvit-heun-T6h2", "solver", "bvit", {"solver": "heun", "recursion": 6, "step_size": 2.0}),
        _arm("bvit-blackbox", "solver", "bvit", {"solver": "blackbox"}),
        _arm("bvit-T3", "depth", "bvit", {"recursion": 3}), _arm("bvit-T5", "depth", "bvit", {"recursion": 5})]
SETTINGS = {a.name: a.settings for a in ARMS}
SWEEP_ARMS = {"R1": "srvit-R1-last", "R2": "srvit-R2-query", "R2-last": "srvit-R2-last", "R4": "srvit-R4-query",
              "R4-last": "srvit-R4-last", "bvit": "bvit-euler"}  # the arm whose seed 0 picks each group's lr


# -- planning ------------------------------------------------------------------------------------------------
def run_id(arm: str, lr: float, seed: int) -> str:
    return f"{arm}-lr{lr:g}-s{seed}"


def planned(arm: str, lr: float, seed: int, phase: str, steps: int) -> PlannedRun:
    """A run; its group (the engine's budget) is its lr."""
    return PlannedRun(run_id(arm, lr, seed), phase, arm, f"lr{lr:g}", seed, {**SETTINGS[arm], "lr": lr, "steps": steps})


def pick_lr(results: list[dict[str, Any]]) -> dict[str, Any]:
    """A sweep's pick: the lr of lowest final training loss (a diverged run never wins)."""
    finite, grid = [r for r in results if not r["diverged"]], sorted(r["lr"] for r in results)
    if not finite:
        raise RuntimeError(f"every lr of the sweep diverged for {results[0]['arm']}: {grid}")
    best = min(finite, key=lambda r: r["final_train_loss"])["lr"]
    return {"lr": best, "arm": results[0]["arm"], "edge": len(grid) > 1 and best in (grid[0], grid[-1]),
            "losses": {str(r["lr"]): None if r["diverged"] else r["final_train_loss"] for r in results},
            "top1": {str(r["lr"]): r.get("top1") for r in results}, "tried": grid}


def next_lr(pick: Mapping[str, Any], tried: list[float], grid: tuple[float, ...]) -> float | None:
    """Half the smallest / twice the largest lr tried when the pick is at that edge, at most MAX_EXTENSIONS times."""
    if not pick["edge"] or len(tried) - len(grid) >= MAX_EXTENSIONS:
        return None
    return min(tried) / 2 if pick["lr"] == min(tried) else max(tried) * 2


def sweeps(records: Mapping[str, dict], seed: int) -> dict[str, tuple[list[float], dict | None]]:
    """Per group: the lrs its sweep needs so far and its pick (``None`` until decided)."""
    out = {}
    for group, arm in SWEEP_ARMS.items():
        tried, pick = list(LR_GRID), None
        while all(records.get(run_id(arm, lr, seed), {}).get("status") == "finished" for lr in tried):
            pick = pick_lr([records[run_id(arm, lr, seed)] for lr in tried])
            if (extra := next_lr(pick, tried, LR_GRID)) is None:
                break
            tried, pick = [*tried, extra], None
        out[group] = (tried, pick)
    return out


def picks_of(records: Mapping[str, dict], seed: int) -> dict[str, dict]:
    return {group: pick for group, (_, pick) in sweeps(records, seed).items() if pick is not None}


def plan_sweep(study: Study, records: Mapping[str, dict]) -> list[PlannedRun]:
    b = study.budgets[0]
    out = [planned(SWEEP_ARMS[g], lr, b.seeds[0], "lrcheck", b.steps or 0)
           for g, (tried, _) in sweeps(records, b.seeds[0]).items() for lr in tried]
    return sorted(out, key=lambda p: -runs.block_evaluations(p.settings))  # the longest first: the pool packs better


def plan_main(study: Study, records: Mapping[str, dict]) -> list[PlannedRun]:
    """Every arm x seed at its group's pick; plain recursion also at its fused arms' lr when its own pick differs
    (how much of a fused - plain difference is the lr). After a quick sweep: one seed."""
    b, out = study.budgets[0], []
    picks = picks_of(records, b.seeds[0])
    for group, pick in picks.items():
        seeds = b.seeds[:1] if records[run_id(pick["arm"], pick["lr"], b.seeds[0])].get("quick") else b.seeds
        other = picks.get(group.removesuffix("-last"), pick)["lr"]
        lrs = [(a, pick["lr"]) for a, s in SETTINGS.items() if s["group"] == group]
        lrs += [(pick["arm"], other)] * (other != pick["lr"])
        out += [planned(a, lr, seed, "main", b.steps or 0) for a, lr in lrs for seed in seeds]
    done = {p.id for p in plan_sweep(study, records)}
    return sorted((p for p in out if p.id not in done), key=lambda p: -runs.block_evaluations(p.settings))


# -- seed statistics: every comparison is paired by seed -----------------------------------------------------
def mean(x: Stat) -> float:
    return statistics.fmean(x.values())


def sd(x: Stat) -> float:
    return statistics.stdev(x.values()) if len(x) > 1 else 0.0


def fmt(x: Stat, digits: int = 2) -> str:
    return mean_sd(list(x.values()), digits)


def compare(a: Stat, b: Stat) -> Difference:
    """``a - b`` over the seeds both have: the mean per-seed difference, its 95% t-interval and a verdict."""
    if not (shared := sorted(set(a) & set(b))):
        raise ValueError("the two arms share no seed: nothing to pair")
    return paired_difference([a[s] for s in shared], [b[s] for s in shared])


def text(d: Difference, unit: str = " points", words: tuple[str, str] = ("better", "worse")) -> str:
    """``words``: what ``a - b > 0`` and ``< 0`` mean (``("higher", "lower")`` for a loss)."""
    if d.low is None:
        why = "one seed pair" if d.n < 2 else "zero spread between seeds, degenerate"
        return f"{d.mean:+.2f}{unit} ({why}, no interval: inconclusive)"
    word = {"better": words[0], "worse": words[1]}.get(d.verdict, d.verdict)
    return f"{d.mean:+.2f}{unit} [{d.low:+.2f}, {d.high:+.2f}] (paired by seed, 95% t, n = {d.n}; {d.wins}/{d.n} " \
           f"higher: {word})"


def vs(a: Stat, b: Stat, **kw: Any) -> str:
    return text(compare(a, b), **kw)


def order(stats: list[Stat]) -> str:
    """``rises`` / ``falls``: monotone means whose ends differ; ``mixed``: the ends differ, the means are not
    monotone; ``flat``: the ends are inconclusive (not the same as equal)."""
    means, ends = [mean(s) for s in stats], compare(stats[-1], stats[0]).verdict
    if ends == "inconclusive":
        return "flat"
    monotone = all((b >= a) if ends == "better" else (b <= a) for a, b in zip(means, means[1:]))
    return ("rises" if ends == "better" else "falls") if monotone else "mixed"


def flattening(curve: list[list[float]], steps: int) -> float:
    """Share of a loss curve's total decrease made in its last 20% of steps (window means; a short run: the point
    nearest each window's end)."""
    def window(lo: float, hi: float) -> float:
        values = [loss for step, loss in curve if lo * steps < step <= hi * steps]
        return statistics.fmean(values or [min(curve, key=lambda p: abs(p[0] - hi * steps))[1]])

    return (window(0.7, 0.8) - window(0.9, 1.0)) / max(curve[0][1] - window(0.9, 1.0), 1e-9)


def mean_curve(curves: list[list[list[float]]]) -> list[list[float]]:
    return [[points[0][0], sum(p[1] for p in points) / len(points)] for points in zip(*curves)]


def summarise(records: Mapping[str, dict], picks: Mapping[str, dict], seeds: tuple[int, ...]) -> Summary:
    """Per arm at its group's pick: every reported quantity as a :data:`Stat` over the seeds (top-1 in %)."""
    out: Summary = {}
    for arm, s in SETTINGS.items():
        lr, shared = picks[s["group"]]["lr"], picks.get(s["group"].removesuffix("-last"), {}).get("lr")
        good = [r for seed in seeds if (r := records.get(run_id(arm, lr, seed))) and r.get("diverged") is False]
        st = lambda f, rs=good: {int(r["seed"]): f(r) for r in rs}
        e = out[arm] = {"s": s, "lr": lr, "seeds": len(good), "horizon": runs.horizon(s),
                        "block_evaluations": runs.block_evaluations(s)}
        if not good:
            continue
        e.update(parameters=good[0]["parameters"], epochs=good[0]["epochs"], top1=st(lambda r: 100 * r["top1"]),
                 top5=st(lambda r: 100 * r["top5"]), final_loss=st(lambda r: r["final_train_loss"]),
                 flattening=st(lambda r: flattening(r["loss_curve"], r["steps"])),
                 train_seconds=st(lambda r: r["train_seconds"]), loss_curve=mean_curve([r["loss_curve"] for r in good]),
                 by_steps={k: st(lambda r, k=k: 100 * r["by_steps"][k])  # the depths every seed was evaluated at
                           for k in sorted(set.intersection(*(set(r["by_steps"]) for r in good)), key=int)},
                 horizon_steps=[str(k) for k in runs.horizon_steps(s)])
        if all("swapped" in r for r in good):
            e["swapped"] = [{**sw, "top1": st(lambda r, i=i: 100 * r["swapped"][i]["top1"])}
                            for i, sw in enumerate(good[0]["swapped"])]
        other = [r for seed in seeds if (r := records.get(run_id(arm, shared or 0, seed))) and not r["diverged"]]
        if shared != lr and other:  # plain recursion at the lr of its depth's fused arms
            e.update(top1_at_shared_lr=st(lambda r: 100 * r["top1"], other), shared_lr=shared)
        for key in ("state_norms", "direction_change", "router_entropy"):
            if key in good[0]:
                e[key] = [st(lambda r, i=i, key=key: r[key][i]) for i in range(len(good[0][key]))]
        if "router_weights" in good[0]:
            e["router_weights"] = [[st(lambda r, i=i, j=j: r["router_weights"][j][i]) for i in range(len(block))]
                                   for j, block in enumerate(good[0]["router_weights"])]
    return out


# -- the reading: every sentence is decided by the numbers ---------------------------------------------------
def coin_toss(pick: Mapping[str, Any], noise: Stat | None) -> tuple[float, float, float] | None:
    """``(runner-up lr, its loss gap, the seed s.d.)`` when the runner-up is behind the pick by less than the seed
    s.d. of the arm's final loss (the pick is a coin toss between the two); else None."""
    finite = sorted((v, float(lr)) for lr, v in pick["losses"].items() if v is not None)
    if len(finite) > 1 and noise and len(noise) > 1 and finite[1][0] - finite[0][0] < sd(noise):
        return finite[1][1], finite[1][0] - finite[0][0], sd(noise)
    return None


def lr_reading(s: Summary, picks: Mapping[str, dict], steps: int) -> list[str]:
    n, lrs = min(e["seeds"] for e in s.values() if e["seeds"]), []
    for group, p in picks.items():
        toss = coin_toss(p, s[p["arm"]].get("final_loss"))
        lrs.append(f"{group} ({p['arm']}) {p['lr']:g} [" + ", ".join(
            f"{float(lr):g}: " + ("diverged" if v is None else f"{v:.3f}")
            for lr, v in sorted(p["losses"].items(), key=lambda kv: float(kv[0]))) + "]"
            + " — still at the edge after extending the grid, so a better lr may lie outside it" * p["edge"]
            + (f" — the runner-up {toss[0]:g} is only {toss[1]:.3f} behind, less than the seed s.d. of this arm's "
               f"final loss ({toss[2]:.3f}): a coin toss between the two" if toss else ""))
    flat = {a: mean(s[a]["flattening"]) for a in ("srvit-R1-last", "srvit-R4-query", "bvit-euler") if "top1" in s[a]}
    still = [a for a, v in flat.items() if v >= FLAT]
    return [f"- **Statistics.** {n} seed(s) per arm, shared by every arm (the same initialisation seed and data "
            "order), so every comparison is paired by seed: the mean of the per-seed differences with a 95% "
            f"t-interval (df = {n - 1}) and a verdict, better / worse when the interval excludes 0, else inconclusive. "
            f"Inconclusive means the data cannot tell, not that the arms are equal; with {n} seeds only consistent "
            "differences several times the seed-to-seed wobble are resolved. No comparison was written down before "
            "the runs and none is corrected for multiplicity over the page's dozens of comparisons: every verdict "
            "here is exploratory.",
            "- **Learning rates.** Picked per depth group by the lowest final training loss of seed 0 over the grid "
            f"{{{', '.join(f'{v:g}' for v in LR_GRID)}}}, extended by halving / doubling while the best lr was the "
            "smallest / largest tried: " + "; ".join(lrs) + ".",
            f"- **Budget.** {steps} steps (≈{s['srvit-R1-last']['epochs']:.1f} epochs). Share of the training loss's "
            f"total decrease made in the last 20% of steps (flattened below {100 * FLAT:.0f}%): "
            + ", ".join(f"{a} {100 * v:.1f}%" for a, v in flat.items()) + "; " + (
                f"still falling by that rule: {', '.join(still)}, so the budget under-trains them" if still else
                "all have flattened by that rule") + ". The cosine schedule ends at 2% of the peak lr, which "
            "flattens every curve's tail by itself; compare the final losses across depths below."]


def srvit_reading(s: Summary, picks: Mapping[str, dict]) -> list[str]:
    loss = [s[a]["final_loss"] for a in ("srvit-R1-last", "srvit-R2-query", "srvit-R4-query")]
    r1, top = s["srvit-R1-last"]["top1"], []
    modes = [m for m in ("query", "token", "global", "mean", "last") if all("top1" in s[f"srvit-R{r}-{m}"]
                                                                            for r in (2, 4))]
    for m in modes:
        two, four = s[f"srvit-R2-{m}"], s[f"srvit-R4-{m}"]
        toss = coin_toss(picks[four["s"]["group"]], four["final_loss"])
        top.append(f"`{m}` {fmt(two['top1'])} / {fmt(four['top1'])} at R=2/4: " + {
            "rises": "rises with R", "falls": "falls with R", "mixed": "not monotone in R",
            "flat": "R=4 − R=1 inconclusive"}[order([r1, two["top1"], four["top1"]])]
            + f" (R=4 − R=1 {vs(four['top1'], r1)})" + (f" at its own lr {four['lr']:g}" + (
                f", an lr picked over {toss[0]:g} on a {toss[1]:.3f} loss gap, less than the seed s.d. "
                f"({toss[2]:.3f}): a coin toss" if toss else "") + f"; at {four['shared_lr']:g}, R=4 − R=1 is "
                f"{vs(four['top1_at_shared_lr'], r1)}" if "top1_at_shared_lr" in four else ""))
    fused, last = [m for m in modes if m != "last"], {r: s[f"srvit-R{r}-last"] for r in (2, 4)}
    shifted = [f"R={r}: at its own lr − at query's lr {vs(e['top1'], e['top1_at_shared_lr'])}; against `last` at "
               f"query's lr ({e['shared_lr']:g}) instead: " + ", ".join(
                   f"{m} − last {vs(s[f'srvit-R{r}-{m}']['top1'], e['top1_at_shared_lr'])}" for m in fused)
               for r, e in last.items() if "top1_at_shared_lr" in e]
    return [f"- **Training loss vs R** (query fusion; R=1 {fmt(loss[0], 3)}, R=2 {fmt(loss[1], 3)}, R=4 "
            f"{fmt(loss[2], 3)}): " + {
                "rises": "it rises with R (R=4 − R=1 paired: higher): the deeper unrolled nets fit the training set "
                         "worse in this budget.",
                "falls": "it falls with R (R=4 − R=1 paired: lower): the deeper unrolled nets fit the training set "
                         "better.",
                "mixed": "R=4 differs from R=1 (paired) but not monotonically.",
                "flat": "R=4 − R=1 is inconclusive (paired by seed)."}[order(loss)]
            + f" R=4 − R=1: {vs(loss[2], loss[0], unit='', words=('higher', 'lower'))}.",
            f"- **Top-1 vs R** (R=1 {fmt(r1)}%): " + "; ".join(top) + ". The paper reports SR-ViT-S rising 79.83 → "
            "82.48 on ImageNet-1K for R = 1 → 4.",
            "- **Plain recursion at its own lr.** `last` has its own sweep per depth: " + ", ".join(
                f"R={r} {picks[f'R{r}-last']['lr']:g} (query's: {picks[f'R{r}']['lr']:g})" for r in (2, 4)) + ". "
            + ("; ".join(shifted) + "." if shifted else "The sweep picked the same lr as `query`'s, so the earlier "
               "comparison stands.") + " Every comparison with `last` below uses its own pick.",
            "- **Fused vs plain recursion** (same R and budget; fused arms at `query`'s lr). " + "; ".join(
                f"R={r}: " + ", ".join(f"{m} − last {vs(s[f'srvit-R{r}-{m}']['top1'], e['top1'])}" for m in fused)
                for r, e in last.items()) + ".", *routing(s, fused)]


def routing(s: Summary, fused: list[str]) -> list[str]:
    """Routing vs averaging the steps (``mean``, ``global``), and what the trained routers favour."""
    out, credited = [], None
    if "mean" in fused:
        diffs = [(f"R={r} {m} − mean", f"{m} at R={r}", compare(s[f"srvit-R{r}-{m}"]["top1"],
                                                              s[f"srvit-R{r}-mean"]["top1"]))
                 for r in (2, 4) for m in ("token", "query", "global") if m in fused]
        credited = [who for _, who, d in diffs if d.verdict == "better"]
        wide = [(d.high - d.low, f"{name} [{d.low:+.2f}, {d.high:+.2f}]") for name, _, d in diffs
                if d.verdict == "inconclusive" and d.low is not None and d.high > d.low]
        out.append("- **Routing vs averaging the steps** (`mean`: equal weights, no parameters; `global`: one learned "
                   "weight per step, shared by all tokens): " + "; ".join(f"{name} {text(d)}" for name, _, d in diffs)
                   + ". " + (f"A learned router beats plain averaging for {', '.join(credited)}." if credited else
                             "No router is shown to beat `mean` fusion" + (
                                 f"; the intervals are too wide to call them equal (the widest, {max(wide)[1]}): "
                                 "inconclusive, not a match" if wide else "") + ". So what the fused arms gain over "
                             "`last` cannot be credited to (token-wise) routing at this budget, nor shown to come from "
                             "averaging alone."))
    found = []
    for name in ("srvit-R4-query", "srvit-R4-token", "srvit-R2-query", "srvit-R2-token"):
        if "router_weights" not in (e := s[name]):
            continue
        r, weights = len(e["router_weights"][0]), [[mean(w) for w in block] for block in e["router_weights"]]
        favoured = [max(range(r), key=b.__getitem__) + 1 for b in weights]
        top = max(set(favoured), key=favoured.count)
        share = sum(max(b) for b, f in zip(weights, favoured) if f == top) / favoured.count(top)
        ent = f"entropy {statistics.fmean(map(mean, e['router_entropy'])):.2f} of ln {r} = {math.log(r):.2f} nats"
        found.append((name, f"{name}: near uniform (the heaviest step's mean weight is below {1 / r:.2f} + "
                      f"{ROUTER_MARGIN:.2f} in the blocks; {ent})") if share < 1 / r + ROUTER_MARGIN else
                     ("", f"{name}: step {top} is the heaviest in {favoured.count(top)} of {len(favoured)} blocks "
                      f"(mean weight there {share:.2f}, uniform = {1 / r:.2f}); {ent}"))
    uniform = [name for name, _ in found if name]
    return out + ["- **What the trained routers favour** (test images, all tokens): " + "; ".join(t for _, t in found)
                  + "." + (f" Near-uniform routers ({', '.join(uniform)}) weigh every step about equally: their "
                           "weights are close to `mean` fusion's (whether they also score like `mean` is the previous "
                           "item's question), so a gain of these arms over `last` cannot be credited to token-wise "
                           "routing " + (
                               "unless a `mean` (and `global`) arm at the same budget is run beside them."
                               if credited is None else "unless they beat the `mean` arm (previous item).")
                           if uniform else "")] * bool(found)


def bvit_reading(s: Summary, steps: int) -> list[str]:
    e, deep = s["bvit-euler"], s["bvit-euler-ds3"]["by_steps"]
    plain, at, far, euler = e["by_steps"], str(e["horizon"]), e["horizon_steps"][-1], e["top1"]
    drops = [{k: v[at][k] - v[far][k] for k in v[at]} for v in (plain, deep)]
    graceful, cost = compare(*drops), compare(euler, s["bvit-blackbox"]["top1"])
    swaps = [(a, compare(sw["top1"], s[a]["top1"]), sw) for a in ("bvit-euler", "bvit-heun", "bvit-heun-T6h2")
             for sw in s[a].get("swapped", [])]
    verdicts = {a: [d.verdict for b, d, _ in swaps if b == a] for a, *_ in swaps}
    out = [f"- **Deep supervision** (bViT, T={at}). At the horizon: {vs(deep[at], plain[at])} (the paper: no nominal "
           f"gain). Run to {far} steps the plain bViT loses {fmt(drops[0])} points and the supervised one "
           f"{fmt(drops[1])} (plain's drop − supervised's drop {text(graceful, words=('larger', 'smaller'))}): " + {
               "better": "graceful degradation appears (the supervised one loses less).",
               "inconclusive": "inconclusive whether supervision changes the degradation.",
               "worse": "the supervised one degrades more."}[graceful.verdict] + " The paper's collapse to near "
           f"chance without supervision {'appears' if mean(plain[far]) < NEAR_CHANCE else 'does not appear'} "
           f"({fmt(plain[far])}% at {far} steps).",
           "- **Euler vs Heun.** At matched steps (T=12, h=1; Heun uses 2× the block evaluations) Heun − Euler "
           f"{vs(s['bvit-heun']['top1'], euler)}; at matched block evaluations and integration time (Heun T=6, h=2) "
           f"{vs(s['bvit-heun-T6h2']['top1'], euler)}."]
    out += ["- **Swapped solvers** (trained weights, the other solver at the same integration time T·h = 12): "
            + "; ".join(f"{a} with {sw['solver']} (h={sw['step_size']:g}, {sw['steps']} steps, "
                        f"{sw['block_evaluations']} evaluations) − with its own {text(d)}" for a, d, sw in swaps)
            + ". Per trained arm: " + "; ".join(
                f"{a}: {v.count('worse')} of {len(v)} worse, {v.count('better')} better (" + (
                    "tied to the discretisation it was trained with" if v.count("worse") == len(v) else
                    "no swap is worse; inconclusive is not equal" if "worse" not in v else "partly tied") + ")"
                for a, v in verdicts.items()) + ". A solver swap that costs accuracy means the weights fit their "
            "discretisation rather than a field that any accurate solver integrates to the same answer."] * bool(swaps)
    inside = {}
    for a in ("bvit-euler", "bvit-euler-ds3", "bvit-blackbox"):
        if "top1" in s[a] and all(str(t) in s[a]["by_steps"] for t in range(1, s[a]["horizon"] + 1)):
            curve = [mean(s[a]["by_steps"][str(t)]) for t in range(1, s[a]["horizon"] + 1)]
            reach = next(t for t in range(1, len(curve) + 1) if min(curve[t - 1:]) >= curve[-1] - WITHIN)
            peak = max(range(len(curve)), key=curve.__getitem__)
            inside[a] = (f"{a} {curve[0]:.1f}% at step 1 → {curve[-1]:.1f}% at step {len(curve)} (" + (
                "rising at every step" if all(y >= x for x, y in zip(curve, curve[1:])) else "not monotone") + (
                f", peak {curve[peak]:.1f}% at step {peak + 1}" if peak < len(curve) - 1 else "")
                + f"), within {WITHIN:g} point of it from step {reach} on")
    if inside:
        mid = str(e["horizon"] // 2)
        d = compare(deep[mid], plain[mid]) if {"bvit-euler", "bvit-euler-ds3"} <= set(inside) else None
        out.append("- **Inside the horizon** (top-1 at every step 1..T, seed means): " + "; ".join(inside.values()) + (
            f". At step {mid}, half the horizon, deep supervision − plain {text(d)}" + (
                ": the supervised states are usable early (any-time prediction)." if d.verdict == "better" else ".")
            if d else ""))
    if all("top1" in s[a] for a in ("bvit-T3", "bvit-T5")):
        stats, hs = [s[a]["top1"] for a in ("bvit-T3", "bvit-T5", "bvit-euler")], (3, 5, e["horizon"])
        out.append(f"- **Depth at this budget** (bViT, Euler h=1, T = {', '.join(map(str, hs))} block evaluations; "
                   f"top-1 {' / '.join(map(fmt, stats))}): " + "; ".join(
                       f"T={h} − T=3 {vs(st, stats[0])}" for h, st in zip(hs[1:], stats[1:])) + ". " + {
                       "rises": "Accuracy rises with T: depth pays at this budget.",
                       "falls": "Accuracy falls with T: more steps of the shared block hurt at this budget.",
                       "mixed": "Not monotone in T.", "flat": f"T={hs[-1]} − T=3 is inconclusive: this budget "
                       "cannot show that depth matters, so depth trends of the papers cannot be tested with it."}[
                       order(stats)])
    norms, turns = ([mean(x) for x in s["bvit-blackbox"][k]] for k in ("state_norms", "direction_change"))
    growth = [(v[12] / v[1]) ** (1 / 11) for v in (norms, [mean(x) for x in e["state_norms"]])]
    stop = next((t + 1 for t in range(12) if max(turns[t:12]) < 0.01), 12)  # from here on each step turns < 1%
    return out + [f"- **Black-box field.** Euler − black-box {text(cost)}" + {
        "better": ": the paper's few-point cost of `z' = F(z)` appears.",
        "inconclusive": ": inconclusive whether the paper's few-point cost of `z' = F(z)` is there.",
        "worse": ": black-box is better here, unlike the paper."}[cost.verdict] + " Its state norm grows "
        f"×{growth[0]:.2f} per step over the 12 training steps (Euler: ×{growth[1]:.2f}), from {norms[1]:.3g} to "
        f"{norms[12]:.3g}; " + (
            f"from step {stop} on, each step turns the normalised state by < 1% (the final LayerNorm sees only the "
            "direction), so the later steps barely act and the arm is effectively shallower." if stop < 12 else
            "every training step still turns the normalised state by ≥ 1%."), *budget_reading(s, steps)]


def budget_reading(s: Summary, steps: int) -> list[str]:
    """Matched FLOPs (12 ViT blocks and bViT's one block applied 12 times), and what the budget can test."""
    vit, bvit, r1 = s["srvit-R1-last"], s["bvit-euler"], s["srvit-R1-last"]["top1"]
    d = compare(vit["top1"], bvit["top1"])
    missing = [label for label, present in (("`mean` / `global` fusion", "top1" in s["srvit-R4-mean"]),
                                            ("bViT at other T", "top1" in s["bvit-T3"]),
                                            ("the trained Euler and Heun bViTs evaluated with the other solver",
                                             "swapped" in bvit)) if not present]
    return [f"- **Matched FLOPs** ({vit['block_evaluations']} block evaluations each): the 12-block ViT − bViT (Euler, "
            f"T=12) {text(d)}; the ViT stores {vit['parameters'] / bvit['parameters']:.1f}× the parameters. " + {
                "better": "Standard ViTs win at matched FLOPs, as Training Crossroads finds.",
                "worse": "bViT wins at matched FLOPs here, unlike Training Crossroads.",
                "inconclusive": "Inconclusive at matched FLOPs."}[d.verdict],
            f"- **What this budget can and cannot test.** At top-1 ≈ {mean(r1):.0f}% (R=1) after {steps} steps "
            f"(≈{vit['epochs']:.0f} epochs of 5,000 images), the study compares arms early in training: it can test "
            f"which arm learns faster at equal steps (R=4 query − R=1 {vs(s['srvit-R4-query']['top1'], r1)}) and what "
            "the trained weights do inside (routers, state norms, solvers), not the papers' converged ImageNet-1K / "
            "CIFAR-100 accuracies, nor whether recursion's gains there appear only after hundreds of epochs."
            + (f" Not run here: {', '.join(missing)}; conclusions that need them are not drawn above." if missing
               else "")]


def reading(s: Summary, picks: Mapping[str, dict], steps: int) -> list[str]:
    return ["## Reading (computed from the tables above; chance is 10%)", "", *lr_reading(s, picks, steps),
            *srvit_reading(s, picks), *bvit_reading(s, steps), ""]


# -- the page ------------------------------------------------------------------------------------------------
def tables(s: Summary, picks: Mapping[str, dict], records: Mapping[str, dict], seed: int, rel: str) -> list[str]:
    lrs = sorted({float(lr) for p in picks.values() for lr in p["losses"]})
    bvit = {a: e for a, e in s.items() if runs.is_bvit(e["s"]) and "top1" in e}
    inside = {a: e for a, e in bvit.items() if all(str(t) in e["by_steps"] for t in range(1, e["horizon"] + 1))}
    width, tok, qry = max([e["horizon"] for e in inside.values()] or [0]), s["srvit-R4-token"], s["srvit-R4-query"]
    routed = "router_weights" in tok and "router_weights" in qry
    solver, h = (lambda e: e["s"]["model"].get("solver", "euler")), lambda e: f"{e['s']['model'].get('step_size', 1):g}"
    cell = lambda r: "–" if r is None else "diverged" if r["diverged"] else \
        f"{r['final_train_loss']:.3f} / {100 * r['top1']:.2f}%"
    swapped = [[a, f"{solver(e)}, {h(e)}, {e['horizon']}", fmt(e["top1"]), sw["solver"], f"{sw['step_size']:g}",
                sw["steps"], sw["block_evaluations"], fmt(sw["top1"]), vs(sw["top1"], e["top1"])]
               for a, e in bvit.items() for sw in e.get("swapped", [])]
    return [
        "## Learning-rate sweep (seed 0; pick = lowest final training loss)", "", *md_table(
            ["group", "arm", *[f"lr {v:g}: loss / top-1" for v in lrs], "pick"],
            [[g, p["arm"], *[cell(records.get(run_id(p["arm"], v, seed))) for v in lrs], f"{p['lr']:g}"]
             for g, p in picks.items()]), "", f"![training loss](./{rel}/loss_curves.png)", "",
        "## 1. SR-ViT: SoftMoR (token, query), uniform (mean), per-step (global) and plain recursion (last)", "",
        "`last` uses the lr of its own sweep at each depth (groups R2-last, R4-last); the fused arms use the lr "
        "picked for `query` at their depth.", "", *md_table(
            ["arm", "R", "fusion_mode", "params", "block evals", "top-1 (%)", "top-5 (%)", "final train loss",
             "last-20% share", "train s"],
            [[a, e["horizon"], e["s"]["model"]["fusion_mode"], f"{e['parameters'] / 1e6:.3f}M", e["block_evaluations"],
              fmt(e["top1"]), fmt(e["top5"]), fmt(e["final_loss"], 3), f"{100 * mean(e['flattening']):.1f}%",
              f"{mean(e['train_seconds']):.0f}"] for a, e in s.items() if e["s"]["section"] == "fusion"]), "",
        *(["Mean SoftMoR weight per step (test images, all tokens; seed mean) and entropy (nats), per block:", "",
           *md_table(["block", "srvit-R4-token weights", "srvit-R4-query weights", "entropy token / query"],
                     [[j, *[" ".join(f"{mean(w):.2f}" for w in e["router_weights"][j]) for e in (tok, qry)],
                       f"{mean(tok['router_entropy'][j]):.2f} / {mean(qry['router_entropy'][j]):.2f}"]
                      for j in range(len(qry["router_weights"]) if routed else 0)]), ""] * routed),
        "## 2–4. bViT: deep supervision, solvers and fields, depth; inside and beyond the training horizon", "",
        "Top-1 (%) when run for 1×, 1.5×, 2×, 3× and 4× the training steps T:", "", *md_table(
            ["arm", "solver", "T", "h", "block evals", "1×", "1.5×", "2×", "3×", "4×", "final train loss"],
            [[a + " (deep supervision every 3)" * bool(e["s"]["extra"]), solver(e), e["horizon"], h(e),
              e["block_evaluations"], *[fmt(e["by_steps"][k]) if k in e["by_steps"] else "–" for k in
                                        e["horizon_steps"]], fmt(e["final_loss"], 3)] for a, e in bvit.items()]), "",
        *(["Top-1 (%) at every step inside the training horizon (the same trajectory, read out by the shared head "
           "after each step):", "", *md_table(["arm", "T", *[f"t={t}" for t in range(1, width + 1)]], [
               [a, e["horizon"], *[fmt(e["by_steps"][str(t)], 1) if t <= e["horizon"] else "" for t in
                                   range(1, width + 1)]] for a, e in inside.items()]), ""] * bool(inside)),
        *(["Swapped solvers: the trained weights run with the other solver at the same integration time T·h (`srvit "
           "eval --solver S --step-size H --steps N` does the same on any checkpoint):", "", *md_table(
               ["trained arm", "trained solver, h, T", "top-1 own (%)", "evaluated with", "h", "steps", "block evals",
                "top-1 (%)", "swapped − own (paired by seed)"], swapped), ""] * bool(swapped)),
        f"State norm (mean L2 norm of a token) after step t, on {runs.PROBE_IMAGES} class-balanced test images (t = "
        "0: the embedding):", "", *md_table(["arm", *[f"t={t}" for t in (0, 1, 2, 3, 6, 12, 24, 48)]], [
            [a, *[f"{mean(e['state_norms'][t]):.3g}" if t < len(e["state_norms"]) else "–" for t in
                  (0, 1, 2, 3, 6, 12, 24, 48)]] for a, e in bvit.items() if "state_norms" in e]), "",
        f"![bViT: top-1 after every step; state norms](./{rel}/bvit.png)", ""]


def figures(folder: Path, s: Summary, picks: Mapping[str, dict], records: Mapping[str, dict], seed: int) -> None:
    """``loss_curves.png``: each sweep arm, seed mean at the pick (solid) and seed 0 at lower (dashed) / higher
    (dotted) lrs; ``bvit.png``: top-1 after every step (each T dotted) and state norms, run to 4x the horizon."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for i, p in enumerate(picks.values()):
        ax.plot(*zip(*s[p["arm"]]["loss_curve"]), color=f"C{i}", lw=1.8, label=f"{p['arm']} lr {p['lr']:g}")
        for lr in p["tried"]:
            if lr != p["lr"] and not (r := records[run_id(p["arm"], lr, seed)])["diverged"]:
                ax.plot(*zip(*r["loss_curve"]), color=f"C{i}", lw=0.8, ls="--" if lr < p["lr"] else ":", alpha=0.7)
    ax.set(xlabel="optimizer step", ylabel="training loss (label-smoothed CE)")
    fig2, (every, norm) = plt.subplots(1, 2, figsize=(11, 4), dpi=120)
    for i, (a, e) in enumerate((a, e) for a, e in s.items() if runs.is_bvit(e["s"]) and "by_steps" in e):
        keys = sorted(e["by_steps"], key=int)
        every.plot([int(k) for k in keys], [mean(e["by_steps"][k]) for k in keys], ".-", color=f"C{i}", label=a)
        every.axvline(e["horizon"], color=f"C{i}", ls=":", lw=0.8)
        norm.semilogy([mean(x) for x in e["state_norms"]], color=f"C{i}")
    every.set(xscale="log", xlabel="evaluation step", ylabel="top-1 (%), seed mean")
    norm.set(xlabel="step t", ylabel="mean token state norm")
    for f, axes, name in ((fig, [ax], "loss_curves.png"), (fig2, [every, norm], "bvit.png")):
        for a in axes:
            a.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        f.tight_layout()
        f.savefig(folder / name)
        plt.close(f)


def body(page: std.Page) -> list[str]:
    """Below the engine's header: the protocol, the tables, the figures, the reading, the raw results."""
    seeds, records, docs, rel = page.study.budgets[0].seeds, page.records, page.store.docs, Path(page.study.docs).name
    if len(picks := picks_of(records, seeds[0])) < len(SWEEP_ARMS) or page.missing:
        return ["Not read yet: the tables and the reading wait for every lr pick and every planned run.", ""]
    s, first = summarise(records, picks, seeds), records[run_id("srvit-R1-last", picks["R1"]["lr"], seeds[0])]
    steps, images = first["settings"]["steps"], first["settings"]["eval_images"]
    ran = ", ".join(map(str, sorted({r["seed"] for r in records.values()})))  # one seed after a quick sweep
    info = json.loads((docs / "settings.json").read_text())["run_info"] if (docs / "settings.json").is_file() else {}
    hours = sum(r.get("train_seconds", 0) + r.get("eval_seconds", 0) for r in records.values()) / 3600
    if page.draw:
        figures(docs, s, picks, records, seeds[0])
    return [PROTOCOL.read_text().strip(), "",
            f"**Budget.** {steps} steps (≈{s['srvit-R1-last']['epochs']:.1f} epochs), seeds "
            f"{ran}" + (f"; top-1 on an evenly spread, class-balanced {images:,} of the test images" if images
                        else "") + f". {len(records)} runs, {hours:.2f} "
            "job-hours of training and evaluation in all (per-run times as measured; a run that overlapped other work "
            "on the machine counts its slower time)" + (
                f", so about {hours * 60 / info['jobs']:.0f} minutes of wall time with {info['jobs']} trainings side "
                f"by side on {info['threads']} thread(s) each, as these runs were trained" if info else "") + ".", "",
            *tables(s, picks, records, seeds[0], rel), *reading(s, picks, steps), *std.divergence(page),
            "## Raw results", "", "One result file per run (loss and entropy curves, state norms, router weights, "
            f"accuracies): [{rel}/runs/](./{rel}/runs/), moved from the study's first layout as [{rel}/migration.json]"
            f"(./{rel}/migration.json) records; the lr picks and the per-run rows: [{rel}/results.json]"
            f"(./{rel}/results.json); the console output of the invocations that trained the runs: "
            f"[{rel}/study.log](./{rel}/study.log).", ""]


def row(record: dict[str, Any]) -> dict[str, Any] | None:
    """A finished run's row (its group: the arm at its lr); a diverged run has no metrics."""
    if record.get("status") != "finished":
        return None
    out = {"arm": record["arm"], "budget": record["budget"], "seed": record["seed"]}
    return {**out, "diverged": True} if record["diverged"] else {
        **out, "top1": 100 * record["top1"], "top5": 100 * record["top5"], "final_loss": record["final_train_loss"]}


STUDY = Study(
    name="recursion", title="Recurrence study (CIFAR-10 at CPU scale)", docs="docs/study_recursion",
    page="docs/study_recursion.md", arms=ARMS, budgets=[Budget(f"{STEPS} steps", SEEDS, steps=STEPS)],
    metric=Metric("top1", "%", label="top-1"), run=runs.run, row=row, preregistration=None,
    phases=[Phase("lrcheck", plan_sweep, registered=False), Phase("main", plan_main, registered=False)],
    sections=[std.header, body], prepare=lambda context: runs.data_dir(context.options),
    estimate=lambda p, o: (11.0 * runs.block_evaluations(p.settings) + 15) * float(
        o.get("steps", runs.QUICK["steps"] if o.get("quick") else p.settings["steps"])) / STEPS,
    extra_results=lambda page: {"picks": picks_of(page.records, page.study.budgets[0].seeds[0])})
