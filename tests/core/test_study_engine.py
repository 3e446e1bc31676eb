"""The study engine end to end on a tiny spec (tests/core/study_tiny_spec.py) in a throw-away git repository:
``loopvae study`` runs it locally and through submitit's local executor with the same numbers, resumes after a
kill of its whole process group, and refuses a changed pre-registration or changed training code."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from looprun.study import RegistrationError, ResultStore, RunContext, load_study
from looprun.study import page as page_module
from looprun.study.engine import run_study
from looprun.study.executors import LocalPool
from looprun.study.page import render
from looprun.study.verdicts import divergent_seeds, null_rows, primary_family

SPEC = Path(__file__).with_name("study_tiny_spec.py")
LOOPVAE = [sys.executable, "-m", "loopvae"]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True,
                   capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with the tiny spec, its pre-registration and a stand-in for the training code, committed."""
    root = tmp_path / "repo"
    (root / "studies").mkdir(parents=True)
    shutil.copy(SPEC, root / "studies" / "tiny.py")
    (root / "docs" / "study_tiny").mkdir(parents=True)
    (root / "docs" / "study_tiny" / "preregistration.md").write_text(
        "## Pre-registration\n\nT1: tied − untied, paired by seed, seeds 0-2, margin 0.5 dB.\n")
    (root / "packages").mkdir()
    (root / "packages" / "model.py").write_text("WIDTH = 6\n")
    (root / "packages" / "tinycode").mkdir()  # a package the runs import from the code root's sources
    (root / "packages" / "tinycode" / "__init__.py").write_text("PASSES = 3\n")
    (root / "pyproject.toml").write_text('[tool.setuptools.packages.find]\nwhere = ["packages"]\n')
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "study")
    return root


def _study(repo: Path, *args: str, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LOOPVAE, "study", "tiny", "--root", str(repo), *args], capture_output=True, text=True,
                          timeout=300, **kwargs)


def _records(repo: Path) -> dict[str, dict]:
    return ResultStore(repo, "docs/study_tiny").all()


def _scores(repo: Path) -> dict[str, float]:
    return {k: r["metrics"]["score"] for k, r in _records(repo).items()}


def test_local_pool_runs_every_run_pins_the_registration_and_renders(repo: Path) -> None:
    proc = _study(repo, "--jobs", "2")
    assert proc.returncode == 0, proc.stderr
    records = _records(repo)
    assert sorted(records) == [f"{arm}-40-s{s}" for arm in ("tied", "untied") for s in range(3)]
    digest = json.loads((repo / "docs/study_tiny/plan.json").read_text())
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert digest["main_commit"] == head
    for r in records.values():
        assert r["status"] == "finished" and r["executor"] == "local"
        assert r["preregistration_sha256"] == digest["preregistration_sha256"]
        assert r["code"] == {"commit": head, "dirty": False}
        assert r["run_cpu_seconds"] > 0
        assert r["code_file"] == str(repo / "packages/tinycode/__init__.py")  # the code root's, on PYTHONPATH
    results = json.loads((repo / "docs/study_tiny/results.json").read_text())
    page = (repo / "docs/study_tiny.md").read_text()
    assert results["primaries"][0]["id"] == "T1" and f"**{results['primaries'][0]['verdict']}**" in page
    assert "T1: tied − untied, paired by seed" in page  # the pre-registration block, verbatim
    # a second invocation runs nothing and leaves every file as it was
    before = {p: p.read_bytes() for p in (repo / "docs/study_tiny/runs").iterdir()}
    again = _study(repo, "--jobs", "2")
    assert again.returncode == 0 and "0 run(s) ran" in again.stdout
    assert before == {p: p.read_bytes() for p in (repo / "docs/study_tiny/runs").iterdir()}
    # re-rendering from the result files alone reproduces the page byte for byte
    rendered = _study(repo, "--render-only")
    assert rendered.returncode == 0 and (repo / "docs/study_tiny.md").read_text() == page


def test_submitit_local_executor_gives_the_same_numbers(repo: Path, tmp_path: Path) -> None:
    remote = _study(repo, "--executor", "submitit-local", "--no-render")
    assert remote.returncode == 0, remote.stdout + remote.stderr
    records = _records(repo)
    assert {r["executor"] for r in records.values()} == {"submitit"} and len(records) == 6
    assert {r["code_file"] for r in records.values()} == {str(repo / "packages/tinycode/__init__.py")}
    assert (repo / "runs/study-tiny/submitit").is_dir()  # submitit's own job folder (pickled task, logs)
    study = load_study(repo / "studies" / "tiny.py")  # the same runs in this process: the executor changes nothing
    here = {p.id: study.run(p, RunContext(repo, tmp_path / p.id, {}))["metrics"]["score"] for p in study.grid()}
    assert _scores(repo) == here


def test_resumes_after_the_process_group_is_killed(repo: Path) -> None:
    proc = subprocess.Popen([*LOOPVAE, "study", "tiny", "--root", str(repo), "--jobs", "1", "--option", "sleep=1.5"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    runs = repo / "docs/study_tiny/runs"
    deadline = time.time() + 120
    while time.time() < deadline and len(list(runs.glob("*.json"))) < 2:
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the run in flight, mid-study
    proc.wait(timeout=30)
    survivors = {p.name: p.read_bytes() for p in runs.glob("*.json")}
    assert 2 <= len(survivors) < 6, sorted(survivors)
    assert all(json.loads(data)["status"] == "finished" for data in survivors.values())  # no half-written file
    resumed = _study(repo, "--jobs", "2")
    assert resumed.returncode == 0, resumed.stderr
    assert f"{6 - len(survivors)} run(s) ran" in resumed.stdout
    after = {p.name: p.read_bytes() for p in runs.glob("*.json")}
    assert len(after) == 6 and all(after[name] == data for name, data in survivors.items())


def test_refuses_a_changed_preregistration_and_changed_training_code(repo: Path) -> None:
    study = load_study(repo / "studies" / "tiny.py")
    pool = LocalPool(2, repo / "runs" / "study-tiny")
    run_study(study, pool, docs_root=repo, log=lambda _: None, only=["tied-40-s2", "untied-40-s0"])
    assert sorted(p.stem for p in (repo / "docs/study_tiny/runs").glob("*.json")) == ["tied-40-s2", "untied-40-s0"]
    run_study(study, pool, docs_root=repo, log=lambda _: None)
    (repo / "docs/study_tiny/runs/tied-40-s2.json").unlink()
    prereg = repo / "docs/study_tiny/preregistration.md"
    prereg.write_text(prereg.read_text().replace("margin 0.5 dB", "margin 1.0 dB"))
    _git(repo, "commit", "-qam", "widen the margin after the data")
    with pytest.raises(RegistrationError, match="preregistration.md differs from the pre-registration"):
        run_study(study, pool, docs_root=repo, log=lambda _: None)
    cli = _study(repo)
    assert cli.returncode == 2 and "loopvae study: error: " in cli.stderr and "preregistration.md differs" in cli.stderr
    assert "Traceback" not in cli.stderr
    _git(repo, "revert", "--no-edit", "HEAD")
    (repo / "packages/model.py").write_text("WIDTH = 7\n")
    with pytest.raises(RegistrationError, match="uncommitted changes"):
        run_study(study, pool, docs_root=repo, log=lambda _: None)
    _git(repo, "commit", "-qam", "change the model after the first runs")
    with pytest.raises(RegistrationError, match="differs from the study's pinned commit"):
        run_study(study, pool, docs_root=repo, log=lambda _: None)
    assert not (repo / "docs/study_tiny/runs/tied-40-s2.json").exists()


def test_a_failing_run_is_recorded_its_family_not_read_and_the_command_fails(repo: Path) -> None:
    study = load_study(repo / "studies" / "tiny.py")
    proc = _study(repo, "--jobs", "2", "--option", "fail=untied")
    assert proc.returncode == 1 and "6 run(s) ran, 3 failed" in proc.stdout, (proc.stdout, proc.stderr)
    assert (repo / "docs/study_tiny.md").is_file()  # rendered before the exit status: the failures are on it
    failed = _records(repo)["untied-40-s0"]
    assert failed["status"] == "failed" and "fails on purpose" in "\n".join(failed["error"])
    text, results = render(study, repo)
    assert results["primaries"] == [] and "untied@40 seed 0" in results["primaries_missing"]
    assert "failed: untied-40-s0, untied-40-s1, untied-40-s2" in text and "Not read yet" in text


def test_a_worker_that_dies_leaves_its_runs_missing_the_page_rendered_and_the_command_failed(repo: Path) -> None:
    proc = _study(repo, "--jobs", "2", "--option", "vanish=untied")
    assert proc.returncode == 1 and "6 run(s) ran, 3 failed" in proc.stdout, (proc.stdout, proc.stderr)
    assert "ended without a result file (untied-40-s0, untied-40-s1, untied-40-s2)" in proc.stdout
    assert "Traceback" not in proc.stderr
    text = (repo / "docs/study_tiny.md").read_text()
    assert "Runs with a result file: 3 of 6 planned; still to run: 3." in text and "Not read yet" in text


def test_a_record_that_cannot_make_a_row_is_named_with_its_file_and_key(repo: Path) -> None:
    store = ResultStore(repo, "docs/study_tiny")
    store.write("tied-40-s0", {"budget": "40", "seed": 0, "status": "finished", "metrics": {"score": 1.0}})
    proc = _study(repo, "--render-only")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "study_tiny/runs/tied-40-s0.json: the result record cannot make a row" in proc.stderr
    assert "(KeyError: 'arm')" in proc.stderr


def test_a_smoke_option_is_refused_in_the_study_own_results_and_recorded_elsewhere(repo: Path,
                                                                                    tmp_path: Path) -> None:
    proc = _study(repo, "--option", "scale=0.25")
    assert proc.returncode == 2 and "--option scale changes what a run of study 'tiny' measures" in proc.stderr
    assert not (repo / "docs/study_tiny/runs").exists()
    scratch = tmp_path / "smoke"
    (scratch / "docs/study_tiny").mkdir(parents=True)  # a scratch root carries the registration it runs under
    shutil.copy(repo / "docs/study_tiny/preregistration.md", scratch / "docs/study_tiny/preregistration.md")
    proc = _study(repo, "--option", "scale=0.25", "--only", "tied-40-s0", "--docs-root", str(scratch))
    assert proc.returncode == 0, proc.stderr
    record = json.loads((scratch / "docs/study_tiny/runs/tied-40-s0.json").read_text())
    assert record["options"] == {"scale": 0.25} and len(record["curve"]) == 1  # 10 steps: one curve point


def test_a_package_imported_from_outside_the_code_root_is_named(repo: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The main checkout's copy of a package the code root also holds (an editable install while the code root
    is a worktree of the pinned commit) is named, so the run fails instead of recording the wrong code."""
    from looprun.study.store import foreign_imports, source_env

    assert source_env(repo)["PYTHONPATH"].split(os.pathsep)[0] == str((repo / "packages").resolve())
    other = tmp_path / "main-checkout" / "tinycode"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("PASSES = 4\n")
    monkeypatch.syspath_prepend(str(other.parent))
    monkeypatch.delitem(sys.modules, "tinycode", raising=False)
    import tinycode

    assert foreign_imports(repo) == [f"tinycode: {tinycode.__file__}"]
    monkeypatch.setitem(sys.modules, "tinycode", type(sys)("tinycode"))  # a module without a file: not foreign
    assert foreign_imports(repo) == []


def test_a_run_under_another_preregistration_is_listed_and_kept_out_of_the_primaries(tmp_path: Path) -> None:
    study = load_study(SPEC)
    store = ResultStore(tmp_path, study.docs)
    store.docs.mkdir(parents=True)
    (store.docs / "preregistration.md").write_text("## Pre-registration\n\nT1, margin 0.5 dB.\n")
    digest = hashlib.sha256((store.docs / "preregistration.md").read_bytes()).hexdigest()
    for arm, seed in itertools.product(("tied", "untied"), range(3)):
        store.write(f"{arm}-40-s{seed}", {"arm": arm, "budget": "40", "seed": seed, "status": "finished",
                                          "metrics": {"score": 10.0 + seed + (arm == "tied") * 0.1 * seed},
                                          "preregistration_sha256": "0" * 64 if (arm, seed) == ("tied", 2)
                                          else digest})
    text, results = render(study, tmp_path, write=False)
    assert results["stale_registration"] == ["tied-40-s2"] and results["primaries"] == []
    assert "tied@40 seed 2" in results["primaries_missing"]
    assert "(these differ and are left out of the primaries: tied-40-s2)" in text


def test_a_primary_stays_unread_in_the_secondaries_until_its_whole_family_is(tmp_path: Path) -> None:
    """T1's runs are complete, T2's are not: the secondaries table must not print T1's difference early (the
    family is read whole); once T2's runs are in, it does."""
    import dataclasses

    from looprun.study import Budget, Comparison

    base = load_study(SPEC)
    study = dataclasses.replace(base, budgets=[*base.budgets, Budget("80", seeds=(0, 1, 2), steps=80)],
                                primaries=[*base.primaries, Comparison("T2", "tied@80", "untied@80")],
                                preregistration=None, sections=[page_module.secondaries])
    store = ResultStore(tmp_path, study.docs)

    def write(arm: str, budget: str, seed: int, score: float) -> None:
        store.write(f"{arm}-{budget}-s{seed}", {"arm": arm, "budget": budget, "seed": seed, "status": "finished",
                                                "metrics": {"score": score}})

    for seed in range(3):
        write("tied", "40", seed, 10.0 + seed)
        write("untied", "40", seed, 10.5 + seed + 0.1 * seed)
    text, _ = render(study, tmp_path, write=False)
    assert "| T1: tied − untied | waiting |" in text and "| S1: " in text and "S1: untied − tied (the same contrast " \
        "reversed) | waiting" not in text
    for seed in range(3):
        write("tied", "80", seed, 11.0 + seed)
        write("untied", "80", seed, 11.0 + seed)
    text, _ = render(study, tmp_path, write=False)
    assert "| T1: tied − untied | -0.60 [" in text


def test_dry_run_plans_with_an_estimate_and_trains_nothing(repo: Path) -> None:
    proc = _study(repo, "--dry-run", "--jobs", "2")
    assert proc.returncode == 0, proc.stderr
    assert "6 run(s) planned, 6 to run" in proc.stdout and "tied-40-s0" in proc.stdout
    assert not (repo / "docs/study_tiny/runs").exists()


# -- the rules, on rows ----------------------------------------------------------------------------------
def _row(arm: str, seed: int, score: float, units: dict[str, float] | None = None) -> dict:
    return {"arm": arm, "budget": "40", "seed": seed, "score": score, "per_unit": {"score": units or {}}}


def test_null_rows_count_each_distinct_seed_pair_once() -> None:
    units = {s: {f"x{i}": float(i + s) + 0.01 * ((i * s) % 3) for i in range(5)} for s in range(3)}
    rows = [_row("tied", s, 1.0, units[s]) for s in range(3)]
    got = null_rows(rows, "score")
    assert [tuple(r["seeds"]) for r in got] == [(0, 1), (0, 2), (1, 2)]
    assert got[0]["diff"] == pytest.approx(sum(units[0][k] - units[1][k] for k in units[0]) / 5)


def test_primaries_wait_for_the_whole_family_and_divergence_uses_the_rule(repo: Path) -> None:
    study = load_study(repo / "studies" / "tiny.py")
    rows = [_row("tied", s, 10.0 + s) for s in range(3)] + [_row("untied", s, 9.0 + s) for s in range(2)]
    prims, missing = primary_family(study, rows)
    assert prims == [] and missing == ["untied@40 seed 2"]
    rows.append(_row("untied", 2, 11.5))
    prims, _ = primary_family(study, rows)
    assert prims[0]["diff"] == pytest.approx((1 + 1 + 0.5) / 3) and prims[0]["test"] == "paired t"
    values = {"a@40": {0: 1.0, 1: 1.1, 2: 4.0, 3: 1.05, 4: 0.95}, "b@40": {0: 1.0, 1: 1.2, 2: 1.1}}
    flagged = divergent_seeds(values, study.rules)
    assert [(f["group"], f["seed"]) for f in flagged] == [("a@40", 2)]
    assert flagged[0]["threshold"] == pytest.approx(1.0)  # max(floor 0.5, 5 x b's spread 0.2)


def test_a_primary_reads_in_its_preregistered_words_and_unknown_words_are_refused(repo: Path) -> None:
    """The tiny spec's T1 (margin 0.5) with the words a pre-registration wrote: the page, the note under the
    table and the results say them; a word for a verdict the comparison cannot reach is an error naming it."""
    import dataclasses

    from looprun.study import Comparison

    words = {"within margin": "tying costs < 0.5", "worse": "tying costs", "better": "tying better",
             "worse, within margin": "tying costs, less than 0.5"}
    base = load_study(repo / "studies" / "tiny.py")
    study = dataclasses.replace(base, primaries=[dataclasses.replace(base.primaries[0], words=words)])
    noise = (-0.1, 0.05, -0.05)  # tied − untied per seed: an interval around 0, well inside the margin
    rows = [_row("tied", s, 10.0 + s + noise[s]) for s in range(3)] + [_row("untied", s, 10.0 + s) for s in range(3)]
    (prim,), _ = primary_family(study, rows)
    assert prim["verdict"] == "tying costs < 0.5" and prim["ci"][0] > -0.5 and prim["ci"][1] > 0
    with pytest.raises(ValueError, match=r"'T9': words for verdicts it cannot reach: \['within margin'\]"):
        Comparison("T9", "tied@40", "untied@40", words={"within margin": "x"})  # no margin: it cannot read so
    page = page_module.Page(study, ResultStore(repo, study.docs), {}, rows, [], primaries=[prim])
    text = "\n".join(page_module.primaries(page))
    assert "**tying costs < 0.5** |" in text and "both = *tying costs, less than 0.5*" in text


def test_the_study_command_reports_errors_in_one_line_and_imports_no_torch(repo: Path) -> None:
    code = ("import sys; from loopvae.cli import main; rc = main(['study', '--list', '--root', sys.argv[1]]); "
            "print('torch' in sys.modules, rc)")
    listed = subprocess.run([sys.executable, "-c", code, str(repo)], capture_output=True, text=True, timeout=120)
    assert listed.stdout.split() == ["tiny", "False", "0"], listed.stdout + listed.stderr
    missing = _study(repo.parent / "nowhere")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.startswith("loopvae study: error: no study 'tiny'")
