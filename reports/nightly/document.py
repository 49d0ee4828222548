"""The source document's table, row by row, against a night's repeats.

For each row of reports.tables.DOCUMENT_CLAIMS (baseline: deadlock ~5.2 h under packet loss;
timeout: noticed in 15 s; retry: restored within 12 s; isolation: breaker opens in 30 s):
every scenario x policy of the night that the row is about (the policy or a variant of
it, on the document's fault where the night ran it, else on whatever fault it ran), with
the claim, the outcomes and the median and spread of the claim's figure, and whether the
claim held. The verdict is reports.tables.judge_claim's, trial by trial: yes or no when
every repeat agrees, partly otherwise; its reason is judge_claim's on the median.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import pandas as pd

from reports.nightly.campaign import is_campaign
from reports.nightly.history import History, trial_rows
from reports.nightly.stats import counts
from reports.nightly.summary import PolicyNight
from reports.tables import DOCUMENT_CLAIMS, Claim, claim_for, judge_claim, markdown_table

NOT_RUN = "not run"
CLAIM_COLUMNS = ("document's policy", "document's claim", "scenario", "policy", "measured", "claim held?")


@dataclass(frozen=True)
class ClaimCheck:
    document_policy: str   # the DOCUMENT_CLAIMS key
    claim: Claim
    scenario: str          # "" when the night ran no such policy
    policy: str
    measured: str          # outcomes, and the claim's figure as median, spread and n
    verdict: str           # yes / no / partly, or NOT_RUN
    why: str


def _check(key: str, claim: Claim, trials: pd.DataFrame, summary: PolicyNight) -> ClaimCheck:
    verdicts = [judge_claim(row)[0] for _, row in trials.iterrows()]
    figure = summary.figure(claim.column) if claim.column is not None else None
    # the repeats as one row for judge_claim: the most common outcome, the median figure
    median_row = {**trials.iloc[0].to_dict(), "outcome": summary.outcomes.most_common, "hung_cap": summary.hung_cap}
    if claim.column is not None:
        median_row[claim.column] = figure.quartiles.median if figure is not None else math.nan
    _, why = judge_claim(median_row)
    measured = summary.outcome_text() + (f"; {figure.metric.label} {figure.text()}" if figure is not None else "")
    return ClaimCheck(document_policy=key, claim=claim, scenario=summary.scenario, policy=summary.policy,
                      measured=measured, verdict=verdicts[0] if len(set(verdicts)) == 1 else "partly",
                      why=f"per run: {counts(verdicts).text()}; on the median: {why}")


def _rows_where(frame: pd.DataFrame, keep: Callable[[pd.Series], bool]) -> pd.DataFrame:
    return frame[pd.Series([keep(row) for _, row in frame.iterrows()], index=frame.index, dtype=bool)]


def _claim_checks(key: str, claim: Claim, rows: pd.DataFrame,
                  by_series: dict[tuple[str, str], PolicyNight]) -> list[ClaimCheck]:
    mine = _rows_where(rows, lambda row: claim_for(row) is claim)
    on_its_fault = _rows_where(mine, lambda row: any(kind in row["fault"] for kind in claim.fault_kinds))
    mine = on_its_fault if len(on_its_fault) else mine
    if not len(mine):
        return [ClaimCheck(key, claim, "", "", "-", NOT_RUN, f"the night ran no {key} policy")]
    return [_check(key, claim, trials, by_series[series])
            for series, trials in mine.groupby(["scenario", "policy"], sort=False)]


def document_checks(history: History, night: str, summaries: tuple[PolicyNight, ...]) -> tuple[ClaimCheck, ...]:
    """The document's rows in its order; `summaries` is summarize_night's for the same night."""
    rows = trial_rows(history, night)
    # a campaign's rows are a window of many faults, not one of the document's trials
    rows = rows[~rows["scenario"].map(is_campaign).astype(bool)]
    by_series = {(s.scenario, s.policy): s for s in summaries}
    return tuple(check for key, claim in DOCUMENT_CLAIMS.items()
                 for check in _claim_checks(key, claim, rows, by_series))


def document_table(checks: tuple[ClaimCheck, ...]) -> str:
    """Markdown, readable as plain text."""
    return markdown_table(CLAIM_COLUMNS, [
        [c.document_policy, f"{c.claim.text} ({c.claim.figure_text})", c.scenario or "-", c.policy or "-",
         c.measured, f"{c.verdict}: {c.why}"] for c in checks])
