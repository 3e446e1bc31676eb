"""What a study is: arms, seeds, budgets, the pre-registered primaries and the rules, as one short spec.

A spec is a Python module under ``studies/`` that defines ``STUDY = Study(...)`` (see ``docs/studies.md``). The
engine (:mod:`looprun.study.engine`) plans its runs from it, runs them through an executor, and renders its page
(:mod:`looprun.study.page`) from the committed result files; every verdict goes through :mod:`looprun.statistics`.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Arm:
    """One arm: its ``name`` (used in run ids and contrasts), a human ``label`` and the free-form ``settings`` the
    study's run function reads (a model name, config overrides, a command line ...)."""

    name: str
    label: str = ""
    settings: Mapping[str, Any] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return self.label or self.name


@dataclass(frozen=True)
class Budget:
    """A training budget (``steps``, ``images`` or ``cpu_seconds``; the run function reads it) with its fixed
    ``seeds`` and the ``arms`` it covers (``None``: every arm of the study)."""

    name: str
    seeds: tuple[int, ...]
    arms: tuple[str, ...] | None = None
    steps: int | None = None
    images: int | None = None
    cpu_seconds: float | None = None


@dataclass(frozen=True)
class Metric:
    """The metric a run reports under ``name`` in its row (higher is better), its ``unit`` and printed digits."""

    name: str
    unit: str = ""
    digits: int = 2
    label: str = ""


@dataclass(frozen=True)
class Comparison:
    """A contrast ``a - b`` between two run groups ``arm@budget``. ``margin``: a non-inferiority margin (in the
    metric's unit; ``None`` for an ordinary two-sided comparison). ``seeds``: the seeds it pairs (default: the
    seeds both groups' budgets fix). ``paired``: seeds share data order and initialisation draws, so the seed-wise
    differences are paired; ``False`` reads Welch's test (independent samples). ``words``: the verdict words the
    pre-registration wrote for this primary, keyed by the engine's verdict (e.g. ``{"within margin": "sharing
    costs < 0.2 dB"}``); a verdict without an entry keeps the engine's word."""

    id: str
    a: str
    b: str
    label: str = ""
    margin: float | None = None
    metric: str | None = None
    seeds: tuple[int, ...] | None = None
    paired: bool = True
    words: Mapping[str, str] = field(default_factory=dict, hash=False)  # (a dict: not hashable)

    def __post_init__(self) -> None:
        allowed = MARGIN_VERDICTS if self.margin is not None else PLAIN_VERDICTS
        if unknown := sorted(set(self.words) - set(allowed)):
            raise ValueError(f"comparison {self.id!r}: words for verdicts it cannot reach: {unknown} "
                             f"(its verdicts: {', '.join(allowed)})")

    def word(self, verdict: str) -> str:
        """The pre-registered word for one of the engine's verdicts."""
        return self.words.get(verdict, verdict)


PLAIN_VERDICTS = ("better", "worse", "inconclusive")  # looprun.statistics.margin_family's verdicts
MARGIN_VERDICTS = (*PLAIN_VERDICTS, "within margin", "worse, within margin")  # ... with a non-inferiority margin


@dataclass(frozen=True)
class Rules:
    """The study rules written down before the runs: the family's ``alpha`` (Holm over the primaries), the seed
    divergence threshold (``max(divergence_floor, divergence_factor x`` the other groups' largest seed spread),
    in the metric's unit) and the rule for any seeds beyond the fixed count (text that the page quotes)."""

    alpha: float = 0.05
    divergence_factor: float = 5.0
    divergence_floor: float = 0.5
    extra_seeds: str = "none: the seed count is fixed before the runs"


@dataclass(frozen=True)
class PlannedRun:
    """One run of a study: its result-file ``id``, ``phase``, ``arm``, ``budget``, ``seed`` and the ``settings``
    the run function reads (the arm's settings plus what the plan adds, e.g. a picked learning rate)."""

    id: str
    phase: str
    arm: str
    budget: str
    seed: int
    settings: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "phase": self.phase, "arm": self.arm, "budget": self.budget, "seed": self.seed,
                "settings": dict(self.settings)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlannedRun:
        return cls(data["id"], data["phase"], data["arm"], data["budget"], int(data["seed"]),
                   dict(data.get("settings", {})))


@dataclass(frozen=True)
class RunContext:
    """Where a run works: the repository ``root`` (commands run there), its scratch ``workdir`` (not committed),
    and the study's ``options`` from the command line (e.g. ``scale`` for smoke runs, a data root)."""

    root: Path
    workdir: Path
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Phase:
    """A phase of runs. ``plan(study, results)`` lists its runs given the result records so far (id -> record), so
    a phase can depend on an earlier one (an lr check's pick) or grow (a grid extended past an edge pick; the
    engine plans again until nothing new appears). ``registered``: runs of this phase need the committed
    pre-registration unchanged and the training code pinned at the phase's first run."""

    name: str
    plan: Callable[[Study, Mapping[str, dict[str, Any]]], list[PlannedRun]]
    registered: bool = True


Section = Callable[[Any], list[str]]  # a page section: Page -> markdown lines (see looprun.study.page)


@dataclass
class Study:
    """A study spec. ``run(planned, context) -> dict`` trains and evaluates one run and returns its measured
    fields; ``row(record) -> dict`` reads a result record into a row with ``arm``, ``budget``, ``seed`` and every
    metric (default: ``record["metrics"]``). ``docs``: the folder of the result files (``runs/``), the
    pre-registration and ``results.json``; ``page``: the markdown page. ``sections``: the page, in order
    (the standard ones live in :mod:`looprun.study.page`; a study adds its own as small functions).
    ``prepare(context) -> options``: once per invocation, before the first run is dispatched (e.g. writing the
    data shards every run reads); what it returns joins the options each run sees."""

    name: str
    title: str
    docs: str
    page: str
    arms: Sequence[Arm]
    budgets: Sequence[Budget]
    metric: Metric
    primaries: Sequence[Comparison] = ()
    secondaries: Sequence[Comparison] = ()
    secondary_metrics: Sequence[Metric] = ()
    rules: Rules = field(default_factory=Rules)
    run: Callable[[PlannedRun, RunContext], dict[str, Any]] | None = None
    row: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None
    phases: Sequence[Phase] = ()
    sections: Sequence[Section] = ()
    run_id: str = "{arm}-{budget}-s{seed}"
    preregistration: str | None = "preregistration.md"
    code_paths: tuple[str, ...] = ("packages", "pipelines")
    estimate: Callable[[PlannedRun, Mapping[str, Any]], float] | None = None
    prepare: Callable[[RunContext], Mapping[str, Any]] | None = None
    command: str = ""
    extra_results: Callable[[Any], dict[str, Any]] | None = None
    seeds_follow_plan: bool = False  # comparisons read only the seeds the phases plan (a pilot's fall-back)
    smoke_options: tuple[str, ...] = ()  # --option keys that change what a run measures (scale, smoke_steps ...)
    cpu_note: str = "CPU-seconds as measured for each run (process and children)."  # what a row's cpu_seconds is
    source: Path | None = None  # the spec's file (set by load_study)

    def arm(self, name: str) -> Arm:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise KeyError(f"study {self.name!r} has no arm {name!r} (arms: {', '.join(a.name for a in self.arms)})")

    def budget(self, name: str) -> Budget:
        for budget in self.budgets:
            if budget.name == name:
                return budget
        raise KeyError(f"study {self.name!r} has no budget {name!r} "
                       f"(budgets: {', '.join(b.name for b in self.budgets)})")

    def grid(self, phase: str = "main", settings: Callable[[Arm, Budget], Mapping[str, Any]] | None = None
             ) -> list[PlannedRun]:
        """Every (budget, seed, arm) of the spec, in that order (each budget's first seeds finish first). A run's
        settings are its arm's, the budget's quantities (``steps`` / ``images`` / ``cpu_seconds`` where set) and
        what ``settings(arm, budget)`` adds (``None`` from it: the run is not plannable yet)."""
        out = []
        for budget in self.budgets:
            for seed in budget.seeds:
                for arm in self.arms:
                    if budget.arms is not None and arm.name not in budget.arms:
                        continue
                    extra = {} if settings is None else settings(arm, budget)
                    if extra is None:
                        continue
                    run_id = self.run_id.format(arm=arm.name, budget=budget.name, seed=seed, phase=phase)
                    amounts = {k: v for k, v in (("steps", budget.steps), ("images", budget.images),
                                                 ("cpu_seconds", budget.cpu_seconds)) if v is not None}
                    out.append(PlannedRun(run_id, phase, arm.name, budget.name, seed,
                                          {**arm.settings, **amounts, **extra}))
        return out

    def plan_phases(self) -> list[Phase]:
        return list(self.phases) or [Phase("main", lambda study, results: study.grid())]

    def group_seeds(self, group: str) -> tuple[int, ...]:
        """The seeds a group ``arm@budget`` is fixed to run."""
        return self.budget(group.split("@", 1)[1]).seeds

    def comparison_seeds(self, comparison: Comparison, planned: set[tuple[str, int]] | None = None
                         ) -> tuple[int, ...]:
        """The seeds a comparison reads: its own, else its groups' budgets' (shared ones when paired). With
        ``planned`` (``(group, seed)`` pairs the phases plan), only seeds planned in both groups: a pre-registered
        fall-back that drops a seed before the runs (decided by a pilot) shrinks the family, it does not stall it."""
        if comparison.seeds is not None:
            seeds = comparison.seeds
        else:
            a, b = self.group_seeds(comparison.a), self.group_seeds(comparison.b)
            seeds = tuple(s for s in a if s in b) if comparison.paired else tuple(sorted(set(a) | set(b)))
        if planned is None:
            return seeds
        return tuple(s for s in seeds if (comparison.a, s) in planned and (comparison.b, s) in planned)


def studies_dir(root: Path) -> Path:
    return root / "studies"


def available_studies(root: Path) -> list[str]:
    """The study names under ``<root>/studies`` (a spec per file; ``_``-prefixed files are helpers)."""
    return sorted(p.stem.replace("_", "-") for p in studies_dir(root).glob("*.py") if not p.stem.startswith("_"))


def load_study(name_or_path: str | Path, root: Path | None = None) -> Study:
    """Load a spec: a path to a ``.py`` file, or a study name under ``<root>/studies`` (``-`` and ``_`` alike).
    The module must define ``STUDY``."""
    path = Path(name_or_path)
    if path.suffix != ".py":
        root = root or Path.cwd()
        path = studies_dir(root) / f"{str(name_or_path).replace('-', '_')}.py"
        if not path.is_file():
            names = available_studies(root)
            raise FileNotFoundError(f"no study {str(name_or_path)!r}: {path} does not exist (studies under "
                                    f"{studies_dir(root)}: {', '.join(names) or 'none'})")
    path = path.resolve()
    module_name = f"loopvision_studies.{path.stem}"
    if module_name in sys.modules and getattr(sys.modules[module_name], "__file__", None) == str(path):
        module = sys.modules[module_name]
    else:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import the study spec {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # before exec: dataclasses and pickling look modules up by name
        if str(path.parent) not in sys.path:  # a spec may import its studies/_helpers.py; appended, so that a
            sys.path.append(str(path.parent))  # spec's name never shadows an installed package
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
    study = getattr(module, "STUDY", None)
    if not isinstance(study, Study):
        raise TypeError(f"{path} defines no STUDY = looprun.study.Study(...) (got {type(study).__name__})")
    study.source = path
    return study
