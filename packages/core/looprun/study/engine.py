"""Plan, run and resume a study: one result file per run, registered phases pinned, runs through an executor.

:func:`run_study` goes phase by phase. A phase plans its runs from the result files so far, and the runs without
a file are dispatched to the executor (:mod:`looprun.study.executors`); the phase is planned again until it plans
nothing new (an lr grid extended past an edge pick grows this way). Before a registered phase's first run the
pre-registration and the training code are checked against ``plan.json`` (:func:`looprun.study.store.registration`),
and every run records the pre-registration's hash, the code version and its measured CPU-seconds.
"""

from __future__ import annotations

import resource
import statistics
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from looprun.study.spec import PlannedRun, RunContext, Study, load_study
from looprun.study.store import ResultStore, code_version, file_sha256, foreign_imports, registration


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def execute_run(task: dict[str, Any]) -> dict[str, Any]:
    """Run one planned run and write its result file; returns ``{id, status}``. Used by every executor (its
    arguments are plain data so that it pickles to a cluster node). An exception in the study's run function is
    a *failed* run (its record keeps the traceback's tail); a run function may also return its own ``status``
    (e.g. ``"refused"``: measured, but kept out of a release), which counts as not finished. A kill leaves no
    file, so the run reruns next time."""
    study = load_study(task["study_file"])
    planned = PlannedRun.from_dict(task["run"])
    store = ResultStore(Path(task["docs_root"]), task["docs"])
    code_root = Path(task["code_root"])
    context = RunContext(code_root, Path(task["workdir"]) / planned.id, dict(task.get("options", {})))
    context.workdir.mkdir(parents=True, exist_ok=True)
    if study.run is None:
        raise RuntimeError(f"study {study.name!r} has no run function: its results come from elsewhere "
                           "(render it with --render-only)")
    wall0, cpu0 = time.time(), _cpu_seconds()
    try:
        if foreign := foreign_imports(code_root):  # the recorded code version would not be the code that ran
            raise RuntimeError(f"this process imports code from outside the study's code root {code_root}: "
                               f"{'; '.join(foreign)}; run with that checkout's source folders on PYTHONPATH "
                               "(the local pool and submitit executors set it)")
        measured, status = study.run(planned, context), "finished"
    except Exception:
        measured, status = {"error": traceback.format_exc().splitlines()[-12:]}, "failed"
    record = {**planned.as_dict(), "status": status, **measured,
              "run_cpu_seconds": _cpu_seconds() - cpu0, "run_wall_seconds": time.time() - wall0,
              "date": time.strftime("%Y-%m-%d %H:%M"), "code": code_version(code_root, study.code_paths),
              "preregistration_sha256": task.get("preregistration_sha256"), "executor": task.get("executor"),
              **({"options": task["given_options"]} if task.get("given_options") else {})}
    store.write(planned.id, record)
    return {"id": planned.id, "status": record["status"]}


def estimate_seconds(study: Study, planned: PlannedRun, records: Mapping[str, dict[str, Any]],
                     options: Mapping[str, Any]) -> float | None:
    """CPU-seconds a run will take: the spec's ``estimate`` (from its probe) where it has one, else the mean
    measured ``run_cpu_seconds`` of finished runs of the same arm and budget (``None`` without either)."""
    if study.estimate is not None:
        return study.estimate(planned, options)
    same = [r["run_cpu_seconds"] for r in records.values() if r.get("arm") == planned.arm
            and r.get("budget") == planned.budget and r.get("status") == "finished" and r.get("run_cpu_seconds")]
    return statistics.fmean(same) if same else None


def run_study(study: Study, executor: Any, *, docs_root: Path, code_root: Path | None = None,
              workdir: Path = Path("runs/study"), phases: Sequence[str] | None = None,
              options: Mapping[str, Any] | None = None, dry_run: bool = False, retry_failed: bool = False,
              only: Sequence[str] | None = None, log: Callable[[str], None] = print) -> dict[str, int]:
    """Run what is missing of ``phases`` (default: all, in order); ``only``: just these run ids (e.g. one failed
    run, or a smoke check of one run per arm). Returns counts ``{planned, ran, failed}``."""
    code_root = Path(code_root or docs_root)
    store = ResultStore(docs_root, study.docs)
    names = [p.name for p in study.plan_phases()]
    unknown = sorted(set(phases or ()) - set(names))
    if unknown:
        raise ValueError(f"study {study.name!r} has no phase {', '.join(unknown)} (phases: {', '.join(names)})")
    counts = {"planned": 0, "ran": 0, "failed": 0}
    given, options, prepared = dict(options or {}), dict(options or {}), False  # given: recorded in each run
    for phase in study.plan_phases():
        if phases and phase.name not in phases:
            continue
        attempted: set[str] = set()
        while True:
            records = store.all()
            planned = phase.plan(study, records)
            ids = [p.id for p in planned]
            if len(set(ids)) != len(ids):
                raise ValueError(f"study {study.name!r}, phase {phase.name}: run ids repeat "
                                 f"({sorted({i for i in ids if ids.count(i) > 1})}); make run_id tell runs apart")
            todo = [p for p in planned if p.id not in attempted and (only is None or p.id in only) and (
                p.id not in records or (retry_failed and records[p.id].get("status") != "finished"))]
            if dry_run:
                _print_plan(study, phase.name, planned, todo, records, options or {}, executor, log)
                break
            if not todo:
                counts["planned"] += len(planned)
                break
            if study.prepare is not None and not prepared:
                options.update(study.prepare(RunContext(code_root, Path(workdir), options)))
                prepared = True
            digest = None
            smoke = sorted(set(given) & set(study.smoke_options))
            if phase.registered and smoke and Path(docs_root).resolve() == code_root.resolve():
                raise ValueError(f"--option {', '.join(smoke)} changes what a run of study {study.name!r} measures: "
                                 f"its registered phase {phase.name!r} refuses it in the study's own results; give a "
                                 "smoke run a scratch --docs-root")
            if phase.registered:
                plan = registration(store, study.preregistration, study.code_paths, code_root=code_root)
                digest = plan.get("preregistration_sha256")
            elif study.preregistration is not None and (store.docs / study.preregistration).is_file():
                digest = file_sha256(store.docs / study.preregistration)
            where = {"docs_root": str(Path(docs_root).resolve()), "docs": study.docs,
                     "code_root": str(code_root.resolve()), "workdir": str(Path(workdir).resolve())}
            tasks = [{"study_file": str(study.source), "run": p.as_dict(), **where, "options": options,
                      "preregistration_sha256": digest, "executor": executor.name, "given_options": given}
                     for p in todo]
            log(f"{study.name} {phase.name}: {len(todo)} run(s) to go on {executor.name} "
                f"({sum(p.id in records for p in planned)} of {len(planned)} have a result file)")

            def done(task: dict[str, Any], outcome: str) -> None:
                counts["ran"] += 1
                counts["failed"] += outcome != "finished"
                log(f"  {task['run']['id']}: {outcome} -> {store.path(task['run']['id'])}")

            executor.run(tasks, done)
            attempted.update(p.id for p in todo)
            lost = [p.id for p in todo if store.load(p.id) is None]
            if lost:  # counted as failed (``done``); the page still renders and lists them as missing
                log(f"{study.name} {phase.name}: {len(lost)} run(s) ended without a result file "
                    f"({', '.join(lost)}): see their logs under {workdir}; they run again next time")
    return counts


def _print_plan(study: Study, phase: str, planned: list[PlannedRun], todo: list[PlannedRun],
                records: Mapping[str, dict[str, Any]], options: Mapping[str, Any], executor: Any,
                log: Callable[[str], None]) -> None:
    log(f"{study.name} {phase}: {len(planned)} run(s) planned, {len(todo)} to run")
    total, unknown = 0.0, 0
    for p in planned:
        state = "to run" if p in todo else records.get(p.id, {}).get("status", "done")
        est = estimate_seconds(study, p, records, options) if p in todo else None
        if p in todo:
            if est is None:
                unknown += 1
            else:
                total += est
        log(f"  {p.id:36s} {state:9s} {'' if est is None else f'~{est / 60:.0f} CPU-min'}")
    jobs = getattr(executor, "jobs", 1)
    if todo:
        log(f"  estimate: {total / 3600:.2f} CPU-h for the runs with an estimate ({unknown} without), "
            f"~{total / 3600 / jobs:.2f} h of wall time at {jobs} job(s)")

