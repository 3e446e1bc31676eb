"""Paired comparisons with three verdicts, shared by the study reports.

A comparison pairs what belongs together (the same seed of two arms, or the same image under two
models), takes the differences ``a - b``, and reports their mean with a two-sided t-interval
(df = n - 1). The verdict is *better* when the whole interval lies above 0, *worse* when it lies
below, and *inconclusive* otherwise, including n < 2, where no interval exists. Never "equal": an
interval that contains 0 says the data cannot tell, not that the arms are the same.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from scipy import stats as scipy_stats

VERDICTS = ("better", "worse", "inconclusive")


@dataclass
class PairedDifference:
    """``mean`` of ``a - b`` over ``n`` pairs, its ``confidence`` interval ``[low, high]`` (``None`` for n < 2),
    the number of pairs with ``a > b`` and the verdict."""

    mean: float
    low: float | None
    high: float | None
    n: int
    wins: int
    confidence: float
    verdict: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self, unit: str = "dB", digits: int = 2) -> str:
        """e.g. ``+0.42 dB [+0.10, +0.74] (95% t, n = 40; 31/40 higher): better``."""
        interval = ("(no interval with one pair)" if self.low is None else
                    f"[{self.low:+.{digits}f}, {self.high:+.{digits}f}] ({100 * self.confidence:.0f}% t, n = {self.n})")
        return (f"{self.mean:+.{digits}f} {unit} {interval}; {self.wins}/{self.n} higher: **{self.verdict}**")


def paired_difference(a: list[float], b: list[float], confidence: float = 0.95) -> PairedDifference:
    """Paired t-interval of ``mean(a - b)``; ``a`` and ``b`` are aligned (same seeds or images, same order)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired comparison needs two equally long, non-empty lists, got {len(a)} and {len(b)}")
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    n, mean = len(diffs), statistics.fmean(diffs)
    wins = sum(d > 0 for d in diffs)
    if n < 2:
        return PairedDifference(mean, None, None, n, wins, confidence, "inconclusive")
    sd = statistics.stdev(diffs)
    half = scipy_stats.t.ppf(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
    low, high = mean - half, mean + half
    verdict = "better" if low > 0 else "worse" if high < 0 else "inconclusive"
    return PairedDifference(mean, low, high, n, wins, confidence, verdict)


def seeds_disagree(values: list[float], others_spread: float, factor: float = 5.0, floor: float = 0.5) -> bool:
    """Flag an arm whose seeds differ by more than ``max(floor, factor * others_spread)``: one of them is
    likely a failed run, and a mean over them should not be quoted without that warning."""
    return len(values) > 1 and max(values) - min(values) > max(floor, factor * others_spread)
