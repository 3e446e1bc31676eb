"""Where a study's runs execute: a local pool of N jobs (the default), or a cluster through ``submitit``.

Both take the same tasks (plain dicts, see :func:`looprun.study.engine.execute_run`) and call ``on_done(task,
outcome)`` as each run ends; the run itself writes its result file, so a run killed with its executor leaves no
file and is simply run again next time.

* :class:`LocalPool`: each run is a ``python -m looprun.study.worker`` subprocess (its own interpreter, so a
  crash or an out-of-memory kill takes only that run), at most ``jobs`` at a time, output to
  ``<workdir>/<run id>.worker.log`` (a run's own logs, e.g. ``loopvae train``'s, may use ``<run id>.log``).
  It lives in the caller's process group: a signal to the group stops every run.
* :class:`SubmititExecutor`: one ``submitit`` job per run (a SLURM job array on a cluster, as DeiT / DINO / MAE
  launch theirs; ``cluster="local"`` runs the same jobs as local processes, which is how the tests drive it).
  SLURM parameters (``slurm_partition``, ``timeout_min``, ``cpus_per_task``, ``gpus_per_node``, ``mem_gb`` ...)
  pass to ``submitit.AutoExecutor.update_parameters``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from looprun.study.store import source_env

Task = dict[str, Any]
OnDone = Callable[[Task, str], None]  # outcome: "finished", "failed", or why no result file was written


class LocalPool:
    """At most ``jobs`` runs at a time on this machine, each in its own subprocess."""

    name = "local"

    def __init__(self, jobs: int = 1, workdir: Path = Path("runs/study")):
        if jobs < 1:
            raise ValueError(f"--jobs must be at least 1, got {jobs}")
        self.jobs, self.workdir = jobs, Path(workdir)

    def run(self, tasks: Sequence[Task], on_done: OnDone) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(self.jobs) as pool:
            futures = {pool.submit(self._one, task): task for task in tasks}
            for future in as_completed(futures):
                on_done(futures[future], future.result())

    def _one(self, task: Task) -> str:
        spec = self.workdir / f"{task['run']['id']}.task.json"
        spec.write_text(json.dumps(task, indent=1) + "\n")
        log = self.workdir / f"{task['run']['id']}.worker.log"
        with open(log, "w") as out:
            code = subprocess.run([sys.executable, "-m", "looprun.study.worker", str(spec)], stdout=out,
                                  stderr=subprocess.STDOUT, cwd=task["code_root"], check=False,
                                  env=source_env(Path(task["code_root"]))).returncode
        return _outcome(task, code, log)


class SubmititExecutor:
    """One submitit job per run; ``cluster``: ``None`` (SLURM where ``sbatch`` exists, else local processes),
    ``"slurm"`` or ``"local"``; ``parameters``: ``submitit.AutoExecutor.update_parameters`` keywords
    (``slurm_partition``, ``timeout_min``, ``cpus_per_task``, ``gpus_per_node``, ``mem_gb`` ...)."""

    name = "submitit"

    def __init__(self, folder: Path, cluster: str | None = None, jobs: int | None = None,
                 poll_seconds: float = 1.0, **parameters: Any):
        import submitit

        self.executor = submitit.AutoExecutor(folder=str(folder), cluster=cluster)
        self.cluster, self.poll_seconds = self.executor.cluster, poll_seconds
        if jobs is not None and self.cluster == "slurm":
            parameters.setdefault("slurm_array_parallelism", jobs)
        parameters.setdefault("timeout_min", 24 * 60)
        self.executor.update_parameters(**parameters)

    def run(self, tasks: Sequence[Task], on_done: OnDone) -> None:
        from looprun.study.engine import execute_run

        saved = dict(os.environ)
        try:  # the jobs inherit the environment: the code root's sources first on PYTHONPATH
            os.environ.update(source_env(Path(tasks[0]["code_root"])) if tasks else {})
            with self.executor.batch():  # one job array on SLURM
                jobs = [(task, self.executor.submit(execute_run, task)) for task in tasks]
        finally:
            os.environ.clear()
            os.environ.update(saved)
        pending = list(jobs)
        while pending:
            still = []
            for task, job in pending:
                if not job.done():
                    still.append((task, job))
                    continue
                try:
                    outcome = job.result()["status"]
                except Exception as err:  # the job died before writing its result (killed, timed out, preempted)
                    outcome = f"no result file: submitit job {job.job_id} failed ({str(err).splitlines()[0][:200]})"
                on_done(task, outcome)
            pending = still
            if pending:
                time.sleep(self.poll_seconds)


def _outcome(task: Task, code: int, log: Path) -> str:
    result = Path(task["docs_root"]) / task["docs"] / "runs" / f"{task['run']['id']}.json"
    if result.is_file():
        return json.loads(result.read_text()).get("status", "finished")
    return f"no result file: the worker exited with code {code} (log: {log})"


def make_executor(name: str, jobs: int, workdir: Path, **parameters: Any) -> LocalPool | SubmititExecutor:
    """``local`` (a pool of ``jobs``), ``submitit`` (SLURM where available, else submitit's local executor),
    ``slurm`` or ``submitit-local``."""
    if name == "local":
        return LocalPool(jobs, workdir)
    clusters = {"submitit": None, "slurm": "slurm", "submitit-local": "local"}
    if name not in clusters:
        raise ValueError(f"unknown executor {name!r}: choose local, submitit, slurm or submitit-local")
    return SubmititExecutor(workdir / "submitit", clusters[name], jobs, **parameters)
