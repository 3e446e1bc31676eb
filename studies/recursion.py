"""The recurrence study: SR-ViT and bViT on the shared CIFAR-10 shards at 3 seeds -> ``docs/study_recursion.md``.

Arms: SR-ViT R = 1, 2, 4 x SoftMoR ``fusion_mode`` (last = plain recursion, mean, global, token, query); bViT (T =
12) with / without deep supervision, through Euler, Heun at matched steps (T = 12) and block evaluations (T = 6,
h = 2) and the black-box field ``z' = F(z)``; bViT at T = 3 and 5. Phase ``lrcheck``: each depth group's sweep arm
at seed 0 over the lr grid, extended by halving / doubling while the pick (lowest final training loss) is at an
edge; ``main``: every arm and seed at its group's pick (fused arms at ``query``'s), plain recursion also at the
fused arms' lr. ``--option quick=true`` (with ``--docs-root`` elsewhere): 200 steps, 2,000 test images, one seed.
Nothing was pre-registered: every verdict is exploratory. One run: ``_recursion_runs.py``."""

from __future__ import annotations

import functools
import json
import math
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import _recursion_runs as runs
from _text import paragraph

from looprun.statistics import Difference, paired_difference
from looprun.study import Arm, Budget, Metric, Phase, PlannedRun, Study
from looprun.study import page as std
from looprun.study.tables import md_table, mean_sd

LR_GRID, MAX_EXTENSIONS, SEEDS, STEPS = (5e-4, 1e-3, 2e-3), 2, (0, 1, 2), 600
FUSION_MODES = ("last", "mean", "global", "token", "query")
FLAT, NEAR_CHANCE, ROUTER_MARGIN, WITHIN = 0.10, 15.0, 0.05, 1.0  # the reading's thresholds (see their use)
Stat = dict[int, float]  # seed -> value
Summary = dict[str, dict[str, Any]]  # arm -> its seed statistics (summarise)
say = functools.partial(paragraph, Path(__file__).resolve().parents[1] / "docs/study_recursion/text.md")  # prose


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
                 train_seconds=st(lambda r: r["train_seconds"]), loss_curve=[  # the seed mean
                     [ps[0][0], sum(p[1] for p in ps) / len(ps)] for ps in zip(*(r["loss_curve"] for r in good))],
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


# -- the reading: every sentence is decided by the numbers (its prose: text.md) --------------------------------
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
        losses = ", ".join(f"{float(lr):g}: " + ("diverged" if v is None else f"{v:.3f}")
                           for lr, v in sorted(p["losses"].items(), key=lambda kv: float(kv[0])))
        lrs.append(f"{group} ({p['arm']}) {p['lr']:g} [{losses}]" + say("lr-edge") * p["edge"]
                   + (say("lr-toss", *toss) if toss else ""))
    flat = {a: mean(s[a]["flattening"]) for a in ("srvit-R1-last", "srvit-R4-query", "bvit-euler") if "top1" in s[a]}
    still = [a for a, v in flat.items() if v >= FLAT]
    return [say("statistics", n=n, df=n - 1),
            say("learning-rates", grid="{" + ", ".join(f"{v:g}" for v in LR_GRID) + "}", picks="; ".join(lrs)),
            say("flattening", steps=steps, epochs=s["srvit-R1-last"]["epochs"], flat=100 * FLAT,
                shares=", ".join(f"{a} {100 * v:.1f}%" for a, v in flat.items()),
                still=say("flattening-still", arms=", ".join(still)) if still else say("flattening-done"))]


def srvit_reading(s: Summary, picks: Mapping[str, dict]) -> list[str]:
    loss = [s[a]["final_loss"] for a in ("srvit-R1-last", "srvit-R2-query", "srvit-R4-query")]
    r1, top = s["srvit-R1-last"]["top1"], []
    modes = [m for m in ("query", "token", "global", "mean", "last")
             if all("top1" in s[f"srvit-R{r}-{m}"] for r in (2, 4))]
    for m in modes:
        two, four = s[f"srvit-R2-{m}"], s[f"srvit-R4-{m}"]
        toss = coin_toss(picks[four["s"]["group"]], four["final_loss"])
        own = say("top1-own-lr", lr=four["lr"], toss=say("top1-toss", *toss) if toss else "", shared=four["shared_lr"],
                  diff=vs(four["top1_at_shared_lr"], r1)) if "top1_at_shared_lr" in four else ""
        top.append(say("top1-mode", mode=m, r2=fmt(two["top1"]), r4=fmt(four["top1"]), own=own,
                       trend=say(f"top1-{order([r1, two['top1'], four['top1']])}"), diff=vs(four["top1"], r1)))
    fused, last = [m for m in modes if m != "last"], {r: s[f"srvit-R{r}-last"] for r in (2, 4)}
    minus = lambda r, m, b: f"{m} − last {vs(s[f'srvit-R{r}-{m}']['top1'], b)}"  # noqa: E731
    shifted = [say("plain-shifted", r=r, diff=vs(e["top1"], e["top1_at_shared_lr"]), lr=e["shared_lr"],
                   fused=", ".join(minus(r, m, e["top1_at_shared_lr"]) for m in fused))
               for r, e in last.items() if "top1_at_shared_lr" in e]
    lrs = ", ".join(f"R={r} {picks[f'R{r}-last']['lr']:g} (query's: {picks[f'R{r}']['lr']:g})" for r in (2, 4))
    return [say("loss-vs-r", r1=fmt(loss[0], 3), r2=fmt(loss[1], 3), r4=fmt(loss[2], 3),
                trend=say(f"loss-{order(loss)}"),
                diff=vs(loss[2], loss[0], unit="", words=("higher", "lower"))),
            say("top1-vs-r", r1=fmt(r1), modes="; ".join(top)),
            say("plain-own-lr", lrs=lrs, shifted="; ".join(shifted) + "." if shifted else say("plain-same-lr")),
            say("fused-vs-plain", diffs="; ".join(f"R={r}: " + ", ".join(minus(r, m, e["top1"]) for m in fused)
                                                  for r, e in last.items())), *routing(s, fused)]


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
        out.append(say("routing", diffs="; ".join(f"{name} {text(d)}" for name, _, d in diffs), verdict=say(
            "routing-credited", arms=", ".join(credited)) if credited else say(
            "routing-not-shown", wide=say("routing-wide", widest=max(wide)[1]) if wide else "")))
    found = []
    for name in ("srvit-R4-query", "srvit-R4-token", "srvit-R2-query", "srvit-R2-token"):
        if "router_weights" not in (e := s[name]):
            continue
        r, weights = len(e["router_weights"][0]), [[mean(w) for w in block] for block in e["router_weights"]]
        favoured = [max(range(r), key=b.__getitem__) + 1 for b in weights]
        top = max(set(favoured), key=favoured.count)
        share = sum(max(b) for b, f in zip(weights, favoured) if f == top) / favoured.count(top)
        ent = f"entropy {statistics.fmean(map(mean, e['router_entropy'])):.2f} of ln {r} = {math.log(r):.2f} nats"
        near = share < 1 / r + ROUTER_MARGIN  # near uniform
        found.append((name * near, say("router-uniform" if near else "router-step", arm=name, step=top, share=share,
                                       count=favoured.count(top), blocks=len(favoured), uniform=1 / r,
                                       margin=ROUTER_MARGIN, entropy=ent)))
    uniform = [name for name, _ in found if name]
    return out + [say("routers", arms="; ".join(t for _, t in found), uniform=say(
        "routers-uniform", arms=", ".join(uniform), unless=say(
            "routers-unless-run" if credited is None else "routers-unless-beat")) if uniform else "")] * bool(found)


def bvit_reading(s: Summary, steps: int) -> list[str]:
    e, deep = s["bvit-euler"], s["bvit-euler-ds3"]["by_steps"]
    plain, at, far, euler = e["by_steps"], str(e["horizon"]), e["horizon_steps"][-1], e["top1"]
    drops = [{k: v[at][k] - v[far][k] for k in v[at]} for v in (plain, deep)]
    graceful, cost = compare(*drops), compare(euler, s["bvit-blackbox"]["top1"])
    swaps = [(a, compare(sw["top1"], s[a]["top1"]), sw) for a in ("bvit-euler", "bvit-heun", "bvit-heun-T6h2")
             for sw in s[a].get("swapped", [])]
    verdicts = {a: [d.verdict for b, d, _ in swaps if b == a] for a, *_ in swaps}
    out = [say("deep-supervision", t=at, horizon=vs(deep[at], plain[at]), far=far, plain=fmt(drops[0]),
               deep=fmt(drops[1]), diff=text(graceful, words=("larger", "smaller")),
               verdict=say(f"degradation-{graceful.verdict}"), at_far=fmt(plain[far]),
               collapse="appears" if mean(plain[far]) < NEAR_CHANCE else "does not appear"),
           say("euler-heun", steps=vs(s["bvit-heun"]["top1"], euler),
               evaluations=vs(s["bvit-heun-T6h2"]["top1"], euler))]
    out += [say("swapped", swaps="; ".join(say("swap", arm=a, diff=text(d), **sw) for a, d, sw in swaps),
                arms="; ".join(f"{a}: {v.count('worse')} of {len(v)} worse, {v.count('better')} better (" + (
                    "tied to the discretisation it was trained with" if v.count("worse") == len(v) else
                    "no swap is worse; inconclusive is not equal" if "worse" not in v else "partly tied") + ")"
                    for a, v in verdicts.items()))] * bool(swaps)
    inside = {}
    for a in ("bvit-euler", "bvit-euler-ds3", "bvit-blackbox"):
        if "top1" in s[a] and all(str(t) in s[a]["by_steps"] for t in range(1, s[a]["horizon"] + 1)):
            curve = [mean(s[a]["by_steps"][str(t)]) for t in range(1, s[a]["horizon"] + 1)]
            reach = next(t for t in range(1, len(curve) + 1) if min(curve[t - 1:]) >= curve[-1] - WITHIN)
            peak = max(range(len(curve)), key=curve.__getitem__)
            inside[a] = say("inside-arm", arm=a, first=curve[0], last=curve[-1], t=len(curve), within=WITHIN,
                            reach=reach, shape="rising at every step" if all(
                                y >= x for x, y in zip(curve, curve[1:])) else "not monotone",
                            peak=f", peak {curve[peak]:.1f}% at step {peak + 1}" if peak < len(curve) - 1 else "")
    if inside:
        mid = str(e["horizon"] // 2)
        d = compare(deep[mid], plain[mid]) if {"bvit-euler", "bvit-euler-ds3"} <= set(inside) else None
        out.append(say("inside", arms="; ".join(inside.values()), mid=say(
            "inside-mid", mid=mid, diff=text(d), early=": the supervised states are usable early (any-time "
            "prediction)." if d.verdict == "better" else ".") if d else ""))
    if all("top1" in s[a] for a in ("bvit-T3", "bvit-T5")):
        stats, hs = [s[a]["top1"] for a in ("bvit-T3", "bvit-T5", "bvit-euler")], (3, 5, e["horizon"])
        out.append(say("depth", ts=", ".join(map(str, hs)), top1=" / ".join(map(fmt, stats)), diffs="; ".join(
            f"T={h} − T=3 {vs(st, stats[0])}" for h, st in zip(hs[1:], stats[1:])), trend=say(
            f"depth-{order(stats)}", t=hs[-1])))
    norms, turns = ([mean(x) for x in s["bvit-blackbox"][k]] for k in ("state_norms", "direction_change"))
    growth = [(v[12] / v[1]) ** (1 / 11) for v in (norms, [mean(x) for x in e["state_norms"]])]
    stop = next((t + 1 for t in range(12) if max(turns[t:12]) < 0.01), 12)  # from here on each step turns < 1%
    return out + [say("blackbox", diff=text(cost), verdict=say(f"blackbox-{cost.verdict}"), growth=growth[0],
                      euler=growth[1], start=norms[1], end=norms[12], turns=say(
                          "blackbox-stops", stop=stop) if stop < 12 else say("blackbox-turns")),
                  *budget_reading(s, steps)]


def budget_reading(s: Summary, steps: int) -> list[str]:
    """Matched FLOPs (12 ViT blocks and bViT's one block applied 12 times), and what the budget can test."""
    vit, bvit, r1 = s["srvit-R1-last"], s["bvit-euler"], s["srvit-R1-last"]["top1"]
    d = compare(vit["top1"], bvit["top1"])
    missing = [label for label, present in (("`mean` / `global` fusion", "top1" in s["srvit-R4-mean"]),
                                            ("bViT at other T", "top1" in s["bvit-T3"]),
                                            ("the trained Euler and Heun bViTs evaluated with the other solver",
                                             "swapped" in bvit)) if not present]
    return [say("matched-flops", evaluations=vit["block_evaluations"], diff=text(d), verdict=say(f"flops-{d.verdict}"),
                ratio=vit["parameters"] / bvit["parameters"]),
            say("can-test", r1=mean(r1), steps=steps, epochs=vit["epochs"], diff=vs(s["srvit-R4-query"]["top1"], r1),
                missing=say("not-run", arms=", ".join(missing)) if missing else "")]


def reading(s: Summary, picks: Mapping[str, dict], steps: int) -> list[str]:
    return [say("reading"), "", *lr_reading(s, picks, steps), *srvit_reading(s, picks), *bvit_reading(s, steps), ""]


# -- the page ------------------------------------------------------------------------------------------------
def tables(s: Summary, picks: Mapping[str, dict], records: Mapping[str, dict], seed: int) -> list[str]:
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
    norms = (0, 1, 2, 3, 6, 12, 24, 48)
    return [
        say("sweep-table"), "", *md_table(
            ["group", "arm", *[f"lr {v:g}: loss / top-1" for v in lrs], "pick"],
            [[g, p["arm"], *[cell(records.get(run_id(p["arm"], v, seed))) for v in lrs], f"{p['lr']:g}"]
             for g, p in picks.items()]), "", say("fusion-table"), "", *md_table(
            ["arm", "R", "fusion_mode", "params", "block evals", "top-1 (%)", "top-5 (%)", "final train loss",
             "last-20% share", "train s"],
            [[a, e["horizon"], e["s"]["model"]["fusion_mode"], f"{e['parameters'] / 1e6:.3f}M", e["block_evaluations"],
              fmt(e["top1"]), fmt(e["top5"]), fmt(e["final_loss"], 3), f"{100 * mean(e['flattening']):.1f}%",
              f"{mean(e['train_seconds']):.0f}"] for a, e in s.items() if e["s"]["section"] == "fusion"]), "",
        *([say("router-table"), "", *md_table(
            ["block", "srvit-R4-token weights", "srvit-R4-query weights", "entropy token / query"],
            [[j, *[" ".join(f"{mean(w):.2f}" for w in e["router_weights"][j]) for e in (tok, qry)],
              f"{mean(tok['router_entropy'][j]):.2f} / {mean(qry['router_entropy'][j]):.2f}"]
             for j in range(len(qry["router_weights"]) if routed else 0)]), ""] * routed),
        say("bvit-table"), "", *md_table(
            ["arm", "solver", "T", "h", "block evals", "1×", "1.5×", "2×", "3×", "4×", "final train loss"],
            [[a + " (deep supervision every 3)" * bool(e["s"]["extra"]), solver(e), e["horizon"], h(e),
              e["block_evaluations"], *[fmt(e["by_steps"][k]) if k in e["by_steps"] else "–" for k in
                                        e["horizon_steps"]], fmt(e["final_loss"], 3)] for a, e in bvit.items()]), "",
        *([say("inside-table"), "", *md_table(["arm", "T", *[f"t={t}" for t in range(1, width + 1)]], [
            [a, e["horizon"], *[fmt(e["by_steps"][str(t)], 1) if t <= e["horizon"] else "" for t in
                                range(1, width + 1)]] for a, e in inside.items()]), ""] * bool(inside)),
        *([say("swapped-table"), "", *md_table(
            ["trained arm", "trained solver, h, T", "top-1 own (%)", "evaluated with", "h", "steps", "block evals",
             "top-1 (%)", "swapped − own (paired by seed)"], swapped), ""] * bool(swapped)),
        say("norms-table", images=runs.PROBE_IMAGES), "", *md_table(["arm", *[f"t={t}" for t in norms]], [
            [a, *[f"{mean(e['state_norms'][t]):.3g}" if t < len(e["state_norms"]) else "–" for t in norms]]
            for a, e in bvit.items() if "state_norms" in e]), "", say("norms-figure"), ""]


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
    seeds, records, docs = page.study.budgets[0].seeds, page.records, page.store.docs
    if len(picks := picks_of(records, seeds[0])) < len(SWEEP_ARMS) or page.missing:
        return [say("not-read"), ""]
    s, first = summarise(records, picks, seeds), records[run_id("srvit-R1-last", picks["R1"]["lr"], seeds[0])]
    steps, images = first["settings"]["steps"], first["settings"]["eval_images"]
    info = json.loads((docs / "settings.json").read_text())["run_info"] if (docs / "settings.json").is_file() else {}
    hours = sum(r.get("train_seconds", 0) + r.get("eval_seconds", 0) for r in records.values()) / 3600
    if page.draw:
        figures(docs, s, picks, records, seeds[0])
    return [say("protocol"), "", say(
        "budget", steps=steps, epochs=s["srvit-R1-last"]["epochs"], runs=len(records), hours=hours,
        seeds=", ".join(map(str, sorted({r["seed"] for r in records.values()}))),  # one seed after a quick sweep
        images=say("budget-images", images=images) if images else "",
        wall=say("budget-wall", minutes=hours * 60 / info["jobs"], **info) if info else ""), "",
        *tables(s, picks, records, seeds[0]), *reading(s, picks, steps), *std.divergence(page), say("raw-results"), ""]


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
