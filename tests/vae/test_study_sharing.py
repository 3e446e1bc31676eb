"""The sharing study's page and results.json, rendered from synthetic result files: every primary is recomputed
from results.json alone, the family is read only when complete, and the pre-registered rules decide verdicts."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import study_sharing as ss  # noqa: E402
import study_sharing_report as report  # noqa: E402

from looprun.statistics import Primary, margin_family, paired_difference  # noqa: E402

PARAMS = {"global": 350535, "scale": 650823, "none": 1251399, "dcae": 1234491}


def _run(arm: str, steps: int, seed: int, psnr: float) -> dict:
    images = [{"key": f"k{i}", "shard": "imagenet-holdout-000000.tar", "psnr": psnr + 0.1 * (i % 3 - 1),
               "ssim": 0.8 + psnr / 1000, "bicubic_psnr": 25.0} for i in range(40)]
    kodak = [{"key": f"kodim2{i}", "shard": "kodak-val-000000.tar", "psnr": psnr - 1, "ssim": 0.7,
              "bicubic_psnr": 24.0} for i in range(1, 5)]
    return {"phase": "main", "arm": arm, "lr": 2e-3 if arm != "dcae" else None, "steps": steps, "seed": seed,
            "name": f"main-{arm}-{steps}-s{seed}", "status": "finished", "recipe": ["lr=2.00e-03"],
            "train_seconds": steps * 0.5, "code": {"commit": "abc"},
            "preregistration_sha256": ss.preregistration_hash(),
            "curve": [{"step": steps, "images_seen": steps * 8, "train_seconds": steps * 0.5, "psnr": psnr,
                       "ssim": 0.8}],
            "evaluation": {"arch": {"params": PARAMS[arm], "gmacs": 7.23}, "imagenet": images, "kodak": kodak}}


def _docs(tmp_path: Path, offsets: dict[str, float], skip: set[str] = frozenset()) -> Path:
    docs = tmp_path / "study_sharing"
    (docs / "runs").mkdir(parents=True)
    shutil.copy(ROOT / "docs/study_sharing/preregistration.md", docs / "preregistration.md")
    plan = [(a, ss.SHORT, s) for s in ss.SHORT_SEEDS for a in ss.SHARING]
    plan += [(a, ss.LONG, s) for s in ss.LONG_SEEDS for a in ("global", "none", "dcae")]
    for arm, steps, seed in plan:
        name = f"main-{arm}-{steps}-s{seed}"
        if name in skip:
            continue
        psnr = 27.0 + offsets[f"{arm}@{steps}"] + 0.05 * seed * (1 if arm == "global" else 0.5)
        (docs / "runs" / f"{name}.json").write_text(json.dumps(_run(arm, steps, seed, psnr)))
    return docs


def test_page_and_results_recompute_from_results_json(tmp_path: Path) -> None:
    offsets = {"global@1500": -0.05, "scale@1500": 0.0, "none@1500": 0.0, "global@4500": 1.0, "none@4500": 1.3,
               "dcae@4500": 1.8}
    docs = _docs(tmp_path, offsets)
    page = tmp_path / "study_sharing.md"
    results = report.render(docs, page)
    text = page.read_text()
    assert "## Pre-registration" in text and "Runs finished: 24 of 24" in text
    saved = json.loads((docs / "results.json").read_text())
    assert [p["id"] for p in saved["primaries"]] == ["Q1", "Q2", "P2-long"]
    assert {r["arm"] for r in saved["runs"]} == {"global", "scale", "none", "dcae"}
    assert all(len(r["per_image"]) == 40 for r in saved["runs"])
    # recompute the family from results.json alone: per-seed means of the per-image numbers
    by = {}
    for r in saved["runs"]:
        by.setdefault(f"{r['arm']}@{r['steps']}", {})[r["seed"]] = sum(i["psnr"] for i in r["per_image"]) / 40
    prims = [Primary(p["id"], paired_difference([by[p["a"]][s] for s in sorted(by[p["a"]])],
                                                [by[p["b"]][s] for s in sorted(by[p["b"]])]), p["margin"])
             for p in saved["primaries"]]
    margin_family(prims)
    for ours, theirs in zip(prims, saved["primaries"], strict=True):
        assert ours.diff.mean == pytest.approx(theirs["diff"]) and ours.verdict == theirs["verdict"]
        assert ours.p_holm == pytest.approx(theirs["p_holm"])
    q1, q2, p2 = saved["primaries"]
    assert q1["margin"] == 0.2 and p2["margin"] is None
    # Q1: global is 0.05 dB behind with a slope over seeds -> a tight interval inside the margin
    assert q1["ci"][0] > -0.2 and "within margin" in q1["verdict"]
    assert q2["diff"] == pytest.approx(-0.3 + 0.025, abs=0.05)
    assert results["primaries"] == saved["primaries"]
    assert (docs / "curves.png").is_file() and "72%" in text


def test_an_incomplete_family_gets_no_verdict(tmp_path: Path) -> None:
    offsets = {k: 0.0 for k in ("global@1500", "scale@1500", "none@1500", "global@4500", "none@4500", "dcae@4500")}
    docs = _docs(tmp_path, offsets, skip={"main-dcae-4500-s2"})
    results = report.render(docs, tmp_path / "page.md")
    assert results["primaries"] == [] and "main-dcae-4500-s2" in results["missing"]
    assert "dcae@4500 seed 2" in (tmp_path / "page.md").read_text()


def test_lr_grid_extends_past_an_edge_pick(tmp_path: Path) -> None:
    import study_fair as sf

    sf.DOCS, sf.RESULTS = tmp_path, tmp_path / "runs"
    sf.RESULTS.mkdir()

    def write(lr: float, psnr: float) -> None:
        (sf.RESULTS / f"{ss.lr_run_name('none', lr)}-s0.json").write_text(
            json.dumps({"status": "finished", "curve": [{"psnr": psnr}]}))

    for lr, v in ((1e-3, 25.0), (2e-3, 25.3), (4e-3, 25.6)):
        write(lr, v)
    assert ss.lr_grid("none") == [1e-3, 2e-3, 4e-3, 8e-3] and ss.lr_pick("none") is None
    write(8e-3, 25.5)
    assert ss.lr_pick("none") == 4e-3
    assert [p.arm.name for p in ss.plan_lrcheck() if "none" in p.arm.name][-1] == "lr-none-8e-3-s0"
