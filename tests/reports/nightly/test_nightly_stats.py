"""Median, IQR, bootstrap interval, counts and the rank-sum test."""
from __future__ import annotations

import math

import numpy as np
import pytest

from reports.nightly.stats import (Quartiles, bootstrap_median, counts, figure_text, quartiles, rank_sum_greater,
                                   smallest_rank_sum_p)


def test_quartiles_ignore_what_was_not_measured():
    q = quartiles([5.0, 1.0, math.nan, 3.0, 2.0, 4.0])
    assert q == Quartiles(n=5, q1=2.0, median=3.0, q3=4.0) and q.iqr == 2.0
    with pytest.raises(ValueError):
        quartiles([math.nan])


def test_bootstrap_interval_is_seeded_and_brackets_the_median():
    values = [11.2, 12.0, 12.4, 11.8, 15.0, 12.1, 11.9]
    rng = np.random.default_rng(7)
    before = rng.bit_generator.state
    first = bootstrap_median(values, rng)
    assert rng.bit_generator.state != before  # the resamples come from the generator passed in
    assert first == bootstrap_median(values, np.random.default_rng(7))
    assert min(values) <= first.low <= 12.0 <= first.high <= max(values) and first.confidence == 0.95


def test_bootstrap_of_one_run_is_none_and_of_equal_runs_is_a_point():
    assert bootstrap_median([4.0], np.random.default_rng(0)) is None
    same = bootstrap_median([4.0, 4.0, 4.0], np.random.default_rng(0))
    assert (same.low, same.high) == (4.0, 4.0)


def test_figure_text_always_says_n_and_labels_one_run():
    q = quartiles([5.1, 5.2, 5.3, 5.2, 5.4])
    interval = bootstrap_median([5.1, 5.2, 5.3, 5.2, 5.4], np.random.default_rng(0))
    assert figure_text(q, "s") == "5.20 s (IQR 5.20-5.30, n=5)"
    assert figure_text(q, "s", interval) == f"5.20 s (IQR 5.20-5.30, 95% CI {interval.low:.2f}-{interval.high:.2f}, n=5)"
    assert figure_text(quartiles([12.34]), "s") == "12.3 s (n=1, one run: no spread)"
    assert figure_text(quartiles([1234.0, 1300.0]), "rank-s").startswith("1267 rank-s (IQR 1250-1284")


def test_counts_most_frequent_first():
    outcomes = counts(["recovered", "failed-fast", "recovered", "recovered", "recovered"])
    assert outcomes.text() == "recovered 4/5, failed-fast 1/5"
    assert outcomes.n == 5 and outcomes.most_common == "recovered"
    assert counts(["hung", "crashed"]).text() == "crashed 1/2, hung 1/2"  # ties by name
    with pytest.raises(ValueError):
        counts([])


def test_rank_sum_matches_the_normal_approximation_by_hand():
    # ranks of 4, 5, 6 among 1..6: 4+5+6 = 15, U = 15 - 3*4/2 = 9; mean n1*n2/2 = 4.5;
    # variance n1*n2*(n+1)/12 = 9*7/12 = 5.25 (no ties); z = (9 - 4.5 - 0.5)/sqrt(5.25)
    z = 4.0 / math.sqrt(5.25)
    assert rank_sum_greater([4, 5, 6], [1, 2, 3]) == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)))
    assert rank_sum_greater([4, 5, 6], [1, 2, 3]) == pytest.approx(0.0404, abs=1e-4)
    assert rank_sum_greater([1, 2, 3], [4, 5, 6]) > 0.95  # one-sided: smaller is not "greater"


def test_rank_sum_corrects_for_ties():
    # 1,1 | 2,2 | 3 ranked: 1.5 1.5 3.5 3.5 5; x = (2, 3): U = 3.5 + 5 - 3 = 5.5; ties (2, 2):
    # variance 2*3/12 * (6 - (6 + 6)/(5*4)) = 2.7; z = (5.5 - 3 - 0.5)/sqrt(2.7)
    z = 2.0 / math.sqrt(2.7)
    assert rank_sum_greater([2, 3], [1, 1, 2]) == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)))


def test_rank_sum_with_nothing_to_rank_is_no_evidence():
    assert rank_sum_greater([2.0, 2.0], [2.0, 2.0, 2.0]) == 1.0
    assert rank_sum_greater([], [1.0]) == 1.0


def test_smallest_p_says_when_the_test_can_decide():
    assert smallest_rank_sum_p(1, 10) > 0.05   # one run tonight: never significant
    assert smallest_rank_sum_p(1, 35) > 0.05
    assert smallest_rank_sum_p(5, 35) < 0.001
