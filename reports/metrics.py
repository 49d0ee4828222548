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
                      (harness.trial.anchor_watch): named with its event and how long it was waited for.
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
                      A coordinator's host (a framework's, the runner's store) detects too,
                      but is no rank: detect_ranks counts the ranks, detect_coordinator
                      says whether it was among them.
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
  final world         the world of the last group formed after fault start and before the
                      observation end (group_ready);
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

Outcome: the first rule of reports.outcome.OUTCOME_RULES that applies, in this order: incomplete, no-fault,
bypassed, hung, preempted, crashed, exited-clean, running-at-cap, continued, recovered, isolated,
retries-exhausted, failed-fast, absorbed;
inconclusive when none does. A new policy's outcome is one more rule in that tuple, and its
name in runfolder.plan.OUTCOMES (the names a scenario may expect).
"""
from __future__ import annotations

import math
import statistics
from typing import Any

import pandas as pd

from reports.outcome import classify
from reports.state import check_state
from reports.step_progress import normal_step_interval, step_rates, waste
from reports.storage import storage_text
from reports.straggler import straggler_text
from reports.trial_events import NAN, event_field, of_kind
from reports.trial_facts import TrialFacts, fault_figures, trial_facts
from runfolder.events import (EXCLUDE, FAULT_NOT_APPLIED, GPU_MEMORY_FREED, GPU_MEMORY_RELEASED, GROUP_READY, HEAL,
                              HEAL_FETCHED, HOST_DROPS, MACHINE_STEAL, REJOIN_ADMITTED, RESOURCES_RELEASED, RESTORED, RETRY,
                              RANK_START, STEP, STEPS_NOT_OBSERVED, SUSPECT, WARMUP_DONE)
from runfolder.info import TrialInfo
from runfolder.plan import PlannedFault, TrialPlan

POLICY_EXIT_REASONS = ("failed-fast", "retries-exhausted", "isolated")
GPU_RELEASE_BAR_S = 50.0
WASTE_GAP_FACTOR = 3.0


def not_applied_text(events: pd.DataFrame) -> str:
    """Each process fault that came due on ranks with no process left (fault_not_applied),
    with when each had exited after the warm-up: "kill on r5: not applied, the rank had
    exited at +50.7 s"; "" when every fault was applied."""
    warm = of_kind(events, WARMUP_DONE, STEPS_NOT_OBSERVED)
    t0 = float(warm["t"].iloc[0]) if len(warm) else float(events["t"].min())
    texts = []
    for _, row in of_kind(events, FAULT_NOT_APPLIED).iterrows():
        ranks, exited = list(row["targets"]), list(row["exited_t"])
        waited_for = event_field(row, "waited_for")
        if waited_for is not None:  # an anchored fault (harness.trial.anchor_watch)
            texts.append(f"{row['fault_kind']} on {', '.join(f'r{r}' for r in ranks)}: not applied, its event "
                         f"{waited_for} never came (waited to +{float(row['t']) - t0:.1f} s)")
            continue
        whens = ["" if t is None else f" at +{t - t0:.1f} s" for t in exited]
        gone = (f"the rank had exited{whens[0]}" if len(ranks) == 1 else
                "the ranks had exited (" + ", ".join(f"r{r}{w}" for r, w in zip(ranks, whens, strict=True)) + ")")
        texts.append(f"{row['fault_kind']} on {', '.join(f'r{r}' for r in ranks)}: not applied, {gone}")
    return "; ".join(texts)


def _count_restarts(events: pd.DataFrame, start: float) -> float:
    """Processes that began (rank_start) at or after `start`: restarts of a rank's process;
    NaN (not observed) when no process ever announced its start (a job without the hook)."""
    starts = of_kind(events, RANK_START)
    return float((starts["t"] >= start).sum()) if len(starts) else NAN


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
        "fault": fault.label if fault else (kinds[0] if kinds else ""),
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
    the job's steps). heal_detail: each, with its source, when, the steps it jumped, and how
    long its fetch of the peer's state took where the framework said (`heal_fetched`)."""
    steps = of_kind(events, STEP)
    if "step_source" not in steps or not steps["step_source"].notna().any():
        return {"heals": NAN, "heal_detail": ""}
    t0 = facts.fault.start if facts.fault else -math.inf
    heals = of_kind(events, HEAL)
    heals = heals[heals["t"] >= t0].sort_values("t")
    fetches = of_kind(events, HEAL_FETCHED).sort_values("t")

    def fetched(heal: pd.Series) -> str:
        after = fetches[(fetches["rank"] == heal["rank"]) & (fetches["t"] >= heal["t"])]
        return f", fetched in {after.iloc[0]['seconds'] * 1000:.0f} ms" if len(after) else ""
    detail = "; ".join(f"r{int(h['rank'])} from replica rank {int(h['source'])} at +{h['t'] - t0:.1f} s "
                       f"(its step {int(h['step'])} to the quorum's {int(h['max_step'])}{fetched(h)})"
                       for _, h in heals.iterrows())
    return {"heals": float(len(heals)), "heal_detail": detail}


def _host_drops_column(events: pd.DataFrame) -> dict[str, Any]:
    """host_backlog_drops: packets the kernel dropped with a receive backlog full while the
    ranks ran (host_drops; the whole machine's count). NaN: not counted (no such kernel)."""
    counted = of_kind(events, HOST_DROPS)
    return {"host_backlog_drops": int(counted.iloc[-1]["packets"]) if len(counted) else NAN}


def _steal_column(events: pd.DataFrame) -> dict[str, Any]:
    """host_steal_share: the share of this machine's CPU time its VM's host took while the
    ranks ran (machine_steal). NaN: not counted (no steal column, or an older run folder)."""
    counted = of_kind(events, MACHINE_STEAL)
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
    released = of_kind(events, GPU_MEMORY_RELEASED)
    if not len(released):
        return {"gpu_released_s": NAN, "gpu_release_within_bar": pd.NA}
    slowest = float((released["t"] - released["breaker_t"]).max())
    return {"gpu_released_s": slowest, "gpu_release_within_bar": slowest <= GPU_RELEASE_BAR_S}


def _gpu_freed_columns(events: pd.DataFrame) -> dict[str, Any]:
    """gpu_freed_after_kill_s: the slowest killed rank's time from its kill until NVML no
    longer listed GPU memory for its process (gpu_memory_freed). NaN: not observed."""
    freed = of_kind(events, GPU_MEMORY_FREED)
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
                             "suspect_events": int((of_kind(events, SUSPECT)["t"]
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
                     detect_ranks=sum(r in facts.ranks for r in facts.detections),
                     detect_coordinator=any(r not in facts.ranks for r in facts.detections),
                     detect_cause=facts.detection_cause)
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
    excluded = of_kind(events, EXCLUDE)
    excluded = excluded[excluded["t"] >= start]
    if len(excluded):
        times["excluded_s"] = float(excluded["t"].min()) - start
    admitted = of_kind(events, REJOIN_ADMITTED)
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
                     **step_rates(events, facts, resumed_at))
    return times


# Every metric column in report order, with its value when it does not apply.
METRIC_DEFAULTS: dict[str, Any] = {
    "ttd_s": NAN, "ttd_median_s": NAN, "ttd_max_s": NAN, "detect_first_rank": pd.NA, "detect_ranks": 0,
    "detect_coordinator": False, "detect_cause": "", "ttr_s": NAN, "ttr_after_end_s": NAN, "breaker_open_s": NAN, "breaker_ranks": 0,
    "released_s": NAN, "hung_cap": NAN, "hung_since_s": NAN, "wasted_rank_s": NAN,
    "waste_gap_threshold_s": NAN, "max_stall_s": NAN, "observed_s": NAN, "steps_per_s_before": NAN,
    "steps_per_s_during": NAN, "steps_per_s_after": NAN, "retries": 0, "restarts": NAN, "generations": 0,
    "final_world": pd.NA, "steps_rolled_back": NAN, "departed": 0, "crashed_ranks": 0,
    "crash_order": "",    "cuda_reserved_after": NAN, "excluded_s": NAN, "suspect_events": 0, "rejoined_ranks": 0,
    "rejoined_s": NAN,
}


def _count_retries(events: pd.DataFrame, start: float) -> int:
    retries = of_kind(events, RETRY)
    retries = retries[retries["t"] >= start]
    return int(retries.groupby("rank").size().max()) if len(retries) else 0


def _count_generations(events: pd.DataFrame) -> int:
    groups = of_kind(events, GROUP_READY)
    return int(groups["gen"].nunique()) if len(groups) and "gen" in groups else 0


def _rolled_back(events: pd.DataFrame, start: float) -> float:
    """Steps done before the first restore after the fault that the restore threw away."""
    restores = of_kind(events, RESTORED)
    restores = restores[restores["t"] >= start]
    if not len(restores):
        return NAN
    steps = of_kind(events, STEP)
    steps = steps[steps["t"] < restores["t"].min()]
    done = int(steps["step"].max()) + 1 if len(steps) else 0
    return float(max(0, done - int(restores["step"].min())))


def _cuda_after(events: pd.DataFrame) -> float:
    released = of_kind(events, RESOURCES_RELEASED)
    if not len(released) or "cuda_reserved_after" not in released:
        return NAN
    values = pd.to_numeric(released["cuda_reserved_after"], errors="coerce").dropna()
    return float(values.max()) if len(values) else NAN
