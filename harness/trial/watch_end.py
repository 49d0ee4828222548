"""Whether a trial's watch ends at a round, and why: one pure decision over what the watch
knows then (a `Round`, gathered once per round by harness.trial.orchestrator), judged by
ordered rules. The orchestrator's loop is their one interpreter: it acts on the rule that
matched (says why, captures stacks, restarts a requeued job) and ends the trial with the
rule's `end`. Each rule is tested by a table of rounds (tests/harness/test_watch_end.py),
without running a trial."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Round:
    """What the watch knows at one round. Times are seconds since warm-up ended."""

    since_warm_s: float
    deadline_s: float          # the trial's deadline (the plan's, plus a campaign's settling)
    live: frozenset[int]       # ranks whose processes run
    relaunching: bool          # a killed host of a framework is to start again after its delay
    requeue: str | None        # once no rank runs: None, the job is over; "ready"; or "pending"
    waiting: bool              # a fault to apply or revert, an anchored fault's event, a relaunch
    steps_observed: bool       # False: a user's job made no step by its start_timeout
    settled: bool              # every live rank not held for good made the settle steps
    frozen: frozenset[int]     # live ranks frozen by a fault that never heals
    idle_s: float              # since the last rank event
    hang_cap: float
    last_action_s: float       # the plan's last fault action


@dataclass(frozen=True)
class Rule:
    name: str
    matches: Callable[[Round], bool]
    end: str | None  # the trial's end (TrialResult.end); None: the watch acts and goes on


def _over(r: Round) -> bool:
    """No rank runs and none is to start again by the framework."""
    return not r.live and not r.relaunching


RULES: tuple[Rule, ...] = (
    Rule("all-exited", lambda r: _over(r) and r.requeue is None, "all-exited"),
    # the scheduler started the job again: every rank starts from the top
    Rule("requeued", lambda r: _over(r) and r.requeue == "ready", None),
    # the scheduler is to start the job again (Slurm holds a requeued job for its
    # credentials' lifetime, 120 s by default): nothing runs to settle or hang
    Rule("requeue-late", lambda r: _over(r) and r.since_warm_s > r.deadline_s, "deadline"),
    Rule("requeue-pending", _over, None),
    # a rank frozen or cut off for good never steps with the others again: they settle without it
    Rule("settled", lambda r: not r.waiting and r.settled, "settled"),
    Rule("held", lambda r: not r.waiting and r.steps_observed and r.live <= r.frozen, "held"),
    # no step can tell hung from training: a job without steps is watched to the cap
    Rule("cap", lambda r: not r.steps_observed and not r.waiting
         and r.since_warm_s - r.last_action_s >= r.hang_cap, "cap"),
    Rule("hung", lambda r: r.steps_observed and r.idle_s >= r.hang_cap and r.since_warm_s >= r.hang_cap, "hung"),
    Rule("deadline", lambda r: r.since_warm_s > r.deadline_s, "deadline"),
)


def decide(r: Round) -> Rule | None:
    """The first rule that matches `r`; None: the watch goes on."""
    return next((rule for rule in RULES if rule.matches(r)), None)
