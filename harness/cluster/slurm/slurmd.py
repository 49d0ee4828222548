"""A node's Slurm daemon, killed and started again (the `slurmd_kill` fault), by the node's
agent: root on the node, where slurmd runs as root.

The daemon is found by its process (`slurmd`, with `-N NODE` where a host runs several:
multiple-slurmd) and recorded, with its command line, environment, working folder and
network namespace, before it is killed; the undo starts that command again, detached
(`setsid --fork`: not a descendant of the job's step, whose end kills its descendants), in
that namespace. A daemon already running again (systemd restarted it) is left alone.
Kept light: every heal imports it (harness.cluster.slurm.undo)."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from chaos import proc

DAEMON = "slurmd"
NAMED_NAMESPACES = Path("/run/netns")
KILLED_WAIT_S = 2.0
START_TIMEOUT_S = 10.0
COPY_EXEC_WAIT_S = 1.0


def _argv(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return None


def daemons(node: str, settle_s: float = COPY_EXEC_WAIT_S) -> list[int]:
    """The pids of the slurmd serving `node` on this host: the one started with `-N node`,
    else the only one started without -N. A step's slurmstepd is a copy of the daemon until
    its exec: slurmd forks, and that child forks the one that execs and exits (the copy is an
    orphan for a moment), once per step launched. A copy whose parent is found is left out at
    once; while more than one remain they are looked at again for `settle_s`, and only those
    there every time count: copies come and go (a busy node launches steps back to back), a
    second daemon stays."""
    deadline = time.monotonic() + settle_s
    stayed: set[int] | None = None
    while True:
        found = _named_or_plain(node)
        alone = {pid for pid in found if proc.parent(pid) not in found}
        stayed = alone if stayed is None else stayed & alone
        if len(alone) <= 1:
            return sorted(alone)
        if time.monotonic() >= deadline:
            return sorted(stayed)
        time.sleep(0.02)


def described(pids: list[int]) -> str:
    """Each process as a line of an error: pid, parent, age, command line."""
    ticks, now = os.sysconf("SC_CLK_TCK"), time.clock_gettime(time.CLOCK_BOOTTIME)
    return "; ".join(f"pid {pid} (parent {proc.parent(pid)}, "
                     f"{now - (proc.start_time(pid) or 0) / ticks:.1f} s old): {' '.join(_argv(pid) or ['gone'])}"
                     for pid in pids)


def _named_or_plain(node: str) -> list[int]:
    named, plain = [], []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        argv = _argv(int(entry.name))
        if not argv or os.path.basename(argv[0]) != DAEMON:
            continue
        if "-N" in argv[:-1]:
            if argv[argv.index("-N") + 1] == node:
                named.append(int(entry.name))
        else:
            plain.append(int(entry.name))
    return named or plain


def _namespace_of(pid: int) -> str | None:
    """A named network namespace holding `pid` (a node of a local cluster), or None: the
    host's own, where nothing needs entering."""
    try:
        inode = os.stat(f"/proc/{pid}/ns/net").st_ino
        if inode == os.stat("/proc/1/ns/net").st_ino:
            return None
        return next((str(p) for p in NAMED_NAMESPACES.iterdir() if p.stat().st_ino == inode), None)
    except OSError:
        return None


def describe(pid: int) -> dict[str, Any]:
    """What starts the daemon `pid` again as it was: the ledger entry's arguments."""
    argv = _argv(pid)
    if not argv:
        raise ProcessLookupError(f"slurmd (pid {pid}) ended before it was recorded")
    env = dict(line.split("=", 1) for line in
               Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0") if "=" in line)
    return {"argv": argv, "env": env, "cwd": os.readlink(f"/proc/{pid}/cwd"), "netns": _namespace_of(pid)}


def kill(pid: int) -> None:
    """SIGKILL, and wait (with a deadline) until it is gone: the fault is on when it returns."""
    proc.send_signal(pid, signal.SIGKILL, proc.start_time(pid), gone_ok=True)
    deadline = time.monotonic() + KILLED_WAIT_S
    while proc.state(pid) not in (None, "Z"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"slurmd (pid {pid}) still there {KILLED_WAIT_S:g} s after SIGKILL")
        time.sleep(0.01)


def start_again(args: dict[str, Any]) -> None:
    """The undo: the recorded daemon, unless one runs with its command line already."""
    argv = list(args["argv"])
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _argv(int(entry.name)) == argv:
            return
    if args.get("netns"):
        if not os.path.exists(args["netns"]):
            return  # its node is gone (a local cluster taken down): nothing to serve
        argv = ["nsenter", f"--net={args['netns']}", *argv]
    subprocess.run(["setsid", "--fork", *argv], env=args["env"], cwd=args["cwd"], check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=START_TIMEOUT_S)
