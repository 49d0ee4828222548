"""The runner's retry / backoff / breaker / membership logic, against scripted fakes.

The fake stands in for gloo only here, where the logic is under test; tests/harness/
test_job.py runs the same runner against real gloo ranks in real namespaces.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import random
import time
from pathlib import Path

import pytest
import torch

from chaos.api import Host
from chaos.errors import UsageError
from chaos.faults import DiskFull
from chaos.inject import NetlinkInjector
from chaos.ledger import Ledger
from chaos.storage import SizedTmpfs
from harness.job.checkpoint import Checkpointer
from harness.job.detector import Straggler, Suspicion
from harness.job.group import CollectiveError, NotAMember
from harness.job.outcome import ExitReason as Outcome
from harness.job.policies import policy_spec
from harness.job.runner import FaultTolerantRunner, State, free_accelerator_memory
from harness.job.workload import Workload, WorkloadSpec
from runfolder.events import EventRecorder


class ScriptedGroup:
    """A one-rank 'group' whose failures are scripted by call number."""

    def __init__(self, fail_steps=(), join_failures=0, health=()):
        self.generation = -1
        self.rank = 0
        self.world_size = 1
        self.member = 0
        self.members = (0,)
        self.fail_steps = set(fail_steps)   # all_reduce call numbers (sum ops) that fail
        self.join_failures = join_failures  # how many joins after the first one fail
        self.health = list(health)          # results of successive health checks (default ok)
        self.calls: list[str] = []
        self._sums = 0
        self._joins = 0

    def join(self, failed_generation, proposal=None, watch=None):
        self._joins += 1
        self.calls.append(f"join({failed_generation})")
        if self._joins > 1 and self.join_failures > 0:
            self.join_failures -= 1
            self.generation = (failed_generation or 0) + 1
            raise CollectiveError("rendezvous timed out", "rendezvous", "join")
        self.generation = 0 if failed_generation is None else failed_generation + 1
        return self.generation

    def all_reduce(self, tensor, op="sum", watch=None):
        if op in ("min", "max"):  # a restore's agreement: one rank agrees with itself
            return
        self._sums += 1
        if self._sums in self.fail_steps:
            raise CollectiveError("Timed out waiting 5000ms for recv operation to complete",
                                  "timeout", "step")

    def leave(self):
        self.calls.append("leave")
        return 0.001

    def health_check(self, timeout_s):
        self.calls.append("health")
        ok = self.health.pop(0) if self.health else True
        return ok, "control plane reachable" if ok else "control plane unreachable"


def make_runner(tmp_path: Path, policy: str, group: ScriptedGroup, really_sleep: bool = False, **overrides):
    spec = policy_spec(policy, {"timeout": "5s", **overrides})
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        group.calls.append("sleep")
        if really_sleep:
            time.sleep(seconds)

    workload = Workload(WorkloadSpec(step_period=0, checkpoint_every=2, hidden=8, features=4),
                        seed=3, rank=0)
    recorder = EventRecorder(tmp_path / "events.jsonl", "rank", 0)
    runner = FaultTolerantRunner(spec, group, workload, Checkpointer(tmp_path / "ckpt"),
                                 recorder, random.Random(7), sleep=sleep)
    return runner, sleeps


def events(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]


def kinds(tmp_path: Path) -> list[str]:
    return [e["kind"] for e in events(tmp_path)]


def test_retry_recovers_from_checkpoint_and_finishes(tmp_path):
    group = ScriptedGroup(fail_steps={6})
    runner, sleeps = make_runner(tmp_path, "retry", group)
    assert runner.run(max_steps=10) is Outcome.STOPPED
    evs = events(tmp_path)
    restored = [e for e in evs if e["kind"] == "restored"]
    # failed during step 5 (the 6th); the newest checkpoint then was step 4
    assert [r["step"] for r in restored] == [0, 4]
    steps = [e["step"] for e in evs if e["kind"] == "step"]
    assert steps == [0, 1, 2, 3, 4, 4, 5, 6, 7, 8, 9]
    assert len(sleeps) == 1
    assert group.calls.index("leave") < group.calls.index("sleep")  # released before waiting


def test_a_stop_a_finalizer_swallowed_ends_the_run_at_its_next_state(tmp_path, monkeypatch):
    """SIGTERM's handler raised Terminated inside a weakref callback, where Python drops it:
    the runner must stop all the same (harness.signals keeps the request), not go on to a
    policy's end of its own while the harness tears the trial down."""
    from harness import signals
    group = ScriptedGroup(fail_steps={6})
    runner, _ = make_runner(tmp_path, "retry", group)
    monkeypatch.setattr(signals, "_requested", signals.Terminated("received SIGTERM"))
    with pytest.raises(signals.Terminated, match="received SIGTERM"):
        runner.run(max_steps=10)
    assert "step" not in kinds(tmp_path)


def test_backoff_is_exponential_capped_with_seeded_jitter(tmp_path):
    group = ScriptedGroup(fail_steps={1}, join_failures=4)
    runner, sleeps = make_runner(tmp_path, "retry", group, max_retries=6, backoff_base="1s",
                                 backoff_cap="4s", jitter=["100ms", "1s"])
    assert runner.run(max_steps=3) is Outcome.STOPPED
    base = [1, 2, 4, 4, 4]  # five tries: four failed joins, then success
    assert len(sleeps) == 5
    for slept, b in zip(sleeps, base, strict=True):
        assert b + 0.1 <= slept <= b + 1.0
    rng = random.Random(7)
    assert sleeps == [b + rng.uniform(0.1, 1.0) for b in base]  # reproducible from the seed


def test_a_step_delay_is_waited_before_each_step_and_left_out_of_its_duration(tmp_path):
    group = ScriptedGroup()
    # slept for real: a step's duration that took the delay in would be 1 s at least, one
    # that does not is the scripted step's milliseconds (a loaded machine's stall included)
    runner, sleeps = make_runner(tmp_path, "timeout", group, really_sleep=True)
    runner.step_delay = lambda: 1.0
    assert runner.run(max_steps=3) is Outcome.STOPPED
    assert sleeps == [1.0, 1.0, 1.0]
    assert all(e["dur"] < 1.0 for e in events(tmp_path) if e["kind"] == "step")


def test_the_delay_is_the_command_s_while_its_file_exists(tmp_path):
    import json
    from harness.job.stepdelay import StepDelays, step_delay_file
    path = step_delay_file(tmp_path, 3)
    assert path == tmp_path / "commands" / "r003.step_delay"
    delays = StepDelays(path)
    assert delays.due() == 0.0
    path.parent.mkdir()
    path.write_text(json.dumps({"id": "r.1", "delay_s": 0.2}))
    assert delays.due() == 0.2 and delays.due() == 0.2
    path.unlink()
    assert delays.due() == 0.0


def test_timeout_policy_fails_fast_and_releases(tmp_path):
    group = ScriptedGroup(fail_steps={3})
    runner, sleeps = make_runner(tmp_path, "timeout", group)
    assert runner.run(max_steps=10) is Outcome.FAILED_FAST
    k = kinds(tmp_path)
    assert k[-3:] == ["collective_error", "group_released", "resources_released"]
    assert "backoff" not in k and "breaker_open" not in k and sleeps == []


def test_retry_gives_up_after_max_retries(tmp_path):
    group = ScriptedGroup(fail_steps={2}, join_failures=99)
    runner, sleeps = make_runner(tmp_path, "retry", group, max_retries=3)
    assert runner.run(max_steps=10) is Outcome.RETRIES_EXHAUSTED
    assert kinds(tmp_path).count("backoff") == 3 and len(sleeps) == 3


@pytest.mark.parametrize("policy, overrides, outcome", [
    ("timeout", {}, Outcome.FAILED_FAST),
    ("retry", {"max_retries": 6, "rendezvous_timeout": "30s", "backoff_base": "1s", "backoff_cap": "8s"},
     Outcome.RETRIES_EXHAUSTED),
    ("isolation", {"max_retries": 3}, Outcome.ISOLATED),
])
def test_a_policy_gives_up_within_the_time_it_states(tmp_path, policy, overrides, outcome):
    """give_up_s bounds a trial's deadline (harness.trial.plan.trial_deadline_s): every wait the
    runner makes on its way to giving up, at its longest (a failed collective its timeout, a
    failed rendezvous its rendezvous timeout, a health check its timeout), fits in it."""
    group = ScriptedGroup(fail_steps={2}, join_failures=99)
    runner, sleeps = make_runner(tmp_path, policy, group, **overrides)
    assert runner.run(max_steps=10) is outcome
    spec = runner.policy
    waited = (spec.timeout + (99 - group.join_failures) * spec.rendezvous_s
              + group.calls.count("health") * spec.health_check_timeout + sum(sleeps))
    assert spec.give_up_s is not None and waited <= spec.give_up_s
    # the bound's slack: a collective's timeout per try (the rendezvous failed before one) and the jitter
    assert spec.give_up_s - waited <= spec.max_retries * (spec.timeout + spec.jitter[1] - spec.jitter[0])


def test_a_policy_that_does_not_catch_errors_never_gives_up():
    assert policy_spec("baseline").give_up_s is None


def test_retry_counts_failed_health_checks_as_tries(tmp_path):
    group = ScriptedGroup(fail_steps={2}, health=[False, False, True])
    runner, _ = make_runner(tmp_path, "retry", group, max_retries=3)
    assert runner.run(max_steps=5) is Outcome.STOPPED
    checks = [e["ok"] for e in events(tmp_path) if e["kind"] == "health_check"]
    assert checks == [False, False, True]


def test_isolation_opens_breaker_when_health_check_fails(tmp_path):
    group = ScriptedGroup(fail_steps={2}, health=[False])
    runner, _ = make_runner(tmp_path, "isolation", group)
    assert runner.run(max_steps=10) is Outcome.ISOLATED
    evs = events(tmp_path)
    breaker = [e for e in evs if e["kind"] == "breaker_open"]
    assert len(breaker) == 1 and "health check failed" in breaker[0]["reason"]
    assert evs[-1]["kind"] == "resources_released"


def test_isolation_opens_breaker_when_retries_run_out(tmp_path):
    group = ScriptedGroup(fail_steps={2}, join_failures=99)
    runner, _ = make_runner(tmp_path, "isolation", group, max_retries=2)
    assert runner.run(max_steps=10) is Outcome.ISOLATED
    breaker = [e for e in events(tmp_path) if e["kind"] == "breaker_open"]
    assert "retries exhausted" in breaker[0]["reason"]


def test_baseline_lets_the_error_propagate(tmp_path):
    group = ScriptedGroup(fail_steps={2})
    runner, _ = make_runner(tmp_path, "baseline", group)
    with pytest.raises(CollectiveError):
        runner.run(max_steps=10)
    assert kinds(tmp_path)[-1] == "collective_error"


def test_restore_loads_the_exact_weights_saved(tmp_path):
    ckpt = Checkpointer(tmp_path / "c")
    w = Workload(WorkloadSpec(hidden=8, features=4), seed=1, rank=0)
    w.train_step(lambda t: None, 1)
    ckpt.save(w.step, w.state())
    saved = [p.clone() for p in w.model.parameters()]
    w.train_step(lambda t: None, 1)
    w.load_state(ckpt.load(ckpt.latest()))
    assert w.step == 1
    assert all(torch.equal(a, b) for a, b in zip(saved, w.model.parameters(), strict=True))


# -- with the failure detector: leaving a stuck collective, elastic membership ------------

class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(seconds, 0.0)


FAKE_SUSPECT_AFTER_S = 0.8


class FakeDetector:
    """Verdicts from a script: peers silent from a time on, peers whose process is gone."""

    def __init__(self, clock: FakeClock, me: int = 0) -> None:
        self.clock = clock
        self.me = me
        self.silent_from: dict[int, float] = {}
        self.gone: set[int] = set()
        self.cut_off = False
        self.degraded: list[Straggler] = []
        self.asks_at: list[float] = []  # fake-clock times ranks asked to rejoin, as digests tell

    def rejoin_asks(self):
        return sum(1 for t in self.asks_at if t <= self.clock.t)

    def judge(self, members, generation):
        if self.cut_off:
            return [Suspicion(self.me, "cut-off", 0.9)]
        found = [Suspicion(p, "connection", 0.1) for p in members if p in self.gone]
        found += [Suspicion(p, "heartbeat", round(self.clock.t - t, 3))
                  for p, t in self.silent_from.items()
                  if p in members and p not in self.gone and self.clock.t - t >= FAKE_SUSPECT_AFTER_S]
        return found

    def stragglers(self, members):
        return [s for s in self.degraded if s.peer in members]

    def stepped(self):
        """The cut-off rule that reads it is the real detector's (test_detector.py): scripted here."""


class ElasticGroup:
    """Four members; collectives hang (polling the watch on the fake clock) while `stuck`."""

    def __init__(self, clock: FakeClock, member: int = 0, world: int = 4) -> None:
        self.clock = clock
        self.generation = -1
        self.member = member
        self.members = tuple(range(world))
        self.rank = member
        self.world_size = world
        self.stuck = False
        self.agreed_by_others: tuple[int, ...] | None = None  # a proposal that won before ours
        self.proposals: list[tuple[int, ...] | None] = []
        self.joined_at: list[float] = []  # fake-clock times of the joins
        self.left = 0
        self.requests: tuple[int, ...] = ()  # ranks asking to rejoin, for group rank 0 to find
        self.asked_at: float | None = None   # when this rank asked to rejoin
        self.admit_after = 0.3               # the members let an asking rank in this long after
        self.flag_next_reduce = False        # another member admits ranks in the next all-reduce

    def join(self, failed_generation, proposal=None, watch=None):
        self.generation = 0 if failed_generation is None else failed_generation + 1
        self.proposals.append(proposal)
        self.joined_at.append(self.clock.t)
        members = (self.agreed_by_others if failed_generation is not None else None) or proposal or self.members
        if self.member not in members:
            raise NotAMember(self.generation, members)
        self.members, self.rank, self.world_size = members, members.index(self.member), len(members)
        return self.generation

    def all_reduce(self, tensor, op="sum", watch=None):
        started = self.clock.t
        while self.stuck:
            self.clock.sleep(0.02)
            reason = watch(self.clock.t - started) if watch else None
            if reason is not None:
                raise CollectiveError(reason, "suspect", "step")
            if self.clock.t - started > 60:
                raise CollectiveError("Timed out waiting 60000ms", "timeout", "step")
        if op == "sum":
            tensor.mul_(self.world_size)
        if self.flag_next_reduce:
            self.flag_next_reduce = False
            tensor[-1] += 1.0

    def broadcast(self, tensor, src, watch=None):
        pass

    def ask_to_rejoin(self):
        self.asked_at = self.clock.t

    def admitted(self):
        if self.asked_at is None or self.clock.t < self.asked_at + self.admit_after:
            return None
        return self.generation + 1, tuple(sorted({*self.members, self.member}))

    def rejoin_requests(self):
        asking, self.requests = self.requests, ()
        return asking

    def admit(self, ranks):
        self.agreed_by_others = tuple(sorted(self.members + tuple(ranks)))
        return self.agreed_by_others

    def leave(self):
        self.left += 1
        self.stuck = False  # the abandoned group is the reaper's now; the next one works
        return 0.0

    def health_check(self, timeout_s):
        raise AssertionError("with a detector the health check asks the detector")


def make_detector_runner(tmp_path: Path, policy: str, group: ElasticGroup, clock: FakeClock,
                         fake: FakeDetector, **overrides):
    spec = policy_spec(policy, overrides)
    workload = Workload(WorkloadSpec(step_period=0.25, checkpoint_every=5, hidden=8, features=4),
                        seed=3, rank=group.member)
    recorder = EventRecorder(tmp_path / "events.jsonl", "rank", group.member)
    cuda = []
    runner = FaultTolerantRunner(spec, group, workload, Checkpointer(tmp_path / "ckpt"), recorder,
                                 random.Random(7), sleep=clock.sleep, detector=fake,
                                 clock=clock, free_accelerator=lambda: cuda.append(1) or {})
    return runner, cuda


class StopAt:
    """Freezes a peer (the fake way) when the runner reaches a step."""

    def __init__(self, group, detector, clock, step, peer, gone=False):
        self.args = (group, detector, clock, step, peer, gone)

    def __call__(self, runner):
        group, detector, clock, step, peer, gone = self.args
        original = runner.workload.train_step

        def train_step(all_reduce, world_size):
            if runner.workload.step == step and group.generation == 0:
                group.stuck = True
                if gone:
                    detector.gone.add(peer)
                else:
                    detector.silent_from[peer] = clock.t
            return original(all_reduce, world_size)
        runner.workload.train_step = train_step


def test_elastic_leaves_a_stuck_collective_and_goes_on_without_the_silent_rank(tmp_path):
    clock = FakeClock()
    group, detector = ElasticGroup(clock), FakeDetector(clock)
    runner, _ = make_detector_runner(tmp_path, "elastic", group, clock, detector)
    StopAt(group, detector, clock, step=6, peer=2)(runner)
    assert runner.run(max_steps=12) is Outcome.STOPPED
    evs = events(tmp_path)
    [suspect] = [e for e in evs if e["kind"] == "suspect"]
    assert (suspect["peer"], suspect["via"]) == (2, "heartbeat")
    assert suspect["waited_s"] <= 0.85  # the wait ended at the detector, not at a timeout
    [error] = [e for e in evs if e["kind"] == "collective_error"]
    assert error["cause"] == "suspect"
    [excluded] = [e for e in evs if e["kind"] == "exclude"]
    assert excluded["peers"] == [2]
    silent_for = group.joined_at[1] - detector.silent_from[2]
    assert silent_for == pytest.approx(FAKE_SUSPECT_AFTER_S + runner.policy.exclude_after, abs=0.1)
    assert group.proposals == [None, (0, 1, 3)]
    [member] = [e for e in evs if e["kind"] == "membership"]
    assert member["members"] == [0, 1, 3] and member["left_out"] == [2] and member["world"] == 3
    restored = [e for e in evs if e["kind"] == "restored"]
    assert restored[-1]["source"] == "peer" and restored[-1]["step"] == 6  # nothing rolled back
    steps = [e["step"] for e in evs if e["kind"] == "step"]
    assert steps == list(range(12))


def test_elastic_leaves_out_a_rank_whose_process_is_gone_at_once(tmp_path):
    clock = FakeClock()
    group, detector = ElasticGroup(clock), FakeDetector(clock)
    runner, _ = make_detector_runner(tmp_path, "elastic", group, clock, detector)
    StopAt(group, detector, clock, step=3, peer=1, gone=True)(runner)
    assert runner.run(max_steps=6) is Outcome.STOPPED
    evs = events(tmp_path)
    [suspect] = [e for e in evs if e["kind"] == "suspect"]
    assert suspect["via"] == "connection" and [e["peers"] for e in evs if e["kind"] == "exclude"] == [[1]]
    assert group.joined_at[1] - group.joined_at[0] < 1.0 + 0.2  # 3 steps, then at once
    assert group.members == (0, 2, 3)


def test_a_silent_rank_that_speaks_again_within_the_grace_is_kept(tmp_path):
    clock = FakeClock()
    group, detector = ElasticGroup(clock), FakeDetector(clock)
    runner, _ = make_detector_runner(tmp_path, "elastic", group, clock, detector, exclude_after="1s")
    StopAt(group, detector, clock, step=3, peer=1)(runner)
    original_sleep = runner.sleep

    def sleep(seconds):  # rank 1 speaks again 0.5 s into the grace
        original_sleep(seconds)
        if 1 in detector.silent_from and clock.t - detector.silent_from[1] > FAKE_SUSPECT_AFTER_S + 0.5:
            del detector.silent_from[1]
    runner.sleep = sleep
    assert runner.run(max_steps=6) is Outcome.STOPPED
    assert group.proposals[-1] == (0, 1, 2, 3) and "exclude" not in kinds(tmp_path)


def test_the_rank_left_out_opens_its_breaker_and_frees_the_accelerator(tmp_path):
    clock = FakeClock()
    group, detector = ElasticGroup(clock, member=2), FakeDetector(clock, me=2)
    runner, cuda = make_detector_runner(tmp_path, "elastic", group, clock, detector)
    StopAt(group, detector, clock, step=4, peer=0)(runner)
    group.agreed_by_others = (0, 1, 3)  # the others already agreed without this rank
    assert runner.run(max_steps=10) is Outcome.ISOLATED
    evs = events(tmp_path)
    breaker = [e for e in evs if e["kind"] == "breaker_open"]
    assert "left out" in breaker[0]["reason"]
    assert evs[-1]["kind"] == "resources_released" and cuda == [1]


def test_the_rank_cut_off_from_the_control_plane_isolates_itself(tmp_path):
    clock = FakeClock()
    group, detector = ElasticGroup(clock), FakeDetector(clock)
    runner, _ = make_detector_runner(tmp_path, "elastic", group, clock, detector)
    original = runner.workload.train_step

    def train_step(all_reduce, world_size):
        if runner.workload.step == 3:
            group.stuck, detector.cut_off = True, True
        return original(all_reduce, world_size)
    runner.workload.train_step = train_step
    assert runner.run(max_steps=10) is Outcome.ISOLATED
    evs = events(tmp_path)
    assert [e["via"] for e in evs if e["kind"] == "suspect"] == ["cut-off"]
    [breaker] = [e for e in evs if e["kind"] == "breaker_open"]
    assert "heard nothing from the control plane" in breaker["reason"]


def test_retry_with_detector_rejoins_the_whole_world(tmp_path):
    clock = FakeClock()
    group, detector = ElasticGroup(clock), FakeDetector(clock)
    runner, _ = make_detector_runner(tmp_path, "retry", group, clock, detector, detector={},
                                     backoff_base="50ms", jitter=["0s", "0s"])
    StopAt(group, detector, clock, step=3, peer=1)(runner)
    original_sleep = runner.sleep

    def sleep(seconds):  # the silent rank is back by the time of the health check
        original_sleep(seconds)
        detector.silent_from.pop(1, None) if group.left else None
    runner.sleep = sleep
    assert runner.run(max_steps=6) is Outcome.STOPPED
    assert group.proposals == [None, None] and group.members == (0, 1, 2, 3)
    assert [e["cause"] for e in events(tmp_path) if e["kind"] == "collective_error"] == ["suspect"]


def test_a_slow_collective_with_every_member_alive_reports_stragglers(tmp_path):
    clock = FakeClock()
    group, detector = ElasticGroup(clock), FakeDetector(clock)
    detector.degraded = [Straggler(3, 0.2, 0.3)]
    runner, _ = make_detector_runner(tmp_path, "elastic", group, clock, detector)
    original_all_reduce = group.all_reduce

    def slow(tensor, op="sum", watch=None):  # 2.5 s per all-reduce at step 2, nobody silent
        if op == "sum" and runner.workload.step == 2:
            for i in range(125):
                clock.sleep(0.02)
                assert watch(0.02 * (i + 1)) is None
        original_all_reduce(tensor, op, watch)
    group.all_reduce = slow
    assert runner.run(max_steps=4) is Outcome.STOPPED
    evs = events(tmp_path)
    [straggler] = [e for e in evs if e["kind"] == "straggler"]
    assert straggler["peer"] == 3 and straggler["loss"] == 0.2 and straggler["step"] == 2
    assert "suspect" not in kinds(tmp_path)


def test_free_accelerator_memory_measures_before_and_after():
    class FakeCuda:
        reserved, free = 4 << 30, 10 << 30

        def is_available(self):
            return True

        def memory_reserved(self):
            return self.reserved

        def mem_get_info(self):
            return self.free, 80 << 30

        def empty_cache(self):
            self.free += self.reserved
            self.reserved = 0

    cuda, cleared = FakeCuda(), []
    got = free_accelerator_memory(cuda, clear_workspaces=lambda: cleared.append(cuda.reserved))
    assert got == {"cuda_reserved_before": 4 << 30, "cuda_reserved_after": 0,
                   "cuda_free_before": 10 << 30, "cuda_free_after": 14 << 30}
    assert cleared == [4 << 30]  # cuBLAS's workspaces go before the cache is emptied


@pytest.mark.requires_gpu
def test_free_accelerator_memory_hands_cached_memory_back_to_the_device():
    block = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    weights = torch.randn(512, 512, device="cuda")
    (weights @ weights).sum().item()  # cuBLAS takes its workspace from the allocator
    del block, weights  # now cached by the allocator, not free on the device
    got = free_accelerator_memory()
    # what stays reserved is what live tensors hold (earlier tests' in this process): less
    # than one 2 MiB segment of the small pool more; cuBLAS's 66-68 MiB workspace is gone
    assert got["cuda_reserved_after"] - torch.cuda.memory_allocated() < 2 << 20, got
    assert got["cuda_free_after"] - got["cuda_free_before"] >= 200 << 20


# -- rejoin: a rank left out comes back at the next generation -----------------------------

def test_a_rank_cut_off_frees_what_it_holds_and_rejoins_once_it_hears_the_control_plane(tmp_path):
    clock = FakeClock()
    group, detector = ElasticGroup(clock, member=2), FakeDetector(clock, me=2)
    runner, cuda = make_detector_runner(tmp_path, "elastic", group, clock, detector, rejoin=True)
    original = runner.workload.train_step
    cut = {}

    def train_step(all_reduce, world_size):
        if runner.workload.step == 3 and not cut:
            group.stuck, detector.cut_off = True, True
            cut["at"] = clock.t
        if cut and clock.t - cut["at"] > 5.0:
            detector.cut_off = False  # the link is back
        return original(all_reduce, world_size)
    runner.workload.train_step = train_step
    original_sleep = runner.sleep

    def sleep(seconds):
        original_sleep(seconds)
        if cut and clock.t - cut["at"] > 5.0:
            detector.cut_off = False
    runner.sleep = sleep
    assert runner.run(max_steps=10) is Outcome.STOPPED
    evs = events(tmp_path)
    order = [e["kind"] for e in evs if e["kind"] in
             ("breaker_open", "resources_released", "rejoin_request", "rejoin_admitted", "group_ready")]
    assert order == ["group_ready", "breaker_open", "resources_released", "rejoin_request",
                     "rejoin_admitted", "group_ready"]
    assert cuda == [1]  # accelerator memory freed while it waited
    assert group.asked_at - cut["at"] == pytest.approx(5.0, abs=0.1)  # once it heard digests
    assert group.members == (0, 1, 2, 3)
    assert [e["step"] for e in evs if e["kind"] == "step"][-1] == 9


def test_a_rank_left_out_that_nobody_lets_in_leaves_after_rejoin_within(tmp_path):
    clock = FakeClock()
    group, detector = ElasticGroup(clock, member=2), FakeDetector(clock, me=2)
    runner, _ = make_detector_runner(tmp_path, "elastic", group, clock, detector, rejoin=True,
                                     rejoin_within="20s")
    StopAt(group, detector, clock, step=4, peer=0)(runner)
    group.agreed_by_others = (0, 1, 3)
    group.admit_after = math.inf
    assert runner.run(max_steps=10) is Outcome.ISOLATED
    evs = events(tmp_path)
    [opened] = [e for e in evs if e["kind"] == "breaker_open"]
    [gave_up] = [e for e in evs if e["kind"] == "rejoin_gave_up"]
    assert gave_up["waited_s"] == pytest.approx(20.0, abs=0.1)
    assert "left out" in opened["reason"] and "rejoin_request" in kinds(tmp_path)


def test_group_rank_0_admits_an_asking_rank_and_every_member_moves_on_after_that_step(tmp_path):
    clock = FakeClock()
    group, detector = ElasticGroup(clock), FakeDetector(clock)
    group.members, group.world_size = (0, 1, 3), 3  # rank 2 was left out before
    runner, _ = make_detector_runner(tmp_path, "elastic", group, clock, detector, rejoin=True)
    sizes = []
    original_reduce = group.all_reduce

    def all_reduce(tensor, op="sum", watch=None):
        sizes.append(tensor.numel())
        return original_reduce(tensor, op, watch)
    group.all_reduce = all_reduce
    original = runner.workload.train_step

    def train_step(all_reduce, world_size):
        if runner.workload.step == 4 and not group.proposals[1:]:
            group.requests = (2,)  # found by _admission before the step after this one
        return original(all_reduce, world_size)
    runner.workload.train_step = train_step
    assert runner.run(max_steps=10) is Outcome.STOPPED
    evs = events(tmp_path)
    [admit] = [e for e in evs if e["kind"] == "admit"]
    assert admit["peers"] == [2] and admit["gen"] == 1
    membership = [e for e in evs if e["kind"] == "membership"]
    assert membership[-1]["members"] == [0, 1, 2, 3] and membership[-1]["joined"] == [2]
    steps = [(e["step"], e["gen"]) for e in evs if e["kind"] == "step"]
    assert steps == [(s, 0) for s in range(6)] + [(s, 1) for s in range(6, 10)]
    assert "collective_error" not in kinds(tmp_path) and "backoff" not in kinds(tmp_path)
    n_params = sum(p.numel() for p in runner.workload.model.parameters())
    assert n_params + 1 in sizes and n_params not in sizes  # the gradients and the flag, in one


def test_a_member_moves_on_when_another_member_admits_a_rank(tmp_path):
    clock = FakeClock()
    group, detector = ElasticGroup(clock, member=1), FakeDetector(clock, me=1)
    runner, _ = make_detector_runner(tmp_path, "elastic", group, clock, detector, rejoin=True)
    original = runner.workload.train_step

    def train_step(all_reduce, world_size):
        if runner.workload.step == 3 and group.generation == 0:
            group.flag_next_reduce = True
        return original(all_reduce, world_size)
    runner.workload.train_step = train_step
    assert runner.run(max_steps=6) is Outcome.STOPPED
    assert group.proposals == [None, None]  # moved on to what rank 0 agreed, not a proposal of its own
    steps = [(e["step"], e["gen"]) for e in events(tmp_path) if e["kind"] == "step"]
    assert steps == [(0, 0), (1, 0), (2, 0), (3, 0), (4, 1), (5, 1)]


def gaps(times: list[float]) -> list[float]:
    return [round(b - a, 3) for a, b in itertools.pairwise(times)]


def test_a_rank_asking_back_ends_the_members_pacing_sleep_once(tmp_path):
    """The digest says a rank asked to rejoin: the step that may admit it starts within a
    pacing slice, not when it is due; the same request does not cut a later sleep short."""
    clock = FakeClock()
    group, detector = ElasticGroup(clock, member=1), FakeDetector(clock, me=1)
    detector.asks_at = [clock.t - 5.0]  # a request answered before this generation formed
    runner, _ = make_detector_runner(tmp_path, "elastic", group, clock, detector, rejoin=True)
    started: list[float] = []
    original = runner.workload.train_step

    def train_step(all_reduce, world_size):
        started.append(clock.t)
        if runner.workload.step == 3:
            detector.asks_at.append(clock.t + 0.09)  # during the sleep after step 3
        return original(all_reduce, world_size)
    runner.workload.train_step = train_step
    assert runner.run(max_steps=6) is Outcome.STOPPED
    assert gaps(started) == [0.25, 0.25, 0.25, 0.1, 0.25]


def test_without_rejoin_a_rank_asking_back_does_not_shorten_a_step(tmp_path):
    clock = FakeClock()
    group, detector = ElasticGroup(clock, member=1), FakeDetector(clock, me=1)
    detector.asks_at = [clock.t + 0.6]
    runner, _ = make_detector_runner(tmp_path, "elastic", group, clock, detector)
    started: list[float] = []
    original = runner.workload.train_step
    runner.workload.train_step = lambda *a: started.append(clock.t) or original(*a)
    assert runner.run(max_steps=5) is Outcome.STOPPED
    assert gaps(started) == [0.25] * 4


def test_rejoin_needs_an_elastic_policy():
    with pytest.raises(UsageError, match="rejoin needs an elastic policy"):
        policy_spec("isolation", {"rejoin": True})


@pytest.mark.skipif(os.geteuid() != 0, reason="a full disk is a size-capped tmpfs: mounting needs root")
def test_a_save_the_full_disk_refuses_is_recorded_and_the_retry_restores_the_last_durable_one(tmp_path):
    """The checkpoint folder fills up after step 4's save (a real ENOSPC): every later save
    fails, training goes on, and the failure at step 9 restores step 4, not a torn file."""
    group = ScriptedGroup(fail_steps={10})
    runner, _ = make_runner(tmp_path, "retry", group)
    state = runner.start(max_steps=5)
    while runner.workload.step < 5:
        state = runner.advance(state)
    ckpt = tmp_path / "ckpt"
    host = Host("r000", "10.0.0.1", None, None, None, storage=str(ckpt))
    ledger = Ledger("runnerfull", tmp_path / "state")
    full = NetlinkInjector(ledger, {"disk_full": SizedTmpfs()}).apply(DiskFull(), [host])
    try:
        runner.max_steps = 12
        while state is not State.DONE:
            state = runner.advance(state)
        assert Checkpointer(ckpt).steps() == [2, 4]
        assert not list(ckpt.glob(".tmp-*"))
    finally:
        full.revert()
    evs = events(tmp_path)
    # step 9's failure rolls back to 4: steps 6 and 8 are saved (and refused) twice
    assert [(e["step"], e["errno"]) for e in evs if e["kind"] == "checkpoint_failed"] == [
        (6, "ENOSPC"), (8, "ENOSPC"), (6, "ENOSPC"), (8, "ENOSPC"), (10, "ENOSPC"), (12, "ENOSPC")]
    assert [e["step"] for e in evs if e["kind"] == "restored"] == [0, 4]
    assert runner.exit_reason is Outcome.STOPPED
