"""`chaos tune`'s analysis: the job measured without faults, the candidate settings derived
from it by written rules, each candidate judged from its trials, the successive halving,
the recommendation and its report. Pure: values in, values and files out (the runs are
harness.run.tune's).

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
import json
import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

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


def _wave_lines(waves: list[Wave]) -> list[str]:
    if not waves:
        return []
    out = ["## A retry wave", "", "One rank frozen a little longer than the recommended timeout: every other rank fails "
           f"at once and re-joins at the store after its backoff. Re-joins per second: the most in any "
           f"{WAVE_WINDOW_S:g} s.", "", "| jitter | re-joins | over | re-joins per second, at most | every rank "
           "stepping again | outcome |", "|---|---|---|---|---|---|"]
    for w in waves:
        back = f"{w.recover_s:.2f} s" if not math.isnan(w.recover_s) else "not within the trial"
        over = f"{w.spread_s:.2f} s" if not math.isnan(w.spread_s) else "-"
        peak = f"{w.peak_per_s:g}" if not math.isnan(w.peak_per_s) else "-"
        out.append(f"| {w.jitter[0]:g}-{w.jitter[1]:g} s ({w.name}) | {w.rejoins} | {over} | {peak} | {back} | "
                   f"{w.outcome} |")
    return out + [""]


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


LEGEND = {BREAKER_SUFFIX: "`*_breaker`: the same settings with a breaker (policy isolation)",
          TORCHRUN_SUFFIX: "`*_torchrun`: the same timeout under torchrun with the --max-restarts (and store) "
                           "recommended below",
          "document": "`document`: the document's values (30 s, 3 retries from 2 s, a breaker)",
          "document_30s": "`document_30s`: the document's 30 s through the job's knob",
          "pytorch_default": "`pytorch_default`: PyTorch's gloo timeout (1800 s) and nothing else",
          "as_written": "`as_written`: the job as its command is written"}


def _stuck_lines(rows: Iterable[FaultResult | RestartResult], label: Callable[[Any], str]) -> list[str]:
    """Where each hung trial's processes were at its cap, read from outside (py-spy)."""
    hung = [r for r in rows if r.outcome == "hung" and r.stuck_in]
    if not hung:
        return []
    return (["Where the hung trials were at the cap (py-spy, from outside):", ""]
            + [f"- {label(r)}: stuck in: {r.stuck_in}" for r in hung] + [""])


def _seconds_or(value: float, missing: str = "-") -> str:
    return f"{value:.2f} s" if math.isfinite(value) else missing


def _wasted_and_outcome(outcome: str, wasted_rank_s: float, hang_cap_s: float) -> tuple[str, str]:
    """A table's wasted rank-seconds and outcome cells: a hung trial's, to the cap."""
    hung = outcome == "hung"
    wasted = ("-" if not math.isfinite(wasted_rank_s) else
              f">= {wasted_rank_s:.0f} (to the cap)" if hung else f"{wasted_rank_s:.0f}")
    return wasted, f"hung >= {hang_cap_s:g} s (cap)" if hung else outcome


def _outcome_table(columns: list[str], results: Iterable[FaultResult | RestartResult | HostsResult],
                   cells: Callable[[Any], list[str]], label: Callable[[Any], str]) -> list[str]:
    """A table of trials whose last two columns are wasted rank-seconds and the outcome (a
    hung one's to the cap), then where each hung trial was at its cap."""
    results = list(results)
    out = ["| " + " | ".join([*columns, "wasted rank-seconds", "outcome"]) + " |", "|---" * (len(columns) + 2) + "|"]
    for r in results:
        out.append("| " + " | ".join([*cells(r), *_wasted_and_outcome(r.outcome, r.wasted_rank_s, r.hang_cap_s)]) + " |")
    return out + [""] + _stuck_lines(results, label)


def _fault_lines(results: list[FaultResult], chosen: str | None) -> list[str]:
    if not results:
        return []
    settings = {r.setting for r in results}
    legend = [text for key, text in LEGEND.items() if key in settings or any(n.endswith(key) for n in settings)]
    out = ["## What the settings do, per fault", "", "One rank under each fault of --faults; times from the fault's start; "
           "wasted rank-seconds: every rank's stalls longer than 3 steps until it left or the trial ended "
           "(reports.metrics). " + "; ".join(legend) + ".", ""]
    out += _outcome_table(
        ["fault", "setting", "ranks that knew: first, last", "breaker opened", "every rank stepping again"], results,
        lambda r: [r.fault, r.setting, f"{r.first_s:.2f} s, {r.last_s:.2f} s ({r.detect_ranks} ranks)"
                   if r.detect_ranks else "none", _seconds_or(r.breaker_s), _seconds_or(r.back_s)],
        lambda r: f"{r.fault}, `{r.setting}`")
    verdict = breaker_verdict(results, chosen) if chosen else None
    warnings = (flap_warnings(results, chosen) + dead_host_notes(results, chosen)) if chosen else []
    said = ([f"{verdict[1][0].upper()}{verdict[1][1:]}."] if verdict else []) + warnings
    return out + [line for text in said for line in (text, "")]


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


def _detector_choice(f: "Findings") -> list[str]:
    if not f.detector_evidence:
        return []
    detector = f.chosen_detector
    if detector is None:
        return ["For the elastic policies: no threshold passed (each tripped in a fault-free control or missed the "
                "silent rank somewhere); keep the timeout alone, or give the detector a longer control.", ""]
    return [f"`{detector.name}` (the elastic policies' failure detector): {detector.rule}; of the thresholds that "
            "tripped nothing and with which every rank knew of the silent one, the one it knew soonest with.", ""]


def _detector_lines(f: "Findings") -> list[str]:
    if f.gaps is None:
        return []
    g = f.gaps
    out = ["## The failure detector (elastic policies)", "",
           f"Fault-free heartbeat gaps at the control plane: {g.gaps} over {g.watched_s:.0f} s, median "
           f"{g.quantile_s(0.5):.3f} s, p99 {g.quantile_s(0.99):.3f} s, max {g.max_s:.3f} s (rank {g.max_rank}). "
           "Each threshold below ran an elastic policy: a fault-free control (a suspicion there is a false trip), "
           "then one rank stopped for good.", ""]
    if not f.detector_evidence:
        return out + ["(not run: the budget ended first, or no chosen timeout)", ""]
    out += ["| threshold | suspect_after | false trips (controls) | every rank knew of a silent rank | passes |",
            "|---|---|---|---|---|"]
    for name, e in f.detector_evidence.items():
        known = [t for t in e.every_s if not math.isnan(t)]
        knew = (f"median {statistics.median(known):.2f} s of {len(e.every_s)}" if len(known) == len(e.every_s)
                else f"{len(known)} of {len(e.every_s)} trials")
        out.append(f"| {name} | {e.suspect_after:g} s | {sum(e.false_trips)} in {sum(e.control_s):.0f} s over "
                   f"{len(e.control_s)} controls | {knew} | {'yes' if e.passes else 'no'} |")
    return out + [""]


# -- torchrun's restarts (a user's job with job.tune.max_restarts: torchrun) -----------------

RESTART_EPISODES = 3      # fault episodes a run rides out by restarting: torchrun's default before 1.10
RESTART_EXTRA_S = 3.0     # the pause outlasts the timeout by this: every collective times out, every agent restarts
# torchrun's workers meet on the rendezvous's own store by default, their keys told apart by
# each agent's own restart count, which agents that restarted for different reasons do not
# share (pytorch/pytorch#135712, #108158); with this set, each round's workers get a store of their own
OWN_STORE_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


@dataclass(frozen=True)
class RestartResult:
    """The job under torchrun with one --max-restarts, after a pause longer than its timeout
    (times from the fault's start; nan: not observed)."""

    setting: str
    max_restarts: int
    own_store: bool           # OWN_STORE_ENV set
    outcome: str
    used: int                 # the most restarts one host's agent made (its worker processes begun after the fault)
    back_s: float             # every rank stepping again (TTR)
    wasted_rank_s: float
    hang_cap_s: float
    stuck_in: str = ""        # a hung trial: where each process was at the cap (reports.stuck)


def restarts_used(events: Iterable[dict[str, Any]], since: float) -> int:
    """The most restarts one rank's agent spent at or after `since`: the rise in torchrun's
    restart count its processes began with (rank_start `restart`; an agent that restarts
    for a host that joined spends none), or where that is not recorded (run folder format
    11 and before) the processes it began, each restart starting every worker of the host."""
    before: dict[int, int] = {}
    after: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("kind") == "rank_start":
            rank = int(e["rank"])
            if float(e["t"]) >= since:
                after.setdefault(rank, []).append(e)
            elif e.get("restart") is not None:
                before[rank] = max(before.get(rank, 0), int(e["restart"]))
    spent = [max(int(e["restart"]) for e in starts) - before.get(rank, 0)
             if all(e.get("restart") is not None for e in starts) else len(starts) for rank, starts in after.items()]
    return max(spent, default=0)


def restart_choice(results: Iterable[RestartResult]) -> RestartResult | None:
    """Of the sides with restarts that brought every rank back, torch's own store first (no
    environment to set), then the soonest back."""
    back = [r for r in results if r.max_restarts and r.outcome in CAME_BACK]
    return min(back, key=lambda r: (r.own_store, r.back_s)) if back else None


def max_restarts_of(r: RestartResult) -> tuple[int, str]:
    """--max-restarts and its rule: an agent's restarts per episode (measured) times RESTART_EPISODES."""
    per_episode = max(r.used, 1)
    n = per_episode * RESTART_EPISODES
    return n, (f"--max-restarts {n}: {RESTART_EPISODES} fault episodes a run rides out (torchrun's default before "
               f"1.10) x {per_episode} restart(s) the most-restarted agent made for one (measured: a pause "
               f"{RESTART_EXTRA_S:g} s longer than the timeout); torchrun counts restarts per agent and never "
               "gives one back" + ("" if n == r.max_restarts else f" (the trial ran --max-restarts {r.max_restarts})"))


def _restart_lines(results: list[RestartResult]) -> list[str]:
    if not results:
        return []
    return ["## torchrun's restarts", "", f"The chosen timeout under torchrun, one rank paused {RESTART_EXTRA_S:g} s "
            "longer than it: every worker's collective times out and each agent restarts its workers; times from "
            "the pause's start. Own store: " + ", ".join(f"{k}={v}" for k, v in OWN_STORE_ENV.items()) + ".",
            ""] + _outcome_table(
        ["setting", "--max-restarts", "store", "restarts (most by one agent)", "every rank stepping again"], results,
        lambda r: [r.setting, str(r.max_restarts), "own" if r.own_store else "shared (default)", str(r.used),
                   _seconds_or(r.back_s)], lambda r: f"`{r.setting}`")


def _store_env(own_store: bool) -> str:
    """What goes before `torchrun` on the command line to paste: the own store's variable, or nothing."""
    return " ".join(f"{k}={v}" for k, v in OWN_STORE_ENV.items()) + " " if own_store else ""


def _restart_choice_lines(results: list[RestartResult]) -> list[str]:
    if not results:
        return []
    chosen = restart_choice(results)
    if chosen is None:
        return ["Under torchrun, no --max-restarts tried brought every rank back after the pause: the job's "
                "restarts do not recover it here; see the table above and each trial's logs (torchrun's own).", ""]
    n, rule = max_restarts_of(chosen)
    shared = [r for r in results if r.max_restarts and not r.own_store]
    env = _store_env(chosen.own_store)
    if chosen.own_store:
        rule += (f"; {env.strip()}: with the shared store the restarted job ended "
                 + ", ".join(r.outcome for r in shared) + " where its own store brought it back")
    return [f"For torchrun: {rule}; every rank stepped again {chosen.back_s:.2f} s after the pause began.", "",
            "```sh", f"{env}torchrun --max-restarts {n} ...", "```", ""]


# -- a host gone for good (a user's job under torchrun) ----------------------------------------

MIN_HOSTS_SUFFIX = "_min_hosts"              # torchrun --nnodes N-1:N with the rendezvous settings derived below
TORCH_RDZV_SUFFIX = "_min_hosts_torch_rdzv"  # the same with torch's rendezvous defaults (a reference)
# torch's c10d rendezvous (dynamic_rendezvous.create_handler): an agent that stops writing its
# keep-alive is dropped interval x attempts after its last one; once the fewest hosts allowed
# have joined, the rendezvous waits last_call for more before it closes
TORCH_RDZV = {"keep_alive_interval": 5, "keep_alive_max_attempt": 3, "last_call_timeout": 30}
KEEP_ALIVE_S = 1         # the smallest --rdzv-conf takes (whole seconds)
MIN_LAST_CALL_S = 2


def rdzv_wait_s(conf: dict[str, int]) -> float:
    """How long a rendezvous waits for a host that is gone before it closes without it."""
    merged = {**TORCH_RDZV, **conf}
    return merged["keep_alive_interval"] * merged["keep_alive_max_attempt"] + merged["last_call_timeout"]


def rdzv_conf_for(measured: FaultFree) -> tuple[dict[str, int], str]:
    """--rdzv-conf for a job that goes on without a host, and its rule."""
    wait = max(measured.max_s, measured.step_period_s)
    last_call = max(MIN_LAST_CALL_S, math.ceil(2 * wait))
    attempts = TORCH_RDZV["keep_alive_max_attempt"]
    return ({"keep_alive_interval": KEEP_ALIVE_S, "last_call_timeout": last_call},
            f"keep_alive_interval {KEEP_ALIVE_S} s: a gone agent is dropped {KEEP_ALIVE_S * attempts} s "
            f"({attempts} missed keep-alives, torch's count) after its last one, not "
            f"{TORCH_RDZV['keep_alive_interval'] * attempts} s; last_call_timeout {last_call} s: twice the longest "
            f"fault-free wait ({wait:.3f} s), whole seconds, at least {MIN_LAST_CALL_S} s (the survivors fail "
            "within a step of each other and their agents see it within 0.1 s; one later than the last call "
            f"is not lost, it costs another restart), not {TORCH_RDZV['last_call_timeout']} s")


@dataclass(frozen=True)
class HostsResult:
    """The job under torchrun with --nnodes MIN:MAX after a host went for good (times from
    the fault's start; nan: not observed)."""

    fault: str
    setting: str
    min_hosts: int
    hosts: int
    rdzv_conf: dict[str, int]  # --rdzv-conf ({}: torch's defaults)
    outcome: str
    world: int | None          # the hosts in the last group formed after the fault
    used: int                  # the most restarts one agent made
    back_s: float              # every survivor stepping again (TTR)
    wasted_rank_s: float
    hang_cap_s: float
    stuck_in: str = ""


def hosts_choice(results: Iterable[HostsResult]) -> tuple[HostsResult, ...]:
    """The rows of the setting that went on without the host under every fault tried, the
    soonest back under its slowest fault (empty: no setting did)."""
    by_setting: dict[str, list[HostsResult]] = {}
    for r in results:
        by_setting.setdefault(r.setting, []).append(r)
    back = [tuple(rows) for rows in by_setting.values() if all(r.outcome in CAME_BACK for r in rows)]
    return min(back, key=lambda rows: max(r.back_s for r in rows), default=())


def _conf_text(conf: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in conf.items()) if conf else "torch's defaults"


def _hosts_lines(results: list[HostsResult]) -> list[str]:
    if not results:
        return []
    first = results[0]
    return ["## A host gone for good, under torchrun", "",
            f"The chosen timeout under torchrun with the --max-restarts and store recommended, and --nnodes "
            f"{first.min_hosts}:{first.hosts} (job.min_hosts {first.min_hosts}): the job may go on without one host; "
            "how many it may lose is yours to choose (its batch, its memory per rank). Times from the fault's start.",
            ""] + _outcome_table(
        ["fault", "setting", "--rdzv-conf", "hosts after", "restarts (most by one agent)", "every rank stepping again"],
        results, lambda r: [r.fault, r.setting, _conf_text(r.rdzv_conf), "-" if r.world is None else str(r.world),
                            str(r.used), _seconds_or(r.back_s)], lambda r: f"{r.fault}, `{r.setting}`")


def _hosts_choice_lines(results: list[HostsResult], restarts: list[RestartResult], measured: FaultFree) -> list[str]:
    if not results:
        return []
    rows = hosts_choice(results)
    if not rows:
        faults = ", ".join(dict.fromkeys(r.fault for r in results))
        return [f"Under {faults}, no --nnodes {results[0].min_hosts}:{results[0].hosts} setting tried brought the "
                "other hosts back every time: see the table above and each trial's logs (torchrun's own).", ""]
    chosen = rows[0]
    defaults = {r.fault: r for r in results if not r.rdzv_conf}
    said = []
    for r in rows:
        default = defaults.get(r.fault)
        beside = ("" if default is None or default.setting == r.setting else
                  f" (torch's rendezvous defaults: {_seconds_or(default.back_s, 'not back')}, {default.outcome})")
        said.append(f"under {r.fault} the others went on as {r.world} host{'' if r.world == 1 else 's'}, every "
                    f"rank stepping again {r.back_s:.2f} s after the fault began{beside}")
    why = rdzv_conf_for(measured)[1] if chosen.rdzv_conf else "torch's rendezvous defaults (the faster settings did not bring it back)"
    restart = restart_choice(restarts)
    n = max_restarts_of(restart)[0] if restart else chosen.used
    env = _store_env(bool(restart and restart.own_store))
    conf = f" --rdzv-conf {_conf_text(chosen.rdzv_conf)}" if chosen.rdzv_conf else ""
    went_on = "; ".join(said)
    return [f"For a host gone for good: --nnodes {chosen.min_hosts}:{chosen.hosts}; {why}. "
            f"{went_on[0].upper()}{went_on[1:]}.",
            "", "```sh", f"{env}torchrun --nnodes {chosen.min_hosts}:{chosen.hosts} --max-restarts {n}{conf} ...",
            "```", ""]


# -- the recommendation -----------------------------------------------------------------------

@dataclass(frozen=True)
class Reference:
    """A setting measured beside the candidates with the same rank gone silent: the
    document's 30 s, PyTorch's gloo default."""

    name: str
    timeout: float | None  # None: the job as written (its own, PyTorch's default unless it sets one)
    outcome: str
    detect_s: float       # every rank knew (nan: not every rank did within the trial)
    hang_cap_s: float


@dataclass(frozen=True)
class Findings:
    """Everything a tune found, as its report and its JSON say it."""

    measured: FaultFree
    candidates: tuple[Candidate, ...]
    evidence: dict[str, Evidence]
    chosen: str | None
    references: list[Reference]
    transient_s: float
    stopped_early: str | None = None
    variant: dict[str, Any] | None = None   # a user's job: the chosen candidate's `variants:` entry
    hogs: int = 0                           # busy CPU processes beside every stage
    waves: list[Wave] = field(default_factory=list)             # the chosen candidate's retry waves
    per_fault: list[FaultResult] = field(default_factory=list)  # it and the references under --faults
    gaps: HeartbeatGaps | None = None                           # fault-free heartbeat gaps (the built-in workload)
    detectors: tuple[DetectorCandidate, ...] = ()
    detector_evidence: dict[str, DetectorEvidence] = field(default_factory=dict)  # with the default's
    detector_interval_s: float = 0.0
    restarts: list[RestartResult] = field(default_factory=list)  # a user's job under torchrun (job.tune.max_restarts)
    hosts: list[HostsResult] = field(default_factory=list)       # ... and with --nnodes MIN:MAX after a host went

    @property
    def chosen_detector(self) -> DetectorCandidate | None:
        name = choose_detector(self.detector_evidence, self.detectors)
        return next((d for d in self.detectors if d.name == name), None)


def recommendation_text(f: Findings) -> str:
    """tune.md: the measurement, the candidates with their rules and evidence, the
    references measured beside them, the retry wave, what the settings do per fault, and
    the choice with the lines to paste."""
    measured, cands, evidence, chosen, references, transient, stopped_early, variant, hogs, waves = (
        f.measured, f.candidates, f.evidence, f.chosen, f.references, f.transient_s, f.stopped_early, f.variant,
        f.hogs, f.waves)
    busy = f" Every stage ran beside {hogs} busy CPU process(es) (--hogs {hogs}): a busy node." if hogs else ""
    out = ["# chaos tune", "", f"Fault-free: {measured.line()}.{busy}", ""]
    if stopped_early:
        out += [f"**Stopped early: {stopped_early}.** What follows is what the trials run so far show.", ""]
    out += ["## Candidates", "", "| candidate | timeout | false trips (controls) | transient "
            f"{transient:g} s absorbed | every rank knew of a silent rank | passes |", "|---|---|---|---|---|---|"]
    for c in cands:
        e = evidence.get(c.name, Evidence())
        absorbed = (f"{sum(1 for d in e.transient_detected if d == 0)} of {len(e.transient_detected)}"
                    if e.transient_detected else "not run")
        known = [t for t in e.silent_detected_s if not math.isnan(t)]
        detect = (f"median {statistics.median(known):.2f} s of {len(e.silent_detected_s)}" if known else
                  ("not every rank" if e.silent_detected_s else "not run"))
        out.append(f"| {c.name} | {c.timeout:g} s ({c.margin:g} x) | {sum(e.false_trips)} in "
                   f"{sum(e.control_s):.0f} s over {len(e.control_s)} controls | {absorbed} | {detect} | "
                   f"{'yes' if e.passes else 'no'} |")
    out += ["", "## Beside them, the same rank gone silent", "", "| setting | timeout | every rank knew | outcome |",
            "|---|---|---|---|"]
    if not references:
        out.append("| (not run: --no-references, or the budget ended first) | | | |")
    for r in references:
        known = f"{r.detect_s:.2f} s" if not math.isnan(r.detect_s) else f"not within the trial (hung >= {r.hang_cap_s:g} s cap)"
        setting = f"{r.timeout:g} s" if r.timeout is not None else "the job's own"
        out.append(f"| {r.name} | {setting} | {known} | {r.outcome} |")
    out += ["", *_wave_lines(waves), *_restart_lines(f.restarts), *_fault_lines(f.per_fault, chosen),
            *_hosts_lines(f.hosts), *_detector_lines(f), "## Recommended", ""]
    if chosen is None:
        out += ["No candidate passed: every one tripped in a fault-free control or detected a transient "
                "shorter than its timeout. Give the job a longer control (--control) or look at its slow steps."]
        return "\n".join(out) + "\n"
    c = next(c for c in cands if c.name == chosen)
    if variant is not None:
        how = (" ".join(variant["args"]) + " on its command line" if "args" in variant else
               ", ".join(f"{k}={v}" for k, v in variant["env"].items()) + " in its environment")
        return "\n".join(out + [
            f"`{c.name}`: " + "; ".join(c.rules) + ".", "", f"For your job: {how} (job.tune.timeout). In the "
            "script, that is the timeout of the process group its training collectives use:", "", "```python",
            "from datetime import timedelta", f"timeout = timedelta(seconds={c.timeout:g})",
            "dist.init_process_group(backend, timeout=timeout)  # or a group made for training after start-up",
            "```", "", "As a variant of the scenario:", "", "```yaml", "variants:",
            f"  {c.name}: {json.dumps(variant)}", "```", "", *_restart_choice_lines(f.restarts),
            *_hosts_choice_lines(f.hosts, f.restarts, f.measured)])
    jitter = wave_jitter(c, waves)
    if jitter != c.jitter:
        c = replace(c, jitter=jitter, rules=(*c.rules, f"jitter {jitter[0]:g}-{jitter[1]:g} s, the document's: "
                                                       "the narrower one's retry wave did not recover"))
    verdict = breaker_verdict(f.per_fault, c.name)
    breaker = bool(verdict and verdict[0])
    if verdict:
        c = replace(c, rules=(*c.rules, verdict[1]))
    detector = f.chosen_detector
    elastic = ([f"  {c.name}_elastic: {json.dumps(elastic_policy(c, detector, f.detector_interval_s))}"]
               if detector else [])
    out += [f"`{c.name}`: " + "; ".join(c.rules) + ".", "", *_detector_choice(f), "For the scenario:", "",
            "```yaml", "policies:", f"  {c.name}: {json.dumps(c.policy(breaker))}", *elastic, "```", "",
            "For your own job:", "", "```python",
            "from datetime import timedelta",
            f"dist.init_process_group(backend, timeout=timedelta(seconds={c.timeout:g}))",
            f"# retry a failed step up to {c.max_retries} times, waiting {c.backoff_base:g} s x 2^attempt "
            f"(at most {c.backoff_cap:g} s) + uniform({c.jitter[0]:g}, {c.jitter[1]:g}) s"
            + ("; when they run out or the\n# control plane cannot be reached, free what the rank holds and leave "
               "(the breaker)" if breaker else ""), "```", ""]
    return "\n".join(out) + "\n"


def write_tradeoff(path: Path, f: Findings) -> None:
    """The picture: every rank's time to know of a silent rank against the margin over the
    longest fault-free step, per candidate (a cross where it tripped or missed a transient),
    with the document's and PyTorch's default as lines."""
    cands, evidence, references = f.candidates, f.evidence, f.references
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for c in cands:
        e = evidence.get(c.name)
        if e is None or not e.silent_detected_s:
            continue
        y = e.detect_s()
        ax.scatter([c.margin], [y if math.isfinite(y) else c.timeout], marker="o" if e.passes else "x",
                   color="tab:green" if e.passes else "tab:red", zorder=3)
        ax.annotate(f"{c.timeout:g} s", (c.margin, y if math.isfinite(y) else c.timeout),
                    textcoords="offset points", xytext=(5, 5), fontsize=8)
    for r in references:
        y = r.detect_s if not math.isnan(r.detect_s) else r.hang_cap_s
        ax.axhline(y, linestyle="--", color="tab:gray")
        ax.text(0.99, y, f"{r.name}: " + (f"{y:.1f} s" if not math.isnan(r.detect_s) else f">= {y:g} s (cap)"),
                transform=ax.get_yaxis_transform(), ha="right", va="bottom", fontsize=8)
    ax.set_xscale("log")
    margins = sorted({c.margin for c in cands})
    ax.set_xticks(margins, [f"{m:g}x" for m in margins])
    ax.minorticks_off()
    ax.set_xlabel("timeout as a multiple of the longest fault-free wait")
    ax.set_ylabel("every rank knew of a silent rank (s)")
    ax.set_title("chaos tune: detection against margin (o passes, x tripped or missed a transient)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _max_restarts_json(results: list[RestartResult]) -> dict[str, Any] | None:
    chosen = restart_choice(results)
    if chosen is None:
        return None
    n, rule = max_restarts_of(chosen)
    return {"max_restarts": n, "env": OWN_STORE_ENV if chosen.own_store else {}, "from": chosen.setting, "rule": rule}


def _min_hosts_json(results: list[HostsResult], measured: FaultFree) -> dict[str, Any] | None:
    rows = hosts_choice(results)
    if not rows:
        return None
    chosen = rows[0]
    return {"min_hosts": chosen.min_hosts, "rdzv_conf": chosen.rdzv_conf, "from": chosen.setting,
            "rule": rdzv_conf_for(measured)[1] if chosen.rdzv_conf else "torch's rendezvous defaults"}


def tune_json(f: Findings) -> str:
    verdict = breaker_verdict(f.per_fault, f.chosen) if f.chosen else None
    return json.dumps({"fault_free": asdict(f.measured), "candidates": [asdict(c) for c in f.candidates],
                       "evidence": {k: asdict(v) for k, v in f.evidence.items()}, "chosen": f.chosen,
                       "references": [asdict(r) for r in f.references], "waves": [asdict(w) for w in f.waves],
                       "per_fault": [asdict(r) for r in f.per_fault],
                       "breaker": None if verdict is None else {"recommended": verdict[0], "why": verdict[1]},
                       "warnings": flap_warnings(f.per_fault, f.chosen) if f.chosen else [],
                       "heartbeat_gaps": None if f.gaps is None else json.loads(f.gaps.to_json()),
                       "detectors": [asdict(d) for d in f.detectors],
                       "detector_evidence": {k: asdict(v) for k, v in f.detector_evidence.items()},
                       "detector": None if f.chosen_detector is None else f.chosen_detector.name,
                       "restarts": [asdict(r) for r in f.restarts],
                       "max_restarts": _max_restarts_json(f.restarts),
                       "hosts": [asdict(r) for r in f.hosts], "min_hosts": _min_hosts_json(f.hosts, f.measured),
                       "stopped_early": f.stopped_early}, indent=1, default=str)

