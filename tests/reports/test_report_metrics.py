"""Metrics and outcomes of synthetic event histories (pure logic: no harness, no root)."""
from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest

import report_fakes as fakes
from reports.history import events_frame
from reports.metrics import trial_metrics
from reports.outcome import OUTCOME_RULES, classify, ranks_text
from reports.step_progress import progress_gaps
from reports.trial_facts import trial_facts
from runfolder.plan import OUTCOMES


def metrics_of(history) -> dict:
    events, trial = history
    return trial_metrics(events_frame(events), trial)


@pytest.mark.parametrize("history, outcome", [
    (fakes.absorbed, "absorbed"),
    (fakes.recovered, "recovered"),
    (fakes.failed_fast, "failed-fast"),
    (fakes.killed_then_failed_fast, "failed-fast"),
    (fakes.retries_exhausted, "retries-exhausted"),
    (fakes.isolated, "isolated"),
    (fakes.hung, "hung"),
    (fakes.crashed, "crashed"),
    (fakes.continued, "continued"),
    (fakes.rejoined, "recovered"),
    (fakes.stalled_without_verdict, "inconclusive"),
    (fakes.no_fault, "no-fault"),
])
def test_outcome(history, outcome):
    row = metrics_of(history())
    assert row["outcome"] == outcome, row["outcome_reason"]
    assert row["outcome_reason"]


def test_a_job_the_scheduler_started_again_recovered_with_its_steps_lost():
    """A Slurm preemption with requeue: every rank ended on SIGTERM (what it knew of the
    fault), the job came back and restored its newest checkpoint."""
    row = metrics_of(fakes.requeued())
    assert row["outcome"] == "recovered", row["outcome_reason"]
    assert "restart 1, 14.9 s after its last rank ended" in row["outcome_reason"]
    assert "every rank restored step 30 (9 steps lost)" in row["outcome_reason"]
    assert row["ttd_s"] == pytest.approx(0.1) and row["ttr_s"] == pytest.approx(17.0, abs=0.01)


@pytest.mark.parametrize("saves, lost, said", [
    (False, 9, "ranks ended by signal SIGTERM); the newest checkpoint is step 30, saved 2.4 s before the preemption: "
               "a resume redoes 9 steps"),
    (True, 0, "every rank exited cleanly); the newest checkpoint is step 40, saved on the signal: a resume redoes "
              "0 steps")])
def test_a_preempted_job_says_what_a_resume_would_redo(saves, lost, said):
    row = metrics_of(fakes.preempted(saves))
    assert row["outcome"] == "preempted" and said in row["outcome_reason"], row["outcome_reason"]
    assert row["steps_lost"] == lost


def test_a_fault_that_reaches_more_than_its_targets_says_so():
    """A Slurm node's link fault aimed at r1 reaches every rank of the node (the event's
    `reaches`): the report names them beside the target."""
    from reports.tables import fault_text
    events, trial = fakes.absorbed()
    applied = next(e for e in events if e["kind"] == "fault_applied")
    applied["reaches"] = [0, 2, 3]
    row = metrics_of((events, trial))
    assert fault_text(row).startswith("link_down on r1 (reaches r0, r2, r3 too)"), fault_text(row)


def test_a_restart_from_step_0_is_a_recovery_with_its_steps_rolled_back():
    # what bench/torchrun_kill.py writes: agents stop their groups, new workers start over
    row = metrics_of(fakes.restarted())
    assert row["outcome"] == "recovered" and row["departed"] == 0
    assert row["ttd_s"] == pytest.approx(0.3) and row["detect_cause"] == "agent"
    assert row["ttr_s"] == pytest.approx(4.003)  # the last node's first step of its new worker
    assert row["steps_rolled_back"] == 40


def test_what_a_rank_says_once_the_harness_began_to_stop_the_ranks_is_not_judged():
    # measured (a tune's 10 s link down under torchrun, 2026-12-05): every rank stepped again,
    # the trial settled, and rank 0's worker printed a reset as its peers were stopped
    row = metrics_of(fakes.restarted_then_stopped())
    assert row["outcome"] == "recovered" and row["ttr_s"] == pytest.approx(4.003)
    assert row["observed_s"] == pytest.approx(10.0)  # the fault at 10 s, the stop at 20 s
    before_format_13 = metrics_of(fakes.restarted_then_stopped(stopping=False))
    assert before_format_13["outcome"] == "inconclusive"  # the error counted: a survivor never stepped again


def test_every_outcome_has_a_rule_and_the_fallback_is_last():
    assert OUTCOMES[:-1] == tuple(name for name, _ in OUTCOME_RULES)
    assert OUTCOMES[-1] == "inconclusive"


def test_time_to_detect_first_rank_and_spread():
    row = metrics_of(fakes.failed_fast())  # ranks detect at 15.1, 15.2, 15.3, 15.4; fault at 10
    assert row["ttd_s"] == pytest.approx(5.1)
    assert row["ttd_median_s"] == pytest.approx(5.25)
    assert row["ttd_max_s"] == pytest.approx(5.4)
    assert row["detect_first_rank"] == 0
    assert row["detect_ranks"] == 4
    assert row["detect_cause"] == "timeout"
    assert row["released_s"] == pytest.approx(5.7)  # last process reaped at 15.7


def test_time_to_recover_from_fault_start_and_end():
    row = metrics_of(fakes.recovered())  # fault 10-13; restored 17.9; first steps 18.000-18.003
    assert row["ttd_s"] == pytest.approx(1.5)
    assert row["ttr_s"] == pytest.approx(8.003)
    assert row["ttr_after_end_s"] == pytest.approx(5.003)
    assert row["retries"] == 1
    assert row["generations"] == 2
    assert row["steps_rolled_back"] == 10  # 40 steps done, restored to 30


def test_no_ttr_without_a_recovery():
    assert math.isnan(metrics_of(fakes.absorbed())["ttr_s"])
    assert math.isnan(metrics_of(fakes.failed_fast())["ttr_s"])


def test_continued_reports_the_smaller_world():
    row = metrics_of(fakes.continued())  # r3 killed at 10; survivors step from 11.2
    assert row["final_world"] == 3
    assert row["departed"] == 1 and row["crashed_ranks"] == 0
    assert row["ttr_s"] == pytest.approx(1.202)
    assert math.isnan(row["ttr_after_end_s"])  # a kill does not heal


def test_a_group_a_survivor_forms_while_the_harness_stops_the_others_is_not_the_final_world():
    """Teardown stops the survivors one by one: the last one, still in a collective, finds
    the others gone and forms a world of itself before its own stop (seen on a loaded CI
    machine under elastic). The final world is the one at the observation end."""
    events, info = fakes.continued()  # the survivors 0-2 stopped at 16.0
    late = {"t": 16.05, "kind": "group_ready", "rank": 2, "gen": 2, "world": 1, "group_rank": 0, "secs": 0.01}
    row = metrics_of((sorted([*events, late], key=lambda e: e["t"]), info))
    assert row["outcome"] == "continued" and row["final_world"] == 3


def test_a_breaker_a_rank_opens_while_the_harness_stops_it_is_not_the_outcome():
    """A rank whose stop came late (its SIGTERM lost in a finalizer) saw its peers go in
    teardown and opened its breaker: that is not what the policy did under the fault."""
    events, info = fakes.absorbed()
    end = max(e["t"] for e in events if e["kind"] == "exit")
    late = {"t": end + 0.3, "kind": "breaker_open", "rank": 2, "reason": "retries exhausted after: Broken pipe"}
    row = metrics_of((sorted([*events, late], key=lambda e: e["t"]), info))
    assert row["outcome"] == "absorbed"


def test_an_elastic_job_going_on_without_a_rank_frozen_for_good_continued():
    row = metrics_of(fakes.continued_without_a_frozen_rank())  # r3 frozen, left out; 0-2 step from 10.8 s
    assert row["outcome"] == "continued" and row["final_world"] == 3 and row["departed"] == 0
    assert row["ttr_s"] == pytest.approx(0.802) and row["detect_ranks"] == 3


@pytest.mark.parametrize("per_host", [1, 2])
def test_a_user_job_restarted_into_fewer_hosts_continued_in_the_world_its_processes_began_in(per_host):
    row = metrics_of(fakes.elastic_hosts(per_host))  # torchrun --nnodes 3:4, host 3 killed
    assert row["outcome"] == "continued", row["outcome_reason"]
    assert row["final_world"] == 3 and row["departed"] == 1  # hosts, whatever the processes per host
    assert row["ttr_s"] == pytest.approx(35.002)  # the last survivor's first step of its new worker


@pytest.mark.parametrize("per_host", [1, 2])
def test_a_user_job_going_on_without_a_host_cut_off_for_good_continued_and_leaves_it_out(per_host):
    """No membership event in a user's job: the hosts its processes began the last world in
    are the members; the cut-off host, alive and never stepping, is left out, not stalled."""
    row = metrics_of(fakes.elastic_hosts_cut_off(per_host))
    assert row["outcome"] == "continued", row["outcome_reason"]
    assert row["outcome_reason"] == "3 survivors went on in a world of 3 (r3 left out)"
    assert row["final_world"] == 3 and row["departed"] == 0
    assert row["ttr_s"] == pytest.approx(12.002)  # the last going-on host's first step of its new worker


def test_a_host_whose_new_worker_has_not_begun_is_not_left_out():
    """A world of 3 of which only 2 hosts' workers began: the third may still come, so the
    host cut off counts as a survivor that never stepped again."""
    row = metrics_of(fakes.elastic_hosts_cut_off(began=(0, 1)))
    assert row["outcome"] == "inconclusive" and "2 survivors never stepped again" in row["outcome_reason"]


def test_a_rank_let_back_in_makes_the_trial_recovered_with_its_rejoin_time():
    row = metrics_of(fakes.rejoined())  # link down on r3 10-20 s, let back in at 20.4 s
    assert row["final_world"] == 4 and row["departed"] == 0
    assert row["rejoined_ranks"] == 1 and row["rejoined_s"] == pytest.approx(10.4)
    assert row["ttr_after_end_s"] == pytest.approx(0.603)  # r3's first step at 20.603
    assert metrics_of(fakes.continued())["rejoined_ranks"] == 0


def test_exclusion_time_and_suspect_events():
    row = metrics_of(fakes.rejoined())  # every rank suspects r3 at 10.8; survivors exclude at 10.95
    assert row["excluded_s"] == pytest.approx(0.95) and row["suspect_events"] == 4
    events, trial = fakes.no_fault()
    # at the end every rank suspects the first rank stopped: not a false trip
    late = [{**events[-1], "t": 20.05, "src": "rank", "rank": r, "kind": "suspect", "peer": 0}
            for r in (1, 2)]
    row = metrics_of((events + late, trial))
    assert row["outcome"] == "no-fault" and row["suspect_events"] == 0
    early = [{**late[0], "t": 15.0}]
    assert metrics_of((events + early, trial))["suspect_events"] == 1


def test_breaker_open_time():
    row = metrics_of(fakes.isolated())
    assert row["breaker_open_s"] == pytest.approx(8.2)
    assert row["breaker_ranks"] == 4
    assert row["released_s"] == pytest.approx(8.4)
    assert math.isnan(row["cuda_reserved_after"])  # no accelerator in the fake


def test_hung_reports_the_cap_and_no_measured_times():
    row = metrics_of(fakes.hung())
    assert row["hung_cap"] == 30.0
    assert all(math.isnan(row[c]) for c in ("ttd_s", "ttr_s", "breaker_open_s", "released_s"))
    # the ranks SIGKILLed by the harness after the hang verdict are no crash and no departure
    assert row["crashed_ranks"] == 0 and row["departed"] == 0


def test_a_kill_fault_is_not_a_crash_but_an_unexplained_signal_is():
    events, trial = fakes.killed_then_failed_fast()
    assert metrics_of((events, trial))["crashed_ranks"] == 0
    for event in events:
        if event["kind"] == "fault_applied":
            event["fault_kind"] = "pause"
    row = metrics_of((events, trial))
    assert row["outcome"] == "crashed"
    assert "r1" in row["outcome_reason"] and "SIGKILL" in row["outcome_reason"]


def test_a_kill_of_two_ranks_whose_first_exit_is_reaped_before_the_apply_returned_is_no_crash():
    events, trial = fakes.killed_then_failed_fast()
    for event in events:
        if event["kind"] == "fault_applied":  # the kernel's acknowledgement came after r1's reaping
            event["t_requested"], event["t"] = event["t"], event["t"] + 0.04
    assert metrics_of((events, trial))["crashed_ranks"] == 0
    for event in events:
        if event["kind"] == "fault_applied":
            event["t_requested"] = event["t"]
    assert metrics_of((events, trial))["crashed_ranks"] == 1  # before the request: a crash


def test_wasted_rank_seconds_of_a_stall():
    # 4 ranks; last step before the fault at 9.75 + r ms, next at 13.2 + r ms: each wastes
    # 3.2 s + r ms inside the window; everything else steps every 0.25 s (< 3 x 0.25)
    row = metrics_of(fakes.absorbed())
    assert row["waste_gap_threshold_s"] == pytest.approx(0.75)
    assert row["wasted_rank_s"] == pytest.approx(4 * 3.2 + 0.006)
    assert row["max_stall_s"] == pytest.approx(3.203)


def test_wasted_rank_seconds_stop_when_a_rank_is_gone():
    # failed-fast: each rank idle from fault start (10) until reaped (15.7)
    assert metrics_of(fakes.failed_fast())["wasted_rank_s"] == pytest.approx(4 * 5.7)
    # hung: each rank idle for the whole 30 s cap (the harness's kills come after)
    assert metrics_of(fakes.hung())["wasted_rank_s"] == pytest.approx(4 * 30.0)


def test_progress_gaps_clip_to_the_window_and_skip_normal_intervals():
    steps = (1.0, 1.25, 1.5, 4.0, 4.25)
    assert progress_gaps(steps, 2.0, 5.5, 0.75) == [pytest.approx(2.0), pytest.approx(1.25)]
    assert progress_gaps(steps, 2.0, 5.0, 0.75) == [pytest.approx(2.0)]  # 0.75 is not longer
    assert progress_gaps(steps, 0.0, 1.6, 0.75) == [pytest.approx(1.0)]  # lo -> first step
    assert progress_gaps((), 2.0, 3.0, 0.75) == [pytest.approx(1.0)]
    assert progress_gaps(steps, 3.0, 3.0, 0.75) == []


def test_step_rates_before_during_after():
    row = metrics_of(fakes.absorbed())
    assert row["steps_per_s_before"] == pytest.approx(3.9, abs=0.05)
    assert row["steps_per_s_during"] == 0.0  # a stall is zero steps, not "unknown"
    assert row["steps_per_s_after"] == pytest.approx(4.0, abs=0.05)


def test_a_fault_reverted_at_teardown_did_not_heal_and_ends_the_observation():
    h = fakes.History(policy="timeout")
    h.steps(0.0, 20.0)
    h.fault()
    h.harness(20.0, "fault_reverted", index=0, fault_kind="link_down", targets=[1], teardown=True)
    for r in range(fakes.RANKS):
        h.harness(20.5, "rank_exited", rank=r, pid=100 + r, exitcode=None, signal=9, stopped=True)
    h.harness(21.0, "trial_end", reason="settled")
    row = metrics_of(h.done())
    assert math.isnan(row["fault_duration_s"])
    assert row["observed_s"] == pytest.approx(10.0)
    assert row["outcome"] == "absorbed" and row["crashed_ranks"] == 0


def test_torn_and_odd_lines_are_skipped(tmp_path):
    from reports.history import read_events
    path = tmp_path / "events.jsonl"
    path.write_text('{"t": 1.0, "src": "rank", "rank": 0, "pid": 1, "kind": "step", "step": 0}\n'
                    '[1, 2]\n{"t": 2.0, "src": "ha')
    frame = read_events(path)
    assert list(frame["kind"]) == ["step"]
    assert read_events(tmp_path / "missing.jsonl").empty


def test_an_empty_trial_has_no_fault_and_no_numbers():
    history = fakes.History(policy="retry")
    history.end(1.0)
    events, info = history.done()
    row = trial_metrics(events_frame(events), info)
    assert row["outcome"] == "no-fault"
    assert math.isnan(row["wasted_rank_s"])


def test_facts_feed_a_new_outcome_rule():
    # the classification is a tuple of (name, rule): a new policy's outcome is one more rule
    facts = trial_facts(events_frame(fakes.absorbed()[0]), fakes.absorbed()[1])
    assert classify(facts)[0] == "absorbed"
    assert facts.survivors == (0, 1, 2, 3)


def test_events_frame_keeps_harness_rank_null():
    frame = events_frame([{"t": 1.0, "src": "harness", "rank": None, "pid": 1, "kind": "trial_start"},
                          {"t": 0.5, "src": "rank", "rank": 3, "pid": 2, "kind": "rank_start"}])
    assert list(frame["kind"]) == ["rank_start", "trial_start"]
    assert frame["rank"].iloc[0] == 3 and frame["rank"].iloc[1] is pd.NA


def test_a_non_zero_exit_without_a_policy_reason_is_a_crash():
    h = fakes.History(policy="timeout")
    h.steps(0.0, fakes.FAULT_AT)
    h.fault(end=12.0)
    h.harness(10.5, "rank_exited", rank=2, pid=102, exitcode=70, signal=None)
    h.end(20.0)
    row = metrics_of(h.done())
    assert row["outcome"] == "crashed" and "r2" in row["outcome_reason"] and "exit code 70" in row["outcome_reason"]


@pytest.mark.parametrize("teardown", [True, False])
def test_a_user_job_s_rank_that_aborts_after_destroying_its_group_is_no_detection(teardown):
    """A user's job runs to its end through a pause; r1 aborts at exit, after its
    destroy_process_group() (gloo, when DDP outlives the group): a crash, said as one in
    teardown, and no detection of the fault. Without the group destroyed, it is both."""
    h = fakes.History(policy="default")
    h.plan = dataclasses.replace(h.plan, job={"command": ["python", "train.py"]})
    h.steps(0.0, fakes.FAULT_AT + 3.0)
    h.fault(kind="pause", end=fakes.FAULT_AT + 1.0)
    h.each(None if teardown else [0, 2, 3], fakes.FAULT_AT + 3.05, "group_destroyed", gen=0)
    for r in (0, 2, 3):
        h.harness(fakes.FAULT_AT + 3.1, "rank_exited", rank=r, pid=100 + r, exitcode=0, signal=None)
    h.harness(fakes.FAULT_AT + 3.2, "rank_exited", rank=1, pid=101, exitcode=None, signal=6)
    h.harness(fakes.FAULT_AT + 3.3, "trial_end", reason="all-exited")
    row = metrics_of(h.done())
    assert row["outcome"] == "crashed" and "r1 crashed (first r1, crashed-by-abort)" in row["outcome_reason"]
    assert ("in teardown, after destroy_process_group(): its training was done" in row["outcome_reason"]) \
        is teardown, row["outcome_reason"]
    assert math.isnan(row["ttd_s"]) is teardown, row["ttd_s"]


def test_a_hang_outranks_the_crashes_that_came_before_it():
    # baseline under a kill: the ring neighbours crash on "connection closed", the rest hang
    h = fakes.History(policy="baseline", timeout=6 * 3600)
    h.steps(0.0, fakes.FAULT_AT)
    h.fault(kind="kill", targets=(1,))
    h.harness(10.02, "rank_exited", rank=1, pid=101, exitcode=None, signal=9)
    h.each([0, 2], 10.05, "collective_error", step=40, gen=0, phase="step", cause="closed", error="closed")
    h.each([0, 2], 10.06, "exit", reason="crashed", code=70, error="Connection closed by peer")
    h.harness(40.0, "hang_detected", cap=30.0, idle_since=10.06)
    h.harness(45.0, "trial_end", reason="hung")
    row = metrics_of(h.done())
    assert row["outcome"] == "hung"
    assert row["crashed_ranks"] == 2 and row["departed"] == 3
    assert row["ttd_s"] == pytest.approx(0.05)


@pytest.mark.parametrize("ranks, text", [
    ([3], "r3"),
    ([1, 0], "r0, r1"),
    (list(range(64)), "r0-r63"),
    ([9, 0, 1, 2, 3, 4, 6, 7] + list(range(10, 64)), "r0-r4, r6, r7, r9-r63"),
])
def test_rank_lists_shorten_runs_of_three_or_more_to_a_range(ranks, text):
    assert ranks_text(ranks) == text


def test_an_absorbed_fault_says_the_pace_during_it_against_before():
    """A fault training absorbs (a slow rank) is read by its pace: steps/s during the fault
    against before, the ratio of the two."""
    from reports.tables import what_happened
    row = metrics_of(fakes.absorbed())
    text = what_happened(row)
    before, during = row["steps_per_s_before"], row["steps_per_s_during"]
    assert f"{during:.2f} steps/s during the fault, {before:.2f} before: {during / before:.2f}x" in text, text
