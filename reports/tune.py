"""`chaos tune`'s analysis: the job measured without faults, the candidate settings derived
from it by written rules, each candidate judged from its trials, the successive halving,
and the settings chosen. Pure: values in, values out (the runs are harness.studies.tune.command's; a
user's job under torchrun is reports.tune_torchrun's; tune.md, tune.json and the picture
are reports.tune_report's).

The rules (docs/tune.md says why):

  timeout     a margin over the longest fault-free wait: the longest step of every rank
              (its collective wait included) or one step period, whichever is longer (a
              paced rank may wait a period for a slow peer with nothing wrong); MARGINS
              times it, rounded up to ROUND_S. The smaller, the sooner a silent rank is
              known; too small, and a slow step or a short flap trips it.
              A user's job: the longest interval between its steps (its own pacing and
              collectives included), the job's timeout set through job.tune.
  retries     (the built-in workload's policies) the backoff base is the longest time a group took to form (rounded up to
              ROUND_S, at least MIN_BACKOFF_S): a retry sooner than that finds no group;
              the cap is 8 bases; enough retries that their backoffs add up to RIDE_OUT_S,
              the longest transient a retry should ride out; the jitter 0 to the longest
              group formation (rounded up to JITTER_STEP_S, at least that): the ranks'
              re-joins spread over the time a group takes to form, not over the document's
              0.1-1.0 s, which delays the last re-join by up to a second. A retry wave (every
              rank failing at once) measures both: the re-joins at the store per second, at
              the most, in WAVE_WINDOW_S windows, and when every rank stepped again.
  judged      a candidate passes when its fault-free control tripped nothing (no rank
              detected a fault) and transients shorter than its timeout were absorbed (no
              rank detected them). Of those that pass, the one whose every rank knew soonest
              of a rank gone silent (stopped, never resumed: a hung host, which only a
              timeout can tell) is recommended (ties: by name).
  detector    (the elastic policies) suspect_after DETECTOR_MARGINS times the longest
              fault-free heartbeat gap the control plane recorded while the job was
              measured, rounded up to the heartbeat period, at least MIN_HEARTBEATS
              periods. Each runs as an elastic policy: a fault-free control (a suspicion is
              a false trip), then a rank stopped for good; of those that tripped nothing and
              with which every rank knew, the one every rank knew soonest with.
  restarts    (a user's job with job.tune.max_restarts: torchrun) the chosen timeout under
              torchrun, one rank paused RESTART_EXTRA_S longer than it, so that every
              agent restarts its workers: with torchrun's default (no restarts), with
              RESTART_EPISODES, and with them on a store of the workers' own
              (OWN_STORE_ENV). --max-restarts is the restarts the most-restarted agent made
              for that one episode (the rise in torchrun's restart count) times
              RESTART_EPISODES; the environment variable is
              recommended only where the shared store's side did not come back and the own one did.
  hosts       (a user's job whose torchrun side did not come back from a fault for good) --nnodes N-1:N
              with --rdzv-conf keep_alive_interval KEEP_ALIVE_S (a gone agent dropped after
              3 missed keep-alives) and last_call_timeout twice the longest fault-free wait
              (at least MIN_LAST_CALL_S), beside torch's defaults (TORCH_RDZV); of those that
              went on without the host under every fault for good, the soonest back at its
              slowest is recommended.
  halving     every round runs the candidates still in on a new seed; after each, the
              failing ones go and at most half of the rest (the slowest to detect) follow.
  breaker     the chosen settings run under each fault of --faults twice, without and with a
              breaker (policy isolation: when the retries run out or the control plane
              cannot be reached, leave and free what the rank holds). The breaker is
              recommended when, under every fault where the retries brought every rank
              back, it did too; a breaker that makes a rank leave on a flap the retries
              ride out costs the job its run.
"""
from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from runfolder.events import DETECTION_KINDS, EVENTS_FILE, GROUP_READY, RETRY, STEP, read_events
from runfolder.heartbeats import HeartbeatGaps
from runfolder.layout import trial_dir

MARGINS = (3.0, 10.0, 30.0)
ROUND_S = 0.5
MIN_BACKOFF_S = 0.5
RIDE_OUT_S = 10.0
JITTER_STEP_S = 0.1
WAVE_WINDOW_S = 0.1
DOCUMENT = {"timeout": 30.0, "max_retries": 3, "backoff_base": 2.0, "jitter": (0.1, 1.0)}
PYTORCH_GLOO_TIMEOUT_S = 1800.0  # torch.distributed's default for gloo (NCCL: 600 s)


def round_up(seconds: float, step: float = ROUND_S) -> float:
    return round(math.ceil(seconds / step - 1e-9) * step, 6)  # 3 x 0.1 is 0.30000000000000004


@dataclass(frozen=True)
class FaultFree:
    """The job without faults: its steps (each the rank's compute and collective wait) and
    the longest time a process group took to form."""

    steps: int
    median_s: float
    p99_s: float
    max_s: float
    formation_s: float | None  # None: no group formation recorded (a user's job forms its own)
    step_period_s: float       # 0: none set (a user's job paces itself; its steps are intervals)
    seconds: float  # how long it was watched

    def line(self) -> str:
        formed = "" if self.formation_s is None else f"; a group formed in at most {self.formation_s:.2f} s"
        return (f"{self.steps} steps in {self.seconds:.0f} s: median {self.median_s:.3f} s, "
                f"p99 {self.p99_s:.3f} s, max {self.max_s:.3f} s{formed}")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def step_interval_s(events: Iterable[dict[str, Any]]) -> float:
    """The median time between a rank's steps (a user's job paces itself)."""
    durations = [float(e["dur"]) for e in events if e.get("kind") == STEP and e.get("dur") is not None]
    if not durations:
        raise ValueError("the job recorded no two steps in a row: is the step hook or job.step_pattern seeing "
                         "its steps?")
    return statistics.median(durations)


def fault_free(events: Iterable[dict[str, Any]], step_period_s: float) -> FaultFree:
    """The measurement from one fault-free trial's events."""
    events = list(events)
    durations = [float(e["dur"]) for e in events if e.get("kind") == STEP and e.get("dur") is not None]
    if not durations:
        raise ValueError("the fault-free trial recorded no step with a duration")
    formed = [float(e["secs"]) for e in events if e.get("kind") == GROUP_READY and e.get("secs") is not None]
    times = [float(e["t"]) for e in events if e.get("kind") == STEP]
    return FaultFree(steps=len(durations), median_s=statistics.median(durations), p99_s=_percentile(durations, 0.99),
                     max_s=max(durations), formation_s=max(formed, default=None), step_period_s=step_period_s,
                     seconds=max(times) - min(times))


@dataclass(frozen=True)
class Candidate:
    """Settings to try, with the rule that gave each."""

    name: str
    margin: float
    timeout: float
    max_retries: int
    backoff_base: float
    backoff_cap: float
    jitter: tuple[float, float]
    rules: tuple[str, ...]

    def policy(self, breaker: bool = False) -> dict[str, Any]:
        """As a scenario's `policies:` entry (harness.job.policies: base retry, or isolation,
        which is retry with a breaker)."""
        return {"base": "isolation" if breaker else "retry", "timeout": self.timeout, "max_retries": self.max_retries,
                "backoff_base": self.backoff_base, "backoff_cap": self.backoff_cap, "jitter": list(self.jitter)}


def candidates(measured: FaultFree, margins: tuple[float, ...] = MARGINS, with_retries: bool = True
               ) -> tuple[Candidate, ...]:
    """The candidates the rules give (see the module's list); one per distinct timeout.
    `with_retries`: False for a user's job, whose timeout alone is set (no retry rules)."""
    wait = max(measured.max_s, measured.step_period_s)
    extra = ""
    if not measured.step_period_s:
        which = "the longest interval between a rank's steps"
    elif measured.max_s >= measured.step_period_s:
        which = "the longest fault-free step"
    else:
        which, extra = "one step period", f"; the longest step {measured.max_s:.3f} s"
    formation = measured.formation_s or 0.0
    base = max(MIN_BACKOFF_S, round_up(formation))
    retries = max(1, math.ceil(math.log2(RIDE_OUT_S / base + 1)))
    jitter = max(JITTER_STEP_S, round_up(formation, JITTER_STEP_S))
    retry_rules = (f"backoff base {base:g} s: the longest group formation ({formation:.2f} s) rounded "
                   f"up to {ROUND_S:g} s, at least {MIN_BACKOFF_S:g} s",
                   f"{retries} retries: backoffs {base:g} x (2^{retries} - 1) = {base * (2 ** retries - 1):g} s "
                   f">= {RIDE_OUT_S:g} s, the longest transient to ride out; cap {8 * base:g} s (8 bases)",
                   f"jitter 0-{jitter:g} s: the longest group formation rounded up to {JITTER_STEP_S:g} s, at least "
                   f"{JITTER_STEP_S:g} s (the re-joins spread over the time a group takes to form)")
    found: dict[float, Candidate] = {}
    for margin in margins:
        timeout = round_up(margin * wait)
        rule = (f"timeout {timeout:g} s: {margin:g} x the longest fault-free wait ({which}: {wait:.3f} s{extra}), "
                f"rounded up to {ROUND_S:g} s")
        found.setdefault(timeout, Candidate(name=f"tuned_{str(timeout).replace('.', '_').removesuffix('_0')}s",
                                            margin=margin, timeout=timeout,
                                            max_retries=retries if with_retries else 0, backoff_base=base,
                                            backoff_cap=8 * base, jitter=(0.0, jitter),
                                            rules=(rule, *retry_rules) if with_retries else (rule,)))
    return tuple(found.values())


def transient_s(cands: Iterable[Candidate]) -> float:
    """The transient every candidate should absorb: half the smallest timeout, rounded up."""
    return round_up(min(c.timeout for c in cands) / 2)


# -- judging ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Evidence:
    """One candidate's trials: per round, the fault-free control, the transients and the
    silent rank."""

    false_trips: list[int] = field(default_factory=list)          # detecting events in a control
    control_s: list[float] = field(default_factory=list)          # fault-free seconds watched
    transient_detected: list[int] = field(default_factory=list)   # ranks that detected a transient
    silent_detected_s: list[float] = field(default_factory=list)  # every other rank knew of the silent one
    silent_first_s: list[float] = field(default_factory=list)     # the first rank knew
    silent_outcomes: list[str] = field(default_factory=list)

    @property
    def passes(self) -> bool:
        return bool(self.control_s) and not any(self.false_trips) and not any(self.transient_detected)

    def detect_s(self) -> float:
        """The median time for every other rank to know of the silent one (inf: not observed)."""
        known = [t for t in self.silent_detected_s if not math.isnan(t)]
        return statistics.median(known) if known else math.inf


def fault_start(events: Iterable[dict[str, Any]]) -> float:
    """When a trial's first fault was applied (inf: none was)."""
    return next((float(e["t"]) for e in events if e.get("kind") == "fault_applied"), math.inf)


def control_trips(events: list[dict[str, Any]], until_t: float) -> tuple[int, float]:
    """Detecting events before `until_t` (the first fault) after warm-up, and the seconds watched."""
    warm = next((float(e["t"]) for e in events if e.get("kind") == "warmup_done"), None)
    if warm is None:
        return 0, 0.0
    trips = sum(1 for e in events if e.get("kind") in DETECTION_KINDS and warm <= float(e["t"]) < until_t)
    return trips, until_t - warm


def trial_events(run_dir: Path, policy: str) -> list[dict[str, Any]]:
    return read_events(trial_dir(Path(run_dir), policy) / EVENTS_FILE)[0]


def select(evidence: dict[str, Evidence], keep_at_most: int) -> list[str]:
    """The candidates that stay in: those that pass, the fastest to detect first, at most
    `keep_at_most` of them (ties: by name)."""
    passing = [name for name, e in evidence.items() if e.passes]
    return sorted(passing, key=lambda n: (evidence[n].detect_s(), n))[:keep_at_most]


def halve(count: int) -> int:
    return max(1, math.ceil(count / 2))


# -- the retry wave ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Wave:
    """A retry wave under one jitter: every rank's first re-join at the store after the
    fault, how far apart, the most in any WAVE_WINDOW_S (per second), and the recovery."""

    name: str
    jitter: tuple[float, float]
    rejoins: int
    spread_s: float
    peak_per_s: float
    recover_s: float   # every rank stepping again (nan: not within the trial)
    outcome: str


def rejoin_wave(events: Iterable[dict[str, Any]], window_s: float = WAVE_WINDOW_S) -> tuple[int, float, float]:
    """(re-joins, their spread, the most in any `window_s` per second) of every rank's first
    retry (`retry` attempt 1: the rank re-joining at the store)."""
    times = sorted(float(e["t"]) for e in events if e.get("kind") == RETRY and e.get("attempt") == 1)
    if not times:
        return 0, math.nan, math.nan
    most = max(bisect.bisect_right(times, t + window_s - 1e-9) - i for i, t in enumerate(times))
    return len(times), times[-1] - times[0], most / window_s


def wave_jitter(chosen: Candidate, waves: list[Wave]) -> tuple[float, float]:
    """The jitter to recommend: the candidate's where its wave recovered, else the document's."""
    own = next((w for w in waves if w.jitter == chosen.jitter), None)
    return chosen.jitter if own is None or own.outcome == "recovered" else tuple(DOCUMENT["jitter"])


# -- per fault ---------------------------------------------------------------------------------

BREAKER_SUFFIX = "_breaker"
TORCHRUN_SUFFIX = "_torchrun"   # a user's job: the chosen timeout under torchrun with the restarts chosen
CAME_BACK = ("recovered", "absorbed", "continued")


@dataclass(frozen=True)
class FaultResult:
    """One setting under one fault of --faults: what it did, by reports.metrics' definitions
    (times from the fault's start; nan: not observed)."""

    fault: str          # "link_down 10 s", "kill"
    heals: bool         # the fault ends by itself (a flap, a pause with a duration)
    setting: str        # the chosen candidate, it with a breaker, or a reference
    outcome: str
    detect_ranks: int
    first_s: float      # the first rank knew
    last_s: float       # the last rank that knew
    breaker_s: float    # the first breaker opened
    back_s: float       # every survivor stepping again (TTR)
    wasted_rank_s: float
    hang_cap_s: float
    stuck_in: str = ""  # a hung trial: where each process was at the cap (reports.stuck)


def breaker_verdict(results: Iterable[FaultResult], chosen: str) -> tuple[bool, str] | None:
    """(recommend the breaker, why) from the chosen candidate's runs without and with it;
    None when they did not run."""
    results = list(results)
    own = {r.fault: r for r in results if r.setting == chosen}
    guarded = {r.fault: r for r in results if r.setting == chosen + BREAKER_SUFFIX}
    if not guarded:
        return None
    for fault, r in own.items():
        b = guarded.get(fault)
        if b is not None and r.outcome in CAME_BACK and b.outcome not in CAME_BACK:
            return False, (f"no breaker: under {fault} it ended {b.outcome} where the retries alone brought every "
                           f"rank back ({r.outcome}" + (f" in {r.back_s:.2f} s)" if math.isfinite(r.back_s) else ")"))
    opened = [f"{fault} in {b.breaker_s:.2f} s" for fault, b in guarded.items() if math.isfinite(b.breaker_s)]
    return True, ("a breaker (policy isolation): under every fault of --faults it came back where the retries "
                  "alone did" + (f"; it opened under {', '.join(opened)}" if opened else ""))


def flap_warnings(results: Iterable[FaultResult], chosen: str) -> list[str]:
    """Each healing fault the chosen settings did not come back from where a reference did:
    a flap longer than the timeout ends a job whose failed collective is not retried."""
    results = list(results)
    out = []
    for r in results:
        if r.setting != chosen or not r.heals or r.outcome in CAME_BACK:
            continue
        ours = (chosen, chosen + BREAKER_SUFFIX, chosen + TORCHRUN_SUFFIX)
        back = [x.setting for x in results if x.fault == r.fault and x.outcome in CAME_BACK and x.setting not in ours]
        restarted = next((x for x in results if x.fault == r.fault and x.setting == chosen + TORCHRUN_SUFFIX
                          and x.outcome in CAME_BACK), None)
        if restarted is not None:
            out.append(f"Under {r.fault}, `{chosen}` ended {r.outcome}; under torchrun with the restarts recommended "
                       f"below it came back: every rank stepping again {restarted.back_s:.2f} s after the fault began.")
        elif back:
            out.append(f"Under {r.fault}, `{chosen}` ended {r.outcome} where {', '.join(back)} came back: a fault "
                       "that outlasts the timeout fails the collective, and only a retry brings the job back from "
                       "it. Retry failed steps in the job, or choose a timeout above the longest flap it must ride "
                       "out (`--faults` says which flaps are tried).")
    return out


def dead_host_notes(results: Iterable[FaultResult], chosen: str) -> list[str]:
    """Each fault for good under which the chosen timeout's torchrun side did not come back:
    torchrun's restarts wait for a host that is gone at a fixed --nnodes (the tune then tries
    --nnodes MIN:MAX: the table after this one)."""
    return [f"Under {r.fault}, torchrun's restarts did not bring the job back: a host gone for good leaves every "
            "other agent waiting in its next rendezvous for it (--nnodes fixed). `job.min_hosts` (torchrun's "
            "--nnodes MIN:MAX) lets the others go on without it: the next table." for r in results
            if r.setting == chosen + TORCHRUN_SUFFIX and not r.heals and r.outcome not in CAME_BACK]


# -- the failure detector -------------------------------------------------------------------

DETECTOR_MARGINS = (2.0, 5.0)   # 5: NVIDIA's resiliency extension's safety factor over observed intervals
MIN_HEARTBEATS = 4              # suspect_after is at least this many heartbeat periods
DETECTOR_DEFAULT = "detector_default"  # the elastic policies' own threshold (harness.job.policies)


@dataclass(frozen=True)
class DetectorCandidate:
    """A failure detector threshold for the elastic policies, with the rule that gave it."""

    name: str
    margin: float
    suspect_after: float
    rule: str


def detector_candidates(gaps: HeartbeatGaps, interval_s: float, margins: tuple[float, ...] = DETECTOR_MARGINS
                        ) -> tuple[DetectorCandidate, ...]:
    """suspect_after: a margin over the longest fault-free heartbeat gap, rounded up to a
    heartbeat period, at least MIN_HEARTBEATS periods; one per distinct value."""
    least = MIN_HEARTBEATS * interval_s
    found: dict[float, DetectorCandidate] = {}
    for margin in margins:
        threshold = max(round_up(margin * gaps.max_s, interval_s), round(least, 6))
        rule = (f"suspect_after {threshold:g} s: {margin:g} x the longest fault-free heartbeat gap "
                f"({gaps.max_s:.3f} s, rank {gaps.max_rank}, of {gaps.gaps} gaps) rounded up to the "
                f"{interval_s:g} s heartbeat period, at least {MIN_HEARTBEATS} periods")
        name = f"detector_{str(threshold).replace('.', '_').removesuffix('_0')}s"
        found.setdefault(threshold, DetectorCandidate(name, margin, threshold, rule))
    return tuple(found.values())


@dataclass
class DetectorEvidence:
    """One threshold's trials: fault-free control, then one rank stopped for good."""

    suspect_after: float
    false_trips: list[int] = field(default_factory=list)
    control_s: list[float] = field(default_factory=list)
    every_s: list[float] = field(default_factory=list)   # every other rank knew of the silent one (nan: not all)
    first_s: list[float] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)

    @property
    def passes(self) -> bool:
        return (bool(self.control_s) and not any(self.false_trips) and bool(self.every_s)
                and not any(math.isnan(t) for t in self.every_s))

    def detect_s(self) -> float:
        return statistics.median(self.every_s) if self.passes else math.inf


def choose_detector(evidence: dict[str, DetectorEvidence], candidates: Iterable[DetectorCandidate]) -> str | None:
    """Of the candidate thresholds that tripped nothing and with which every rank knew of
    the silent one in every trial, the one whose every rank knew soonest (ties: the larger
    threshold, the further from a false trip)."""
    passing = [c for c in candidates if c.name in evidence and evidence[c.name].passes]
    return min(passing, key=lambda c: (evidence[c.name].detect_s(), -c.suspect_after)).name if passing else None


def elastic_policy(c: Candidate, detector: DetectorCandidate | None, interval_s: float) -> dict[str, Any]:
    """The elastic policy with the chosen timeout, and the threshold (None: its default)."""
    return {"base": "elastic", "timeout": c.timeout,
            "detector": {"interval": interval_s, "suspect_after": detector.suspect_after} if detector else {}}


# -- the references measured beside the candidates ------------------------------------------

@dataclass(frozen=True)
class Reference:
    """A setting measured beside the candidates with the same rank gone silent: the
    document's 30 s, PyTorch's gloo default."""

    name: str
    timeout: float | None  # None: the job as written (its own, PyTorch's default unless it sets one)
    outcome: str
    detect_s: float       # every rank knew (nan: not every rank did within the trial)
    hang_cap_s: float
