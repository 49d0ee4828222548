"""A ledger's place (chaos.undo.record_owner): entries a Slurm node's agent made in "its own"
network namespace mean what they say only on that node, so a heal elsewhere, even on a
machine that shares the state folder, leaves them to the heal there."""
from __future__ import annotations

from pathlib import Path

from chaos.heal import heal
from chaos.ledger import Ledger
from chaos.undotable import UndoTable
from chaos.undo import record_owner


def _table(undone: list[str]) -> UndoTable:
    return UndoTable({"owner": lambda args: None, "bpf_filter": lambda args: undone.append(args["ifname"])})


def _node_ledger(folder: Path) -> Ledger:
    ledger = Ledger("run1.node04", folder)
    record_owner(ledger, place="node04")
    ledger.mark(ledger.record("bpf_filter", ns="/proc/self/ns/net", ifname="eth0"), "done")
    ledger.mark(ledger.record("owner", pid=2 ** 22 + 1, started=1), "done")  # its agent, gone
    return ledger


def test_a_heal_elsewhere_leaves_a_node_s_ledger_and_says_so(tmp_path: Path) -> None:
    undone: list[str] = []
    ledger = _node_ledger(tmp_path)
    # (not everything=True: that heals every chaos namespace on the host, a live run's too)
    for asked in ({}, {"run_id": "run1.node04"}):
        report = heal(_table(undone), directory=tmp_path, **asked)
        assert undone == [] and report.elsewhere == ["run1.node04 (node04)"], asked
        assert "left to a heal where they were made: run1.node04 (node04)" in report.summary()
    assert ledger.path.exists()


def test_the_heal_at_its_place_takes_it_back(tmp_path: Path) -> None:
    undone: list[str] = []
    ledger = _node_ledger(tmp_path)
    elsewhere = Ledger("run2", tmp_path)  # a ledger of this machine is not the node heal's
    elsewhere.mark(elsewhere.record("bpf_filter", ns="chaos-run2-r000", ifname="eth0"), "done")
    report = heal(_table(undone), "run1.node04", directory=tmp_path, place="node04")
    assert undone == ["eth0"] and report.elsewhere == [] and not ledger.path.exists()
    report = heal(_table(undone), directory=tmp_path, place="node04")
    assert undone == ["eth0"] and report.elsewhere == ["run2 (this machine)"]
