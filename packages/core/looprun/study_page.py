"""Building blocks of a study page: markdown tables, primaries with their verdicts, seed divergence.

A study page is computed from committed per-run result files; these helpers keep the study rules in one place:
the seed is the unit, a fixed pre-registered family is corrected with Holm (:func:`looprun.statistics.margin_family`),
intervals are labelled as unadjusted or Holm-level, a missing run is listed, never filled in, and a seed that
disagrees with its arm is flagged with the threshold that flagged it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from looprun.statistics import Primary, disagreement_threshold, margin_family, paired_difference


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> list[str]:
    """A markdown table as lines; ``align`` is one character per column (``l`` / ``r``; default: first column
    left, the rest right). Cells are formatted with ``str``."""
    align = align or ("l" + "r" * (len(header) - 1))
    if len(align) != len(header) or any(len(r) != len(header) for r in rows):
        raise ValueError(f"table with {len(header)} columns got rows of {sorted({len(r) for r in rows})} cells")
    rule = ["---:" if a == "r" else "---" for a in align]
    return ["| " + " | ".join(map(str, line)) + " |" for line in (header, rule, *rows)]


def signed(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:+.{digits}f}"


def interval(ci: Sequence[float | None] | None, digits: int = 2) -> str:
    if not ci or ci[0] is None:
        return "–"
    return f"[{ci[0]:+.{digits}f}, {ci[1]:+.{digits}f}]"


def mean_sd(values: Sequence[float], digits: int = 2) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def paired_by_seed(a: dict[int, float], b: dict[int, float], seeds: Sequence[int]) -> tuple[list[float], list[float]]:
    """The two arms' values at ``seeds`` (every seed must be present in both: the caller checks completeness)."""
    return [a[s] for s in seeds], [b[s] for s in seeds]


def primary_family(specs: Sequence[dict[str, Any]], values: dict[str, dict[int, float]], alpha: float = 0.05
                   ) -> tuple[list[dict[str, Any]], list[str]]:
    """Compute a pre-registered family once every one of its runs exists.

    ``specs``: ``{id, a, b, seeds, margin}`` (``margin`` ``None`` for an ordinary comparison); ``values``: per arm,
    ``seed -> metric``. Returns (rows, missing): each row ``{id, a, b, diff, ci, n, p, p_holm, margin,
    confidence_holm, ci_holm, verdict, test}``; with any run missing, no member gets a verdict (a Holm family is
    read whole) and ``missing`` lists what is absent as ``arm seed k``."""
    missing = [f"{arm} seed {s}" for spec in specs for arm in (spec["a"], spec["b"]) for s in spec["seeds"]
               if s not in values.get(arm, {})]
    if missing:
        return [], sorted(set(missing))
    prims = [Primary(spec["id"], paired_difference(*paired_by_seed(values[spec["a"]], values[spec["b"]],
                                                                   spec["seeds"])), spec.get("margin"))
             for spec in specs]
    margin_family(prims, alpha)
    rows = []
    for spec, prim in zip(specs, prims, strict=True):
        rows.append({"a": spec["a"], "b": spec["b"], **prim.as_dict()})
    return rows, []


def primaries_table(rows: Sequence[dict[str, Any]], labels: dict[str, str], unit: str = "dB") -> list[str]:
    """The primaries as a table: difference, unadjusted 95% interval, Holm-level interval, p, Holm p, verdict."""
    body = []
    for r in rows:
        level = "–" if r["confidence_holm"] is None else f"{100 * r['confidence_holm']:.1f}%"
        body.append([f"**{r['id']}**", labels.get(r["id"], f"{r['a']} − {r['b']}"), r["n"],
                     f"{r['diff']:+.2f} {unit}", interval(r["ci"]), f"{interval(r['ci_holm'])} ({level})",
                     "–" if r["p"] is None else f"{r['p']:.3g}", "–" if r["p_holm"] is None else f"{r['p_holm']:.3g}",
                     "–" if r["margin"] is None else f"−{r['margin']:.2f}", f"**{r['verdict']}**"])
    return md_table(["id", "contrast", "seeds", "difference", "95% interval (unadjusted)",
                     "Holm-level interval", "p", "Holm p", "margin", "verdict"], body, "llrrrrrrrl")


def divergent_seeds(values: dict[str, dict[int, float]]) -> list[dict[str, Any]]:
    """Per arm (name -> seed -> value), the seeds more than ``disagreement_threshold`` (from the other arms' largest
    seed spread) away from the median of their arm's other seeds: ``{arm, seed, value, median, threshold}``."""
    spreads = {a: (max(v.values()) - min(v.values())) if len(v) > 1 else 0.0 for a, v in values.items()}
    out = []
    for arm, by_seed in values.items():
        if len(by_seed) < 2:
            continue
        others = max((s for a, s in spreads.items() if a != arm), default=0.0)
        threshold = disagreement_threshold(others)
        for seed, value in sorted(by_seed.items()):
            median = statistics.median(v for s, v in by_seed.items() if s != seed)
            if abs(value - median) > threshold:
                out.append({"arm": arm, "seed": seed, "value": value, "median": median, "threshold": threshold})
    return out
