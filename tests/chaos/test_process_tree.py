"""Process faults hit a host's whole workload: the rank's process and every process under it,
including those in sessions of their own (as torchrun starts its workers). Real processes,
real signals; no namespace needed."""
from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace

import pytest

from chaos import proc, topology
from chaos.api import Host
from chaos.faults import parse_fault
from chaos.heal import heal_run
from chaos.undotable import HealReport
from chaos.mechanism import record_process
from chaos.errors import TargetGone
from chaos.inject import NetlinkInjector, SignalKill, SignalStop
from chaos.undo import UNDOS, undo_outstanding
from chaos.ledger import Ledger

from .conftest import new_run_id, run_leftovers

# An "agent" that starts a "worker" in a new session (torchrun's subprocess handler does so),
# which starts a grandchild; each prints its pid.
AGENT = """
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", '''
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(120)"])
import os; print(os.getpid(), flush=True); time.sleep(120)
'''], start_new_session=True)
print("ready", flush=True)
time.sleep(120)
"""
DEADLINE_S = 30


def wait_for(check, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.fixture
def tree():
    agent = subprocess.Popen([sys.executable, "-c", AGENT], stdout=subprocess.PIPE, text=True)
    everyone = [agent.pid]
    try:
        assert agent.stdout.readline().strip() == "ready"
        wait_for(lambda: len(proc.descendants(agent.pid)) >= 2, "the worker and its child never started")
        everyone += [pid for pid, _ in proc.descendants(agent.pid)]
        yield agent, everyone
    finally:
        for pid in everyone:
            proc.send_signal(pid, 9, None, gone_ok=True)
        agent.wait(DEADLINE_S)
        agent.stdout.close()


def host_of(pid: int) -> Host:
    return Host(name="r000", address="10.0.0.1", switch_ns="-", port="-", ns_path="-", pid=pid)


def test_descendants_lists_parents_before_children(tree):
    agent, everyone = tree
    found = proc.descendants(agent.pid)
    assert [pid for pid, _ in found][:1] == everyone[1:2]  # the worker, then its child
    assert {pid for pid, _ in found} == set(everyone[1:])
    assert all(started == proc.start_time(pid) for pid, started in found)


def test_a_kill_ends_the_agent_and_the_workers_in_their_own_sessions(tree, tmp_path):
    agent, everyone = tree
    SignalKill().apply(parse_fault({"kind": "kill"}), host_of(agent.pid), Ledger(new_run_id(), tmp_path))
    agent.wait(DEADLINE_S)
    wait_for(lambda: all(proc.state(pid) in (None, "Z") for pid in everyone[1:]), "a worker outlived the kill")


@pytest.mark.parametrize("kind", ["kill", "pause"])
def test_a_target_that_ended_by_itself_is_left_out_and_the_others_still_get_the_fault(tmp_path, kind):
    # a race with the job: one rank crashed the moment a fault on two came due
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()  # reaped: its pid names nothing (or, reused, another process: its start time differs)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        ledger = Ledger(new_run_id(), tmp_path)
        injector = NetlinkInjector(ledger, {kind: SignalKill() if kind == "kill" else SignalStop()}, hosts=[], undos=UNDOS)
        hosts = [Host(name=f"r{i:03d}", address="127.0.0.1", switch_ns=None, port=None, ns_path=None, pid=p)
                 for i, p in enumerate((ended.pid, alive.pid))]
        injection = injector.apply(parse_fault({"kind": kind}), hosts)
        assert injection.applied.hosts == ("r001",)
        wait_for(lambda: proc.state(alive.pid) in ("Z", "T", None), f"the live target was not {kind}ed")
        injection.revert()
        with pytest.raises(TargetGone):
            injector.apply(parse_fault({"kind": kind}), hosts[:1])
    finally:
        alive.kill()
        alive.wait()


def test_a_pause_stops_every_process_and_its_revert_continues_them(tree, tmp_path):
    agent, everyone = tree
    ledger = Ledger(new_run_id(), tmp_path)
    entries = SignalStop().apply(parse_fault({"kind": "pause"}), host_of(agent.pid), ledger)
    assert [e.args["pid"] for e in entries] == everyone
    wait_for(lambda: all(proc.state(pid) == "T" for pid in everyone), "a process of the tree was not stopped")
    for entry in reversed(entries):  # last in, first out, as the injector reverts
        UNDOS.revert(entry, ledger)
    wait_for(lambda: all(proc.state(pid) == "S" for pid in everyone), "a process stayed stopped")
    assert ledger.outstanding() == []


# An agent as torch.distributed.elastic's: a monitor of its own (unmarked) and a worker in a
# session of its own with the agent's mark in its environment, which starts a child (a data
# loader, inheriting the mark).
MARKED_AGENT = """
import os, subprocess, sys, time
child = "import time; time.sleep(120)"  # silent: the agent's one line is the test's to read
monitor = subprocess.Popen([sys.executable, "-c", child])
worker = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {child!r}]); {child}"],
                          start_new_session=True, env={**os.environ, "TORCHELASTIC_RESTART_COUNT": "0"})
print(monitor.pid, worker.pid, flush=True)
time.sleep(120)
"""


@pytest.fixture
def marked():
    agent = subprocess.Popen([sys.executable, "-c", MARKED_AGENT], stdout=subprocess.PIPE, text=True)
    try:
        monitor, worker = (int(word) for word in agent.stdout.readline().split())
        wait_for(lambda: len(proc.descendants(agent.pid)) >= 3, "the worker's child never started")
        [loader] = [pid for pid, _ in proc.descendants(worker)]
        yield agent, monitor, worker, loader
    finally:
        for pid, _ in [*proc.descendants(agent.pid), (agent.pid, 0)]:
            proc.send_signal(pid, 9, None, gone_ok=True)
        agent.wait(DEADLINE_S)
        agent.stdout.close()


def workers_host(agent: int) -> Host:
    return replace(host_of(agent), agent_processes=tuple(proc.workers(agent)))


def test_the_workers_are_the_topmost_processes_with_the_agents_mark(marked):
    agent, monitor, worker, loader = marked
    assert proc.workers(agent.pid) == [(worker, proc.start_time(worker))]


def test_a_kill_of_the_workers_ends_them_and_leaves_the_agent_and_its_monitor(marked, tmp_path):
    agent, monitor, worker, loader = marked
    SignalKill().apply(parse_fault({"kind": "kill", "processes": "workers"}), workers_host(agent.pid),
                       Ledger(new_run_id(), tmp_path))
    wait_for(lambda: all(proc.state(pid) in (None, "Z") for pid in (worker, loader)), "a worker outlived the kill")
    assert agent.poll() is None and proc.state(monitor) == "S"


def test_a_pause_of_the_workers_stops_them_alone_and_its_revert_continues_them(marked, tmp_path):
    agent, monitor, worker, loader = marked
    ledger = Ledger(new_run_id(), tmp_path)
    entries = SignalStop().apply(parse_fault({"kind": "pause", "processes": "workers"}), workers_host(agent.pid),
                                 ledger)
    assert [e.args["pid"] for e in entries] == [worker, loader]
    wait_for(lambda: proc.state(worker) == proc.state(loader) == "T", "a worker was not stopped")
    assert proc.state(agent.pid) == proc.state(monitor) == "S"
    for entry in reversed(entries):
        UNDOS.revert(entry, ledger)
    wait_for(lambda: proc.state(worker) == proc.state(loader) == "S", "a worker stayed stopped")


def test_a_fault_on_the_workers_while_none_runs_is_not_applied(marked, tmp_path):
    agent, *_ = marked
    with pytest.raises(TargetGone, match="no worker runs under its agent"):  # between two restarts
        SignalStop().apply(parse_fault({"kind": "pause", "processes": "workers"}), host_of(agent.pid),
                           Ledger(new_run_id(), tmp_path))


@pytest.mark.requires_root
def test_heal_ends_what_still_runs_in_a_dead_run_s_namespaces(state_dir):
    """A SIGKILLed harness's torchrun workers: detached from every process the ledger names,
    in a namespace of the run; heal ends them before it removes the namespace."""
    run_id = new_run_id()
    hosts = topology.hosts_of(run_id, 1)
    topology.build(Ledger(run_id), hosts)
    namespace = hosts[0].ns_path.rsplit("/", 1)[1]
    agent = subprocess.Popen(["ip", "netns", "exec", namespace, sys.executable, "-c", AGENT],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    everyone = [agent.pid]
    try:
        assert agent.stdout.readline().strip() == "ready"
        wait_for(lambda: len(proc.descendants(agent.pid)) >= 2, "the worker and its child never started")
        everyone += [pid for pid, _ in proc.descendants(agent.pid)]
        report = HealReport()
        heal_run(run_id, report, UNDOS)
        agent.wait(DEADLINE_S)
        wait_for(lambda: all(proc.state(pid) in (None, "Z") for pid in everyone), "a process outlived the heal")
        assert sum("in the run's namespaces" in line for line in report.undone) == 3
        assert run_leftovers(run_id) == ([], [])
    finally:  # also when the heal failed to
        for pid in everyone:
            proc.send_signal(pid, 9, None, gone_ok=True)
        agent.wait()
        agent.stdout.close()
        heal_run(run_id, HealReport(), UNDOS)


def test_undoing_a_recorded_child_leaves_no_zombie(tmp_path):
    """A dead-man switch the harness started and dropped: its revert must reap it, or it stays
    a zombie of the harness until something else happens to."""
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    pid = helper.pid
    ledger = Ledger(new_run_id(), tmp_path)
    record_process(ledger, pid)
    try:
        undo_outstanding(ledger, UNDOS)
        assert proc.state(pid) is None  # gone, not "Z"
    finally:
        helper.kill()
        helper.wait()


# A host's process that daemonizes a watcher, as nvidia-resiliency-ext's in-process restart
# does for each rank (a double fork and setsid: it leaves the process tree, not the host's
# network namespace); it prints the daemon's pid.
DAEMONIZING = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        print(os.getpid(), flush=True)
        time.sleep(120)
    os._exit(0)
time.sleep(120)
"""


@pytest.mark.requires_root  # a network namespace
@pytest.mark.parametrize("kind", ["kill", "pause"])
def test_a_fault_on_a_host_reaches_its_daemons_in_its_namespace(state_dir, kind):
    run_id = new_run_id()
    ledger = Ledger(run_id)
    [host] = topology.hosts_of(run_id, 1)
    topology.build(ledger, [host])
    namespace = host.ns_path.rsplit("/", 1)[1]
    rank = subprocess.Popen(["ip", "netns", "exec", namespace, sys.executable, "-c", DAEMONIZING],
                            stdout=subprocess.PIPE, text=True)
    daemon = int(rank.stdout.readline())
    try:
        assert daemon not in {pid for pid, _ in proc.descendants(rank.pid)}  # out of the tree
        mechanism = SignalKill() if kind == "kill" else SignalStop()
        entries = mechanism.apply(parse_fault({"kind": kind}), replace(host, pid=rank.pid), ledger)
        wait_for(lambda: proc.state(daemon) in ((None, "Z") if kind == "kill" else ("T",)),
                 f"the daemon in the host's namespace was not {kind}ed")
        if kind == "pause":
            assert daemon in [e.args["pid"] for e in entries]
            for entry in reversed(entries):
                UNDOS.revert(entry, ledger)
            wait_for(lambda: proc.state(daemon) not in ("T", None), "the daemon was not continued")
    finally:
        for pid in (daemon, rank.pid):
            proc.send_signal(pid, 9, None, gone_ok=True)
        rank.wait(DEADLINE_S)
        rank.stdout.close()
        heal_run(run_id, HealReport(), UNDOS)
        assert run_leftovers(run_id) == ([], [])
