"""The studies' paired comparisons: intervals cross-checked against scipy, three verdicts, never "equal"."""

import sys
from pathlib import Path

import pytest
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from paired_stats import paired_difference, seeds_disagree  # noqa: E402


def test_interval_is_scipys_paired_t_interval() -> None:
    a = [24.1, 23.7, 25.0, 22.9, 24.4]
    b = [23.9, 23.8, 24.1, 22.0, 24.0]
    ours = paired_difference(a, b)
    ci = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert ours.low == pytest.approx(ci.low) and ours.high == pytest.approx(ci.high)
    assert ours.n == 5 and ours.wins == 4 and ours.mean == pytest.approx(0.46)


def test_three_verdicts() -> None:
    assert paired_difference([1.0, 1.1, 0.9], [0.0, 0.1, 0.0]).verdict == "better"
    assert paired_difference([0.0, 0.1, 0.0], [1.0, 1.1, 0.9]).verdict == "worse"
    # a consistent sign with a wide interval is still inconclusive at n = 2
    assert paired_difference([1.0, 0.1], [0.0, 0.0]).verdict == "inconclusive"
    one = paired_difference([5.0], [0.0])
    assert one.verdict == "inconclusive" and one.low is None and "no interval" in one.describe()


def test_bad_pairs_are_refused() -> None:
    with pytest.raises(ValueError, match="equally long"):
        paired_difference([1.0, 2.0], [1.0])


def test_diverging_seeds_are_flagged() -> None:
    assert seeds_disagree([21.7, 24.0], others_spread=0.07)
    assert not seeds_disagree([23.39, 23.41], others_spread=0.07)
    assert not seeds_disagree([23.4], others_spread=0.07)
