"""Metrics and the outcome of one trial: pure functions over its events and trial.json.

All times are seconds on the run's one clock (monotonic, shared by every process of the
trial); reported times are relative to the first fault's start unless a name says otherwise.
Definitions (the one definition of each; every report repeats them):

  fault start / end   t of fault_applied / fault_reverted of the first fault applied;
                      end is NaN for a fault that did not heal while the harness watched
                      (kill, or reverted only at teardown). A gpu_hang (a kernel spinning
                      on the rank's GPU) is silent like pause and judged by the same rules;
                      its start is when its command was written (the rank queues the
                      kernel within harness.job.gpufault.POLL_S of it).
  not applied         a process fault (kill, pause, gpu_hang) that came due on ranks whose
                      process had already exited: named, with when each exited (after the
                      warm-up), and not a fault of the trial (no fault_applied); its other
                      targets got it. Also a fault anchored on an event that never came
                      (harness.run.anchor): named with its event and how long it was waited for.
  observation end     when the harness stopped watching: the first of hang_detected,
                      a fault reverted at teardown, a rank reaped by the harness's stop
                      (rank_exited stopped), a rank exiting "terminated" (asked to stop),
                      trial_end; the last event when there is none of these.
  departed rank       a rank whose process ended before the observation end and was not
                      started again: exit reason failed-fast / retries-exhausted /
                      isolated / crashed, killed by a kill fault aimed at it, or ended by
                      another signal or a non-zero exit code. The others are survivors; a
                      survivor the last membership after fault start left out (an elastic
                      job going on without a rank frozen for good; a user's job, which
                      records no membership: a host none of whose processes began the
                      last world they began in after fault start, once every host of
                      that world has) is not waited for: "every survivor" below means
                      every one still in the job.
  crash               a departure by exit reason crashed, by SIGABRT (crashed-by-abort:
                      NCCL's watchdog tore it down), by a signal that no kill fault
                      explains, or by a non-zero exit code with no policy exit reason.
                      In teardown: a crash of a user's job's process after it destroyed
                      its process groups (group_destroyed; gloo can abort a process at
                      exit when DDP outlives its group).
  TTD                 first detection (collective_error, or a failure detector's suspect)
                      on any rank at or after fault start (and before the observation
                      end), minus fault start; also the
                      first rank, and min / median / max of the per-rank first detections.
  resumed             a survivor's first step (of every process of its host: a user's job
                      with nproc_per_host > 1) after its last disruption: its last
                      detection or restore after fault start; for a survivor that saw no
                      error, after fault end (fault start for a fault that does not heal).
  TTR                 when every survivor has resumed, minus fault start (and minus fault
                      end for faults that heal); only for recovered / continued trials:
                      the policy acted. An absorbed fault has no TTR: see max stall.
  breaker open        first breaker_open minus fault start. released: when the last rank
                      that left through the policy (failed-fast, retries-exhausted,
                      isolated) had released its resources and its process was gone.
  wasted rank-seconds for every rank, from fault start (or its start) to the observation
                      end (or its departure): the sum of the gaps between consecutive
                      steps (the last step before the window counts as the first mark, the
                      end of the rank's window as the last) that are longer than 3x the
                      median pre-fault step interval, clipped to the window.
  restarts            rank processes that began (rank_start) at or after fault start: a
                      torchrun agent's or a retry wrapper's new worker; NaN (not observed)
                      for a user's job whose processes never ran the step hook.
  final world         the world of the last group formed after fault start (group_ready);
                      a user's job has none: the WORLD_SIZE of the last process begun after
                      it over its processes per host (rank_start: torchrun's restart into
                      fewer hosts, --nnodes MIN:MAX).
  user's job          (trial plan `job`) also detects by a rank's departure after fault
                      start that no kill fault explains and that is not a crash in
                      teardown (cause "exit"), and by classified
                      error lines of its output (job_output).
  steps not observed  a user's job that made no step by its start_timeout while every rank
                      lived (steps_not_observed): TTD from exits and classified lines as
                      above; TTR, max stall, wasted rank-seconds and steps/s are NaN (not
                      observed); the outcome is crashed, exited-clean (every process ended,
                      none by an error) or running-at-cap (still running hang_cap after the
                      last fault action: hung and training cannot be told apart).
  excluded            first exclude (the survivors of an elastic policy leave a rank out of
                      their next proposal) minus fault start.
  suspect events      failure-detector suspicions before the observation end (at the end
                      every rank rightly suspects the first rank the harness stopped); in
                      a fault-free trial each one is a false trip.
  rejoined            last rejoin_admitted (a rank left out let back in: policy option
                      rejoin) minus fault start; rejoined ranks: how many were let back in.
  max stall           the longest such gap of any rank, clipped to the window.
  steps/s             median over ranks of the steps completed per second: before fault
                      start (from the rank's first step, not counted), during the fault
                      (until fault end or the observation end, while the rank lived: a
                      stall counts as 0), and after every survivor resumed (recovered,
                      continued, absorbed) until the observation end.
  GPU memory freed    after a kill fault on a rank on a GPU: the slowest killed rank's time
                      from the kill until NVML no longer lists GPU memory for its pid
                      (gpu_memory_freed); NaN: not observed (no NVML, ranks on the CPU).

  state               the state checker's verdict on the trial's fingerprints (reports.state:
                      consistent | diverged | not observed) and its line; steps repeated:
                      steps run again after a resume, over all ranks.

Per fault (every fault of the timeline, `fault_figures`; columns f<i>_*): the same TTD,
TTR and breaker open, measured from that fault's start within its own window, which ends
at the next fault's start (or the observation end): detections, resumed steps and breaker
openings inside it. TTR needs a detection in the window and every survivor resumed in it.
The unprefixed columns (ttd_s, ...) stay those of the first fault over the whole trial.

bypassed            a fault on the network whose targets' links did not carry the job's
                    collectives in the window before it (runfolder.events TRAFFIC_BEFORE):
                    the job made k >= 1 steps in that window, and each step all-reduces
                    allreduce_bytes, of which every member must receive at least one copy
                    (each of its sums needs the others' values), yet every target's link
                    carried fewer than k x allreduce_bytes / 2 bytes both ways (a rank that
                    left the job, or a transport past the link: shared memory, NVLink).
                    No step in the window: not judged. The fault tested nothing, so the
                    trial is not judged by what the job did either.

preempted           a preempt fault without requeue (the slurm backend) and every rank ended:
                    the scheduler ended the job. Its line names how the ranks ended and
                    what a resume would find: the newest checkpoint saved (checkpoint,
                    checkpoint_save), whether it was written after the preemption began
                    (saved on the signal), and the steps made since it (steps lost: what a
                    resume does again; all of them where nothing was saved).
  steps lost        preempted: newest step made - newest checkpoint's step; a requeue:
                    newest step before it - the step every rank restored after it.

incomplete          the events have no trial_end: the harness was killed (or is still
                    running); or its trial_end says "error": the harness stopped the trial
                    (a rank gone during warm-up, a signal). The outcome says where it ended
                    (the last harness phase and the last event) and judges nothing else.

Outcome: the first rule of OUTCOME_RULES that applies, in this order: incomplete, no-fault,
bypassed, hung, preempted, crashed, exited-clean, running-at-cap, continued, recovered, isolated,
retries-exhausted, failed-fast, absorbed;
inconclusive when none does. A new policy's outcome is one more rule in that tuple, and its
name in runfolder.plan.OUTCOMES (the names a scenario may expect).
"""
from __future__ import annotations

import itertools
import math
import signal as signals
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

import pandas as pd

from runfolder.frameworks import training_hosts
from runfolder.events import (DETECTION_KINDS, HEAL, BREAKER_OPEN, CHECKPOINT, CHECKPOINT_SAVE, CLUSTER_UP, EXCLUDE, EXIT, FAULT_APPLIED,
                              FAULT_NOT_APPLIED, FAULT_REVERTED, GPU_MEMORY_FREED, JOB_REQUEUED, GPU_MEMORY_RELEASED, GROUP_DESTROYED, GROUP_READY, HANG_DETECTED, HARNESS as HARNESS_SOURCE, RANK_EXITED,
                              HOST_DROPS, MACHINE_STEAL, MEMBERSHIP, RANK_SPAWNED, RANK_START, REJOIN_ADMITTED, RESOURCES_RELEASED, RESTORED, RETRY,
                              STEP, STEPS_NOT_OBSERVED, STOPPING, SUSPECT, TRIAL_END, TRIAL_START, WARMUP_DONE)
from reports.checkpoints import loaded_steps
from reports.state import check_state
from reports.storage import storage_text
from reports.straggler import straggler_text
from runfolder.info import TrialInfo
from runfolder.plan import PlannedFault, TrialPlan

NAN = float("nan")
POLICY_EXIT_REASONS = ("failed-fast", "retries-exhausted", "isolated")
GPU_RELEASE_BAR_S = 50.0
# SIGABRT: NCCL's watchdog tore the process down (TORCH_NCCL_ASYNC_ERROR_HANDLING=1)
ABORTED = "crashed-by-abort"
NORMAL_EXIT_REASONS = ("stopped", "terminated")
WASTE_GAP_FACTOR = 3.0
# Used only when no two steps were ever seen, so no interval can be measured.
FALLBACK_STEP_INTERVAL_S = 1.0


@dataclass(frozen=True)
class FaultWindow:
    index: int
    kind: str
    targets: tuple[int, ...]
    start: float
    end: float  # NaN when the fault was never reverted
    requested: float = NAN  # just before the harness acted; a signal can act before `start`
    reaches: tuple[int, ...] = ()  # the other ranks it reached (a Slurm node's link: every rank there)


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
class Requeue:
    """The scheduler started the job again after every rank had ended (a Slurm requeue)."""

    t: float
    restarts: int
    waited_s: float
    last_step: int | None      # the newest step any rank made before it
    restored: int | None       # the step every rank restored after it (None: not one step)

    @property
    def steps_lost(self) -> int | None:
        return None if self.last_step is None or self.restored is None else self.last_step - self.restored


@dataclass(frozen=True)
class Preempted:
    """The scheduler ended the job for good (a preemption, no requeue): what a resume finds."""

    t: float                  # the preemption's start
    last_step: int | None     # the newest step any rank made
    saved_step: int | None    # the newest checkpoint's step (None: nothing saved)
    saved_t: float = NAN      # when it was saved

    @property
    def on_signal(self) -> bool:
        return self.saved_t >= self.t

    @property
    def steps_lost(self) -> int | None:
        return None if self.last_step is None else self.last_step - (self.saved_step or 0)


def _newest_checkpoint(events: pd.DataFrame, before: float) -> tuple[int | None, float]:
    """The built-in runner's atomic checkpoints and a user's job's saves (the hook)."""
    saves = _of_kind(events, CHECKPOINT, CHECKPOINT_SAVE)
    saves = saves[(saves["t"] <= before) & saves["step"].notna()] if len(saves) else saves
    if not len(saves):
        return None, NAN
    newest = saves.loc[saves["step"].astype(int).idxmax()]
    return int(newest["step"]), float(newest["t"])


def _preempted(events: pd.DataFrame, faults: tuple[FaultWindow, ...], end: float) -> Preempted | None:
    applied = _of_kind(events, FAULT_APPLIED)
    ends = applied[applied["fault"].map(lambda f: isinstance(f, dict) and f.get("kind") == "preempt"
                                        and not f.get("requeue"))] if "fault" in applied else applied[:0]
    if not len(ends) or _end_reason(events) != "all-exited":
        return None
    t = float(ends["t"].min())
    steps = _of_kind(events, STEP)
    saved, saved_t = _newest_checkpoint(events, end)
    return Preempted(t=t, last_step=int(steps["step"].max()) if len(steps) else None, saved_step=saved,
                     saved_t=saved_t)


def _requeue(events: pd.DataFrame) -> Requeue | None:
    found = _of_kind(events, JOB_REQUEUED)
    if not len(found):
        return None
    first = found.sort_values("t").iloc[0]
    t = float(first["t"])
    steps = _of_kind(events, STEP)
    before = steps[steps["t"] < t]
    restores = _of_kind(events, RESTORED)
    # the built-in runner says what it restored; a user's job, the file it loaded (the hook)
    after = set(restores[restores["t"] > t]["step"]) or loaded_steps(events, t)
    return Requeue(t=t, restarts=int(first["restarts"]), waited_s=float(first["waited_s"]),
                   last_step=int(before["step"].max()) if len(before) else None,
                   restored=int(after.pop()) if len(after) == 1 else None)


def _requeue_detections(events: pd.DataFrame, fault: FaultWindow, requeue: Requeue) -> dict[int, float]:
    """Each rank's end between the fault and the requeue: the scheduler ending the job is
    what every rank knew of the fault."""
    ends = _of_kind(events, EXIT, RANK_EXITED)
    ends = ends[(ends["t"] >= fault.start) & (ends["t"] < requeue.t) & ends["rank"].notna()]
    return {int(r): float(t) for r, t in ends.groupby("rank")["t"].min().items()}


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
    final_world: int | None             # world of the last group formed after fault start
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

def _of_kind(events: pd.DataFrame, *kinds: str) -> pd.DataFrame:
    return events[events["kind"].isin(kinds)]


def _field(row: pd.Series, name: str, default: Any = None) -> Any:
    value = row.get(name, default)
    if isinstance(value, float) and math.isnan(value):
        return default
    return default if value is None or value is pd.NA else value


def fault_windows(events: pd.DataFrame) -> tuple[FaultWindow, ...]:
    """Applied faults in the order they were applied (a fault anchored on an event may come
    after one listed below it: the first applied is the trial's fault, whose detection and
    recovery the report measures), each with the time it was reverted (NaN if never)."""
    # A revert at teardown ends the harness's cleanup, not the fault: it never healed in view.
    healed = _of_kind(events, FAULT_REVERTED)
    healed = healed[~_flagged(healed, "teardown")]
    reverted = {int(r["index"]): r["t"] for _, r in healed.iterrows()}
    windows = []
    for _, row in _of_kind(events, FAULT_APPLIED).iterrows():
        # the event's `kind` is the event kind: the fault's kind is `fault_kind`
        windows.append(FaultWindow(index=int(row["index"]), kind=str(row["fault_kind"]),
                                   targets=tuple(int(r) for r in row["targets"]), start=float(row["t"]),
                                   end=float(reverted.get(int(row["index"]), NAN)),
                                   requested=float(row["t_requested"]),
                                   reaches=tuple(int(r) for r in _field(row, "reaches", None) or ())))
    return tuple(sorted(windows, key=lambda w: (w.start, w.index)))


def _flagged(events: pd.DataFrame, column: str) -> pd.Series:
    """Rows whose optional boolean field `column` is true."""
    if column not in events:
        return pd.Series(False, index=events.index)
    return events[column].map(lambda v: v is True)


def _observation_end(events: pd.DataFrame) -> float:
    """The first sign that the harness stopped watching and began to tear the trial down."""
    stops = (events["kind"].isin([HANG_DETECTED, STOPPING, TRIAL_END])
             | ((events["kind"] == FAULT_REVERTED) & _flagged(events, "teardown"))
             | ((events["kind"] == RANK_EXITED) & _flagged(events, "stopped")))
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
    if _end_reason(events) not in ("", "error"):
        return ""
    events = events[events["kind"] != TRIAL_END]
    if not len(events):
        return "before its first event"
    own = events[events["src"] == HARNESS_SOURCE]
    phase = PHASE_AFTER.get(str(own.iloc[-1]["kind"]), "") if len(own) else ""
    last = events.iloc[-1]
    rank = _field(last, "rank")
    where = f" on r{rank}" if rank is not None else ""
    said = f"while {phase}, " if phase else ""
    return f"{said}last event {last['kind']}{where} {float(last['t'] - events['t'].min()):.2f} s into the trial"


def _end_reason(events: pd.DataFrame) -> str:
    ends = _of_kind(events, TRIAL_END)
    return str(_field(ends.iloc[0], "reason", "")) if len(ends) else ""


def _end_error(events: pd.DataFrame) -> str:
    ends = _of_kind(events, TRIAL_END)
    return str(_field(ends.iloc[0], "error", "")) if len(ends) else ""


def not_applied_text(events: pd.DataFrame) -> str:
    """Each process fault that came due on ranks with no process left (fault_not_applied),
    with when each had exited after the warm-up: "kill on r5: not applied, the rank had
    exited at +50.7 s"; "" when every fault was applied."""
    warm = _of_kind(events, WARMUP_DONE, STEPS_NOT_OBSERVED)
    t0 = float(warm["t"].iloc[0]) if len(warm) else float(events["t"].min())
    texts = []
    for _, row in _of_kind(events, FAULT_NOT_APPLIED).iterrows():
        ranks, exited = list(row["targets"]), list(row["exited_t"])
        waited_for = _field(row, "waited_for")
        if waited_for is not None:  # an anchored fault (harness.run.anchor)
            texts.append(f"{row['fault_kind']} on {', '.join(f'r{r}' for r in ranks)}: not applied, its event "
                         f"{waited_for} never came (waited to +{float(row['t']) - t0:.1f} s)")
            continue
        whens = ["" if t is None else f" at +{t - t0:.1f} s" for t in exited]
        gone = (f"the rank had exited{whens[0]}" if len(ranks) == 1 else
                "the ranks had exited (" + ", ".join(f"r{r}{w}" for r, w in zip(ranks, whens, strict=True)) + ")")
        texts.append(f"{row['fault_kind']} on {', '.join(f'r{r}' for r in ranks)}: not applied, {gone}")
    return "; ".join(texts)


def _hang(events: pd.DataFrame) -> Hang | None:
    hangs = _of_kind(events, HANG_DETECTED)
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
    return any(f.kind == "kill" and rank in f.targets and t >= min(f.start, f.requested) for f in faults)


def departures(events: pd.DataFrame, ranks: tuple[int, ...], faults: tuple[FaultWindow, ...],
               observation_end: float) -> dict[int, Departure]:
    """Ranks whose process ended before the observation end and was not started again."""
    gone: dict[int, Departure] = {}
    lifecycle = _of_kind(events, RANK_START, EXIT, RANK_EXITED, GROUP_DESTROYED)
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
        reason = str(_field(exits.iloc[-1], "reason", "")) if len(exits) else ""
        error = str(_field(exits.iloc[-1], "error", "")) if len(exits) else ""
        signal = _field(reaped.iloc[-1], "signal") if len(reaped) else None
        code = _field(reaped.iloc[-1], "exitcode") if len(reaped) else None
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
    found = _of_kind(events, *DETECTION_KINDS)
    # a detector also notices the harness stopping the ranks: that is after the observation
    found = found[(found["t"] >= start) & (found["t"] < end) & found["rank"].notna()]
    if not len(found):
        return {}, ""
    first = found.groupby("rank")["t"].min()
    earliest = found.loc[found["t"].idxmin()]  # lines of concurrent writers are not in time order
    cause = _field(earliest, "cause", "") or earliest["kind"]
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


def _count_restarts(events: pd.DataFrame, start: float) -> float:
    """Processes that began (rank_start) at or after `start`: restarts of a rank's process;
    NaN (not observed) when no process ever announced its start (a job without the hook)."""
    starts = _of_kind(events, RANK_START)
    return float((starts["t"] >= start).sum()) if len(starts) else NAN


def _quorum_change(events: pd.DataFrame, detections: dict[int, float]) -> float | None:
    """Where a framework forms a quorum every step (its steps say `participants`): the first
    detection of any process, its coordinator's included, after which a step is one of the
    quorum that went on without the failed member (or with it back); None otherwise."""
    steps = _of_kind(events, STEP)
    framework = "participants" in steps and steps["participants"].notna().any()
    return min(detections.values()) if framework and detections else None


def _resumed(events: pd.DataFrame, survivors: tuple[int, ...], fault: FaultWindow,
             detections: dict[int, float], step_times: dict[int, tuple[tuple[float, ...], ...]],
             end: float, quorum_change: float | None = None) -> dict[int, float]:
    """A survivor's time of resuming: when the last of its processes stepped after its last
    disruption (a user's job with nproc_per_host > 1 has several per host); a survivor of a
    framework that saw nothing itself: after the quorum changed (`_quorum_change`), not a
    step that was in flight as the fault came."""
    restores = _of_kind(events, RESTORED)
    restores = restores[restores["t"] >= fault.start]
    errors = _of_kind(events, *DETECTION_KINDS)
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


def _final_world(events: pd.DataFrame, start: float, per_host: int = 1) -> int | None:
    """In ranks (hosts): a user's job's WORLD_SIZE counts each host's `per_host` processes; a
    framework's quorum (its steps' participants: replica groups, one per host) counts hosts."""
    quorum = _of_kind(events, STEP)
    if "participants" in quorum:
        quorum = quorum[(quorum["t"] >= start) & quorum["participants"].notna()]
        if len(quorum):
            return int(quorum.sort_values("t").iloc[-1]["participants"])
    formed, per_group = _of_kind(events, GROUP_READY), 1
    if not len(formed):  # a user's job
        formed, per_group = _of_kind(events, RANK_START), per_host
    formed = formed[formed["t"] >= start]
    return int(formed.iloc[-1]["world"]) // per_group if len(formed) and "world" in formed else None


def _final_members(events: pd.DataFrame, start: float, end: float) -> tuple[int, ...] | None:
    """The members of the last membership agreed after `start` and before `end` (None: none
    was: the job's group never changed its members)."""
    agreed = _of_kind(events, MEMBERSHIP)
    agreed = agreed[(agreed["t"] >= start) & (agreed["t"] < end)]
    if not len(agreed):
        return None
    return tuple(int(r) for r in agreed.sort_values("t").iloc[-1]["members"])


def _final_hosts(events: pd.DataFrame, start: float, per_host: int) -> tuple[int, ...] | None:
    """A user's job (no membership events): the hosts whose processes began, after `start`,
    the last world its processes began in (a run of rank_start events with that WORLD_SIZE).
    None unless every host of that world began one: one still to begin is not left out."""
    began = _of_kind(events, RANK_START)
    began = began[began["t"] >= start].sort_values("t")
    if not len(began) or "world" not in began:
        return None
    worlds = [int(w) for w in began["world"]]
    last = next((i for i in range(len(worlds) - 1, -1, -1) if worlds[i] != worlds[-1]), -1)
    hosts = tuple(sorted({int(r) for r in began["rank"].iloc[last + 1:]}))
    return hosts if len(hosts) * per_host == worlds[-1] else None


def _step_times(events: pd.DataFrame) -> dict[int, tuple[tuple[float, ...], ...]]:
    """Each rank's step times per process of its host (local_rank; one process without it)."""
    steps = _of_kind(events, STEP)
    local = steps["local_rank"].fillna(0) if "local_rank" in steps else pd.Series(0, index=steps.index)
    return {int(r): tuple(tuple(float(t) for t in w["t"]) for _, w in g.groupby(local[g.index]))
            for r, g in steps.groupby("rank")}


def link_traffic(events: pd.DataFrame) -> tuple[LinkTraffic, ...]:
    """Each application of a fault on the network with its link counts, in time order; each
    revert belongs to the latest apply of its fault before it."""
    if "link_bytes_before" not in events:
        return ()
    reverts = _of_kind(events, FAULT_REVERTED)
    found = []
    for _, row in _of_kind(events, FAULT_APPLIED).sort_values("t").iterrows():
        carried = _field(row, "link_bytes_before")
        if carried is None:
            continue  # a fault on a process
        index, targets = int(row["index"]), [int(r) for r in row["targets"]]
        after = reverts[(reverts["index"] == index) & (reverts["t"] >= row["t"])]
        during = _field(after.iloc[0], "link_bytes_during") if len(after) else None
        steps = max(row["steps_before"], default=0)
        floor = steps * int(row["allreduce_bytes"]) / 2
        found.append(LinkTraffic(
            index=index, before=sum(carried[r] for r in targets), before_s=float(row["before_s"]),
            during=None if during is None else sum(during[r] for r in targets),
            bypassed=all(carried[r] < floor for r in targets) if steps else None))
    return tuple(found)


def trial_facts(events: pd.DataFrame, trial: TrialInfo) -> TrialFacts:
    ranks = training_hosts(trial.plan.ranks, trial.plan.job)  # a framework's coordinator is no rank
    faults = fault_windows(events)
    end = _observation_end(events)
    steps = _step_times(events)
    gone = departures(events, ranks, faults, end)
    detections, cause, resumed, world, opens, left_out = {}, "", {}, None, {}, ()
    requeue = _requeue(events)
    if faults:
        fault = faults[0]
        detections, cause = _first_detections(events, min(fault.start, fault.requested), end)
        if requeue is not None and not detections:
            detections, cause = _requeue_detections(events, fault, requeue), "the job ended (scheduler)"
        if trial.plan.job is not None:
            detections, cause = _with_exits(detections, cause, gone, fault)
        survivors = tuple(r for r in ranks if r not in gone)
        resumed = _resumed(events, survivors, fault, detections, steps, end, _quorum_change(events, detections))
        world = _final_world(events, fault.start, int((trial.plan.job or {}).get("nproc_per_host") or 1))
        members = _final_members(events, fault.start, end)
        if members is None and trial.plan.job is not None:
            members = _final_hosts(events, fault.start, int(trial.plan.job.get("nproc_per_host") or 1))
        left_out = () if members is None else tuple(r for r in survivors if r not in members)
        breakers = _of_kind(events, BREAKER_OPEN)
        breakers = breakers[breakers["t"] >= fault.start]
        opens = {int(r): float(t) for r, t in breakers.groupby("rank")["t"].min().items()}
    return TrialFacts(ranks=ranks, faults=faults, observation_end=end, hang=_hang(events),
                      detections=detections, detection_cause=cause, departures=gone,
                      resumed=resumed, final_world=world, breaker_opens=opens,
                      end_reason=_end_reason(events), stopped_at=_stopped_at(events),
                      stopped_by=_end_error(events), step_times=steps,
                      traffic=link_traffic(events), steps_observed=not len(_of_kind(events, STEPS_NOT_OBSERVED)),
                      left_out=left_out, requeue=requeue, preempted=_preempted(events, faults, end))


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
        breakers = _of_kind(events, BREAKER_OPEN)
        breakers = breakers[(breakers["t"] >= fault.start) & (breakers["t"] < until)]
        recovered = bool(detections) and bool(back) and max(back) < until
        figures.append(FaultFigures(
            # after the first fault applied: by index, an anchored one may come later than the next
            index=fault.index, kind=fault.kind, targets=fault.targets, start_s=fault.start - first,
            ttd_s=min(max(t, fault.start) for t in detections.values()) - fault.start if detections else NAN,
            detect_ranks=len(detections), ttr_s=max(back) - fault.start if recovered else NAN,
            breaker_open_s=float(breakers["t"].min()) - fault.start if len(breakers) else NAN))
    return tuple(figures)


# -- outcome ------------------------------------------------------------------------------

def ranks_text(ranks: list[int]) -> str:
    """`r0-r4, r6, r7, r9-r63`: three or more consecutive ranks as a range, so that a
    64-rank row stays readable."""
    runs: list[list[int]] = []
    for r in sorted(set(ranks)):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ", ".join(f"r{run[0]}-r{run[-1]}" if len(run) > 2 else ", ".join(f"r{r}" for r in run)
                     for run in runs)


def _incomplete(f: TrialFacts) -> str | None:
    if not f.stopped_at:
        return None
    if f.end_reason == "error":
        if f.stopped_by:
            return f"the harness stopped the trial: {f.stopped_by} ({f.stopped_at})"
        return f"the harness stopped the trial on an error ({f.stopped_at}); its command said why"
    return f"no trial_end: the trial did not finish ({f.stopped_at})"


def _no_fault(f: TrialFacts) -> str | None:
    if f.faults or f.hang is not None or f.departures:
        return None  # a control run that hung or lost ranks raised a false alarm: the rules below
    ended = f" (the trial ended: {f.end_reason})" if f.end_reason else ""
    return f"no fault was applied: no fault_applied event{ended}"


def _bypassed(f: TrialFacts) -> str | None:
    missed = [t for t in f.traffic if t.bypassed]
    if not missed:
        return None
    first = missed[0]
    return (f"fault {first.index} did not reach the job: its links carried {first.before} bytes in the "
            f"{first.before_s:.1f} s before it, less than half of one gradient copy per step")


def _hung(f: TrialFacts) -> str | None:
    if f.hang is None:
        return None
    return f"no step and no policy action for {f.hang.cap:g} s (the harness cap); stopped watching"


def _preempted_outcome(f: TrialFacts) -> str | None:
    p = f.preempted
    if p is None:
        return None
    ends = sorted({d.how for d in f.departures.values()})
    how = f"ranks ended by {', '.join(ends)}" if ends else "every rank exited cleanly"
    if p.saved_step is None:
        return f"the scheduler ended the job ({how}); nothing was saved: a resume starts from scratch"
    when = "on the signal" if p.on_signal else f"{p.t - p.saved_t:.1f} s before the preemption"
    return (f"the scheduler ended the job ({how}); the newest checkpoint is step {p.saved_step}, saved {when}: "
            f"a resume redoes {p.steps_lost} steps")


def _crashed(f: TrialFacts) -> str | None:
    crashes = f.crashes
    if not crashes:
        return None
    first = min(crashes, key=lambda d: d.t)
    detail = f": {first.error}" if first.error else ""
    said = f"{ranks_text([d.rank for d in crashes])} crashed (first r{first.rank}, {first.how}{detail})"
    if all(d.in_teardown for d in crashes):
        said += (" in teardown, after destroy_process_group(): its training was done; not counted as "
                 "a detection of the fault")
    return said


def _exited_clean(f: TrialFacts) -> str | None:
    if f.steps_observed or f.end_reason != "all-exited":
        return None
    killed = [d.rank for d in f.departures.values() if d.how == "killed"]
    by_fault = f", {ranks_text(killed)} killed by the fault" if killed else ""
    return f"every rank's process ended, none by an error{by_fault}; steps not observed"


def _running_at_cap(f: TrialFacts) -> str | None:
    if f.steps_observed or f.end_reason != "cap":
        return None
    return (f"{len(f.survivors)} of {len(f.ranks)} ranks still running at the harness cap after the last "
            "fault action; steps not observed, so hung cannot be told from still training")


def _continued(f: TrialFacts) -> str | None:
    if not (f.detections and f.all_survivors_resumed and f.final_world is not None
            and f.final_world < len(f.ranks)):
        return None
    left = f" ({ranks_text(list(f.left_out))} left out)" if f.left_out else ""
    return f"{len(f.going_on)} survivors went on in a world of {f.final_world}{left}"


def _recovered(f: TrialFacts) -> str | None:
    if not (f.detections and not f.departures and f.all_survivors_resumed):
        return None
    if f.requeue is None:
        return f"every rank stepped again after {len(f.detections)} detected the fault"
    q = f.requeue
    restored = (f"every rank restored step {q.restored} ({q.steps_lost} steps lost) and stepped again"
                if q.restored is not None and q.steps_lost is not None else "every rank stepped again")
    return (f"the scheduler started the job again (restart {q.restarts}, {q.waited_s:.1f} s after its "
            f"last rank ended); {restored}")


def _isolated(f: TrialFacts) -> str | None:
    if not f.breaker_opens:
        return None
    return f"the breaker opened on {len(f.breaker_opens)} of {len(f.ranks)} ranks"


def _left_by(reason: str) -> Callable[[TrialFacts], str | None]:
    def rule(f: TrialFacts) -> str | None:
        left = [d.rank for d in f.departures.values() if d.how == reason]
        return f"{len(left)} of {len(f.ranks)} ranks exited {reason}" if left else None
    return rule


def _absorbed(f: TrialFacts) -> str | None:
    if f.detections or f.departures or not f.all_survivors_resumed:
        return None
    return "no rank saw an error and every rank stepped after the fault"


OUTCOME_RULES: tuple[tuple[str, Callable[[TrialFacts], str | None]], ...] = (
    ("incomplete", _incomplete),
    ("no-fault", _no_fault),
    ("bypassed", _bypassed),
    ("hung", _hung),
    ("preempted", _preempted_outcome),
    ("crashed", _crashed),
    ("exited-clean", _exited_clean),
    ("running-at-cap", _running_at_cap),
    ("continued", _continued),
    ("recovered", _recovered),
    ("isolated", _isolated),
    ("retries-exhausted", _left_by("retries-exhausted")),
    ("failed-fast", _left_by("failed-fast")),
    ("absorbed", _absorbed),
)


def classify(facts: TrialFacts) -> tuple[str, str]:
    """The trial's outcome and a one-line reason (see OUTCOME_RULES for the order)."""
    for name, rule in OUTCOME_RULES:
        reason = rule(facts)
        if reason is not None:
            return name, reason
    stalled = [r for r in facts.survivors if r not in facts.resumed]
    return "inconclusive", (f"{len(facts.detections)} ranks detected the fault, "
                            f"{len(facts.departures)} left, {len(stalled)} survivors never stepped "
                            "again, and the harness saw no hang")


# -- numbers ------------------------------------------------------------------------------

def step_rate(times: tuple[float, ...], lo: float, hi: float) -> float:
    """Steps completed per second in [lo, hi); NaN for an empty window. A stall counts as 0."""
    if not hi > lo:
        return NAN
    return sum(1 for t in times if lo <= t < hi) / (hi - lo)


def median_rate(rates: list[float]) -> float:
    rates = [r for r in rates if not math.isnan(r)]
    return statistics.median(rates) if rates else NAN


def normal_step_interval(step_times: dict[int, tuple[tuple[float, ...], ...]], before: float) -> float:
    """Median interval between a process's consecutive steps before `before` (pooled over
    every process of every rank)."""
    def intervals(limit: float) -> list[float]:
        out = []
        for times in itertools.chain.from_iterable(step_times.values()):
            kept = [t for t in times if t < limit]
            out += [b - a for a, b in itertools.pairwise(kept)]
        return out
    gaps = intervals(before) or intervals(math.inf)
    return statistics.median(gaps) if gaps else FALLBACK_STEP_INTERVAL_S


def progress_gaps(step_times: tuple[float, ...], lo: float, hi: float, threshold: float) -> list[float]:
    """Gaps longer than `threshold` between progress marks, clipped to [lo, hi].

    Marks: the last step at or before lo (lo itself if none), the steps inside, and hi."""
    if hi <= lo:
        return []
    before = [t for t in step_times if t <= lo]
    marks = [before[-1] if before else lo] + [t for t in step_times if lo < t < hi] + [hi]
    return [min(b, hi) - max(a, lo) for a, b in itertools.pairwise(marks) if b - a > threshold]


def _alive_window(events: pd.DataFrame, facts: TrialFacts, rank: int, start: float) -> tuple[float, float]:
    own = events[events["rank"] == rank]
    born = float(own["t"].min()) if len(own) else start
    gone = facts.departures[rank].t if rank in facts.departures else facts.observation_end
    return max(start, born), min(gone, facts.observation_end)


def waste(events: pd.DataFrame, facts: TrialFacts, threshold: float) -> tuple[float, float]:
    """(wasted rank-seconds, max stall) from fault start to the observation end."""
    start = facts.fault.start  # type: ignore[union-attr]
    total, longest = 0.0, 0.0
    for rank in facts.ranks:
        lo, hi = _alive_window(events, facts, rank, start)
        for times in facts.step_times.get(rank, ((),)):
            gaps = progress_gaps(times, lo, hi, threshold)
            total += sum(gaps)
            longest = max([longest, *gaps])
    return total, longest


def _trial_columns(trial: TrialInfo) -> dict[str, Any]:
    spec = trial.plan.policy_spec  # harness.job.policies.PolicySpec, as JSON
    return {
        "policy": trial.policy,
        "policy_base": spec.get("base", trial.policy),
        "timeout_s": float(spec.get("timeout", NAN)),
        "max_retries": spec.get("max_retries", NAN),
        "breaker": spec.get("breaker", NAN),
        "backend": trial.backend,
        "run_id": trial.run_id,
        "hang_cap_s": trial.plan.hang_cap,
    }


def _fault_columns(facts: TrialFacts, planned: tuple[PlannedFault, ...]) -> dict[str, Any]:
    fault = facts.fault
    kinds = [f.kind for f in facts.faults] or [f.kind for f in planned]
    return {
        "fault": fault.kind if fault else (kinds[0] if kinds else ""),
        "fault_targets": " ".join(str(r) for r in fault.targets) if fault else "",
        "fault_reaches": " ".join(str(r) for r in fault.reaches) if fault else "",
        "faults": ";".join(kinds),
        "fault_start_t": fault.start if fault else NAN,
        "fault_duration_s": fault.end - fault.start if fault else NAN,
    }


def trial_metrics(events: pd.DataFrame, trial: TrialInfo) -> dict[str, Any]:
    """Every metric of one trial as a flat row (NaN where a metric does not apply)."""
    facts = trial_facts(events, trial)
    outcome, reason = classify(facts)
    row: dict[str, Any] = {**_trial_columns(trial), **_fault_columns(facts, trial.plan.faults),
                           "ranks": len(facts.ranks), "outcome": outcome, "outcome_reason": reason,
                           "not_applied": not_applied_text(events)}
    row.update(_outcome_times(events, facts, outcome))
    for figures in fault_figures(events, facts):
        row.update(figures.columns())
    row.update(_traffic_columns(facts))
    row.update(_gpu_release_columns(events))
    row.update(_gpu_freed_columns(events))
    row.update(_host_drops_column(events))
    row.update(_steal_column(events))
    row.update(_heal_columns(events, facts))
    records = events.to_dict("records")  # once: the judges of recorded histories read records
    row.update(_state_columns(records, events, facts, trial.plan))
    row["stragglers"] = straggler_text(records, float(trial.plan.workload.get("step_period") or 0.0),
                                       bool(trial.plan.policy_spec.get("detector")))
    lost = (facts.preempted or facts.requeue)
    row["steps_lost"] = NAN if lost is None or lost.steps_lost is None else float(lost.steps_lost)
    return row


def _state_columns(records: list[dict[str, Any]], events: pd.DataFrame, facts: TrialFacts,
                   plan: TrialPlan) -> dict[str, Any]:
    """The state checker's verdict (reports.state), its line (times after fault start), the
    storage invariants under a storage fault (reports.storage) and the steps run again after
    a resume, over all ranks."""
    verdict = check_state(records)
    t0 = facts.fault.start if facts.fault else (float(events["t"].min()) if len(events) else 0.0)
    return {"state": verdict.verdict, "state_detail": verdict.summary(t0),
            "storage": storage_text(records, plan, verdict),
            "state_fingerprints": verdict.states, "steps_repeated": sum(verdict.repeated.values())}


def _heal_columns(events: pd.DataFrame, facts: TrialFacts) -> dict[str, Any]:
    """heals: a framework's replica groups healed live from a peer after fault start (`heal`
    events, from its log lines); NaN: not observed (no framework that says its heals counted
    the job's steps). heal_detail: each, with its source, when, and the steps it jumped."""
    steps = _of_kind(events, STEP)
    if "step_source" not in steps or not steps["step_source"].notna().any():
        return {"heals": NAN, "heal_detail": ""}
    t0 = facts.fault.start if facts.fault else -math.inf
    heals = _of_kind(events, HEAL)
    heals = heals[heals["t"] >= t0].sort_values("t")
    detail = "; ".join(f"r{int(h['rank'])} from replica rank {int(h['source'])} at +{h['t'] - t0:.1f} s "
                       f"(its step {int(h['step'])} to the quorum's {int(h['max_step'])})" for _, h in heals.iterrows())
    return {"heals": float(len(heals)), "heal_detail": detail}


def _host_drops_column(events: pd.DataFrame) -> dict[str, Any]:
    """host_backlog_drops: packets the kernel dropped with a receive backlog full while the
    ranks ran (host_drops; the whole machine's count). NaN: not counted (no such kernel)."""
    counted = _of_kind(events, HOST_DROPS)
    return {"host_backlog_drops": int(counted.iloc[-1]["packets"]) if len(counted) else NAN}


def _steal_column(events: pd.DataFrame) -> dict[str, Any]:
    """host_steal_share: the share of this machine's CPU time its VM's host took while the
    ranks ran (machine_steal). NaN: not counted (no steal column, or an older run folder)."""
    counted = _of_kind(events, MACHINE_STEAL)
    if not len(counted):
        return {"host_steal_share": NAN}
    last = counted.iloc[-1]
    cpu_s = float(last["secs"]) * int(last["cpus"])
    return {"host_steal_share": float(last["steal_s"]) / cpu_s if cpu_s > 0 else NAN}


def _gpu_release_columns(events: pd.DataFrame) -> dict[str, Any]:
    """gpu_released_s: the slowest rank's time from its breaker opening until its process
    held at most 512 MiB of GPU memory (gpu_memory_released); judged against the public bar
    (NVIDIA resiliency-ext: below 512 MB within GPU_RELEASE_BAR_S). NaN: not observed (no
    GPU, or no breaker opened)."""
    released = _of_kind(events, GPU_MEMORY_RELEASED)
    if not len(released):
        return {"gpu_released_s": NAN, "gpu_release_within_bar": pd.NA}
    slowest = float((released["t"] - released["breaker_t"]).max())
    return {"gpu_released_s": slowest, "gpu_release_within_bar": slowest <= GPU_RELEASE_BAR_S}


def _gpu_freed_columns(events: pd.DataFrame) -> dict[str, Any]:
    """gpu_freed_after_kill_s: the slowest killed rank's time from its kill until NVML no
    longer listed GPU memory for its process (gpu_memory_freed). NaN: not observed."""
    freed = _of_kind(events, GPU_MEMORY_FREED)
    return {"gpu_freed_after_kill_s": float((freed["t"] - freed["killed_t"]).max()) if len(freed) else NAN}


def _traffic_columns(facts: TrialFacts) -> dict[str, Any]:
    """Bytes through the first fault on the network's target links, before and during it,
    and every fault found bypassed (NaN / empty where none was counted)."""
    first = facts.traffic[0] if facts.traffic else None
    during = first.during if first is not None and first.during is not None else NAN
    return {"link_bytes_before": first.before if first else NAN, "link_window_s": first.before_s if first else NAN,
            "link_bytes_during": during,
            "bypassed_faults": " ".join(str(i) for i in sorted({t.index for t in facts.traffic if t.bypassed}))}


def _outcome_times(events: pd.DataFrame, facts: TrialFacts, outcome: str) -> dict[str, Any]:
    fault = facts.fault
    times: dict[str, Any] = {**METRIC_DEFAULTS, "generations": _count_generations(events),
                             "final_world": facts.final_world or pd.NA,
                             "departed": len(facts.departures), "crashed_ranks": len(facts.crashes),
                             # in the order they died: the first one's log holds the cause (reports.last_error)
                             "crash_order": " ".join(f"{d.rank}" for d in sorted(facts.crashes,
                                                                                 key=lambda d: (d.t, d.rank))),
                             "breaker_ranks": len(facts.breaker_opens),
                             "suspect_events": int((_of_kind(events, SUSPECT)["t"]
                                                    < facts.observation_end).sum())}
    if fault is None:
        return times
    start = fault.start
    if facts.detections:
        # A kill can be noticed before the harness reads the clock after the syscall: such a
        # detection (between t_requested and fault start) counts as 0 s, never negative.
        firsts = sorted(max(t, start) for t in facts.detections.values())
        first_rank = min(facts.detections, key=lambda r: (facts.detections[r], r))
        times.update(ttd_s=firsts[0] - start, ttd_median_s=statistics.median(firsts) - start,
                     ttd_max_s=firsts[-1] - start, detect_first_rank=first_rank,
                     detect_ranks=len(firsts), detect_cause=facts.detection_cause)
    resumed_at = NAN
    if outcome in ("recovered", "continued", "absorbed"):
        resumed_at = max(facts.resumed[r] for r in facts.going_on)
    if outcome in ("recovered", "continued"):
        times.update(ttr_s=resumed_at - start, ttr_after_end_s=resumed_at - fault.end)
    if facts.breaker_opens:
        times["breaker_open_s"] = min(facts.breaker_opens.values()) - start
    left = [d.t for d in facts.departures.values() if d.how in POLICY_EXIT_REASONS]
    if left:
        times["released_s"] = max(left) - start
    excluded = _of_kind(events, EXCLUDE)
    excluded = excluded[excluded["t"] >= start]
    if len(excluded):
        times["excluded_s"] = float(excluded["t"].min()) - start
    admitted = _of_kind(events, REJOIN_ADMITTED)
    admitted = admitted[admitted["t"] >= start]
    if len(admitted):
        times.update(rejoined_ranks=int(admitted["rank"].nunique()),
                     rejoined_s=float(admitted["t"].max()) - start)
    if facts.hang is not None:
        times.update(hung_cap=facts.hang.cap, hung_since_s=facts.hang.idle_since - start)
    times.update(observed_s=facts.observation_end - start, retries=_count_retries(events, start),
                 restarts=_count_restarts(events, start),
                 steps_rolled_back=_rolled_back(events, start), cuda_reserved_after=_cuda_after(events))
    if facts.steps_observed:  # without steps, stalls, waste and rates are not observed
        threshold = WASTE_GAP_FACTOR * normal_step_interval(facts.step_times, start)
        wasted, stall = waste(events, facts, threshold)
        times.update(wasted_rank_s=wasted, waste_gap_threshold_s=threshold, max_stall_s=stall,
                     **_rates(events, facts, resumed_at))
    return times


def _rates(events: pd.DataFrame, facts: TrialFacts, after_from: float) -> dict[str, float]:
    """Steps/s of a process (median over every process of every rank) before the fault,
    during it (while its rank lived) and after recovery."""
    fault = facts.fault
    assert fault is not None
    steps = facts.step_times
    during_to = facts.observation_end if math.isnan(fault.end) else fault.end
    during = []
    for rank in facts.ranks:
        lo, hi = _alive_window(events, facts, rank, fault.start)
        during += [step_rate(times, lo, min(hi, during_to)) for times in steps.get(rank, ((),))]
    return {
        # from each process's first step, which is not counted: it includes forming the group
        "steps_per_s_before": median_rate([step_rate(t[1:], t[0], fault.start)
                                           for t in itertools.chain.from_iterable(steps.values())]),
        "steps_per_s_during": median_rate(during),
        "steps_per_s_after": median_rate([step_rate(times, after_from, facts.observation_end)
                                          for r in facts.survivors for times in steps.get(r, ((),))]),
    }


# Every metric column in report order, with its value when it does not apply.
METRIC_DEFAULTS: dict[str, Any] = {
    "ttd_s": NAN, "ttd_median_s": NAN, "ttd_max_s": NAN, "detect_first_rank": pd.NA, "detect_ranks": 0,
    "detect_cause": "", "ttr_s": NAN, "ttr_after_end_s": NAN, "breaker_open_s": NAN, "breaker_ranks": 0,
    "released_s": NAN, "hung_cap": NAN, "hung_since_s": NAN, "wasted_rank_s": NAN,
    "waste_gap_threshold_s": NAN, "max_stall_s": NAN, "observed_s": NAN, "steps_per_s_before": NAN,
    "steps_per_s_during": NAN, "steps_per_s_after": NAN, "retries": 0, "restarts": NAN, "generations": 0,
    "final_world": pd.NA, "steps_rolled_back": NAN, "departed": 0, "crashed_ranks": 0,
    "crash_order": "",    "cuda_reserved_after": NAN, "excluded_s": NAN, "suspect_events": 0, "rejoined_ranks": 0,
    "rejoined_s": NAN,
}


def _count_retries(events: pd.DataFrame, start: float) -> int:
    retries = _of_kind(events, RETRY)
    retries = retries[retries["t"] >= start]
    return int(retries.groupby("rank").size().max()) if len(retries) else 0


def _count_generations(events: pd.DataFrame) -> int:
    groups = _of_kind(events, GROUP_READY)
    return int(groups["gen"].nunique()) if len(groups) and "gen" in groups else 0


def _rolled_back(events: pd.DataFrame, start: float) -> float:
    """Steps done before the first restore after the fault that the restore threw away."""
    restores = _of_kind(events, RESTORED)
    restores = restores[restores["t"] >= start]
    if not len(restores):
        return NAN
    steps = _of_kind(events, STEP)
    steps = steps[steps["t"] < restores["t"].min()]
    done = int(steps["step"].max()) + 1 if len(steps) else 0
    return float(max(0, done - int(restores["step"].min())))


def _cuda_after(events: pd.DataFrame) -> float:
    released = _of_kind(events, RESOURCES_RELEASED)
    if not len(released) or "cuda_reserved_after" not in released:
        return NAN
    values = pd.to_numeric(released["cuda_reserved_after"], errors="coerce").dropna()
    return float(values.max()) if len(values) else NAN
