"""Undo tables: plain values combined explicitly, a duplicate refused, the table given to each
revert and heal used as given (no root, no kernel: fake undos and a fake mechanism)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from chaos.api import Host
from chaos.errors import InjectionError, UnsupportedFault
from chaos.faults import FaultBase, LinkDown
from chaos.heal import heal
from chaos.undotable import HealReport
from chaos.inject import NetlinkInjector
from chaos.undo import UNDOS, undo_outstanding
from chaos.ledger import Entry, Ledger
from chaos.mechanism import Mechanism
from chaos.undotable import UndoTable

CHAOS = Path(__file__).resolve().parents[2] / "chaos"
HOST = Host(name="r000", address="10.77.0.10", switch_ns="chaos-x-sw", port="p0", ns_path="/run/netns/chaos-x-r000")


def recorded_ops(package: Path) -> set[str]:
    """Every op a module of `package` writes to a ledger: `ledger.record("op", ...)`, and
    `record_process(ledger, pid[, op])` (default "sigkill")."""
    ops = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "attr", getattr(node.func, "id", None))
            if name == "record" and node.args and isinstance(node.args[0], ast.Constant):
                ops.add(node.args[0].value)
            if name == "record_process":
                given = node.args[2:3] + [k.value for k in node.keywords if k.arg == "op"]
                ops |= {g.value for g in given if isinstance(g, ast.Constant)} or {"sigkill"}
    return ops


def test_the_fault_library_can_undo_every_op_it_records() -> None:
    assert recorded_ops(CHAOS) <= set(UNDOS.ops)
    assert {"netns", "link_up", "root_qdisc", "bpf_filter", "nft_table", "stop_process"} <= recorded_ops(CHAOS)


def test_combine_refuses_an_op_or_a_sweep_two_owners_define() -> None:
    a = UndoTable({"x": lambda args: None}, sweeps={"s": lambda *a: None})
    with pytest.raises(ValueError, match="undo op 'x' is defined by both first and second"):
        UndoTable.combine({"first": a, "second": UndoTable({"x": lambda args: None})})
    with pytest.raises(ValueError, match="sweep 's' is defined by both first and second"):
        UndoTable.combine({"first": a, "second": UndoTable({}, sweeps={"s": lambda *a: None})})
    both = UndoTable.combine({"first": a, "second": UndoTable({"y": lambda args: None})})
    assert sorted(both.ops) == ["x", "y"] and list(both.sweeps) == ["s"]


def test_a_table_is_a_value_nobody_fills_in_later() -> None:
    ops = {"x": lambda args: None}
    table = UndoTable(ops)
    ops["y"] = lambda args: None
    assert list(table.ops) == ["x"]
    with pytest.raises(TypeError):
        table.ops["z"] = lambda args: None  # type: ignore[index]


def test_revert_runs_the_given_table_and_refuses_an_op_it_lacks(tmp_path: Path) -> None:
    undone: list[dict] = []
    ledger = Ledger("u1", tmp_path)
    ledger.mark(ledger.record("ours", n=1), "done")
    ledger.mark(ledger.record("theirs", n=2), "done")
    with pytest.raises(InjectionError, match="no undo for 'theirs'"):
        undo_outstanding(ledger, UndoTable({"ours": undone.append}))
    assert undone == [] and len(ledger.outstanding()) == 2  # last in first out: stopped at once
    undo_outstanding(ledger, UndoTable({"ours": undone.append, "theirs": undone.append}))
    assert undone == [{"n": 2}, {"n": 1}] and ledger.outstanding() == []


class ForeignLinkDown(Mechanism):
    """A backend's link-down that records an op of its own table."""

    name = "foreign link down"

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        entry = ledger.record("foreign_up", port=host.port)
        ledger.mark(entry, "done")
        return [entry]


def test_the_dead_man_switch_is_never_armed_for_ops_it_cannot_undo(tmp_path: Path) -> None:
    """It runs the fault library's table in a process of its own: a fault whose entries
    another table owns is refused before it is left to it, and reverted with the given table."""
    undone: list[dict] = []
    ledger = Ledger("u2", tmp_path)
    injector = NetlinkInjector(ledger, {"link_down": ForeignLinkDown()}, hosts=[HOST],
                               undos=UndoTable.combine({"chaos": UNDOS, "backend": UndoTable({"foreign_up": undone.append})}))
    with pytest.raises(UnsupportedFault, match="dead-man switch cannot undo foreign_up"):
        injector.apply(LinkDown(), [HOST], revert_after=5.0)
    assert undone == [{"port": "p0"}] and ledger.outstanding() == []
    injection = injector.apply(LinkDown(), [HOST])  # no dead-man switch asked for: applied
    injection.revert()
    assert undone == [{"port": "p0"}] * 2


def test_heal_runs_the_sweeps_of_its_table(tmp_path: Path) -> None:
    calls = []
    table = UndoTable({}, sweeps={"labelled": lambda *args: calls.append(args)})
    report = heal(table, "r1", directory=tmp_path)
    assert calls == [("r1", False, report, tmp_path)]
    assert isinstance(report, HealReport)


def test_a_hosts_temporary_folder_goes_with_what_its_processes_left_and_a_second_undo_is_a_no_op(tmp_path):
    import shutil
    import socket
    import tempfile
    # under the machine's temporary folder, as a host's is: a socket's path has 107 bytes at most
    folder = Path(tempfile.mkdtemp(prefix="chaos-abc123-"))
    try:
        (folder / "sub").mkdir()
        (folder / "sub" / "left.txt").write_text("a killed process's file")
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(folder / "_ft_launcher123.socket"))  # a killed agent's IPC socket
        ledger = Ledger("tmpdir", tmp_path / "state")
        ledger.mark(ledger.record("remove_folder", path=str(folder)), "done")
        undo_outstanding(ledger, UNDOS)
        assert not folder.exists() and ledger.outstanding() == []
        UNDOS.ops["remove_folder"]({"path": str(folder)})  # already gone: a heal after the teardown
    finally:
        shutil.rmtree(folder, ignore_errors=True)
