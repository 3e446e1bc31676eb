"""The one table helper of every study page, and the cell formats it uses (signed differences, intervals,
mean ± sd). Missing values print as an en dash, never as a made-up number."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


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
