"""A night's campaign cell (`chaos campaign` run by the nightly, docs/nightly.md) as history
rows, and its ETTR bars' judgement.

A campaign's window gives one row per policy, shaped like
reports.analyze_run's rows so that the night's history, summary, JUnit and trends take it
as they take a trial's: scenario `<scenario>-campaign` (its own series, never pooled with
the scenario's single-fault trials), the ETTR as the metric `ettr_pct`, the outcome
`continued` (its jobs trained through the window, started again as often as they ended) or
`hung` (a job hung to the cap on the way), the bar as the expectation, and a missed bar as
the expectation's failure, naming the policy, the measured ETTR and the bar. The gate
(reports.nightly.gate) fails a night with a missed bar, whatever the history.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import pandas as pd

from runfolder.info import RunFolderError
from runfolder.layout import CAMPAIGN_FILE, CAMPAIGN_FORMAT

if TYPE_CHECKING:
    from reports.campaign import PolicyMeasures

CAMPAIGN_SUFFIX = "-campaign"
REFERENCE = "reference"


@dataclass(frozen=True)
class EttrBar:
    """A policy's bar: ETTR at least `at_least`, and at least `of_reference_at_least` of the
    fault-free reference's ETTR (each a fraction; None: not asked)."""

    at_least: float | None = None
    of_reference_at_least: float | None = None

    def text(self) -> str:
        parts = ([f"ETTR >= {self.at_least:.0%}"] if self.at_least is not None else []) + (
            [f"ETTR >= {self.of_reference_at_least:.0%} of the fault-free reference's"]
            if self.of_reference_at_least is not None else [])
        return " and ".join(parts)


def judge_ettr(policy: str, bar: EttrBar, ettr: float, reference_ettr: float | None) -> list[str]:
    """Each bar the policy's measured ETTR misses, in words; [] when it meets them all. A
    relative bar with no reference measured (or none above 0) is a miss: it cannot be met."""
    misses = []
    if bar.at_least is not None and not ettr >= bar.at_least:
        misses.append(f"{policy}: ETTR {ettr:.1%} is below the bar {bar.at_least:.0%}")
    if bar.of_reference_at_least is not None:
        if reference_ettr is None or not reference_ettr > 0:
            misses.append(f"{policy}: ETTR {ettr:.1%} cannot be judged against the fault-free reference's: "
                          "the reference measured no ETTR")
        elif not ettr / reference_ettr >= bar.of_reference_at_least:
            misses.append(f"{policy}: ETTR {ettr:.1%} is {ettr / reference_ettr:.1%} of the fault-free reference's "
                          f"{reference_ettr:.1%}, below the bar {bar.of_reference_at_least:.0%}")
    return misses


def _outcome_reason(m: PolicyMeasures, reference_ettr: float | None) -> str:
    lost = ", ".join(f"{cause} {seconds:.1f} s" for cause, seconds in m.lost_s.items() if seconds >= 0.05)
    reference = "not measured" if reference_ettr is None else f"{reference_ettr:.1%}"
    return (f"ETTR {m.ettr:.1%} over {m.wall_s:.0f} s (the fault-free reference's: {reference}): "
            f"{len(m.faults)} faults applied, {m.segments} jobs, {m.final_ranks} ranks at the end; "
            f"lost {lost or 'nothing'}")


def campaign_trials(folder: Path, scenario: str, bars: Mapping[str, EttrBar]) -> pd.DataFrame:
    """The campaign folder's rows, one per policy in run order (the fault-free reference is
    in each row's reason, not a row: it is no policy a command could run alone); `bars` maps
    a policy to its bar (a policy without one has no expectation)."""
    from reports.campaign import campaign_measures  # matplotlib: only where a night ran a campaign

    path = Path(folder) / CAMPAIGN_FILE
    campaign: dict[str, Any] = json.loads(path.read_text())
    if campaign.get("format") != CAMPAIGN_FORMAT:
        raise RunFolderError(f"{path}: campaign format {campaign.get('format')!r}; this harness reads format "
                             f"{CAMPAIGN_FORMAT}: report it with the harness that made it")
    measured = campaign_measures(campaign)
    reference = measured.get(REFERENCE)
    reference_ettr = reference[0].ettr if reference else None
    rows = []
    for policy, entry in campaign["policies"].items():
        if policy == REFERENCE:
            continue
        bar = bars.get(policy)
        found = measured.get(policy)
        if found is None:  # it never finished a warm-up: nothing measured, which a bar counts as missed
            ettr, outcome = math.nan, "incomplete"
            reason = entry.get("error") or "its first job never finished its warm-up"
        else:
            m = found[0]
            ettr, outcome, reason = m.ettr, "hung" if m.hangs else "continued", _outcome_reason(m, reference_ettr)
        misses = [] if bar is None else (judge_ettr(policy, bar, ettr, reference_ettr) if not math.isnan(ettr)
                                         else [f"{policy}: no ETTR measured ({reason})"])
        rows.append({
            "scenario": scenario + CAMPAIGN_SUFFIX, "policy": policy, "policy_base": policy,
            "fault": f"{campaign['mix']['name']} mix, mean {campaign['mtbf_s']:g} s apart over {campaign['duration_s']:g} s",
            "seed": campaign["seed"], "outcome": outcome, "outcome_reason": reason, "hung_cap": math.nan,
            "timeout_s": math.nan, "expect": "" if bar is None else bar.text(), "expect_failures": "; ".join(misses),
            "run": str(Path(folder)), "state": "", "state_detail": "",
            "ettr_pct": 100 * ettr,
        })
    return pd.DataFrame(rows)


def is_campaign(scenario: str) -> bool:
    return scenario.endswith(CAMPAIGN_SUFFIX)
