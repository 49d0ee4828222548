"""What the events say about one trial, gathered once (TrialFacts): its ranks and faults,
when the harness stopped watching, who departed and how, the first detections, when each
survivor resumed, the final world; and each fault's own figures within its window
(fault_figures). The outcome rules (reports.outcome) and the metrics row (reports.metrics)
read them; the definitions are reports.metrics'."""
from __future__ import annotations

import math
import signal as signals
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from reports.scheduler_ends import Preempted, Requeue, requeue_detections, scheduler_preemption, scheduler_requeue
from reports.trial_events import NAN, FaultWindow, end_reason, event_field, fault_windows, flagged, of_kind
from runfolder.events import (BREAKER_OPEN, CLUSTER_UP, DETECTION_KINDS, EXIT, FAULT_APPLIED, FAULT_REVERTED,
                              GROUP_DESTROYED, GROUP_INIT, GROUP_READY, HANG_DETECTED, HARNESS as HARNESS_SOURCE, MEMBERSHIP,
                              RANK_EXITED, RANK_SPAWNED, RANK_START, RESTORED, STEP, STEPS_NOT_OBSERVED, STOPPING,
                              TRIAL_END, TRIAL_START, WARMUP_DONE)
from runfolder.frameworks import training_hosts
from runfolder.info import TrialInfo

# SIGABRT: NCCL's watchdog tore the process down (TORCH_NCCL_ASYNC_ERROR_HANDLING=1)
ABORTED = "crashed-by-abort"
NORMAL_EXIT_REASONS = ("stopped", "terminated")


@dataclass(frozen=True)
class Departure:
    rank: int
    t: float   # when the process was gone (the later of its exit event and its reaping)
    how: str   # an exit reason, "killed" (by a kill fault), "signal SIGx" or "exit code N"
    error: str = ""
    in_teardown: bool = False  # it ended after its process destroyed its process groups (a user's job)


@dataclass(frozen=True)
class Hang:
    t: float
    cap: float
    idle_since: float


@dataclass(frozen=True)
class LinkTraffic:
    """Bytes through one fault's target links (summed), from its fault_applied / _reverted."""

    index: int
    before: int                # in the window before the apply
    before_s: float
    during: int | None         # from the apply to the revert (None: never reverted)
    bypassed: bool | None      # None: not judged (no step in the window before)


@dataclass(frozen=True)
class TrialFacts:
    """What the events say about one trial, gathered once; outcome rules and metrics read it."""

    ranks: tuple[int, ...]
    faults: tuple[FaultWindow, ...]
    observation_end: float
    hang: Hang | None
    detections: dict[int, float]        # rank -> first detection at or after fault start
    detection_cause: str                # cause of the first detection ("" when none)
    departures: dict[int, Departure]
    resumed: dict[int, float]           # survivor -> first step after its last disruption
    final_world: int | None             # world of the last group formed after fault start, before the end
    breaker_opens: dict[int, float]     # rank -> first breaker_open
    end_reason: str                     # the harness's trial_end reason ("" when missing)
    stopped_at: str                     # where a trial that did not finish ended ("" when it did)
    # rank -> the step times of each process of its host (a user's job with nproc_per_host
    # > 1 has several; a rank that never stepped: one process without steps)
    step_times: dict[int, tuple[tuple[float, ...], ...]] = field(repr=False)
    traffic: tuple[LinkTraffic, ...] = ()  # per application of a fault on the network
    steps_observed: bool = True         # False: a user's job that made no step by its start_timeout
    left_out: tuple[int, ...] = ()      # survivors the final membership left out (elastic)
    stopped_by: str = ""                # what stopped a trial that ended on an error ("" when not recorded)
    requeue: Requeue | None = None      # the scheduler started the job again (the first time)
    preempted: Preempted | None = None  # the scheduler ended the job for good

    @property
    def fault(self) -> FaultWindow | None:
        return self.faults[0] if self.faults else None

    @property
    def survivors(self) -> tuple[int, ...]:
        return tuple(r for r in self.ranks if r not in self.departures)

    @property
    def crashes(self) -> tuple[Departure, ...]:
        return tuple(d for d in self.departures.values() if is_crash(d))

    @property
    def going_on(self) -> tuple[int, ...]:
        """The survivors still in the job: those the final membership did not leave out."""
        return tuple(r for r in self.survivors if r not in self.left_out)

    @property
    def all_survivors_resumed(self) -> bool:
        return bool(self.going_on) and all(r in self.resumed for r in self.going_on)


def is_crash(departure: Departure) -> bool:
    return departure.how in ("crashed", ABORTED) or departure.how.startswith(("signal", "exit code"))


# -- gathering facts ----------------------------------------------------------------------

def _observation_end(events: pd.DataFrame) -> float:
    """The first sign that the harness stopped watching and began to tear the trial down."""
    stops = (events["kind"].isin([HANG_DETECTED, STOPPING, TRIAL_END])
             | ((events["kind"] == FAULT_REVERTED) & flagged(events, "teardown"))
             | ((events["kind"] == RANK_EXITED) & flagged(events, "stopped")))
    if "reason" in events:  # a rank that exits "terminated" was asked to stop by the harness
        stops |= (events["kind"] == EXIT) & (events["reason"] == "terminated")
    marks = events[stops]["t"]
    if len(marks):
        return float(min(marks))
    return float(events["t"].max()) if len(events) else NAN


# the harness's phase after each of its events, for saying where an incomplete trial ended
PHASE_AFTER: dict[str, str] = {
    TRIAL_START: "building the cluster", CLUSTER_UP: "starting the ranks", RANK_SPAWNED: "starting the ranks",
    WARMUP_DONE: "running the fault timeline", STEPS_NOT_OBSERVED: "running the fault timeline",
    FAULT_APPLIED: "running the fault timeline",
    FAULT_REVERTED: "running the fault timeline", HANG_DETECTED: "stopping a hung trial",
    RANK_EXITED: "watching the ranks",
}


def _stopped_at(events: pd.DataFrame) -> str:
    """Where a trial that did not finish ended (no trial_end, or one the harness wrote on an
    error: a rank gone in warm-up, a signal): its last phase and last event before that."""
    if end_reason(events) not in ("", "error"):
        return ""
    events = events[events["kind"] != TRIAL_END]
    if not len(events):
        return "before its first event"
    own = events[events["src"] == HARNESS_SOURCE]
    phase = PHASE_AFTER.get(str(own.iloc[-1]["kind"]), "") if len(own) else ""
    last = events.iloc[-1]
    rank = event_field(last, "rank")
    where = f" on r{rank}" if rank is not None else ""
    said = f"while {phase}, " if phase else ""
    return f"{said}last event {last['kind']}{where} {float(last['t'] - events['t'].min()):.2f} s into the trial"


def _end_error(events: pd.DataFrame) -> str:
    ends = of_kind(events, TRIAL_END)
    return str(event_field(ends.iloc[0], "error", "")) if len(ends) else ""


def _hang(events: pd.DataFrame) -> Hang | None:
    hangs = of_kind(events, HANG_DETECTED)
    if not len(hangs):
        return None
    row = hangs.iloc[0]
    return Hang(t=float(row["t"]), cap=float(row["cap"]), idle_since=float(row["idle_since"]))


def _signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return str(number)


def _killed_by_fault(rank: int, t: float, faults: tuple[FaultWindow, ...]) -> bool:
    # from the request: a kill of several ranks signals them one by one, and the first may be
    # reaped before the injector returns (its t) (found by chaos explore, docs/explore.md)
    return any(f.kind == "kill" and f.processes == "host" and rank in f.targets and t >= min(f.start, f.requested)
               for f in faults)


def departures(events: pd.DataFrame, ranks: tuple[int, ...], faults: tuple[FaultWindow, ...],
               observation_end: float) -> dict[int, Departure]:
    """Ranks whose process ended before the observation end and was not started again."""
    gone: dict[int, Departure] = {}
    lifecycle = of_kind(events, RANK_START, EXIT, RANK_EXITED, GROUP_DESTROYED)
    lifecycle = lifecycle[lifecycle["t"] < observation_end]
    for rank in ranks:
        own = lifecycle[lifecycle["rank"] == rank]
        starts = own[own["kind"] == RANK_START]
        if len(starts):
            own = own[own["t"] >= starts["t"].max()]
        exits, reaped = own[own["kind"] == EXIT], own[own["kind"] == RANK_EXITED]
        if not len(exits) and not len(reaped):
            continue
        t = float(max(exits["t"].max() if len(exits) else -math.inf,
                      reaped["t"].max() if len(reaped) else -math.inf))
        reason = str(event_field(exits.iloc[-1], "reason", "")) if len(exits) else ""
        error = str(event_field(exits.iloc[-1], "error", "")) if len(exits) else ""
        signal = event_field(reaped.iloc[-1], "signal") if len(reaped) else None
        code = event_field(reaped.iloc[-1], "exitcode") if len(reaped) else None
        if reason and reason not in NORMAL_EXIT_REASONS:
            how = reason
        elif signal is not None:
            how = ("killed" if _killed_by_fault(rank, t, faults) else ABORTED if signal == signals.SIGABRT
                   else f"signal {_signal_name(int(signal))}")
        elif code not in (None, 0) and not reason:
            how = f"exit code {int(code)}"
        else:
            continue  # a normal end (max steps reached, or asked to stop)
        gone[rank] = Departure(rank=rank, t=t, how=how, error=error,
                               in_teardown=bool((own["kind"] == GROUP_DESTROYED).any()))
    return gone


def _first_detections(events: pd.DataFrame, start: float, end: float) -> tuple[dict[int, float], str]:
    found = of_kind(events, *DETECTION_KINDS)
    # a detector also notices the harness stopping the ranks: that is after the observation
    found = found[(found["t"] >= start) & (found["t"] < end) & found["rank"].notna()]
    if not len(found):
        return {}, ""
    first = found.groupby("rank")["t"].min()
    earliest = found.loc[found["t"].idxmin()]  # lines of concurrent writers are not in time order
    cause = event_field(earliest, "cause", "") or earliest["kind"]
    return {int(r): float(t) for r, t in first.items()}, str(cause)


def _with_exits(detections: dict[int, float], cause: str, gone: dict[int, Departure],
                fault: FaultWindow) -> tuple[dict[int, float], str]:
    """A user's job may just exit, saying nothing the classifier knows: its rank's departure
    after fault start detects (unless a kill fault ended it: that is the fault, not a
    detection; nor a crash in its teardown, once it had destroyed its process groups).
    Cause "exit" when an exit came first."""
    exits = {r: d.t for r, d in gone.items() if d.how != "killed" and not d.in_teardown and d.t >= fault.start}
    merged = {r: min(t for t in (detections.get(r), exits.get(r)) if t is not None)
              for r in {*detections, *exits}}
    first_exit = min(exits.values(), default=math.inf)
    return merged, "exit" if first_exit < min(detections.values(), default=math.inf) else cause


def _quorum_change(events: pd.DataFrame, detections: dict[int, float]) -> float | None:
    """Where a framework forms a quorum every step (its steps say `participants`): the first
    detection of any process, its coordinator's included, after which a step is one of the
    quorum that went on without the failed member (or with it back); None otherwise."""
    steps = of_kind(events, STEP)
    framework = "participants" in steps and steps["participants"].notna().any()
    return min(detections.values()) if framework and detections else None


def _resumed(events: pd.DataFrame, survivors: tuple[int, ...], fault: FaultWindow,
             detections: dict[int, float], step_times: dict[int, tuple[tuple[float, ...], ...]],
             end: float, quorum_change: float | None = None) -> dict[int, float]:
    """A survivor's time of resuming: when the last of its processes stepped after its last
    disruption (a user's job with nproc_per_host > 1 has several per host); a survivor of a
    framework that saw nothing itself: after the quorum changed (`_quorum_change`), not a
    step that was in flight as the fault came."""
    restores = of_kind(events, RESTORED)
    restores = restores[restores["t"] >= fault.start]
    errors = of_kind(events, *DETECTION_KINDS)
    errors = errors[(errors["t"] >= fault.start) & (errors["t"] < end)]
    resumed = {}
    for rank in survivors:
        if rank in detections:
            marks = list(restores[restores["rank"] == rank]["t"]) + list(errors[errors["rank"] == rank]["t"])
            # a user's job that ended (a scheduler's requeue) with no error said: its exit
            disrupted = max(marks, default=detections[rank])
        else:
            disrupted = fault.start if math.isnan(fault.end) else fault.end
            if quorum_change is not None:
                disrupted = max(disrupted, quorum_change)
        firsts = [[t for t in times if t > disrupted][:1] for times in step_times.get(rank, ())]
        if firsts and all(firsts):
            resumed[rank] = max(first[0] for first in firsts)
    return resumed


def _final_world(events: pd.DataFrame, start: float, end: float = math.inf, per_host: int = 1) -> int | None:
    """The world formed last between `start` and `end` (the observation end: a survivor may
    form one alone while the harness stops the others), in ranks (hosts): a user's job's
    WORLD_SIZE counts each host's `per_host` processes; a framework's quorum (its steps'
    participants: replica groups, one per host) counts hosts."""
    events = events[events["t"] < end]
    quorum = of_kind(events, STEP)
    if "participants" in quorum:
        quorum = quorum[(quorum["t"] >= start) & quorum["participants"].notna()]
        if len(quorum):
            return int(quorum.sort_values("t").iloc[-1]["participants"])
    formed, per_group = of_kind(events, GROUP_READY), 1
    if not len(formed):  # a user's job: a process's start, or its group made again in-process
        formed, per_group = of_kind(events, RANK_START, GROUP_INIT), per_host
    formed = formed[formed["t"] >= start]
    return int(formed.iloc[-1]["world"]) // per_group if len(formed) and "world" in formed else None


def _final_members(events: pd.DataFrame, start: float, end: float) -> tuple[int, ...] | None:
    """The members of the last membership agreed after `start` and before `end` (None: none
    was: the job's group never changed its members)."""
    agreed = of_kind(events, MEMBERSHIP)
    agreed = agreed[(agreed["t"] >= start) & (agreed["t"] < end)]
    if not len(agreed):
        return None
    return tuple(int(r) for r in agreed.sort_values("t").iloc[-1]["members"])


def _final_hosts(events: pd.DataFrame, start: float, per_host: int) -> tuple[int, ...] | None:
    """A user's job (no membership events): the hosts whose processes began, after `start`,
    the last world its processes began in (a run of rank_start events with that WORLD_SIZE).
    None unless every host of that world began one: one still to begin is not left out."""
    began = of_kind(events, RANK_START)
    began = began[began["t"] >= start].sort_values("t")
    if not len(began) or "world" not in began:
        return None
    worlds = [int(w) for w in began["world"]]
    last = next((i for i in range(len(worlds) - 1, -1, -1) if worlds[i] != worlds[-1]), -1)
    hosts = tuple(sorted({int(r) for r in began["rank"].iloc[last + 1:]}))
    return hosts if len(hosts) * per_host == worlds[-1] else None


def _step_times(events: pd.DataFrame) -> dict[int, tuple[tuple[float, ...], ...]]:
    """Each rank's step times per process of its host (local_rank; one process without it)."""
    steps = of_kind(events, STEP)
    local = steps["local_rank"].fillna(0) if "local_rank" in steps else pd.Series(0, index=steps.index)
    return {int(r): tuple(tuple(float(t) for t in w["t"]) for _, w in g.groupby(local[g.index]))
            for r, g in steps.groupby("rank")}


def link_traffic(events: pd.DataFrame) -> tuple[LinkTraffic, ...]:
    """Each application of a fault on the network with its link counts, in time order; each
    revert belongs to the latest apply of its fault before it."""
    if "link_bytes_before" not in events:
        return ()
    reverts = of_kind(events, FAULT_REVERTED)
    found = []
    for _, row in of_kind(events, FAULT_APPLIED).sort_values("t").iterrows():
        carried = event_field(row, "link_bytes_before")
        if carried is None:
            continue  # a fault on a process
        index, targets = int(row["index"]), [int(r) for r in row["targets"]]
        after = reverts[(reverts["index"] == index) & (reverts["t"] >= row["t"])]
        during = event_field(after.iloc[0], "link_bytes_during") if len(after) else None
        steps = max(row["steps_before"], default=0)
        floor = steps * int(row["allreduce_bytes"]) / 2
        found.append(LinkTraffic(
            index=index, before=sum(carried[r] for r in targets), before_s=float(row["before_s"]),
            during=None if during is None else sum(during[r] for r in targets),
            bypassed=all(carried[r] < floor for r in targets) if steps else None))
    return tuple(found)


def trial_facts(events: pd.DataFrame, trial: TrialInfo) -> TrialFacts:
    ranks = training_hosts(trial.plan.ranks, trial.plan.job, trial.plan.store_host)  # a coordinator is no rank
    faults = fault_windows(events)
    end = _observation_end(events)
    steps = _step_times(events)
    gone = departures(events, ranks, faults, end)
    detections, cause, resumed, world, opens, left_out = {}, "", {}, None, {}, ()
    requeue = scheduler_requeue(events)
    if faults:
        fault = faults[0]
        detections, cause = _first_detections(events, min(fault.start, fault.requested), end)
        if requeue is not None and not detections:
            detections, cause = requeue_detections(events, fault, requeue), "the job ended (scheduler)"
        if trial.plan.job is not None:
            detections, cause = _with_exits(detections, cause, gone, fault)
        survivors = tuple(r for r in ranks if r not in gone)
        resumed = _resumed(events, survivors, fault, detections, steps, end, _quorum_change(events, detections))
        world = _final_world(events, fault.start, end, int((trial.plan.job or {}).get("nproc_per_host") or 1))
        members = _final_members(events, fault.start, end)
        if members is None and trial.plan.job is not None:
            members = _final_hosts(events, fault.start, int(trial.plan.job.get("nproc_per_host") or 1))
        left_out = () if members is None else tuple(r for r in survivors if r not in members)
        breakers = of_kind(events, BREAKER_OPEN)
        breakers = breakers[(breakers["t"] >= fault.start) & (breakers["t"] < end)]  # not one in teardown
        opens = {int(r): float(t) for r, t in breakers.groupby("rank")["t"].min().items()}
    return TrialFacts(ranks=ranks, faults=faults, observation_end=end, hang=_hang(events),
                      detections=detections, detection_cause=cause, departures=gone,
                      resumed=resumed, final_world=world, breaker_opens=opens,
                      end_reason=end_reason(events), stopped_at=_stopped_at(events),
                      stopped_by=_end_error(events), step_times=steps,
                      traffic=link_traffic(events), steps_observed=not len(of_kind(events, STEPS_NOT_OBSERVED)),
                      left_out=left_out, requeue=requeue, preempted=scheduler_preemption(events, faults, end))


# -- each fault within its own window -------------------------------------------------------

@dataclass(frozen=True)
class FaultFigures:
    """One fault's own figures, in seconds after its start (NaN: not observed in its window)."""

    index: int
    kind: str
    targets: tuple[int, ...]
    start_s: float          # its start after the first fault's start
    ttd_s: float
    detect_ranks: int
    ttr_s: float
    breaker_open_s: float

    def columns(self) -> dict[str, Any]:
        """Its f<index>_* columns of the metrics row."""
        prefix = f"f{self.index}_"
        return {prefix + name: value for name, value in (
            ("fault", self.kind), ("targets", " ".join(map(str, self.targets))), ("start_s", self.start_s),
            ("ttd_s", self.ttd_s), ("detect_ranks", self.detect_ranks), ("ttr_s", self.ttr_s),
            ("breaker_open_s", self.breaker_open_s))}


def fault_figures(events: pd.DataFrame, facts: TrialFacts) -> tuple[FaultFigures, ...]:
    """TTD, TTR and breaker open of every fault, each within its own window (see above)."""
    figures = []
    first = min((f.start for f in facts.faults), default=NAN)
    for fault in facts.faults:
        later = [f.start for f in facts.faults if f.start > fault.start]
        until = min([facts.observation_end, *later])
        detections, _ = _first_detections(events, min(fault.start, fault.requested), until)
        resumed = _resumed(events, facts.survivors, fault, detections, facts.step_times, until)
        back = [resumed.get(r, math.inf) for r in facts.survivors]
        breakers = of_kind(events, BREAKER_OPEN)
        breakers = breakers[(breakers["t"] >= fault.start) & (breakers["t"] < until)]
        recovered = bool(detections) and bool(back) and max(back) < until
        figures.append(FaultFigures(
            # after the first fault applied: by index, an anchored one may come later than the next
            index=fault.index, kind=fault.kind, targets=fault.targets, start_s=fault.start - first,
            ttd_s=min(max(t, fault.start) for t in detections.values()) - fault.start if detections else NAN,
            detect_ranks=len(detections), ttr_s=max(back) - fault.start if recovered else NAN,
            breaker_open_s=float(breakers["t"].min()) - fault.start if len(breakers) else NAN))
    return tuple(figures)
