"""Figures of repeated trials: median and interquartile range with n, a bootstrap interval
of the median, outcomes as counts, and the one-sided rank-sum test the gate uses.

One run has no spread: its figure is labelled n=1 and no interval is invented for it.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import pandas as pd

BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Quartiles:
    n: int
    q1: float
    median: float
    q3: float

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1


@dataclass(frozen=True)
class Interval:
    """A percentile bootstrap interval of the median."""

    low: float
    high: float
    confidence: float


def _finite(values: Iterable[float]) -> np.ndarray:
    data = np.asarray([float(v) for v in values], dtype=float)
    return data[~np.isnan(data)]


def quartiles(values: Iterable[float]) -> Quartiles:
    """Quartiles of the values that are numbers (linear interpolation); NaN ones are not counted."""
    data = _finite(values)
    if not len(data):
        raise ValueError("quartiles of no values")
    q1, median, q3 = np.percentile(data, [25, 50, 75])
    return Quartiles(n=len(data), q1=float(q1), median=float(median), q3=float(q3))


def bootstrap_median(values: Iterable[float], rng: np.random.Generator,
                     resamples: int = BOOTSTRAP_RESAMPLES, confidence: float = CONFIDENCE) -> Interval | None:
    """The percentile bootstrap interval of the median; None for a single value (no spread)."""
    data = _finite(values)
    if len(data) < 2:
        return None
    medians = np.median(rng.choice(data, size=(resamples, len(data)), replace=True), axis=1)
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(medians, [tail, 100 - tail])
    return Interval(low=float(low), high=float(high), confidence=confidence)


def number_text(value: float) -> str:
    """Two decimals below 10, one below 100, whole numbers from 100 up."""
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def figure_text(figure: Quartiles, unit: str, interval: Interval | None = None) -> str:
    """"5.20 s (IQR 5.10-5.30, 95% CI 5.12-5.28, n=5)"; one run: "5.20 s (n=1, one run: no spread)"."""
    head = f"{number_text(figure.median)} {unit}"
    if figure.n == 1:
        return f"{head} (n=1, one run: no spread)"
    parts = [f"IQR {number_text(figure.q1)}-{number_text(figure.q3)}"]
    if interval is not None:
        parts.append(f"{interval.confidence:.0%} CI {number_text(interval.low)}-{number_text(interval.high)}")
    return f"{head} ({', '.join(parts)}, n={figure.n})"


@dataclass(frozen=True)
class Counts:
    """How often each value (an outcome, a verdict) happened; the most frequent first (ties by name)."""

    counts: tuple[tuple[str, int], ...]

    @property
    def n(self) -> int:
        return sum(count for _, count in self.counts)

    @property
    def most_common(self) -> str:
        return self.counts[0][0]

    def text(self) -> str:
        """"recovered 4/5, failed-fast 1/5"."""
        return ", ".join(f"{value} {count}/{self.n}" for value, count in self.counts)


def counts(values: Iterable[str]) -> Counts:
    counted = Counter(str(v) for v in values)
    if not counted:
        raise ValueError("counts of no values")
    return Counts(tuple(sorted(counted.items(), key=lambda item: (-item[1], item[0]))))


def rank_sum_greater(sample: Iterable[float], reference: Iterable[float]) -> float:
    """One-sided p-value of the Mann-Whitney rank-sum test that `sample` tends to be larger
    than `reference`: the normal approximation with tie and continuity corrections (what
    scipy.stats.mannwhitneyu calls method="asymptotic"). 1.0 when there is nothing to rank
    (an empty side, or every value equal)."""
    x, y = _finite(sample), _finite(reference)
    n1, n2 = len(x), len(y)
    if not n1 or not n2:
        return 1.0
    both = np.concatenate([x, y])
    ranks = pd.Series(both).rank(method="average").to_numpy()
    u = float(ranks[:n1].sum()) - n1 * (n1 + 1) / 2
    n = n1 + n2
    ties = np.unique(both, return_counts=True)[1].astype(float)
    variance = n1 * n2 / 12 * ((n + 1) - float((ties ** 3 - ties).sum()) / (n * (n - 1)))
    if variance <= 0:
        return 1.0
    z = (u - n1 * n2 / 2 - 0.5) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2))


def smallest_rank_sum_p(n_sample: int, n_reference: int) -> float:
    """The smallest p-value rank_sum_greater can give for these sizes: every sample value
    above every reference value. When it is not below the significance level, the test
    cannot tell a shift from noise at these sizes, whatever the values."""
    return rank_sum_greater(n_reference + np.arange(n_sample), np.arange(n_reference))  # no ties
