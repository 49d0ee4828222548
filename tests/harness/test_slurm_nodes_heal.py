"""The slurm backend's record of its nodes (`slurm_nodes`), without a cluster: what a heal does
when the cluster is gone, and which of a run's sbatch arguments its srun on the nodes keeps.
The heal through srun itself runs against a real cluster in tests/slurm."""
from __future__ import annotations

from pathlib import Path

import pytest

from chaos.ledger import STATE_DIR_ENV
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


def test_a_copy_slurmd_forked_is_not_a_second_daemon() -> None:
    """slurmd forks to exec slurmstepd for a step: for a moment the copy has its command line."""
    import subprocess
    import sys
    import time

    from chaos import proc
    from harness.cluster.slurm import slurmd
    code = "import os, time; os.fork(); time.sleep(60)"
    daemon = subprocess.Popen(["slurmd", "-c", code, "-N", "chaos-test-node"], executable=sys.executable)
    try:
        deadline = time.monotonic() + 10
        while not proc.descendants(daemon.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(proc.descendants(daemon.pid)) == 1
        assert slurmd.daemons("chaos-test-node") == [daemon.pid]
    finally:
        for pid, _ in proc.descendants(daemon.pid):
            proc.send_signal(pid, 9, None, gone_ok=True)
        daemon.kill()
        daemon.wait()
