"""The runner's recovery as a state machine: the states each policy goes through, driven one
state at a time (`start`, then `advance`) against the scripted fakes of test_runner."""
from __future__ import annotations

import json
import math

from harness.job.group import CollectiveError
from harness.job.outcome import EXIT_CODES, ExitReason
from harness.job.runner import State
from runfolder.events import read_events, schema_problems
from tests.harness.test_runner import (ElasticGroup, FakeClock, FakeDetector, ScriptedGroup, StopAt,
                                       make_detector_runner, make_runner)

S = State


def trace(runner, max_steps: int) -> list[State]:
    """The states the runner went through, each run of STEPPING counted once; every event
    it wrote on the way has the fields the run-folder contract gives its kind."""
    states = [runner.start(max_steps)]
    while states[-1] is not State.DONE:
        state = runner.advance(states[-1])
        if not (state is State.STEPPING and states[-1] is State.STEPPING):
            states.append(state)
    events, _ = read_events(runner.recorder.path)
    problems = [problem for event in events for problem in schema_problems(event)
                if "missing cuda_" not in problem]  # make_detector_runner's accelerator measures nothing
    assert problems == []
    return states


def attempts(tmp_path) -> list[int]:
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    return [e["attempt"] for e in map(json.loads, lines) if e["kind"] == "backoff"]


def rank_2(tmp_path, group_type=ElasticGroup, **overrides):
    """Original rank 2 of four under the elastic policy, on a fake clock."""
    clock = FakeClock()
    group, detector = group_type(clock, member=2), FakeDetector(clock, me=2)
    runner, _ = make_detector_runner(tmp_path, "elastic", group, clock, detector, **overrides)
    return runner, group, detector, clock


def test_exit_reasons_are_the_exit_events_values_with_their_codes():
    assert {r.value: EXIT_CODES[r] for r in ExitReason} == {
        "stopped": 0, "failed-fast": 3, "retries-exhausted": 4, "isolated": 5, "terminated": 0,
        "crashed": 70}


def test_timeout_gives_up_at_the_first_failure(tmp_path):
    runner, _ = make_runner(tmp_path, "timeout", ScriptedGroup(fail_steps={3}))
    assert trace(runner, 10) == [S.STEPPING, S.BACKOFF, S.DONE]
    assert runner.exit_reason is ExitReason.FAILED_FAST


def test_retry_backs_off_again_after_a_failed_health_check(tmp_path):
    runner, _ = make_runner(tmp_path, "retry", ScriptedGroup(fail_steps={2}, health=[False, True]))
    assert trace(runner, 5) == [S.STEPPING, S.BACKOFF, S.HEALTH_CHECK, S.BACKOFF, S.HEALTH_CHECK,
                                S.REGROUP, S.STEPPING, S.DONE]
    assert runner.exit_reason is ExitReason.STOPPED and attempts(tmp_path) == [1, 2]


def test_a_failed_join_counts_as_a_try_and_a_working_group_restores_the_budget(tmp_path):
    group = ScriptedGroup(fail_steps={2, 5}, join_failures=1)
    runner, _ = make_runner(tmp_path, "retry", group, max_retries=2)
    assert trace(runner, 6) == [S.STEPPING, S.BACKOFF, S.HEALTH_CHECK, S.REGROUP, S.BACKOFF,
                                S.HEALTH_CHECK, S.REGROUP, S.STEPPING, S.BACKOFF, S.HEALTH_CHECK,
                                S.REGROUP, S.STEPPING, S.DONE]
    assert attempts(tmp_path) == [1, 2, 1] and runner.exit_reason is ExitReason.STOPPED


def test_a_failed_first_join_is_recovered_from(tmp_path):
    class FirstJoinFails(ScriptedGroup):
        def join(self, failed_generation, proposal=None, watch=None):
            if failed_generation is None:
                self.generation = 0
                raise CollectiveError("rendezvous timed out", "rendezvous", "join")
            return super().join(failed_generation, proposal, watch)

    runner, _ = make_runner(tmp_path, "retry", FirstJoinFails())
    assert trace(runner, 3) == [S.BACKOFF, S.HEALTH_CHECK, S.REGROUP, S.STEPPING, S.DONE]


def test_retry_without_a_breaker_runs_out_of_tries(tmp_path):
    runner, _ = make_runner(tmp_path, "retry", ScriptedGroup(fail_steps={2}, join_failures=99),
                            max_retries=1)
    assert trace(runner, 10) == [S.STEPPING, S.BACKOFF, S.HEALTH_CHECK, S.REGROUP, S.BACKOFF, S.DONE]
    assert runner.exit_reason is ExitReason.RETRIES_EXHAUSTED


def test_isolation_opens_the_breaker_on_a_failed_health_check(tmp_path):
    runner, _ = make_runner(tmp_path, "isolation", ScriptedGroup(fail_steps={2}, health=[False]))
    assert trace(runner, 10) == [S.STEPPING, S.BACKOFF, S.HEALTH_CHECK, S.BREAKER_OPEN, S.DONE]
    assert runner.exit_reason is ExitReason.ISOLATED


def test_isolation_opens_the_breaker_when_tries_run_out(tmp_path):
    runner, _ = make_runner(tmp_path, "isolation", ScriptedGroup(fail_steps={2}, join_failures=99),
                            max_retries=1)
    assert trace(runner, 10) == [S.STEPPING, S.BACKOFF, S.HEALTH_CHECK, S.REGROUP, S.BACKOFF,
                                 S.BREAKER_OPEN, S.DONE]
    assert runner.exit_reason is ExitReason.ISOLATED


def test_a_rank_left_out_of_the_next_generation_opens_its_breaker(tmp_path):
    runner, group, detector, clock = rank_2(tmp_path)
    StopAt(group, detector, clock, step=4, peer=0)(runner)
    group.agreed_by_others = (0, 1, 3)
    assert trace(runner, 10) == [S.STEPPING, S.BACKOFF, S.HEALTH_CHECK, S.REGROUP, S.BREAKER_OPEN,
                                 S.DONE]
    assert runner.exit_reason is ExitReason.ISOLATED


class AdmittedJoinFailsOnce(ElasticGroup):
    """The first join after this rank asked to rejoin fails in its rendezvous."""

    failed = False

    def join(self, failed_generation, proposal=None, watch=None):
        if self.asked_at is not None and not self.failed:
            self.failed = True
            self.generation = failed_generation + 1
            raise CollectiveError("rendezvous timed out", "rendezvous", "join")
        return super().join(failed_generation, proposal, watch)


def cut_off_for(runner, group, detector, clock, seconds: float, at_step: int = 3) -> None:
    """This rank hears nothing from the control plane for `seconds` from a step on."""
    original_step, original_sleep = runner.workload.train_step, runner.sleep
    cut: dict[str, float] = {}

    def heal() -> None:
        if cut and clock.t - cut["at"] > seconds:
            detector.cut_off = False

    def train_step(all_reduce, world_size):
        if runner.workload.step == at_step and not cut:
            group.stuck, detector.cut_off = True, True
            cut["at"] = clock.t
        heal()
        return original_step(all_reduce, world_size)

    def sleep(s):
        original_sleep(s)
        heal()
    runner.workload.train_step, runner.sleep = train_step, sleep


def test_with_rejoin_the_breaker_closes_when_the_rank_is_let_back_in(tmp_path):
    runner, group, detector, clock = rank_2(tmp_path, rejoin=True)
    cut_off_for(runner, group, detector, clock, 5.0)
    assert trace(runner, 10) == [S.STEPPING, S.BACKOFF, S.HEALTH_CHECK, S.BREAKER_OPEN, S.REJOIN,
                                 S.STEPPING, S.DONE]
    assert runner.exit_reason is ExitReason.STOPPED


def test_a_failed_join_after_rejoining_starts_a_fresh_budget_of_tries(tmp_path):
    runner, group, detector, clock = rank_2(tmp_path, AdmittedJoinFailsOnce, rejoin=True, max_retries=1)
    cut_off_for(runner, group, detector, clock, 5.0)
    assert trace(runner, 10) == [S.STEPPING, S.BACKOFF, S.HEALTH_CHECK, S.BREAKER_OPEN, S.REJOIN,
                                 S.BACKOFF, S.HEALTH_CHECK, S.REGROUP, S.STEPPING, S.DONE]
    assert attempts(tmp_path) == [1, 1]


def test_with_rejoin_a_rank_nobody_lets_in_leaves(tmp_path):
    runner, group, detector, clock = rank_2(tmp_path, rejoin=True, rejoin_within="5s")
    StopAt(group, detector, clock, step=4, peer=0)(runner)
    group.agreed_by_others, group.admit_after = (0, 1, 3), math.inf
    assert trace(runner, 10) == [S.STEPPING, S.BACKOFF, S.HEALTH_CHECK, S.REGROUP, S.BREAKER_OPEN,
                                 S.REJOIN, S.DONE]
    assert runner.exit_reason is ExitReason.ISOLATED
