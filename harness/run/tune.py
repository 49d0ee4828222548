"""`chaos tune SCENARIO.yaml`: the timeout and retries a job should use, measured on that job.

    chaos tune SCENARIO.yaml [--budget 30m] [--repeat 2] [--measure 60s] [--control 30s] [--hogs N]
                             [--faults link_down:10s,kill,...] [--ranks N] [--backend B] [--out DIR]
                             [--no-references] [--dry-run]

It takes the scenario's cluster, workload or job, and seed (its faults, policies and
variants are its own business) and runs, each stage a run folder made the way `chaos run`
makes one:

  probe     a user's job only: a few fault-free steps, to learn its step interval
  measure   the job without faults for --measure (trial fault_free: nothing to trip; the
            built-in workload's hearts beat, and the control plane records their gaps);
            reports.tune derives the candidates from it (rules written out there)
  round r   (r < --repeat, a new seed each; successive halving between rounds)
            control  the candidates still in, a trial each: --control of fault-free
                     steps (a detection there is a false trip), then a pause and, where
                     the backend has links, a link down of one rank, each half the
                     smallest candidate timeout (shorter than every timeout: absorbed)
            silent   the candidates still in, and in round 0 beside them the document's
                     30 s and PyTorch's gloo default (a user's job: the job as written):
                     one rank stops (SIGSTOP, never resumed: a hung host, which only a
                     timeout tells; a killed process's peers hear of it from gloo within
                     a second whatever the timeout)
  wave      (the built-in workload) the chosen candidate, with its jitter and with the
            document's: one rank frozen WAVE_EXTRA_S longer than its timeout, so that every
            other rank fails at once and re-joins at the store after its backoff (the
            re-joins per second, and when every rank steps again)
  fault-*   one per fault of --faults (default_faults: a link down and a pause for
            RIDE_OUT_S, the longest transient a retry should ride out, a pause of
            SHORT_STALL_S, a kill, a blackhole for good; no link faults where the backend
            has no links): the chosen candidate, and (the built-in workload) it with a
            breaker, beside the document's values and PyTorch's default (a user's job: the
            document's 30 s and the job as written): detection, breaker, recovery, waste
  restarts  (a user's job with job.tune.max_restarts: torchrun) the chosen timeout under
            torchrun, one rank paused RESTART_EXTRA_S longer than it (every agent restarts
            its workers): torchrun's default of no restarts (a reference), RESTART_EPISODES
            restarts, and those on a store of the workers' own (OWN_STORE_ENV)
  hosts-*   (a user's job, after a fault-* stage of a fault for good under which the
            torchrun side did not come back) the same torchrun side with --nnodes N-1:N
            and a --rdzv-conf from the measurement, and (a reference) with torch's
            rendezvous defaults: the hosts it went on with, and when
  detector  (the built-in workload) r < --repeat: the elastic policy with the chosen timeout,
            once per failure detector threshold (from the heartbeat gaps the control plane
            recorded while measuring), and in round 0 its default beside them: --control
            fault-free, then one rank stopped for good
With --hogs N, N busy CPU processes run beside every stage (a busy node: the slow steps it
makes are measured, and the controls judge the candidates under the same load).
The built-in workload's candidates are policies (timeout, retries, backoff); a user's job's
are variants that set its timeout where `job.tune.timeout` says (an argument or an
environment variable): a job without it is refused with that fix.
A tune folder (OUT/<time>/) keeps a manifest like a night's (harness.run.nightly): after
Ctrl-C, a crash or a budget that ended it, the same command (any --budget) resumes it. One progress line with the ETA;
before each stage it checks the budget, and when the next stage would pass it, it stops and
reports what the stages run so far show. tune.md, tune.json and tradeoff.png are the result.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import yaml

from chaos.errors import UsageError
from chaos.faults import FaultBase, parse_fault
from chaos.units import parse_duration
from harness.cluster.backends import BACKEND_NAMES, backend_class
from harness.run.nightly import Cell, Manifest, NightProgress, open_night, run_cells, seed_for, write_manifest
from harness.run.hogs import cpu_hogs
from harness.run.progress import Progress
from harness.run.scaling import usable_cores
from harness.run.scenario import load_scenario, reproduce_command
from harness.signals import Terminated
from reports import analyze_run
from reports.analysis import run_frame
from reports.history import load_run
from harness.job.policies import DetectorSpec, policy_spec
from reports.tune import (BREAKER_SUFFIX, CAME_BACK, DETECTOR_DEFAULT, DOCUMENT, MIN_HOSTS_SUFFIX, OWN_STORE_ENV,
                          RESTART_EPISODES, RESTART_EXTRA_S, RIDE_OUT_S,
                          TORCH_RDZV_SUFFIX, Candidate, DetectorCandidate, DetectorEvidence, Evidence, FaultFree,
                          FaultResult, Findings, HostsResult, Reference, RestartResult, Wave, TORCHRUN_SUFFIX, candidates,
                          control_trips, detector_candidates, elastic_policy, fault_free, fault_start, halve,
                          max_restarts_of, rdzv_conf_for, rdzv_wait_s, recommendation_text, rejoin_wave,
                          restart_choice, restarts_used, select, step_interval_s, trial_events, transient_s,
                          tune_json, write_tradeoff)
from runfolder.heartbeats import HeartbeatGaps, read_heartbeat_gaps
from runfolder.layout import trial_dir

DEFAULT_SCENARIO = Path(__file__).resolve().parent.parent.parent / "scenarios" / "link_down.yaml"
KEPT_FIELDS = ("cluster", "workload", "job", "warmup_steps", "groups")  # each stage sets its own name and seed
FAULT_AT_S = 2.0           # the silent rank stops, after warm-up
TRANSIENT_GAP_S = 4.0      # between the control's two transients, and after the first
WAVE_EXTRA_S = 0.5         # the wave's frozen rank thaws this long after the others' timeout
SILENT_MARGIN_S = 5.0      # a silent stage watches this long past its longest timeout (the hang cap)
START_S = 10.0             # a trial's bring-up and warm-up, for the estimates only
FAULT_FREE = "fault_free"  # the measuring stages' one trial
PROBE_STEPS = 8            # a user's job's probe: enough intervals for a median
REFERENCES = {"document_30s": 30.0, "pytorch_default": 1800.0}  # name -> timeout (s); a user's job:
AS_WRITTEN = "as_written"  # ... the document's 30 s through its knob, and the job as written beside it
DOCUMENT_VALUES = "document"  # per fault: the document's runner (30 s, 3 retries from 2 s, a breaker)
RESTART_WATCH_S = 45.0     # a restart of every agent: a rendezvous of all hosts, then the workers' start
UNBOUNDED_S = 60.0         # a wait this long or longer is not watched to its end: hung >= the cap
SHORT_STALL_S = 2.0        # --faults' default short pause: a hiccup of a step (a collection, a compile)
TRIED_KINDS = ("link_down", "blackhole", "pause", "kill")  # --faults: those that need only a rank and a time


@dataclasses.dataclass(frozen=True)
class FaultChoice:
    """One fault of --faults, put on the tune's target rank."""

    kind: str
    duration: float | None  # None: for good (a kill always)

    @property
    def fault(self) -> FaultBase:
        return parse_fault({"kind": self.kind})

    @property
    def heals(self) -> bool:
        return self.duration is not None

    @property
    def label(self) -> str:
        if self.heals:
            return f"{self.kind} {self.duration:g} s"
        return f"{self.kind} for good" if self.fault.reversible else self.kind  # a kill is for good anyway

    @property
    def stage(self) -> str:
        return "fault-" + self.label.replace(" ", "-").replace(".", "_")

    @property
    def for_good(self) -> bool:
        """Its host never comes back while the harness watches (a kill, or a fault given
        without a duration): the others may go on without it."""
        return not self.heals

    def spec(self) -> str:
        return f"{self.kind}:{self.duration:g}s" if self.heals else self.kind


def default_faults(links: bool) -> tuple[FaultChoice, ...]:
    """What the chosen settings are tried under without --faults: the transients a retry
    should ride out (a link down, where the backend has links, and a pause, each as long as
    the retry rule's RIDE_OUT_S), a short stall a timeout fit for the job absorbs, and the
    faults for good: a kill and, where the backend has links, a blackhole."""
    transients = ((FaultChoice("link_down", RIDE_OUT_S),) if links else ()) + (
        FaultChoice("pause", SHORT_STALL_S), FaultChoice("pause", RIDE_OUT_S))
    return transients + (FaultChoice("kill", None),) + ((FaultChoice("blackhole", None),) if links else ())


def parse_faults(text: str) -> tuple[FaultChoice, ...]:
    """--faults: KIND[:DURATION] separated by commas (none: no per-fault stage)."""
    if text.strip() == "none":
        return ()
    found = []
    for item in (part.strip() for part in text.split(",")):
        kind, _, duration = item.partition(":")
        if kind not in TRIED_KINDS:
            raise UsageError(f"--faults {text}: {kind!r} is not one of {', '.join(TRIED_KINDS)}; give e.g. "
                             "link_down:10s,kill (none: no per-fault stage)")
        if duration and not parse_fault({"kind": kind}).reversible:
            raise UsageError(f"--faults {text}: a {kind} does not heal; give {kind} without a duration")
        found.append(FaultChoice(kind, _seconds("--faults", duration) if duration else None))
    return tuple(found)


@dataclasses.dataclass(frozen=True)
class Options:
    scenario_file: Path
    budget_s: float
    repeat: int
    measure_s: float
    control_s: float
    ranks: int | None
    backend: str | None
    references: bool
    hogs: int = 0
    faults: tuple[FaultChoice, ...] | None = None  # None: the backend's default (Stages.faults)

    def digest(self) -> str:
        """What makes two invocations one tune: the scenario and every option but the
        budget (a tune the budget stopped goes on with a larger one)."""
        chosen = {k: v for k, v in dataclasses.asdict(self).items() if k != "budget_s"}
        text = self.scenario_file.read_text() + json.dumps(chosen, default=str, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


class Stages:
    """The tune's stages of one scenario, each a scenario file written into `folder` and
    loaded back (so a stage's run folder stores the command that runs it again)."""

    def __init__(self, options: Options, folder: Path) -> None:
        self.options = options
        self.folder = folder
        overrides: dict[str, Any] = {k: v for k, v in (("cluster.ranks", options.ranks),
                                                       ("cluster.backend", options.backend)) if v}
        # its faults, expectations and tiers are not the tune's (and may not fit --ranks or name its sides)
        self.base = load_scenario(options.scenario_file, {**overrides, "faults": [], "expect": {}, "tier": {},
                                                          "variants": {}})
        self.job = self.base.job
        if self.job is not None and self.job.tune is None:
            raise UsageError(f"{options.scenario_file}: job: has no `tune:`, so chaos tune cannot set the job's "
                             "timeout. Add where your script reads it, e.g. under job:\n"
                             "  tune: {timeout: \"--timeout {seconds}\"}    # or {timeout: {env: TRAIN_TIMEOUT}}")
        raw = yaml.safe_load(options.scenario_file.read_text())
        self.kept = {k: raw[k] for k in KEPT_FIELDS if k in raw}
        self.kept["cluster"] = {**self.kept.get("cluster", {}), "ranks": self.base.cluster.ranks,
                                "backend": self.base.cluster.backend}
        if self.job is not None:  # the stages' files live in the tune folder: the job's folder made absolute
            self.kept["job"] = {**self.kept["job"], "workdir": self.job.workdir}
        self.target = min(5, self.base.cluster.ranks - 1)
        self.heartbeat_s = DetectorSpec().interval  # not tuned: the thresholds are counted in its periods
        self.links = backend_class(self.base.cluster.backend).traits.network_faults
        self.faults = options.faults if options.faults is not None else default_faults(self.links)
        for choice in self.faults:
            if choice.fault.acts_on == "link" and not self.links:
                raise UsageError(f"--faults {choice.spec()}: the {self.base.cluster.backend} backend cannot put "
                                 "faults on links; give pause or kill faults (pause:10s,kill), or a backend with "
                                 "network namespaces (--backend netns)")

    def side(self, timeout: float) -> dict[str, Any]:
        """A trial with this timeout and nothing else: a policy of the built-in workload, or
        the variant of a user's job that sets it through job.tune."""
        if self.job is not None:
            return self.job.tune.timeout_variant(timeout)
        return {"base": "timeout", "timeout": timeout}

    def candidate_side(self, c: Candidate, retries: bool = True) -> dict[str, Any]:
        if self.job is not None:
            return self.side(c.timeout)
        return c.policy() if retries else {**c.policy(), "max_retries": 0}

    def references(self) -> dict[str, dict[str, Any]]:
        if self.job is None:
            return {name: self.side(timeout) for name, timeout in REFERENCES.items()}
        return {"document_30s": self.side(REFERENCES["document_30s"]), AS_WRITTEN: {}}

    def _cell(self, stage: str, faults: list[dict], sides: dict[str, dict], seed: int, hang_cap: float,
              settle_steps: int = 8) -> Cell:
        data = {**self.kept, "name": f"{self.base.name}-{stage}", "seed": seed, "faults": faults,
                "variants" if self.job is not None else "policies": sides, "hang_cap": f"{hang_cap:g}s",
                "settle_steps": settle_steps}
        path = self.folder / "scenarios" / f"{stage}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# chaos tune: stage {stage} of {self.options.scenario_file}\n"
                        + yaml.safe_dump(data, sort_keys=False))
        return Cell(load_scenario(path), path, tuple(sides), 0, reproduce_command(path, list(sides), seed))

    def _fault_free(self) -> dict[str, dict]:
        """A user's job as it is; the built-in workload with the failure detector's hearts
        beating (its server records their gaps: runfolder.heartbeats) but no silence
        shorter than UNBOUNDED_S judged, so that nothing it hears changes the steps."""
        if self.job is not None:
            return {FAULT_FREE: {}}
        return {FAULT_FREE: {"base": "baseline", "detector": {"interval": self.heartbeat_s,
                                                             "suspect_after": UNBOUNDED_S}}}

    def probe(self) -> Cell:
        """A user's job's few fault-free steps: its step interval sizes the measurement."""
        return self._cell("probe", [], self._fault_free(), self.base.seed, hang_cap=self.base.hang_cap,
                          settle_steps=PROBE_STEPS)

    def measure(self, step_interval_s: float) -> Cell:
        return self._cell("measure", [], self._fault_free(), self.base.seed, hang_cap=self.base.hang_cap,
                          settle_steps=max(8, math.ceil(self.options.measure_s / step_interval_s)))

    def control(self, round_: int, cands: tuple[Candidate, ...], transient: float) -> Cell:
        """Fault-free for --control, then transients shorter than every candidate's timeout."""
        faults = [{"kind": "pause", "target": {"rank": self.target}, "start": f"{self.options.control_s:g}s",
                   "duration": f"{transient:g}s"}]
        if self.links:
            faults.append({"kind": "link_down", "target": {"rank": self.target},
                           "start": f"{self.options.control_s + transient + TRANSIENT_GAP_S:g}s",
                           "duration": f"{transient:g}s"})
        return self._cell(f"control-{round_}", faults, {c.name: self.candidate_side(c) for c in cands},
                          seed_for(self.base.seed, "tune", round_), hang_cap=max(c.timeout for c in cands) + 10)

    def silent(self, round_: int, cands: tuple[Candidate, ...]) -> Cell:
        """One rank stopped for good: the candidates' timeouts (without their retries: only
        the time every other rank takes to know is measured here, and retries against a
        rank that never answers only lengthen the trial), and in round 0 the references."""
        sides: dict[str, dict] = {c.name: self.candidate_side(c, retries=False) for c in cands}
        if round_ == 0 and self.options.references:
            sides.update(self.references())
        longest = max([c.timeout for c in cands] + [t for n, t in REFERENCES.items() if n in sides and t < 60])
        return self._cell(f"silent-{round_}", [{"kind": "pause", "target": {"rank": self.target},
                                                "start": f"{FAULT_AT_S:g}s"}],
                          sides, seed_for(self.base.seed, "tune", round_), hang_cap=longest + SILENT_MARGIN_S)


    def fault(self, choice: FaultChoice, c: Candidate, restarts: RestartResult | None = None) -> Cell:
        """The chosen candidate under one fault of --faults (the built-in workload: also with a
        breaker; a user's job: also under torchrun with the restarts `restarts` chose), beside
        the document's values and PyTorch's default (a user's job: the document's 30 s and the
        job as written). The hang cap lets every side whose waits are bounded (below
        UNBOUNDED_S) reach its end; the others read hung >= the cap."""
        entry = {"kind": choice.kind, "target": {"rank": self.target}, "start": f"{FAULT_AT_S:g}s",
                 **({"duration": f"{choice.duration:g}s"} if choice.heals else {})}
        seed = seed_for(self.base.seed, "tune-fault", 0)
        if self.job is not None:  # a job's variants: their timeouts are all that is known of their waits
            sides = {c.name: self.candidate_side(c)}
            waits = [c.timeout] + ([REFERENCES["document_30s"]] if self.options.references else [])
            hang_cap = max(waits) + SILENT_MARGIN_S
            if restarts is not None:  # its agents restart once the timeout (and a flap) has passed
                sides[c.name + TORCHRUN_SUFFIX] = self.torchrun_side(c, restarts)
                hang_cap = max(hang_cap, max(choice.duration or 0.0, c.timeout) + RESTART_WATCH_S)
            sides.update(self.references() if self.options.references else {})
            return self._cell(choice.stage, [entry], sides, seed, hang_cap=hang_cap)
        sides = {c.name: c.policy(), c.name + BREAKER_SUFFIX: c.policy(breaker=True)}
        if self.options.references:
            sides.update({DOCUMENT_VALUES: {"base": "isolation"},
                          "pytorch_default": self.side(REFERENCES["pytorch_default"])})
        # a policy's longest quiet: a collective or a rendezvous up to its timeout, then its
        # longest backoff and jitter before the next try
        waits = [spec.timeout + spec.backoff(max(spec.max_retries, 1)) + spec.jitter[1]
                 for spec in (policy_spec(name, side) for name, side in sides.items())]
        return self._cell(choice.stage, [entry], sides, seed,
                          hang_cap=max((w for w in waits if w < UNBOUNDED_S), default=min(waits)) + SILENT_MARGIN_S)

    def torchrun_side(self, c: Candidate, restarts: RestartResult) -> dict[str, Any]:
        """The chosen timeout under torchrun with the --max-restarts and store the restarts stage chose."""
        return self.job.tune.restarts_variant(c.timeout, max_restarts_of(restarts)[0],
                                              OWN_STORE_ENV if restarts.own_store else {})

    def hosts(self, choice: FaultChoice, c: Candidate, restarts: RestartResult, conf: dict[str, int]) -> Cell:
        """The chosen timeout under torchrun with the restarts chosen and --nnodes N-1:N, under
        `choice` for good: with `conf` as --rdzv-conf and (a reference) torch's rendezvous defaults.
        The hang cap lets each side's rendezvous drop the host and close without it, then its
        agents restart."""
        min_hosts = max(self.base.cluster.ranks - 1, 1)
        torchrun = {**self.torchrun_side(c, restarts), "min_hosts": min_hosts}
        sides = {c.name + MIN_HOSTS_SUFFIX: {**torchrun, "rdzv_conf": conf},
                 **({c.name + TORCH_RDZV_SUFFIX: torchrun} if self.options.references else {})}
        entry = {"kind": choice.kind, "target": {"rank": self.target}, "start": f"{FAULT_AT_S:g}s"}
        waits = [rdzv_wait_s(side.get("rdzv_conf", {})) for side in sides.values()]
        return self._cell("hosts-" + choice.stage.removeprefix("fault-"), [entry], sides,
                          seed_for(self.base.seed, "tune-hosts", 0),
                          hang_cap=c.timeout + max(waits) + RESTART_WATCH_S)

    @property
    def tunes_restarts(self) -> bool:
        return self.job is not None and self.job.tune.max_restarts == "torchrun"

    def restarts(self, c: Candidate) -> Cell:
        """The chosen timeout under torchrun, one rank paused RESTART_EXTRA_S longer than it:
        RESTART_EPISODES restarts on torch's shared store and on the workers' own, and (a
        reference) torchrun's default of none."""
        knobs, n = self.job.tune, RESTART_EPISODES
        sides = {**({"restarts_0": knobs.restarts_variant(c.timeout, 0, {})} if self.options.references else {}),
                 f"restarts_{n}": knobs.restarts_variant(c.timeout, n, {}),
                 f"restarts_{n}_own_store": knobs.restarts_variant(c.timeout, n, OWN_STORE_ENV)}
        pause = c.timeout + RESTART_EXTRA_S
        fault = {"kind": "pause", "target": {"rank": self.target}, "start": f"{FAULT_AT_S:g}s",
                 "duration": f"{pause:g}s"}
        return self._cell("restarts", [fault], sides, seed_for(self.base.seed, "tune-restarts", 0),
                          hang_cap=pause + RESTART_WATCH_S)

    def detector(self, round_: int, c: Candidate, thresholds: tuple[DetectorCandidate, ...]) -> Cell:
        """The elastic policy with the chosen timeout, once per threshold (and in round 0
        its own default beside them): --control fault-free, then one rank stopped for good."""
        sides = {d.name: elastic_policy(c, d, self.heartbeat_s) for d in thresholds}
        if round_ == 0 and self.options.references:
            sides[DETECTOR_DEFAULT] = elastic_policy(c, None, self.heartbeat_s)
        fault = {"kind": "pause", "target": {"rank": self.target}, "start": f"{self.options.control_s:g}s"}
        return self._cell(f"detector-{round_}", [fault], sides, seed_for(self.base.seed, "tune-detector", round_),
                          hang_cap=c.timeout + SILENT_MARGIN_S)

    def wave(self, c: Candidate) -> Cell:
        """The chosen candidate's retry wave, with its own jitter and with the document's."""
        sides = {c.name: c.policy(), f"{c.name}_document_jitter": {**c.policy(), "jitter": list(DOCUMENT["jitter"])}}
        fault = {"kind": "pause", "target": {"rank": self.target}, "start": f"{FAULT_AT_S:g}s",
                 "duration": f"{c.timeout + WAVE_EXTRA_S:g}s"}
        return self._cell("wave", [fault], sides, seed_for(self.base.seed, "tune-wave", 0),
                          hang_cap=c.timeout + c.backoff_cap + 10)


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
    gathers each candidate's evidence and writes the result (reports.tune)."""

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


# -- the command ----------------------------------------------------------------------------

def add_tune_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", nargs="?", default=str(DEFAULT_SCENARIO),
                        help="a scenario: its cluster, workload or job (with job.tune), and seed are used "
                             "(default: the shipped link-down scenario)")
    parser.add_argument("--budget", default="30m", help="stop before a stage that would pass it (default 30m)")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of successive halving, each on a new seed "
                                                              "(default 2)")
    parser.add_argument("--measure", default="60s", help="fault-free time the job is measured for (default 60s)")
    parser.add_argument("--control", default="30s", help="fault-free time before each candidate's transients, "
                                                         "where a detection is a false trip (default 30s)")
    parser.add_argument("--hogs", type=int, default=0, help="busy CPU processes beside every stage: a busy node "
                                                            "(default 0)")
    parser.add_argument("--faults", help="what the chosen settings are tried under, beside the references: "
                                         "KIND[:DURATION],... of link_down, blackhole, pause (no duration: for "
                                         "good) and kill (default: link_down:10s,pause:2s,pause:10s,kill,blackhole; "
                                         "pause:2s,pause:10s,kill where the backend has no links; none: skip)")
    parser.add_argument("--ranks", type=int, help="number of ranks (overrides cluster.ranks)")
    parser.add_argument("--backend", choices=BACKEND_NAMES, help="host backend (default: the scenario's)")
    parser.add_argument("--out", default="tunes", help="folder of tune folders (default: ./tunes)")
    parser.add_argument("--no-references", action="store_true",
                        help="leave out the document's 30 s and PyTorch's default (a user's job: the job as "
                             "written) beside the candidates")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the estimate, run nothing")
    parser.add_argument("--quiet", action="store_true", help="no progress output")


def _seconds(flag: str, value: str) -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise UsageError(f"{flag} {value}: {exc}") from None
    if seconds <= 0:
        raise UsageError(f"{flag} {value}: give a time above zero, such as 15m")
    return seconds


def options_of(args: argparse.Namespace) -> Options:
    if args.repeat < 1:
        raise UsageError(f"--repeat {args.repeat}: give 1 or more rounds")
    if not 0 <= args.hogs <= 4 * usable_cores():
        raise UsageError(f"--hogs {args.hogs}: give 0 to {4 * usable_cores()} (4 per usable CPU) busy processes")
    return Options(scenario_file=Path(args.scenario), budget_s=_seconds("--budget", args.budget),
                   repeat=args.repeat, measure_s=_seconds("--measure", args.measure),
                   control_s=_seconds("--control", args.control), ranks=args.ranks, backend=args.backend,
                   references=not args.no_references, hogs=args.hogs,
                   faults=None if args.faults is None else parse_faults(args.faults))


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


def tune_command(args: argparse.Namespace, require_privileges: Callable[[str, str], None]) -> int:
    from harness.cluster.backends import backend_named
    from harness.cluster.launcher import LauncherPool
    from harness.run.orchestrator import run_scenario

    options = options_of(args)
    out = Path(args.out)
    if args.dry_run:
        with tempfile.TemporaryDirectory(prefix="chaos-tune-plan-") as scratch:
            print(dry_run_text(Stages(options, Path(scratch))))
        return 0
    with tempfile.TemporaryDirectory(prefix="chaos-tune-check-") as scratch:
        checked = Stages(options, Path(scratch))  # before anything is made
        backend_name, total = checked.base.cluster.backend, trial_count(checked)
    require_privileges("chaos tune", backend_name)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot make the tune folder there ({exc}); pick a writable folder") from None
    info = {"scenario": str(options.scenario_file), "options": json.loads(json.dumps(dataclasses.asdict(options),
                                                                                     default=str))}
    folder, manifest = open_night(out, options.digest(), options.scenario_file, None,
                                  lambda night, started: {"started": started, **info},
                                  datetime.datetime.now(datetime.timezone.utc))
    progress = NightProgress(Progress(quiet=args.quiet), total, sum(d.trials for d in manifest.done), time.monotonic,
                             label="tune")
    if manifest.done:
        progress.show(f"resuming tune {manifest.night}: {len(manifest.done)} stages done")
    backend = backend_named(backend_name)
    try:
        with LauncherPool() as launchers:
            def run_cell(cell: Cell, runs: Path) -> Path:
                with cpu_hogs(options.hogs):
                    run_dir, _ = run_scenario(cell.scenario, cell.scenario_file, list(cell.policies), runs, backend,
                                              Progress(quiet=True), command=cell.command, launchers=launchers)
                return run_dir
            return Tune(Stages(options, folder), manifest, run_cell, progress).tune()
    except (KeyboardInterrupt, Terminated):
        progress.show(f"interrupted: the same command resumes tune {manifest.night} ({folder})")
        raise
