"""The sharing study's spec (studies/sharing.py): its page and results.json rendered by the engine from synthetic
result files in the old driver's format: every primary is recomputed from results.json alone, the family is read
only when complete, the pre-registered rules decide the verdicts, and the lr grid extends past an edge pick."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from looprun.statistics import Primary, margin_family, paired_difference
from looprun.study import load_study
from looprun.study.page import render

ROOT = Path(__file__).resolve().parents[2]
STUDY = load_study("sharing", ROOT)
PARAMS = {"global": 350535, "scale": 650823, "none": 1251399, "dcae": 1234491}


def _run(arm: str, steps: int, seed: int, psnr: float) -> dict:
    images = [{"key": f"k{i}", "shard": "imagenet-holdout-000000.tar", "psnr": psnr + 0.1 * (i % 3 - 1),
               "ssim": 0.8 + psnr / 1000, "bicubic_psnr": 25.0} for i in range(40)]
    kodak = [{"key": f"kodim2{i}", "shard": "kodak-val-000000.tar", "psnr": psnr - 1, "ssim": 0.7,
              "bicubic_psnr": 24.0} for i in range(1, 5)]
    return {"phase": "main", "arm": arm, "lr": 2e-3 if arm != "dcae" else None, "steps": steps, "seed": seed,
            "name": f"main-{arm}-{steps}-s{seed}", "status": "finished", "recipe": ["lr=2.00e-03"],
            "train_seconds": steps * 0.5, "code": {"commit": "abc"},
            "curve": [{"step": steps, "images_seen": steps * 8, "train_seconds": steps * 0.5, "psnr": psnr,
                       "ssim": 0.8}],
            "evaluation": {"arch": {"params": PARAMS[arm], "gmacs": 7.23}, "imagenet": images, "kodak": kodak}}


def _root(tmp_path: Path, offsets: dict[str, float], skip: frozenset[str] = frozenset()) -> Path:
    docs = tmp_path / "docs/study_sharing"
    (docs / "runs").mkdir(parents=True)
    shutil.copy(ROOT / "docs/study_sharing/preregistration.md", docs / "preregistration.md")
    for path in (ROOT / "docs/study_sharing/runs").glob("lr-*.json"):  # the committed lr check: picks 2e-3
        shutil.copy(path, docs / "runs" / path.name)
    plan = [(a, 1500, s) for s in range(5) for a in ("global", "scale", "none")]
    plan += [(a, 4500, s) for s in range(3) for a in ("global", "none", "dcae")]
    for arm, steps, seed in plan:
        name = f"main-{arm}-{steps}-s{seed}"
        if name not in skip:
            psnr = 27.0 + offsets[f"{arm}@{steps}"] + 0.05 * seed * (1 if arm == "global" else 0.5)
            (docs / "runs" / f"{name}.json").write_text(json.dumps(_run(arm, steps, seed, psnr)))
    return tmp_path


def test_page_and_results_recompute_from_results_json(tmp_path: Path) -> None:
    offsets = {"global@1500": -0.05, "scale@1500": 0.0, "none@1500": 0.0, "global@4500": 1.0, "none@4500": 1.3,
               "dcae@4500": 1.8}
    root = _root(tmp_path, offsets)
    text, results = render(STUDY, root)
    assert "## Pre-registration" in text and "Runs with a result file: 33 of 33 planned." in text
    saved = json.loads((root / "docs/study_sharing/results.json").read_text())
    assert [p["id"] for p in saved["primaries"]] == ["Q1", "Q2", "P2-long"]
    assert {r["arm"] for r in saved["runs"]} == {"global", "scale", "none", "dcae"}
    contract = {"arm", "seed", "steps", "psnr", "ssim", "train_seconds", "per_image"}  # the runs fields
    assert all(contract <= set(r) and len(r["per_image"]) == 40 for r in saved["runs"])
    # recompute the family from results.json alone: per-seed means of the per-image numbers
    by: dict[str, dict[int, float]] = {}
    for r in saved["runs"]:
        by.setdefault(f"{r['arm']}@{r['steps']}", {})[r["seed"]] = sum(i["psnr"] for i in r["per_image"]) / 40
    prims = [Primary(p["id"], paired_difference([by[p["a"]][s] for s in sorted(by[p["a"]])],
                                                [by[p["b"]][s] for s in sorted(by[p["b"]])]), p["margin"])
             for p in saved["primaries"]]
    margin_family(prims)
    for ours, theirs, spec in zip(prims, saved["primaries"], STUDY.primaries, strict=True):
        assert ours.diff.mean == pytest.approx(theirs["diff"]) and spec.word(ours.verdict) == theirs["verdict"]
        assert ours.p_holm == pytest.approx(theirs["p_holm"])
    q1, q2, p2 = saved["primaries"]
    assert q1["margin"] == 0.2 and p2["margin"] is None
    # Q1: global is 0.05 dB behind with a slope over seeds -> a tight interval inside the margin
    # in the pre-registration's words: "sharing costs < 0.2 dB" (or, with the upper bound below 0 too, "sharing
    # costs, less than 0.2 dB")
    assert q1["ci"][0] > -0.2 and q1["verdict"] in ("sharing costs < 0.2 dB", "sharing costs, less than 0.2 dB")
    assert q2["diff"] == pytest.approx(-0.3 + 0.025, abs=0.05)
    assert results["primaries"] == saved["primaries"]
    assert (root / "docs/study_sharing/curves.png").is_file() and "72%" in text
    # 3 groups x 10 seed pairs at 1,500 steps + 3 x 3 at 4,500: each distinct pair once
    assert text.count("| global@1500 | ") == 10 and "of 39 distinct seed pairs" in text


def test_an_incomplete_family_gets_no_verdict(tmp_path: Path) -> None:
    offsets = dict.fromkeys(("global@1500", "scale@1500", "none@1500", "global@4500", "none@4500", "dcae@4500"), 0.0)
    root = _root(tmp_path, offsets, skip=frozenset({"main-dcae-4500-s2"}))
    text, results = render(STUDY, root)
    assert results["primaries"] == [] and "main-dcae-4500-s2" in results["missing"]
    assert "dcae@4500 seed 2" in text and "still to run: 1." in text


def test_lr_grid_extends_past_an_edge_pick() -> None:
    import sharing

    records: dict[str, dict] = {}

    def write(lr: float, psnr: float) -> None:
        records[f"lr-none-{sharing.lr_tag(lr)}-s0"] = {"status": "finished", "curve": [{"psnr": psnr}]}

    for lr, v in ((1e-3, 25.0), (2e-3, 25.3), (4e-3, 25.6)):
        write(lr, v)
    assert sharing.lr_grid("none", records) == [1e-3, 2e-3, 4e-3, 8e-3] and sharing.lr_pick("none", records) is None
    write(8e-3, 25.5)
    assert sharing.lr_pick("none", records) == 4e-3
    assert [p.id for p in sharing.plan_lrcheck(STUDY, records) if p.arm == "none"][-1] == "lr-none-8e-3-s0"
    planned = sharing.plan_main(STUDY, records)
    none = [p for p in planned if p.arm == "none"]
    assert none and all(p.settings["lr"] == 4e-3 for p in none)  # the pick feeds every seeded run
    assert not [p for p in planned if p.arm == "global"]  # global's check is not complete here: not plannable
