"""Host safety (issue 14): heal removes every kind of thing a run makes and carries on past an
undo that fails; ranks leave when their harness dies; a dead-man switch fires per on-phase;
calibration and concurrent runs are not healed from under themselves; the session fixture
finds what a test left."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaos import netlink, proc, topology
from chaos.calibrate import scratch_cluster
from chaos.errors import HarnessError
from chaos.heal import heal
from chaos.ledger import Ledger
from chaos.undo import UNDOS
from harness.cluster import host
from harness.cluster.fake import FakeBackend, FakeClock
from harness.cluster.undos import undo_table
from harness.scenario.scenario import load_scenario
from harness.trial.orchestrator import Trial
from harness.trial.scenario_run import start_run
from harness.trial.plan import build_plan
from harness.trial.progress import Progress
from runfolder.layout import trial_dir
from tests.conftest import CHAOS, REPO, chaos_cli, leftovers, stop_child
from tests.run.test_trial_fake import FLAPS

root = pytest.mark.requires_root
DEAD_ENGINE = "unix:///nonexistent/docker.sock"


def _namespaces(run_id: str) -> list[str]:
    return [n for n in netlink.list_namespaces() if n.startswith(topology.namespace_name(run_id, ""))]


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CHAOS_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _fake_trial(tmp_path: Path, backend: FakeBackend) -> None:
    """One trial of FLAPS (link_down pulses 1 s on / 500 ms off within 3 s; a pause of 1 s)."""
    path = tmp_path / "flaps.yaml"
    path.write_text(FLAPS)
    scenario = load_scenario(path)
    run_dir = start_run(tmp_path / "runs", scenario, path, ["timeout"], backend.name, "chaos run")
    Trial(build_plan(scenario, "timeout"), trial_dir(run_dir, "timeout"), backend, Progress(quiet=True),
          make_injector=backend.injector, clock=backend.clock, sleep=backend.clock.sleep,
          state_dir=tmp_path / "state").run()


def test_every_apply_arms_its_dead_man_switch_for_its_own_on_phase(tmp_path: Path) -> None:
    backend = FakeBackend(FakeClock())
    _fake_trial(tmp_path, backend)
    # every on-phase lasts 1 s, plus the 5 s margin (for the whole train: 3 s + 5 s)
    assert backend.clusters[0].dead_men == [6.0, 6.0, 6.0]


def _stale_docker_run(run_id: str) -> Ledger:
    """A dead owner's ledger: a namespace, then a container on an engine that does not answer."""
    ledger = Ledger(run_id)
    ledger.mark(ledger.record("owner", pid=1, started=-1), "done")  # no process started at -1
    topology.make_namespace(ledger, topology.namespace_name(run_id, "sw"))
    ledger.mark(ledger.record("docker_container", name=f"chaos-{run_id}-r000", run_id=run_id,
                              engine=DEAD_ENGINE), "done")
    return ledger


@root
def test_heal_carries_on_past_an_undo_that_fails_and_exits_non_zero_naming_it(state_dir: Path) -> None:
    pytest.importorskip("docker")
    run_id = f"hf{os.getpid()}"
    ledger = _stale_docker_run(run_id)
    try:
        done = chaos_cli("heal", env={**os.environ, "CHAOS_STATE_DIR": str(state_dir)})
        assert done.returncode == 1, done.stdout + done.stderr
        assert "could not undo" in done.stderr and "docker_container" in done.stderr
        assert DEAD_ENGINE in done.stderr
        assert _namespaces(run_id) == []  # the undo before it in the ledger still ran
        assert ledger.path.exists()  # the container entry is still outstanding: a later heal retries it
    finally:
        netlink.remove_namespace(topology.namespace_name(run_id, "sw"))


@root
def test_a_stale_docker_ledger_does_not_block_a_run_s_start_up_heal(state_dir: Path) -> None:
    pytest.importorskip("docker")
    run_id = f"hs{os.getpid()}"
    _stale_docker_run(run_id)
    report = heal(undo_table())  # what `run_scenario` does first
    assert [f.split(":")[0] for f in report.failed] == [f"run {run_id}"]
    assert _namespaces(run_id) == []


_PROBE = """
import sys
from chaos import probe
with probe._scratch_namespace() as (ns, dev):
    print(ns, flush=True)
    sys.stdin.read()
"""


@root
def test_a_killed_probe_s_namespace_is_healed_without_all(state_dir: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", _PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, cwd=REPO)
    try:
        assert child.stdout is not None
        namespace = child.stdout.readline().strip()
        assert namespace == f"chaos-probe{child.pid}-x" and namespace in netlink.list_namespaces()
        assert heal(UNDOS).skipped_live == [f"probe{child.pid}"]  # left alone while the probe lives
        child.kill()
        child.wait(timeout=10)
        assert f"probe{child.pid}" in heal(UNDOS).runs  # a plain heal: no --all
        assert namespace not in netlink.list_namespaces()
        assert list(state_dir.glob("*.jsonl")) == []
    finally:
        stop_child(child, grace_s=5)


@root
def test_a_calibration_cluster_is_not_healed_while_it_measures(state_dir: Path) -> None:
    run_id = f"cal{os.getpid()}"
    with scratch_cluster(run_id, Ledger(run_id)):
        report = heal(UNDOS)  # a concurrent `chaos run` heals first
        assert report.skipped_live == [run_id]
        assert len(_namespaces(run_id)) == 3  # the switch and two hosts
    assert _namespaces(run_id) == []


SMALL = """\
name: small
seed: 3
cluster: {ranks: 4}
workload: {step_period: 250ms}
warmup_steps: 4
settle_steps: 4
hang_cap: 10s
faults:
  - {kind: link_down, target: {rank: 1}, start: 1s, duration: 2s}
policies:
  timeout: {timeout: 5s}
"""


@root
def test_two_runs_at_once_on_one_host_stay_isolated(tmp_path: Path) -> None:
    scenario = tmp_path / "small.yaml"
    scenario.write_text(SMALL)
    outs = [tmp_path / "a", tmp_path / "b"]
    runs = [subprocess.Popen([CHAOS, "run", str(scenario), "--out", str(out)],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for out in outs]
    try:
        texts = [run.communicate(timeout=240)[0] for run in runs]
    finally:
        for run in runs:
            stop_child(run, grace_s=10)
    for run, text in zip(runs, texts, strict=True):
        assert run.returncode == 0, text
    run_ids = [json.loads(next(out.rglob("trial.json")).read_text())["run_id"] for out in outs]
    for text, other in zip(texts, reversed(run_ids), strict=True):
        assert other not in text  # neither healed (nor named) the other's run
    for out in outs:
        kinds = [json.loads(line)["kind"] for line in next(out.rglob("events.jsonl")).read_text().splitlines()]
        assert "fault_applied" in kinds and "fault_reverted" in kinds
        assert leftovers(out) == []


_NETNS_HARNESS = """
import sys
from harness.cli import main
sys.exit(main(["run", sys.argv[1], "--out", sys.argv[2], "--quiet"]))
"""


@root
def test_namespace_ranks_die_with_their_sigkilled_harness(tmp_path: Path) -> None:
    """No lease needed: the launcher dies with the harness and the ranks with the launcher
    (PR_SET_PDEATHSIG). A plain heal then removes the rest."""
    scenario = tmp_path / "small.yaml"
    scenario.write_text(SMALL.replace("start: 1s", "start: 60s"))
    child = subprocess.Popen([sys.executable, "-c", _NETNS_HARNESS, str(scenario), str(tmp_path / "runs")], cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        pids: list[int] = []
        while time.monotonic() < deadline and len(pids) < 4:
            events = list((tmp_path / "runs").rglob("events.jsonl"))
            lines = events[0].read_text().splitlines() if events else []
            pids = [e["pid"] for e in map(json.loads, lines) if e["kind"] == "rank_spawned"]
            time.sleep(0.1)
        assert len(pids) == 4
        started = {pid: proc.start_time(pid) for pid in pids}
        child.kill()
        child.wait(timeout=10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(proc.start_time(p) == s for p, s in started.items()):
            time.sleep(0.05)
        assert [p for p, s in started.items() if proc.start_time(p) == s] == []
        assert heal(undo_table()).failed == []
        assert leftovers(tmp_path / "runs") == []
    finally:
        stop_child(child, grace_s=5)


@root
def test_the_session_check_finds_and_removes_what_a_run_left(state_dir: Path) -> None:
    before = host.snapshot()
    run_id = f"lk{os.getpid()}"
    ledger = Ledger(run_id)
    ledger.mark(ledger.record("owner", pid=1, started=-1), "done")
    topology.make_namespace(ledger, topology.namespace_name(run_id, "sw"))
    helper = subprocess.Popen([sys.executable, "-m", "chaos.deadman", "--run-id", run_id, "--state-dir",
                               str(state_dir), "--at", repr(time.monotonic() + 600), "--entries", ""],
                              stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not proc.helpers_of_run(run_id):
            time.sleep(0.05)
        assert host.left_since(before) == []  # a dead owner's run that is not named: someone else's
        runs = {run_id: None}  # as the session check names its own runs (their folders, ledgers)
        left = host.left_since(before, runs=runs)
        assert {(i.kind, i.run_id) for i in left} == {("ledger", run_id), ("netns", run_id), ("process", run_id)}
        assert host.remove(left, runs).failed == []
        assert host.left_since(before, runs=runs) == []
        helper.wait(timeout=5)  # gone (a TimeoutExpired otherwise)
    finally:
        stop_child(helper, grace_s=1, run_id=run_id)


class _FailingBackend(FakeBackend):
    def up(self, spec, ledger, launchers):  # type: ignore[no-untyped-def]
        raise HarnessError("the engine went away during bring-up")  # before any cluster exists


def test_a_trial_stopped_before_its_cluster_exists_leaves_no_ledger(tmp_path: Path) -> None:
    with pytest.raises(HarnessError):
        _fake_trial(tmp_path, _FailingBackend(FakeClock()))
    assert list((tmp_path / "state").glob("*.jsonl")) == []
