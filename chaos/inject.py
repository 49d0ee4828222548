"""The injector and the process-level mechanisms.

Every mechanism writes a ledger entry *before* acting; the entry's `op` names an undo in
`chaos.undo.UNDOS`, the fault library's undo table, so a revert from the live harness, the
dead-man switch and a `chaos heal` after a SIGKILL run the same code. A backend whose
mechanisms record ops of their own hands its table to the injector and heal (combined
with this one); the dead-man switch, a process of its own, runs this one only.

Which mechanism each kind uses on this machine is chosen here (`choose_mechanisms`) from
the capability probe's findings (`chaos.probe`): netem first where the kernel has it, else
the fallbacks in `chaos.tc`, `chaos.nfq`, `chaos.nft`, else a refusal with the reason.
"""
from __future__ import annotations

import os
import signal
import time
from typing import Sequence

from chaos import cgroup, cmdfile, dutycycle, fusefs, netlink, nvml, probe, proc
from chaos.api import AppliedFault, Host, Injection, Injector
from chaos.errors import FaultConflict, TargetGone, UnsupportedFault
from chaos.faults import FAULT_KINDS, FaultBase, Kill, Slow
from chaos.ledger import Entry, Ledger
from chaos.mechanism import ClusterMechanism, Mechanism, Unavailable, record_process
from chaos.undotable import UndoTable
from chaos.nfq import NfqueueDelay
from chaos.deadman import DEAD_MAN_READY
from chaos.nft import NftDrop, NftPartition
from chaos.fusefs import FusePassthrough
from chaos.storage import ReadOnlyBind, SizedTmpfs
from chaos.tc import BpfDrop, NetemQdisc, TbfBandwidth
from chaos.undo import UNDOS

__all__ = ["NetlinkInjector", "choose_mechanisms", "default_mechanisms", "process_mechanisms"]
HELPER_READY_S = 10.0
NO_SCHEDULER = "a scheduler's fault, made by the backend that has the scheduler (--backend slurm)"


class LinkStateDown(Mechanism):
    name = "link state down (switch-side port)"

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        entry = ledger.record("link_up", ns=host.switch_ns, ifname=host.port)
        netlink.set_link_state(host.switch_ns, host.port, up=False)
        ledger.mark(entry, "done")
        return [entry]


def _require_pid(fault: FaultBase, host: Host) -> int:
    if host.pid is None:
        raise UnsupportedFault(f"{fault.kind} on {host.name}: the host has no process to signal")
    return host.pid


def _roots(fault: FaultBase, host: Host) -> list[tuple[int, int | None]]:
    """The processes a process fault acts on, each with what is under it: the host's one
    process, or with `processes: workers` (`monitors`) the workers (monitors) its agent runs
    now (`host.agent_processes`; none: the agent is between two restarts, and the fault is
    not applied)."""
    pid = _require_pid(fault, host)
    if not fault.on_agent_processes:
        return [(pid, proc.start_time(pid))]
    if not host.agent_processes:
        processes = fault.processes  # type: ignore[attr-defined]
        raise TargetGone(f"{fault.kind} of {host.name}'s {processes}: no {processes.rstrip('s')} runs under its "
                         f"agent ({pid}) now")
    return list(host.agent_processes)


def _left_the_tree(fault: FaultBase, host: Host, tree: set[int]) -> list[tuple[int, int]]:
    """The host's processes that left its process tree but not its network namespace (a
    daemon's double fork: nvidia-resiliency-ext's in-process restart watches each rank from
    one), where a fault acts on the whole host and the host has a namespace of its own: a
    node's failure takes them too. Not the processes in `tree` (already signalled)."""
    if fault.on_agent_processes or not host.ns_path:
        return []
    try:
        inode = os.stat(host.ns_path).st_ino
    except OSError:  # no namespace of its own at that path (a fake host, a gone one)
        return []
    return [(pid, started) for pid, started in proc.in_namespaces({inode}) if pid not in tree]


# A process fault hits the host's whole workload, as a node's failure would: the rank's
# process and every process under it (a torchrun agent and its workers, a job's data
# loaders), and every other process in the host's network namespace; or, asked, only its
# agent's workers (or monitors) and what is under them. A descendant that ends meanwhile is
# already gone, not an error.
class SignalKill(Mechanism):
    name = ("signal to the rank's process (or its agent's workers or monitors), what is under it and what else "
            "runs in the host's namespace")

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        assert isinstance(fault, Kill)
        tree: set[int] = set()
        for pid, started in _roots(fault, host):
            tree |= proc.signal_tree(pid, fault.signal, started, gone_ok=fault.on_agent_processes)
        for pid, started in _left_the_tree(fault, host, tree):
            proc.send_signal(pid, fault.signal, started, gone_ok=True)
        return []  # a kill has nothing to undo


class SignalStop(Mechanism):
    name = ("SIGSTOP / SIGCONT of the rank's process (or its agent's workers or monitors), what is under it and "
            "what else runs in the host's namespace")

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        entries = []
        for pid, started in _roots(fault, host):
            # a worker that ended between the look and the signal is gone, not an error
            entries.append(self._stop(ledger, pid, started, gone_ok=fault.on_agent_processes))
            # the stopped parent starts no one else; its descendants are stopped after it
            entries += [self._stop(ledger, child, child_started, gone_ok=True)
                        for child, child_started in proc.descendants(pid)]
        stopped = {entry.args["pid"] for entry in entries}
        entries += [self._stop(ledger, pid, started, gone_ok=True)
                    for pid, started in _left_the_tree(fault, host, stopped)]
        return entries

    @staticmethod
    def _stop(ledger: Ledger, pid: int, started: int | None, gone_ok: bool) -> Entry:
        entry = ledger.record("sigcont", pid=pid, started=started)
        proc.send_signal(pid, signal.SIGSTOP, started, gone_ok=gone_ok)
        ledger.mark(entry, "done")
        return entry


class DutyCycle(Mechanism):
    """`slow`: a helper (chaos.dutycycle) stops and continues the rank's process tree, as
    cpulimit does: no privilege beyond signalling the rank, on every backend that can. The
    rank's `sigcont` is recorded first, so a heal continues it even if the helper is killed."""

    name = "SIGSTOP/SIGCONT duty cycle of the rank's process tree (as cpulimit)"
    ready_timeout_s = 10.0

    def __init__(self, instead_of_quota: str | None = None) -> None:
        if instead_of_quota:  # says why a slow that asked for a CPU cap gets stops
            self.name = f"{DutyCycle.name}; no CPU quota here: {instead_of_quota}"

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        assert isinstance(fault, Slow)
        pid = _require_pid(fault, host)
        started = proc.start_time(pid)
        if started is None:
            raise UnsupportedFault(f"slow on {host.name}: its process {pid} is gone")
        entries = []
        for member, member_started in [(pid, started), *proc.descendants(pid)]:
            entry = ledger.record("sigcont", pid=member, started=member_started)
            ledger.mark(entry, "done")
            entries.append(entry)
        helper = proc.spawn_helper("chaos.dutycycle", "--pid", str(pid), "--started", str(started),
                                   "--share", repr(fault.cpu_percent), "--period", repr(fault.period),
                                   "--run-id", ledger.run_id)
        proc.wait_ready(helper, dutycycle.READY, self.ready_timeout_s)
        entries.append(record_process(ledger, helper.pid, "stop_process"))
        return entries


class SlowBySetting(Mechanism):
    """`slow`: its CPU share by `cpu`; a GPU setting (gpu_clock, power_limit) through NVML
    where root may, asked only when a fault names one (NVML's start costs every process
    that builds mechanisms, and most never set a GPU)."""

    def __init__(self, cpu: Mechanism) -> None:
        self.cpu = cpu
        self.name = cpu.name

    def for_fault(self, fault: FaultBase) -> Mechanism:
        if not (isinstance(fault, Slow) and fault.gpu_setting):
            return self.cpu.for_fault(fault)
        why_not = nvml.why_no_gpu_settings()
        return nvml.NvmlSetting() if why_not is None else Unavailable(why_not)

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        return self.for_fault(fault).apply(fault, host, ledger)


def slow_mechanism(cpu: Mechanism | None = None) -> Mechanism:
    """`slow`'s CPU share by the kernel's CPU quota where this process may write the cgroup
    files (root in the machine's user namespace), else by the duty cycle, which needs no
    privilege (`cpu`: the backend's own way); its GPU settings by NVML, where root may."""
    if cpu is None:
        why_not = cgroup.why_no_cpu_cap()
        hierarchy = cgroup.cpu_hierarchy() if why_not is None else None
        cpu = cgroup.CfsQuota(hierarchy, DutyCycle()) if hierarchy is not None else DutyCycle(why_not)
    return SlowBySetting(cpu)


def choose_mechanisms(caps: probe.Capabilities) -> dict[str, Mechanism]:
    """Per kind, the most faithful mechanism `caps` allow: netem first, then the fallbacks,
    else a refusal that says what is missing."""
    no_netem = "the kernel has no sch_netem qdisc"
    netem = NetemQdisc() if caps.netem else None
    # without BPF (an ordinary user's user namespace) nftables drops: independent loss only
    drop = BpfDrop() if caps.clsact_bpf else NftDrop() if caps.nft_bridge else None
    delay = NfqueueDelay() if caps.nfqueue_delay else None
    no_fuse = fusefs.why_no_fuse()  # /dev/fuse open to this user, mfusepy, libfuse 3
    fuse = FusePassthrough() if no_fuse is None else Unavailable(no_fuse)
    return {
        "link_down": LinkStateDown(),
        "loss": netem or drop or Unavailable(f"{no_netem}, {caps.why_not('clsact_bpf')}, and "
                                             f"{caps.why_not('nft_bridge')}"),
        "delay": netem or delay or Unavailable(f"{no_netem}, and {caps.why_not('nfqueue_delay')}"),
        "bandwidth": TbfBandwidth() if caps.tbf else Unavailable(caps.why_not("tbf")),
        "duplicate": netem or Unavailable(f"{no_netem}; duplication has no faithful fallback"),
        "corrupt": netem or Unavailable(f"{no_netem}; corruption has no faithful fallback"),
        "reorder": netem or Unavailable(f"{no_netem}; reordering has no faithful fallback"),
        "blackhole": drop or Unavailable(f"{caps.why_not('clsact_bpf')}, and {caps.why_not('nft_bridge')}"),
        "partition": NftPartition() if caps.nft_bridge else Unavailable(caps.why_not("nft_bridge")),
        "kill": SignalKill(),
        "pause": SignalStop(),
        "slow": slow_mechanism(),
        # the trial gives the run folder it writes to (harness.trial.orchestrator)
        **cmdfile.command_mechanisms(None),
        "disk_full": SizedTmpfs(),
        "read_only": ReadOnlyBind(),
        **{kind: fuse for kind in ("io_error", "io_delay", "io_stall", "lose_unsynced")},
        # a scheduler's own faults are its backend's to make (harness.cluster.slurm)
        **{kind.model_fields["kind"].default: Unavailable(NO_SCHEDULER)
           for kind in FAULT_KINDS if kind.acts_on == "scheduler"},
    }


def default_mechanisms() -> dict[str, Mechanism]:
    """Per kind, the mechanism this machine supports best (the probe runs once per process)."""
    return choose_mechanisms(probe.capabilities())


NO_LINK = "the hosts have no network of their own (ranks on the machine's loopback)"


def process_mechanisms() -> dict[str, Mechanism]:
    """Per kind, the mechanisms for hosts without a link of their own: the process and
    storage kinds' own, a refusal for every link kind; nothing is probed (it needs no privilege)."""
    chosen = choose_mechanisms(probe.Capabilities())
    return {kind.model_fields["kind"].default: chosen[kind.model_fields["kind"].default]
            if kind.acts_on != "link" else Unavailable(NO_LINK) for kind in FAULT_KINDS}


class LedgerInjection(Injection):
    def __init__(self, applied: AppliedFault, entries: list[Entry], ledger: Ledger,
                 undos: UndoTable) -> None:
        self.applied = applied
        self._pending = list(entries)
        self._ledger = ledger
        self._undos = undos
        self._t_reverted: float | None = None

    def revert(self) -> float:
        while self._pending:
            self._undos.revert(self._pending.pop(), self._ledger)  # last in, first out
        if self._t_reverted is None:
            self._t_reverted = time.monotonic()
        return self._t_reverted


class NetlinkInjector(Injector):
    """The injector for hosts reachable by netlink from this process (namespaces, containers).

    `hosts` is every host of the cluster: a partition needs them to know who is on the
    other side. `apply(..., revert_after=S)` arms the dead-man switch of a disruptive
    fault (link down, blackhole, partition): it reverts the fault S seconds later even if
    this process is dead by then. `undos` reverts what the mechanisms recorded: the fault
    library's own table unless a backend's mechanisms (`mechanisms`) record ops of their own."""

    def __init__(self, ledger: Ledger, mechanisms: dict[str, Mechanism] | None = None,
                 hosts: Sequence[Host] = (), undos: UndoTable = UNDOS) -> None:
        self.ledger = ledger
        self.mechanisms = mechanisms or default_mechanisms()
        self.hosts = tuple(hosts)
        self.undos = undos

    def mechanism(self, fault: FaultBase) -> str:
        return self._mechanism(fault).name

    def _mechanism(self, fault: FaultBase) -> Mechanism:
        try:
            return self.mechanisms[fault.kind].for_fault(fault)  # type: ignore[attr-defined]
        except KeyError:
            raise UnsupportedFault(f"no mechanism for {fault.kind!r} on this machine") from None  # type: ignore[attr-defined]

    def apply(self, fault: FaultBase, hosts: Sequence[Host],
              revert_after: float | None = None, heals_after: float | None = None) -> Injection:
        mech = self._mechanism(fault)
        if isinstance(mech, Unavailable):
            raise UnsupportedFault(f"{fault.kind} cannot be injected here: {mech.reason}")  # type: ignore[attr-defined]
        if fault.acts_on == "link" and not all(h.has_link for h in (*hosts, *self.hosts)):
            raise UnsupportedFault(f"{fault.kind} cannot be injected here: {NO_LINK}")  # type: ignore[attr-defined]
        for host in hosts:
            reason = mech.conflict(fault, host)
            if reason:
                raise FaultConflict(f"{fault.describe()} on {host.name} refused: {reason}")
        entries: list[Entry] = []
        reached: list[Host] = []
        gone: list[str] = []
        t_requested = time.monotonic()
        try:
            if isinstance(mech, ClusterMechanism):
                entries += mech.apply_cluster(fault, hosts, self.hosts, self.ledger)
                reached = list(hosts)
            else:
                for host in hosts:
                    try:
                        entries += mech.apply(fault, host, self.ledger)
                    except TargetGone as exc:  # that one ended by itself: the others still get it
                        gone.append(f"{host.name}: {exc}")
                        continue
                    reached.append(host)
                if not reached:
                    raise TargetGone("; ".join(gone))
            t_applied = time.monotonic()
            if revert_after is not None and fault.dead_man:
                entries.append(arm_dead_man(self.ledger, entries, t_applied + revert_after))
        except BaseException:
            LedgerInjection(AppliedFault(fault, (), mech.name, 0.0), entries, self.ledger,
                            self.undos).revert()
            raise
        applied = AppliedFault(fault, tuple(h.name for h in reached), mech.name, t_applied, t_requested)
        return LedgerInjection(applied, entries, self.ledger, self.undos)


def arm_dead_man(ledger: Ledger, entries: Sequence[Entry], at: float) -> Entry:
    """Start the dead-man switch that undoes `entries` at monotonic time `at`; returns its
    own (process) entry. It runs `UNDOS` only: an entry of another table is refused here,
    before the fault is left to it."""
    foreign = sorted({e.op for e in entries} - set(UNDOS.ops))
    if foreign:
        raise UnsupportedFault(f"the dead-man switch cannot undo {', '.join(foreign)}: "
                               "only the fault library's own ops (chaos.undo.UNDOS)")
    ids = ",".join(str(e.id) for e in entries)
    helper = proc.spawn_helper("chaos.deadman", "--run-id", ledger.run_id, "--state-dir",
                               str(ledger.path.parent), "--at", repr(at), "--entries", ids)
    proc.wait_ready(helper, DEAD_MAN_READY, HELPER_READY_S)
    return record_process(ledger, helper.pid)
