"""The recurrence study's decisions come from its numbers: the plan (lr sweeps, their extension, the seeded runs),
the lr picks, seed statistics, the reading, the probes; and its committed runs give back the legacy picks."""

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import srvit
from looprun.study import Budget, load_study

ROOT = Path(__file__).resolve().parents[2]
STUDY = load_study(ROOT / "studies/recursion.py")
rec = sys.modules[STUDY.row.__module__]  # the spec module (its helpers: planning, statistics, reading)
runs = sys.modules[STUDY.run.__module__]  # studies/_recursion_runs.py (one run: training, measurements)
SEEDS = (0, 1, 2)


def S(*values: float, seeds: tuple[int, ...] | None = None) -> dict[int, float]:
    """A seed statistic (seed -> value); seeds 0, 1, ... unless given."""
    return dict(zip(seeds or range(len(values)), values, strict=True))


def _run(arm: str, seed: int, top1: float, loss: float = 1.5, by_steps: dict | None = None,
         norms_growth: float = 1.05, turn: float = 0.1) -> dict:
    settings = rec.SETTINGS[arm]
    horizon = runs.horizon(settings)
    result = {"name": f"{arm}-s{seed}", "arm": arm, "lr": 1e-3, "seed": seed, "diverged": False, "status": "finished",
              "steps": 100, "epochs": 1.3, "parameters": 1000, "train_seconds": 10.0, "top1": top1 / 100,
              "top5": 0.9, "final_train_loss": loss,
              "loss_curve": [[s, loss + 1.0 * math.exp(-s / 20)] for s in range(10, 101, 10)],
              "by_steps": {str(k): v / 100 for k, v in (by_steps or {}).items()}}
    if settings["model"].get("fusion_mode", "last") != "last" and horizon > 1:
        result["router_weights"] = [[0.1] * (horizon - 1) + [1 - 0.1 * (horizon - 1)] for _ in range(12)]
        result["router_entropy"] = [0.5] * 12
        result["entropy_curve"] = [[20, [1.0] * 12], [40, [0.6] * 12]]
    if runs.is_bvit(settings):
        result["state_norms"] = [5.0 * norms_growth ** t for t in range(4 * horizon + 1)]
        result["direction_change"] = [turn / (1 + t) ** 3 for t in range(4 * horizon)]
    return result


def _study(r4_top1=(40.0, 40.5, 39.5), r2_top1=(36.0, 36.3, 36.6), plain_far=(20.0, 21.0, 19.0),
           blackbox_growth=2.0, blackbox_top1=30.0, r4_loss=1.5, top1: dict | None = None,
           swapped: dict | None = None, inside: dict | None = None,
           inside_seeds: dict | None = None) -> tuple[dict, dict]:
    """Synthetic results of every arm x 3 seeds. ``top1``: per-arm seed values overriding the defaults;
    ``swapped``: per-arm top-1 of each swapped-solver evaluation (all seeds); ``inside``: per-arm top-1 at steps
    1..T, plus 0.2 per seed (``inside_seeds``: per-arm offsets of the three seeds instead); ``r4_loss``: the R=4
    arms' final loss at seed 0 (+ 0.01 per seed, as every other arm's), or one value per seed."""
    results, picks = {}, {}
    for arm, s in rec.SETTINGS.items():
        picks.setdefault(s["group"], {"lr": 1e-3, "arm": arm, "losses": {"0.0005": 1.6, "0.001": 1.5, "0.002": None},
                                      "edge": False})
        horizon = runs.horizon(s)
        for seed in (0, 1, 2):
            value = {"srvit-R1-last": 35.0 + seed * 0.3, "bvit-blackbox": blackbox_top1 + seed * 0.2}.get(arm)
            if arm.startswith("srvit-R4"):
                value = r4_top1[seed]
            if arm.startswith("srvit-R2"):
                value = r2_top1[seed]
            value = 36.0 + seed * 0.3 if value is None else value
            if top1 and arm in top1:
                value = top1[arm][seed]
            loss = 1.5 + 0.01 * seed
            if arm.startswith("srvit-R4"):
                loss = r4_loss[seed] if isinstance(r4_loss, tuple) else r4_loss + 0.01 * seed
            steps = {}
            if runs.is_bvit(s):
                far = plain_far[seed] if arm == "bvit-euler" else 35.0 + seed * 0.2
                steps = {horizon: 36.0 + seed * 0.2, 2 * horizon: 35.5, 4 * horizon: far}
                if inside and arm in inside:
                    off = (inside_seeds or {}).get(arm, (0.0, 0.2, 0.4))[seed]
                    steps.update({t + 1: v + off for t, v in enumerate(inside[arm])})
            growth = blackbox_growth if arm == "bvit-blackbox" else 1.05
            run = _run(arm, seed, value, loss, steps, growth)
            if swapped and arm in swapped:
                run["swapped"] = [{"solver": method, "step_size": h, "steps": n, "time": n * h,
                                   "block_evaluations": n * (2 if method == "heun" else 1),
                                   "top1": (swapped[arm][i] + seed * 0.2) / 100}
                                  for i, (method, h, n) in enumerate(runs.swapped_solvers(s))]
            results[f"{arm}-lr0.001-s{seed}"] = run
    return results, picks


def _reading(results: dict, picks: dict) -> list[str]:
    return rec.reading(rec.summarise(results, picks, SEEDS), picks, 100)


def _line(lines: list[str], start: str) -> str:
    return next(line for line in lines if line.startswith(start))


def test_differences_are_paired_by_seed_with_three_verdicts() -> None:
    compare, text, order = rec.compare, rec.text, rec.order
    a, b = S(40.0, 40.2, 39.8), S(35.0, 35.3, 34.7)  # +5.0, +4.9, +5.1
    assert compare(a, b).verdict == "better" and compare(a, b).mean == pytest.approx(5.0)
    assert compare(b, a).verdict == "worse"
    # a large seed spread that moves both arms together: paired, the +2.0, +1.9, +2.1 is resolved
    assert compare(S(40.0, 45.0, 35.0), S(38.0, 43.1, 32.9)).verdict == "better"
    # exactly +2 on every seed (zero spread, e.g. one checkpoint scored twice): degenerate, never "better"
    same = compare(S(40.0, 45.0, 35.0), S(38.0, 43.0, 33.0))
    assert same.verdict == "inconclusive" and same.p is None
    assert text(same) == "+2.00 points (zero spread between seeds, degenerate, no interval: inconclusive)"
    # differences that change sign across seeds: inconclusive, never "equal"
    noisy = compare(S(40.0, 45.0, 35.0), S(38.0, 46.0, 31.0))
    assert noisy.verdict == "inconclusive" and "inconclusive" in text(noisy) and "[" in text(noisy)
    # pairs are matched by seed, not by position
    assert compare(S(1.0, 2.0, 3.0), S(2.9, 0.9, 1.9, seeds=(2, 0, 1))).mean == pytest.approx(0.1)
    one_seed = compare(S(40.0), S(30.0))
    assert one_seed.verdict == "inconclusive" and "one seed pair" in text(one_seed)
    with pytest.raises(ValueError, match="share no seed"):
        compare(S(1.0), S(2.0, seeds=(1,)))
    # the ends differ by +2.0, +2.1, +2.0 (or the negatives): resolved, so the order of the means decides
    assert order([S(1.0, 1.1, 0.9), S(2.0, 2.1, 1.9), S(3.0, 3.2, 2.9)]) == "rises"
    assert order([S(3.0, 3.2, 2.9), S(2.0, 2.1, 1.9), S(1.0, 1.1, 0.9)]) == "falls"
    assert order([S(1.0, 1.1, 0.9), S(5.0, 5.1, 4.9), S(3.0, 3.2, 2.9)]) == "mixed"
    # exactly +2 at the ends on every seed: degenerate, so no order is claimed
    assert order([S(1.0, 1.1, 0.9), S(2.0, 2.1, 1.9), S(3.0, 3.1, 2.9)]) == "flat"
    assert order([S(1.0, 2.0, 0.0), S(1.0, 1.1, 0.9), S(1.5, 1.6, 0.1)]) == "flat"
    assert rec.sd(S(1.0, 2.0, 3.0)) == pytest.approx(1.0) and rec.sd(S(4.0)) == 0.0
    assert rec.fmt(S(1.0, 2.0, 3.0)) == "2.00 ± 1.00" and rec.fmt(S(4.0), 3) == "4.000"


def test_depth_trend_and_fusion_sentences_follow_the_numbers() -> None:
    rising = _line(_reading(*_study(r4_top1=(40.0, 40.5, 39.5))), "- **Top-1 vs R**")
    assert "`query` 36.30 ± 0.30 / 40.00 ± 0.50 at R=2/4: rises with R" in rising
    flat = _line(_reading(*_study(r4_top1=(35.0, 35.6, 35.3))), "- **Top-1 vs R**")
    assert "rises with R" not in flat and "`query` 36.30 ± 0.30 / 35.30 ± 0.30 at R=2/4: R=4 − R=1 inconclusive" in flat
    # R=4 − R=1 is -4.7, -5.3, -5.0 points over the seeds (R=1: 35.0, 35.3, 35.6): worse
    mixed = _line(_reading(*_study(r4_top1=(30.3, 30.0, 30.6))), "- **Top-1 vs R**")
    assert "not monotone in R" in mixed and "falls" not in mixed
    falling = _line(_reading(*_study(r4_top1=(30.3, 30.0, 30.6), r2_top1=(33.0, 33.3, 33.6))), "- **Top-1 vs R**")
    assert "`last` 33.30 ± 0.30 / 30.30 ± 0.30 at R=2/4: falls with R" in falling
    fusion = _line(_reading(*_study()), "- **Fused vs plain recursion**")
    r4 = fusion[fusion.index("R=4:"):]
    # every R=4 arm scores the same on every seed: zero spread, degenerate (no interval), inconclusive
    assert "token − last +0.00 points (zero spread between seeds, degenerate, no interval: inconclusive)" in r4
    assert all(f"{m} − last" in r4 for m in ("query", "token", "global", "mean"))
    # token − last +0.3, -0.1, -0.1: an interval across 0, inconclusive
    fusion = _line(_reading(*_study(top1={"srvit-R4-token": (40.3, 40.4, 39.4)})), "- **Fused vs plain recursion**")
    r4 = fusion[fusion.index("R=4:"):]
    assert "token − last +0.03 points [-0.54, +0.61] (paired by seed, 95% t, n = 3; 1/3 higher: inconclusive)" in r4
    # R=4 − R=1 final loss +0.30, +0.31, +0.31 (R=1: 1.50, 1.51, 1.52)
    loss = _line(_reading(*_study(r4_loss=(1.80, 1.82, 1.83))), "- **Training loss vs R**")
    assert "rises with R (R=4 − R=1 paired: higher)" in loss
    # the same loss as R=1 on every seed: degenerate, inconclusive
    same = _line(_reading(*_study(r4_loss=1.5)), "- **Training loss vs R**")
    assert "R=4 − R=1 is inconclusive" in same
    assert "+0.00 (zero spread between seeds, degenerate, no interval: inconclusive)" in same


def test_horizon_and_blackbox_sentences_follow_the_numbers() -> None:
    collapse = _line(_reading(*_study(plain_far=(11.0, 12.0, 13.0))), "- **Deep supervision**")
    assert "graceful degradation appears" in collapse
    assert "collapse to near chance without supervision appears" in collapse
    even = _line(_reading(*_study(plain_far=(35.0, 35.2, 35.4))), "- **Deep supervision**")
    assert "inconclusive whether supervision changes the degradation" in even and "does not appear" in even
    black = _line(_reading(*_study(blackbox_growth=2.0, blackbox_top1=30.0)), "- **Black-box field.**")
    assert "grows ×2.00 per step" in black and "cost of `z' = F(z)` appears" in black
    assert "effectively shallower" in black
    same = _line(_reading(*_study(blackbox_growth=1.05, blackbox_top1=36.0)), "- **Black-box field.**")
    assert "inconclusive whether the paper's few-point cost" in same and "×1.05" in same


def test_matched_flops_router_uniformity_and_budget_sentences() -> None:
    # by default the ViT is exactly 1 point behind bViT on every seed: zero spread, degenerate, no call
    flops = _line(_reading(*_study()), "- **Matched FLOPs**")
    assert "12-block ViT − bViT (Euler, T=12) -1.00 points (zero spread between seeds, degenerate, no interval: " \
        "inconclusive)" in flops and "Inconclusive at matched FLOPs." in flops
    # bViT 36.0, 36.35, 36.55: the ViT (35.0, 35.3, 35.6) is behind by 1.0, 1.05, 0.95 points
    results, picks = _study(top1={"bvit-euler": (36.0, 36.35, 36.55)})
    flops = _line(_reading(results, picks), "- **Matched FLOPs**")
    assert "12-block ViT − bViT (Euler, T=12) -1.00 points" in flops and "worse" in flops
    assert "bViT wins at matched FLOPs here" in flops
    for r in results.values():
        if r["arm"] == "bvit-euler":
            r["top1"] -= 0.05 + 0.001 * r["seed"]  # now the ViT is ahead on every seed
    assert "Standard ViTs win at matched FLOPs" in _line(_reading(results, picks), "- **Matched FLOPs**")
    for r in results.values():
        if "router_weights" in r:
            k = len(r["router_weights"][0])
            r["router_weights"] = [[1 / k] * k for _ in range(12)]
    router = _line(_reading(results, picks), "- **What the trained routers favour**")
    assert "close to `mean` fusion's" in router and "cannot be credited to token-wise routing" in router
    budget = _line(_reading(results, picks), "- **What this budget can and cannot test.**")
    assert "R=4 query − R=1" in budget and "`mean` / `global`" not in budget
    assert "Not run here: the trained Euler and Heun bViTs evaluated with the other solver" in budget
    older = {k: v for k, v in results.items() if "-mean-" not in k and "-global-" not in k}
    lines = rec.reading(rec.summarise(older, picks, SEEDS), picks, 100)  # the mean / global arms were not run
    assert "Not run here: `mean` / `global` fusion" in _line(lines, "- **What this budget can and cannot test.**")
    assert "unless a `mean` (and `global`) arm" in _line(lines, "- **What the trained routers favour**")
    assert not any(line.startswith("- **Routing vs averaging") for line in lines)


def test_routing_is_credited_only_where_it_beats_mean_fusion() -> None:
    same = _line(_reading(*_study()), "- **Routing vs averaging the steps**")
    assert "No router is shown to beat `mean` fusion" in same and "R=4 token − mean +0.00 points" in same
    verdict = same[same.index("No router"):]
    assert "matched" not in verdict and "equal" not in verdict  # zero-width intervals: nothing to call too wide
    # seeds that cross: an inconclusive router − mean is not a match, and the widest interval is named
    noisy = _line(_reading(*_study(top1={"srvit-R4-global": (40.0, 41.5, 39.0)})), "- **Routing vs averaging")
    assert "No router is shown to beat `mean` fusion; the intervals are too wide to call them equal (the widest, " \
        "R=4 global − mean [" in noisy and "inconclusive, not a match" in noisy
    assert "matched" not in noisy and "cannot be credited to (token-wise) routing" in noisy
    assert "No learned router beats plain averaging" not in noisy
    ahead = {"srvit-R4-token": (41.0, 41.6, 40.4)}  # +1.0 +1.1 +0.9 over every R=4 arm, mean included
    routed = _line(_reading(*_study(top1=ahead)), "- **Routing vs averaging the steps**")
    assert "A learned router beats plain averaging for token at R=4." in routed
    assert "R=4 token − mean +1.00 points [" in routed and "better" in routed


def test_plain_recursion_at_its_own_lr_is_compared_with_the_shared_lr() -> None:
    results, picks = _study()
    assert "picked the same lr as `query`'s" in _line(_reading(results, picks), "- **Plain recursion at its own lr.**")
    picks["R4-last"] = {**picks["R4-last"], "lr": 2e-3}
    for seed in (0, 1, 2):  # at its own lr plain recursion gains 2 points on every seed
        results[f"srvit-R4-last-lr0.002-s{seed}"] = _run("srvit-R4-last", seed, 42.0 + seed * 0.1, 1.5 + 0.01 * seed)
    line = _line(_reading(results, picks), "- **Plain recursion at its own lr.**")
    assert "R=4 0.002 (query's: 0.001)" in line
    assert "R=4: at its own lr − at query's lr +2.10 points [" in line and "better" in line
    assert "against `last` at query's lr (0.001) instead: query − last +0.00 points" in line
    fused = _line(_reading(results, picks), "- **Fused vs plain recursion**")
    assert "R=4: query − last -2.10 points [" in fused  # the comparison uses last's own pick
    # the depth trend of plain recursion is given at both lrs; this pick won by 0.1 in loss, no coin toss
    trend = _line(_reading(results, picks), "- **Top-1 vs R**")
    assert "(R=4 − R=1 +6.80 points [" in trend
    assert "at its own lr 0.002; at 0.001, R=4 − R=1 is +4.70 points [" in trend
    assert "coin toss" not in trend
    picks["R4-last"] = {**picks["R4-last"], "losses": {"0.001": 1.501, "0.002": 1.500}}
    trend = _line(_reading(results, picks), "- **Top-1 vs R**")
    assert "at its own lr 0.002, an lr picked over 0.001 on a 0.001 loss gap, less than the seed s.d. (0.010): a " \
        "coin toss; at 0.001, R=4 − R=1 is +4.70 points [" in trend


def test_swapped_solver_depth_and_in_horizon_sentences_follow_the_numbers() -> None:
    # trained Euler/Heun bViTs score 36.0 + 0.2 seed; swaps 3 points below on every seed: all worse
    low = {name: (33.0, 33.0) for name in ("bvit-euler", "bvit-heun", "bvit-heun-T6h2")}
    worse = _line(_reading(*_study(swapped=low)), "- **Swapped solvers**")
    assert "bvit-euler: 2 of 2 worse, 0 better (tied to the discretisation it was trained with)" in worse
    assert "bvit-heun-T6h2: 2 of 2 worse" in worse
    assert "bvit-heun-T6h2 with euler (h=1, 12 steps, 12 evaluations) − with its own -3.10 points" in worse
    even = {name: (36.0, 36.0) for name in ("bvit-euler", "bvit-heun", "bvit-heun-T6h2")}
    mixed = {**even, "bvit-euler": (33.0, 36.0)}  # Heun at h=1 costs the Euler-trained weights 3 points
    line = _line(_reading(*_study(swapped=mixed)), "- **Swapped solvers**")
    assert "bvit-euler: 1 of 2 worse, 0 better (partly tied)" in line
    assert "bvit-heun: 0 of 2 worse, 0 better (no swap is worse; inconclusive is not equal)" in line
    rising = {"bvit-T3": (30.0, 30.4, 29.6), "bvit-T5": (33.0, 33.5, 32.5), "bvit-euler": (36.0, 36.3, 35.7)}
    assert "Accuracy rises with T: depth pays" in _line(_reading(*_study(top1=rising)), "- **Depth at this budget**")
    flat = {"bvit-T3": (36.0, 35.0, 37.0), "bvit-T5": (36.1, 35.2, 36.6), "bvit-euler": (35.5, 36.9, 36.0)}
    assert "this budget cannot show that depth matters" in _line(_reading(*_study(top1=flat)),
                                                                 "- **Depth at this budget**")
    curve = [20.0, 28.0, 31.0, 33.0, 34.0, 34.5, 35.0, 35.4, 35.6, 35.8, 35.9, 36.0]
    supervised = [30.0, 31.0, 33.0, 34.0, 35.0, 35.5, 35.6, 35.7, 35.8, 35.9, 36.0, 36.0]
    # both arms +0.2 per seed: deep supervision − plain is exactly +1 on every seed, degenerate, no call
    line = _line(_reading(*_study(inside={"bvit-euler": curve, "bvit-euler-ds3": supervised})),
                 "- **Inside the horizon**")
    assert "At step 6, half the horizon, deep supervision − plain +1.00 points (zero spread between seeds, " \
        "degenerate, no interval: inconclusive)." in line and "usable early" not in line
    # supervised seeds +0, +0.25, +0.35 (the same mean offset, 0.2): +1.00, +1.05, +0.95 at step 6
    line = _line(_reading(*_study(inside={"bvit-euler": curve, "bvit-euler-ds3": supervised},
                                  inside_seeds={"bvit-euler-ds3": (0.0, 0.25, 0.35)})), "- **Inside the horizon**")
    assert "bvit-euler 20.2% at step 1 → 36.2% at step 12 (rising at every step), within 1 point of it from step 7 on" \
        in line
    assert "At step 6, half the horizon, deep supervision − plain +1.00 points [" in line
    assert "usable early (any-time prediction)" in line
    assert "bvit-blackbox" not in line  # no in-horizon steps stored for it: not described


def test_arm_geometry_eval_depths_and_swapped_solvers() -> None:
    s = rec.SETTINGS
    euler, deep, r4 = s["bvit-euler"], s["bvit-euler-ds3"], s["srvit-R4-query"]
    assert runs.eval_steps(euler) == tuple(range(1, 13)) + (18, 24, 36, 48) and runs.eval_steps(r4) == ()
    assert runs.eval_steps(s["bvit-T5"]) == (1, 2, 3, 4, 5, 8, 10, 15, 20)
    assert runs.horizon_steps(s["bvit-heun-T6h2"]) == (6, 9, 12, 18, 24)
    assert [runs.block_evaluations(s[a]) for a in ("srvit-R1-last", "srvit-R4-query", "bvit-euler", "bvit-heun",
                                                  "bvit-heun-T6h2", "bvit-T3")] == [12, 48, 12, 24, 12, 3]
    assert runs.swapped_solvers(euler) == [("heun", 1.0, 12), ("heun", 2.0, 6)]
    assert runs.swapped_solvers(s["bvit-heun"]) == [("euler", 1.0, 12), ("euler", 0.5, 24)]
    assert runs.swapped_solvers(s["bvit-heun-T6h2"]) == [("euler", 2.0, 6), ("euler", 1.0, 12)]
    assert runs.swapped_solvers(s["bvit-blackbox"]) == runs.swapped_solvers(s["bvit-T3"]) == []
    assert runs.swapped_solvers(deep) == runs.swapped_solvers(r4) == []


def test_router_and_lr_sentences() -> None:
    results, picks = _study()
    lines = _reading(results, picks)
    router = _line(lines, "- **What the trained routers favour**")
    assert "srvit-R4-query: step 4 is the heaviest in 12 of 12 blocks (mean weight there 0.70" in router
    for r in results.values():
        if "router_weights" in r:
            k = len(r["router_weights"][0])
            r["router_weights"] = [[1 / k] * k for _ in range(12)]
    assert "near uniform" in _line(_reading(results, picks), "- **What the trained routers favour**")
    picks["R4"]["edge"] = True
    lr = _line(_reading(results, picks), "- **Learning rates.**")
    assert "0.002: diverged" in lr and "still at the edge after extending the grid" in lr


def test_lr_pick_prefers_the_lowest_final_loss_and_never_a_diverged_run() -> None:
    results = [{"lr": 5e-4, "arm": "a", "diverged": False, "final_train_loss": 1.7, "top1": 0.3},
               {"lr": 1e-3, "arm": "a", "diverged": False, "final_train_loss": 1.5, "top1": 0.3},
               {"lr": 2e-3, "arm": "a", "diverged": True}]
    pick = rec.pick_lr(results)
    assert pick["lr"] == 1e-3 and not pick["edge"] and pick["losses"]["0.002"] is None
    assert rec.pick_lr(results[:2])["edge"]  # the best is the top of a two-point grid
    with pytest.raises(RuntimeError, match="every lr of the sweep diverged"):
        rec.pick_lr([results[2]])


def test_an_edge_pick_extends_the_sweep_outward_a_bounded_number_of_times() -> None:
    grid = (5e-4, 1e-3, 2e-3)
    assert rec.MAX_EXTENSIONS == 2
    assert rec.next_lr({"lr": 5e-4, "edge": True}, [5e-4, 1e-3, 2e-3], grid) == 2.5e-4
    assert rec.next_lr({"lr": 2e-3, "edge": True}, [5e-4, 1e-3, 2e-3], grid) == 4e-3
    assert rec.next_lr({"lr": 2.5e-4, "edge": True}, [2.5e-4, 5e-4, 1e-3, 2e-3], grid) == 1.25e-4
    assert rec.next_lr({"lr": 1.25e-4, "edge": True}, [1.25e-4, 2.5e-4, 5e-4, 1e-3, 2e-3], grid) is None
    assert rec.next_lr({"lr": 1e-3, "edge": False}, [5e-4, 1e-3, 2e-3], grid) is None


def _sweep_record(arm: str, lr: float, loss: float, quick: bool = False) -> dict:
    return {"status": "finished", "arm": arm, "lr": lr, "seed": 0, "diverged": False, "final_train_loss": loss,
            "top1": 0.3, **({"quick": True} if quick else {})}


def test_the_plan_sweeps_each_group_then_runs_every_arm_and_seed_at_its_pick() -> None:
    plan = lambda phase, records: {p.id: p for p in phase.plan(STUDY, records)}
    sweep, main = STUDY.plan_phases()
    assert [sweep.name, main.name] == ["lrcheck", "main"] and not sweep.registered and not main.registered
    first = plan(sweep, {})
    assert len(first) == 18 and all(p.seed == 0 and p.phase == "lrcheck" for p in first.values())
    assert "srvit-R4-query-lr0.0005-s0" in first and first["srvit-R4-query-lr0.0005-s0"].budget == "lr0.0005"
    assert first["srvit-R4-query-lr0.0005-s0"].settings["steps"] == 600
    assert plan(main, {}) == {}  # no pick yet: nothing to run at it
    # every group's best loss at the lowest lr: the sweep halves the lr, at most twice, R4-last keeps falling
    records, curve = {}, {5e-4: 1.5, 1e-3: 1.6, 2e-3: 1.7, 2.5e-4: 1.45, 1.25e-4: 1.47}
    for _ in range(4):
        for run in plan(sweep, records).values():
            loss = curve[run.settings["lr"]] - (0.1 * (run.settings["lr"] < 2e-4) if run.arm == "srvit-R4-last" else 0)
            records.setdefault(run.id, _sweep_record(run.arm, run.settings["lr"], loss))
    assert len(plan(sweep, records)) == 6 * 5  # 3 + 2 extensions per group
    picks = rec.picks_of(records, 0)
    assert picks["R4"]["lr"] == 2.5e-4 and not picks["R4"]["edge"] and picks["R4"]["tried"][0] == 1.25e-4
    assert picks["R4-last"]["lr"] == 1.25e-4 and picks["R4-last"]["edge"]  # still at the edge: no third extension
    runs_ = plan(main, records)
    # every arm x 3 seeds at its pick, less the sweep's seed-0 runs at the pick (6 groups), plus plain R4 recursion
    # at the lr its fused arms use (its own pick differs), less that lr's seed-0 sweep run
    assert len(runs_) == 18 * 3 - 6 + 3 - 1
    assert {f"srvit-R4-last-lr0.00025-s{s}" for s in (1, 2)} <= set(runs_)
    assert "srvit-R4-last-lr0.00025-s0" not in runs_ and "srvit-R4-query-lr0.00025-s0" not in runs_
    assert {f"srvit-R4-token-lr0.00025-s{s}" for s in (0, 1, 2)} <= set(runs_)
    assert not any(r.id.startswith("srvit-R2-last-") and r.settings["lr"] != 2.5e-4 for r in runs_.values())
    assert all(r.phase == "main" for r in runs_.values())
    # a quick sweep (--option quick=true): one seed per arm
    quick = {k: {**v, "quick": True} for k, v in records.items()}
    assert {r.seed for r in plan(main, quick).values()} == {0} and len(plan(main, quick)) == 18 - 6 + 0


def test_the_committed_runs_give_back_the_legacy_plan_and_picks() -> None:
    """The 74 runs moved from the study's first results.json: the plan covers exactly them, and the picks computed
    from them are the ones the first layout stored."""
    records = {p.stem: json.loads(p.read_text()) for p in (ROOT / "docs/study_recursion/runs").glob("*.json")}
    legacy = json.loads((ROOT / "docs/study_recursion/settings.json").read_text())
    planned = [p.id for phase in STUDY.plan_phases() for p in phase.plan(STUDY, records)]
    assert sorted(planned) == sorted(records) and len(planned) == 74
    assert rec.picks_of(records, 0) == legacy["picks"]
    assert legacy["settings"] == {"steps": rec.STEPS, "seeds": list(rec.SEEDS), "lr_grid": list(rec.LR_GRID),
                                  "max_extensions": rec.MAX_EXTENSIONS, "eval_images": None,
                                  "probe_images": runs.PROBE_IMAGES}
    migration = json.loads((ROOT / "docs/study_recursion/migration.json").read_text())
    assert {m["to"] for m in migration["moves"]} >= {f"docs/study_recursion/runs/{k}.json" for k in records}


def test_history_summary_and_flattening() -> None:
    history = [{"step": s, "loss_final": 2.0 - s / 100} for s in range(1, 101)]
    history[19]["fusion_entropy"] = 1.0
    history[19].update({"fusion_entropy/block00": 1.2, "fusion_entropy/block01": 0.8})
    summary = runs.summarise_history(history)
    assert summary["loss_curve"][0] == [10, pytest.approx(2.0 - 5.5 / 100)]
    assert summary["final_train_loss"] == pytest.approx(2.0 - 90.5 / 100)  # the last 10% (>= 20 steps)
    assert summary["entropy_curve"] == [[20, [1.2, 0.8]]]
    linear = rec.flattening(summary["loss_curve"], 100)
    assert linear == pytest.approx(0.2 / 0.9)  # a straight line: 20 of the 90 steps between the first and last window
    settled = rec.flattening([[s, 1.0 + math.exp(-s / 5)] for s in range(10, 101, 10)], 100)
    assert settled < 0.01


def test_test_subset_is_spread_over_the_class_sorted_shard() -> None:
    labels = torch.arange(10).repeat_interleave(100)  # sorted by class, as the shared test shard is
    chosen = runs.spread(len(labels), 50)
    assert torch.bincount(labels[chosen], minlength=10).tolist() == [5] * 10
    assert torch.equal(runs.spread(7, None), torch.arange(7)) and torch.equal(runs.spread(7, 9), torch.arange(7))


def test_probe_measures_state_growth_and_router_weights_on_real_models() -> None:
    torch.manual_seed(0)
    images = torch.randn(4, 3, 16, 16)
    kw = dict(embed_dim=24, num_heads=2, patch_size=8, img_size=16, num_classes=3)
    bvit = {**rec.SETTINGS["bvit-T3"], "model": {"recursion": 3}}
    black = runs.probe(srvit.create_model("bvit-ti", recursion=3, solver="blackbox", **kw).eval(), images, bvit)
    euler = runs.probe(srvit.create_model("bvit-ti", recursion=3, **kw).eval(), images, bvit)
    assert len(black["state_norms"]) == 13 and len(black["direction_change"]) == 12  # run to 4x the horizon
    # z + F(z) = 2z + r(LN z): at initialisation (small residual branches) the norm doubles every step
    ratios = [b / a for a, b in zip(black["state_norms"][1:], black["state_norms"][2:])]
    assert all(1.9 < r < 2.1 for r in ratios)
    assert all(0.9 < b / a < 1.1 for a, b in zip(euler["state_norms"], euler["state_norms"][1:]))
    routed = runs.probe(srvit.create_model("srvit-ti", depth=2, recursion=3, fusion_mode="query", **kw).eval(), images,
                        rec.SETTINGS["srvit-R4-query"])
    assert len(routed["router_weights"]) == 2 and all(sum(w) == pytest.approx(1.0) for w in routed["router_weights"])
    assert all(0 <= e <= math.log(3) + 1e-6 for e in routed["router_entropy"])
    assert "state_norms" not in routed and "router_weights" not in black


@pytest.mark.slow
def test_the_study_runs_end_to_end_at_a_tiny_budget(cifar10, tmp_path: Path, monkeypatch) -> None:
    """Every arm x 2 seeds for 3 steps through the engine (a few minutes): the page, results.json and the figures
    are written, and a rerun reuses every finished run."""
    from looprun.study.engine import run_study
    from looprun.study.executors import LocalPool
    from looprun.study.page import render

    monkeypatch.setattr(rec, "LR_GRID", (1e-3,))
    tiny = replace(STUDY, budgets=[Budget("3 steps", (0, 1), steps=3)])
    options = {"eval_images": 100, "data": str(Path(cifar10["train"]).parent)}
    go = lambda: run_study(tiny, LocalPool(2, tmp_path / "work"), docs_root=tmp_path, code_root=ROOT,
                           workdir=tmp_path / "work", options=options, log=lambda line: None)
    assert go()["failed"] == 0
    text, results = render(tiny, tmp_path)
    assert "## Reading" in text and "- **Black-box field.**" in text and results["missing"] == []
    assert len(results["runs"]) == 18 * 2 and set(results["picks"]) == set(rec.SWEEP_ARMS)
    assert {p.name for p in (tmp_path / "docs/study_recursion").iterdir()} == {
        "runs", "results.json", "loss_curves.png", "bvit.png"}
    assert go()["ran"] == 0  # a rerun reuses every finished run


def test_logged_history_keeps_the_steps_of_an_interrupted_run(kodak_labelled, tmp_path: Path) -> None:
    """The study reads each run's history from TensorBoard: a run resumed from step 3 still has steps 1..6,
    and the recomputed steps 4..6 carry the values of the resumed invocation."""
    from looprun.checkpoint import CheckpointManager
    from srvit.train_config import load_train_config
    from srvit.trainer import train

    config = load_train_config("cifar10-srvit-ti", [
        "protocol=imagenet", "num_classes=2", "resolution=32", "batch_size=4", "num_workers=0", "progress_bar=false",
        "model_overrides={depth: 2, embed_dim: 24, num_heads: 2, patch_size: 8, recursion: 2}", "lr=1e-3",
        "warmup_epochs=0.2", "log_every=1", "max_steps=6", "checkpoint_every=3",
    ])
    run = tmp_path / "run"
    train(config, kodak_labelled, run)
    manager = CheckpointManager(run / "checkpoints")
    for path in manager.list_checkpoints()[1:]:  # as if killed during step 4: only the step-3 checkpoint is left
        for f in path.iterdir():
            f.unlink()
        path.rmdir()
    resumed = train(config, kodak_labelled, run)
    assert [h["step"] for h in resumed.history] == [4, 5, 6]  # in memory: only the last invocation
    history = runs.logged_history(run)
    assert [h["step"] for h in history] == [1, 2, 3, 4, 5, 6]
    for logged, live in zip(history[3:], resumed.history):
        assert logged["loss_final"] == pytest.approx(live["loss_final"], rel=1e-6)
        assert logged["fusion_entropy/block01"] == pytest.approx(live["fusion_entropy/block01"], rel=1e-6)


def test_lr_picks_within_seed_noise_are_flagged() -> None:
    results, picks = _study()
    assert "coin toss" not in _line(_reading(results, picks), "- **Learning rates.**")
    picks["R4-last"] = {**picks["R4-last"], "losses": {"0.00025": 1.500, "0.0005": 1.505, "0.001": 1.6}}
    for r in results.values():
        if r["arm"] == "srvit-R4-last":
            r["final_train_loss"] = 1.5 + 0.02 * r["seed"]  # seed s.d. 0.02 > the 0.005 margin
    line = _line(_reading(results, picks), "- **Learning rates.**")
    assert "R4-last (srvit-R4-last) 0.001 [0.00025: 1.500, 0.0005: 1.505, 0.001: 1.600] — the runner-up 0.0005 is " \
        "only 0.005 behind, less than the seed s.d. of this arm's final loss (0.020): a coin toss" in line
