"""A Slurm node's agent: the rank launcher of its node (harness.cluster.zygote), started by
srun as one task on the node, talking to the harness through srun's standard input and
output, with the node's own ops beside the launcher's:

    {"op": "signal", "target": "r005", "signal": 15}   -> {"t"}: to the rank's process tree
    {"op": "fault", "id": 3, "fault": {...}, "targets": ["r004", ...], "heals_after": s|null,
     "revert_after": s}                              -> {"t", "t_requested", "mechanism"}
    {"op": "revert", "id": 3}                        -> {"t"}: when it was reverted
    {"op": "clock"}                                  -> {"t", "boot_id"}: the node's monotonic clock
    {"op": "clock_offset", "offset": s}              -> {"t"}: node clock - harness clock, for
                                                        the events of what it starts (runfolder.events)

A `slurmd_kill` fault kills the node's Slurm daemon (harness.cluster.slurm.slurmd); its
revert starts it again.

A link fault acts on the node's own interface (the one holding its Slurm address), so on
every rank of the node at once, as a NIC or cable failure does; a process fault on the
rank's processes. While its own link is faulted the node cannot hear the harness (srun's
traffic crosses that link too), so the agent reverts a link fault itself when its on-phase
ends (`heals_after`); the harness's revert then only reads when that was. Both go through the fault library's injector with the node's own ledger
(`<run id>.<node>` in the node's state folder), recorded before they are made. The agent
reverts what is still on when the harness goes (srun's input closes: the harness died or
closed it), and arms the dead-man switch of every disruptive link fault, so that a link
taken down for good comes back even if Slurm kills the agent (the node's traffic to srun
cannot flow while it is down). What an agent killed that way left is its ledger's, which
the next heal on the node takes back.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from chaos import netlink, proc
from chaos.api import AppliedFault, Host, Injection
from chaos.faults import FaultBase, fault_from_wire, parse_fault
from chaos.inject import DutyCycle, LedgerInjection, NetlinkInjector, SignalKill, SignalStop, slow_mechanism
from chaos.ledger import Ledger
from chaos.tc import BpfDrop
from chaos.undo import UNDOS, record_owner, undo_outstanding
from harness.cluster import zygote
from harness.cluster.hosttmp import TemporaryFolders
from harness.cluster.slurm import nodecheck, slurmd
from runfolder.events import CLOCK_OFFSET_ENV
from harness.cluster.slurm.undo import NODE_UNDOS, node_run_id

OWN_NAMESPACE = "/proc/self/ns/net"  # the node's: the agent's, the dead-man switch's, a heal's on the node
NODES_DIR = "nodes"  # under the run folder: each agent's facts, which prove the folder is shared
# The link kinds a node's own interface takes; the others need the switch side of a link
# (a delay line, a partition between hosts) or a second qdisc on one device.
LINK_KINDS = ("link_down", "blackhole", "loss")
LINK_APPLY_LEAD_S = 0.1  # a link fault goes on this long after its answer left (srun's traffic crosses the link)
TICK_S = 0.02            # the launcher's loop turns at least this often
LEFT_SOMETHING = 3       # the agent's exit status when its ledger is not clean: a heal on the node is due


def boot_id() -> str:
    """The running kernel's identity: processes under one kernel share one monotonic clock."""
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def interface_of(address: str) -> str:
    """The interface holding `address` in this namespace."""
    with netlink.route(None) as ipr:
        for addr in ipr.get_addr(address=address):
            return ipr.get_links(addr["index"])[0].get_attr("IFLA_IFNAME")
    raise RuntimeError(f"no interface on this node holds {address} (the node's Slurm NodeAddr)")


class Agent(zygote.NodeOps):
    def __init__(self, run_id: str, node: str, address: str) -> None:
        self.node = node
        self.ifname = interface_of(address)
        self.link = Host(name=node, address=address, switch_ns=OWN_NAMESPACE, port=self.ifname,
                         ns_path=OWN_NAMESPACE, ifname=self.ifname)
        self.ledger = Ledger(node_run_id(run_id, node))
        record_owner(self.ledger, place=node)  # its namespace is "this process's": healed on the node only
        self.temporary_folders = TemporaryFolders(self.ledger, run_id)  # on the node's own disk
        # A link down seen from the node is a lost carrier: its interface stays up with its
        # routes and nothing passes either way (the netns backend's switch-side port down does
        # that to a host). Setting the node's own interface down instead removes its routes:
        # its sends fail at once, and a 20 s outage recovered 3 s sooner than on netns.
        mechanisms = {"link_down": BpfDrop(own_interface=True), "blackhole": BpfDrop(own_interface=True),
                      "loss": BpfDrop(own_interface=True),
                      "kill": SignalKill(), "pause": SignalStop(), "slow": slow_mechanism(DutyCycle())}
        self.injector = NetlinkInjector(self.ledger, mechanisms, hosts=(self.link,), undos=UNDOS)
        self.faults: dict[int, Injection] = {}
        self.scheduled: list[tuple[float, int, FaultBase, float | None, float | None]] = []  # link faults announced
        self.due: dict[int, float] = {}  # fault id -> when the agent reverts it itself
        self.reverted: dict[int, float] = {}
        self.kill_at: float | None = None   # a preemption's grace ends: every rank's tree SIGKILLed
        self.ranks: dict[int, str] = {}     # the launcher's live children (pid -> name), as it keeps them

    def _pid(self, target: str, names: dict[int, str]) -> int | None:
        return next((pid for pid, name in names.items() if name == target), None)

    def answer(self, cmd: dict[str, Any], names: dict[int, str]) -> dict[str, Any]:
        op = cmd["op"]
        if op == "clock":
            return {"t": time.monotonic(), "boot_id": boot_id()}
        if op == "clock_offset":  # every process started on the node from now writes events on the harness's clock
            os.environ[CLOCK_OFFSET_ENV] = repr(float(cmd["offset"]))
            return {"t": time.monotonic()}
        if op == "signal":
            pid = self._pid(cmd["target"], names)
            if pid is not None:
                proc.signal_tree(pid, cmd["signal"], proc.start_time(pid), gone_ok=True)
            return {"t": time.monotonic(), "gone": pid is None}
        if op == "fault":
            fault = fault_from_wire(cmd["fault"])
            if fault.kind == "slurmd_kill":  # type: ignore[attr-defined]
                return self._kill_slurmd(cmd["id"])
            if fault.acts_on == "process":
                hosts = [Host(name=t, address=self.link.address, switch_ns=None, port=None, ns_path=None,
                              pid=self._pid(t, names)) for t in cmd["targets"]]
            else:
                hosts = [self.link]
            if fault.acts_on == "process":
                injection = self._apply(cmd["id"], fault, hosts, cmd.get("revert_after"))
                return {"t": injection.applied.t_applied, "t_requested": injection.applied.t_requested,
                        "mechanism": injection.applied.mechanism}
            if (why := nodecheck.allowed(nodecheck.effective_caps(), os.geteuid())[fault.kind]) != "yes":
                raise PermissionError(f"{fault.kind} on {self.node}: {why} (`chaos doctor --backend slurm`)")
            if getattr(fault, "direction", "both") != "both":
                raise ValueError(f"{fault.kind} on a node's own interface takes direction both only")
            # The answer must leave before the link goes: it is sent now, and the fault put on
            # at the time it names (the kernel's acknowledgement follows within a millisecond)
            now = time.monotonic()
            at = now + LINK_APPLY_LEAD_S
            self.scheduled.append((at, cmd["id"], fault, cmd.get("heals_after"), cmd.get("revert_after")))
            return {"t": at, "t_requested": now, "mechanism": self.injector.mechanism(fault)}
        if op == "kill_after":
            # Slurm's own SIGKILL after a preemption comes KillWait after its SIGTERM, and
            # `scancel --signal=KILL` too is a cancel with KillWait: a shorter grace is the agent's
            self.kill_at, self.ranks = time.monotonic() + cmd["seconds"], names
            return {"t": time.monotonic()}
        if op == "revert":
            self.tick()  # one announced and not yet due is put on and taken off, as planned
            self.due.pop(cmd["id"], None)
            injection = self.faults.pop(cmd["id"], None)
            t = injection.revert() if injection is not None else self.reverted.pop(cmd["id"], time.monotonic())
            return {"t": t}
        return super().answer(cmd, names)

    def spawning(self, cmd: dict[str, Any]) -> dict[str, Any]:
        if cmd["entry"] != "exec":
            return cmd
        config = self.temporary_folders.launch(cmd["name"], cmd["config"])
        if config.get("hostname") and not shares_a_hostname(self.node, socket.gethostname()):
            config = {**config, "hostname": None}  # the node's own name, which its peers resolve
        return {**cmd, "config": config}

    def _kill_slurmd(self, index: int) -> dict[str, Any]:
        """The node's daemon, recorded (to start it again) and killed; its revert is the undo."""
        t_requested = time.monotonic()
        pids = slurmd.daemons(self.node)
        if len(pids) != 1:
            raise RuntimeError(f"slurmd of {self.node}: {len(pids) or 'no'} daemons found on this host "
                               "(one expected: `slurmd -N NODE` where a host runs several)"
                               + (f": {slurmd.described(pids)}" if pids else ""))
        entry = self.ledger.record("slurmd_killed", **slurmd.describe(pids[0]))
        slurmd.kill(pids[0])
        self.ledger.mark(entry, "done")
        self.faults[index] = LedgerInjection(
            AppliedFault(parse_fault({"kind": "slurmd_kill"}), (self.node,), f"SIGKILL to slurmd (pid {pids[0]})",
                         time.monotonic(), t_requested), [entry], self.ledger, NODE_UNDOS)
        applied = self.faults[index].applied
        return {"t": applied.t_applied, "t_requested": t_requested, "mechanism": applied.mechanism}

    def _apply(self, index: int, fault: FaultBase, hosts: list[Host], revert_after: float | None) -> Injection:
        injection = self.injector.apply(fault, hosts, revert_after=revert_after)
        if fault.reversible:
            self.faults[index] = injection
        return injection

    def tick(self) -> None:
        if self.kill_at is not None and time.monotonic() >= self.kill_at:
            self.kill_at = None
            for pid, name in list(self.ranks.items()):
                if not name.startswith("tap-"):
                    proc.signal_tree(pid, signal.SIGKILL, proc.start_time(pid), gone_ok=True)
        for at, index, fault, heals_after, revert_after in list(self.scheduled):
            if (left := at - time.monotonic()) > TICK_S:
                continue
            time.sleep(max(0.0, left))
            self.scheduled.remove((at, index, fault, heals_after, revert_after))
            applied = self._apply(index, fault, [self.link], revert_after).applied
            print(f"fault {index} {fault.kind}: announced for {at:.6f}, the kernel acknowledged at "
                  f"{applied.t_applied:.6f}", file=sys.stderr, flush=True)
            if heals_after is not None:
                self.due[index] = at + heals_after
        now = time.monotonic()
        for index in [i for i, at in self.due.items() if at <= now]:
            del self.due[index]
            self.reverted[index] = self.faults.pop(index).revert()

    def close(self) -> None:
        for index in sorted(self.faults, reverse=True):
            self.faults.pop(index).revert()
        undo_outstanding(self.ledger, NODE_UNDOS)
        self.ledger.close_if_clean()

    @property
    def clean(self) -> bool:
        """Everything it did is taken back: its ledger is closed (the harness needs no heal on
        the node then)."""
        return not self.ledger.path.exists()


def shares_a_hostname(node: str, hostname: str) -> bool:
    """Whether the node's processes see a hostname that is not the node's own: a node of the
    local cluster (a network namespace) has the machine's. A framework that advertises its
    hostname to peers (torchft) gets one of its own there (harness.cluster.jobstart); on a
    cluster's own machines the name is the node's, which the others resolve."""
    return hostname.split(".")[0] != node


def main(argv: list[str] | None = None) -> bool:
    """The agent until the harness closes its input; whether it left the node clean."""
    parser = argparse.ArgumentParser(prog="python -m harness.cluster.slurm.agent")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--address", required=True, help="the node's address (its Slurm NodeAddr)")
    args = parser.parse_args(argv)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    agent = Agent(args.run_id, node, args.address)
    facts = {"node": node, "ifname": agent.ifname, "slurm_job": os.environ.get("SLURM_JOB_ID"),
             "slurm_step": os.environ.get("SLURM_STEP_ID"),
             "kinds": nodecheck.allowed(nodecheck.effective_caps(), os.geteuid())}
    # written where the harness reads the ranks' events: if it cannot see this, it cannot see those
    shared = args.run_dir / NODES_DIR / f"{node}.json"
    shared.parent.mkdir(parents=True, exist_ok=True)
    shared.write_text(json.dumps(facts) + "\n")

    def ended_by_slurm(signum: int, frame: object) -> None:
        # scancel, a time limit, a preemption: Slurm signals every process of the step, the
        # ranks too, and SIGKILLs them after KillWait; the agent gives the node back its
        # link and goes on reporting how its ranks end (a job that checkpoints on SIGTERM)
        agent.close()
    signal.signal(signal.SIGTERM, ended_by_slurm)
    zygote.main(agent, ready=facts)
    return agent.clean


if __name__ == "__main__":
    clean = main()
    sys.stdout.flush()
    os._exit(0 if clean else LEFT_SOMETHING)  # skip the interpreter's teardown of torch
