"""A machine that stops: every process of a 16-rank job (ranks, their hearts, the control
plane) stopped at once for 0.6 s, twice, as a virtual machine's host stops it. The job
must make no false suspicion: a detector does not count silence over its own stall.
Before it did, one such stop made 588 heartbeat suspicions and 3 cut-offs."""
from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from chaos import netlink, proc, topology
from harness.job.control import STALL_LOGGED
from runfolder.events import STOPPING
from tests.conftest import CHAOS, REPO

pytestmark = pytest.mark.requires_root
STOP_S = 0.6
STOPS = 2
WARM_TIMEOUT_S = 120.0


def warm_trial(runs: Path, deadline: float) -> tuple[str, Path]:
    """The run id and trial folder of the job under `runs`, once its warm-up is done."""
    while time.monotonic() < deadline:
        for events in runs.glob("*/trials/*/events.jsonl"):
            lines = [json.loads(line) for line in events.read_text().splitlines() if line.endswith("}")]
            starts = [e for e in lines if e["kind"] == "trial_start"]
            if starts and any(e["kind"] == "warmup_done" for e in lines):
                return starts[0]["run_id"], events.parent
        time.sleep(0.2)
    raise AssertionError(f"no trial under {runs} finished its warm-up within {WARM_TIMEOUT_S:.0f} s")


def stop_the_job(run_id: str, ranks: int) -> int:
    """SIGSTOP every process in the run's namespaces, STOP_S later SIGCONT them; how many."""
    names = [Path(h.ns_path).name for h in topology.hosts_of(run_id, ranks)] + [topology.switch_namespace(run_id)]
    stopped = []
    try:
        for pid, started in proc.in_namespaces(netlink.namespace_inodes(names)):
            proc.send_signal(pid, signal.SIGSTOP, started, gone_ok=True)
            stopped.append((pid, started))
        time.sleep(STOP_S)
    finally:
        for pid, started in stopped:
            proc.send_signal(pid, signal.SIGCONT, started, gone_ok=True)
    return len(stopped)


def test_a_job_stopped_whole_for_0_6_s_makes_no_false_suspicion(tmp_path, leaves_nothing):
    scenario = tmp_path / "machine_stop.yaml"
    text = (REPO / "scenarios" / "detector_no_fault.yaml").read_text()
    scenario.write_text(text.replace("name: detector_no_fault", "name: machine_stop")
                        .replace("settle_steps: 240", "settle_steps: 60"))
    runs = tmp_path / "runs"
    job = subprocess.Popen([CHAOS, "run", str(scenario), "--out", str(runs)], cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        run_id, trial = warm_trial(runs, time.monotonic() + WARM_TIMEOUT_S)
        for _ in range(STOPS):
            assert stop_the_job(run_id, 16) >= 2 * 16 + 1  # each rank, its heart, the control plane
            time.sleep(4.0)
        out, _ = job.communicate(timeout=180)
    finally:
        if job.poll() is None:
            job.terminate()
            job.communicate(timeout=60)
    assert job.returncode == 0, out  # the scenario's expectation: suspects_at_most 0
    # the stops were seen: the control plane did not count the silence over each
    stalls = [line for line in (trial / "logs" / "control.log").read_text().splitlines()
              if line.startswith(STALL_LOGGED)]
    assert len(stalls) >= STOPS, stalls
    events = [json.loads(line) for line in (trial / "events.jsonl").read_text().splitlines()]
    # judged up to `stopping`, as the report judges: once the harness terminates the ranks, one
    # that has not yet taken its SIGTERM sees a peer's lease close and rightly suspects it
    watched = events[:next(i for i, e in enumerate(events) if e["kind"] == STOPPING)]
    assert [e for e in watched if e["kind"] in ("suspect", "collective_error", "exclude")] == []
