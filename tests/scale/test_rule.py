"""The scaling rule of `--ranks` (harness.scenario.scaling.scaled_to_cores; docs/scale.md)."""
from __future__ import annotations

import os

import pytest

from harness.scenario.scaling import scale_factor, scaled_to_cores, scaling_note
from harness.scenario.scenario import load_scenario
from tests.conftest import REPO, chaos_cli

SCENARIOS = REPO / "scenarios"


@pytest.mark.parametrize(("ranks", "cores", "factor"), [
    (16, 2, 1.0),    # the reference: what every shipped scenario was measured with
    (8, 2, 1.0),     # fewer ranks per core never shrinks a time
    (64, 2, 4.0),
    (24, 2, 1.5),
    (128, 2, 16.0),  # past 64 ranks the ring's length counts too
    (256, 16, 8.0),
    (256, 64, 4.0),  # fewer than 8 ranks per core: the ring alone
])
def test_factor_is_ranks_per_core_over_eight_times_the_ring_past_64(ranks, cores, factor):
    assert scale_factor(ranks, cores) == factor


def test_stretches_the_step_the_fault_timeline_and_the_hang_cap():
    base = load_scenario(SCENARIOS / "link_flap.yaml", {"cluster.ranks": 64})
    scaled = scaled_to_cores(base, 2)
    assert scaled.workload.step_period == base.workload.step_period * 4
    assert scaled.hang_cap == base.hang_cap * 4
    [before], [after] = base.faults, scaled.faults
    assert (after.start, after.duration, after.pulses.on_for, after.pulses.off_for) == \
           (before.start * 4, before.duration * 4, before.pulses.on_for * 4, before.pulses.off_for * 4)
    assert after.fault == before.fault
    assert scaled.expect == base.expect  # link_flap expects an outcome only


def test_stretches_policies_and_bounds_but_not_the_detectors_heartbeats():
    base = load_scenario(SCENARIOS / "elastic_kill.yaml", {"cluster.ranks": 64})
    scaled = scaled_to_cores(base, 2)
    for name in base.policies:
        before, after = base.policy(name), scaled.policy(name)
        for field in ("timeout", "backoff_base", "backoff_cap", "health_check_timeout", "rejoin_within"):
            assert getattr(after, field) == getattr(before, field) * 4, field
        assert after.jitter == (before.jitter[0] * 4, before.jitter[1] * 4)
        assert after.rendezvous_timeout == (None if before.rendezvous_timeout is None
                                            else before.rendezvous_timeout * 4)
        assert after.exclude_after == before.exclude_after and after.max_retries == before.max_retries
        if before.detector is None:
            assert after.detector is None
        else:
            # the heartbeats run ahead of the steps (harness.job.detector.run_ahead); a wait on a step does not
            assert after.detector.straggler_after == before.detector.straggler_after * 4
            assert after.detector.model_copy(update={"straggler_after": before.detector.straggler_after}) == before.detector
    assert scaled.expect["elastic"].detect_within == base.expect["elastic"].detect_within * 4
    assert scaled.expect["elastic"].recover_within == base.expect["elastic"].recover_within * 4
    assert scaled.expect["isolation"].breaker_within == base.expect["isolation"].breaker_within * 4
    assert scaled.expect["elastic"].outcome == base.expect["elastic"].outcome


def test_the_reference_size_is_left_as_written():
    base = load_scenario(SCENARIOS / "link_down.yaml")
    assert scaled_to_cores(base, 2) is base


def test_chaos_run_ranks_applies_the_rule():
    factor = scale_factor(64, len(os.sched_getaffinity(0)))
    done = chaos_cli("run", str(SCENARIOS / "control.yaml"), "--ranks", "64", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert f"hang cap ({15 * factor:g} s)" in done.stdout
    assert f"timeout {5 * factor:g} s" in done.stdout
    assert (f"stretched x{factor:g}" in done.stdout) == (factor > 1)  # the run says it was scaled
    job = chaos_cli("run", str(SCENARIOS / "byo_kill.yaml"), "--ranks", "64", "--dry-run")
    assert job.returncode == 0, job.stderr
    assert ("your job's own command, args and env are not" in job.stdout) == (factor > 1)


def test_a_users_job_is_told_its_own_arguments_were_not_stretched():
    # a job that passes its own timeout to init_process_group has it bound its rendezvous,
    # and 64 interpreters importing torch on 2 cores reach it > 20 s apart (docs/scale.md)
    assert scaling_note(16, 2, job=True) is None
    assert scaling_note(64, 2).endswith("docs/scale.md)")
    assert "past 32 ranks per core" in scaling_note(256, 2) and "past" not in scaling_note(64, 2)
    assert scaling_note(64, 2, job=True).endswith(
        "your job's own command, args and env are not (a timeout it passes to init_process_group "
        "also bounds its start-up: docs/scale.md)")
