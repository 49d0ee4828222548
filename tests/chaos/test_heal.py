"""SIGKILL in the middle of each kind of fault, then `chaos heal`: nothing is left behind.

A child process applies a fault to a cluster the test built and is killed with SIGKILL
while the fault is on. The fault's ledger belongs to its own run id, so the heal of that
run must undo the fault itself (qdiscs, filters, rules, delayer, stopped process) on the
cluster, which stays up for the checks; the cluster is healed by its fixture afterwards.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from chaos import netlink, nft, proc
from chaos.heal import heal_main
from chaos.ledger import Ledger

from .conftest import new_run_id

pytestmark = pytest.mark.requires_root

CHILD = """
import json, sys, time
from chaos.api import Host
from chaos.faults import parse_fault
from chaos.inject import NetlinkInjector
from chaos.ledger import Ledger
run_id, fault, hosts, target, revert_after = json.loads(sys.argv[1])
hosts = [Host(**h) for h in hosts]
injector = NetlinkInjector(Ledger(run_id), hosts=hosts)
injector.apply(parse_fault(fault), [hosts[target]], revert_after=revert_after)
print("applied", flush=True)
time.sleep(60)
"""

FAULTS = [
    {"kind": "loss", "percent": "30%"},
    {"kind": "loss", "percent": "10%", "burst": 5, "direction": "to_host"},
    {"kind": "delay", "latency": "20ms", "jitter": "5ms", "distribution": "normal"},
    {"kind": "bandwidth", "rate": "10mbit"},
    {"kind": "blackhole"},
    {"kind": "partition"},
    {"kind": "link_down"},
    {"kind": "pause"},
]


def kernel_state(cluster) -> dict:
    sw = cluster.hosts[0].switch_ns
    return {
        "port_qdiscs": {h.port: sorted(q["kind"] for q in netlink.qdiscs(sw, h.port)) for h in cluster.hosts},
        "eth0_qdiscs": {h.name: sorted(q["kind"] for q in netlink.qdiscs(h.ns_path, h.ifname)) for h in cluster.hosts},
        "tables": nft.tables(sw) + nft.tables(sw, nft.NFPROTO_IPV4),
        "ports_up": [netlink.link_is_up(sw, h.port) for h in cluster.hosts],
    }


def process_state(pid: int) -> str:
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: "-".join(str(v) for v in f.values()))
def test_sigkill_mid_fault_then_heal_leaves_nothing(cluster, state_dir, fault):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    hosts = [h.__dict__ | {"pid": sleeper.pid} for h in cluster.hosts]
    clean = kernel_state(cluster)
    fault_run = new_run_id("k")
    revert_after = 30.0 if fault["kind"] in ("blackhole", "partition", "link_down") else None
    child = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps([fault_run, fault, hosts, 0, revert_after])],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "applied"
        assert kernel_state(cluster) != clean or process_state(sleeper.pid) == "T"
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert heal_main(["--run-id", fault_run]) == 0
        assert heal_main(["--run-id", fault_run]) == 0  # idempotent
        assert kernel_state(cluster) == clean
        assert proc.helpers_of_run(fault_run) == []  # no delayer, no dead-man switch
        assert process_state(sleeper.pid) != "T"
        assert not Ledger(fault_run).path.exists()
    finally:
        child.kill()
        sleeper.kill()
        sleeper.wait()


def test_heal_finds_a_helper_that_started_before_its_ledger_entry(state_dir):
    """The window between starting a helper and recording its pid: /proc names it."""
    run_id = new_run_id("h")
    helper = proc.spawn_helper("chaos.deadman", "--run-id", run_id, "--state-dir", str(state_dir),
                               "--at", repr(time.monotonic() + 60), "--entries", "")
    proc.wait_ready(helper, "dead-man switch armed", 10)
    assert proc.helpers_of_run(run_id) == [helper.pid]
    assert heal_main(["--run-id", run_id]) == 0
    assert proc.helpers_of_run(run_id) == []
    helper.wait(timeout=5)
