"""Every study rule in one place, on top of :mod:`looprun.statistics`.

* The seed is the unit: a contrast compares per-seed values of two run groups (``arm@budget``), paired by seed
  when the spec says the seeds are paired (same data order and initialisation draws), Welch otherwise.
* The pre-registered primaries form one family, read whole (no member gets a verdict while any of its runs is
  missing) in Holm's interval form, with non-inferiority margins where the spec gives one
  (:func:`looprun.statistics.margin_family`).
* Secondaries are descriptive: a 95% interval, no verdict word.
* Null rows: two seeds of one group compared image by image (the per-image test a single-run comparison would
  use); each distinct pair of seeds counts once. They show how often per-image intervals "find" a difference
  between two runs that differ only in their seed.
* A seed further than ``max(floor, factor x`` the other groups' largest spread) from the median of its group's
  other seeds is flagged as diverging (to be diagnosed, never silently averaged).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from looprun.statistics import (
    Difference,
    Primary,
    disagreement_threshold,
    margin_family,
    paired_difference,
    welch_difference,
)
from looprun.study.spec import Comparison, Rules, Study

Values = dict[str, dict[int, float]]  # group "arm@budget" -> seed -> value


def group_of(row: Mapping[str, Any]) -> str:
    return f"{row['arm']}@{row['budget']}"


def group_values(rows: Sequence[Mapping[str, Any]], metric: str) -> Values:
    """Per group, ``seed -> row[metric]`` (rows without the metric are left out)."""
    out: Values = {}
    for r in rows:
        if r.get(metric) is not None:
            out.setdefault(group_of(r), {})[int(r["seed"])] = float(r[metric])
    return out


Planned = set[tuple[str, int]] | None  # (group, seed) pairs the phases plan; see Study.comparison_seeds


def missing_runs(study: Study, comparisons: Sequence[Comparison], values: Values, planned: Planned = None
                 ) -> list[str]:
    """``arm@budget seed k`` for every run the comparisons need and ``values`` lacks (``<id>: no run planned yet``
    for a comparison whose plan holds no seed yet)."""
    unplanned = [f"{c.id}: no run planned yet" for c in comparisons if not study.comparison_seeds(c, planned)]
    if unplanned:
        return unplanned
    missing = {f"{g} seed {s}" for c in comparisons for g in (c.a, c.b) for s in study.comparison_seeds(c, planned)
               if s not in values.get(g, {}) and (c.paired or s in study.group_seeds(g))}
    return sorted(missing)


def difference(study: Study, comparison: Comparison, values: Values, planned: Planned = None) -> Difference:
    """The contrast at 95%: paired by seed, or Welch over each group's own seeds."""
    seeds = study.comparison_seeds(comparison, planned)
    a, b = values[comparison.a], values[comparison.b]
    if comparison.paired:
        return paired_difference([a[s] for s in seeds], [b[s] for s in seeds])
    return welch_difference([a[s] for s in seeds if s in a], [b[s] for s in seeds if s in b])


def primary_family(study: Study, rows: Sequence[Mapping[str, Any]], planned: Planned = None
                   ) -> tuple[list[dict[str, Any]], list[str]]:
    """The pre-registered primaries once every one of their runs exists: rows ``{id, a, b, label, metric, diff,
    ci, n, test, p, p_holm, margin, confidence_holm, ci_holm, verdict, seeds}`` (``verdict`` in the words the
    comparison registered); with any run missing, no member is read and the second value lists what is absent."""
    by_metric = {c.metric or study.metric.name for c in study.primaries}
    values = {m: group_values(rows, m) for m in by_metric}
    missing = sorted({x for c in study.primaries
                      for x in missing_runs(study, [c], values[c.metric or study.metric.name], planned)})
    if missing:
        return [], missing
    prims = [Primary(c.id, difference(study, c, values[c.metric or study.metric.name], planned), c.margin)
             for c in study.primaries]
    margin_family(prims, study.rules.alpha)
    return [{"a": c.a, "b": c.b, "label": c.label, "metric": c.metric or study.metric.name,
             "seeds": list(study.comparison_seeds(c, planned)), **p.as_dict(), "verdict": c.word(p.verdict)}
            for c, p in zip(study.primaries, prims, strict=True)], []


def secondary_rows(study: Study, rows: Sequence[Mapping[str, Any]], comparisons: Sequence[Comparison],
                   metrics: Sequence[str], planned: Planned = None) -> list[dict[str, Any]]:
    """Descriptive contrasts (no verdicts): per comparison, ``{id, label, a, b, n, metrics: {metric: Difference
    dict or None}}``; ``None`` while a run is missing."""
    out = []
    for c in comparisons:
        cells: dict[str, Any] = {}
        for m in metrics:
            values = group_values(rows, m)
            cells[m] = None if missing_runs(study, [c], values, planned) else \
                difference(study, c, values, planned).as_dict()
        out.append({"id": c.id, "label": c.label, "a": c.a, "b": c.b, "n": len(study.comparison_seeds(c, planned)),
                    "metrics": cells})
    return out


def null_rows(rows: Sequence[Mapping[str, Any]], metric: str) -> list[dict[str, Any]]:
    """Two seeds of one group compared per image (``row["per_unit"][metric]``: key -> value), each distinct
    pair of seeds once: ``{group, seeds: [s, t], n, diff, ci, verdict}`` (the verdict a per-image paired test
    would give; a study reports how many of them call a seed-only difference "better" or "worse")."""
    by_group: dict[str, dict[int, Mapping[str, float]]] = {}
    for r in rows:
        units = (r.get("per_unit") or {}).get(metric)
        if units:
            by_group.setdefault(group_of(r), {})[int(r["seed"])] = units
    out = []
    for group, seeds in sorted(by_group.items()):
        for s, t in itertools.combinations(sorted(seeds), 2):
            keys = sorted(set(seeds[s]) & set(seeds[t]))
            if len(keys) < 2:
                continue
            d = paired_difference([seeds[s][k] for k in keys], [seeds[t][k] for k in keys])
            out.append({"group": group, "seeds": [s, t], "n": d.n, "diff": d.mean, "ci": [d.low, d.high],
                        "verdict": d.verdict})
    return out


def divergent_seeds(values: Values, rules: Rules | None = None) -> list[dict[str, Any]]:
    """Per group, the seeds further than the rules' threshold (from the other groups' largest seed spread) from
    the median of their group's other seeds: ``{group, seed, value, median, threshold}``."""
    rules = rules or Rules()
    spreads = {g: (max(v.values()) - min(v.values())) if len(v) > 1 else 0.0 for g, v in values.items()}
    out = []
    for group, by_seed in sorted(values.items()):
        if len(by_seed) < 2:
            continue
        others = max((s for g, s in spreads.items() if g != group), default=0.0)
        threshold = disagreement_threshold(others, rules.divergence_factor, rules.divergence_floor)
        for seed, value in sorted(by_seed.items()):
            median = statistics.median(v for s, v in by_seed.items() if s != seed)
            if abs(value - median) > threshold:
                out.append({"group": group, "seed": seed, "value": value, "median": median, "threshold": threshold})
    return out
