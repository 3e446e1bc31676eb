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


def test_zero_spread_is_degenerate_not_significant() -> None:
    # one checkpoint listed twice per arm: every pair differs by exactly 0.035 dB
    same = paired_difference([24.035, 24.035], [24.0, 24.0])
    assert same.verdict == "inconclusive" and same.p is None and same.low is None
    assert welch_difference([1.0, 1.0], [0.5, 0.5]).verdict == "inconclusive"
    # the same at float-rounding level: 24.035 - 24.0 computed from different sums
    rounding = paired_difference([24.035, 24.035 + 3e-15, 24.035 - 2e-15], [24.0, 24.0, 24.0])
    assert rounding.verdict == "inconclusive" and rounding.p is None
    # a real, tiny spread is not degenerate
    assert paired_difference([24.035, 24.036, 24.034], [24.0, 24.0, 24.0]).verdict == "better"


def test_margin_family_reads_holm_in_interval_form() -> None:
    from looprun.statistics import Primary, margin_family

    # a small, tight cost: inside the margin and below zero at once
    tight = paired_difference([24.0, 24.1, 23.9, 24.05, 23.95], [24.1, 24.2, 24.0, 24.14, 24.06])
    # wide: nothing can be claimed
    wide = paired_difference([24.0, 25.0, 23.0], [24.2, 24.1, 24.0])
    # a large, clear deficit without a margin
    clear = paired_difference([22.0, 22.1, 21.9], [23.0, 23.05, 22.95])
    fam = margin_family([Primary("Q1", tight, 0.2), Primary("Q2", wide, 0.2), Primary("P", clear)])
    assert [p.verdict for p in fam] == ["worse, within margin", "inconclusive", "worse"]
    # the first primary in Holm order is read at 1 - 0.05 / 3, its interval wider than the 95% one
    first = min(fam, key=lambda p: p.p)
    assert first.confidence_holm == pytest.approx(1 - 0.05 / 3)
    assert first.ci_holm[0] < first.diff.low and first.ci_holm[1] > first.diff.high
    # the within-margin p is scipy's one-sided test of mean > -0.2, on the two-sided scale
    ref = stats.ttest_1samp([a - b for a, b in zip([24.0, 24.1, 23.9, 24.05, 23.95],
                                                    [24.1, 24.2, 24.0, 24.14, 24.06], strict=True)], -0.2,
                            alternative="greater")
    assert fam[0].p <= 2 * ref.pvalue + 1e-12
    assert fam[0].as_dict()["margin"] == 0.2 and fam[0].as_dict()["ci"] == [tight.low, tight.high]


def test_margin_family_steps_down() -> None:
    from looprun.statistics import Primary, margin_family

    weak = paired_difference([0.3, 0.12, 0.33, 0.1], [0.0] * 4)  # p between 0.0125 and 0.05
    assert 0.0125 < weak.p < 0.05
    fam = margin_family([Primary("a", weak), Primary("b", paired_difference([0.0, 0.1, -0.1], [0.0] * 3))])
    assert [p.verdict for p in fam] == ["inconclusive", "inconclusive"]


def test_a_degenerate_member_still_counts_in_the_registered_family_size() -> None:
    """Holm over a registered m = 2: a member without an interval makes no claim but keeps m at 2, so the other
    is read at 1 - 0.05 / 2, not at 95% (which would make its correction milder than registered)."""
    from looprun.statistics import Primary, margin_family

    weak = paired_difference([0.3, 0.12, 0.33, 0.1], [0.0] * 4)  # p between 0.025 and 0.05
    assert 0.025 < weak.p < 0.05
    degenerate = paired_difference([24.035, 24.035], [24.0, 24.0])
    fam = margin_family([Primary("a", weak), Primary("b", degenerate)])
    assert fam[0].confidence_holm == pytest.approx(1 - 0.05 / 2) and fam[0].p_holm == pytest.approx(2 * weak.p)
    assert [p.verdict for p in fam] == ["inconclusive", "inconclusive"]
    assert margin_family([Primary("a", weak)])[0].verdict == "better"  # alone it would be read at 95%
