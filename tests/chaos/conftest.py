"""Fixtures for the fault library: a scratch cluster of real namespaces per test.

Every namespace is named ``chaos-<run>-*`` and recorded in a ledger under a per-test
state directory; the fixture heals the run at the end and asserts that nothing of it is
left: no namespace, no helper process (delayer, dead-man switch).
"""
from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

import pytest

from chaos import netlink, proc, topology
from chaos.api import Host
from chaos.heal import heal_run
from chaos.undotable import HealReport
from chaos.storage import mounted
from chaos.undo import UNDOS
from chaos.ledger import Ledger

_RUNS = itertools.count()


@dataclass
class Cluster:
    run_id: str
    ledger: Ledger
    hosts: list[Host]


def new_run_id(prefix: str = "t") -> str:
    return f"{prefix}{os.getpid()}x{next(_RUNS)}"


def run_leftovers(run_id: str) -> tuple[list[str], list[int]]:
    namespaces = [n for n in netlink.list_namespaces() if n.startswith(topology.namespace_name(run_id, ""))]
    return namespaces, proc.helpers_of_run(run_id)


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CHAOS_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture
def cluster(state_dir):
    """Three hosts r000..r002 on one switch, laid out as a run's; healed and checked clean afterwards."""
    run_id = new_run_id()
    ledger = Ledger(run_id)
    hosts = topology.hosts_of(run_id, 3)
    try:
        topology.build(ledger, hosts)
        yield Cluster(run_id, ledger, list(hosts))
    finally:
        heal_run(run_id, HealReport(), UNDOS)
        assert run_leftovers(run_id) == ([], []), "the test left namespaces or helper processes"


@pytest.fixture
def storage(state_dir, tmp_path):
    """A checkpoint directory holding one checkpoint, a host naming it, and a ledger; every
    mount and helper (a FUSE daemon) of the test's run healed and checked gone afterwards."""
    directory = tmp_path / "ckpt"
    directory.mkdir()
    (directory / "step-00000010.pt").write_bytes(b"ten" * 1000)
    run_id = new_run_id("s")
    host = Host("r000", "10.0.0.1", None, None, None, storage=str(directory))
    try:
        yield host, Ledger(run_id), directory
    finally:
        heal_run(run_id, HealReport(), UNDOS)
        assert not mounted(str(directory)), "the test left a mount"
        assert proc.helpers_of_run(run_id) == [], "the test left a helper process"
