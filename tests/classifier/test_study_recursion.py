"""The recurrence study's decisions come from its numbers: lr picks, seed statistics, the reading, the probes."""

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from study_recursion import Arm, Settings, next_lr, pick_lr, study_arms  # noqa: E402
from study_recursion_measure import probe, spread, summarise_history  # noqa: E402
from study_recursion_report import Stat, compare, flattening, order, reading, summarise  # noqa: E402

import srvit  # noqa: E402

SETTINGS = {"steps": 100, "seeds": [0, 1, 2], "lr_grid": [5e-4, 1e-3, 2e-3], "eval_images": None,
            "probe_images": 8}


def _run(arm: Arm, seed: int, top1: float, loss: float = 1.5, by_steps: dict | None = None,
         norms_growth: float = 1.05, turn: float = 0.1) -> dict:
    horizon = arm.horizon
    result = {"name": f"{arm.name}-s{seed}", "arm": arm.name, "lr": 1e-3, "seed": seed, "diverged": False,
              "steps": 100, "epochs": 1.3, "parameters": 1000, "train_seconds": 10.0, "top1": top1 / 100,
              "top5": 0.9, "final_train_loss": loss,
              "loss_curve": [[s, loss + 1.0 * math.exp(-s / 20)] for s in range(10, 101, 10)],
              "by_steps": {str(k): v / 100 for k, v in (by_steps or {}).items()}}
    if arm.model.get("fusion_mode", "last") != "last" and horizon > 1:
        result["router_weights"] = [[0.1] * (horizon - 1) + [1 - 0.1 * (horizon - 1)] for _ in range(12)]
        result["router_entropy"] = [0.5] * 12
        result["entropy_curve"] = [[20, [1.0] * 12], [40, [0.6] * 12]]
    if arm.preset.startswith("cifar10-bvit"):
        result["state_norms"] = [5.0 * norms_growth ** t for t in range(4 * horizon + 1)]
        result["direction_change"] = [turn / (1 + t) ** 3 for t in range(4 * horizon)]
    return result


def _study(r4_top1=(40.0, 40.5, 39.5), r2_top1=(36.0, 36.3, 36.6), plain_far=(20.0, 21.0, 19.0),
           blackbox_growth=2.0, blackbox_top1=30.0, r4_loss=1.5) -> tuple[dict, dict]:
    results, picks = {}, {}
    for arm in study_arms():
        picks.setdefault(arm.group, {"lr": 1e-3, "arm": arm.name, "losses": {"0.0005": 1.6, "0.001": 1.5,
                                                                             "0.002": None}, "edge": False})
        for seed in (0, 1, 2):
            top1 = {"srvit-R1-last": 35.0 + seed * 0.3, "bvit-blackbox": blackbox_top1 + seed * 0.2}.get(arm.name)
            if arm.name.startswith("srvit-R4"):
                top1 = r4_top1[seed]
            if arm.name.startswith("srvit-R2"):
                top1 = r2_top1[seed]
            top1 = 36.0 + seed * 0.3 if top1 is None else top1
            loss = r4_loss if arm.name.startswith("srvit-R4") else 1.5
            loss += 0.01 * seed
            steps = {}
            if arm.preset.startswith("cifar10-bvit"):
                far = plain_far[seed] if arm.name == "bvit-euler" else 35.0 + seed * 0.2
                steps = {arm.horizon: 36.0 + seed * 0.2, 2 * arm.horizon: 35.5, 4 * arm.horizon: far}
            growth = blackbox_growth if arm.name == "bvit-blackbox" else 1.05
            results[f"{arm.name}-lr0.001-s{seed}"] = _run(arm, seed, top1, loss, steps, growth)
    return results, picks


def _reading(results: dict, picks: dict) -> list[str]:
    summary = summarise(results, picks, study_arms(), SETTINGS)
    return reading(summary, picks, SETTINGS, SETTINGS["lr_grid"])


def _line(lines: list[str], start: str) -> str:
    return next(line for line in lines if line.startswith(start))


def test_differences_are_paired_by_seed_with_three_verdicts() -> None:
    a, b = Stat([40.0, 40.2, 39.8]), Stat([35.0, 35.2, 34.8])
    assert compare(a, b).verdict == "better" and compare(a, b).delta == pytest.approx(5.0)
    assert compare(b, a).verdict == "worse"
    # a large seed spread that moves both arms together: paired, the +2 on every seed is resolved
    assert compare(Stat([40.0, 45.0, 35.0]), Stat([38.0, 43.0, 33.0])).verdict == "better"
    # differences that change sign across seeds: inconclusive, never "equal"
    noisy = compare(Stat([40.0, 45.0, 35.0]), Stat([38.0, 46.0, 31.0]))
    assert noisy.verdict == "inconclusive" and "inconclusive" in noisy.text() and "[" in noisy.text()
    # pairs are matched by seed, not by position
    assert compare(Stat([1.0, 2.0, 3.0], [0, 1, 2]), Stat([2.9, 0.9, 1.9], [2, 0, 1])).delta == pytest.approx(0.1)
    one_seed = compare(Stat([40.0]), Stat([30.0]))
    assert not one_seed.called and "one seed pair" in one_seed.text()
    assert order([Stat([1.0, 1.1, 0.9]), Stat([2.0, 2.1, 1.9]), Stat([3.0, 3.1, 2.9])]) == "rises"
    assert order([Stat([3.0, 3.1, 2.9]), Stat([2.0, 2.1, 1.9]), Stat([1.0, 1.1, 0.9])]) == "falls"
    assert order([Stat([1.0, 1.1, 0.9]), Stat([5.0, 5.1, 4.9]), Stat([3.0, 3.1, 2.9])]) == "mixed"
    assert order([Stat([1.0, 2.0, 0.0]), Stat([1.0, 1.1, 0.9]), Stat([1.5, 1.6, 0.1])]) == "flat"
    assert Stat([1.0, 2.0, 3.0]).sd == pytest.approx(1.0) and Stat([4.0]).sd == 0.0


def test_depth_trend_and_fusion_sentences_follow_the_numbers() -> None:
    rising = _line(_reading(*_study(r4_top1=(40.0, 40.5, 39.5))), "- **Top-1 vs R**")
    assert "`query` 36.30 ± 0.30 / 40.00 ± 0.50 at R=2/4: rises with R" in rising
    flat = _line(_reading(*_study(r4_top1=(35.0, 35.6, 35.3))), "- **Top-1 vs R**")
    assert "rises with R" not in flat and "`query` 36.30 ± 0.30 / 35.30 ± 0.30 at R=2/4: R=4 − R=1 inconclusive" in flat
    mixed = _line(_reading(*_study(r4_top1=(30.0, 30.3, 30.6))), "- **Top-1 vs R**")
    assert "not monotone in R" in mixed and "falls" not in mixed
    falling = _line(_reading(*_study(r4_top1=(30.0, 30.3, 30.6), r2_top1=(33.0, 33.3, 33.6))), "- **Top-1 vs R**")
    assert "`last` 33.30 ± 0.30 / 30.30 ± 0.30 at R=2/4: falls with R" in falling
    fusion = _line(_reading(*_study()), "- **SoftMoR vs plain recursion**")
    assert "R=4: token − last +0.00 points [+0.00, +0.00] (paired by seed, 95% t, n = 3; 0/3 higher: inconclusive)" \
        in fusion
    loss = _line(_reading(*_study(r4_loss=1.8)), "- **Training loss vs R**")
    assert "rises with R (R=4 − R=1 paired: higher)" in loss
    assert "inconclusive" in _line(_reading(*_study(r4_loss=1.5)), "- **Training loss vs R**")


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
    results, picks = _study()
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
    assert "act as `mean` fusion" in router and "cannot be credited to token-wise routing" in router
    budget = _line(_reading(results, picks), "- **What this budget can and cannot test.**")
    assert "`mean` / `global` fusion" in budget and "R=4 query − R=1" in budget


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
    runs = [{"lr": 5e-4, "arm": "a", "diverged": False, "final_train_loss": 1.7, "top1": 0.3},
            {"lr": 1e-3, "arm": "a", "diverged": False, "final_train_loss": 1.5, "top1": 0.3},
            {"lr": 2e-3, "arm": "a", "diverged": True}]
    pick = pick_lr(runs)
    assert pick["lr"] == 1e-3 and not pick["edge"] and pick["losses"]["0.002"] is None
    assert pick_lr(runs[:2])["edge"]  # the best is the top of a two-point grid
    with pytest.raises(RuntimeError, match="every lr of the sweep diverged"):
        pick_lr([runs[2]])


def test_an_edge_pick_extends_the_sweep_outward_a_bounded_number_of_times() -> None:
    settings = Settings(lr_grid=(5e-4, 1e-3, 2e-3), max_extensions=2)
    low = {"lr": 5e-4, "edge": True}
    assert next_lr(low, [5e-4, 1e-3, 2e-3], settings) == 2.5e-4
    assert next_lr({"lr": 2e-3, "edge": True}, [5e-4, 1e-3, 2e-3], settings) == 4e-3
    assert next_lr({"lr": 2.5e-4, "edge": True}, [2.5e-4, 5e-4, 1e-3, 2e-3], settings) == 1.25e-4
    assert next_lr({"lr": 1.25e-4, "edge": True}, [1.25e-4, 2.5e-4, 5e-4, 1e-3, 2e-3], settings) is None
    assert next_lr({"lr": 1e-3, "edge": False}, [5e-4, 1e-3, 2e-3], settings) is None


def test_history_summary_and_flattening() -> None:
    history = [{"step": s, "loss_final": 2.0 - s / 100} for s in range(1, 101)]
    history[19]["fusion_entropy"] = 1.0
    history[19].update({"fusion_entropy/block00": 1.2, "fusion_entropy/block01": 0.8})
    summary = summarise_history(history)
    assert summary["loss_curve"][0] == [10, pytest.approx(2.0 - 5.5 / 100)]
    assert summary["final_train_loss"] == pytest.approx(2.0 - 90.5 / 100)  # the last 10% (>= 20 steps)
    assert summary["entropy_curve"] == [[20, [1.2, 0.8]]]
    linear = flattening(summary["loss_curve"], 100)
    assert linear == pytest.approx(0.2 / 0.9)  # a straight line: 20 of the 90 steps between the first and last window
    settled = flattening([[s, 1.0 + math.exp(-s / 5)] for s in range(10, 101, 10)], 100)
    assert settled < 0.01


def test_test_subset_is_spread_over_the_class_sorted_shard() -> None:
    labels = torch.arange(10).repeat_interleave(100)  # sorted by class, as the shared test shard is
    chosen = spread(len(labels), 50)
    assert torch.bincount(labels[chosen], minlength=10).tolist() == [5] * 10
    assert torch.equal(spread(7, None), torch.arange(7)) and torch.equal(spread(7, 9), torch.arange(7))


def test_probe_measures_state_growth_and_router_weights_on_real_models() -> None:
    torch.manual_seed(0)
    images = torch.randn(4, 3, 16, 16)
    kw = dict(embed_dim=24, num_heads=2, patch_size=8, img_size=16, num_classes=3)
    arms = {a.name: a for a in study_arms()}
    black = probe(srvit.create_model("bvit-ti", recursion=3, solver="blackbox", **kw).eval(), images,
                  Arm("b", "solver", "cifar10-bvit-ti", "bvit", {"recursion": 3}))
    euler = probe(srvit.create_model("bvit-ti", recursion=3, **kw).eval(), images,
                  Arm("e", "solver", "cifar10-bvit-ti", "bvit", {"recursion": 3}))
    assert len(black["state_norms"]) == 13 and len(black["direction_change"]) == 12  # run to 4x the horizon
    # z + F(z) = 2z + r(LN z): at initialisation (small residual branches) the norm doubles every step
    ratios = [b / a for a, b in zip(black["state_norms"][1:], black["state_norms"][2:])]
    assert all(1.9 < r < 2.1 for r in ratios)
    assert all(0.9 < b / a < 1.1 for a, b in zip(euler["state_norms"], euler["state_norms"][1:]))
    routed = probe(srvit.create_model("srvit-ti", depth=2, recursion=3, fusion_mode="query", **kw).eval(), images,
                   arms["srvit-R4-query"])
    assert len(routed["router_weights"]) == 2 and all(sum(w) == pytest.approx(1.0) for w in routed["router_weights"])
    assert all(0 <= e <= math.log(3) + 1e-6 for e in routed["router_entropy"])


@pytest.mark.slow
def test_the_study_runs_end_to_end_at_a_tiny_budget(cifar10, tmp_path: Path) -> None:
    """Every arm x 2 seeds for 3 steps (a few minutes): report, plots and results.json are written."""
    from study_recursion import main

    runs, out = tmp_path / "runs", tmp_path / "report.md"
    data = str(Path(cifar10["train"]).parent)
    args = ["--data", data, "--runs", str(runs), "--out", str(out), "--steps", "3", "--seeds", "0,1",
            "--lr-grid", "1e-3", "--eval-images", "100", "--jobs", "1"]
    assert main(args) == 0
    text = out.read_text()
    assert "## Reading" in text and "- **Black-box field.**" in text
    assert {p.name for p in (tmp_path / "report").iterdir()} == {
        "fusion.png", "loss_curves.png", "results.json", "routers.png", "solver.png", "state_norms.png",
        "supervision.png"}
    assert main(args) == 0  # a rerun reuses every finished run


def test_logged_history_keeps_the_steps_of_an_interrupted_run(kodak_labelled, tmp_path: Path) -> None:
    """The study reads each run's history from TensorBoard: a run resumed from step 3 still has steps 1..6,
    and the recomputed steps 4..6 carry the values of the resumed invocation."""
    from study_recursion_measure import logged_history

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
    history = logged_history(run)
    assert [h["step"] for h in history] == [1, 2, 3, 4, 5, 6]
    for logged, live in zip(history[3:], resumed.history):
        assert logged["loss_final"] == pytest.approx(live["loss_final"], rel=1e-6)
        assert logged["fusion_entropy/block01"] == pytest.approx(live["fusion_entropy/block01"], rel=1e-6)
