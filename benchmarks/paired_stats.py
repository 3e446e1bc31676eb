"""The study reports' comparison helpers: :mod:`looprun.statistics` (paired and Welch t-intervals with three
verdicts, Holm's correction), re-exported under the name the reports import."""

from __future__ import annotations

from looprun.statistics import (  # noqa: F401
    VERDICTS,
    Difference,
    PairedDifference,
    apply_holm,
    holm_adjust,
    paired_difference,
    seeds_disagree,
    welch_difference,
)
