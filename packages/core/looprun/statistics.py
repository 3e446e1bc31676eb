"""Comparisons with three verdicts: paired or Welch t-intervals, and Holm's correction over a family.

A comparison takes two samples (per-seed means of two arms, or per-image values of two models), reports the
mean difference ``a - b`` with a two-sided t-interval and a p-value, and a verdict: *better* when the
difference is significant and positive, *worse* when significant and negative, *inconclusive* otherwise (also
for fewer than two values per side, where no interval exists). Never "equal": an interval that contains 0 says
the data cannot tell, not that the arms are the same.

* :func:`paired_difference`: the two samples are aligned (the same seed of two arms, sharing the data order a
  seed fixes; or the same image under two models), df = n - 1.
* :func:`welch_difference`: independent samples with unequal variances (Welch-Satterthwaite df).
* :func:`holm_adjust` / :func:`apply_holm`: Holm's step-down correction of the p-values of a family of
  comparisons that was written down before the data; the verdicts are then read from the adjusted p-values.
* :func:`margin_family`: a pre-registered family whose members may carry a non-inferiority margin, read in
  Holm's interval form (each member's interval at its step-down level; claims "within the margin", "worse",
  "better").

Zero spread with n >= 2 (every pair differs by exactly the same amount, e.g. one checkpoint listed twice) is
degenerate: no interval, no p-value, verdict inconclusive. A p of 0 would otherwise call any gap "better".
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from scipy import stats as scipy_stats

VERDICTS = ("better", "worse", "inconclusive")


@dataclass
class Difference:
    """``mean`` of ``a - b``, its ``confidence`` interval ``[low, high]`` and two-sided ``p`` (``None`` without an
    interval), ``n`` pairs (paired) or the smaller sample's size (Welch), ``wins`` (pairs with ``a > b``; Welch:
    ``None``), the ``test`` and the verdict at ``alpha = 1 - confidence`` (or from ``p_adjusted`` once a family
    correction was applied)."""

    mean: float
    low: float | None
    high: float | None
    n: int
    wins: int | None
    confidence: float
    verdict: str
    p: float | None = None
    test: str = "paired t"
    p_adjusted: float | None = None
    n_a: int | None = None
    n_b: int | None = None
    df: float | None = None  # the t distribution's degrees of freedom (None without an interval)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self, unit: str = "dB", digits: int = 2, verdict: bool = True) -> str:
        """e.g. ``+0.42 dB [+0.10, +0.74] (95% t, n = 40; 31/40 higher): better``; ``verdict=False`` leaves the
        verdict word out (descriptive intervals, e.g. per image within one run)."""
        interval = (("(no interval with one value per side)" if self.n < 2 else
                     "(no interval: zero spread between seeds, degenerate)") if self.low is None else
                    f"[{self.low:+.{digits}f}, {self.high:+.{digits}f}] ({100 * self.confidence:.0f}% "
                    f"{'Welch ' if self.test.startswith('Welch') else ''}t, n = {self.n})")
        wins = "" if self.wins is None else f"; {self.wins}/{self.n} higher"
        text = f"{self.mean:+.{digits}f} {unit} {interval}{wins}"
        return text + (f": **{self.verdict}**" if verdict else "")


# The older name (study reports import it).
PairedDifference = Difference


def _verdict(mean: float, p: float | None, alpha: float) -> str:
    if p is None or p >= alpha:
        return "inconclusive"
    return "better" if mean > 0 else "worse" if mean < 0 else "inconclusive"


def _degenerate(spread: float, mean: float) -> bool:
    """A spread at float-rounding level (``1e-9`` of the values' scale): the copies of one number that a
    repeated checkpoint gives, where a t-statistic would be astronomically large and meaningless."""
    return spread <= 1e-9 * max(1.0, abs(mean))


def paired_difference(a: list[float], b: list[float], confidence: float = 0.95) -> Difference:
    """Paired t-interval of ``mean(a - b)``; ``a`` and ``b`` are aligned (same seeds or images, same order)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired comparison needs two equally long, non-empty lists, got {len(a)} and {len(b)}")
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    n, mean = len(diffs), statistics.fmean(diffs)
    wins = sum(d > 0 for d in diffs)
    if n < 2:
        return Difference(mean, None, None, n, wins, confidence, "inconclusive")
    sd = statistics.stdev(diffs)
    se = sd / math.sqrt(n)
    if _degenerate(sd, mean):  # identical pairs (up to float rounding) carry no information about the spread
        return Difference(mean, None, None, n, wins, confidence, "inconclusive")
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2, n - 1)) * se
    p = float(2 * scipy_stats.t.sf(abs(mean / se), n - 1))
    return Difference(mean, mean - half, mean + half, n, wins, confidence, _verdict(mean, p, 1 - confidence), p,
                      df=n - 1)


def welch_difference(a: list[float], b: list[float], confidence: float = 0.95) -> Difference:
    """Welch's t-interval of ``mean(a) - mean(b)`` for independent samples (unequal variances)."""
    if not a or not b:
        raise ValueError(f"a comparison needs two non-empty lists, got {len(a)} and {len(b)}")
    mean = statistics.fmean(a) - statistics.fmean(b)
    n = min(len(a), len(b))
    if len(a) < 2 or len(b) < 2:
        return Difference(mean, None, None, n, None, confidence, "inconclusive", test="Welch t", n_a=len(a),
                          n_b=len(b))
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if _degenerate(se, mean):  # degenerate: both samples constant (up to float rounding)
        return Difference(mean, None, None, n, None, confidence, "inconclusive", test="Welch t", n_a=len(a),
                          n_b=len(b))
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2, df)) * se
    p = float(2 * scipy_stats.t.sf(abs(mean / se), df))
    return Difference(mean, mean - half, mean + half, n, None, confidence, _verdict(mean, p, 1 - confidence), p,
                      "Welch t", n_a=len(a), n_b=len(b), df=df)


def holm_adjust(pvalues: list[float | None], m: int | None = None) -> list[float | None]:
    """Holm's step-down adjusted p-values; ``None`` stays ``None``. ``m``: the family size (default: the p-values
    that are not ``None``; a pre-registered family passes its registered size, so a member without a p-value
    does not make the others' correction milder)."""
    indexed = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m = len(indexed) if m is None else m
    adjusted: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(indexed):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def apply_holm(family: list[Difference]) -> list[Difference]:
    """Set ``p_adjusted`` (Holm over ``family``) and read each verdict from it at ``1 - confidence``."""
    for diff, adj in zip(family, holm_adjust([d.p for d in family]), strict=True):
        diff.p_adjusted = adj
        diff.verdict = _verdict(diff.mean, adj, 1 - diff.confidence)
    return family


def disagreement_threshold(others_spread: float, factor: float = 5.0, floor: float = 0.5) -> float:
    """The seed spread (max - min, in the metric's unit) above which :func:`seeds_disagree` flags an arm."""
    return max(floor, factor * others_spread)


def seeds_disagree(values: list[float], others_spread: float, factor: float = 5.0, floor: float = 0.5) -> bool:
    """Flag an arm whose seeds differ by more than ``max(floor, factor * others_spread)``: one of them is
    likely a failed run, and a mean over them should not be quoted without that warning."""
    return len(values) > 1 and max(values) - min(values) > disagreement_threshold(others_spread, factor, floor)


# -- pre-registered families with non-inferiority margins, read in Holm's interval form ------------------
@dataclass
class Primary:
    """One pre-registered primary: ``diff`` (a paired or Welch :class:`Difference` at 95%), its ``id``, and the
    non-inferiority ``margin`` (``None``: an ordinary two-sided comparison). Filled in by :func:`margin_family`:
    ``p`` (the smallest alpha at which its interval supports any claim), ``p_holm``, the Holm-level interval
    ``ci_holm`` at ``confidence_holm``, and ``verdict``."""

    id: str
    diff: Difference
    margin: float | None = None
    p: float | None = None
    p_holm: float | None = None
    confidence_holm: float | None = None
    ci_holm: tuple[float, float] | None = None
    verdict: str = "inconclusive"

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "diff": self.diff.mean, "ci": [self.diff.low, self.diff.high], "n": self.diff.n,
                "test": self.diff.test, "p": self.p, "p_holm": self.p_holm, "margin": self.margin,
                "confidence_holm": self.confidence_holm,
                "ci_holm": list(self.ci_holm) if self.ci_holm else None, "verdict": self.verdict}


def _tail_p(diff: Difference, bound: float, side: str) -> float | None:
    """Two-sided-scale p-value of "the interval's ``side`` bound lies beyond ``bound``" (``low``: the lower bound
    above ``bound``; ``high``: the upper bound below it): the smallest alpha whose 1 - alpha interval shows it."""
    if diff.low is None or diff.high is None:
        return None
    half = (diff.high - diff.low) / 2
    q = float(scipy_stats.t.ppf(0.5 + diff.confidence / 2, _df(diff)))
    se = half / q
    t = (diff.mean - bound) / se if side == "low" else (bound - diff.mean) / se
    return float(min(1.0, 2 * scipy_stats.t.sf(t, _df(diff))))


def _df(diff: Difference) -> float:
    return diff.df if diff.df is not None else diff.n - 1


def _interval_at(diff: Difference, confidence: float) -> tuple[float, float] | None:
    if diff.low is None or diff.high is None:
        return None
    df = _df(diff)
    se = (diff.high - diff.low) / 2 / float(scipy_stats.t.ppf(0.5 + diff.confidence / 2, df))
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2, df)) * se
    return diff.mean - half, diff.mean + half


def _claims(primary: Primary, alpha: float) -> list[tuple[str, float | None]]:
    """(claim, two-sided-scale p) pairs a primary can make: with a margin, "within the margin" (lower bound above
    -margin), "worse" (upper bound below 0) and "better" (lower bound above 0); without, "better" / "worse"."""
    d = primary.diff
    claims = [("better", _tail_p(d, 0.0, "low")), ("worse", _tail_p(d, 0.0, "high"))]
    if primary.margin is not None:
        claims.append(("within margin", _tail_p(d, -primary.margin, "low")))
    return claims


def margin_family(primaries: list[Primary], alpha: float = 0.05) -> list[Primary]:
    """Holm over a pre-registered family in interval form.

    Each primary's p is the smallest alpha at which its two-sided interval supports any of its claims; sorted by
    it, the k-th of m is read from its interval at confidence 1 - alpha / (m - k + 1) (the step-down level), and
    once one primary makes no claim the later ones make none. ``p_holm`` is Holm's adjusted p of that p.
    Verdicts: ``better`` / ``worse`` / ``inconclusive`` without a margin; with a margin ``within margin``
    (lower bound above -margin), ``worse, within margin`` (both bounds between -margin and 0), ``worse``
    (upper bound below 0, lower bound not above -margin), ``better`` (lower bound above 0), or
    ``inconclusive``. Degenerate members (no interval) are inconclusive and still count in m (the registered
    family size), as members that make no claim.
    """
    for prim in primaries:
        ps = [p for _, p in _claims(prim, alpha) if p is not None]
        prim.p = min(ps) if ps else None
    adjusted = holm_adjust([p.p for p in primaries], len(primaries))
    ordered = sorted((p for p in primaries if p.p is not None), key=lambda p: p.p)  # type: ignore[arg-type, return-value]
    m, stopped = len(primaries), False
    for prim, adj in zip(primaries, adjusted, strict=True):
        prim.p_holm = adj
    for rank, prim in enumerate(ordered):
        level = alpha / (m - rank)
        prim.confidence_holm = 1 - level
        prim.ci_holm = _interval_at(prim.diff, 1 - level)
        made = set() if stopped else {c for c, p in _claims(prim, alpha) if p is not None and p < level}
        prim.verdict = _margin_verdict(made, prim.margin is not None)
        stopped = stopped or not made
    for prim in primaries:
        if prim.p is None:
            prim.verdict = "inconclusive"
    return primaries


def _margin_verdict(made: set[str], has_margin: bool) -> str:
    if "better" in made:
        return "better"
    if "worse" in made:
        return "worse, within margin" if "within margin" in made else "worse"
    if "within margin" in made and has_margin:
        return "within margin"
    return "inconclusive"
