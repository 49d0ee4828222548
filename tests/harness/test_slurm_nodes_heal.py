"""The slurm backend's record of its nodes (`slurm_nodes`), without a cluster: what a heal does
when the cluster is gone, which of a run's sbatch arguments its srun on the nodes keeps, and
which process is a node's daemon (slurmd_kill's target) among its copies. The heal through
srun itself, and slurmd_kill, run against a real cluster in tests/slurm."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaos import proc
from chaos.ledger import STATE_DIR_ENV
from harness.cluster.slurm import slurmd
from harness.cluster.slurm.cluster import placement
from harness.cluster.slurm.undo import UNDOS


def test_a_local_cluster_taken_down_takes_its_nodes_ledgers_with_it(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path))
    for name in ("r1.node01", "r1.node02", "r2.node01", "r1"):
        (tmp_path / f"{name}.jsonl").write_text("")
    UNDOS.ops["slurm_nodes"]({"name": "chaos-r1", "conf": str(tmp_path / "gone" / "slurm.conf"),
                              "nodes": ["node01", "node02"], "run_id": "r1", "python": "python3", "placement": []})
    assert sorted(p.stem for p in tmp_path.glob("*.jsonl")) == ["r1", "r2.node01"]


def test_the_srun_on_the_nodes_keeps_the_partition_and_account_only() -> None:
    args = ("--partition", "gpu", "--time", "10:00", "--account", "ml", "--signal", "USR1@60")
    assert placement(args) == ["--partition", "gpu", "--account", "ml"]
    assert placement(()) == []


# this process's own node name: pytest-xdist's workers run these tests side by side
NODE = f"chaos-test-node-{os.getpid()}"


def _started_as_slurmd(code: str, node: str) -> subprocess.Popen:
    return subprocess.Popen(["slurmd", "-c", code, "-N", node], executable=sys.executable)


def _named(node: str) -> list[int]:
    return [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
            if proc.command_line(pid).startswith("slurmd ") and proc.command_line(pid).endswith(f" -N {node}")]


def _until(condition, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not seen within {timeout_s:g} s: {what}"
        time.sleep(0.01)


def _end(*daemons: subprocess.Popen) -> None:
    for daemon in daemons:
        for pid, _ in proc.descendants(daemon.pid):
            proc.send_signal(pid, 9, None, gone_ok=True)
        daemon.kill()
        daemon.wait()


def test_a_copy_slurmd_forked_is_not_a_second_daemon() -> None:
    """slurmd forks to exec slurmstepd for a step: for a moment the copy has its command line."""
    daemon = _started_as_slurmd("import os, time; os.fork(); time.sleep(60)", NODE)
    try:
        _until(lambda: len(proc.descendants(daemon.pid)) == 1, "the daemon's copy")
        assert slurmd.daemons(NODE) == [daemon.pid]
    finally:
        _end(daemon)


def test_a_copy_orphaned_on_its_way_to_slurmstepd_is_not_a_second_daemon() -> None:
    """Slurm's fork for a step: the child forks the one that execs slurmstepd, and exits; the
    grandchild, an orphan, carries slurmd's command line until its exec (here: 0.5 s)."""
    code = ("import os, time\n"
            "if os.fork() == 0:\n"
            "    if os.fork() == 0: time.sleep(0.5); os._exit(0)\n"
            "    os._exit(0)\n"
            "time.sleep(60)")
    daemon = _started_as_slurmd(code, NODE)
    try:
        _until(lambda: [pid for pid in _named(NODE) if proc.parent(pid) != daemon.pid
                        and pid != daemon.pid], "the orphaned copy")
        assert slurmd.daemons(NODE) == [daemon.pid]
    finally:
        _end(daemon)


def test_copies_that_come_and_go_on_a_busy_node_are_not_a_second_daemon() -> None:
    """A node launching steps back to back: at every look some copy is on its way to its
    exec (here a new orphan every 0.05 s, each for 0.15 s). Only the daemon is there each time."""
    code = ("import os, time\n"
            "while True:\n"
            "    if os.fork() == 0:\n"
            "        if os.fork() == 0: time.sleep(0.15); os._exit(0)\n"
            "        os._exit(0)\n"
            "    os.wait()\n"
            "    time.sleep(0.05)")
    daemon = _started_as_slurmd(code, NODE)
    try:
        _until(lambda: len(_named(NODE)) >= 3, "the orphaned copies")
        assert slurmd.daemons(NODE) == [daemon.pid]
    finally:
        _end(daemon)


def test_two_daemons_of_one_node_stay_two() -> None:
    first, second = (_started_as_slurmd("import time; time.sleep(60)", NODE) for _ in range(2))
    try:
        _until(lambda: len(_named(NODE)) == 2, "both daemons")
        assert sorted(slurmd.daemons(NODE, settle_s=0.2)) == sorted([first.pid, second.pid])
    finally:
        _end(first, second)
