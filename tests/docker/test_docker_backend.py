"""The docker backend against a real engine: bring-up, training, faults, teardown, heal.

Small clusters (2-4 ranks) to share two cores; each test checks that nothing labelled with
its run id (containers) or named after it (namespaces) remains."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import pytest

from chaos import netlink, proc, sysctl
from chaos.faults import Kill, LinkDown, Pause
from chaos.heal import heal
from chaos.inject import NetlinkInjector, default_mechanisms
from chaos.ledger import Ledger
from chaos.storage import mounts_below
from harness.cluster.spec import ClusterSpec
from harness.cluster.undos import undo_table
from harness.cluster.docker.cluster import DockerBackend, DockerCluster
from harness.cluster.docker.engine import LABEL_LEDGER, LABEL_OWNER, LABEL_RUN, engine
from harness.cluster.docker.heal import heal_containers
from harness.cluster.launcher import LauncherPool
from harness.job import lease
from runfolder.events import read_events
from tests.conftest import stop_child
from harness.job.policies import policy_spec
from harness.job.workload import WorkloadSpec

pytestmark = [pytest.mark.requires_docker, pytest.mark.requires_root]

PROJECT = Path(__file__).resolve().parents[2]


def rank_config(cluster: DockerCluster, rank: int, policy: str = "timeout",
                max_steps: int | None = None, **overrides: object) -> dict:
    run_dir = cluster.spec.run_dir
    return dict(
        rank=rank, world_size=cluster.spec.ranks, seed=1, store_address=cluster.store_address,
        store_port=cluster.store_port, events_path=str(run_dir / "events.jsonl"),
        checkpoint_dir=str(run_dir / "ckpt"),
        policy=policy_spec(policy, {"timeout": "5s", **overrides}).model_dump(mode="json"),
        workload=WorkloadSpec(step_period=0.25).model_dump(mode="json"), max_steps=max_steps)


def leftovers(run_id: str) -> list[str]:
    client = engine()
    try:
        found = [f"container {c.name}" for c in
                 client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"})]
        found += [f"network {n.name}" for n in
                  client.networks.list(filters={"label": f"{LABEL_RUN}={run_id}"})]
    finally:
        client.close()
    return found + [f"netns {n}" for n in netlink.list_namespaces() if n.startswith(f"chaos-{run_id}-")]


def steps_by_rank(run_dir: Path) -> dict[int, int]:
    events, _ = read_events(run_dir / "events.jsonl")
    out: dict[int, int] = {}
    for e in events:
        if e["kind"] == "step":
            out[e["rank"]] = max(out.get(e["rank"], -1), e["step"])
    return out


def wait_until(pred, timeout: float, what: str, interval: float = 0.1):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def test_bringup_training_link_down_teardown(run_id: str, ledger: Ledger, launchers: LauncherPool, tmp_path: Path) -> None:
    """4 containers train, each with the scenario's own network settings; rank 1's switch
    port goes down; the timeout policy fails fast."""
    n = 4
    settings = (("net.ipv4.neigh.eth0.retrans_time_ms", "100"), ("net.ipv4.tcp_retries2", "5"))
    cluster = DockerBackend().up(ClusterSpec(run_id, n, tmp_path, sysctls=settings), ledger, launchers)
    try:
        labels = {c.name: c.labels for c in cluster.client.containers.list(
            all=True, filters={"label": f"{LABEL_RUN}={run_id}"})}
        assert sorted(labels) == [f"chaos-{run_id}-r{r:03d}" for r in range(n)]
        for r in range(n):
            pid = cluster.start_rank(r, rank_config(cluster, r))
            assert cluster.pid(r) == pid
            assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
        wait_until(lambda: len(steps_by_rank(tmp_path)) == n and min(steps_by_rank(tmp_path).values()) >= 4,
                   120, "4 steps on every rank")

        host = cluster.hosts[1]
        assert host.pid == cluster.pid(1)
        # the container's namespace, found by its pid and pinned under the netns backend's name
        assert os.stat(host.ns_path).st_ino == os.stat(f"/proc/{host.pid}/ns/net").st_ino
        assert host.ns_path == f"/run/netns/chaos-{run_id}-r001"
        assert netlink.link_is_up(f"/proc/{host.pid}/ns/net", "eth0")
        assert all(sysctl.read(h.ns_path, dict(settings)) == dict(settings) for h in cluster.hosts)
        injection = NetlinkInjector(ledger).apply(LinkDown(), [host])
        assert not netlink.link_is_up(cluster.switch_ns, host.port)
        exits: list = []
        wait_until(lambda: exits.extend(cluster.reap()) or len(exits) == n, 60, "every rank to exit")
        detected = [e for e in read_events(tmp_path / "events.jsonl")[0] if e["kind"] == "collective_error"]
        assert detected, "no rank reported the collective failure"
        ttd = min(e["t"] for e in detected) - injection.applied.t_applied
        assert 4.0 < ttd < 8.0, f"time-to-detect {ttd:.2f}s under a 5 s timeout"
        assert {e.exitcode for e in exits} == {3}, exits  # failed-fast, every rank
        injection.revert()
        assert netlink.link_is_up(cluster.switch_ns, host.port)
    finally:
        cluster.close()
    assert (tmp_path / "logs" / "r000.log").exists()
    assert leftovers(run_id) == []
    assert all(e.state == "undone" for e in ledger.entries())


def test_pause_and_kill_through_the_engine(run_id: str, ledger: Ledger, launchers: LauncherPool, tmp_path: Path) -> None:
    n = 2
    cluster = DockerBackend().up(ClusterSpec(run_id, n, tmp_path), ledger, launchers)
    try:
        for r in range(n):
            cluster.start_rank(r, rank_config(cluster, r, policy="retry", max_retries=3))
        wait_until(lambda: len(steps_by_rank(tmp_path)) == n, 120, "steps on both ranks")
        injector = NetlinkInjector(ledger, {**default_mechanisms(), **cluster.mechanisms()}, undos=undo_table())
        assert "docker pause" in injector.mechanism(Pause())
        host = replace(cluster.hosts[0], pid=cluster.pid(0))
        paused = injector.apply(Pause(), [host])
        assert cluster.client.containers.get(cluster.container_name(0)).status == "paused"
        before = steps_by_rank(tmp_path)
        time.sleep(1.0)  # 1 s under a 5 s timeout: a freeze the ranks must absorb
        assert steps_by_rank(tmp_path).get(0) == before.get(0)
        paused.revert()
        assert cluster.client.containers.get(cluster.container_name(0)).status == "running"
        wait_until(lambda: steps_by_rank(tmp_path).get(0, -1) >= before.get(0, -1) + 3, 30,
                   "rank 0 to step again after unpause")

        injector.apply(Kill(), [replace(cluster.hosts[1], pid=cluster.pid(1))])
        exits = wait_until(lambda: cluster.reap(), 30, "rank 1's exit", interval=0.05)
        assert [(e.rank, e.signal, e.exitcode) for e in exits] == [(1, signal.SIGKILL, None)]
        assert cluster.pid(1) is None
        stopped = cluster.stop_ranks(10.0)
        assert [e.rank for e in stopped] == [0]
    finally:
        cluster.close()
    assert leftovers(run_id) == []


def test_restart_rank_rewires_its_link(run_id: str, ledger: Ledger, launchers: LauncherPool, tmp_path: Path) -> None:
    """start_rank on a rank whose container exited starts it again, on a fresh veth."""
    cluster = DockerBackend().up(ClusterSpec(run_id, 1, tmp_path), ledger, launchers)
    try:
        first = cluster.start_rank(0, rank_config(cluster, 0, max_steps=2))
        exits = wait_until(lambda: cluster.reap(), 120, "the first run to end", interval=0.05)
        assert exits[0].exitcode == 0
        second = cluster.start_rank(0, rank_config(cluster, 0, max_steps=4))
        assert second != first
        assert netlink.link_is_up(cluster.hosts[0].ns_path, "eth0")
        exits = wait_until(lambda: cluster.reap(), 120, "the second run to end", interval=0.05)
        assert exits[0].exitcode == 0 and steps_by_rank(tmp_path)[0] >= 3
    finally:
        cluster.close()
    assert leftovers(run_id) == []


_HARNESS = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from harness import signals
    signals.install()  # as the `chaos` command does: SIGINT works whatever the parent ignored
    from chaos.undo import record_owner
    from chaos.ledger import Ledger
    from harness.cluster.spec import ClusterSpec
    from harness.cluster.docker.cluster import DockerBackend
    from harness.cluster.launcher import LauncherPool
    sys.path[:0] = [{tests!r}, {project!r}]
    from test_docker_backend import rank_config
    run_id, run_dir = sys.argv[1], Path(sys.argv[2])
    ledger = Ledger(run_id)
    record_owner(ledger)
    launchers = LauncherPool(run_dir.parent / LAUNCHERS)  # its ledger where the test heals it
    cluster = DockerBackend().up(ClusterSpec(run_id, 2, run_dir), ledger, launchers)
    try:
        for r in range(2):
            cluster.start_rank(r, rank_config(cluster, r))
        print("started", flush=True)
        while True:
            time.sleep(0.1)
    finally:
        cluster.close()
        launchers.close()
        ledger.close_if_clean()
""")
LAUNCHERS = "launchers"


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a background shell or CI runner leaves it


@contextlib.contextmanager
def _harness(run_id: str, tmp_path: Path) -> Iterator[subprocess.Popen]:
    """A helper harness with 2 running ranks, started with SIGINT ignored; ended whatever
    the test does (`stop_child`: SIGINT, SIGKILL at the deadline, then a heal)."""
    script = tmp_path / "killable_harness.py"
    script.write_text(_HARNESS.replace("LAUNCHERS", repr(LAUNCHERS)).format(
        tests=str(Path(__file__).parent), project=str(PROJECT)))
    child = subprocess.Popen([sys.executable, str(script), run_id, str(tmp_path / "run")],
                             stdout=subprocess.PIPE, cwd=PROJECT, text=True, preexec_fn=_ignore_sigint)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "started"
        assert len(leftovers(run_id)) == 5  # 2 containers, their 2 pinned namespaces, the switch
        yield child
    finally:
        stop_child(child, run_id=run_id)
        heal(undo_table(), directory=tmp_path / LAUNCHERS)  # the harness's launcher, if it was killed


def test_ctrl_c_leaves_nothing(run_id: str, tmp_path: Path) -> None:
    with _harness(run_id, tmp_path) as child:
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=60) != 0
        assert leftovers(run_id) == [] and mounts_below(str(tmp_path)) == []  # the shared trial folder too
        assert not Ledger(run_id).path.exists()


def _running(run_id: str) -> list[str]:
    client = engine()
    try:
        return [c.name for c in client.containers.list(filters={"label": f"{LABEL_RUN}={run_id}"})]
    finally:
        client.close()


def test_containers_leave_once_their_harness_is_killed(run_id: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease (harness.job.lease): a SIGKILLed harness renews nothing, so its ranks leave
    within the lease's timeout and their containers stop; heal then removes what is left.
    Its ledger is kept in a folder of its own: a harness started meanwhile (another test)
    heals dead runs as it starts, and would take these containers before their lease."""
    monkeypatch.setenv("CHAOS_STATE_DIR", str(tmp_path / "state"))
    with _harness(run_id, tmp_path) as child:
        assert len(_running(run_id)) == 2
        child.kill()
        child.wait(timeout=10)
        killed = time.monotonic()
        wait_until(lambda: not _running(run_id), lease.TIMEOUT_S + lease.EXIT_GRACE_S + 10, "the containers to stop")
        assert time.monotonic() - killed >= lease.TIMEOUT_S - 1  # by the lease, not by anything sooner
        report = heal(undo_table(), run_id)  # the owner is dead: the ledger path removes containers and the switch
        assert any(u.startswith("docker_container") for u in report.undone)
        assert any(u.startswith("unmount_storage") for u in report.undone)  # the shared trial folder
        assert leftovers(run_id) == [] and mounts_below(str(tmp_path)) == []
        assert not Ledger(run_id).path.exists()


def _orphan(run_id: str, **labels: str) -> None:
    """A container of `run_id` that no ledger names, its owner the process `owner` (alive
    until the test ends it: a harness started meanwhile heals only dead runs)."""
    client = engine()
    try:
        from harness.cluster.docker.image import ensure_local_image
        client.containers.create(ensure_local_image(client), name=f"chaos-{run_id}-orphan",
                                 labels={LABEL_RUN: run_id, **labels}, network_mode="none")
    finally:
        client.close()


@contextlib.contextmanager
def _owner() -> Iterator[tuple[subprocess.Popen, str]]:
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        yield owner, f"{owner.pid}:{proc.start_time(owner.pid)}"
    finally:
        owner.kill()
        owner.wait()


def test_heal_finds_labelled_containers_without_a_ledger(run_id: str) -> None:
    with _owner() as (owner, label):
        _orphan(run_id, **{LABEL_OWNER: label})
        assert leftovers(run_id) == [f"container chaos-{run_id}-orphan"]
        assert run_id in heal_containers().skipped_live
        owner.kill()
        owner.wait()
        report = heal_containers()
    assert f"docker container chaos-{run_id}-orphan" in report.undone
    assert leftovers(run_id) == []


def test_two_heals_removing_one_container_each_return_once_it_is_gone(run_id: str) -> None:
    """The second heal's removal finds the first's "already in progress": it waits for the
    container to be gone, so that its report is true when it returns."""
    from concurrent.futures import ThreadPoolExecutor
    from harness.cluster.docker.heal import undo_container
    for _ in range(5):  # the engine answers "in progress" now and then only
        _orphan(run_id)
        with ThreadPoolExecutor(2) as pool:
            removals = [pool.submit(undo_container, {"name": f"chaos-{run_id}-orphan", "run_id": run_id})
                        for _ in range(2)]
            for removal in removals:
                removal.result()
                assert leftovers(run_id) == []


def test_a_dead_runs_containers_are_its_own_ledger_folders_to_heal(run_id: str, tmp_path: Path) -> None:
    """A heal of the default folder leaves a dead run's containers whose ledger is kept in
    another folder (a test's, a user's CHAOS_STATE_DIR) to the heal of that folder."""
    elsewhere = tmp_path / "state"
    Ledger(run_id, elsewhere).record("docker_container", name=f"chaos-{run_id}-orphan", run_id=run_id)
    with _owner() as (owner, label):
        _orphan(run_id, **{LABEL_OWNER: label, LABEL_LEDGER: str(elsewhere)})
    report = heal_containers()
    assert f"{run_id} (its ledger in {elsewhere})" in report.elsewhere and leftovers(run_id)
    report = heal_containers(directory=elsewhere)
    assert f"docker container chaos-{run_id}-orphan" in report.undone and leftovers(run_id) == []


def test_link_faults_on_the_container_side(run_id: str, ledger: Ledger, launchers: LauncherPool, tmp_path: Path) -> None:
    """The fault library's own mechanisms reach the container's eth0 through /proc/PID/ns/net."""
    from chaos.faults import parse_fault
    cluster = DockerBackend().up(ClusterSpec(run_id, 2, tmp_path), ledger, launchers)
    try:
        for r in range(2):
            cluster.start_rank(r, rank_config(cluster, r))
        wait_until(lambda: len(steps_by_rank(tmp_path)) == 2, 120, "steps on both ranks")
        host = replace(cluster.hosts[1], pid=cluster.pid(1))
        injector = NetlinkInjector(ledger, hosts=cluster.hosts)
        shaped = injector.apply(parse_fault({"kind": "bandwidth", "rate": "10mbit", "direction": "from_host"}),
                                [host])
        assert [q["kind"] for q in netlink.qdiscs(host.ns_path, "eth0")] == ["tbf"]
        shaped.revert()
        assert "tbf" not in [q["kind"] for q in netlink.qdiscs(host.ns_path, "eth0")]
        before = steps_by_rank(tmp_path)
        wait_until(lambda: min(steps_by_rank(tmp_path).values()) >= min(before.values()) + 2, 30,
                   "steps after the revert")
    finally:
        cluster.close()
    assert leftovers(run_id) == []


def test_sigterm_while_a_rank_is_still_loading(run_id: str, ledger: Ledger, launchers: LauncherPool, tmp_path: Path) -> None:
    """A rank is PID 1 of its container: it must catch SIGTERM from its first moments (the
    kernel drops signals PID 1 has no handler for), not only once torch is imported."""
    n = 2
    cluster = DockerBackend().up(ClusterSpec(run_id, n, tmp_path), ledger, launchers)
    try:
        for r in range(n):
            cluster.start_rank(r, rank_config(cluster, r))
        time.sleep(0.3)  # started, still importing torch
        t0 = time.monotonic()
        exits = cluster.stop_ranks(10.0)
        assert time.monotonic() - t0 < 5.0
        assert sorted((e.rank, e.exitcode, e.signal) for e in exits) == [(r, 0, None) for r in range(n)]
    finally:
        cluster.close()
    assert leftovers(run_id) == []
