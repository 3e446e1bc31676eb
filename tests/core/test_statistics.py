"""looprun.statistics: paired and Welch intervals cross-checked against scipy, Holm's correction checked against
its definition, three verdicts, never "equal"."""

import pytest
from scipy import stats

from looprun.statistics import apply_holm, holm_adjust, paired_difference, seeds_disagree, welch_difference


def test_interval_is_scipys_paired_t_interval() -> None:
    a = [24.1, 23.7, 25.0, 22.9, 24.4]
    b = [23.9, 23.8, 24.1, 22.0, 24.0]
    ours = paired_difference(a, b)
    ci = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert ours.low == pytest.approx(ci.low) and ours.high == pytest.approx(ci.high)
    assert ours.n == 5 and ours.wins == 4 and ours.mean == pytest.approx(0.46)
    assert ours.p == pytest.approx(stats.ttest_rel(a, b).pvalue)


def test_welch_interval_and_p_are_scipys() -> None:
    a = [24.1, 23.7, 25.0, 22.9]
    b = [23.9, 23.8, 24.1, 22.0, 24.0, 23.5]
    ours = welch_difference(a, b)
    ref = stats.ttest_ind(a, b, equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert ours.low == pytest.approx(ci.low) and ours.high == pytest.approx(ci.high)
    assert ours.p == pytest.approx(ref.pvalue) and ours.test == "Welch t"
    assert (ours.n_a, ours.n_b, ours.n, ours.wins) == (4, 6, 4, None)
    assert welch_difference([1.0], [0.0, 0.1]).verdict == "inconclusive"


def test_holm_adjustment_by_its_definition() -> None:
    # sorted p: 0.01, 0.02, 0.03, 0.2 -> 4 x 0.01, max(0.04, 3 x 0.02), max(0.06, 2 x 0.03), max(0.06, 0.2)
    assert holm_adjust([0.03, 0.2, 0.01, None, 0.02]) == pytest.approx([0.06, 0.2, 0.04, None, 0.06], nan_ok=True)
    assert holm_adjust([0.6, 0.5]) == [1.0, 1.0]


def test_holm_turns_a_marginal_verdict_inconclusive() -> None:
    strong = paired_difference([1.0, 1.1, 0.9, 1.05], [0.0, 0.1, 0.0, 0.02])
    marginal = paired_difference([0.3, 0.12, 0.33, 0.1], [0.0, 0.0, 0.0, 0.0])
    assert marginal.verdict == "better" and 0.0125 < marginal.p < 0.05
    family = apply_holm([strong, marginal, paired_difference([0.0, 0.1, -0.1, 0.05], [0.0] * 4)])
    assert [d.verdict for d in family] == ["better", "inconclusive", "inconclusive"]
    assert family[1].p_adjusted == pytest.approx(min(1.0, 2 * marginal.p))


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
