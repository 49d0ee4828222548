"""A trial's measured metrics against the expectation its plan stored (runfolder.plan):
the one verdict, used by the reports, `chaos run` and `pytest scenarios/`."""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

import pandas as pd

from runfolder.plan import Expectation

# expectation bound -> (metric column, what the bound is about)
TIME_BOUNDS = {
    "detect_within": ("ttd_s", "time to detect"),
    "recover_within": ("ttr_s", "time to recover"),
    "breaker_within": ("breaker_open_s", "breaker open"),
}
FAILURE_SEPARATOR = "; "  # joins a trial's failures in its expect_failures column; no message has it


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


def check_expectations(metrics: Mapping[str, Any], expect: Expectation | None) -> list[str]:
    """One message per unmet expectation, naming it, its bound and the measured value."""
    if expect is None:
        return []
    failures = []
    if expect.outcome and metrics.get("outcome") not in expect.outcome:
        failures.append(f"outcome: expected {' or '.join(expect.outcome)}, measured {metrics.get('outcome')}")
    for key, bound in expect.bounds().items():
        column, meaning = TIME_BOUNDS[key]
        value = _number(metrics.get(column))
        if math.isnan(value) or value > bound:
            failures.append(f"{key} {bound:g} s: {meaning} {measured_text(metrics, column)}")
    state = metrics.get("state")
    if (expect.state is not None and state != expect.state) or (expect.state is None and state == "diverged"):
        failures.append(f"state: expected {expect.state or 'not diverged'}, measured {metrics.get('state_detail') or state}")
    if expect.stuck_in is not None and expect.stuck_in not in str(metrics.get("stuck_in") or ""):
        failures.append(f"stuck_in {expect.stuck_in!r}: stuck in: {metrics.get('stuck_in') or 'nothing captured'}")
    if expect.steps_lost_at_most is not None:
        lost = _number(metrics.get("steps_lost"))
        if math.isnan(lost) or lost > expect.steps_lost_at_most:
            failures.append(f"steps_lost_at_most {expect.steps_lost_at_most}: "
                            f"{'not measured (no preemption or requeue)' if math.isnan(lost) else f'{lost:g} steps lost'}")
    if expect.suspects_at_most is not None and (suspects := int(metrics.get("suspect_events", 0))) > expect.suspects_at_most:
        failures.append(f"suspects_at_most {expect.suspects_at_most}: {suspects} suspect events")
    ranks = _number(metrics.get("ranks"))
    if expect.ranks_lost_at_most is not None:
        world = _number(metrics.get("final_world"))
        if math.isnan(world) or ranks - world > expect.ranks_lost_at_most:
            failures.append(f"ranks_lost_at_most {expect.ranks_lost_at_most}: "
                            + ("no group formed after the fault" if math.isnan(world)
                               else f"a final world of {world:g} of {ranks:g} ranks"))
    if expect.undetected_at_most is not None:
        detected = _number(metrics.get("detect_ranks"))
        if math.isnan(detected) or ranks - detected > expect.undetected_at_most:
            failures.append(f"undetected_at_most {expect.undetected_at_most}: "
                            f"{0 if math.isnan(detected) else detected:g} of {ranks:g} ranks detected the fault")
    return failures


def expectation_json(expect: Expectation) -> str:
    """The expectation as set (no empty field), for the `expect` column."""
    return json.dumps({k: v for k, v in dataclasses.asdict(expect).items() if v not in (None, ())},
                      sort_keys=True)


def trial_failures(row: Mapping[str, Any]) -> list[str]:
    """The unmet expectations of one analyzed trial (a row of `analyze_run`)."""
    return [failure for failure in str(row.get("expect_failures") or "").split(FAILURE_SEPARATOR) if failure]


def expectation_failures(table: pd.DataFrame) -> list[str]:
    """Every unmet expectation of an analyzed run, one line each: "<trial>: <failure>"."""
    return [f"{row['trial']}: {failure}" for _, row in table.iterrows() for failure in trial_failures(row)]
