"""The study engine: a study is a short spec (arms, seeds, budgets, pre-registered primaries, rules); the engine
plans, runs and resumes it (one committed result file per run, the pre-registration's hash in each), dispatches
runs to a local pool or a cluster through submitit, computes every verdict through :mod:`looprun.statistics`
and renders the page. Entry point: ``loopvae study NAME`` (``make study NAME=...``); guide: ``docs/studies.md``.
"""

from looprun.study.spec import (
    Arm,
    Budget,
    Comparison,
    Metric,
    Phase,
    PlannedRun,
    Rules,
    RunContext,
    Study,
    available_studies,
    load_study,
)
from looprun.study.store import RegistrationError, ResultStore

__all__ = ["Arm", "Budget", "Comparison", "Metric", "Phase", "PlannedRun", "RegistrationError", "ResultStore",
           "Rules", "RunContext", "Study", "available_studies", "load_study"]
