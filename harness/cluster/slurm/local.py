"""A real Slurm cluster on this machine, for trying the slurm backend and testing it:
`chaos slurm up --nodes N`, `chaos slurm status`, `chaos slurm down`.

Debian's slurm-wlm (22.05) and munge, unchanged: one munged and one slurmctld of the
cluster's own, and N slurmd (multiple-slurmd: `slurmd -N NAME`), each node a network host
of its own laid out as a run's hosts are (`chaos.topology`: node i is host i's namespace,
eth0 at 10.77.0.(10+i) on the switch's bridge). slurmctld runs in the switch namespace on
the bridge's address; a login link (a veth from the bridge into this namespace, 10.77.0.2)
lets srun, sbatch and squeue here reach the controller and the nodes, and the nodes' step
daemons reach srun. Made in the switch namespace, the link goes with it.

Everything is written to the cluster's ledger (id `slurm<hex>`) before it is made, so
`chaos slurm down`, `chaos heal` and a heal after a SIGKILL take it all back. The cluster
outlives the command that built it: its ledger names slurmctld as a second owner, so the
heal every run does first leaves a live cluster alone, and takes back one whose controller
died.

What Slurm needs of the host, and why this is the layout:
- slurmd is started with nsenter --net, not `ip netns exec`: the latter mounts a /sys of the
  namespace, where slurmd finds no cgroup filesystem and the node stays down.
- proctrack/linuxproc and task/none keep Slurm off cgroups (this machine has v1; nodes
  sharing one kernel would share one hierarchy anyway).
- Every node reports the host's CPUs; `--cpus-per-node` overrides it (config_overrides).
- Root only: slurmd starts each job's tasks as the job's user, which needs root (an
  ordinary user's user namespace maps only that user, and munge refuses to run there as
  the root it would appear to be).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from chaos import netlink, proc, topology
from chaos.errors import DeadlineExceeded, HarnessError, UsageError
from chaos.heal import heal_run, owner_alive
from chaos.undotable import HealReport
from chaos.ledger import Ledger, ledger_run_ids, make_state_dir, state_dir
from chaos.mechanism import record_process
from chaos.undo import record_owner
from harness.cluster.undos import undo_table
from harness.cluster.slurm import commands

ID_PREFIX = "slurm"
LOGIN_ADDRESS = str(topology.NETWORK.network_address + 2)
LOGIN_PORT = "login"
CTLD_PORT, SLURMD_PORT = 6817, 6818
PARTITION = "chaos"
UP_TIMEOUT_S = 60.0
DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
INSTALL = "apt-get install slurm-wlm munge"
CLUSTER_FILE = "cluster.json"
# A job's end: Slurm waits KillWait between SIGTERM and SIGKILL (its default 30 s would
# make every trial's teardown long). SlurmdTimeout is Slurm's default: a node whose daemon
# has not answered for 300 s is declared down and its steps cancelled, as on a real
# cluster, where a link fault on a node's only interface also cuts its daemon off.
# `--slurmd-timeout` shortens it for a slurmd_kill that should end in a node declared down
# within a trial (docs/slurm.md).
KILL_WAIT_S, SLURMD_TIMEOUT_S, MIN_SLURMD_TIMEOUT_S = 5, 300, 10
CRED_EXPIRE_S = 10
# Who may reach what in the cluster's folder (in the state folder, which anyone may pass
# through): the users of the cluster pass through the folder, without listing it, to
# slurm.conf and munged's socket (munged makes it 0777), and through the spool to a batch
# job's script (slurmstepd runs it as the job's user); the munge key, slurmctld's state
# and the logs are root's. Set by chmod, so that no umask decides.
MODES = {"": 0o711, "slurm.conf": 0o644, "spool": 0o711, "munge.key": 0o400, "state": 0o700, "log": 0o700}


@dataclass(frozen=True)
class LocalCluster:
    id: str
    nodes: tuple[str, ...]
    addresses: tuple[str, ...]
    cpus_per_node: int
    conf: str

    @property
    def folder(self) -> Path:
        return Path(self.conf).parent


def node_name(index: int) -> str:
    return f"node{index + 1:02d}"


def running() -> list[LocalCluster]:
    """The local clusters whose ledger has a live owner (their controller)."""
    found = []
    for rid in ledger_run_ids():
        if rid.startswith(ID_PREFIX) and owner_alive(Ledger(rid)):
            path = state_dir() / rid / CLUSTER_FILE
            if path.exists():
                data = json.loads(path.read_text())
                found.append(LocalCluster(**{**data, "nodes": tuple(data["nodes"]),
                                             "addresses": tuple(data["addresses"])}))
    return found


def _missing() -> list[str]:
    return [name for name in DAEMONS if shutil.which(name) is None
            and not Path(f"/usr/sbin/{name}").exists()]


def _daemon(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _conf(cluster_id: str, folder: Path, nodes: int, cpus: int, slurmd_timeout: int) -> str:
    host = socket.gethostname()
    lines = [
        f"ClusterName={cluster_id}",
        f"SlurmctldHost={host}({topology.SWITCH_ADDRESS})",
        "SlurmUser=root", "SlurmdUser=root",
        f"SlurmctldPort={CTLD_PORT}", f"SlurmdPort={SLURMD_PORT}",
        # cred_expire is also how long a requeued job waits before it may start again
        # (Slurm's default 120 s); a test cluster's trials would spend most of their time there
        "AuthType=auth/munge", f"AuthInfo=socket={folder / 'munge.sock'},cred_expire={CRED_EXPIRE_S}",
        "CredType=cred/munge",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool'}/%n",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd'}-%n.pid",
        f"SlurmctldLogFile={folder / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'log'}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2", "MpiDefault=none", "JobRequeue=1",
        f"KillWait={KILL_WAIT_S}", f"SlurmdTimeout={slurmd_timeout}",
        "SchedulerParameters=sched_interval=1", "MessageTimeout=5",
        "PreemptType=preempt/none",
    ]
    for i in range(nodes):
        lines.append(f"NodeName={node_name(i)} NodeAddr={topology.host_address(i)} NodeHostname={host} "
                     f"CPUs={cpus} State=UNKNOWN")
    lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _start(ledger: Ledger, argv: list[str], log: Path, ns: str | None = None) -> int:
    """A daemon in the foreground, in a session of its own, recorded to be SIGKILLed."""
    if ns is not None:
        argv = ["nsenter", f"--net={ns}", *argv]
    with open(log, "ab") as out:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    record_process(ledger, child.pid)
    return child.pid


def _wait(what: str, ready, timeout_s: float, log: Path):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = ready()
        if got:
            return got
        time.sleep(0.2)
    tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
    raise DeadlineExceeded(f"{what} within {timeout_s:.0f} s; {log}: " + (" | ".join(tail) or "empty"))


def _login_link(switch_ns: str, ifname: str) -> None:
    """A veth from the switch's bridge into this namespace, for srun, sbatch and squeue."""
    with netlink.translated("plug the login link"), netlink.route(switch_ns) as ipr:
        ipr.link("add", ifname=LOGIN_PORT, kind="veth",
                 peer={"ifname": ifname, "net_ns_fd": f"/proc/{os.getpid()}/ns/net"})
        ipr.link("set", index=netlink.link_index(ipr, LOGIN_PORT), state="up",
                 master=netlink.link_index(ipr, topology.BRIDGE))
    with netlink.translated("address the login link"), netlink.route(None) as ipr:
        index = netlink.link_index(ipr, ifname)
        ipr.addr("add", index=index, address=LOGIN_ADDRESS, prefixlen=topology.NETWORK.prefixlen)
        ipr.link("set", index=index, state="up")


def up(nodes: int, cpus_per_node: int | None = None, say=print,
       slurmd_timeout: int = SLURMD_TIMEOUT_S) -> LocalCluster:
    """Build and start a local cluster of `nodes` nodes; returns once every node is idle.
    On any failure what was made is taken back."""
    if os.geteuid() != 0:
        raise UsageError("chaos slurm up needs root: slurmd starts each job's tasks as the job's user. "
                         "Run it as root (sudo), or point SLURM_CONF at a cluster you have")
    if missing := _missing():
        raise UsageError(f"chaos slurm up: {', '.join(missing)} not found: {INSTALL}")
    if slurmd_timeout < MIN_SLURMD_TIMEOUT_S:
        raise UsageError(f"--slurmd-timeout {slurmd_timeout}: expected {MIN_SLURMD_TIMEOUT_S} s or more (the "
                         "controller pings every third of it; shorter declares nodes down under load)")
    if nodes < 1 or nodes > topology.MAX_HOSTS:
        raise UsageError(f"--nodes {nodes}: expected 1 to {topology.MAX_HOSTS}")
    if others := running():
        raise UsageError(f"a local Slurm cluster already runs ({others[0].id}, SLURM_CONF={others[0].conf}): "
                         "one at a time, since its login link holds 10.77.0.0/16 here; "
                         "`chaos slurm down` first, or use it")
    cpus = cpus_per_node or os.cpu_count() or 1
    cluster_id = f"{ID_PREFIX}{secrets.token_hex(2)}"
    folder = make_state_dir() / cluster_id
    for sub in ("", "state", "spool", "log"):
        (folder / sub).mkdir()
        (folder / sub).chmod(MODES[sub])
    ledger = Ledger(cluster_id)
    record_owner(ledger)
    began = time.monotonic()
    try:
        hosts = [topology.host_at(cluster_id, i) for i in range(nodes)]
        switch_ns = topology.switch_namespace(cluster_id)
        topology.build(ledger, hosts)
        _login_link(switch_ns, cluster_id)
        key = folder / "munge.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, MODES[key.name])  # never readable by others
        with os.fdopen(fd, "wb") as out:
            out.write(os.urandom(1024))
        sock = folder / "munge.sock"
        log = folder / "log"
        _start(ledger, [_daemon("munged"), "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                        f"--pid-file={folder / 'munged.pid'}", f"--seed-file={folder / 'munged.seed'}",
                        f"--log-file={log / 'munged.log'}"], log / "munged.out")
        _wait("munged did not open its socket", sock.exists, 10.0, log / "munged.log")
        conf = folder / "slurm.conf"
        conf.write_text(_conf(cluster_id, folder, nodes, cpus, slurmd_timeout))
        conf.chmod(MODES[conf.name])
        ctld = _start(ledger, [_daemon("slurmctld"), "-D", "-f", str(conf)], log / "slurmctld.out",
                      ns=topology.namespace_path(switch_ns))
        for i, host in enumerate(hosts):
            _start(ledger, [_daemon("slurmd"), "-D", "-N", node_name(i), "-f", str(conf)],
                   log / f"slurmd-{node_name(i)}.out", ns=host.ns_path)
        os.environ["SLURM_CONF"] = str(conf)
        cluster = LocalCluster(cluster_id, tuple(node_name(i) for i in range(nodes)),
                               tuple(h.address for h in hosts), cpus, str(conf))
        (folder / CLUSTER_FILE).write_text(json.dumps(asdict(cluster), indent=2) + "\n")
        _wait(f"the {nodes} nodes were not idle", lambda: _all_idle(nodes), UP_TIMEOUT_S, log / "slurmctld.log")
        # from here the controller owns the cluster: a heal leaves it alone while it lives
        ledger.mark(ledger.record("owner", pid=ctld, started=proc.start_time(ctld)), "done")
    except BaseException:
        heal_run(cluster_id, HealReport(), undo_table())
        shutil.rmtree(folder, ignore_errors=True)
        raise
    say(f"chaos slurm: {nodes} nodes ({cluster.nodes[0]}..{cluster.nodes[-1]}, {cpus} CPUs each) up in "
        f"{time.monotonic() - began:.1f} s; cluster {cluster_id}")
    return cluster


def _all_idle(nodes: int) -> bool:
    out = commands.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout_s=10.0, check=False)
    states = [line.split()[1] for line in out.splitlines() if len(line.split()) == 2]
    return len(states) == nodes and all(s == "idle" for s in states)


def down(cluster_id: str | None = None) -> list[str]:
    """Take back the local cluster(s) (every one this user's state folder names, or one);
    returns what was undone. Jobs die with their daemons."""
    ids = [cluster_id] if cluster_id else [rid for rid in ledger_run_ids() if rid.startswith(ID_PREFIX)]
    report = HealReport()
    for rid in ids:
        heal_run(rid, report, undo_table())
        shutil.rmtree(state_dir() / rid, ignore_errors=True)
    if report.failed:
        raise HarnessError("could not undo: " + "; ".join(report.failed))
    return ids

