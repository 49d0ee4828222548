"""The watch's ending rules (harness.trial.watch_end), one round each: which rule a round
matches, and that the first in order wins where several could."""
from __future__ import annotations

from dataclasses import replace

import pytest

from harness.trial.watch_end import RULES, Round, decide

# a round of a training watch in the middle: faults done, ranks stepping, nothing due
TRAINING = Round(since_warm_s=30.0, deadline_s=120.0, live=frozenset(range(4)), relaunching=False, requeue=None,
                 waiting=False, steps_observed=True, settled=False, frozen=frozenset(), idle_s=0.1, hang_cap=20.0,
                 last_action_s=10.0)
GONE = replace(TRAINING, live=frozenset())

CASES = [
    ("training goes on", TRAINING, None),
    ("every rank exited, no scheduler", GONE, "all-exited"),
    ("every rank exited, a framework's host to start again", replace(GONE, relaunching=True, waiting=True), None),
    ("the scheduler runs the job again", replace(GONE, requeue="ready"), "requeued"),
    ("the scheduler is to start it", replace(GONE, requeue="pending"), "requeue-pending"),
    ("the scheduler is to start it, past the deadline", replace(GONE, requeue="pending", since_warm_s=121.0),
     "requeue-late"),
    ("settled", replace(TRAINING, settled=True), "settled"),
    ("settled but a fault is still due", replace(TRAINING, settled=True, waiting=True), None),
    ("settled and idle past the cap: settled first", replace(TRAINING, settled=True, idle_s=25.0), "settled"),
    ("every live rank frozen for good", replace(TRAINING, live=frozenset({1, 2}), frozen=frozenset({0, 1, 2})),
     "held"),
    ("one live rank not frozen", replace(TRAINING, frozen=frozenset({0, 1, 2})), None),
    ("frozen, a fault still due", replace(TRAINING, frozen=frozenset(range(4)), waiting=True), None),
    ("no steps: the cap after the last action", replace(TRAINING, steps_observed=False, since_warm_s=30.0), "cap"),
    ("no steps, before the cap", replace(TRAINING, steps_observed=False, since_warm_s=29.9), None),
    ("no steps, a fault still due, past the cap", replace(TRAINING, steps_observed=False, waiting=True), None),
    ("no steps never hangs: idle is no signal", replace(TRAINING, steps_observed=False, since_warm_s=20.0,
                                                        idle_s=20.0), None),
    ("no steps and all frozen: not held", replace(TRAINING, steps_observed=False, since_warm_s=20.0,
                                                  frozen=frozenset(range(4))), None),
    ("idle for the cap", replace(TRAINING, idle_s=20.0), "hung"),
    ("idle for the cap while a fault is due: still hung", replace(TRAINING, idle_s=20.0, waiting=True), "hung"),
    ("idle since warm-up, less than the cap after it", replace(TRAINING, idle_s=25.0, since_warm_s=19.0), None),
    ("past the deadline", replace(TRAINING, since_warm_s=121.0), "deadline"),
    ("past the deadline and idle for the cap: hung first", replace(TRAINING, since_warm_s=121.0, idle_s=20.0),
     "hung"),
]


@pytest.mark.parametrize(("case", "round_", "rule"), CASES, ids=[c[0] for c in CASES])
def test_a_round_ends_the_watch_by_its_first_matching_rule(case: str, round_: Round, rule: str | None) -> None:
    decided = decide(round_)
    assert (decided.name if decided else None) == rule, case


def test_every_rule_is_reached_by_some_case() -> None:
    assert {rule for _, _, rule in CASES} - {None} == {rule.name for rule in RULES}


def test_a_rule_ends_the_trial_with_the_end_the_reports_know() -> None:
    ends = {rule.name: rule.end for rule in RULES}
    assert ends == {"all-exited": "all-exited", "requeued": None, "requeue-late": "deadline", "requeue-pending": None,
                    "settled": "settled", "held": "held", "cap": "cap", "hung": "hung", "deadline": "deadline"}
