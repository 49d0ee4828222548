"""`slow` by the kernel's CPU bandwidth controller (CFS quota): the rank's processes moved
into a cgroup of the run's own, capped at `cpu_percent` of one CPU per `period` (cgroup v2
`cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`). A process the rank starts later is
born in it, and the kernel throttles the group inside each period: no helper process, no
signals, nothing a rank can see but time.

Who gets it: root in the machine's own user namespace, where the cgroup filesystem is
writable. An ordinary user (its own user namespace; the cgroup files stay the real root's)
and a container's rank (its cgroup is the engine's) get the SIGSTOP/SIGCONT duty cycle
(chaos.dutycycle), which needs no privilege. `why_no_cpu_cap()` says which and why.

The entry is written before the cgroup is made, naming it and the cgroup the rank came
from; its undo (`cgroup_cpu`) moves every process still in it back there and removes it,
so a revert, a heal after a SIGKILL and a later run's heal run the same code.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos import proc
from chaos.api import Host
from chaos.errors import InjectionError, UnsupportedFault
from chaos.faults import FaultBase, Slow
from chaos.ledger import Entry, Ledger
from chaos.mechanism import Mechanism
from chaos.undotable import UndoTable

RMDIR_TRIES, RMDIR_PAUSE_S = 50, 0.01  # a process leaving the group may linger there a moment


@dataclass(frozen=True)
class CpuHierarchy:
    """Where the cpu controller is mounted, and which cgroup version it is."""

    mount: str
    version: int

    def cgroup_of(self, pid: int) -> str:
        """The cgroup `pid` is in, as a folder of this hierarchy."""
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if (self.version == 2 and controllers == "") or "cpu" in controllers.split(","):
                return os.path.join(self.mount, path.lstrip("/"))
        raise InjectionError(f"process {pid} is in no cgroup of the cpu controller")

    def cap(self, folder: str, share: float, period_s: float) -> None:
        period_us = max(1000, round(period_s * 1_000_000))
        quota_us = max(1000, round(share * period_us))
        if self.version == 2:
            Path(folder, "cpu.max").write_text(f"{quota_us} {period_us}")
        else:
            Path(folder, "cpu.cfs_period_us").write_text(str(period_us))
            Path(folder, "cpu.cfs_quota_us").write_text(str(quota_us))


def _mounts() -> list[tuple[str, str, list[str]]]:
    """(mount point, type, options) of every cgroup filesystem."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, fstype, options = line.split()[:4]
        if fstype in ("cgroup", "cgroup2"):
            found.append((point, fstype, options.split(",")))
    return found


def cpu_hierarchy() -> CpuHierarchy | None:
    """The hierarchy with the cpu controller whose children can be capped, or None."""
    for point, fstype, options in _mounts():
        if fstype == "cgroup" and "cpu" in options and os.path.exists(os.path.join(point, "cpu.cfs_quota_us")):
            return CpuHierarchy(point, 1)
        if fstype == "cgroup2":
            try:
                enabled = Path(point, "cgroup.subtree_control").read_text().split()
            except OSError:
                continue
            if "cpu" in enabled:
                return CpuHierarchy(point, 2)
    return None


def _own_user_namespace() -> bool:
    """Whether this process is in a user namespace other than the machine's (its root
    there is not root of the cgroup files)."""
    try:
        first = Path("/proc/self/uid_map").read_text().split()
    except OSError:
        return False
    return first[:3] != ["0", "0", "4294967295"]


def why_no_cpu_cap() -> str | None:
    """Why `slow` cannot be a CFS quota here (then it is the duty cycle), or None."""
    if os.geteuid() != 0 or _own_user_namespace():
        return "the cgroup files are the machine's root's (an ordinary user, or a user namespace)"
    hierarchy = cpu_hierarchy()
    if hierarchy is None:
        return "no cgroup hierarchy with the cpu controller enabled for its children"
    if not os.access(hierarchy.mount, os.W_OK):
        return f"{hierarchy.mount} is not writable (a container's read-only cgroup filesystem)"
    return None


def _undo_cgroup_cpu(args: dict[str, Any]) -> None:
    """Move every process still in the run's cgroup back where the rank was, then remove it."""
    folder, home = args["path"], args["home"]
    if not os.path.isdir(folder):
        return  # already gone
    back = home if os.path.isdir(home) else args["mount"]
    for _ in range(RMDIR_TRIES):
        try:
            members = Path(folder, "cgroup.procs").read_text().split()
        except FileNotFoundError:
            return
        for pid in members:
            try:
                Path(back, "cgroup.procs").write_text(pid)
            except ProcessLookupError:
                pass  # exited meanwhile
        try:
            os.rmdir(folder)
            return
        except FileNotFoundError:
            return
        except OSError:  # EBUSY: a process not yet gone from it (or one born meanwhile)
            time.sleep(RMDIR_PAUSE_S)
    raise InjectionError(f"cgroup {folder} still holds processes: move them to {back} and rmdir it")


UNDOS = UndoTable({"cgroup_cpu": _undo_cgroup_cpu})


class CfsQuota(Mechanism):
    """`slow`: the rank's process tree in a cgroup capped at `cpu_percent` of one CPU; a
    `slow` with `stops` goes to `stops` (the duty cycle)."""

    name = "cgroup CPU quota of the rank's processes (CFS bandwidth)"

    def __init__(self, hierarchy: CpuHierarchy, stops: Mechanism) -> None:
        self.hierarchy = hierarchy
        self.stops = stops

    def for_fault(self, fault: FaultBase) -> Mechanism:
        return self.stops if isinstance(fault, Slow) and fault.stops else self

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        assert isinstance(fault, Slow)
        if host.pid is None or proc.start_time(host.pid) is None:
            raise UnsupportedFault(f"slow on {host.name}: it has no live process")
        pid = host.pid
        folder = os.path.join(self.hierarchy.mount, f"chaos-{ledger.run_id}-{host.name}")
        entry = ledger.record("cgroup_cpu", path=folder, home=self.hierarchy.cgroup_of(pid),
                              mount=self.hierarchy.mount)
        try:
            os.mkdir(folder)
            self.hierarchy.cap(folder, fault.cpu_percent, fault.period)
            # the rank first: a child it forks meanwhile is born in the group
            for member, _ in [(pid, None), *proc.descendants(pid)]:
                try:
                    Path(folder, "cgroup.procs").write_text(str(member))
                except ProcessLookupError:
                    pass  # exited meanwhile
        except BaseException:
            _undo_cgroup_cpu(entry.args)
            ledger.mark(entry, "undone")
            raise
        ledger.mark(entry, "done")
        return [entry]
