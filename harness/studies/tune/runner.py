"""Runs a tune's stages (harness.studies.tune.stages) as a night's cells (manifest, resume,
progress) within the budget, reads what each stage's run folder shows into the evidence
the rules judge (reports.tune), and writes the result (reports.tune_report). PlannedTune
(harness.studies.tune.planned) walks the same stages on assumed readings."""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any, Callable

from chaos.errors import UsageError
from harness.studies.nightly import Cell, Manifest, NightProgress, run_cells, write_manifest
from harness.studies.tune.stages import FAULT_FREE, REFERENCES, FaultChoice, Stages
from reports import analyze_run
from reports.analysis import run_frame
from reports.history import load_run
from reports.tune import (CAME_BACK, TORCHRUN_SUFFIX, Candidate, DetectorCandidate, DetectorEvidence, Evidence,
                          FaultFree, FaultResult, Reference, Wave, candidates, control_trips, detector_candidates,
                          fault_free, fault_start, halve, rejoin_wave, select, step_interval_s, trial_events,
                          transient_s)
from reports.tune_report import Findings, recommendation_text, tune_json, write_tradeoff
from reports.tune_torchrun import (OWN_STORE_ENV, HostsResult, RestartResult, rdzv_conf_for, restart_choice,
                                   restarts_used)
from runfolder.heartbeats import HeartbeatGaps, read_heartbeat_gaps
from runfolder.layout import trial_dir

START_S = 10.0             # a trial's bring-up and warm-up, for the estimates only


def stage_read(run_dir: Path) -> tuple[Any, dict[str, list[dict[str, Any]]]]:
    """A stage's metrics by trial and each trial's raw events, from one read of its run folder."""
    run = load_run(run_dir)
    return run_frame(run).set_index("trial"), {trial.name: trial.events.to_dict("records") for trial in run.trials}


def window_estimate_s(cell: Cell, step_s: float | None = None) -> float:
    """A stage's seconds from its own windows: start, faults, settle steps (each `step_s`
    long; None: the built-in workload's step period) and, under a fault for good, the hang
    cap a trial may wait to (a fault that heals ends by itself: its trial is counted to that
    end, as the control's transients and a flap are)."""
    s = cell.scenario
    windows = max([e.start + (e.duration or 0) for e in s.faults], default=0.0)
    for_good = any(e.duration is None for e in s.faults)
    return len(cell.policies) * (START_S + windows + s.settle_steps * (step_s or s.workload.step_period)
                                 + (s.hang_cap if for_good else 0.0))


class Tune:
    """Runs the stages as a night's cells (manifest, resume, progress) within the budget,
    gathers each candidate's evidence and writes the result (reports.tune_report)."""

    def __init__(self, stages: Stages, manifest: Manifest, run_cell: Callable[[Cell, Path], Path],
                 progress: NightProgress, clock: Callable[[], float] = time.monotonic) -> None:
        self.stages = stages
        self.options = stages.options
        self.folder = stages.folder
        self.manifest = manifest
        self.run_cell = run_cell
        self.progress = progress
        self.clock = clock
        self.started = clock()
        self.stopped_early: str | None = None

    def estimate_s(self, cell: Cell) -> float:
        """A stage's seconds: this invocation's seconds per trial so far, else its windows."""
        ran = self.progress.done - self.progress.resumed
        if ran:
            return (self.clock() - self.started) / ran * len(cell.policies)
        return window_estimate_s(cell)

    def run(self, cell: Cell) -> Path | None:
        """The stage's run folder: the one the manifest has, or a new one; None once the
        budget would be passed (stopped_early says so)."""
        done = {d.key: d for d in self.manifest.done}
        if cell.key in done:
            return self.folder / done[cell.key].run
        if self.stopped_early:
            return None
        left = self.options.budget_s - (self.clock() - self.started)
        estimate = self.estimate_s(cell)
        if estimate > left:
            self.stopped_early = (f"the budget ({self.options.budget_s:g} s) would be passed by stage "
                                  f"{cell.scenario.name} (about {estimate:.0f} s, {max(left, 0):.0f} s left)")
            self.progress.show(self.stopped_early)
            return None
        self.manifest = run_cells(self.folder, self.manifest, (cell,), self.run_cell, self.progress, self.clock,
                                  last=False)
        return self.folder / next(d.run for d in self.manifest.done if d.key == cell.key)

    def _measured(self, cell: Cell) -> Path:
        run_dir = self.run(cell)
        if run_dir is None:
            raise UsageError(f"--budget {self.options.budget_s:g}s: too short for the fault-free measurement; "
                             "give more time or a shorter --measure")
        return run_dir

    def tune(self) -> int:
        findings = self.walk()
        text = recommendation_text(findings)
        (self.folder / "tune.md").write_text(text)
        (self.folder / "tune.json").write_text(tune_json(findings))
        write_tradeoff(self.folder / "tradeoff.png", findings)
        if not self.stopped_early:
            write_manifest(self.folder, dataclasses.replace(self.manifest, finished=True))
        print(text)
        print(f"tune folder: {self.folder}\nreport:      {self.folder / 'tune.md'}\n"
              f"picture:     {self.folder / 'tradeoff.png'}")
        return 0 if findings.chosen else 1

    def walk(self) -> Findings:
        """The stages in their order, each made from what the ones before it measured: the
        one definition of the plan (PlannedTune walks it on assumed readings)."""
        job = self.stages.job is not None
        period = self.stages.base.workload.step_period  # the built-in workload's pacing
        if job:  # a user's job paces itself: its interval, from a few steps
            period = self._step_interval(self._measured(self.stages.probe()))
            self.progress.show(f"the job's step interval: {period:.3f} s (median of its probe's)")
        measure_dir = self._measured(self.stages.measure(period))
        measured = self._fault_free(measure_dir, 0.0 if job else period)
        self.progress.show(f"fault-free: {measured.line()}")
        gaps = None if job else self._gaps(measure_dir)
        cands = candidates(measured, with_retries=not job)
        transient = transient_s(cands)
        evidence: dict[str, Evidence] = {c.name: Evidence() for c in cands}
        references: list[Reference] = []
        still_in = cands
        for round_ in range(self.options.repeat):
            control, silent = self.stages.control(round_, still_in, transient), self.stages.silent(round_, still_in)
            control_dir, silent_dir = self.run(control), self.run(silent)
            if control_dir is not None:
                self._controls(control_dir, control, evidence)
            if silent_dir is not None:
                references += self._silences(silent_dir, silent, evidence)
            if control_dir is None or silent_dir is None:
                break
            kept = set(select({c.name: evidence[c.name] for c in still_in}, halve(len(still_in))))
            still_in = tuple(c for c in still_in if c.name in kept)
            if not still_in:
                break
        timed = [n for n in select(evidence, len(evidence)) if math.isfinite(evidence[n].detect_s())]
        chosen = timed[0] if timed else None
        best = next((c for c in cands if c.name == chosen), None)
        waves: list[Wave] = []
        if best and not job:
            wave = self.stages.wave(best)
            if (wave_dir := self.run(wave)) is not None:
                waves = self._waves(wave_dir, wave)
        restarts: list[RestartResult] = []
        if best and self.stages.tunes_restarts:
            cell = self.stages.restarts(best)
            if (restarts_dir := self.run(cell)) is not None:
                restarts = self._restarts(restarts_dir, cell)
        per_fault: list[FaultResult] = []
        hosts: list[HostsResult] = []
        conf = rdzv_conf_for(measured)[0]
        for choice in self.stages.faults if best else ():
            cell = self.stages.fault(choice, best, restart_choice(restarts))
            if (fault_dir := self.run(cell)) is None:
                break
            rows = self._per_fault(fault_dir, cell, choice)
            per_fault += rows
            if choice.for_good and any(r.setting == best.name + TORCHRUN_SUFFIX and r.outcome not in CAME_BACK
                                   for r in rows):  # its agents wait for the host that is gone: go on without it
                cell = self.stages.hosts(choice, best, restart_choice(restarts), conf)
                if (hosts_dir := self.run(cell)) is None:
                    break
                hosts += self._hosts(hosts_dir, cell, choice)
        thresholds = detector_candidates(gaps, self.stages.heartbeat_s) if gaps and gaps.gaps else ()
        detector_evidence = self._detectors(best, thresholds) if best and thresholds else {}
        return Findings(measured, cands, evidence, chosen, references, transient, self.stopped_early,
                        variant=self.stages.side(best.timeout) if best and job else None,
                        hogs=self.options.hogs, waves=waves, per_fault=per_fault, gaps=gaps,
                        detectors=thresholds, detector_evidence=detector_evidence,
                        detector_interval_s=self.stages.heartbeat_s, restarts=restarts, hosts=hosts)

    # -- what each stage's run folder shows (PlannedTune assumes them instead) --

    @staticmethod
    def _step_interval(probe_dir: Path) -> float:
        return step_interval_s(trial_events(probe_dir, FAULT_FREE))

    @staticmethod
    def _fault_free(measure_dir: Path, period: float) -> FaultFree:
        return fault_free(trial_events(measure_dir, FAULT_FREE), period)

    @staticmethod
    def _gaps(measure_dir: Path) -> HeartbeatGaps | None:
        return read_heartbeat_gaps(trial_dir(measure_dir, FAULT_FREE))

    @staticmethod
    def _controls(run_dir: Path, cell: Cell, evidence: dict[str, Evidence]) -> None:
        """Each candidate's false trips before the first transient, and the ranks that
        detected the transients."""
        table, records = stage_read(run_dir)
        for name in cell.policies:
            events = records[name]
            first = fault_start(events)
            trips, watched = control_trips(events, first)
            evidence[name].false_trips.append(trips)
            evidence[name].control_s.append(watched)
            row = table.loc[name]
            evidence[name].transient_detected.append(
                sum(int(row.get(f"f{i}_detect_ranks", 0) or 0) for i in range(len(cell.scenario.faults))))

    def _detectors(self, c: Candidate, thresholds: tuple[DetectorCandidate, ...]) -> dict[str, DetectorEvidence]:
        """Each threshold's (and the default's) false trips before the silent rank, and the
        time until every other rank knew of it, round by round."""
        evidence: dict[str, DetectorEvidence] = {}
        for round_ in range(self.options.repeat):
            cell = self.stages.detector(round_, c, thresholds)
            if (run_dir := self.run(cell)) is None:
                break
            self._detector_round(run_dir, cell, evidence)
        return evidence

    def _detector_round(self, run_dir: Path, cell: Cell, evidence: dict[str, DetectorEvidence]) -> None:
        table, records = stage_read(run_dir)
        survivors = self.stages.base.cluster.ranks - 1
        for name in cell.policies:
            events, row = records[name], table.loc[name]
            trips, watched = control_trips(events, fault_start(events))
            e = evidence.setdefault(name, DetectorEvidence(cell.scenario.policy(name).detector.suspect_after))
            e.false_trips.append(trips)
            e.control_s.append(watched)
            e.every_s.append(float(row["ttd_max_s"]) if int(row["detect_ranks"]) >= survivors else math.nan)
            e.first_s.append(float(row["ttd_s"]))
            e.outcomes.append(str(row["outcome"]))

    @staticmethod
    def _waves(run_dir: Path, cell: Cell) -> list[Wave]:
        table, events = stage_read(run_dir)
        waves = []
        for name in cell.policies:
            rejoins, spread, peak = rejoin_wave(events[name])
            row = table.loc[name]
            waves.append(Wave(name, tuple(cell.scenario.policy(name).jitter), rejoins, spread, peak,
                              float(row["ttr_s"]), str(row["outcome"])))
        return waves

    @staticmethod
    def _per_fault(run_dir: Path, cell: Cell, choice: FaultChoice) -> list[FaultResult]:
        table = analyze_run(run_dir).set_index("trial")
        results = []
        for name in cell.policies:
            row = table.loc[name]
            results.append(FaultResult(choice.label, choice.heals, name,
                                       str(row["outcome"]), int(row["detect_ranks"]),
                                       float(row["ttd_s"]), float(row["ttd_max_s"]), float(row["breaker_open_s"]),
                                       float(row["ttr_s"]), float(row["wasted_rank_s"]), cell.scenario.hang_cap,
                                       str(row["stuck_in"] or "")))
        return results

    @staticmethod
    def _restarts(run_dir: Path, cell: Cell) -> list[RestartResult]:
        table, records = stage_read(run_dir)
        results = []
        for name in cell.policies:
            events, row = records[name], table.loc[name]
            job = cell.scenario.variants[name].applied_to(cell.scenario.job)
            since = fault_start(events)
            own_store = all(job.env.get(k) == v for k, v in OWN_STORE_ENV.items())
            results.append(RestartResult(name, job.max_restarts, own_store, str(row["outcome"]),
                                         restarts_used(events, since), float(row["ttr_s"]),
                                         float(row["wasted_rank_s"]), cell.scenario.hang_cap,
                                         str(row["stuck_in"] or "")))
        return results

    def _hosts(self, run_dir: Path, cell: Cell, choice: FaultChoice) -> list[HostsResult]:
        table, records = stage_read(run_dir)
        results = []
        for name in cell.policies:
            events, row = records[name], table.loc[name]
            job = cell.scenario.variants[name].applied_to(cell.scenario.job)
            try:
                world: int | None = int(row["final_world"])
            except (TypeError, ValueError):  # NA: no group formed after the fault
                world = None
            results.append(HostsResult(choice.label, name, int(job.min_hosts or 0), self.stages.base.cluster.ranks,
                                       dict(job.rdzv_conf), str(row["outcome"]), world,
                                       restarts_used(events, fault_start(events)), float(row["ttr_s"]),
                                       float(row["wasted_rank_s"]), cell.scenario.hang_cap, str(row["stuck_in"] or "")))
        return results

    def _silences(self, run_dir: Path, cell: Cell, evidence: dict[str, Evidence]) -> list[Reference]:
        """Each candidate's time until every other rank knew of the silent one; the
        references' beside them."""
        table = analyze_run(run_dir).set_index("trial")
        survivors = self.stages.base.cluster.ranks - 1
        references = []
        for name in cell.policies:
            row = table.loc[name]
            every = float(row["ttd_max_s"]) if int(row["detect_ranks"]) >= survivors else math.nan
            if name in evidence:
                evidence[name].silent_detected_s.append(every)
                evidence[name].silent_first_s.append(float(row["ttd_s"]))
                evidence[name].silent_outcomes.append(str(row["outcome"]))
            else:
                references.append(Reference(name, REFERENCES.get(name), str(row["outcome"]), every,
                                            cell.scenario.hang_cap))
        return references
