"""A tune's plan, walked without running a stage: PlannedTune assumes each stage's reading
so that the plan is as long as it can be; from it, the trials a tune runs at the most, the
time it takes against the budget, and the text --dry-run prints."""
from __future__ import annotations

import math
from pathlib import Path

from harness.studies.nightly import Cell, Manifest, NightProgress
from harness.studies.tune.runner import Tune, window_estimate_s
from harness.studies.tune.stages import PROBE_STEPS, FaultChoice, Stages
from harness.trial.progress import Progress
from reports.tune import DetectorEvidence, Evidence, FaultFree, FaultResult, Reference, Wave, candidates
from reports.tune_torchrun import RESTART_EPISODES, RESTART_EXTRA_S, HostsResult, RestartResult
from runfolder.heartbeats import HeartbeatGaps


def dry_run_text(stages: Stages) -> str:
    from reports import tune as rules
    o = stages.options
    if stages.job is None:
        measure = stages.measure(stages.base.workload.step_period)
        first = [f"measure: {measure.scenario.settle_steps} fault-free steps (--measure {o.measure_s:g} s)",
                 f"candidates: timeouts of {', '.join(f'{m:g}x' for m in rules.MARGINS)} the longest fault-free "
                 f"wait (the longest step or one step period, rounded up to {rules.ROUND_S:g} s); retries from the "
                 "longest group formation (reports.tune)"]
    else:
        knob = stages.job.tune.timeout
        first = [f"probe: {PROBE_STEPS} fault-free steps of your job, for its step interval; then measure: "
                 f"--measure {o.measure_s:g} s of fault-free steps",
                 f"candidates: timeouts of {', '.join(f'{m:g}x' for m in rules.MARGINS)} the longest fault-free "
                 f"step interval, rounded up to {rules.ROUND_S:g} s, given to the job as "
                 + (f"${knob.env}" if hasattr(knob, "env") else repr(knob)) + " (job.tune.timeout)"]
    steps = [
        *first,
        f"{o.repeat} round(s) of successive halving, each a control ({o.control_s:g} s fault-free, then a pause"
        + (" and a link down" if stages.links else "") + " of half the smallest timeout) and a rank stopped for good"
        + ((", and in round 0 the document's 30 s and " + ("the job as written" if stages.job else
                                                           "PyTorch's gloo default") + " beside them")
           if o.references else ""),
        *([] if stages.job else ["a retry wave: the chosen candidate with its jitter and with the document's, "
                                 "one rank frozen a little longer than its timeout"]),
        *([f"torchrun's restarts (job.tune.max_restarts): the chosen timeout under torchrun, one rank paused "
           f"{RESTART_EXTRA_S:g} s longer than it, with --max-restarts {RESTART_EPISODES} on torch's shared store and "
           "on the workers' own" + (", and torchrun's default (0) beside them" if o.references else "")]
          if stages.tunes_restarts else []),
        *([f"per fault ({', '.join(f.label for f in stages.faults)}): the chosen candidate"
           + (" without and with a breaker" if not stages.job else
              ", and under torchrun with the restarts chosen" if stages.tunes_restarts else "")
           + (", beside the document's " + ("30 s and the job as written" if stages.job else
                                            "values and PyTorch's default") if o.references else "")
           + ": detection, breaker, recovery, wasted rank-seconds (--faults)"] if stages.faults else []),
        *([f"a host gone for good ({', '.join(permanent)}), where torchrun's restarts did not bring the job back: "
           f"--nnodes {max(stages.base.cluster.ranks - 1, 1)}:{stages.base.cluster.ranks} with a --rdzv-conf from "
           "the measurement" + (", and with torch's rendezvous defaults beside it" if o.references else "")]
          if stages.tunes_restarts and (permanent := [f.label for f in stages.faults if f.for_good]) else []),
        *([] if stages.job else [
            f"{o.repeat} round(s) of the elastic policies' failure detector: thresholds of "
            f"{', '.join(f'{m:g}x' for m in rules.DETECTOR_MARGINS)} the longest fault-free heartbeat gap (recorded "
            "while measuring)" + (", and in round 0 its default beside them" if o.references else "")
            + f", each a control ({o.control_s:g} s fault-free), then a rank stopped for good"])]
    return "\n".join([
        f"chaos tune {o.scenario_file}: {stages.base.cluster.ranks} ranks on {stages.base.cluster.backend}, "
        f"rank {stages.target} faulted" + (f", your job: {' '.join(stages.job.command)}" if stages.job else ""),
        *(f"{i}. {step}" for i, step in enumerate(steps, 1)),
        *([f"beside every stage: {o.hogs} busy CPU process(es) (--hogs)"] if o.hogs else []),
        f"at most {trial_count(stages)} trials; {plan_estimate_text(stages)}"])


class PlannedTune(Tune):
    """The stages a tune would run, walked without running one: each stage's reading is
    assumed, so that the plan is as long as it can be. The longest fault-free wait is one
    step (`step_s`; None: the built-in workload's step period), the heartbeats are as
    regular as they can be, every candidate passes its control and every rank knows of the
    silent one at its timeout (the fastest is chosen), torchrun's restarts bring the job
    back, and no setting comes back from a fault for good (so every hosts-* stage runs)."""

    def __init__(self, stages: Stages, step_s: float | None = None) -> None:
        clock = lambda: 0.0  # noqa: E731 (nothing runs: no time passes)
        super().__init__(stages, Manifest(night="plan", digest="", plan_file="", info={}), self._runs_nothing,
                         NightProgress(Progress(quiet=True), 0, 0, clock, label="tune"), clock)
        self.interval_s = step_s or stages.base.workload.step_period
        self.measured: FaultFree | None = None
        self.cells: list[Cell] = []

    @staticmethod
    def _runs_nothing(cell: Cell, runs: Path) -> Path:
        raise AssertionError("a planned tune runs no stage")

    def run(self, cell: Cell) -> Path:
        self.cells.append(cell)
        return self.folder / cell.scenario.name  # never read: the readings below are assumed

    def _step_interval(self, probe_dir: Path) -> float:
        return self.interval_s

    def _fault_free(self, measure_dir: Path, period: float) -> FaultFree:
        self.measured = FaultFree(steps=0, median_s=self.interval_s, p99_s=self.interval_s, max_s=self.interval_s,
                                  formation_s=None, step_period_s=period, seconds=0.0)
        return self.measured

    def _gaps(self, measure_dir: Path) -> HeartbeatGaps:
        return HeartbeatGaps(gaps=1, max_s=self.stages.heartbeat_s, max_rank=0, watched_s=0.0)

    def _controls(self, run_dir: Path, cell: Cell, evidence: dict[str, Evidence]) -> None:
        for name in cell.policies:
            evidence[name].false_trips.append(0)
            evidence[name].control_s.append(self.options.control_s)
            evidence[name].transient_detected.append(0)

    def _silences(self, run_dir: Path, cell: Cell, evidence: dict[str, Evidence]) -> list[Reference]:
        timeouts = {c.name: c.timeout for c in candidates(self.measured)}
        for name in cell.policies:
            if name in evidence:
                evidence[name].silent_detected_s.append(timeouts[name])
        return []

    def _waves(self, run_dir: Path, cell: Cell) -> list[Wave]:
        return []

    def _restarts(self, run_dir: Path, cell: Cell) -> list[RestartResult]:
        return [RestartResult(name, cell.scenario.variants[name].max_restarts or 0, False, "recovered", 1, 0.0, 0.0,
                              cell.scenario.hang_cap) for name in cell.policies]

    def _per_fault(self, run_dir: Path, cell: Cell, choice: FaultChoice) -> list[FaultResult]:
        return [FaultResult(choice.label, choice.heals, name, "hung", 0, math.nan, math.nan, math.nan, math.nan,
                            math.nan, cell.scenario.hang_cap) for name in cell.policies]

    def _hosts(self, run_dir: Path, cell: Cell, choice: FaultChoice) -> list[HostsResult]:
        return []

    def _detector_round(self, run_dir: Path, cell: Cell, evidence: dict[str, DetectorEvidence]) -> None:
        """Nothing comes after the detector's rounds: their readings decide no stage."""


def planned_cells(stages: Stages, step_s: float | None = None) -> list[Cell]:
    """The stages the tune runs, as many as it can run (PlannedTune), its steps `step_s` long."""
    tune = PlannedTune(stages, step_s)
    tune.walk()
    return tune.cells


JOB_STEPS_S = (0.25, 1.0, 5.0)  # a user's job's dry run: its plan at these step times (its probe measures it)


def plan_estimate_s(stages: Stages, step_s: float | None = None) -> tuple[float, str | None]:
    """The seconds the planned stages take if every trial runs to its windows' end and, under
    a fault for good, its hang cap (a trial that settles sooner ends sooner; one that hangs
    also spends its teardown), and the stage the budget would stop before at that time."""
    total, cut = 0.0, None
    for cell in planned_cells(stages, step_s):
        total += window_estimate_s(cell, step_s)
        if cut is None and total > stages.options.budget_s:
            cut = cell.scenario.name
    return total, cut


def plan_estimate_text(stages: Stages) -> str:
    """The plan's time: the built-in workload's at its step period; a user's job's at each of
    JOB_STEPS_S, since only its probe tells its step interval."""
    budget = stages.options.budget_s
    runs = "every trial runs to the end of its faults or, under one for good, its hang cap (one that settles ends sooner)"
    if stages.job is None:
        total, cut = plan_estimate_s(stages)
        stops = f": if every trial took that long, it would stop before {cut}" if cut else ""
        return (f"about {total / 60:.0f} min if the longest fault-free wait is one step period "
                f"({stages.base.workload.step_period:g} s) and {runs}; budget {budget / 60:g} min{stops}")
    plans = [(step, *plan_estimate_s(stages, step)) for step in JOB_STEPS_S]
    stops = next((f": at {step:g} s a step it would stop before {cut}" for step, _, cut in plans if cut), "")
    (first, total, _), *others = plans
    return (f"about {total / 60:.0f} min if a step of your job takes {first:g} s, "
            + ", ".join(f"{t / 60:.0f} min at {step:g} s" for step, t, _ in others)
            + f" (its probe measures it), if {runs}; budget {budget / 60:g} min{stops}")


def trial_count(stages: Stages) -> int:
    """The trials of the longest plan (the halving as if every candidate passed)."""
    return sum(len(cell.policies) for cell in planned_cells(stages))
