"""The runner's retry / backoff / breaker logic, against a scripted fake group.

The fake stands in for gloo only here, where the logic is under test; tests/harness/
test_job.py runs the same runner against real gloo ranks in real namespaces.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from harness.checkpoint import Checkpointer
from harness.events import EventRecorder
from harness.group import CollectiveError
from harness.policies import policy_spec
from harness.runner import FaultTolerantRunner, Outcome
from harness.workload import Workload, WorkloadSpec


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
        self.peer_latest: int | None = None  # what "other ranks" report in the restore MIN
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
        if op == "min":
            if self.peer_latest is not None:
                tensor.fill_(min(int(tensor.item()), self.peer_latest))
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


def make_runner(tmp_path: Path, policy: str, group: ScriptedGroup, **overrides):
    spec = policy_spec(policy, {"timeout": "5s", **overrides})
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        group.calls.append("sleep")

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


def test_backoff_is_exponential_capped_with_seeded_jitter(tmp_path):
    group = ScriptedGroup(fail_steps={1}, join_failures=4)
    runner, sleeps = make_runner(tmp_path, "retry", group, max_retries=6, backoff_base="1s",
                                 backoff_cap="4s", jitter=["100ms", "1s"])
    assert runner.run(max_steps=3) is Outcome.STOPPED
    base = [1, 2, 4, 4, 4]  # five tries: four failed joins, then success
    assert len(sleeps) == 5
    for slept, b in zip(sleeps, base):
        assert b + 0.1 <= slept <= b + 1.0
    rng = random.Random(7)
    assert sleeps == [b + rng.uniform(0.1, 1.0) for b in base]  # reproducible from the seed


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


def test_restore_uses_the_minimum_over_ranks(tmp_path):
    group = ScriptedGroup(fail_steps={7})
    runner, _ = make_runner(tmp_path, "retry", group)
    group.peer_latest = 2  # another rank only sees checkpoint 2
    runner.run(max_steps=8)
    restored = [e["step"] for e in events(tmp_path) if e["kind"] == "restored"]
    assert restored == [0, 2]


def test_restore_loads_the_exact_weights_saved(tmp_path):
    ckpt = Checkpointer(tmp_path / "c")
    w = Workload(WorkloadSpec(hidden=8, features=4), seed=1, rank=0)
    w.train_step(lambda t: None, 1)
    ckpt.save(w.step, w.state())
    saved = [p.clone() for p in w.model.parameters()]
    w.train_step(lambda t: None, 1)
    w.load_state(ckpt.load(ckpt.latest()))
    assert w.step == 1
    assert all(torch.equal(a, b) for a, b in zip(saved, w.model.parameters()))
