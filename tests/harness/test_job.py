"""The whole path, as a user runs it: `chaos run` on real namespaces with real gloo ranks.

These need root (CI has it) and take tens of seconds each: a 16-rank job on two cores.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

import reports
from chaos.ledger import Ledger, state_dir
from runfolder.events import EVENTS_FILE, read_events
from runfolder.info import read_run_info
from runfolder.layout import trial_dir
from tests.conftest import CHAOS, REPO, chaos_cli, leftovers, stop_child

SCENARIO = REPO / "scenarios" / "link_down.yaml"
pytestmark = [pytest.mark.requires_root]


def ledgers() -> set[str]:
    return {p.name for p in state_dir().glob("*.jsonl")} if state_dir().is_dir() else set()


def test_link_down_through_the_installed_command(tmp_path, leaves_nothing):
    """Two of the four policies through `chaos` itself, whose exit code judges their expect
    block (CI leaves these two out of scenarios/link_down.yaml under the pytest plugin)."""
    done = chaos_cli("run", str(SCENARIO), "--policy", "baseline", "--policy", "timeout",
                     "--out", str(tmp_path), "--quiet", timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = tmp_path.iterdir()
    table = reports.analyze_run(run_dir).set_index("policy")
    assert list(table.index) == ["baseline", "timeout"]
    assert table.loc["baseline", "outcome"] == "hung"
    assert table.loc["baseline", "hung_cap"] == 20
    assert table.loc["timeout", "outcome"] == "failed-fast"
    assert 5.0 <= table.loc["timeout", "ttd_s"] <= 7.0
    assert table.loc["timeout", "detect_ranks"] == 16
    for name in ("report.md", "report.html", "metrics.csv"):
        assert (run_dir / name).stat().st_size > 0
    assert "hung >= 20 s" in done.stdout or ">= 20 s" in done.stdout
    # where every rank waited at the cap, read from outside: all 16 in the step's all-reduce,
    # one group wherever inside the wait py-spy caught each
    [stuck] = re.findall(r"stuck in: (.*?) \| >= 20 s", done.stdout)
    assert re.findall(r"(\d+) ranks? in all_reduce: ", stuck) == ["16"], stuck
    assert "Workload.train_step" in stuck
    assert table.loc["baseline", "state"] == table.loc["timeout", "state"] == "consistent"
    captured = [e for e in read_events(trial_dir(run_dir, "baseline") / EVENTS_FILE, 0)[0]
                if e["kind"] in ("hang_detected", "stacks_captured")]
    assert [e["kind"] for e in captured] == ["hang_detected", "stacks_captured"]  # after the cap's time
    assert captured[1]["dumped"] == captured[1]["processes"] == 16
    # the first trial's launcher was started as the command began (its import of torch
    # overlapping the command's own work); the second forked from the one the first gave back
    ups = [e for policy in ("baseline", "timeout")
           for e in read_events(trial_dir(run_dir, policy) / EVENTS_FILE, 0)[0] if e["kind"] == "cluster_up"]
    assert [e["launcher"] for e in ups] == ["ahead", "kept"]
    # the machine's speed, measured as the command began, is kept with the run and reported
    machine = read_run_info(run_dir).machine
    assert machine is not None and machine.cpus >= 1 and machine.loop_ns > 0 and machine.wake_us > 0
    assert f"- machine: {machine.describe()}" in (run_dir / "report.md").read_text()


def _start_run(tmp_path: Path, policy: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [CHAOS, "run", str(SCENARIO), "--policy", policy,
         "--out", str(tmp_path)], cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True)
    deadline = time.monotonic() + 120
    assert proc.stderr is not None
    try:
        for line in proc.stderr:  # progress lines: wait until the fault is on
            if "applied" in line:
                return proc
            assert time.monotonic() < deadline, "the fault was never applied"
        raise AssertionError(f"chaos run ended before the fault: rc {proc.wait()}")
    except BaseException:
        stop_child(proc)
        raise


def test_ctrl_c_during_a_fault_leaves_nothing(tmp_path, leaves_nothing):
    proc = _start_run(tmp_path, "baseline")
    try:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        stop_child(proc)  # a test that fails kills what it started
    assert proc.returncode == 130, err
    assert "interrupted" in err


def owned_by(pid: int) -> set[str]:
    """The ledgers in the state directory whose owner entry names `pid`."""
    return {name for name in ledgers()
            if any(e.op == "owner" and e.args["pid"] == pid for e in Ledger(name.removesuffix(".jsonl")).entries())}


def test_sigkill_then_heal_leaves_nothing(tmp_path, leaves_nothing, monkeypatch):
    # a ledger folder of its own: a harness started meanwhile (another test) heals dead runs
    # as it starts, and would take this one's before the heal below
    monkeypatch.setenv("CHAOS_STATE_DIR", str(tmp_path / "state"))
    proc = _start_run(tmp_path, "baseline")
    # the trial's ledger and the one of the rank launcher that the run's trials share
    assert len(owned_by(proc.pid)) == 2
    proc.kill()
    proc.wait()
    # the rank launcher and every rank die with the harness (PR_SET_PDEATHSIG)...
    deadline = time.monotonic() + 10
    while any(x.startswith("rank") for x in leftovers(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(x.startswith("rank") for x in leftovers(tmp_path))
    # ...but the namespaces and the ledger stay until a heal
    assert any(x.startswith("chaos-") for x in leftovers(tmp_path))
    ledger = f"{json.loads(next(tmp_path.rglob('trial.json')).read_text())['run_id']}.jsonl"
    assert ledger in ledgers()  # (other runs on this host may add ledgers meanwhile)
    healed = chaos_cli("heal")
    assert healed.returncode == 0, healed.stderr
    assert "healed" in healed.stdout
    assert leftovers(tmp_path) == []
    assert owned_by(proc.pid) == set()
    again = chaos_cli("heal")  # idempotent
    assert again.returncode == 0 and ledger not in again.stdout


@pytest.mark.parametrize("args, words", [
    (["run", "nope.yaml"], "no such scenario file"),
    (["run", str(SCENARIO), "--policy", "yolo"], "--policy yolo"),
    (["run", str(SCENARIO), "--ranks", "4"], "rank 5 is outside the cluster"),
    (["run", str(SCENARIO), "--ranks", "x"], "invalid int value"),
])
def test_bad_input_is_one_line_and_exit_2(args, words, tmp_path):
    done = chaos_cli(*args, "--out", str(tmp_path))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("chaos: error:"), done.stderr
    assert words in lines[0]
    assert not list(tmp_path.iterdir())  # refused before any run began


def test_not_root_on_a_backend_that_needs_it_is_refused_with_the_fix():
    # the netns backend runs as an ordinary user in a user namespace (tests/run/test_user_namespace.py);
    # the docker engine is root's
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
         CHAOS, "run", str(SCENARIO), "--backend", "docker"],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "HOME": "/tmp"})
    assert done.returncode == 2, done.stderr
    assert "needs root on the docker backend" in done.stderr and "--backend local" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
