"""The FUSE storage faults in real trials through the installed `chaos run`: an io_error's
EIO reaches the built-in runner's checkpointer and the restore after it is the last durable
save on every rank (the state verdict consistent); an io_stall holds rank 0 in its save
until the fault ends while the others time out; a SIGKILL of the harness mid-stall, then
`chaos heal` of that run, leaves no mount and no FUSE daemon behind."""
from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from chaos import proc
from chaos.storage import mounted
from reports.state import CONSISTENT, check_state
from runfolder.events import EVENTS_FILE, read_events
from runfolder.layout import trial_dir
from tests.conftest import CHAOS, REPO, chaos_cli, leftovers, stop_child

pytestmark = [pytest.mark.requires_root, pytest.mark.requires_fuse]
SCENARIOS = REPO / "scenarios"


def test_io_error_reaches_the_checkpointer_and_the_restore_is_the_last_durable_save(tmp_path, leaves_nothing):
    done = chaos_cli("run", str(SCENARIOS / "io_error.yaml"), "--policy", "retry", "--out", str(tmp_path), "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr  # its expectations met: recovered, consistent
    run_dir = next(tmp_path.iterdir())
    events = read_events(trial_dir(run_dir, "retry") / EVENTS_FILE, 0)[0]
    applied = next(e for e in events if e["kind"] == "fault_applied" and e["fault_kind"] == "io_error")
    assert "FUSE" in applied["mechanism"] and applied["storage"].endswith("ckpt")
    reverted = next(e for e in events if e["kind"] == "fault_reverted" and e["index"] == applied["index"])
    failed = [e for e in events if e["kind"] == "checkpoint_failed"]
    assert failed and {e["errno"] for e in failed} == {"EIO"}
    assert all(applied["t"] <= e["t"] <= reverted["t"] for e in failed)
    durable = [e["step"] for e in events if e["kind"] == "checkpoint" and e["t"] < failed[0]["t"]]
    # the link_down after the EIOs makes every rank restore: the newest save that went through
    restored = {e["rank"]: e["step"] for e in events
                if e["kind"] == "restored" and e["t"] > failed[0]["t"] and e.get("source") == "checkpoint"}
    assert sorted(restored) == [0, 1, 2, 3] and set(restored.values()) == {durable[-1]}, (restored, durable)
    verdict = check_state(events)
    assert verdict.verdict == CONSISTENT and verdict.restores_checked >= 4, verdict.summary()


def test_io_stall_holds_the_save_until_the_storage_comes_back(tmp_path, leaves_nothing):
    done = chaos_cli("run", str(SCENARIOS / "io_stall.yaml"), "--policy", "timeout", "--out", str(tmp_path), "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr  # its expectations met: failed-fast, consistent
    events = read_events(trial_dir(next(tmp_path.iterdir()), "timeout") / EVENTS_FILE, 0)[0]
    applied = next(e for e in events if e["kind"] == "fault_applied" and e["fault_kind"] == "io_stall")
    reverted = next(e for e in events if e["kind"] == "fault_reverted" and e["index"] == applied["index"])
    rank0 = [e for e in events if e.get("rank") == 0 and e["kind"] in ("step", "checkpoint")]
    stalled = next(e for e in rank0 if e["kind"] == "checkpoint" and e["t"] > applied["t"])
    before = [e for e in rank0 if e["kind"] == "step" and e["t"] < stalled["t"]][-1]
    # rank 0's last step before the save was within the fault; the save ended only as the fault did
    assert applied["t"] <= before["t"] < applied["t"] + 1.0
    assert stalled["t"] - before["t"] > 1.5 and abs(stalled["t"] - reverted["t"]) < 0.5, (before, stalled, reverted)
    timed_out = [e for e in events if e["kind"] == "collective_error" and e["rank"] != 0]
    assert timed_out and all(e["t"] < stalled["t"] for e in timed_out)  # the others gave up waiting meanwhile


def test_sigkill_mid_stall_then_heal_of_the_run_leaves_no_mount(tmp_path, leaves_nothing, monkeypatch):
    # a ledger folder of its own: a harness started meanwhile (another test) heals dead runs
    # as it starts, and would take this one's mount before the heal below
    monkeypatch.setenv("CHAOS_STATE_DIR", str(tmp_path / "state"))
    child = subprocess.Popen([CHAOS, "run", str(SCENARIOS / "io_stall.yaml"), "--policy", "timeout",
                              "--out", str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    run_id = None
    try:
        deadline = time.monotonic() + 120
        assert child.stderr is not None
        for line in child.stderr:  # progress lines: wait until the stall is on
            if "applied" in line:
                break
            assert time.monotonic() < deadline, "the fault was never applied"
        else:
            raise AssertionError(f"chaos run ended before the fault: rc {child.wait()}")
        run_id = json.loads(next(tmp_path.rglob("trial.json")).read_text())["run_id"]
        directory = str(next(tmp_path.rglob("ckpt")))
        assert mounted(directory) and proc.helpers_of_run(run_id)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        assert mounted(directory)  # the mount outlives the harness: a heal must take it
        healed = chaos_cli("heal", "--run-id", run_id)
        assert healed.returncode == 0, healed.stderr
        assert "unmount_fuse" in healed.stdout or "stop_fuse" in healed.stdout, healed.stdout
        assert not mounted(directory) and proc.helpers_of_run(run_id) == []
        Path(directory, "after-heal").write_bytes(b"x")  # the directory itself again, not a hung mount
        assert leftovers(tmp_path) == []
    finally:
        stop_child(child, grace_s=5, run_id=run_id)
