"""The trajectory invariant (reports.trajectory) on scripted step events (the reference it
judges against is checked on real gloo ranks in tests/harness/test_reference.py)."""
from __future__ import annotations

import json

from reports.trajectory import (CHANGED, DIFFERS, MATCHES, NOT_OBSERVED, TOLERANCE, Reference, check_trajectory,
                                read_reference)
from runfolder.layout import REFERENCE_FILE

REF = Reference(world=2, losses=((2.0, 1.5, 1.2, 1.0), (2.1, 1.6, 1.3, 1.1)))


def step(t: float, rank: int, n: int, loss: float, gen: int = 0) -> dict:
    return {"t": t, "kind": "step", "rank": rank, "step": n, "gen": gen, "loss": loss, "dur": 0.1}


def test_a_recovery_that_replays_the_same_steps_matches():
    events = [step(0.1 * i, r, i, REF.losses[r][i]) for i in range(3) for r in (0, 1)]
    events += [{"t": 1.0, "kind": "group_ready", "rank": 0, "gen": 1, "world": 2, "group_rank": 0, "secs": 0.1}]
    events += [step(1.1 + 0.1 * i, r, i, REF.losses[r][i] + TOLERANCE / 2, gen=1) for i in (2, 3) for r in (0, 1)]
    verdict = check_trajectory(events, REF)
    assert verdict.verdict == MATCHES and verdict.compared == 10, verdict


def test_a_loss_off_the_fault_free_one_is_named_with_its_rank_step_and_generation():
    events = [step(0.1 * i, r, i, REF.losses[r][i]) for i in range(2) for r in (0, 1)]
    events.append(step(1.0, 1, 2, REF.losses[1][2] + 0.01, gen=1))  # restored the wrong state, say
    verdict = check_trajectory(events, REF)
    assert verdict.verdict == DIFFERS
    assert verdict.detail.startswith("rank 1's loss at step 2 (generation 1) is 1.31000, a fault-free run's 1.30000")


def test_a_smaller_elastic_group_changes_the_batches_by_design_and_the_gap_is_said():
    events = [step(0.1 * i, r, i, REF.losses[r][i]) for i in range(2) for r in (0, 1)]
    events.append({"t": 0.5, "kind": "membership", "rank": 0, "gen": 1, "world": 1, "members": [0],
                   "left_out": [1], "joined": []})
    events.append(step(0.6, 0, 2, 1.25, gen=1))
    verdict = check_trajectory(events, REF)
    assert verdict.verdict == CHANGED and verdict.compared == 4
    assert "in generation 1 (membership: world 1 of 2)" in verdict.detail and "up to 0.05" in verdict.detail


def test_without_a_reference_or_a_loss_nothing_is_judged(tmp_path):
    assert check_trajectory([step(0.1, 0, 0, 2.0)], None).verdict == NOT_OBSERVED
    assert check_trajectory([{"t": 0.1, "kind": "step", "rank": 0, "step": 0, "loss": None}], REF).verdict == NOT_OBSERVED
    assert read_reference(tmp_path) is None  # a run folder before format 7
    (tmp_path / REFERENCE_FILE).write_text(json.dumps({"world": 2, "losses": [list(r) for r in REF.losses]}))
    assert read_reference(tmp_path) == REF


def test_the_tolerance_grows_with_what_rounding_alone_has_moved_by_that_step():
    late = Reference(world=1, losses=((2.0, 1.0, 0.5),), spread=(0.0, 0.0, 0.001))
    assert late.tolerance(0) == TOLERANCE and late.tolerance(2) == TOLERANCE + 0.004
    # the same gap (0.002) is a divergence at step 1, where two orders agree, and rounding at step 2
    assert check_trajectory([step(0.1, 0, 1, 1.002)], late).verdict == DIFFERS
    assert check_trajectory([step(0.1, 0, 2, 0.502)], late).verdict == MATCHES
