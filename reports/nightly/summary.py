"""A night's figures per scenario x policy over its repeats: outcomes as counts, every metric
of NIGHTLY_METRICS as median, interquartile range, bootstrap interval and n."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from reports.nightly.history import NIGHTLY_METRICS, History, Metric, reproduce_command, trial_rows
from reports.nightly.stats import Counts, Interval, Quartiles, bootstrap_median, counts, figure_text, quartiles


@dataclass(frozen=True)
class Figure:
    metric: Metric
    quartiles: Quartiles
    interval: Interval | None  # None for n=1

    def text(self) -> str:
        return figure_text(self.quartiles, self.metric.unit, self.interval)


@dataclass(frozen=True)
class PolicyNight:
    """Tonight's repeats of one scenario x policy."""

    scenario: str
    policy: str
    fault: str
    outcomes: Counts
    hung_cap: float                      # the largest cap of a hung repeat; NaN when none hung
    figures: tuple[Figure, ...]          # the metrics measured in at least one repeat
    expected: bool                       # whether the scenario sets an expectation for the policy
    expect_failures: tuple[str, ...]     # per repeat that missed it: what, and how to reproduce it

    def figure(self, column: str) -> Figure | None:
        return next((f for f in self.figures if f.metric.column == column), None)

    def outcome_text(self) -> str:
        """"recovered 4/5, hung 1/5 (hung >= 30 s, the harness cap)"."""
        hung = "" if math.isnan(self.hung_cap) else f" (hung >= {self.hung_cap:g} s, the harness cap)"
        return self.outcomes.text() + hung

    def expectation_text(self) -> str:
        if not self.expected:
            return "none set"
        if not self.expect_failures:
            return f"met {self.outcomes.n}/{self.outcomes.n}"
        return f"FAILED in {len(self.expect_failures)}/{self.outcomes.n}: " + "; ".join(self.expect_failures)


def _policy_night(trials: pd.DataFrame, rng: np.random.Generator) -> PolicyNight:
    first = trials.iloc[0]
    figures = []
    for metric in NIGHTLY_METRICS:
        values = trials[metric.column].dropna()
        if len(values):
            figures.append(Figure(metric, quartiles(values), bootstrap_median(values, rng)))
    failed = trials[trials["expect_failures"] != ""]
    return PolicyNight(
        scenario=str(first["scenario"]), policy=str(first["policy"]), fault=str(first["fault"]),
        outcomes=counts(trials["outcome"]), hung_cap=float(trials["hung_cap"].max()),
        figures=tuple(figures), expected=bool((trials["expect"] != "").any()),
        expect_failures=tuple(f"repeat {row['repeat']}: {row['expect_failures']} (reproduce: {reproduce_command(row)})"
                              for _, row in failed.iterrows()))


def summarize_night(history: History, night: str, rng: np.random.Generator) -> tuple[PolicyNight, ...]:
    """One PolicyNight per scenario x policy of the night, in the order they ran; `rng`
    drives the bootstrap intervals."""
    rows = trial_rows(history, night)
    return tuple(_policy_night(trials, rng) for _, trials in rows.groupby(["scenario", "policy"], sort=False))
