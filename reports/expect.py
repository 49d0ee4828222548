"""A trial's measured metrics against the scenario's expectations for its policy."""
from __future__ import annotations

import math
from typing import Any, Mapping

import pandas as pd

from reports.metrics import seconds

# expectation key -> (metric column, what the bound is about)
TIME_BOUNDS = {
    "detect_within": ("ttd_s", "time to detect"),
    "recover_within": ("ttr_s", "time to recover"),
    "breaker_within": ("breaker_open_s", "breaker open"),
}


def _number(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.nan
    return number


def measured_text(metrics: Mapping[str, Any], column: str) -> str:
    """A measured time in words; a hung trial shows its cap, never a number it did not see."""
    value = _number(metrics.get(column))
    if not math.isnan(value):
        return f"{value:.2f} s"
    cap = _number(metrics.get("hung_cap"))
    if not math.isnan(cap):
        return f"nothing measured: hung >= {cap:g} s"
    return f"nothing measured (outcome {metrics.get('outcome', '?')})"


def check_expectations(metrics: Mapping[str, Any], expect: Mapping[str, Any] | None) -> list[str]:
    """One message per unmet expectation, naming it, its bound and the measured value.

    `expect` keys: outcome (a name or a list of acceptable names), detect_within,
    recover_within, breaker_within (seconds, or strings such as "15s")."""
    if not expect:
        return []
    failures = []
    wanted = expect.get("outcome")
    if wanted is not None:
        allowed = [str(w) for w in wanted] if isinstance(wanted, (list, tuple)) else [str(wanted)]
        if metrics.get("outcome") not in allowed:
            failures.append(f"outcome: expected {' or '.join(allowed)}, measured {metrics.get('outcome')}")
    for key, (column, meaning) in TIME_BOUNDS.items():
        if expect.get(key) is None:
            continue
        bound = seconds(expect[key])
        if math.isnan(bound):
            failures.append(f"{key}: unreadable bound {expect[key]!r} (expected seconds such as \"15s\")")
            continue
        value = _number(metrics.get(column))
        if math.isnan(value) or value > bound:
            failures.append(f"{key} {bound:g} s: {meaning} {measured_text(metrics, column)}")
    return failures


FAILURE_SEPARATOR = "; "  # joins a trial's failures in its expect_failures column; no message has it


def expectation_failures(table: pd.DataFrame) -> list[str]:
    """Every unmet expectation of an analyzed run, one line each: "<trial>: <failure>"."""
    return [f"{row['trial']}: {failure}" for _, row in table.iterrows()
            for failure in str(row.get("expect_failures") or "").split(FAILURE_SEPARATOR) if failure]
