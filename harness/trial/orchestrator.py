"""The orchestrator: runs one trial (a policy of a scenario) on a fresh cluster; a scenario's
run of every trial in turn is harness.trial.scenario_run.

A trial goes through its phases, saving the event history as it goes:

    cluster up -> ranks start under the policy -> warm-up steps on every rank
      -> fault timeline: apply (ledger first) ... revert
      -> observe until every rank exited, or every live rank made `settle_steps` steps
         after the last fault action, or every live rank is frozen by a fault that never
         heals (held: nothing can move any more), or nothing moved for `hang_cap` (hung); a user's job
         that made no step by its start_timeout (steps not observed) is watched until every
         rank exited or `hang_cap` after the last fault action (cap); each round's facts
         judged once by the ordered rules of harness.trial.watch_end
      -> teardown on every path (pass, fail, Ctrl-C): faults reverted last-in first-out,
         ranks stopped (SIGTERM, then SIGKILL at one deadline), hosts removed

A trial executes its plan (harness.trial.plan), built once from the scenario and the
policy. The run folder (runfolder: `RUN_DIR/run.json`, `RUN_DIR/trials/<policy>/{trial.json
with the plan, events.jsonl, logs/}`) is what `reports` analyzes, now or later.
"""
from __future__ import annotations

import contextlib
import functools
import os
import secrets
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Collection, Sequence

from chaos.api import AppliedFault, Injection, Injector
from chaos.cmdfile import command_mechanisms
from chaos.errors import HarnessError, TargetGone, UsageError
from chaos.faults import MONITORS, FaultBase
from chaos.inject import default_mechanisms
from chaos.ledger import Ledger
from chaos.mechanism import Mechanism
from chaos.undo import record_owner, undo_outstanding
from harness import signals
from harness.cluster.api import Backend, Cluster
from harness.cluster.frameworks import FRAMEWORKS
from harness.cluster.launcher import LauncherPool
from harness.cluster.spec import ClusterSpec
from harness.cluster.undos import undo_table
from harness.cluster.workers import worker_processes
from harness.cluster.userjob import JobSpec, launch_command, rank_command, rank_environment
from harness.job.config import RankConfig, WorkloadSpec
from harness.job.device import (Placement, choose, gpu_memory_by_pid, job_device_env, rank_env)
from harness.job.gpufault import commands_dir
from harness.scenario.scenario import job_checkpoint_dir
from harness.trial import machine as machine_speed, stacks
from harness.trial.anchor_watch import AnchorWatch, Fired
from harness.trial.gpumem import GpuRelease
from harness.trial.plan import Plan, ranks_text, trial_deadline_s
from harness.trial.progress import Progress
from harness.trial.traffic import Sample, TrafficWatch
from harness.trial.watch_end import Round, decide
from runfolder import events as kinds
from runfolder.events import EVENTS_FILE, EventRecorder, read_events
from runfolder.frameworks import STORE, coordinator_host, training_hosts
from runfolder.info import TrialInfo, write_trial_info
from runfolder.layout import (CHECKPOINT_DIR, LOGS_DIR)
from runfolder.plan import APPLY, REVERT, Action, TrialPlan

POLL_S = 0.05
# while an anchored fault waits for its event: the poll is the most of the event-to-fault lag
# (bench/anchor_lag.py, docs/performance.md), and it must stay well under a step
ANCHOR_POLL_S = 0.01
STACKS_AT_DETECT_DEADLINE_S = 30.0  # for the captures at detection still running when a trial ends
STOP_DEADLINE_S = 3.0
DEAD_MAN_MARGIN_S = 5.0


@dataclass
class Monitor:
    """Follows a trial's events: steps per rank, last activity, live ranks. A rank (host)
    with `per_host` processes (a user's job's nproc_per_host) counts the steps of the one
    that made the fewest: every process of the job must step, not just one per host."""

    path: Path
    ranks: int
    last_activity: float  # t of the latest rank event
    per_host: int = 1
    offset: int = 0
    step_of: dict[int, int] = field(default_factory=dict)
    # by (rank, local rank)
    steps_since: dict[tuple[int, int], int] = field(default_factory=dict)  # steps after `mark()`
    steps_made: dict[tuple[int, int], int] = field(default_factory=dict)   # steps since the trial began
    breakers: dict[int, float] = field(default_factory=dict)   # rank -> its breaker_open t
    errors: int = 0
    exited: set[int] = field(default_factory=set)
    exited_at: dict[int, float] = field(default_factory=dict)  # rank -> t its process was reaped
    detections: list[float] = field(default_factory=list)  # t of every rank's detection event
    seen: Callable[[dict[str, Any]], None] | None = None  # told every event read (anchored faults)

    def poll(self) -> None:
        events, self.offset = read_events(self.path, self.offset)
        for ev in events:
            if self.seen is not None:
                self.seen(ev)
            if ev["src"] != kinds.RANK:
                continue
            self.last_activity = max(self.last_activity, ev["t"])
            rank = ev["rank"]
            worker = (rank, ev.get("local_rank", 0))
            if ev["kind"] == kinds.STEP:
                self.step_of[rank] = ev["step"]
                self.steps_since[worker] = self.steps_since.get(worker, 0) + 1
                self.steps_made[worker] = self.steps_made.get(worker, 0) + 1
            elif ev["kind"] in (kinds.GROUP_READY, kinds.GROUP_INIT):
                # a rank in a group formed again settles by its steps in that group: those
                # before it are not the recovery's (the report's `resumed` counts from there)
                self.steps_since.pop(worker, None)
            elif ev["kind"] == kinds.BREAKER_OPEN:
                self.breakers.setdefault(rank, ev["t"])
            elif ev["kind"] == kinds.COLLECTIVE_ERROR:
                self.errors += 1
            if ev["kind"] in kinds.DETECTION_KINDS:
                self.detections.append(ev["t"])

    def mark(self) -> None:
        self.steps_since = {}

    def least_since(self) -> int:
        """Steps since `mark()` of the live rank that made the fewest."""
        return min((self.fewest(self.steps_since, r) for r in self.live), default=0)

    def fewest(self, counts: dict[tuple[int, int], int], rank: int, missing: int = 0) -> int:
        """`rank`'s steps in `counts`: those of its process that made the fewest."""
        return min(counts.get((rank, local), missing) for local in range(self.per_host))

    @property
    def live(self) -> list[int]:
        return [r for r in range(self.ranks) if r not in self.exited]

    def all_made(self, steps: int, frozen: Collection[int] = ()) -> bool:
        """Every live rank but the `frozen` ones made `steps` since the mark, or since it last
        joined a group formed after it (and one did)."""
        moving = [r for r in self.live if r not in frozen]
        return bool(moving) and all(self.fewest(self.steps_since, r, missing=-1) >= steps for r in moving)

    def summary(self) -> str:
        steps = [self.step_of.get(r, 0) for r in self.live] or [0]
        return (f"step {min(steps)}..{max(steps)}  live {len(self.live)}/{self.ranks}"
                f"  errors {self.errors}")


@dataclass
class _Timeline:
    """The fault timeline's state across the watch's rounds."""

    pending: list[Action]  # actions not yet due, by time (anchored ones once their event came)
    traffic: TrafficWatch
    fired: dict[int, Fired] = field(default_factory=dict)  # the anchored faults whose event came, by index
    outstanding: dict[int, Injection] = field(default_factory=dict)  # applied and not yet reverted, by index
    killed: set[int] = field(default_factory=set)  # hosts a kill fault ended, for the framework's relaunch


@dataclass(frozen=True)
class TrialResult:
    policy: str
    trial_dir: Path
    end: str          # all-exited | settled | held | hung | deadline | cap (steps not observed)
    seconds: float


def trial_mechanisms(backend: Backend, cluster: Cluster, trial_dir: Path) -> dict[str, Mechanism]:
    """Per fault kind, the mechanism a trial injects with: the probed defaults where the
    backend has links (probing needs root), the cluster's own over them, and last the
    trial's own delivery of gpu_hang and step_delay (their command files in this trial's
    folder), which no backend's default can know."""
    # a backend that declares its own link kinds (a Slurm node's agent) makes them its own way
    probed = backend.traits.network_faults and backend.traits.link_kinds is None
    return {**(default_mechanisms() if probed else {}), **cluster.mechanisms(),
            **command_mechanisms(commands_dir(trial_dir))}



class Trial:
    """One scenario under one policy: executes its plan on a fresh cluster.

    `clock` and `sleep` pace the trial (injected: the fake cluster's tests run it on a fake
    clock); `state_dir` holds the ledger (default: chaos.ledger's); `launchers` lends the
    rank launcher (a run's trials share one; default: a launcher for this trial alone)."""

    def __init__(self, plan: Plan, trial_dir: Path, backend: Backend, progress: Progress,
                 make_injector: Callable[[Ledger, Cluster], Injector] | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 state_dir: Path | None = None, placement: Placement | None = None,
                 launchers: LauncherPool | None = None) -> None:
        self.plan = plan.trial
        self.faults = plan.faults
        self.ranks_per_node = plan.ranks_per_node
        self.scheduler_args = plan.scheduler_args
        self.placement = placement or choose("cpu", "gloo", plan.trial.ranks, 0)
        self.trial_dir = trial_dir
        self.backend = backend
        self.progress = progress
        # a backend without links gets no probe (it needs root): its cluster's own mechanisms
        self.make_injector = make_injector or (lambda ledger, cluster: cluster.injector(
            ledger, trial_mechanisms(backend, cluster, trial_dir)))
        self.clock = clock
        self.sleep = sleep
        self.state_dir = state_dir
        self.launchers = launchers
        self.run_id = secrets.token_hex(3)
        self.events_path = trial_dir / EVENTS_FILE

    @functools.cached_property
    def training(self) -> tuple[int, ...]:
        """The hosts that train: every one but a coordinator's (runfolder.frameworks)."""
        return training_hosts(self.plan.ranks, self.plan.job, self.plan.store_host)

    @property
    def storage_dir(self) -> Path:
        """The ranks' checkpoint folder, where storage faults act: the runner's, or the one
        a user's job names under its trial folder (one folder for every rank: they share
        this machine's disk)."""
        if self.plan.job is None:
            return self.trial_dir / CHECKPOINT_DIR
        return self.trial_dir / job_checkpoint_dir(JobSpec.model_validate(self.plan.job))

    def _say(self, text: str) -> None:
        self.progress.phase(self.plan.policy, text)

    def _rank_config(self, cluster: Cluster, rank: int) -> dict:
        return RankConfig.model_validate(dict(
            rank=rank, world_size=len(self.training), seed=self.plan.seed,
            store_address=cluster.store_address, store_port=cluster.store_port,
            events_path=str(self.events_path), checkpoint_dir=str(self.trial_dir / CHECKPOINT_DIR),
            policy=self.plan.policy_spec, workload=self.plan.workload,
            device=self.placement.device, comm=self.placement.comm,
            ifname=cluster.hosts[rank].ifname,
            env=rank_env(self.placement, rank, self.plan.policy_spec["base"], cluster.hosts[rank].ifname),
        )).model_dump(mode="json")

    def _start(self, cluster: Cluster, rank: int) -> int:
        """Start `rank`: the harness's runner, or the user's job (harness.cluster.userjob)."""
        if self.plan.job is None:
            return cluster.start_rank(rank, self._rank_config(cluster, rank))
        job = JobSpec.model_validate(self.plan.job)
        host = cluster.hosts[rank]
        # the job's hosts: every one, or where the store has a host of its own (the last),
        # the others: its agents rendezvous there and the job never counts it
        hosts = cluster.hosts[:len(self.training)] if self.plan.store_host else cluster.hosts
        addresses = [h.address for h in hosts]
        env = rank_environment(job, rank, len(hosts), self.run_id, self.plan.policy, str(self.events_path),
                               host.ifname, device=job_device_env(self.placement, rank, host.ifname),
                               master=(cluster.hosts[0].address, cluster.job_port), addresses=addresses)
        argv = rank_command(job, rank, len(hosts), self.run_id, f"{cluster.store_address}:{cluster.store_port}",
                            addresses=addresses)
        return cluster.start_job(rank, launch_command(job, argv, env, self.trial_dir, host.address))

    def run(self) -> TrialResult:
        """Run the trial; teardown steps are stacked as side effects happen and run last-in
        first-out on every path, each even if an earlier one failed."""
        plan = self.plan
        self.trial_dir.mkdir(parents=True, exist_ok=True)
        write_trial_info(self.trial_dir, TrialInfo(plan=plan, run_id=self.run_id, backend=self.backend.name,
                                                   mono_anchor=self.clock(), wall_anchor=time.time()))
        ledger = Ledger(self.run_id, self.state_dir)
        recorder = EventRecorder(self.events_path, kinds.HARNESS, clock=self.clock)
        started = recorder.emit(kinds.TRIAL_START, policy=plan.policy, run_id=self.run_id,
                                ranks=plan.ranks, backend=self.backend.name, hang_cap=plan.hang_cap)
        end, stopped_by = ["error"], []
        with contextlib.ExitStack() as teardown:
            teardown.callback(ledger.close_if_clean)
            # what no cluster took back: the owner entry when bring-up stopped before a cluster
            # existed (the ledger's first line is written only once this is in place)
            teardown.callback(undo_outstanding, ledger, undo_table())
            record_owner(ledger)
            teardown.callback(recorder.close)
            teardown.callback(lambda: recorder.emit(kinds.TRIAL_END, reason=end[0], **dict(stopped_by)))
            teardown.push(lambda _type, exc, _tb: stopped_by.append(("error", _stop_text(exc))) if exc else None)
            teardown.callback(self.progress.done)
            launchers = self.launchers or teardown.enter_context(LauncherPool(self.state_dir))
            launcher = launchers.next_launcher
            cluster = self.backend.up(ClusterSpec(self.run_id, plan.ranks, self.trial_dir,
                                                  Path(plan.job["workdir"]) if plan.job else None,
                                                  tuple(self.placement.gpu_of(r) for r in range(plan.ranks)),
                                                  tuple((plan.sysctls or {}).items()), _preload(plan.job),
                                                  ranks_per_host=self.ranks_per_node,
                                                  scheduler_args=self.scheduler_args, say=self._say,
                                                  store_host=plan.store_host),
                                      ledger, launchers)
            teardown.callback(cluster.close)
            teardown.callback(self._stop_ranks, cluster, recorder)
            at_detection = stacks.AtDetection(self.trial_dir, functools.partial(self._captured, recorder, "detect"))
            teardown.callback(at_detection.join, STACKS_AT_DETECT_DEADLINE_S)  # before the ranks stop
            up = recorder.emit(kinds.CLUSTER_UP, secs=round(self.clock() - started, 3), launcher=launcher,
                               phases={k: round(v, 3) for k, v in getattr(cluster, "timings", {}).items()})
            teardown.callback(self._count_drops, cluster, recorder, cluster.backlog_drops(), up)
            teardown.callback(self._count_steal, recorder, machine_speed.steal_s(), up)
            self._say(f"cluster up: {len(cluster.hosts)} {self.backend.name} hosts in {up - started:.2f} s"
                      + (" (rank launcher kept from the last trial)" if launcher == "kept" else ""))
            self._refuse_what_hosts_cannot_take(cluster)
            if any(fault.acts_on == "storage" for fault in self.faults):
                self.storage_dir.mkdir(parents=True, exist_ok=True)  # a job's own code may expect it
            for rank in range(plan.ranks):
                # the runner's store on a host of its own started with the cluster: its process
                pid = cluster.pid(rank) if plan.store_host and rank not in self.training else self._start(cluster, rank)
                recorder.emit(kinds.RANK_SPAWNED, rank=rank, pid=pid)
            # a coordinator (its own host, the last) makes no step: the others are the ranks
            monitor = Monitor(self.events_path, len(self.training), last_activity=up,
                              per_host=plan.job["nproc_per_host"] if plan.job else 1)
            steps_observed = self._warm_up(cluster, monitor, recorder, up)
            faults = teardown.enter_context(contextlib.ExitStack())
            end[0] = self._observe(cluster, monitor, recorder, ledger, faults, steps_observed,
                                   at_detection if plan.stacks_at_detect else None)
        seconds = self.clock() - started
        self._say(f"done: {end[0]} after {seconds:.1f} s")
        return TrialResult(plan.policy, self.trial_dir, end[0], seconds)

    def _refuse_what_hosts_cannot_take(self, cluster: Cluster) -> None:
        for index, planned in enumerate(self.plan.faults):
            for rank in planned.targets:
                if why := cluster.refuses(planned.kind, rank):
                    raise UsageError(f"faults[{index}] ({planned.description} on r{rank}): {why}; see what "
                                     f"each host allows with `chaos doctor --backend {self.backend.name}`, and "
                                     "leave this fault out or run where it is allowed")

    def _count_drops(self, cluster: Cluster, recorder: EventRecorder, at_up: int | None, up: float) -> None:
        """What the kernel dropped with a receive backlog full while the ranks ran, said
        where it happened at all: past ~32 ranks per core veth traffic overflows it."""
        if at_up is None or (now := cluster.backlog_drops()) is None:
            return
        packets, secs = now - at_up, round(self.clock() - up, 3)
        recorder.emit(kinds.HOST_DROPS, packets=packets, secs=secs)
        if packets:
            self._say(f"the kernel dropped {packets} packets with a CPU's receive backlog full in these "
                      f"{secs:.0f} s (whole machine; net.core.netdev_max_backlog): a loss no fault injected")

    def _count_steal(self, recorder: EventRecorder, at_up: float | None, up: float) -> None:
        """CPU time the VM's host took while the ranks ran: on a shared VM a slow hour is
        the host's, and a stop of the whole machine makes every rank silent at once."""
        if at_up is None or (now := machine_speed.steal_s()) is None:
            return
        recorder.emit(kinds.MACHINE_STEAL, steal_s=round(now - at_up, 2), cpus=len(os.sched_getaffinity(0)),
                      secs=round(self.clock() - up, 3))

    def _stop_ranks(self, cluster: Cluster, recorder: EventRecorder) -> None:
        recorder.emit(kinds.STOPPING)
        for ex in cluster.stop_ranks(STOP_DEADLINE_S):
            recorder.emit(kinds.RANK_EXITED, t=ex.t, rank=ex.rank, pid=ex.pid,
                          exitcode=ex.exitcode, signal=ex.signal, stopped=True)

    def _reap(self, cluster: Cluster, monitor: Monitor, recorder: EventRecorder) -> None:
        for ex in cluster.reap():
            monitor.exited.add(ex.rank)
            monitor.exited_at[ex.rank] = ex.t
            recorder.emit(kinds.RANK_EXITED, t=ex.t, rank=ex.rank, pid=ex.pid,
                          exitcode=ex.exitcode, signal=ex.signal)

    def _warm_up(self, cluster: Cluster, monitor: Monitor, recorder: EventRecorder,
                 up: float) -> bool:
        """Wait for the warm-up steps on every rank; False when a user's job made no step at
        all by its start_timeout while every rank's process lived: no step source (no
        torch.optim, no opt-in, no step_pattern), so the trial goes on on time alone."""
        # a user's job starts its own interpreters and imports torch in each: it says how long.
        # The harness's ranks come up within the backend's bound, then make their warm-up steps
        # at the step period, which the scale rule stretches (12 of 4 s at 256 ranks on 2 cores).
        start_timeout = self.plan.job["start_timeout"] if self.plan.job else (
            self.backend.start_timeout_s + self.plan.warmup_steps * self.plan.workload["step_period"])
        deadline = self.clock() + start_timeout
        want = self.plan.warmup_steps
        logs = self.trial_dir / LOGS_DIR
        while not monitor.all_made(want):
            self.sleep(POLL_S)
            signals.check()
            monitor.poll()
            self._reap(cluster, monitor, recorder)
            if monitor.exited:
                raise HarnessError(f"{_what_exited(sorted(monitor.exited), self.plan)} "
                                   f"exited during warm-up; see {logs}")
            if self.clock() > deadline:
                # a framework's workers step through torch.optim: none means they never came up
                if self.plan.job and not monitor.step_of and self.plan.job["launcher"] not in FRAMEWORKS:
                    recorder.emit(kinds.STEPS_NOT_OBSERVED, waited_s=round(start_timeout, 3))
                    self._say(f"warm-up: no step from any rank in {start_timeout:g} s, every rank alive: "
                              "steps not observed; the faults run on time alone")
                    return False
                none = [f"r{r:03d}" for r in monitor.live if monitor.fewest(monitor.steps_made, r) == 0]
                silent = f"; no step from {', '.join(none)}" if none else ""
                raise HarnessError(f"ranks did not make {want} steps within "
                                   f"{start_timeout:.0f} s ({monitor.summary()}{silent}); see {logs}")
            self.progress.status(self.plan.policy, monitor.least_since() / want,
                                 f"warm-up   {monitor.summary()}")
        t = recorder.emit(kinds.WARMUP_DONE, step=min(monitor.step_of.values()))
        self._say(f"warm-up: {want} steps on all ranks, {t - up:.1f} s after bring-up")
        return True

    def _observe(self, cluster: Cluster, monitor: Monitor, recorder: EventRecorder,
                 ledger: Ledger, faults: contextlib.ExitStack, steps_observed: bool,
                 at_detection: stacks.AtDetection | None) -> str:
        plan = self.plan
        injector = self.make_injector(ledger, cluster)
        t_warm = self.clock()
        anchors = AnchorWatch(plan.faults, plan.job is not None, t_warm)
        monitor.seen = anchors.see
        try:
            return self._watch(cluster, monitor, recorder, injector, faults, steps_observed, at_detection,
                               t_warm, anchors)
        finally:  # the trial ends (however) before these events came
            monitor.seen = None
            self._not_come(anchors.give_up(), recorder, "the trial ended first")

    def _not_come(self, indexes: list[int], recorder: EventRecorder, why: str | None = None) -> None:
        """Anchored faults whose event never came (by their `until`, or `why`): not applied,
        recorded and said."""
        for index in indexes:
            planned = self.plan.faults[index]
            anchor = planned.anchor
            assert anchor is not None
            ended = why or f"waited until +{anchor.until:g} s after warm-up"
            recorder.emit(kinds.FAULT_NOT_APPLIED, index=index, fault_kind=planned.kind,
                          targets=list(planned.targets), exited_t=[], waited_for=anchor.describe())
            self._say(f"fault {planned.description} on {ranks_text(planned.targets)}: not applied, its event "
                      f"{anchor.describe()} never came ({ended})")

    def _watch(self, cluster: Cluster, monitor: Monitor, recorder: EventRecorder, injector: Injector,
               faults: contextlib.ExitStack, steps_observed: bool, at_detection: stacks.AtDetection | None,
               t_warm: float, anchors: AnchorWatch) -> str:
        """The watch's loop: each round the fault timeline acts, the watchers poll, and the
        round's facts are judged once (harness.trial.watch_end), the loop acting on the rule."""
        plan = self.plan
        # the settle steps' own time on top: a campaign's trial settles for minutes (harness.studies.campaign)
        settling = plan.settle_steps * plan.workload["step_period"] if steps_observed else 0.0
        deadline_s = trial_deadline_s(plan) + settling
        monitor.last_activity = t_warm
        monitor.mark()
        timeline = _Timeline(list(plan.actions), self._traffic_watch(cluster, monitor))
        # NVML per pid means nothing for ranks on the CPU: not observed, never a 0 s release
        gpu = GpuRelease(gpu_memory_by_pid if self.placement.device == "cuda" else lambda: None)
        job = JobSpec.model_validate(plan.job) if plan.job else None
        relaunch = job.framework.relaunch(job) if job is not None and job.framework is not None else None
        watchers: list[Callable[[float], None]] = [  # after the timeline, each round, in this order
            lambda now: self._poll_stacks(at_detection, cluster, monitor),
            lambda now: self._poll_gpu(gpu, cluster, monitor, recorder),
            lambda now: self._reap(cluster, monitor, recorder),
        ]
        while True:
            monitor.poll()  # first: an anchored fault whose event came is applied in this round
            now = self.clock()
            self._act_due(timeline, now, t_warm, cluster, monitor, recorder, injector, faults, gpu, at_detection,
                          anchors)
            monitor.poll()
            for poll in watchers:
                poll(now)
            relaunching = relaunch is not None and self._relaunch(cluster, monitor, recorder, now, relaunch,
                                                                   timeline.killed)
            live = frozenset(monitor.live)
            if anchors.waiting and not timeline.pending and steps_observed and live and live <= frozen_for_good(
                    timeline.outstanding, plan):  # the events they wait for come from ranks that can never move
                self._not_come(anchors.give_up(), recorder, "every live rank is frozen by a fault that never heals")
            waiting = bool(timeline.pending or anchors.waiting or relaunching)  # a host to start again settles too
            # a rank frozen or cut off for good never steps with the others again: they settle without it
            frozen, cut_off = ((frozen_for_good(timeline.outstanding, plan), cut_off_for_good(timeline.outstanding,
                                                                                               plan))
                               if not waiting and steps_observed else (set(), set()))
            this = Round(since_warm_s=now - t_warm, deadline_s=deadline_s, live=live, relaunching=relaunching,
                         requeue=None if live or relaunching else cluster.requeue_state(), waiting=waiting,
                         steps_observed=steps_observed, settled=monitor.all_made(plan.settle_steps, frozen | cut_off),
                         frozen=frozenset(frozen), idle_s=now - monitor.last_activity, hang_cap=plan.hang_cap,
                         last_action_s=plan.last_action_s)
            rule = decide(this)
            if rule is not None and rule.end is not None:
                self._ending(rule.name, this, cluster, monitor, recorder)
                return rule.end
            if rule is not None and rule.name == "requeued":
                self._restart(cluster, monitor, recorder)
            self.progress.status(plan.policy, *self._progress(this, monitor, rule is not None
                                                              and rule.name == "requeue-pending"))
            self.sleep(ANCHOR_POLL_S if anchors.waiting else POLL_S)
            signals.check()

    def _act_due(self, timeline: _Timeline, now: float, t_warm: float, cluster: Cluster, monitor: Monitor,
                 recorder: EventRecorder, injector: Injector, faults: contextlib.ExitStack, gpu: GpuRelease,
                 at_detection: stacks.AtDetection | None, anchors: AnchorWatch) -> None:
        """The fault timeline's round: anchored faults whose event came are scheduled, those
        whose event is past its `until` given up, and every action now due applied or reverted."""
        plan = self.plan
        for event in anchors.take():
            timeline.fired[event.index] = event
            shifted = [replace(a, at=event.t - t_warm + a.at) for a in plan.anchored if a.index == event.index]
            timeline.pending = sorted(timeline.pending + shifted, key=lambda a: (a.at, a.verb == APPLY))
        self._not_come(anchors.expired(now), recorder)
        traffic = timeline.traffic
        traffic.due(now - t_warm)
        while timeline.pending and t_warm + timeline.pending[0].at <= now:
            action = timeline.pending.pop(0)
            if action.verb == APPLY:
                targets = self._with_a_process(action.index, cluster, monitor, recorder, t_warm)
                pids = {rank: cluster.pid(rank) for rank in targets}
                applied = self._apply(action.index, targets, cluster, injector, recorder, timeline.outstanding,
                                      on_phase_s(action, timeline.pending), traffic.applying(action),
                                      timeline.fired.get(action.index)) if targets else None
                if applied is not None:
                    if applied.fault.ends_host:  # a host killed (a worker killed leaves its agent)
                        gpu.killed(pids, applied.t_applied)
                        timeline.killed.update(targets)
                    if at_detection is not None:
                        at_detection.armed(action.index, applied.t_applied)
                    traffic.applied(action)
                    faults.callback(self._revert, action.index, timeline.outstanding, recorder, traffic, True)
            else:
                self._revert(action.index, timeline.outstanding, recorder, traffic)
            # the settle steps count from the plan's last action, applied or not: a last
            # fault whose rank was gone ended a campaign's trial 46 s before its window
            monitor.mark()

    def _poll_stacks(self, at_detection: stacks.AtDetection | None, cluster: Cluster, monitor: Monitor) -> None:
        if at_detection is not None:
            at_detection.poll(monitor.detections, lambda: self._live_pids(cluster, monitor))

    @staticmethod
    def _poll_gpu(gpu: GpuRelease, cluster: Cluster, monitor: Monitor, recorder: EventRecorder) -> None:
        for rank, breaker_t, held in gpu.poll(monitor.breakers, cluster.pid):
            recorder.emit(kinds.GPU_MEMORY_RELEASED, rank=rank, breaker_t=breaker_t, held=held)
        for rank, pid, killed_t in gpu.freed():
            recorder.emit(kinds.GPU_MEMORY_FREED, rank=rank, killed_t=killed_t, killed_pid=pid)

    def _ending(self, rule: str, this: Round, cluster: Cluster, monitor: Monitor, recorder: EventRecorder) -> None:
        """What the watch says and keeps as it ends by `rule`."""
        cap = self.plan.hang_cap
        if rule == "requeue-late":
            self._say("the scheduler did not start the job again by the trial's deadline")
        elif rule == "held":
            self._say(f"every live rank ({ranks_text(sorted(this.live))}) is frozen by a fault that never heals: "
                      "nothing can move any more")
        elif rule == "cap":
            self._say(f"still running {cap:g} s after the last fault action (the cap); steps not observed")
            self._capture_stacks(cluster, monitor, recorder, "cap")
        elif rule == "hung":
            recorder.emit(kinds.HANG_DETECTED, cap=cap, idle_since=round(monitor.last_activity, 6))
            self._say(f"hung: no step and no policy action for {cap:g} s (the cap)")
            self._capture_stacks(cluster, monitor, recorder, "hung")

    def _progress(self, this: Round, monitor: Monitor, requeue_pending: bool) -> tuple[float, str]:
        """How far the watch is, and in which phase, for the progress line."""
        t = this.since_warm_s
        if requeue_pending:
            return t / this.deadline_s, f"the scheduler is to start the job again ({this.idle_s:.0f} s)"
        if this.waiting:
            done, phase = t / max(this.last_action_s, POLL_S), "faults  "
        elif not this.steps_observed:
            watched = t - this.last_action_s
            done, phase = watched / this.hang_cap, f"to the cap ({watched:.0f}/{this.hang_cap:g} s, no steps)"
        else:  # settled by steps, or hung by the cap: whichever comes first
            done = max(monitor.least_since() / self.plan.settle_steps, this.idle_s / this.hang_cap)
            phase = f"settling (idle {this.idle_s:.0f}/{this.hang_cap:g} s)"
        return done, f"{phase}  t+{t:5.1f}s  {monitor.summary()}"

    def _relaunch(self, cluster: Cluster, monitor: Monitor, recorder: EventRecorder, now: float,
                  after: float, killed: set[int]) -> bool:
        """A framework's hosts that a kill fault ended (a training host, or its coordinator's),
        started again `after` seconds later, as the scheduler it runs under would start a
        failed replica group, node or coordinator again (job.<framework>.relaunch); True while
        one is still waiting for its delay. A host whose processes ended by themselves (a
        crash) is not: its end stays the trial's outcome."""
        waiting = False
        for rank in sorted(monitor.exited & killed):
            waited = now - monitor.exited_at.get(rank, now)
            if waited < after:
                waiting = True
                continue
            recorder.emit(kinds.RANK_SPAWNED, rank=rank, pid=self._start(cluster, rank))
            monitor.exited.discard(rank)
            monitor.exited_at.pop(rank, None)
            killed.discard(rank)
            self._say(f"r{rank:03d} started again {waited:.1f} s after its processes ended (the framework's relaunch)")
        return waiting

    def _restart(self, cluster: Cluster, monitor: Monitor, recorder: EventRecorder) -> None:
        """The scheduler started the job again: every rank starts from the top, as its batch
        script would start it (the job's own checkpoint is what it resumes from)."""
        last = max(monitor.exited_at.values(), default=self.clock())
        recorder.emit(kinds.JOB_REQUEUED, restarts=cluster.restarts,
                      waited_s=round(self.clock() - last, 3))
        self._say(f"the scheduler started the job again after {self.clock() - last:.1f} s: its ranks start again")
        for rank in range(self.plan.ranks):
            recorder.emit(kinds.RANK_SPAWNED, rank=rank, pid=self._start(cluster, rank))
        monitor.exited.clear()
        monitor.last_activity = self.clock()
        monitor.mark()

    @staticmethod
    def _live_pids(cluster: Cluster, monitor: Monitor) -> stacks.LiveRanks:
        live = stacks.LiveRanks({})
        for rank in monitor.live:
            if (pid := cluster.pid(rank)) is None:
                continue
            if why := cluster.not_here(rank):
                live.elsewhere[rank] = (pid, why)
            else:
                live.here[rank] = pid
        return live

    def _capture_stacks(self, cluster: Cluster, monitor: Monitor, recorder: EventRecorder, reason: str) -> None:
        """Where every live process is, now that every measured time is recorded."""
        live = self._live_pids(cluster, monitor)
        index, secs = stacks.capture(live.here, self.trial_dir, elsewhere=live.elsewhere)
        ranks = live.here
        asked = stacks.recording_ranks(read_events(self.events_path)[0], ranks)
        answered = stacks.ask_flight_recorders(asked, self.trial_dir)
        self._captured(recorder, reason, None, index, secs, asked=sorted(asked), answered=answered)

    def _captured(self, recorder: EventRecorder, reason: str, fault: int | None, index: list[stacks.Dumped],
                  secs: float, asked: list[int] | None = None, answered: list[int] | None = None) -> None:
        """Record and say a capture: at the cap (fault None; the flight recorders `asked`),
        or at fault `fault`'s first detection."""
        dumped = sum(entry.file is not None for entry in index)
        recorder.emit(kinds.STACKS_CAPTURED, reason=reason, processes=len(index), dumped=dumped, secs=round(secs, 3),
                      **({"flight": asked, "flight_answered": answered or []} if asked is not None else {}),
                      **({"fault": fault} if fault is not None else {}))
        missing = next((entry.error for entry in index if entry.error), None)
        when = f"at fault {fault}'s first detection: " if fault is not None else ""
        self._say(f"{when}stacks of {dumped}/{len(index)} processes in {secs:.1f} s"
                  + (f" ({missing})" if missing else "")
                  + (f"; flight recorders of {len(answered or [])}/{len(asked)} ranks" if asked else ""))

    def _traffic_watch(self, cluster: Cluster, monitor: Monitor) -> TrafficWatch:
        """Samples around each fault on the network, the first as long before its apply as
        the fault stays on (since warm-up for one that never heals)."""
        actions = self.plan.actions
        starts = {}
        for pos, action in enumerate(actions):
            # a user's job: its gradient size is unknown, so its traffic proves nothing either way;
            # a backend that counts no link bytes (slurm) proves nothing here; nor does the link of
            # the runner's store alone, which carries no gradient
            if (action.verb == APPLY and self.faults[action.index].acts_on == "link" and self.plan.job is None
                    and self.backend.traits.link_counters
                    and set(self.plan.faults[action.index].targets) & set(self.training)):
                on = on_phase_s(action, list(actions[pos + 1:]))
                starts[action] = max(0.0, action.at - (action.at if on is None else on))

        def sample() -> Sample:
            monitor.poll()
            return Sample(self.clock(), cluster.link_bytes(),
                          tuple(monitor.fewest(monitor.steps_made, r) for r in range(self.plan.ranks)))
        return TrafficWatch(starts, WorkloadSpec.model_validate(self.plan.workload).gradient_bytes, sample)

    def _with_a_process(self, index: int, cluster: Cluster, monitor: Monitor, recorder: EventRecorder,
                        t_warm: float) -> tuple[int, ...]:
        """The targets of fault `index` it can act on now. A process fault due on a rank whose
        process has exited (a job that ended, an agent that gave up) is a fact about the trial,
        not the harness's error: recorded and said as not applied there, and the trial goes on."""
        planned = self.plan.faults[index]
        if self.faults[index].acts_on != "process":
            return planned.targets
        self._reap(cluster, monitor, recorder)  # when each one that is gone exited
        gone = [rank for rank in planned.targets if cluster.pid(rank) is None]
        if gone:
            exited = [monitor.exited_at.get(rank) for rank in gone]
            when = ", ".join(f"r{rank} at +{t - t_warm:.1f} s" if t is not None else f"r{rank}"
                             for rank, t in zip(gone, exited, strict=True))
            self._not_applied(index, gone, exited, f"the process had exited ({when})", recorder)
        return tuple(rank for rank in planned.targets if rank not in gone)

    def _agent_processes(self, fault: FaultBase, pid: int | None) -> tuple[tuple[int, int], ...]:
        """The processes of the agent under `pid` a fault acts on, where it acts on some
        (`processes: workers`, or `monitors`: the framework's, as the scenario checked)."""
        if pid is None or not fault.on_agent_processes:
            return ()
        if fault.processes == MONITORS:  # type: ignore[attr-defined]
            monitors = FRAMEWORKS[self.plan.job["launcher"]].monitors  # type: ignore[index]
            return tuple(monitors(pid)) if monitors is not None else ()
        return tuple(worker_processes(pid))

    def _apply(self, index: int, targets: tuple[int, ...], cluster: Cluster, injector: Injector,
               recorder: EventRecorder, outstanding: dict[int, Injection], on_phase: float | None,
               traffic: dict[str, Any], anchor: Fired | None = None) -> AppliedFault | None:
        """The fault applied and recorded; None where every target's process ended as it was
        applied (recorded as not applied, like a process gone before: the trial goes on)."""
        planned, fault = self.plan.faults[index], self.faults[index]
        storage = str(self.storage_dir) if fault.acts_on == "storage" else None  # a job may name none
        hosts = [replace(cluster.hosts[rank], pid=(pid := cluster.pid(rank)), storage=storage,
                         gpu=self.placement.gpu_of(rank),
                         agent_processes=self._agent_processes(fault, pid))
                 for rank in targets]
        # The dead-man switch reverts a disruptive fault even if this process dies first: at
        # the end of this on-phase (a pulse, not the whole train), plus a margin.
        dead_man = None if on_phase is None else on_phase + DEAD_MAN_MARGIN_S
        try:
            injection = injector.apply(fault, hosts, revert_after=dead_man, heals_after=on_phase)
        except TargetGone as exc:
            self._not_applied(index, targets, [None] * len(targets), f"the process ended as it was applied ({exc})",
                              recorder)
            return None
        if fault.reversible:
            outstanding[index] = injection
        applied = injection.applied
        missed = [r for r in targets if fault.acts_on == "process" and cluster.hosts[r].name not in applied.hosts]
        if missed:
            self._not_applied(index, missed, [None] * len(missed), "the process ended as it was applied", recorder)
            targets = tuple(r for r in targets if r not in missed)
        reaches = sorted({int(h[1:]) for h in applied.hosts if h[:1] == "r" and h[1:].isdigit()} - set(targets))
        recorder.emit(kinds.FAULT_APPLIED, t=applied.t_applied,
                      t_requested=round(applied.t_requested or applied.t_applied, 6), index=index,
                      fault_kind=planned.kind, fault=planned.fault, targets=list(targets),
                      mechanism=applied.mechanism, **traffic,
                      **({"storage": str(self.storage_dir)} if fault.acts_on == "storage" else {}),
                      **({"reaches": reaches} if reaches else {}),
                      **({"anchor_t": round(anchor.t, 6), "anchor_rank": anchor.rank} if anchor else {}))
        also = f" (it reaches {ranks_text(reaches)} too)" if reaches else ""
        self._say(f"fault {planned.description} on {ranks_text(targets)} applied ({applied.mechanism}){also}")
        return applied

    def _not_applied(self, index: int, gone: Sequence[int], exited: list[float | None], why: str,
                     recorder: EventRecorder) -> None:
        """A process fault not applied on `gone`, whose processes had ended (reaped at `exited`,
        None: not known): a fact about the trial, recorded and said; the trial goes on."""
        planned = self.plan.faults[index]
        recorder.emit(kinds.FAULT_NOT_APPLIED, index=index, fault_kind=planned.kind, targets=list(gone),
                      exited_t=[None if t is None else round(t, 6) for t in exited])
        self._say(f"fault {planned.description} on {ranks_text(gone)}: not applied, {why}")

    def _revert(self, index: int, outstanding: dict[int, Injection], recorder: EventRecorder,
                traffic: TrafficWatch, teardown: bool = False) -> None:
        if index not in outstanding:
            return
        planned = self.plan.faults[index]
        # Counted just before the revert: what it lets through at once (TCP's queued
        # retransmissions) is not the fault's; and a failed count never keeps a fault on.
        began = self.clock()
        try:
            during = traffic.reverting(index)
        finally:
            t = outstanding.pop(index).revert()
        recorder.emit(kinds.FAULT_REVERTED, t=began if teardown else t, index=index, fault_kind=planned.kind,
                      targets=list(planned.targets), teardown=teardown, **during)
        self._say(f"fault {planned.kind} on {ranks_text(planned.targets)} reverted"
                  + (" (teardown)" if teardown else ""))


def _what_exited(ranks: list[int], plan: TrialPlan) -> str:
    """The ranks, or a coordinator, whose process ended: "rank(s) [2]", "the coordinator
    (torchft_lighthouse on r003)", "the coordinator (the rendezvous store ... on r016)"."""
    coordinator = coordinator_host(plan.ranks, plan.job, plan.store_host)
    named = [f"rank(s) {[r for r in ranks if r != coordinator]}"] if set(ranks) - {coordinator} else []
    if coordinator in ranks:
        what = STORE if plan.job is None else FRAMEWORKS[plan.job["launcher"]].coordinator
        named.append(f"the coordinator ({what} on r{coordinator:03d})")
    return " and ".join(named)


def _stop_text(exc: BaseException) -> str:
    """What stopped a trial, for its trial_end."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (SIGINT)"
    return str(exc) or type(exc).__name__


def frozen_for_good(outstanding: dict[int, Injection], plan: Plan) -> set[int]:
    """The ranks a fault holds frozen that is still applied once no action is pending (so
    it never heals while the harness watches)."""
    return _held_for_good(outstanding, plan, lambda fault: fault.freezes)


def cut_off_for_good(outstanding: dict[int, Injection], plan: Plan) -> set[int]:
    """In a user's job, the ranks a fault cuts off from every other host that is still
    applied once no action is pending. The built-in runner's cut-off rank leaves by its
    policy and records it; a user's job's lives on, never stepping (a torchrun agent waits
    in its rendezvous as long as its join timeout, 600 s by default)."""
    return set() if plan.job is None else _held_for_good(outstanding, plan, lambda fault: fault.isolates())


def _held_for_good(outstanding: dict[int, Injection], plan: Plan, holds: Callable[[FaultBase], bool]) -> set[int]:
    """The targets of the outstanding faults that `holds`."""
    return {rank for index, injection in outstanding.items() if holds(injection.applied.fault)
            for rank in plan.faults[index].targets}


def _preload(job: dict | None) -> tuple[str, ...] | None:
    """What the rank launcher imports ahead for the trial's user job (None: nothing)."""
    return tuple(job["preload"]) if job is not None and job["start"] == "preloaded" else None


def on_phase_s(apply: Action, later: list[Action]) -> float | None:
    """How long `apply` keeps its fault on: until that fault's next revert among `later` (one
    on-phase of a pulsed fault); None when it is never reverted while the harness watches."""
    return next((a.at - apply.at for a in later if a.index == apply.index and a.verb == REVERT), None)
