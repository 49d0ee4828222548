"""Scenario files: one YAML file is one experiment, validated once into frozen values.

    name: link-down                     # defaults to the file name
    description: ...
    seed: 1                             # all randomness (jitter, target choice) comes from it
    cluster: {ranks: 16, backend: netns, device: auto, comm: auto,  # auto: harness.job.device
              sysctls: {net.ipv4.neigh.eth0.retrans_time_ms: 100}}  # each host's own (chaos.sysctl)
    workload: {step_period: 250ms, checkpoint_every: 10,
               gloo_lazy_init: false}   # true: gloo connects pairs on first use (docs/scale.md)
    warmup_steps: 8                     # steps every rank completes before the first fault
    groups: {left: [0, 1, 2, 3]}        # named sets of ranks, for targets
    faults:                             # the timeline, offsets after warm-up
      - {kind: link_down, target: {rank: 5}, start: 2s, duration: 20s}
      - {kind: loss, percent: "20%", target: {count: "25%"}, start: 30s, duration: 10s}
      - {kind: link_down, target: {ranks: [1, 2]}, start: 50s, duration: 12s,
         pulses: {on_for: 2s, off_for: 4s}}            # flapping: on 2 s, off 4 s, ...
    hang_cap: 30s                       # no step and no policy action this long = hung
    settle_steps: 8                     # steps every live rank makes after the faults end
    stacks_at_detect: false             # true: where every rank was at each fault's first detection
    policies:                           # the policies to compare, with overrides
      baseline: {}
      timeout: {timeout: 5s}
    expect:                             # what each policy is expected to do
      timeout: {outcome: failed-fast, detect_within: 7s}
      elastic: {suspects_at_most: 0}    # the failure detector's suspect events (0: no false alarm)
    tier: {timeout: nightly}            # where a trial runs (harness.scenario.tiers; default ci); all: tier: nightly

Instead of the harness's runner and its policies, a scenario may run the user's own job
(harness.cluster.userjob; docs/own-job.md), one trial per variant:

    job: {command: [python, train.py], workdir: ., env: {}, launcher: direct, max_restarts: 0,
          step_pattern: null, start_timeout: 300s, start: preloaded, preload: []}
    variants: {default: {}, timeout_60s: {args: [--timeout, "60"], env: {...}}}

A target is exactly one of: `rank: 5`, `ranks: [1, 2]`, `group: left`, `count: 2` or
`count: "25%"` (that many ranks, chosen with the scenario's seed). `chaos schema` prints
the JSON Schema of this format. Errors name the file, the line, the field, the value given
and the accepted form (harness.scenario.yaml_errors). harness.scenario.scaling stretches a scenario's
times for more than 8 ranks per core (`chaos run --ranks`; docs/scale.md); harness.scenario.schema
is the format as a JSON Schema.
"""
from __future__ import annotations

import math
import random
import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, Mapping, Sequence

import yaml
from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag,
                      ValidationError, field_validator, model_validator)

from chaos import sysctl, units
from chaos.errors import UsageError
from chaos.faults import FAULT_KINDS, MONITORS, Fault, Seconds, kind_names
from chaos.reach import why_unreadable
from chaos.topology import host_index, host_name
from harness.cluster.backends import BACKEND_NAMES, DEFAULT_BACKEND, backends_with, traits_of
from harness.cluster.userjob import TRIAL_DIR_FIELD, JobSpec, JobVariant
from harness.job.config import WorkloadSpec
from harness.job.policies import POLICY_NAMES, PolicySpec, policy_spec
from harness.scenario.anchors import ANCHOR_EVENTS, ANCHOR_NAMES, CHECKPOINT_ANCHORS
from harness.scenario.tiers import DEFAULT_TIER, TIERS
from harness.scenario.yaml_errors import TARGET_FORM, describe_errors, duplicate_keys, line_of
from runfolder.plan import OUTCOMES, STATE_VERDICTS

TIMING_FIELDS = ("target", "start", "duration", "pulses")
FAULT_CLASSES = dict(zip(kind_names(), FAULT_KINDS, strict=True))
JOB_TRIAL = "job"  # the one trial of a user's job without variants
TIER_FORM = "give one tier for every trial (tier: nightly) or one per trial (tier: {retry: nightly})"


def _finite(seconds: float) -> float:
    if not math.isfinite(seconds):
        raise ValueError(f"{seconds!r} is not a finite time; expected {units.DURATION_FORM}")
    return seconds


def _positive(seconds: float) -> float:
    if seconds <= 0:
        raise ValueError(f"must be above 0; expected {units.DURATION_FORM}")
    return seconds


Time = Annotated[Seconds, AfterValidator(_finite)]
Span = Annotated[Seconds, AfterValidator(_finite), AfterValidator(_positive)]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# Every backend plugs all ranks into one Linux bridge (a netns switch or a docker network),
# and a bridge takes at most 1023 ports (BR_MAX_PORTS - 1); one rank is one port.
BRIDGE_MAX_PORTS = 1023
SEED_MAX = 2**64 - 1  # numpy and torch generators take seeds below 2^64
# A scenario's name names its run folder under --out: one plain path component.
NAME_FORM = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
HOST_NAME = re.compile(r"r\d{3,}")


def _setting_text(value: Any) -> Any:
    # YAML reads `retrans_time_ms: 100` as a number; /proc/sys takes text (a list: tcp_rmem's three)
    def text(v: Any) -> Any:
        if isinstance(v, list):
            return " ".join(map(str, v))
        return v if v is None or isinstance(v, str) else str(int(v) if isinstance(v, bool) else v)

    return {k: text(v) for k, v in value.items()} if isinstance(value, dict) else value


class SlurmConfig(Frozen):
    """The allocation a trial asks Slurm for (the slurm backend): `chaos run`'s --partition,
    --account, --time and --slurm-arg set these too."""

    partition: str | None = None
    account: str | None = None
    time: str | None = Field(default=None, description="sbatch's --time, e.g. 10:00 (a time limit per trial)")
    args: tuple[str, ...] = Field(default=(), description="more sbatch arguments, passed as they are")

    def sbatch_args(self) -> tuple[str, ...]:
        named = [(f"--{key}", value) for key, value in (("partition", self.partition), ("account", self.account),
                                                        ("time", self.time)) if value]
        return tuple(word for pair in named for word in pair) + self.args


class ClusterConfig(Frozen):
    ranks: Annotated[int, Field(ge=2)] = 16
    ranks_per_node: Annotated[int, Field(ge=1, description="ranks that share a host (a Slurm node): "
                                                           "consecutive ranks, a link fault hits them all")] = 1
    slurm: SlurmConfig | None = None
    backend: Literal[BACKEND_NAMES] = DEFAULT_BACKEND  # type: ignore[valid-type]  (harness.cluster.backends)
    # harness.job.device.choose picks from these and the host's GPUs when the run starts
    device: Literal["cpu", "cuda", "auto"] = "auto"
    comm: Literal["gloo", "nccl", "auto"] = "auto"
    sysctls: Annotated[dict[Annotated[str, AfterValidator(sysctl.check_key)], str],
                       BeforeValidator(_setting_text)] = Field(
        default={}, description="every host's own net.* settings, as on your nodes "
                                "(net.ipv4.neigh.eth0.retrans_time_ms: 100); chaos.sysctl")
    store: Literal["switch", "host"] = Field(
        default="switch", description="where the rendezvous store (the runner's, or torchrun's and ft_launcher's "
        "agents') and the failure detector run: on the switch, which every rank reaches over its own link "
        "(default), or on the cluster's last host, a fault target of its own (kill, pause, its link); the other "
        "hosts are the ranks")

    @field_validator("ranks")
    @classmethod
    def _fits_one_bridge(cls, value: int) -> int:
        if value > BRIDGE_MAX_PORTS:
            raise ValueError(f"{value} ranks do not fit one Linux bridge (at most {BRIDGE_MAX_PORTS} "
                             "ports, one per rank); use at most that many")
        return value


class Target(Frozen):
    """Which ranks a fault hits: exactly one of the fields."""

    rank: Annotated[int, Field(ge=0)] | None = None
    ranks: Annotated[tuple[Annotated[int, Field(ge=0)], ...], Field(min_length=1)] | None = None
    group: str | None = Field(default=None, description="a name under the scenario's 'groups'")
    count: Annotated[int, Field(ge=1)] | str | None = Field(
        default=None, description='that many ranks (2) or that share of them ("25%"), chosen with the seed')

    @field_validator("count")
    @classmethod
    def _count_form(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, str):
            share = units.parse_percent(value)
            if share <= 0:
                raise ValueError(f"{value!r} chooses no rank; expected a share above 0%")
        return value

    @field_validator("ranks")
    @classmethod
    def _distinct(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError(f"rank {next(r for r in value if value.count(r) > 1)} is listed twice")
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> "Target":
        given = [name for name in ("rank", "ranks", "group", "count") if getattr(self, name) is not None]
        if len(given) != 1:
            got = f"got {' and '.join(given)}" if given else "got none"
            raise ValueError(f"{TARGET_FORM}; exactly one ({got})")
        return self

    def size(self, world: int) -> int:
        """How many ranks `count` chooses in a cluster of `world` ranks."""
        if isinstance(self.count, str):
            return max(1, round(units.parse_percent(self.count) * world))
        return int(self.count or 0)


class Pulses(Frozen):
    """On/off cycles within the fault's duration (a flapping link): on for `on_for`, healed
    for `off_for`, again, until the duration ends (the last on-phase is cut at the end)."""

    on_for: Span
    off_for: Span

    @model_validator(mode="before")
    @classmethod
    def _yaml_booleans(cls, data: Any) -> Any:
        if isinstance(data, dict) and any(isinstance(k, bool) for k in data):
            raise ValueError("YAML reads the keys on and off as booleans; write on_for: and off_for:")
        return data


class AnchorSpec(Frozen):
    """A start on an event (harness.scenario.anchors): `delay` after the `nth` `on` event since
    warm-up of the first process to see it (or of rank `rank`); not applied if it has not
    come `within` after warm-up (default: the hang cap after the last fault at a time)."""

    on: Literal[ANCHOR_NAMES] = Field(description="; ".join(  # type: ignore[valid-type]
        f"{e.name}: {e.meaning}" for e in ANCHOR_EVENTS.values()))
    nth: Annotated[int, Field(ge=1)] = 1
    delay: Time = 0.0
    rank: Annotated[int, Field(ge=0)] | None = Field(default=None, description="only this rank's events count")
    within: Span | None = Field(default=None, description="how long after warm-up the event is waited for")

    @model_validator(mode="before")
    @classmethod
    def _yaml_on(cls, data: Any) -> Any:
        # YAML 1.1 reads the key `on` as the boolean true: it is the anchor's event all the same
        if isinstance(data, dict) and True in data and "on" not in data:
            return {("on" if k is True else k): v for k, v in data.items()}
        return data


def _start_form(value: Any) -> str:
    return "event" if isinstance(value, (dict, AnchorSpec)) else "seconds"


Start = Annotated[Annotated[Time, Tag("seconds")] | Annotated[AnchorSpec, Tag("event")], Discriminator(_start_form)]


class FaultEvent(Frozen):
    """One entry of the timeline: what (fault), where (target), when (start, duration, pulses).
    In a file it is one flat mapping: the fault's kind and parameters next to the timing."""

    fault: Fault
    target: Target
    start: Start = 0.0            # seconds after warm-up, or {on: EVENT, nth, delay, rank, within}
    duration: Span | None = None  # None: the fault never heals within the trial
    pulses: Pulses | None = None

    @model_validator(mode="before")
    @classmethod
    def _split(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "fault" in data:
            return data
        kind = data.get("kind")
        if kind not in kind_names():
            problem = "missing" if kind is None else f"unknown fault kind {kind!r}"
            raise ValueError(f"kind: {problem}; expected one of {', '.join(kind_names())}")
        timing = {k: data[k] for k in TIMING_FIELDS if k in data}
        fault = {k: v for k, v in data.items() if k not in timing}
        if "duration" in timing and "duration" in FAULT_CLASSES[kind].model_fields:
            fault["duration"] = timing["duration"]  # a kind that plays its own length (gpu_hang)
        return {**timing, "fault": fault}

    @model_validator(mode="after")
    def _timing_fits_kind(self) -> "FaultEvent":
        kind = self.fault.kind
        if not self.fault.reversible and self.duration is not None:
            raise ValueError(f"duration: a {kind} fault cannot be undone; remove 'duration'")
        if self.pulses is not None:
            if kind == "gpu_hang":
                raise ValueError("pulses: a gpu_hang is one kernel that cannot be stopped once queued; "
                                 "give one fault per hang instead of pulses")
            if self.duration is None:
                raise ValueError("pulses: cycles need a 'duration' to repeat within")
            cycle = self.pulses.on_for + self.pulses.off_for
            if cycle > self.duration:
                raise ValueError(f"pulses: one cycle (on_for + off_for = {units.format_duration(cycle)}) "
                                 f"is longer than the duration {units.format_duration(self.duration)}; "
                                 "make the duration at least one cycle or drop 'pulses'")
        return self

    @property
    def anchor(self) -> AnchorSpec | None:
        return self.start if isinstance(self.start, AnchorSpec) else None

    @property
    def offset(self) -> float:
        """When it starts: seconds after warm-up, or after its anchor's event (the delay)."""
        return self.start.delay if isinstance(self.start, AnchorSpec) else self.start

    def clock(self) -> tuple[str, int, int | None] | None:
        """What its offsets count from: None for warm-up, else its anchor's event."""
        anchor = self.anchor
        return None if anchor is None else (anchor.on, anchor.nth, anchor.rank)

    def windows(self) -> list[tuple[float, float | None]]:
        """(on, off) offsets of every on-phase, after warm-up or after its anchor's event;
        off is None if it never heals."""
        start = self.offset
        if self.duration is None:
            return [(start, None)]
        end = start + self.duration
        if self.pulses is None:
            return [(start, end)]
        spans, t = [], start
        while t < end:
            spans.append((t, min(t + self.pulses.on_for, end)))
            t += self.pulses.on_for + self.pulses.off_for
        return spans


def _framework_problem(job: JobSpec, cluster: ClusterConfig) -> str | None:
    """Why a fault-tolerance framework's job cannot run on this cluster (None: it can)."""
    framework = job.framework
    if framework is None:
        return None
    if cluster.backend not in framework.backends:
        return (f"{framework.name} runs on the {' or '.join(framework.backends)} backend only ({framework.why_backend}); "
                f"set cluster.backend: {framework.backends[0]}, or run with --backend {framework.backends[0]}")
    if framework.coordinator is not None and cluster.ranks < 3:
        return (f"{framework.name}'s coordinator ({framework.coordinator}) takes the last of the cluster's "
                f"{cluster.ranks} hosts, and it needs two replica groups besides: give cluster.ranks: 3 or more")
    return None


def one_or_more(value: Any) -> Any:
    return (value,) if isinstance(value, str) else value


def _tier_form(value: Any) -> Any:
    """A tier that is not a name of TIERS, refused with the two forms of `tier:` (checked
    before the union's own errors, which would name its members instead)."""
    for trial, tier in value.items() if isinstance(value, dict) else [(None, value)]:
        if trial is not None and not isinstance(trial, str):
            raise ValueError(f"{trial!r} is not a policy's or variant's name; {TIER_FORM}")
        if not (isinstance(tier, str) and tier in TIERS):
            raise ValueError(f"{'' if trial is None else f'{trial}: '}{tier!r} is not a tier ("
                             f"{', '.join(TIERS)}); {TIER_FORM}")
    return value


Tier = Literal[tuple(TIERS)]  # type: ignore[valid-type]


class Expectation(Frozen):
    """What a policy is expected to do: an outcome (or a list of acceptable ones) and bounds
    on the measured times, in seconds after the fault started."""

    outcome: Annotated[tuple[Literal[OUTCOMES], ...], BeforeValidator(one_or_more),  # type: ignore[valid-type]
                       Field(min_length=1)] | None = None
    detect_within: Span | None = None
    recover_within: Span | None = None
    breaker_within: Span | None = None
    suspects_at_most: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="at most this many suspect events from the failure detector "
                                  "(0 in a fault-free run: any is a false alarm)")
    state: Literal[STATE_VERDICTS] | None = Field(  # type: ignore[valid-type]
        default=None, description="the state checker's verdict (reports.state): consistent (every "
                                  "replica agrees, every resumed state is real), diverged, not observed; "
                                  "with any expectation set, a diverged state fails unless expected")
    steps_lost_at_most: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="at most this many steps a resume does again (a scheduler's preemption "
                                  "or requeue: steps made since the newest checkpoint; 0: it saved on the signal)")
    stuck_in: Annotated[str, Field(min_length=1)] | None = Field(
        default=None, description="words that the trial's 'stuck in' line must contain: where every live "
                                  "process was at the hang cap (e.g. 'torchrun agents in rendezvous')")
    ranks_lost_at_most: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="at most this many of the cluster's ranks missing from the last group formed "
                                  "after the fault (1: the survivors of a killed rank go on together); a count, "
                                  "so it holds at any --ranks")
    undetected_at_most: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="at most this many ranks never detected the fault (0: every rank did; 1 where "
                                  "the fault kills a rank, which cannot); a count, so it holds at any --ranks")


class Scenario(Frozen):
    name: str
    description: str = ""
    seed: Annotated[int, Field(ge=0, le=SEED_MAX)] = 0
    cluster: ClusterConfig = ClusterConfig()
    workload: WorkloadSpec = WorkloadSpec()
    warmup_steps: Annotated[int, Field(ge=1)] = 8
    groups: dict[str, Annotated[tuple[Annotated[int, Field(ge=0)], ...], Field(min_length=1)]] = {}
    faults: tuple[FaultEvent, ...] = ()
    hang_cap: Span = 60.0
    settle_steps: Annotated[int, Field(ge=1)] = 8
    # py-spy reads every live process at each fault's first detection without pausing it
    # (harness.trial.stacks.AtDetection). Off unless asked: it moves what it watches, a fast
    # recovery most (bench/stacks_at_detect.py: an elastic kill's 0.17 s recovery took
    # 0.23 s with it on 2 cores, docs/performance.md)
    stacks_at_detect: bool = False
    policies: dict[str, dict[str, Any]] = Field(default_factory=lambda: {p: {} for p in POLICY_NAMES})
    expect: dict[str, Expectation] = {}
    tier: Annotated[Tier | dict[str, Tier], BeforeValidator(_tier_form)] = Field(  # type: ignore[valid-type]
        default=DEFAULT_TIER, description=f"where the trials run: one tier for all, or trial -> tier (a trial "
                                          f"not named: {DEFAULT_TIER}); " + "; ".join(f"{name}: {meaning}"
                                                                                  for name, meaning in TIERS.items()))
    job: JobSpec | None = None              # the user's own job instead of the harness's runner
    variants: dict[str, JobVariant] = {}    # the job's sides to compare (trials), like policies

    @field_validator("policies", mode="before")
    @classmethod
    def _bare_policy_names(cls, value: Any) -> Any:
        # `baseline:` with nothing after it means the policy's defaults
        if isinstance(value, dict):
            return {k: {} if v is None else v for k, v in value.items()}
        return value

    @field_validator("name")
    @classmethod
    def _safe_label(cls, value: str) -> str:
        if not NAME_FORM.fullmatch(value):
            raise ValueError(f"{value!r} is not a plain label: it names the run folder; use letters, "
                             "digits, '.', '_' and '-' (up to 100, not starting with '.' or '-')")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "Scenario":
        world = self.cluster.ranks
        for name, members in self.groups.items():
            _inside(f"groups.{name}", members, world)
        for i, event in enumerate(self.faults):
            self._check_target(i, event)
        _check_overlaps(self)
        self._check_backend()
        for name in self.policies:
            try:
                policy_spec(name, self.policies[name])
            except UsageError as exc:
                message = str(exc)
                raise ValueError(message if message.startswith("policies.")
                                 else f"policies.{name}: {message}") from None
        if self.cluster.store == "host" and world < 3:
            raise ValueError(f"cluster.store: host: the store takes the last of the cluster's {world} hosts, "
                             "and a group needs two ranks besides: give cluster.ranks: 3 or more")
        if self.variants and self.job is None:
            raise ValueError("variants: they vary a user's job; add 'job:' or use 'policies:'")
        for i, event in enumerate(self.faults):
            setting = getattr(event.fault, "gpu_setting", None)
            if setting and self.cluster.device == "cpu":
                raise ValueError(f"faults.{i}.{setting}: sets the rank's GPU, and the ranks run on the CPU "
                                 "(cluster.device: cpu); set cluster.device: cuda (or auto on a GPU node), "
                                 "or slow the rank by cpu_percent")
            if event.fault.on_agent_processes and self.job is None:
                raise ValueError(f"faults.{i}.processes: {event.fault.processes} are those a host's agent started "
                                 "(torchrun, torchft, ft_launcher), and the harness's runner is one process per "
                                 "host; remove processes to act on the host, or run your job under an agent (job:)")
            if self.job is not None and event.fault.kind == "gpu_hang":
                raise ValueError(f"faults.{i}.kind: 'gpu_hang' is queued by the harness's rank code, and "
                                 "a user's job (job:) has none; use kind: pause for a silent stall, "
                                 "or run the harness's runner (policies: instead of job:)")
        for name, variant in {"": None, **self.variants}.items():
            try:
                job = variant.applied_to(self.job) if variant else self.job  # type: ignore[arg-type]
            except ValidationError as exc:
                raise ValueError(f"variants.{name}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
            storage = next((i for i, event in enumerate(self.faults) if event.fault.acts_on == "storage"), None)
            if job is not None and storage is not None:
                try:
                    job_checkpoint_dir(job)
                except ValueError as exc:
                    raise ValueError(f"faults.{storage}.kind: {self.faults[storage].fault.kind} acts on the "
                                     f"job's checkpoint folder{f' (variant {name})' if name else ''}: {exc}") from None
            on_agent = next((i for i, event in enumerate(self.faults)
                             if event.fault.on_agent_processes), None)
            if job is not None and on_agent is not None and job.one_process_per_host:
                raise ValueError(f"faults.{on_agent}.processes: {self.faults[on_agent].fault.processes} are those a "
                                 f"host's agent started, and {f'variant {name} of ' if name else ''}the job runs "
                                 f"without one (launcher: {job.launcher}); run it under torchrun, torchft or "
                                 "ft_launcher (job.launcher), or remove processes to act on the host")
            monitors = next((i for i, event in enumerate(self.faults)
                             if getattr(event.fault, "processes", None) == MONITORS), None)
            if job is not None and monitors is not None and (job.framework is None or job.framework.monitors is None):
                raise ValueError(f"faults.{monitors}.processes: monitors are the processes an agent watches its "
                                 f"workers with (ft_launcher's rank monitors), and "
                                 f"{f'variant {name} of ' if name else ''}the job's launcher, {job.launcher}, has "
                                 "none; run it under ft_launcher (job.launcher), or use processes: workers")
            if job is not None and self.cluster.store == "host" and not job.rendezvous_on_harness_store:
                raise ValueError(f"cluster.store: host places the rendezvous store the harness runs, and "
                                 f"{f'variant {name} of ' if name else ''}the job (launcher: {job.launcher}) does not "
                                 "rendezvous there (only torchrun's and ft_launcher's agents do); remove it, or "
                                 "use one of those launchers")
            if job is not None and (problem := _framework_problem(job, self.cluster)):
                raise ValueError(f"{f'variants.{name}' if name else 'job'}.launcher: {problem}")
            if job is not None and job.min_hosts is not None and job.min_hosts > world:
                raise ValueError(f"{f'variants.{name}' if name else 'job'}.min_hosts: {job.min_hosts} is more than the "
                                 f"cluster's {world} hosts (torchrun's --nnodes {job.min_hosts}:{world}); give at "
                                 f"most {world}, e.g. {max(world - 1, 1)} to go on without one host")
        for i, event in enumerate(self.faults):
            self._check_anchor(i, event)
        for field, named in (("expect", self.expect), ("tier", self.tier if isinstance(self.tier, dict) else {})):
            for name in named:
                if name not in self.trial_names():
                    raise ValueError(f"{field}.{name}: no such {'variant' if self.job else 'policy'} "
                                     f"({', '.join(self.trial_names())}); name one of those")
        return self

    def _check_backend(self) -> None:
        """What the backend cannot do, refused with the backends that can."""
        backend = self.cluster.backend
        traits = traits_of(backend)
        for i, event in enumerate(self.faults):
            if event.fault.acts_on == "link" and not traits.network_faults:
                raise ValueError(
                    f"faults.{i}.kind: {event.fault.kind} acts on a rank's link, and the {backend} backend's "
                    f"hosts have none ({traits.summary}); run it with --backend "
                    f"{' or '.join(backends_with('network_faults'))}, or keep to kill, pause and gpu_hang")
            if event.fault.acts_on == "scheduler":
                if event.fault.kind not in traits.scheduler_kinds:
                    raise ValueError(
                        f"faults.{i}.kind: {event.fault.kind} is a scheduler's fault, and the {backend} backend "
                        f"has no scheduler ({traits.summary}); run it with --backend "
                        f"{' or '.join(b for b in BACKEND_NAMES if event.fault.kind in traits_of(b).scheduler_kinds)}")
                continue
            if (event.fault.acts_on == "link" and traits.network_faults and traits.link_kinds is not None
                    and event.fault.kind not in traits.link_kinds):
                raise ValueError(
                    f"faults.{i}.kind: {event.fault.kind} cannot act on the {backend} backend's hosts "
                    f"({traits.summary}): its link faults are {', '.join(traits.link_kinds)}; use one of those, "
                    f"or run it with --backend {' or '.join(b for b in backends_with('network_faults') if traits_of(b).link_kinds is None)}")
            if event.fault.on_agent_processes and not traits.worker_faults:
                raise ValueError(
                    f"faults.{i}.processes: {event.fault.processes}: the {backend} backend acts on a host whole "
                    f"({traits.summary}); run it with --backend {' or '.join(backends_with('worker_faults'))}, "
                    "or remove processes to act on the host")
            if event.fault.acts_on == "storage" and not traits.storage_faults:
                raise ValueError(
                    f"faults.{i}.kind: {event.fault.kind} mounts over the ranks' checkpoint folder in the "
                    f"harness's mount namespace, which the {backend} backend's ranks do not see; run it with "
                    f"--backend {' or '.join(backends_with('storage_faults'))}")
        per = self.cluster.ranks_per_node
        if per > 1 and not traits.ranks_per_host:
            raise ValueError(f"cluster.ranks_per_node: {per} ranks per host, and the {backend} backend gives each "
                             f"rank a host of its own; remove it, or run with --backend "
                             f"{' or '.join(backends_with('ranks_per_host'))}")
        if self.cluster.ranks % per:
            raise ValueError(f"cluster.ranks_per_node: {self.cluster.ranks} ranks do not split into hosts of {per}; "
                             f"give ranks a multiple of {per} (--ranks {per * max(1, round(self.cluster.ranks / per))})")
        if self.cluster.store == "host" and not traits.store_host:
            raise ValueError(f"cluster.store: host: the {backend} backend runs the store where its own "
                             f"cluster puts it ({traits.summary}); remove it, or run with --backend "
                             f"{' or '.join(backends_with('store_host'))}")
        if self.cluster.sysctls and not traits.host_sysctls:
            raise ValueError(f"cluster.sysctls: the {backend} backend's ranks share this machine's network "
                             f"settings; remove them, or run with --backend {' or '.join(backends_with('host_sysctls'))}")

    def _check_anchor(self, i: int, event: FaultEvent) -> None:
        """An anchor on an event this trial's job can record, on a rank of the cluster."""
        anchor, where = event.anchor, f"faults.{i}.start"
        if anchor is None:
            return
        if anchor.rank is not None:
            _inside(f"{where}.rank", (anchor.rank,), self.cluster.ranks)
        meaning = ANCHOR_EVENTS[anchor.on]
        if self.job is not None:
            if not meaning.job:
                raise ValueError(f"{where}.on: {anchor.on}: {meaning.missing}")
            if anchor.on in CHECKPOINT_ANCHORS:
                for name, variant in {"": None, **self.variants}.items():
                    job = variant.applied_to(self.job) if variant else self.job
                    if not any(TRIAL_DIR_FIELD in word for word in (*job.command, *job.env.values())):
                        raise ValueError(
                            f"{where}.on: {anchor.on} waits for the job's checkpoint, and "
                            f"{f'variant {name} of ' if name else ''}the job declares none (its command and "
                            f"env name no path under {TRIAL_DIR_FIELD}); pass the checkpoint as one, such as "
                            f'--checkpoint "{TRIAL_DIR_FIELD}/ckpt/checkpoint.pt" (docs/own-job.md), or anchor on step')
        elif anchor.on == "rank_start" and not traits_of(self.cluster.backend).scheduler_kinds:
            raise ValueError(f"{where}.on: rank_start: the runner's ranks start once on the "
                             f"{self.cluster.backend} backend (no scheduler requeues them); anchor on "
                             "new_generation (a group formed again) or retry")

    def _check_target(self, i: int, event: FaultEvent) -> None:
        where, target, world = f"faults.{i}.target", event.target, self.cluster.ranks
        if target.rank is not None:
            _inside(f"{where}.rank", (target.rank,), world)
        if target.ranks is not None:
            _inside(f"{where}.ranks", target.ranks, world)
        if target.group is not None and target.group not in self.groups:
            known = ", ".join(self.groups) or "none defined"
            raise ValueError(f"{where}.group: no group {target.group!r} under 'groups' ({known})")
        if target.count is not None and target.size(world) > world:
            raise ValueError(f"{where}.count: {target.count!r} ranks out of a cluster of {world}")
        if event.fault.kind == "partition" and event.fault.groups is not None:
            for g, group in enumerate(event.fault.groups):
                for ref in group:
                    _a_rank(f"faults.{i}.groups.{g}", ref, world)
        if event.fault.kind == "partition" and event.fault.groups is None \
                and len(self.targets(i)) >= world:
            raise ValueError(f"{where}: a partition cuts the target off from the other ranks, "
                             "but it covers the whole cluster; leave at least one rank out")

    def targets(self, index: int) -> tuple[int, ...]:
        """The ranks fault `index` hits, sorted; `count` draws them with the seed, the same
        ones on every run of the scenario."""
        target = self.faults[index].target
        if target.rank is not None:
            return (target.rank,)
        if target.ranks is not None:
            return tuple(sorted(target.ranks))
        if target.group is not None:
            return tuple(sorted(set(self.groups[target.group])))
        draw = random.Random(f"{self.seed}/{index}")
        return tuple(sorted(draw.sample(range(self.cluster.ranks), target.size(self.cluster.ranks))))

    def trial_names(self) -> list[str]:
        """One trial each: the policies, or for a user's job its variants ("job" without any)."""
        if self.job is None:
            return list(self.policies)
        return list(self.variants) or [JOB_TRIAL]

    def policy(self, name: str) -> PolicySpec:
        return policy_spec(name, self.policies.get(name, {}))

    def tier_of(self, trial: str) -> str:
        """Where `trial` runs: a name of TIERS."""
        return self.tier.get(trial, DEFAULT_TIER) if isinstance(self.tier, dict) else self.tier


def trial_dir_paths(job: JobSpec) -> list[str]:
    """Every path under `{trial_dir}` the job's command or environment names, as written
    after it ("/checkpoint.pt"), in order."""
    return [(word.split(TRIAL_DIR_FIELD, 1)[1].split() or [""])[0]
            for word in (*job.command, *job.env.values()) if TRIAL_DIR_FIELD in word]


def job_checkpoint_dir(job: JobSpec) -> str:
    """The folder, relative to the trial's, where a user's job keeps its checkpoint: the
    first path under `{trial_dir}` its command or environment names (a file's folder, a
    name without a suffix being the folder itself). Raises ValueError with the fix where
    there is none, or it is the trial's folder itself (its events and logs are there) or
    outside it."""
    fix = f'pass the checkpoint as a path in a folder of its own, such as "{TRIAL_DIR_FIELD}/ckpt/checkpoint.pt"'
    named = trial_dir_paths(job)
    if not named:
        raise ValueError(f"job.command names no path under {TRIAL_DIR_FIELD}; {fix}")
    path = PurePosixPath(named[0].lstrip("/"))
    folder = path.parent if path.suffix else path
    if str(folder) in ("", "."):
        raise ValueError(f"{TRIAL_DIR_FIELD}{named[0]} is in the trial's own folder, which holds its events "
                         f"and logs; {fix}")
    if ".." in folder.parts:
        raise ValueError(f"{TRIAL_DIR_FIELD}{named[0]} is outside the trial's folder; {fix}")
    return str(folder)


def _inside(where: str, ranks: tuple[int, ...], world: int) -> None:
    outside = [r for r in ranks if r >= world]
    if outside:
        raise ValueError(f"{where}: rank {outside[0]} is outside the cluster (ranks 0..{world - 1}; "
                         "cluster.ranks sets the size)")


def _a_rank(where: str, ref: int | str, world: int) -> None:
    """A partition group's host: a rank number or its host name ("r005"), inside the cluster."""
    rank = ref if isinstance(ref, int) else host_index(ref) if HOST_NAME.fullmatch(ref) else None
    if rank is None or not 0 <= rank < world or (isinstance(ref, str) and host_name(rank) != ref):
        raise ValueError(f"{where}: {ref!r} is not a rank of this cluster (0..{world - 1} or "
                         f"{host_name(0)}..{host_name(world - 1)}; cluster.ranks sets the size)")


def _check_overlaps(scenario: Scenario) -> None:
    """Refuse timelines that cannot happen: one kind twice on a rank at once, or a fault on a
    rank after a kill fault removed it."""
    faults = scenario.faults
    for j, later in enumerate(faults):
        for i, earlier in enumerate(faults[:j]):
            if (earlier.fault.acts_on == later.fault.acts_on == "storage" and earlier.clock() == later.clock()
                    and _overlap(earlier, later)):
                raise ValueError(f"faults.{j}: a {later.fault.kind} while faults.{i} ({earlier.fault.kind}) still holds "
                                 "the checkpoint folder, which every rank shares on this machine; make one end "
                                 "before the other starts")
            shared = sorted(set(scenario.targets(i)) & set(scenario.targets(j)))
            # faults on different clocks (warm-up, an anchor's event) have no known order: a
            # process fault that comes after a kill is not applied when it comes (the rank is gone)
            if not shared or earlier.clock() != later.clock():
                continue
            for a, b in ((i, j), (j, i)):
                if faults[a].fault.ends_host and faults[b].offset >= faults[a].offset:
                    raise ValueError(f"faults.{b}: rank {shared[0]} is killed by faults.{a} at "
                                     f"{faults[a].offset:g} s; nothing can happen to it after that")
            if earlier.fault.kind == later.fault.kind and _overlap(earlier, later):
                raise ValueError(f"faults.{j}: a second {later.fault.kind} on rank {shared[0]} while "
                                 f"faults.{i} still holds it; make one end before the other starts")


def _overlap(a: FaultEvent, b: FaultEvent) -> bool:
    def before(x: float | None, y: float) -> bool:
        return x is not None and x <= y
    return any(not before(a_off, b_on) and not before(b_off, a_on)
               for a_on, a_off in a.windows() for b_on, b_off in b.windows())


# -- loading ------------------------------------------------------------------------------

# The overrides `chaos run` takes as options (the seed is the scenario's, overridden or not).
OVERRIDE_OPTIONS = {"cluster.ranks": "--ranks", "cluster.backend": "--backend",
                    "cluster.ranks_per_node": "--ranks-per-node"}


def reproduce_command(scenario_file: Path, policies: str | Sequence[str], seed: int,
                      overrides: Mapping[str, Any] | None = None) -> str:
    """The `chaos run` line that runs these policies of a scenario again (none named: all of
    them): the same seed, and the ranks and backend where `overrides` gave them."""
    overrides = overrides or {}
    words = ["chaos", "run", str(scenario_file)]
    for policy in [policies] if isinstance(policies, str) else policies:
        words += ["--policy", policy]
    for key, option in OVERRIDE_OPTIONS.items():
        if overrides.get(key) is not None:
            words += [option, str(overrides[key])]
    return shlex.join(words + ["--seed", str(seed)])


def refuse_what_this_machine_cannot_set(path: Path | str, scenario: Scenario) -> None:
    """A fault setting that only some machines can make (`slow`'s GPU clock or power limit:
    NVML, root), refused before anything runs, file:line: field: why and the fix. Apart from
    `load_scenario`, which judges the file alone: a test session skips such a scenario, saying
    why, and `--dry-run` shows what a run would use."""
    from chaos.faults import Slow
    from chaos.nvml import why_no_gpu_settings
    settings = [(i, event.fault.gpu_setting) for i, event in enumerate(scenario.faults)
                if isinstance(event.fault, Slow) and event.fault.gpu_setting]
    if not settings:
        return
    why = why_no_gpu_settings()
    if why is None:
        return
    i, field = settings[0]
    root = yaml.compose(Path(path).read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    line = line_of(root, ("faults", i, field))
    raise UsageError(f"{path}{f':{line}' if line else ''}: faults.{i}.{field}: a GPU setting, and {why}; "
                     "run it on a GPU node as root, or slow the rank by cpu_percent")


def load_scenario(path: Path | str, overrides: dict[str, Any] | None = None) -> Scenario:
    """Read and validate a scenario file; raises UsageError with file:line: field: problem,
    one line per problem.

    `overrides` maps dotted field paths ("cluster.ranks", "seed") to values given on the
    command line; they are merged before validation, so they are checked like the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such scenario file; pass the path of a .yaml file "
                         "(see scenarios/ for examples)") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text (byte {exc.start}); a scenario is a YAML text file") from None
    except PermissionError as exc:
        raise UsageError(f"{path}: {why_unreadable(path) or exc.strerror}") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise UsageError(f"{path}{where}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:
        raise UsageError(f"{path}: nested too deeply to read") from None
    twice = duplicate_keys(root, path)
    if twice:
        raise UsageError("\n".join(twice))
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a scenario is a mapping of fields (name, faults, policies, ...), "
                         f"not {type(data).__name__}")
    data.setdefault("name", path.stem)
    written_workdir = None
    if isinstance(data.get("job"), dict):  # the job's folder is relative to the scenario file
        written_workdir = str(data["job"].get("workdir", "."))
        data["job"]["workdir"] = str(path.resolve().parent / written_workdir)
    for dotted, value in (overrides or {}).items():
        *parents, leaf = dotted.split(".")
        node = data
        for key in parents:
            if not isinstance(node.get(key, {}), dict):
                raise UsageError(f"{path}: {key}: expected a mapping to set {dotted} in")
            node = node.setdefault(key, {})
        node[leaf] = value
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        lines = []
        for loc, message in describe_errors(exc):
            line = line_of(root, loc)
            lines.append(f"{path}{f':{line}' if line else ''}: {message}")
        raise UsageError("\n".join(lines)) from None
    except RecursionError:
        raise UsageError(f"{path}: a value refers to itself (a YAML alias loop)") from None
    if scenario.job is not None and (why := why_unreadable(scenario.job.workdir, folder=True)):
        line = line_of(root, ("job", "workdir"))  # refused before anything runs
        raise UsageError(f"{path}{f':{line}' if line else ''}: job.workdir: {written_workdir!r} "
                         f"({scenario.job.workdir}): {why}; give the folder your command runs in, relative to "
                         f"{path.resolve().parent}")
    return scenario
