"""Synthetic event histories of one trial, built step by step, for the reports tests.

Ranks step every PERIOD seconds, rank r offset by r ms; the fault is applied at FAULT_AT.
Each history function returns (events, trial) as the orchestrator would store them: the
events as runfolder.events defines them, the trial info (with its plan) as runfolder.info
types it, and `write_run` writes them through the contract.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from runfolder.events import EVENTS_FILE
from runfolder.info import MachineSpeed, RunInfo, TrialInfo, write_run_info, write_trial_info
from runfolder.layout import SCENARIO_FILE, trial_dir
from runfolder.plan import APPLY, REVERT, Action, Expectation, PlannedFault, TrialPlan

Events = list[dict[str, Any]]

PERIOD = 0.25
FAULT_AT = 10.0
RANKS = 4


class History:
    def __init__(self, ranks: int = RANKS, policy: str = "timeout", timeout: float = 5.0,
                 hang_cap: float = 30.0) -> None:
        self.ranks = ranks
        self.events: Events = []
        self.plan = TrialPlan(
            policy=policy, policy_spec={"name": policy, "base": policy, "timeout": timeout,
                                        "max_retries": 0 if policy in ("timeout", "baseline") else 3,
                                        "breaker": policy == "isolation"},
            workload={"step_period": PERIOD}, ranks=ranks, seed=7, warmup_steps=8, settle_steps=8,
            hang_cap=hang_cap, faults=(), actions=(), expect=None)
        self.next_step = {r: 0 for r in range(ranks)}
        self.harness(0.0, "trial_start", policy=policy, ranks=ranks, run_id="fake", backend="netns",
                     hang_cap=hang_cap)
        for r in range(ranks):
            self.rank(r, 0.01, "rank_start", policy=policy, world=ranks)
            self.rank(r, 0.05, "group_ready", gen=0, world=ranks, group_rank=r, secs=0.04)

    def harness(self, t: float, kind: str, **fields: Any) -> None:
        self.events.append({"t": t, "src": "harness", "rank": None, "pid": 1, "kind": kind, **fields})

    def rank(self, r: int, t: float, kind: str, **fields: Any) -> None:
        self.events.append({"t": t, "src": "rank", "rank": r, "pid": 100 + r, "kind": kind, **fields})

    def each(self, ranks: list[int] | None, t: float, kind: str, spread: float = 0.0, **fields: Any) -> None:
        """The same event on several ranks, rank r at t + r*spread."""
        for r in range(self.ranks) if ranks is None else ranks:
            self.rank(r, t + r * spread, kind, **fields)

    def steps(self, t_from: float, t_to: float, ranks: list[int] | None = None, gen: int = 0) -> None:
        """Every PERIOD from t_from (rank r offset by r ms) while before t_to."""
        for r in range(self.ranks) if ranks is None else ranks:
            t = t_from + r * 0.001
            while t < t_to:
                self.rank(r, t, "step", step=self.next_step[r], gen=gen, loss=1.0, dur=0.1)
                self.next_step[r] += 1
                t += PERIOD

    def fault(self, kind: str = "link_down", targets: tuple[int, ...] = (1,), end: float | None = None,
              start: float = FAULT_AT, index: int = 0) -> None:
        planned = PlannedFault(index=index, kind=kind, fault={"kind": kind}, description=kind,
                               targets=targets, start=start, duration=None if end is None else end - start)
        actions = (Action(start, APPLY, index),) + (() if end is None else (Action(end, REVERT, index),))
        self.plan = dataclasses.replace(self.plan, faults=self.plan.faults + (planned,),
                                        actions=tuple(sorted(self.plan.actions + actions, key=lambda a: a.at)))
        self.harness(start, "fault_applied", index=index, fault_kind=kind, fault={"kind": kind},
                     targets=list(targets), mechanism="fake", t_requested=start)
        if end is not None:
            self.harness(end, "fault_reverted", index=index, fault_kind=kind, targets=list(targets))

    def leave(self, ranks: list[int] | None, t: float, reason: str, code: int) -> None:
        self.each(ranks, t, "resources_released", outcome=reason, group=True, cuda_reserved_before=None,
                  cuda_reserved_after=None, cuda_free_before=None, cuda_free_after=None)
        self.each(ranks, t + 0.01, "exit", reason=reason, code=code)
        for r in range(self.ranks) if ranks is None else ranks:
            self.harness(t + 0.1, "rank_exited", rank=r, pid=100 + r, exitcode=code, signal=None)

    def end(self, t: float, survivors: list[int] | None = None) -> None:
        """The harness stops the survivors (they exit terminated) and ends the trial."""
        for r in survivors or []:
            self.rank(r, t, "exit", reason="terminated", code=0)
            self.harness(t + 0.1, "rank_exited", rank=r, pid=100 + r, exitcode=0, signal=None)
        self.harness(t + 0.2, "trial_end", reason="observed")

    def done(self) -> tuple[Events, TrialInfo]:
        info = TrialInfo(plan=self.plan, run_id="fake", backend="netns", mono_anchor=0.0, wall_anchor=0.0)
        return sorted(self.events, key=lambda e: e["t"]), info


def expecting(history: tuple[Events, TrialInfo], **expect: Any) -> tuple[Events, TrialInfo]:
    """The history with an expectation in its plan (outcome names and float seconds)."""
    events, info = history
    plan = dataclasses.replace(info.plan, expect=Expectation(**expect))
    return events, dataclasses.replace(info, plan=plan)


def absorbed() -> tuple[Events, TrialInfo]:
    """A 3 s flap: no error, steps stop 10-13.2 s and resume."""
    h = History(policy="timeout")
    h.steps(0.0, FAULT_AT)
    h.fault(end=13.0)
    h.steps(13.2, 20.0)
    h.end(20.0, survivors=list(range(RANKS)))
    return h.done()


def failed_fast() -> tuple[Events, TrialInfo]:
    """Link down; every rank times out at 15.1 + r*0.1 s and exits failed-fast."""
    h = History(policy="timeout")
    h.steps(0.0, FAULT_AT)
    h.fault(end=25.0)
    h.each(None, 15.1, "collective_error", spread=0.1, step=40, gen=0, phase="step", cause="timeout",
           error="Timed out waiting 5000ms for recv operation to complete")
    h.each(None, 15.5, "group_released", secs=0.01)
    h.leave(None, 15.6, "failed-fast", 3)
    h.end(26.0)
    return h.done()


def recovered() -> tuple[Events, TrialInfo]:
    """Link down 10-13 s; errors at 11.5 s, backoff, retry, restored at 17.9 s, steps from 18 s."""
    h = History(policy="retry", timeout=1.5)
    h.steps(0.0, FAULT_AT)
    h.fault(end=13.0)
    h.each(None, 11.5, "collective_error", step=40, gen=0, phase="step", cause="timeout", error="Timed out")
    h.each(None, 11.6, "group_released", secs=0.01)
    h.each(None, 11.6, "backoff", attempt=1, seconds=2.5)
    h.each(None, 14.1, "health_check", attempt=1, ok=True, detail="ok")
    h.each(None, 14.1, "retry", attempt=1, after_gen=0)
    h.each(None, 17.8, "group_ready", gen=1, world=RANKS, group_rank=0, secs=3.7)
    h.each(None, 17.9, "restored", step=30, gen=1, source="checkpoint")
    for r in range(RANKS):
        h.next_step[r] = 30
    h.steps(18.0, 25.0, gen=1)
    h.end(25.0, survivors=list(range(RANKS)))
    return h.done()


def isolated() -> tuple[Events, TrialInfo]:
    """Link down for good; errors at 15.1 s, the health check fails, the breaker opens at 18.2 s."""
    h = History(policy="isolation")
    h.steps(0.0, FAULT_AT)
    h.fault(end=40.0)
    h.each(None, 15.1, "collective_error", step=40, gen=0, phase="step", cause="timeout", error="Timed out")
    h.each(None, 15.2, "backoff", attempt=1, seconds=2.5)
    h.each(None, 17.7, "health_check", attempt=1, ok=False, detail="peer unreachable")
    h.each(None, 18.2, "breaker_open", spread=0.01, reason="health check failed")
    h.leave(None, 18.3, "isolated", 5)
    h.end(41.0)
    return h.done()


def hung() -> tuple[Events, TrialInfo]:
    """Baseline: no error ever; the harness sees no progress for its 30 s cap and kills the ranks."""
    h = History(policy="baseline", timeout=6 * 3600)
    h.steps(0.0, FAULT_AT)
    h.fault()
    h.harness(40.0, "hang_detected", cap=30.0, idle_since=9.75)
    for r in range(RANKS):  # stuck in a C++ call: only SIGKILL at the stop deadline ends them
        h.harness(45.0, "rank_exited", rank=r, pid=100 + r, exitcode=None, signal=9)
    h.harness(45.5, "trial_end", reason="hung")
    return h.done()


def crashed() -> tuple[Events, TrialInfo]:
    """Baseline with a short timeout: the error propagates and every rank crashes."""
    h = History(policy="baseline", timeout=5.0)
    h.steps(0.0, FAULT_AT)
    h.fault(end=30.0)
    h.each(None, 15.1, "collective_error", step=40, gen=0, phase="step", cause="timeout", error="Timed out")
    h.each(None, 15.2, "exit", reason="crashed", code=70, error="RuntimeError: Timed out")
    for r in range(RANKS):
        h.harness(15.4, "rank_exited", rank=r, pid=100 + r, exitcode=70, signal=None)
    h.end(31.0)
    return h.done()


def killed_then_failed_fast() -> tuple[Events, TrialInfo]:
    """SIGKILL on r1: it is gone (not a crash); the others see the peer close and fail fast."""
    h = History(policy="timeout")
    h.steps(0.0, FAULT_AT)
    h.fault(kind="kill", targets=(1,))
    h.harness(10.02, "rank_exited", rank=1, pid=101, exitcode=None, signal=9)
    survivors = [0, 2, 3]
    h.each(survivors, 10.05, "collective_error", spread=0.01, step=40, gen=0, phase="step",
           cause="closed", error="Connection closed by peer")
    h.leave(survivors, 10.3, "failed-fast", 3)
    h.end(12.0)
    return h.done()


def continued() -> tuple[Events, TrialInfo]:
    """SIGKILL on r3; the survivors re-form a world of 3 and go on (a future elastic policy)."""
    h = History(policy="elastic")
    h.steps(0.0, FAULT_AT)
    h.fault(kind="kill", targets=(3,))
    h.harness(10.02, "rank_exited", rank=3, pid=103, exitcode=None, signal=9)
    survivors = [0, 1, 2]
    h.each(survivors, 10.05, "collective_error", step=40, gen=0, phase="step", cause="closed", error="closed")
    h.each(survivors, 11.0, "group_ready", gen=1, world=3, group_rank=0, secs=0.9)
    h.each(survivors, 11.1, "restored", step=40, gen=1, source="checkpoint")
    h.steps(11.2, 16.0, ranks=survivors, gen=1)
    h.end(16.0, survivors=survivors)
    return h.done()


def continued_without_a_frozen_rank() -> tuple[Events, TrialInfo]:
    """r3 stopped for good (a pause never healed); the survivors suspect it, leave it out,
    and go on as 3 from 10.8 s; r3 is still alive, frozen, when the harness stops watching."""
    h = History(policy="elastic")
    h.steps(0.0, FAULT_AT)
    h.fault(kind="pause", targets=(3,))
    survivors = [0, 1, 2]
    h.each(survivors, 10.4, "suspect", peer=3, via="heartbeat", cause="heartbeat", silent_s=0.4, gen=0, waited_s=0.0)
    h.each(survivors, 10.7, "exclude", peers=[3], gen=0, reasons={"3": "rank 3 silent"})
    h.each(survivors, 10.72, "group_ready", gen=1, world=3, group_rank=0, secs=0.01)
    h.each(survivors, 10.72, "membership", gen=1, world=3, members=survivors, left_out=[3], joined=[])
    h.each(survivors, 10.75, "restored", step=40, gen=1, source="peer", peer=0, bytes=1024)
    h.steps(10.8, 16.0, ranks=survivors, gen=1)
    h.end(16.0, survivors=survivors)
    return h.done()


def rejoined() -> tuple[Events, TrialInfo]:
    """Link down on r3 10-20 s; survivors go on as 3 at 11.2 s; r3 is let back in at 20.4 s
    and all four step from 20.6 s."""
    h = History(policy="elastic")
    h.steps(0.0, FAULT_AT)
    h.fault(targets=(3,), end=20.0)
    survivors = [0, 1, 2]
    h.each(None, 10.8, "suspect", peer=3, via="heartbeat", cause="heartbeat", silent_s=0.8, gen=0, waited_s=0.8)
    h.rank(3, 10.9, "breaker_open", reason="health check failed: cut off")
    h.each(survivors, 10.95, "exclude", peers=[3], gen=0, reasons={"3": "rank 3 silent"})
    h.each(survivors, 11.0, "group_ready", gen=1, world=3, group_rank=0, secs=0.1)
    h.each(survivors, 11.1, "restored", step=40, gen=1, source="peer", peer=0, bytes=1024)
    h.steps(11.2, 20.5, ranks=survivors, gen=1)
    h.rank(3, 20.3, "rejoin_request", gen=0)
    h.rank(3, 20.4, "rejoin_admitted", gen=2, waited_s=9.5)
    h.each(None, 20.5, "group_ready", gen=2, world=4, group_rank=0, secs=0.1)
    h.each(None, 20.55, "restored", step=77, gen=2, source="peer", peer=0, bytes=1024)
    h.next_step[3] = 77
    h.steps(20.6, 25.0, gen=2)
    h.end(25.0, survivors=list(range(RANKS)))
    return h.done()


def restarted() -> tuple[Events, TrialInfo]:
    """torchrun (bench/torchrun_kill.py): SIGKILL on r1's worker; every other agent stops its
    worker group at 10.3 s (a suspect via agent); new workers start at 12 s, form a group,
    begin again at step 0 and step from 14 s."""
    h = History(policy="torchrun")
    h.steps(0.0, FAULT_AT)
    h.fault(kind="kill", targets=(1,))
    h.harness(10.02, "rank_exited", rank=1, pid=101, exitcode=None, signal=9)
    h.each([0, 2, 3], 10.3, "suspect", peer=None, via="agent", cause="agent", silent_s=None, gen=0, waited_s=None)
    for r in range(RANKS):
        h.rank(r, 12.0, "rank_start", pid=200 + r, policy="torchrun", world=RANKS)
        h.rank(r, 13.5, "group_ready", pid=200 + r, gen=1, world=RANKS, group_rank=r, secs=1.5)
        h.rank(r, 13.6, "restored", pid=200 + r, step=0, gen=1, source="initial")
        h.next_step[r] = 0
    h.steps(14.0, 20.0, gen=1)
    h.end(20.0, survivors=list(range(RANKS)))
    return h.done()


def requeued() -> tuple[Events, TrialInfo]:
    """Slurm preempts the job with requeue (tests/slurm): every rank checkpointed step 30,
    ends on SIGTERM at 10.1 s (made step 39 first); the scheduler starts the job again at
    25 s, the ranks restore step 30 and step from 27 s."""
    h = History(policy="retry")
    h.steps(0.0, FAULT_AT)
    h.each(None, 7.6, "checkpoint", step=30)
    h.fault(kind="preempt", targets=(0,))
    for r in range(RANKS):
        h.rank(r, 10.1, "exit", reason="terminated", code=0)
        h.harness(10.15, "rank_exited", rank=r, pid=100 + r, exitcode=0, signal=None)
    h.harness(25.0, "job_requeued", restarts=1, waited_s=14.9)
    for r in range(RANKS):
        h.rank(r, 26.0, "rank_start", pid=300 + r, policy="retry", world=RANKS)
        h.rank(r, 26.5, "group_ready", pid=300 + r, gen=0, world=RANKS, group_rank=r, secs=0.5)
        h.rank(r, 26.6, "restored", pid=300 + r, step=30, gen=0, source="checkpoint")
        h.next_step[r] = 30
    h.steps(27.0, 30.0)
    h.end(30.0, survivors=list(range(RANKS)))
    return h.done()


def preempted(saves_on_signal: bool) -> tuple[Events, TrialInfo]:
    """Slurm preempts the job for good (no requeue) at 10 s: every rank checkpointed step 30
    at 7.6 s and made step 39. One that saves on SIGTERM writes step 40 at 10.05 s and exits
    0; one that does not ends by the signal."""
    h = History(policy="retry")
    h.steps(0.0, FAULT_AT)
    h.each(None, 7.6, "checkpoint", step=30)
    h.fault(kind="preempt", targets=(0,))
    if saves_on_signal:
        h.each(None, 10.0, "step", step=40, gen=0, loss=1.0, dur=0.1)
        h.each(None, 10.05, "checkpoint", step=40)
    for r in range(RANKS):
        h.harness(10.15, "rank_exited", rank=r, pid=100 + r, exitcode=0 if saves_on_signal else None,
                  signal=None if saves_on_signal else 15)
    h.harness(10.3, "trial_end", reason="all-exited")
    return h.done()


def restarted_then_stopped(stopping: bool = True) -> tuple[Events, TrialInfo]:
    """`restarted`, then settled: the harness stops the ranks at 20 s and rank 0's worker
    prints a gloo error at 20.2 s as its peers go (SIGKILL at 23 s). `stopping`: the harness
    said when it began (format 13); without it the observation ends at the first kill."""
    events, info = restarted()
    h = History(policy="torchrun")
    h.events = [e for e in events if e["kind"] not in ("exit", "rank_exited", "trial_end") or e["t"] < 20.0]
    if stopping:
        h.harness(20.0, "stopping")
    h.rank(0, 20.2, "job_output", pid=200, cause="reset",
           line="[rank0]: RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")
    for r in range(RANKS):
        h.harness(23.0, "rank_exited", rank=r, pid=200 + r, exitcode=None, signal=9, stopped=True)
    h.harness(23.1, "trial_end", reason="settled")
    return sorted(h.events, key=lambda e: e["t"]), info


def _elastic_torchrun_job(per_host: int) -> History:
    """A user's job under torchrun with --nnodes 3:4 (no group_ready: its processes report
    their WORLD_SIZE when they begin), stepping until the fault."""
    h = History(policy="torchrun")
    h.plan = dataclasses.replace(h.plan, job={"command": ["python", "train.py"], "launcher": "torchrun",
                                              "min_hosts": 3, "nproc_per_host": per_host})
    h.events = [e for e in h.events if e["kind"] != "group_ready"]
    h.steps(0.0, FAULT_AT)
    return h


def elastic_hosts(per_host: int = 1) -> tuple[Events, TrialInfo]:
    """A user's job under torchrun with --nnodes 3:4: host 3 killed at 10 s; the other hosts' new workers
    begin at 40 s in a world of 3 hosts and step from 45 s."""
    h = _elastic_torchrun_job(per_host)
    h.fault(kind="kill", targets=(3,))
    h.harness(10.02, "rank_exited", rank=3, pid=103, exitcode=None, signal=9)
    h.each([0, 1, 2], 10.3, "suspect", peer=None, via="agent", cause="agent", silent_s=None, gen=0, waited_s=None)
    for r in range(3):
        h.rank(r, 40.0, "rank_start", pid=200 + r, policy="torchrun", world=3 * per_host)
    h.steps(45.0, 50.0, ranks=[0, 1, 2], gen=1)
    h.end(50.0, survivors=[0, 1, 2])
    return h.done()


def elastic_hosts_cut_off(per_host: int = 1, began: tuple[int, ...] = (0, 1, 2)) -> tuple[Events, TrialInfo]:
    """A user's job under torchrun with --nnodes 3:4: host 3 blackholed for good at 10 s.
    Every worker's collective times out at 15 s; the `began` hosts' new workers begin at 20 s
    in a world of 3 hosts and step from 22 s; host 3's agent lives on in its rendezvous."""
    h = _elastic_torchrun_job(per_host)
    h.fault(kind="blackhole", targets=(3,))
    h.each(None, 15.0, "collective_error", step=40, gen=0, phase="step", cause="timeout", error="Timed out")
    for r in began:
        for local in range(per_host):
            h.rank(r, 20.0, "rank_start", pid=200 + r, policy="torchrun", world=3 * per_host, local_rank=local)
    h.steps(22.0, 27.0, ranks=list(began), gen=1)
    h.end(27.0, survivors=[0, 1, 2, 3])
    return h.done()


def retries_exhausted() -> tuple[Events, TrialInfo]:
    h = History(policy="retry")
    h.steps(0.0, FAULT_AT)
    h.fault(end=60.0)
    h.each(None, 15.1, "collective_error", step=40, gen=0, phase="step", cause="timeout", error="Timed out")
    for attempt in (1, 2, 3):
        h.each(None, 15.0 + 5 * attempt, "retry", attempt=attempt, after_gen=attempt - 1)
        h.each(None, 17.0 + 5 * attempt, "collective_error", step=40, gen=attempt, phase="join",
               cause="rendezvous", error="store timeout")
    h.leave(None, 33.0, "retries-exhausted", 4)
    h.end(61.0)
    return h.done()


def stalled_without_verdict() -> tuple[Events, TrialInfo]:
    """Errors, then nothing: no exit, no step, no hang verdict before the trial ended."""
    h = History(policy="retry")
    h.steps(0.0, FAULT_AT)
    h.fault(end=12.0)
    h.each(None, 15.1, "collective_error", step=40, gen=0, phase="step", cause="timeout", error="Timed out")
    h.end(20.0)
    return h.done()


def no_fault() -> tuple[Events, TrialInfo]:
    h = History(policy="timeout")
    h.steps(0.0, 20.0)
    h.end(20.0, survivors=list(range(RANKS)))
    return h.done()


def write_trial(run_dir: Path, name: str, events: Events, trial: TrialInfo, torn_tail: bool = False) -> None:
    folder = trial_dir(run_dir, name)
    folder.mkdir(parents=True)
    write_trial_info(folder, trial)
    text = "".join(json.dumps(e) + "\n" for e in events)
    if torn_tail:  # a rank killed mid-write leaves half a line
        text += '{"t": 99.0, "src": "rank", "ki'
    (folder / EVENTS_FILE).write_text(text)


def write_run(run_dir: Path, trials: dict[str, tuple[Events, TrialInfo]], seed: int = 7,
              machine: MachineSpeed | None = None) -> Path:
    run_dir.mkdir(parents=True)
    write_run_info(run_dir, RunInfo(
        scenario="link-down-r1", scenario_file="scenarios/link_down.yaml", seed=seed, backend="netns",
        policies=tuple(trials), started_wall="2025-01-01T00:00:00+00:00",
        command="chaos run scenarios/link_down.yaml", clock="monotonic (one kernel)", machine=machine))
    (run_dir / SCENARIO_FILE).write_text("name: link-down-r1\nfaults:\n  - kind: link_down\n")
    for name, (events, trial) in trials.items():
        write_trial(run_dir, name, events, trial, torn_tail=True)
    return run_dir
