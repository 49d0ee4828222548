"""The orchestrator: runs a scenario, one trial per policy, each on a fresh cluster.

A trial goes through its phases, saving the event history as it goes:

    cluster up -> ranks start under the policy -> warm-up steps on every rank
      -> fault timeline: apply (ledger first) ... revert
      -> observe until every rank exited, or every live rank made `settle_steps` steps
         after the last fault action, or nothing moved for `hang_cap` (hung)
      -> teardown on every path (pass, fail, Ctrl-C): faults reverted last-in first-out,
         ranks stopped (SIGTERM, then SIGKILL at one deadline), hosts removed

The run folder (`RUN_DIR/run.json`, `RUN_DIR/trials/<policy>/{trial.json, events.jsonl,
logs/}`) is what `reports` analyzes, now or later.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import secrets
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from chaos.api import Injection, Injector
from chaos.errors import HarnessError
from chaos.faults import FaultBase
from chaos.heal import heal
from chaos.inject import NetlinkInjector, default_mechanisms, record_owner
from chaos.ledger import Ledger
from harness.cluster.api import Backend, Cluster, ClusterSpec
from harness.cluster.backends import load_undo_plugins
from runfolder.events import EVENTS_FILE, EventRecorder, read_events
from harness.run.progress import Progress
from harness.job.rank import RankConfig
from harness.run.scenario import Scenario

POLL_S = 0.05
STOP_DEADLINE_S = 3.0
DEAD_MAN_MARGIN_S = 5.0


@dataclass
class Monitor:
    """Follows a trial's events: steps per rank, last activity, live ranks."""

    path: Path
    ranks: int
    offset: int = 0
    step_of: dict[int, int] = field(default_factory=dict)
    steps_since: dict[int, int] = field(default_factory=dict)  # steps after `mark()`
    errors: int = 0
    exited: set[int] = field(default_factory=set)
    last_activity: float = field(default_factory=time.monotonic)

    def poll(self) -> None:
        events, self.offset = read_events(self.path, self.offset)
        for ev in events:
            if ev["src"] != "rank":
                continue
            self.last_activity = max(self.last_activity, ev["t"])
            rank = ev["rank"]
            if ev["kind"] == "step":
                self.step_of[rank] = ev["step"]
                self.steps_since[rank] = self.steps_since.get(rank, 0) + 1
            elif ev["kind"] == "collective_error":
                self.errors += 1

    def mark(self) -> None:
        self.steps_since = {}

    def least_since(self) -> int:
        """Steps since `mark()` of the live rank that made the fewest."""
        return min((self.steps_since.get(r, 0) for r in self.live), default=0)

    @property
    def live(self) -> list[int]:
        return [r for r in range(self.ranks) if r not in self.exited]

    def all_made(self, steps: int, source: dict[int, int] | None = None) -> bool:
        counts = self.steps_since if source is None else source
        return bool(self.live) and all(counts.get(r, -1) >= steps for r in self.live)

    def summary(self) -> str:
        steps = [self.step_of.get(r, 0) for r in self.live] or [0]
        return (f"step {min(steps)}..{max(steps)}  live {len(self.live)}/{self.ranks}"
                f"  errors {self.errors}")


@dataclass(frozen=True)
class TrialResult:
    policy: str
    trial_dir: Path
    end: str          # all-exited | settled | hung | deadline
    seconds: float


@dataclass(frozen=True)
class Action:
    at: float         # offset after warm-up
    verb: str         # apply | revert
    index: int


def timeline(scenario: Scenario) -> list[Action]:
    """Every apply and revert in time order; a pulsed fault contributes one pair per on-phase."""
    actions = []
    for i, event in enumerate(scenario.faults):
        for on, off in event.windows():
            actions.append(Action(on, "apply", i))
            if off is not None:
                actions.append(Action(off, "revert", i))
    return sorted(actions, key=lambda a: (a.at, a.verb == "apply"))


class Trial:
    """One scenario under one policy."""

    def __init__(self, scenario: Scenario, policy: str, trial_dir: Path, backend: Backend,
                 progress: Progress,
                 make_injector: Callable[[Ledger, Cluster], Injector] | None = None) -> None:
        self.scenario = scenario
        self.policy = scenario.policy(policy)
        self.trial_dir = trial_dir
        self.backend = backend
        self.progress = progress
        self.make_injector = make_injector or (lambda ledger, cluster: NetlinkInjector(
            ledger, {**default_mechanisms(), **cluster.mechanisms()}, hosts=cluster.hosts))
        self.run_id = secrets.token_hex(3)
        self.events_path = trial_dir / EVENTS_FILE

    def _say(self, text: str) -> None:
        self.progress.phase(self.policy.name, text)

    def _rank_config(self, cluster: Cluster, rank: int) -> dict:
        return RankConfig(
            rank=rank, world_size=self.scenario.cluster.ranks, seed=self.scenario.seed,
            store_address=cluster.store_address, store_port=cluster.store_port,
            events_path=str(self.events_path), checkpoint_dir=str(self.trial_dir / "ckpt"),
            policy=self.policy, workload=self.scenario.workload,
        ).model_dump(mode="json")

    def _write_metadata(self) -> None:
        faults = [{"index": i, "kind": e.fault.kind, "fault": e.fault.model_dump(mode="json"),
                   "targets": list(self.scenario.targets(i)), "start": e.start, "duration": e.duration,
                   "windows": e.windows()}
                  for i, e in enumerate(self.scenario.faults)]
        expect = self.scenario.expect.get(self.policy.name)
        meta = {"policy": self.policy.name, "policy_spec": self.policy.model_dump(mode="json"),
                "run_id": self.run_id, "backend": self.backend.name,
                "ranks": self.scenario.cluster.ranks, "hang_cap": self.scenario.hang_cap,
                "settle_steps": self.scenario.settle_steps, "seed": self.scenario.seed,
                "mono_anchor": time.monotonic(), "wall_anchor": time.time(), "faults": faults,
                "expect": expect.model_dump(mode="json", exclude_none=True) if expect else None}
        (self.trial_dir / "trial.json").write_text(json.dumps(meta, indent=2) + "\n")

    def run(self) -> TrialResult:
        """Run the trial; teardown steps are stacked as side effects happen and run last-in
        first-out on every path, each even if an earlier one failed."""
        self.trial_dir.mkdir(parents=True, exist_ok=True)
        self._write_metadata()
        ledger = Ledger(self.run_id)
        record_owner(ledger)
        recorder = EventRecorder(self.events_path, "harness")
        started = recorder.emit("trial_start", policy=self.policy.name, run_id=self.run_id,
                                ranks=self.scenario.cluster.ranks, backend=self.backend.name,
                                hang_cap=self.scenario.hang_cap)
        end = ["error"]
        with contextlib.ExitStack() as teardown:
            teardown.callback(ledger.close_if_clean)
            teardown.callback(recorder.close)
            teardown.callback(lambda: recorder.emit("trial_end", reason=end[0]))
            teardown.callback(self.progress.done)
            cluster = self.backend.up(
                ClusterSpec(self.run_id, self.scenario.cluster.ranks, self.trial_dir), ledger)
            teardown.callback(cluster.close)
            teardown.callback(self._stop_ranks, cluster, recorder)
            up = recorder.emit("cluster_up", secs=round(time.monotonic() - started, 3))
            self._say(f"cluster up: {len(cluster.hosts)} {self.backend.name} hosts in {up - started:.2f} s")
            for rank in range(self.scenario.cluster.ranks):
                pid = cluster.start_rank(rank, self._rank_config(cluster, rank))
                recorder.emit("rank_spawned", rank=rank, pid=pid)
            monitor = Monitor(self.events_path, self.scenario.cluster.ranks)
            self._warm_up(cluster, monitor, recorder, up)
            faults = teardown.enter_context(contextlib.ExitStack())
            end[0] = self._observe(cluster, monitor, recorder, ledger, faults)
        seconds = time.monotonic() - started
        self._say(f"done: {end[0]} after {seconds:.1f} s")
        return TrialResult(self.policy.name, self.trial_dir, end[0], seconds)

    def _stop_ranks(self, cluster: Cluster, recorder: EventRecorder) -> None:
        for ex in cluster.stop_ranks(STOP_DEADLINE_S):
            recorder.emit("rank_exited", t=ex.t, rank=ex.rank, pid=ex.pid,
                          exitcode=ex.exitcode, signal=ex.signal, stopped=True)

    def _reap(self, cluster: Cluster, monitor: Monitor, recorder: EventRecorder) -> None:
        for ex in cluster.reap():
            monitor.exited.add(ex.rank)
            recorder.emit("rank_exited", t=ex.t, rank=ex.rank, pid=ex.pid,
                          exitcode=ex.exitcode, signal=ex.signal)

    def _warm_up(self, cluster: Cluster, monitor: Monitor, recorder: EventRecorder,
                 up: float) -> None:
        deadline = time.monotonic() + self.backend.start_timeout_s
        want = self.scenario.warmup_steps
        while not monitor.all_made(want):
            time.sleep(POLL_S)
            monitor.poll()
            self._reap(cluster, monitor, recorder)
            if monitor.exited:
                raise HarnessError(f"rank(s) {sorted(monitor.exited)} exited during warm-up; "
                                   f"see {self.trial_dir / 'logs'}")
            if time.monotonic() > deadline:
                raise HarnessError(f"ranks did not make {want} steps within "
                                   f"{self.backend.start_timeout_s:.0f} s "
                                   f"({monitor.summary()}); see {self.trial_dir / 'logs'}")
            self.progress.status(self.policy.name, monitor.least_since() / want,
                                 f"warm-up   {monitor.summary()}")
        t = recorder.emit("warmup_done", step=min(monitor.step_of.values()))
        self._say(f"warm-up: {want} steps on all ranks, {t - up:.1f} s after bring-up")

    def _observe(self, cluster: Cluster, monitor: Monitor, recorder: EventRecorder,
                 ledger: Ledger, faults: contextlib.ExitStack) -> str:
        scenario = self.scenario
        injector = self.make_injector(ledger, cluster)
        t_warm = time.monotonic()
        pending = timeline(scenario)
        outstanding: dict[int, Injection] = {}  # applied and not yet reverted, by fault index
        deadline = t_warm + scenario.last_action_s + 3 * max(scenario.hang_cap, 60.0)
        monitor.last_activity = t_warm
        monitor.mark()
        while True:
            now = time.monotonic()
            while pending and t_warm + pending[0].at <= now:
                action = pending.pop(0)
                if action.verb == "apply":
                    self._apply(action.index, cluster, injector, recorder, outstanding)
                    faults.callback(self._revert, action.index, outstanding, recorder, True)
                else:
                    self._revert(action.index, outstanding, recorder)
                monitor.mark()
            monitor.poll()
            self._reap(cluster, monitor, recorder)
            if not monitor.live:
                return "all-exited"
            if not pending and monitor.all_made(scenario.settle_steps):
                return "settled"
            idle = now - monitor.last_activity
            if idle >= scenario.hang_cap and now - t_warm >= scenario.hang_cap:
                recorder.emit("hang_detected", cap=scenario.hang_cap,
                              idle_since=round(monitor.last_activity, 6))
                self._say(f"hung: no step and no policy action for {scenario.hang_cap:g} s (the cap)")
                return "hung"
            if now > deadline:
                return "deadline"
            if pending:
                done, phase = (now - t_warm) / max(scenario.last_action_s, POLL_S), "faults  "
            else:  # settled by steps, or hung by the cap: whichever comes first
                done = max(monitor.least_since() / scenario.settle_steps, idle / scenario.hang_cap)
                phase = f"settling (idle {idle:.0f}/{scenario.hang_cap:g} s)"
            self.progress.status(self.policy.name, done,
                                 f"{phase}  t+{now - t_warm:5.1f}s  {monitor.summary()}")
            time.sleep(POLL_S)

    def _apply(self, index: int, cluster: Cluster, injector: Injector, recorder: EventRecorder,
               outstanding: dict[int, Injection]) -> None:
        event = self.scenario.faults[index]
        ranks = self.scenario.targets(index)
        hosts = [replace(cluster.hosts[rank], pid=cluster.pid(rank)) for rank in ranks]
        # The dead-man switch reverts a disruptive fault even if this process dies first.
        dead_man = None if event.duration is None else event.duration + DEAD_MAN_MARGIN_S
        injection = injector.apply(event.fault, hosts, revert_after=dead_man)
        if event.fault.reversible:
            outstanding[index] = injection
        recorder.emit("fault_applied", t=injection.applied.t_applied,
                      t_requested=round(injection.applied.t_requested or injection.applied.t_applied, 6),
                      index=index,
                      fault_kind=event.fault.kind, fault=event.fault.model_dump(mode="json"),  # type: ignore[attr-defined]
                      targets=list(ranks), mechanism=injection.applied.mechanism)
        self._say(f"fault {event.fault.describe()} on {_ranks_text(ranks)} applied "
                  f"({injection.applied.mechanism})")

    def _revert(self, index: int, outstanding: dict[int, Injection], recorder: EventRecorder,
                teardown: bool = False) -> None:
        if index not in outstanding:
            return
        event = self.scenario.faults[index]
        t = outstanding.pop(index).revert()
        recorder.emit("fault_reverted", t=t, index=index, fault_kind=event.fault.kind,  # type: ignore[attr-defined]
                      targets=list(self.scenario.targets(index)), teardown=teardown)
        self._say(f"fault {event.fault.kind} on {_ranks_text(self.scenario.targets(index))} reverted"  # type: ignore[attr-defined]
                  + (" (teardown)" if teardown else ""))


def _ranks_text(ranks: tuple[int, ...]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


def new_run_dir(out: Path, scenario: Scenario) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = out / f"{scenario.name}-{stamp}-{secrets.token_hex(2)}"
    (run_dir / "trials").mkdir(parents=True)
    return run_dir


def run_scenario(scenario: Scenario, scenario_file: Path, policies: list[str], out: Path,
                 backend: Backend, progress: Progress,
                 command: str | None = None) -> tuple[Path, list[TrialResult]]:
    """Run every policy of `scenario` in turn; returns the run folder and the trial results.
    `command` is how to run it again (default: this process's `chaos` command line)."""
    load_undo_plugins()
    healed = heal()  # leftovers of crashed runs (their owner is dead); live runs are left alone
    if healed.undone:
        progress.phase("heal", healed.summary())
    run_dir = new_run_dir(out, scenario)
    shutil.copyfile(scenario_file, run_dir / "scenario.yaml")
    (run_dir / "run.json").write_text(json.dumps({
        "scenario": scenario.name, "scenario_file": str(scenario_file), "seed": scenario.seed,
        "backend": backend.name, "policies": policies,
        "started_wall": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": command or shlex.join(["chaos", *sys.argv[1:]]),
        "clock": "monotonic, one kernel shared by every rank"}, indent=2) + "\n")
    results = []
    for policy in policies:
        trial = Trial(scenario, policy, run_dir / "trials" / policy, backend, progress)
        results.append(trial.run())
    return run_dir, results


def plan_text(scenario: Scenario, scenario_file: Path, policies: list[str],
              mechanism: Callable[[FaultBase], str]) -> str:
    """What `run_scenario` would do, in words: which ranks, which mechanism, when (for
    `chaos run --dry-run`; nothing is built or injected)."""
    lines = [f"scenario {scenario.name} ({scenario_file}), seed {scenario.seed}: "
             f"{scenario.cluster.ranks} ranks on {scenario.cluster.backend} hosts",
             f"per policy, on a fresh cluster: {scenario.warmup_steps} warm-up steps on every rank, "
             "then at these offsets after warm-up:"]
    for action in timeline(scenario):
        event = scenario.faults[action.index]
        what = event.fault.describe() if action.verb == "apply" else event.fault.kind  # type: ignore[attr-defined]
        how = f" by {mechanism(event.fault)}" if action.verb == "apply" else ""
        lines.append(f"  +{action.at:7.3f} s  {action.verb:6}  faults.{action.index} {what} "
                     f"on {_ranks_text(scenario.targets(action.index))}{how}")
    if not scenario.faults:
        lines.append("  (no fault: a control run)")
    never = [f"faults.{i}" for i, e in enumerate(scenario.faults) if e.duration is None]
    if never:
        lines.append(f"  {', '.join(never)} never heal{'s' if len(never) == 1 else ''} while the harness watches")
    lines.append(f"then watch until every live rank made {scenario.settle_steps} steps after the last "
                 f"action, every rank exited, or nothing moved for the hang cap ({scenario.hang_cap:g} s)")
    lines.append("policies, in this order:")
    for name in policies:
        spec = scenario.policy(name)
        expect = scenario.expect.get(name)
        wanted = ", ".join(f"{k} {' or '.join(v) if k == 'outcome' else f'{v:g} s'}"
                           for k, v in expect.model_dump(exclude_none=True).items()) if expect else "nothing"
        lines.append(f"  {name:10} timeout {spec.timeout:g} s, {spec.max_retries} retries "
                     f"(backoff {spec.backoff_base:g}..{spec.backoff_cap:g} s), "
                     f"breaker {'on' if spec.breaker else 'off'}"
                     + (", failure detector" if spec.detector is not None else "")
                     + (", elastic" if spec.elastic else "")
                     + (f", rejoin within {spec.rejoin_within:g} s" if spec.rejoin else "")
                     + f"; expects {wanted}")
    return "\n".join(lines)
