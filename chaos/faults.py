"""Faults are values: one frozen, typed class per kind, validated once when built.

A fault says *what* happens to a host (its kind and parameters, with units parsed from
strings such as "250ms", "20%", "10mbit"); *where* and *when* belong to the scenario.
`parse_fault(dict)` builds the right class from its ``kind`` and raises `InvalidFault`
naming the field, the value and the accepted form.
"""
from __future__ import annotations

import errno
import math
import signal
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError,
                      model_validator)

from chaos import units
from chaos.errors import InvalidFault

Seconds = Annotated[float, BeforeValidator(units.parse_duration), Field(ge=0)]
Fraction = Annotated[float, BeforeValidator(units.parse_percent)]
BitsPerSecond = Annotated[float, BeforeValidator(units.parse_rate)]
Bytes = Annotated[int, BeforeValidator(units.parse_size)]


class FaultBase(BaseModel):
    """Common shape of every fault kind: frozen, no unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    # Faults on a link act on its switch side ("wire" semantics) unless a kind says otherwise.
    acts_on: ClassVar[str] = "link"  # "link" | "process" | "storage" | "scheduler"
    # Whether the fault has a natural end that the harness reverts after `duration`.
    reversible: ClassVar[bool] = True
    # A disruptive fault that must end even if the harness dies (see chaos.deadman).
    dead_man: ClassVar[bool] = False
    # Whether its target's process cannot run at all while it holds: a rank held by one that
    # never heals can change nothing more, so a trial left with only such ranks is over.
    freezes: ClassVar[bool] = False

    def isolates(self) -> bool:
        """Whether its targets can reach no other host while it holds (TCP needs both ways,
        so one way cut is cut): under one that never heals, the others can only go on
        without them."""
        return False

    @property
    def ends_host(self) -> bool:
        """Whether its targets' processes end for good: nothing happens to them after it."""
        return False

    @property
    def on_agent_processes(self) -> bool:
        """Whether it acts on some of its hosts' agents' processes only (`processes: workers`
        or `monitors`), not on the hosts whole."""
        return getattr(self, "processes", HOST) != HOST

    def describe(self) -> str:
        # a whole host is what a process fault acts on unless it says otherwise: not repeated
        quiet = {"kind"} | ({"processes"} if hasattr(self, "processes") and not self.on_agent_processes else set())
        params = ", ".join(f"{k}={v}" for k, v in self.model_dump(exclude=quiet).items())
        return f"{self.kind}({params})" if params else self.kind  # type: ignore[attr-defined]


def _signal_number(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return signal.Signals(value).value
    if isinstance(value, str):
        name = value.upper()
        name = name if name.startswith("SIG") else "SIG" + name
        if name in signal.Signals.__members__:
            return signal.Signals[name].value
    raise ValueError(f"{value!r} is not a signal name such as \"SIGKILL\" or \"TERM\"")


# Which of a host's processes a process fault acts on: the whole host (its process and
# every one under it, as a node's failure); only the workers an agent on it started
# (torchrun, torchft's replica group, ft_launcher), as a worker's own crash or hang: the
# agent lives on to see it and restart them; or only the monitors its agent watches its
# workers with (ft_launcher's rank monitor per worker): the watcher itself fails.
HOST, WORKERS, MONITORS = "host", "workers", "monitors"
Processes = Literal["host", "workers", "monitors"]


class Kill(FaultBase):
    """The rank's process receives `signal` (SIGKILL by default): it dies, it does not come
    back. With `processes: workers`, only the workers of the host's agent: the agent lives;
    with `processes: monitors`, only the agent's monitors of its workers."""

    kind: Literal["kill"] = "kill"
    signal: Annotated[int, BeforeValidator(_signal_number)] = signal.SIGKILL.value
    processes: Processes = HOST
    acts_on: ClassVar[str] = "process"
    reversible: ClassVar[bool] = False

    @property
    def ends_host(self) -> bool:
        return self.processes == HOST


def _finite_duration(seconds: float) -> float:
    if not math.isfinite(seconds):
        raise ValueError(f"{seconds!r} is not a finite time; expected {units.DURATION_FORM}")
    return seconds


class Pause(FaultBase):
    """The rank's process is frozen with SIGSTOP and thawed with SIGCONT (a GC or scheduler
    stall). With `processes: workers`, only the workers of the host's agent (a hung worker
    under a live agent, which ft_launcher's rank monitor is there to see); with `processes:
    monitors`, only the agent's monitors of its workers (the watcher hung)."""

    kind: Literal["pause"] = "pause"
    processes: Processes = HOST
    acts_on: ClassVar[str] = "process"
    freezes: ClassVar[bool] = True


class Slow(FaultBase):
    """The rank runs slow (fail-slow, a straggler), by one of three settings:

    cpu_percent   its processes get that share of one CPU per `period` (as root, a cgroup
                  CPU quota: chaos.cgroup; a rank with CPU to spare within its cap is not
                  slowed), or with `stops` (and for an ordinary user, who has no quota) are
                  stopped for the rest of each period by a SIGSTOP/SIGCONT duty cycle, as
                  cpulimit does: a GC pause or a scheduling delay, which every collective it
                  joins waits for whatever CPU it needs
    gpu_clock     its GPU's graphics clock locked at that many MHz (NVML, root: chaos.nvml)
    power_limit   its GPU's power limit set to that many watts (NVML, root), a thermal or
                  power-capped node"""

    kind: Literal["slow"] = "slow"
    cpu_percent: Fraction | None = None
    period: Annotated[Seconds, Field(gt=0, le=1)] = 0.1
    stops: bool = False
    gpu_clock: Annotated[int, Field(gt=0)] | None = None    # MHz
    power_limit: Annotated[int, Field(gt=0)] | None = None  # W
    acts_on: ClassVar[str] = "process"

    @model_validator(mode="after")
    def _one_setting(self) -> "Slow":
        given = [k for k in ("cpu_percent", "gpu_clock", "power_limit") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give one of cpu_percent (e.g. 20%), gpu_clock (MHz, e.g. 900) and "
                             f"power_limit (W, e.g. 150){f', not {given[0]} and {given[1]}' if given else ''}")
        if self.cpu_percent is not None and not 0.01 <= self.cpu_percent <= 0.99:
            raise ValueError(f"cpu_percent: expected 1% to 99% (got {self.cpu_percent:.0%}); "
                             "0% is a pause (kind: pause), 100% no fault")
        if self.stops and self.cpu_percent is None:
            raise ValueError(f"stops: a duty cycle of the rank's CPU share; {given[0]} sets its GPU: remove stops")
        return self

    @property
    def gpu_setting(self) -> str | None:
        """The GPU setting it makes (gpu_clock or power_limit), None for a CPU share."""
        return "gpu_clock" if self.gpu_clock is not None else "power_limit" if self.power_limit is not None else None

    def describe(self) -> str:
        if self.gpu_setting == "gpu_clock":
            return f"slow(gpu_clock={self.gpu_clock} MHz)"
        if self.gpu_setting == "power_limit":
            return f"slow(power_limit={self.power_limit} W)"
        return f"slow(cpu_percent={self.cpu_percent}, period={self.period}, stops={self.stops})"


class GpuHang(FaultBase):
    """A kernel spins on the rank's GPU for `duration` (the scenario's timing field, required
    and finite: a kernel cannot be stopped once queued), queued on the stream the training
    uses: the rank stops making progress while its process and its link stay alive. The
    rank plays it (harness.job.gpufault) from a command file (chaos.cmdfile)."""

    kind: Literal["gpu_hang"] = "gpu_hang"
    duration: Annotated[Seconds, AfterValidator(_finite_duration), Field(gt=0)]
    acts_on: ClassVar[str] = "process"


class StorageFault(FaultBase):
    """A fault on a rank's checkpoint directory (`Host.storage`): the job's own file calls
    there get the kernel's error. Each kind is one mechanism of chaos.storage's family."""

    acts_on: ClassVar[str] = "storage"


class DiskFull(StorageFault):
    """Writes in the directory fail with ENOSPC: from the start, or once `after_bytes` more
    were written (a save cut off half-way). What was written before stays."""

    kind: Literal["disk_full"] = "disk_full"
    after_bytes: Bytes | None = None


class ReadOnly(StorageFault):
    """The directory turns read-only: creating, writing, renaming and removing there fail
    with EROFS; reads go on."""

    kind: Literal["read_only"] = "read_only"


# The file operations a FUSE storage fault can act on (chaos.fusefs); `open` includes creating.
IoOp = Literal["write", "fsync", "read", "open", "rename"]
DEFAULT_IO_OPS: tuple[IoOp, ...] = ("write", "fsync")


def _errno_number(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value in errno.errorcode:
        return value
    if isinstance(value, str) and value.upper() in errno.errorcode.values():
        return int(getattr(errno, value.upper()))
    raise ValueError(f"{value!r} is not an errno name such as \"EIO\" or \"ENOSPC\"")


class FuseStorageFault(StorageFault):
    """A storage fault made by a passthrough FUSE filesystem mounted over the directory
    (chaos.fusefs), on the files whose path in the directory matches the glob `path`."""

    path: Annotated[str, Field(min_length=1)] = "*"


class IoCallFault(FuseStorageFault):
    """A fault on each of the file calls `ops`."""

    ops: Annotated[tuple[IoOp, ...], Field(min_length=1)] = DEFAULT_IO_OPS


class IoError(IoCallFault):
    """The `ops` fail with `errno` (EIO unless named): every one, a `percent` of them drawn
    from a stream seeded by the run id and the directory, or every `every_nth`: a transient
    NFS or Lustre error."""

    kind: Literal["io_error"] = "io_error"
    errno: Annotated[int, BeforeValidator(_errno_number)] = errno.EIO
    percent: Fraction | None = None
    every_nth: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _one_rate(self) -> "IoError":
        if self.percent is not None and self.every_nth is not None:
            raise ValueError("percent and every_nth: give one of them, not both (neither: every operation fails)")
        if self.percent is not None and not 0 < self.percent <= 1:
            raise ValueError(f"percent: expected above 0% and at most 100% (got {self.percent:.0%})")
        return self


class IoDelay(IoCallFault):
    """Each of the `ops` is held `latency` before it is done: a slow shared filesystem."""

    kind: Literal["io_delay"] = "io_delay"
    latency: Annotated[Seconds, Field(gt=0)]


class IoStall(IoCallFault):
    """The `ops` block until the fault ends, then complete: a hung NFS server that comes back."""

    kind: Literal["io_stall"] = "io_stall"


class LoseUnsynced(FuseStorageFault):
    """The node's storage crashes at the fault's end, as LazyFS's `clear-cache` does: what was
    written during the fault and not fsynced is gone (a file holds what its last fsync made
    durable; one never fsynced is empty); renames, creations and removals stay done. Give the
    rank a kill just before the end: a process that lived on past the crash would go on
    writing over data it no longer has."""

    kind: Literal["lose_unsynced"] = "lose_unsynced"


# Which way a link fault acts, seen from the host: traffic it sends, receives, or both.
LinkDirection = Literal["both", "from_host", "to_host"]
Distribution = Literal["uniform", "normal", "pareto", "paretonormal"]
# tbf and netem carry a rate in a 32-bit bytes/s field unless the 64-bit attribute is sent;
# chaos.tc sends it, so the ceiling is only what a link here can carry.
MAX_RATE_BITS = 400e9


class LinkFault(FaultBase):
    """A fault on the host's link; `direction` says which of its two ways it degrades."""

    direction: LinkDirection = "both"


class LinkDown(LinkFault):
    """The host's link goes down (switch-side port): a pulled cable the port notices."""

    kind: Literal["link_down"] = "link_down"
    direction: Literal["both"] = "both"
    dead_man: ClassVar[bool] = True

    def isolates(self) -> bool:
        return True


class Loss(LinkFault):
    """Packets vanish on the wire with probability `percent`, independently, correlated
    (P(lost | previous lost) = correlation + (1 - correlation) * percent), or in bursts of
    `burst` packets on average (Gilbert-Elliott, mean loss `percent`)."""

    kind: Literal["loss"] = "loss"
    percent: Fraction
    correlation: Fraction = 0.0
    burst: Annotated[float, Field(ge=1.0)] | None = None

    @model_validator(mode="after")
    def _one_memory_model(self) -> "Loss":
        if self.burst is not None and self.correlation:
            raise ValueError("correlation and burst: give one of them, not both (burst is the mean "
                             "burst length in packets, a number >= 1)")
        if self.burst is not None and not 0 < self.percent < 1:
            raise ValueError(f"percent: a burst model needs a loss strictly between 0% and 100% "
                             f"(got {self.percent:.0%})")
        return self


class Delay(LinkFault):
    """Every packet is held `latency` (+/- `jitter` drawn from `distribution`) on the wire.
    Packets keep their order: a packet never leaves before the one ahead of it."""

    kind: Literal["delay"] = "delay"
    latency: Seconds = 0.0
    jitter: Seconds = 0.0
    distribution: Distribution = "uniform"
    correlation: Fraction = 0.0

    @model_validator(mode="after")
    def _jitter_needs_latency(self) -> "Delay":
        if self.latency <= 0:
            raise ValueError(f"latency: must be above 0 (got {units.format_duration(self.latency)}; "
                             f"a jitter needs a latency to vary around); expected {units.DURATION_FORM}")
        if self.jitter > self.latency:
            raise ValueError(f"jitter: {units.format_duration(self.jitter)} exceeds the latency "
                             f"{units.format_duration(self.latency)}; delays would go negative")
        if (self.distribution != "uniform" or self.correlation) and not self.jitter:
            raise ValueError("distribution, correlation: they shape the jitter; give a jitter too")
        return self


class Bandwidth(LinkFault):
    """The link carries at most `rate` (token bucket of `burst` bytes)."""

    kind: Literal["bandwidth"] = "bandwidth"
    rate: Annotated[BitsPerSecond, Field(le=MAX_RATE_BITS)]
    burst: Bytes | None = None


class _NetemOnly(LinkFault):
    """Kinds that only sch_netem can inject: refused where the kernel lacks it."""

    percent: Fraction
    correlation: Fraction = 0.0


class Duplicate(_NetemOnly):
    """A `percent` of packets arrive twice."""

    kind: Literal["duplicate"] = "duplicate"


class Corrupt(_NetemOnly):
    """A `percent` of packets get a flipped bit (and fail their checksum at the receiver)."""

    kind: Literal["corrupt"] = "corrupt"


class Reorder(_NetemOnly):
    """A `percent` of packets go at once while the others wait `latency`: they overtake."""

    kind: Literal["reorder"] = "reorder"
    latency: Seconds = 0.0

    @model_validator(mode="after")
    def _needs_latency(self) -> "Reorder":
        if self.latency <= 0:
            raise ValueError(f"latency: reorder needs a latency above 0 for packets to overtake; "
                             f"expected {units.DURATION_FORM}")
        return self


class Blackhole(LinkFault):
    """The link stays up but traffic vanishes (a pulled cable seen from the peers)."""

    kind: Literal["blackhole"] = "blackhole"
    dead_man: ClassVar[bool] = True

    def isolates(self) -> bool:
        return True


HostRef = Union[Annotated[int, Field(ge=0)], str]


class Partition(FaultBase):
    """The switch drops traffic between groups of hosts (names such as "r005" or rank
    numbers). Without `groups`, the target hosts are cut off from every other host.
    `one_way`: only traffic from the first group to the others is dropped."""

    kind: Literal["partition"] = "partition"
    groups: tuple[tuple[HostRef, ...], ...] | None = None
    direction: Literal["both", "one_way"] = "both"
    dead_man: ClassVar[bool] = True

    def isolates(self) -> bool:
        return self.groups is None  # between groups: which side goes on is the job's to say

    @model_validator(mode="after")
    def _disjoint_groups(self) -> "Partition":
        if self.groups is None:
            return self
        if len(self.groups) < 2 or not all(self.groups):
            raise ValueError('groups: expected at least two non-empty groups of hosts, such as '
                             '[["r000", "r001"], ["r002"]] or [[0, 1], [2]]')
        seen: set[HostRef] = set()
        for group in self.groups:
            twice = seen.intersection(group)
            if twice:
                raise ValueError(f"groups: host {sorted(map(str, twice))[0]} is in two groups")
            seen.update(group)
        return self


class SchedulerFault(FaultBase):
    """A fault the cluster's scheduler makes on the job's allocation (the slurm backend's
    own: harness.cluster.slurm), refused on backends without a scheduler."""

    acts_on: ClassVar[str] = "scheduler"


class Preempt(SchedulerFault):
    """The scheduler preempts the job, as Slurm does: with `signal`, that signal to every task
    `lead` before (sbatch --signal's warning); then SIGCONT and SIGTERM to every task, and
    SIGKILL `grace` later (default: the cluster's KillWait, what Slurm itself waits). With
    `requeue`, the job is then queued again and starts from the top (a spot instance taken
    back)."""

    kind: Literal["preempt"] = "preempt"
    signal: Annotated[int, BeforeValidator(_signal_number)] | None = None
    lead: Seconds = 0.0
    grace: Seconds | None = None
    requeue: bool = False
    reversible: ClassVar[bool] = False

    @model_validator(mode="after")
    def _lead_needs_signal(self) -> "Preempt":
        if self.lead and self.signal is None:
            raise ValueError("lead: a warning needs its signal (signal: USR1); give both or neither")
        return self


class Requeue(SchedulerFault):
    """The job is requeued (scontrol requeue): every task ends (SIGTERM, SIGKILL after
    KillWait), the job is queued again and starts from the top, SLURM_RESTART_COUNT one higher."""

    kind: Literal["requeue"] = "requeue"
    reversible: ClassVar[bool] = False


class NodeDown(SchedulerFault):
    """The target ranks' nodes are set DOWN: the scheduler ends the job (node failure) and
    requeues it where it may; reverted by resuming the nodes."""

    kind: Literal["node_down"] = "node_down"


class Drain(SchedulerFault):
    """The target ranks' nodes are drained: what runs there goes on, the nodes take no new
    work (a requeued job waits for others); reverted by resuming them."""

    kind: Literal["drain"] = "drain"


class SlurmdKill(SchedulerFault):
    """The target ranks' nodes lose their Slurm daemon (SIGKILL to slurmd): the job's steps
    run on (slurmstepd is apart), the controller hears nothing from the node and, after its
    SlurmdTimeout, sets it DOWN and ends (or requeues) the job; reverted by starting the
    daemon again as it was started."""

    kind: Literal["slurmd_kill"] = "slurmd_kill"


class StepDelay(FaultBase):
    """Each step of the rank takes `delay` longer while the fault is on: a slow data loader,
    a slow input pipeline. Played by the rank's own process before each step (the built-in
    runner; a user's job through its step hook, before its optimizer's step) from a command
    file (chaos.cmdfile): a rank whose peers wait for it every step, with no stop, no lost
    packet and no error."""

    kind: Literal["step_delay"] = "step_delay"
    delay: Annotated[Seconds, Field(gt=0, le=60)]
    acts_on: ClassVar[str] = "process"


# The closed set of kinds. A new kind is one class here plus its mechanism in chaos.inject
# (a scheduler's kinds: in the backend that has the scheduler).
FAULT_KINDS: tuple[type[FaultBase], ...] = (
    LinkDown, Loss, Delay, Bandwidth, Duplicate, Corrupt, Reorder, Blackhole, Partition, Kill, Pause,
    Slow, StepDelay, GpuHang, DiskFull, ReadOnly, IoError, IoDelay, IoStall, LoseUnsynced, Preempt, Requeue, NodeDown,
    Drain, SlurmdKill)
Fault = Annotated[Union[LinkDown, Loss, Delay, Bandwidth, Duplicate, Corrupt, Reorder, Blackhole,
                        Partition, Kill, Pause, Slow, StepDelay, GpuHang, DiskFull, ReadOnly, IoError, IoDelay, IoStall,
                        LoseUnsynced,
                        Preempt, Requeue, NodeDown, Drain, SlurmdKill],
                  Field(discriminator="kind")]
_FAULT_ADAPTER: TypeAdapter[Any] = TypeAdapter(Fault)


def kind_names() -> list[str]:
    return [cls.model_fields["kind"].default for cls in FAULT_KINDS]


def fault_from_wire(data: dict[str, Any]) -> FaultBase:
    """A fault value from its own `model_dump(mode="json")`, as a harness sends it to a node
    agent: validated when it was built, its fields already in canonical form (a percentage
    as 0.2, not "20%"), so it is rebuilt without validating again."""
    kind = data.get("kind")
    cls = next((c for c in FAULT_KINDS if c.model_fields["kind"].default == kind), None)
    if cls is None:
        raise InvalidFault(f"kind: unknown fault kind {kind!r}; expected one of {', '.join(kind_names())}")
    return cls.model_construct(**{name: _tuples(value) for name, value in data.items()})


def _tuples(value: Any) -> Any:
    """JSON's lists back into the tuples a fault value holds (ops, groups)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def parse_fault(data: dict[str, Any]) -> FaultBase:
    """Build a fault value from a mapping, or raise InvalidFault naming field, value and form."""
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in kind_names():
        raise InvalidFault(f"kind: unknown fault kind {kind!r}; expected one of {', '.join(kind_names())}")
    try:
        return _FAULT_ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise InvalidFault(describe_validation_error(exc, prefix=f"{kind}.")) from exc


def describe_validation_error(exc: ValidationError, prefix: str = "") -> str:
    """One line per problem: field path, the value given, and what was expected."""
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"] if not str(p).startswith("function-")]
        if loc and prefix and loc[0] == prefix.rstrip("."):
            loc = loc[1:]  # the tag of a discriminated union repeats the kind
        where = prefix + ".".join(loc) if loc else prefix.rstrip(".")
        msg = err["msg"].removeprefix("Value error, ")
        value = err.get("input")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        # a model-level check names its fields itself; a field check may already quote the value
        quoted = not loc or err["type"] == "missing" or repr(value) in msg
        lines.append(f"{where}: {msg}" if quoted else f"{where}: {msg} (got {value!r})")
    return "; ".join(lines)
