"""The stages of `chaos tune` (harness.studies.tune.command) for one scenario, each a scenario file
written into the tune folder and loaded back as a night's cell (so a stage's run folder
stores the command that runs it again), and the options that shape them (Options, and
--faults' FaultChoice). In their order:

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
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import yaml

from chaos.errors import UsageError
from chaos.faults import FaultBase, parse_fault
from harness.cluster.backends import backend_class
from harness.job.policies import DetectorSpec, policy_spec
from harness.scenario.scenario import load_scenario, reproduce_command
from harness.studies.nightly import Cell, seed_for
from reports.tune import (BREAKER_SUFFIX, DETECTOR_DEFAULT, DOCUMENT, RIDE_OUT_S, TORCHRUN_SUFFIX, Candidate,
                          DetectorCandidate, elastic_policy)
from reports.tune_torchrun import (MIN_HOSTS_SUFFIX, OWN_STORE_ENV, RESTART_EPISODES, RESTART_EXTRA_S,
                                   TORCH_RDZV_SUFFIX, RestartResult, max_restarts_of, rdzv_wait_s)

KEPT_FIELDS = ("cluster", "workload", "job", "warmup_steps", "groups")  # each stage sets its own name and seed
FAULT_AT_S = 2.0           # the silent rank stops, after warm-up
TRANSIENT_GAP_S = 4.0      # between the control's two transients, and after the first
WAVE_EXTRA_S = 0.5         # the wave's frozen rank thaws this long after the others' timeout
SILENT_MARGIN_S = 5.0      # a silent stage watches this long past its longest timeout (the hang cap)
FAULT_FREE = "fault_free"  # the measuring stages' one trial
PROBE_STEPS = 8            # a user's job's probe: enough intervals for a median
REFERENCES = {"document_30s": 30.0, "pytorch_default": 1800.0}  # name -> timeout (s); a user's job:
AS_WRITTEN = "as_written"  # ... the document's 30 s through its knob, and the job as written beside it
DOCUMENT_VALUES = "document"  # per fault: the document's runner (30 s, 3 retries from 2 s, a breaker)
RESTART_WATCH_S = 45.0     # a restart of every agent: a rendezvous of all hosts, then the workers' start
UNBOUNDED_S = 60.0         # a wait this long or longer is not watched to its end: hung >= the cap
SHORT_STALL_S = 2.0        # --faults' default short pause: a hiccup of a step (a collection, a compile)


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
