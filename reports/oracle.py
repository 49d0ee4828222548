"""The oracle of `chaos explore` (docs/explore.md): did one trial keep its policy's
contract, and if not, its failure signature. Pure: a trial's analyzed row (reports.metrics)
and its stored plan (runfolder.plan) in, a verdict out.

The contract, where the scenario sets no `expect:` for the trial (one that does is judged
by it: its failed expectations are the violations):
  outcome   a fault-tolerant policy (any with a timeout below the hang cap; a user's job with
            torchrun restarts) ends absorbed, recovered, continued, isolated or failed-fast,
            retries-exhausted only under a fault that never
            heals; never hung (its timeout ends any wait). A policy without a timeout before
            the cap (baseline, a user's job without restarts) may hang or crash: it is held
            to state and trajectory alone.
  state     never diverged (consistent, or not observed)
  trajectory never differs from the fault-free run's (matches, changed, or not observed)
A trial the harness could not judge (incomplete, inconclusive, bypassed: the fault never
reached the job's traffic; no-fault: no fault was applied, its events never came) is
unjudged, neither kept nor broken, whatever the scenario expects.

The signature is what shrinking keeps constant: each violated invariant with its cause,
rank numbers as `rN`, counts of ranks as `N of N` and times as `N s` (a smaller schedule
moves which ranks and how many, not what happened), and a crash by how its first rank
ended, without its error's words: one torn checkpoint read twice fails as `EOFError` and
as `negative seek value -307`, and a crash's error is not always caught (the found file's
"why" names it): "outcome crashed: rN-rN crashed (first rN, exit code 1)".
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from runfolder.plan import TrialPlan

TOLERANT_ENDS = ("absorbed", "recovered", "continued", "isolated", "failed-fast")
# no-fault: every fault's event never came (or its rank was gone): the trial says nothing
UNJUDGED = ("incomplete", "inconclusive", "bypassed", "no-fault")
KEPT, BROKEN, NOT_JUDGED = "kept", "broken", "unjudged"
_RANKS = re.compile(r"\br\d+\b")
_COUNTS = re.compile(r"\b\d+ of \d+\b")  # "3 of 4 ranks exited": how many moves with the targets
_CRASH_ERROR = re.compile(r"(crashed \(first rN, [^:()]+): .*\)$")  # reports.outcome: "(first rN, HOW: ERROR)"


@dataclass(frozen=True)
class Verdict:
    verdict: str                      # KEPT | BROKEN | NOT_JUDGED
    violations: tuple[str, ...]       # "outcome crashed: ..." (empty unless broken)
    signature: str                    # the violations with rank numbers as rN ("" unless broken)


def _text(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def fault_tolerant(plan: TrialPlan) -> bool:
    """Whether the contract holds the trial's outcome to recovering or failing fast: a policy
    whose timeout comes before the hang cap, or a user's job that torchrun restarts."""
    if plan.job is not None:
        return int(plan.job.get("max_restarts") or 0) > 0
    return float(plan.policy_spec.get("timeout", math.inf)) < plan.hang_cap


def _outcome_violation(row: Mapping[str, Any], plan: TrialPlan) -> str | None:
    outcome, why = _text(row.get("outcome")), _text(row.get("outcome_reason"))
    permanent = any(f.duration is None for f in plan.faults)  # a kill too: that rank never comes back
    if outcome in TOLERANT_ENDS or not fault_tolerant(plan):
        return None
    if outcome == "retries-exhausted" and permanent:
        return None
    return f"outcome {outcome}" + (f": {why}" if why else "")


def judge(row: Mapping[str, Any], plan: TrialPlan) -> Verdict:
    """The verdict on one trial: its analyzed row and the plan it ran."""
    outcome = _text(row.get("outcome"))
    if outcome in UNJUDGED:
        return Verdict(NOT_JUDGED, (), "")
    if plan.expect is not None:
        failures = tuple(f for f in _text(row.get("expect_failures")).split("; ") if f)
        violations = () if row.get("expect_ok") else (failures or (f"expectation not met (outcome {outcome})",))
    else:
        found = [_outcome_violation(row, plan)]
        if _text(row.get("state")) == "diverged":
            found.append(f"state diverged: {_text(row.get('state_detail'))}")
        if _text(row.get("trajectory")) == "differs":
            found.append(f"trajectory differs: {_text(row.get('trajectory_detail'))}")
        violations = tuple(v for v in found if v)
    if not violations:
        return Verdict(KEPT, (), "")
    return Verdict(BROKEN, violations, signature(violations))


def signature(violations: tuple[str, ...]) -> str:
    """The violations as shrinking compares them: rank numbers as rN, figures as N."""
    return "; ".join(_CRASH_ERROR.sub(r"\1)", _COUNTS.sub("N of N", re.sub(r"\d+(\.\d+)?\s*s\b", "N s",
                                                                             _RANKS.sub("rN", v))))
                     for v in violations)
