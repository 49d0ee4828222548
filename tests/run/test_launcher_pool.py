"""The rank launcher a run's trials share (harness.cluster.launcher.LauncherPool), on real
namespaces: the second cluster forks from the first one's launcher, nothing of the first
cluster outlives it (not a stopped rank, not the control plane), and closing the pool
leaves no process and no ledger."""
from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path

import pytest

from chaos import proc
from chaos.undo import record_owner
from chaos.ledger import Ledger
from harness.cluster.spec import ClusterSpec
from harness.cluster.launcher import LauncherPool
from harness.cluster.netns import NetnsBackend, NetnsCluster
from harness.job.config import RankConfig, WorkloadSpec
from harness.job.detector import AHEAD_NICE
from harness.job.policies import policy_spec
from runfolder.events import EVENTS_FILE, read_events

pytestmark = pytest.mark.system  # real rank launchers: not in ./dev.sh check

RANKS = 2


def alive(pid: int) -> bool:
    return proc.start_time(pid) is not None


def start_and_wait_for_steps(cluster: NetnsCluster, run_dir: Path, steps: int = 3, within_s: float = 30,
                             policy: str = "timeout", overrides: dict | None = None) -> None:
    for r in range(RANKS):
        cluster.start_rank(r, RankConfig(
            rank=r, world_size=RANKS, seed=0, store_address=cluster.store_address,
            store_port=cluster.store_port, events_path=str(run_dir / EVENTS_FILE),
            checkpoint_dir=str(run_dir / "ckpt"), policy=policy_spec(policy, {"timeout": "10s", **(overrides or {})}),
            workload=WorkloadSpec()).model_dump(mode="json"))
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        events, _ = read_events(run_dir / EVENTS_FILE, 0)
        made = {r: sum(1 for e in events if e["kind"] == "step" and e["rank"] == r) for r in range(RANKS)}
        if min(made.values()) >= steps:
            return
        assert cluster.reap() == []
        time.sleep(0.05)
    pytest.fail(f"ranks did not make {steps} steps within {within_s} s: {made}")


@pytest.mark.requires_root
def test_a_runs_clusters_fork_from_one_launcher_and_leave_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    pool = LauncherPool(state)
    ledgers: list[Ledger] = []
    clusters: list[NetnsCluster] = []
    try:
        launcher_pids: list[int] = []
        forked: list[list[int]] = []
        for trial in range(2):
            run_id = secrets.token_hex(3)
            ledger = Ledger(run_id, state)
            record_owner(ledger)
            ledgers.append(ledger)
            run_dir = tmp_path / run_id
            assert pool.next_launcher == ("kept" if trial == 1 else "new")
            cluster = NetnsBackend().up(ClusterSpec(run_id, RANKS, run_dir), ledger, pool)
            clusters.append(cluster)
            launcher_pids.append(cluster.launcher.pid)
            start_and_wait_for_steps(cluster, run_dir)
            pids = [*cluster.launcher.pids.values()]  # the ranks and the control plane
            assert len(pids) == RANKS + 1
            forked.append(pids)
            if trial == 0:
                # a rank still paused by a fault, as a trial stopped by Ctrl-C can leave it
                os.kill(cluster.pid(0), signal.SIGSTOP)  # type: ignore[arg-type]
            cluster.close()  # without stop_ranks: the release itself must end them
            assert [pid for pid in pids if alive(pid)] == []
            assert ledger.close_if_clean()
        assert launcher_pids[0] == launcher_pids[1]
        assert alive(launcher_pids[0])
        assert not set(forked[0]) & set(forked[1])
    finally:
        for cluster in clusters:
            cluster.close()
        pool.close()
        for ledger in ledgers:
            ledger.close_if_clean()
    assert not alive(launcher_pids[0])
    assert list(state.glob("*.jsonl")) == []


def nice_of_each_thread(pid: int) -> list[int]:
    """The nice value of each of the process's threads (/proc/PID/task/TID/stat, field 19)."""
    return [int((task / "stat").read_text().rsplit(")", 1)[1].split()[16])
            for task in Path(f"/proc/{pid}/task").iterdir()]


def thread_nices(pid: int) -> set[int]:
    return set(nice_of_each_thread(pid))


@pytest.mark.requires_root
def test_the_control_plane_and_the_heartbeats_run_ahead_of_the_steps(tmp_path: Path) -> None:
    state, run_id = tmp_path / "state", secrets.token_hex(3)
    ledger = Ledger(run_id, state)
    record_owner(ledger)
    with LauncherPool(state) as pool:
        cluster = NetnsBackend().up(ClusterSpec(run_id, RANKS, tmp_path / run_id), ledger, pool)
        try:
            start_and_wait_for_steps(cluster, tmp_path / run_id, policy="with_detector",
                                     overrides={"base": "retry", "detector": {}})
            assert thread_nices(cluster.launcher.pids["control"]) == {AHEAD_NICE}
            # the rank's heart (its one child) and its digest listener (the probe of its own
            # stalls) run ahead; the rank's steps (every other thread) keep the nice value the
            # rank inherited from this process
            rank = cluster.pid(0)
            hearts = [int(pid) for task in Path(f"/proc/{rank}/task").iterdir()
                      for pid in (task / "children").read_text().split()]
            assert len(hearts) == 1 and thread_nices(hearts[0]) == {AHEAD_NICE}
            inherited = os.getpriority(os.PRIO_PROCESS, 0)  # type: ignore[arg-type]
            nices = nice_of_each_thread(rank)
            assert nices.count(AHEAD_NICE) == 1 and set(nices) == {inherited, AHEAD_NICE}
        finally:
            cluster.close()
    assert ledger.close_if_clean()


@pytest.mark.requires_root
def test_a_kept_launcher_that_died_is_replaced(tmp_path: Path) -> None:
    """A heal with --all (or the OOM killer) can end the kept launcher between trials."""
    state = tmp_path / "state"
    with LauncherPool(state) as pool:
        first = pool.take()
        first.wait_ready()
        pool.give_back(first)
        assert pool.next_launcher == "kept"
        os.kill(first.pid, signal.SIGKILL)
        os.waitid(os.P_PID, first.pid, os.WEXITED | os.WNOWAIT)  # dead, not yet reaped
        second = pool.take()
        try:
            assert second.pid != first.pid
            second.wait_ready()
        finally:
            pool.give_back(second)
    assert not alive(second.pid)
    assert list(state.glob("*.jsonl")) == []


@pytest.mark.requires_root
def test_a_launcher_started_ahead_is_the_first_one_taken(tmp_path: Path) -> None:
    with LauncherPool(tmp_path / "state") as pool:
        assert pool.next_launcher == "new"
        pool.start_ahead()
        pool.start_ahead()  # one is enough
        assert pool.next_launcher == "ahead"
        first = pool.take()
        assert pool.next_launcher == "new"  # nothing else was started
        first.wait_ready()
        pool.give_back(first)
        assert pool.next_launcher == "kept"
        again = pool.take()
        assert again.pid == first.pid
        pool.give_back(again)
    assert not alive(first.pid)
    assert list((tmp_path / "state").glob("*.jsonl")) == []


def test_the_launcher_imports_this_harness_not_one_in_the_working_directory(tmp_path: Path, monkeypatch) -> None:
    # a user's project with a package of the same name, or a worktree run from main's folder
    decoy = tmp_path / "harness"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise ImportError('the working directory's harness was imported')\n")
    monkeypatch.chdir(tmp_path)
    with LauncherPool(tmp_path / "state") as pool:
        launcher = pool.take()
        try:
            launcher.wait_ready()  # a launcher that imported the decoy exits: HarnessError
        finally:
            pool.give_back(launcher)
