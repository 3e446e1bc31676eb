"""The SR-ViT depth study's spec (studies/srvit_depth.py) on synthetic result files: the pilot's projection takes
the pre-registered fall-backs in their order, the plan follows it, P1 is read paired by seed over the planned seeds,
and results.json has the contract's fields (primary, runs with arm / seed / epochs / top1 / curve / train_seconds)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from looprun.statistics import paired_difference
from looprun.study import load_study
from looprun.study.page import render

ROOT = Path(__file__).resolve().parents[2]
STUDY = load_study("srvit-depth", ROOT)


def _pilot(r1_epoch: float, r4_epoch: float, test: float = 30.0) -> dict:
    return {"id": "pilot", "phase": "pilot", "arm": "pilot", "budget": "pilot", "seed": 0, "status": "finished",
            "arms": {"R1": {"train_epoch_cpu_seconds": r1_epoch, "test_pass_cpu_seconds": test},
                     "R4": {"train_epoch_cpu_seconds": r4_epoch, "test_pass_cpu_seconds": 3 * test}}}


def _run(arm: str, budget: str, seed: int, top1: float, epochs: int = 60) -> dict:
    curve = [{"epoch": e, "top1": top1 - (epochs - e) / 10} for e in range(10, epochs + 1, 10)]
    router = {"router_entropy": 1.2 + seed / 100, "router_entropy_blocks": [1.1, 1.3 + seed / 50]} \
        if arm == "R4" else {}
    train_curve = [{"epoch": e, "loss": 2.0 - e / 60, "train_top1": 20.0 + e / 2 + seed, **router}
                   for e in range(1, epochs + 1)]
    return {"id": f"{arm}-{budget}-s{seed}", "phase": "checks" if budget != "60" else "main", "arm": arm,
            "budget": budget, "seed": seed, "status": "finished", "epochs": epochs, "top1": top1, "curve": curve,
            "train_seconds": 1000.0 + seed, "run_cpu_seconds": 1100.0, "train_curve": train_curve}


def test_the_projection_takes_the_fall_backs_in_the_registered_order() -> None:
    import srvit_depth as sd

    fits = sd.projection({"pilot": _pilot(20, 70)})
    assert fits["keep"] == {"depth6": True, "epochs120": True, "seed4": True}
    assert fits["core_hours"] == pytest.approx(5 * (60 * 90 + 6 * 120) / 3600)  # 6 test passes a run
    tight = sd.projection({"pilot": _pilot(20, 120)})  # core ~12.2 job-hours: every fall-back, seed 4 last
    assert tight["keep"] == {"depth6": False, "epochs120": False, "seed4": False}
    middle = sd.projection({"pilot": _pilot(20, 85)})  # drops the depth check only
    assert middle["keep"] == {"depth6": False, "epochs120": True, "seed4": True}
    assert sd.projection({}) is None
    records = {"pilot": _pilot(20, 120)}
    assert {p.seed for p in sd.plan_main(STUDY, records)} == {0, 1, 2, 3}
    assert sd.plan_checks(STUDY, records) == [] and sd.plan_main(STUDY, {}) == []
    plan = sd.plan_main(STUDY, {"pilot": _pilot(20, 70)}) + sd.plan_checks(STUDY, {"pilot": _pilot(20, 70)})
    assert len(plan) == 10 + 1 + 3 and {p.id for p in plan} >= {"R4-60-s4", "R1-120-s0", "R1-depth6-60-check-s2"}


def test_page_and_results_json_follow_the_contract(tmp_path: Path) -> None:
    docs = tmp_path / "docs/study_srvit_depth"
    (docs / "runs").mkdir(parents=True)
    shutil.copy(ROOT / "docs/study_srvit_depth/preregistration.md", docs)
    records = {"pilot": _pilot(20, 120)}  # seed 4 dropped by the pilot: P1 at n = 4
    r1 = {s: 40.0 + s for s in range(4)}
    r4 = {s: 40.5 + s + 0.1 * s * s for s in range(4)}
    for s in range(4):
        records[f"R1-60-s{s}"] = _run("R1", "60", s, r1[s])
        records[f"R4-60-s{s}"] = _run("R4", "60", s, r4[s])
    for name, record in records.items():
        (docs / "runs" / f"{name}.json").write_text(json.dumps(record))
    text, results = render(STUDY, tmp_path)
    expected = paired_difference([r4[s] for s in range(4)], [r1[s] for s in range(4)])
    primary = results["primary"]
    assert set(primary) == {"id", "a", "b", "diff", "ci", "n", "p", "verdict"} and primary["n"] == 4
    assert primary["diff"] == pytest.approx(expected.mean) and primary["verdict"] == "better"
    assert primary["ci"] == pytest.approx([expected.low, expected.high])
    assert [(r["arm"], r["seed"]) for r in results["runs"]] == [("R1", s) for s in range(4)] + [("R4", s)
                                                                                                 for s in range(4)]
    assert set(results["runs"][0]) == {"arm", "seed", "epochs", "top1", "curve", "train_seconds", "train_curve"}
    assert results["runs"][0]["curve"][0] == {"epoch": 10, "top1": 35.0}
    assert "after the fall-backs taken (depth6, epochs120, seed4)" in text and "**better**" in text
    # training curves every 10 epochs: R1 / R4 loss and training top-1 over seeds, R4's router entropy and the
    # blocks' range (seeds 0-3: entropy 1.2 + s / 100, blocks 1.1 and 1.3 + s / 50)
    assert "| 60 | 1.000 ± 0.000 | 51.5 ± 1.3 | 1.000 ± 0.000 | 51.5 ± 1.3 | 1.215 ± 0.013 (1.100–1.360) |" in text
    assert "Mean ± sd over seeds; CPU-s per run: the trainer's own counter" in text
    assert "| R1 (`last`, 12 blocks), 60 | 4 | 40.00 / 41.00 / 42.00 / 43.00 | 41.50 ± 1.29 | 1002 ± 1 |" in text
    assert "reproduces at CPU scale" in text and "## The gap over training" in text
    assert "| 60 | 41.50 ± 1.29 |" in text and "waiting for P1" not in text  # P1 read: its row is shown


def test_a_run_whose_trainer_did_not_finish_is_not_a_result(tmp_path: Path, monkeypatch) -> None:
    """srvit train stopped by a signal (exit 0, stopped_by set) or without its final test pass: the run raises (the
    engine records it failed, naming how to resume) instead of recording a mid-training top-1 as P1 data."""
    import srvit_depth as sd

    from looprun.study import RunContext

    planned = next(p for p in STUDY.grid("main") if p.id == "R1-60-s0")
    context = RunContext(root=ROOT, workdir=tmp_path / "R1-60-s0", options={"steps_per_epoch": 78, "train": "t",
                                                                           "test": "v"})
    context.workdir.mkdir()
    monkeypatch.setattr(sd, "_srvit", lambda *calls: [0.0] * len(calls))
    summary = {"step": 780, "total_steps": 4680, "stopped_by": "SIGTERM", "train_seconds": 900.0,
               "validation": [{"step": 780, "top1": 0.3}]}
    (context.workdir / "train_summary.json").write_text(json.dumps(summary))
    with pytest.raises(RuntimeError, match=r"ended at step 780 of 4680 \(stopped by SIGTERM\).*--retry-failed"):
        sd.run(planned, context)
    summary.update(step=4680, stopped_by=None)  # complete, but the last test pass is not the final step's
    (context.workdir / "train_summary.json").write_text(json.dumps(summary))
    with pytest.raises(RuntimeError, match="without the final test pass"):
        sd.run(planned, context)


def _render(tmp_path: Path, records: dict[str, dict]) -> tuple[str, dict]:
    docs = tmp_path / "docs/study_srvit_depth"
    (docs / "runs").mkdir(parents=True)
    shutil.copy(ROOT / "docs/study_srvit_depth/preregistration.md", docs)
    for name, record in records.items():
        (docs / "runs" / f"{name}.json").write_text(json.dumps(record))
    return render(STUDY, tmp_path)


def _gap_rows(text: str) -> list[str]:
    section = text.split("## The gap over training")[1].split("\n## ")[0]
    return [line for line in section.splitlines() if line.startswith("| ") and line[2].isdigit()]


def test_the_gap_table_holds_p1s_row_until_p1_is_read(tmp_path: Path) -> None:
    """Seeds 0-2 of both arms finished, seed 3 of R1 not: P1's family is incomplete, so the final epoch's row
    (P1's difference on the seeds so far) waits; the earlier, descriptive rows are shown."""
    records = {"pilot": _pilot(20, 120)}  # P1 at seeds 0-3
    for s in range(3):
        records[f"R1-60-s{s}"] = _run("R1", "60", s, 40.0 + s)
        records[f"R4-60-s{s}"] = _run("R4", "60", s, 41.0 + s)
    records["R4-60-s3"] = _run("R4", "60", 3, 44.0)
    text, results = _render(tmp_path, records)
    assert results["primary"] is None
    rows = _gap_rows(text)
    assert [r.split("|")[1].strip() for r in rows] == ["10", "20", "30", "40", "50", "60"]
    assert rows[-1].count("waiting for P1") == 3 and "1.00 ±" not in rows[-1]
    assert all("waiting" not in r for r in rows[:-1])
    assert "P1 is not read yet" in text


def _worse_study(rise_120: float, depth_gap: float, pilot: dict | None = None) -> dict[str, dict]:
    """R4 below R1 on every seed (P1 *worse*); R1 seed 0 at 120 epochs ``rise_120`` points above its 60-epoch
    top-1; R1 at depth 6 ``depth_gap`` (+ 0.2 seed) points below depth 12 on seeds 0-2."""
    records = {"pilot": pilot or _pilot(20, 70)}  # everything fits: both checks planned
    for s in range(5):
        records[f"R1-60-s{s}"] = _run("R1", "60", s, 40.0 + s)
        records[f"R4-60-s{s}"] = _run("R4", "60", s, 38.0 + s - 0.1 * s * s)
    if pilot is None:
        records["R1-120-s0"] = _run("R1", "120", 0, 40.0 + rise_120, epochs=120)
        for s in range(3):
            records[f"R1-depth6-60-check-s{s}"] = _run("R1-depth6", "60-check", s, 40.0 + s - depth_gap - 0.2 * s)
    return records


def test_a_worse_p1_is_evidence_only_with_every_validity_check_passing(tmp_path: Path) -> None:
    text, results = _render(tmp_path / "pass", _worse_study(rise_120=0.5, depth_gap=3.0))
    assert results["primary"]["verdict"] == "worse"
    assert "(a) R1 seed 0: 40.00% at 60 epochs, 40.50% at 120 (+0.50 points)" in text and "(passes)" in text
    assert "this regime rewards depth" in text
    conclusion = text.split("## Conclusion")[1]
    assert "this is evidence that the trend does not transfer" in conclusion and "Uninformative" not in conclusion


@pytest.mark.parametrize("rise_120, depth_gap, why", [
    (2.0, 3.0, "here (a) failed."),  # 60 epochs is still early
    (0.5, 0.0, "here (b) failed."),  # depth 6 as good as depth 12: the interval does not lie above 0
    (2.0, 0.0, "here (a) failed, (b) failed."),
])
def test_a_worse_p1_with_a_failed_validity_check_is_uninformative(tmp_path: Path, rise_120: float,
                                                                   depth_gap: float, why: str) -> None:
    text, results = _render(tmp_path, _worse_study(rise_120, depth_gap))
    assert results["primary"]["verdict"] == "worse"
    conclusion = text.split("## Conclusion")[1]
    assert "Uninformative under the pre-registered rule" in conclusion and why in conclusion
    assert "is evidence" not in conclusion


def test_a_worse_p1_with_checks_dropped_or_pending_is_uninformative(tmp_path: Path) -> None:
    # the pilot's fall-backs dropped both checks (P1 at n = 4)
    text, results = _render(tmp_path / "dropped", _worse_study(0.0, 0.0, pilot=_pilot(20, 120)))
    assert results["primary"]["verdict"] == "worse" and results["primary"]["n"] == 4
    assert "here (a) was dropped by the pilot's fall-backs, (b) was dropped by the pilot's fall-backs." in text
    assert "- (a) R1 seed 0 at 60 and 120 epochs: dropped by the pilot's fall-backs." in text
    # both checks planned, not yet run: P1 is read, the verdict waits on the checks
    records = _worse_study(0.5, 3.0)
    del records["R1-120-s0"]
    text, _ = _render(tmp_path / "pending", records)
    assert "here (a) has not run yet." in text and "is evidence" not in text.split("## Conclusion")[1]


@pytest.mark.slow
def test_smoke_run_of_every_phase_through_the_engine(tmp_path: Path, cifar10: dict[str, str]) -> None:
    """pilot -> main -> checks with 3 training steps per run (about 3 CPU-minutes): every run finishes, the page
    reads P1 and the checks, and a second invocation runs nothing."""
    import subprocess
    import sys

    docs = tmp_path / "docs/study_srvit_depth"
    docs.mkdir(parents=True)
    shutil.copy(ROOT / "docs/study_srvit_depth/preregistration.md", docs)
    cmd = [sys.executable, "-m", "loopvae", "study", "srvit-depth", "--root", str(ROOT), "--docs-root", str(tmp_path),
           "--workdir", str(tmp_path / "work"), "--option", "smoke_steps=3",
           "--option", f"shared={Path(cifar10['train']).parents[1]}"]
    first = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "15 run(s) ran, 0 failed" in first.stdout  # the pilot, 10 seeded runs, 4 checks
    results = json.loads((docs / "results.json").read_text())
    assert results["primary"]["n"] == 5 and len(results["runs"]) == 10 and len(results["checks"]) == 4
    assert all(r["curve"] and r["train_seconds"] > 0 for r in results["runs"])
    # the curves from the trainer's own logs: R4's router entropy for each of its 12 blocks, near ln 4 this early
    r4 = next(r for r in results["runs"] if r["arm"] == "R4")["train_curve"][0]
    assert r4["epoch"] == 1 and r4["loss"] > 0 and len(r4["router_entropy_blocks"]) == 12
    assert r4["router_entropy"] == pytest.approx(1.386, abs=0.05)
    assert results["pilot"]["keep"] and "side by side, both at once" in (tmp_path / "docs/study_srvit_depth.md"
                                                                         ).read_text()
    again = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert again.returncode == 0 and "0 run(s) ran" in again.stdout
