"""Judging one policy of a scenario (harness.trial.check) and the pytest plugin over it."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.pytest_plugin import machine_range, steal_range
from harness.scenario.scenario import load_scenario, reproduce_command
from harness.trial.check import PolicyCheck
from runfolder.info import MachineSpeed, RunInfo, write_run_info
from tests.conftest import REPO, chaos_cli, leftovers

SCENARIO = REPO / "scenarios" / "pause_rank.yaml"


def fake_check(tmp_path: Path) -> PolicyCheck:
    """A judged trial whose run folder holds a few events and two rank logs."""
    trial = tmp_path / "run" / "trials" / "timeout"
    (trial / "logs").mkdir(parents=True)
    events = [
        {"t": 10.0, "src": "harness", "rank": None, "kind": "warmup_done", "step": 12},
        {"t": 11.0, "src": "harness", "rank": None, "kind": "fault_applied", "index": 0,
         "fault_kind": "pause", "targets": [5], "mechanism": "SIGSTOP"},
        {"t": 16.1, "src": "rank", "rank": 4, "kind": "collective_error", "cause": "timeout",
         "error": "Timed out waiting 5000ms for recv operation to complete"},
        {"t": 16.2, "src": "rank", "rank": 6, "kind": "collective_error", "cause": "timeout", "error": "x"},
        {"t": 16.2, "src": "rank", "rank": 6, "kind": "collective_error", "cause": "closed", "error": "y"},
        {"t": 16.5, "src": "harness", "rank": 4, "kind": "rank_exited", "exitcode": 3, "signal": None},
    ]
    (trial / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (trial / "logs" / "r000.log").write_text("".join(f"line {i}\n" for i in range(20)))
    (trial / "logs" / "r001.log").write_text("")
    metrics = {"outcome": "failed-fast", "outcome_reason": "16 of 16 ranks exited failed-fast", "ttd_s": 5.1}
    return PolicyCheck(load_scenario(SCENARIO), SCENARIO, "timeout", tmp_path / "run", metrics,
                       ("outcome: expected hung, measured failed-fast",), 12.5,
                       reproduce_command(SCENARIO, "timeout", 1, {"cluster.ranks": 64, "cluster.backend": None}))


def test_a_failure_names_the_expectation_the_measured_value_and_the_command(tmp_path: Path) -> None:
    text = fake_check(tmp_path).failure_text()
    assert "pause_rank under timeout: 1 expectation not met" in text
    assert "outcome: expected hung, measured failed-fast" in text
    assert f"reproduce: chaos run {SCENARIO} --policy timeout --ranks 64 --seed 1" in text


def test_the_reproducing_command_has_every_policy_and_each_option_the_run_overrode() -> None:
    assert reproduce_command(SCENARIO, ["retry", "timeout"], 7, {"cluster.backend": "docker", "seed": 7}) == \
        f"chaos run {SCENARIO} --policy retry --policy timeout --backend docker --seed 7"


def test_the_timeline_is_in_seconds_after_warm_up(tmp_path: Path) -> None:
    lines = fake_check(tmp_path).timeline_text().splitlines()
    assert lines[0].startswith("   +0.000 s  warmup_done")
    assert lines[1].startswith("   +1.000 s  fault_applied") and '"targets":[5]' in lines[1]
    assert lines[2].startswith("   +6.100 s  first collective error: r4 timeout: Timed out")
    assert lines[3].startswith("   +6.200 s  collective errors on 2 ranks by now")
    assert lines[4].startswith("   +6.500 s  r4 rank_exited")


def test_the_log_tails_show_the_last_lines_of_every_rank(tmp_path: Path) -> None:
    tails = fake_check(tmp_path).log_tails(lines=3)
    assert tails == "--- r000.log\nline 17\nline 18\nline 19\n--- r001.log\n(empty)"


def test_the_summary_line_has_outcome_times_and_runtime(tmp_path: Path) -> None:
    assert fake_check(tmp_path).summary() == "timeout: failed-fast (detect 5.10 s) in 12.5 s"


# -- the plugin, as `pytest scenarios/` runs it --------------------------------------------

TINY = """\
cluster: {ranks: 4}
warmup_steps: 4
faults:
  - {kind: pause, target: {rank: 1}, start: 500ms, duration: 1s}
hang_cap: 10s
settle_steps: 4
policies:
  timeout: {timeout: 5s}
expect:
  timeout: {outcome: hung}
"""


def test_the_summary_gives_the_machines_speed_over_the_runs(tmp_path: Path) -> None:
    def run(name: str, machine: MachineSpeed | None) -> Path:
        (tmp_path / name).mkdir()
        write_run_info(tmp_path / name, RunInfo(
            scenario=name, scenario_file=f"{name}.yaml", seed=1, backend="netns", policies=("timeout",),
            started_wall="2026-12-03T00:00:00+00:00", command="chaos run", clock="monotonic", machine=machine))
        return tmp_path / name
    fast = run("fast", MachineSpeed(cpus=2, model="", loop_ns=44.4, wake_us=5.56, load_1m=0.11, fault_us=1.23))
    slow = run("slow", MachineSpeed(cpus=2, model="", loop_ns=73.2, wake_us=9.81, load_1m=64.34, fault_us=3.07))
    before_faults = run("before_faults", MachineSpeed(cpus=2, model="", loop_ns=50.0, wake_us=6.0, load_1m=1.0))
    unmeasured = run("unmeasured", None)
    assert machine_range([fast, unmeasured, slow]) == (
        "machine over 2 run(s): a Python loop step 44-73 ns, a round trip between two processes on one CPU "
        "5.6-9.8 us, a page's first touch 1.2-3.1 us, load average 0.1-64.3 (harness/trial/machine.py)")
    assert machine_range([fast]).startswith("machine over 1 run(s): a Python loop step 44 ns, a round trip "
                                            "between two processes on one CPU 5.6 us, a page's first touch "
                                            "1.2 us, load average 0.1 (")
    assert machine_range([before_faults]).startswith("machine over 1 run(s): a Python loop step 50 ns, a round "
                                                     "trip between two processes on one CPU 6.0 us, load average")
    assert machine_range([unmeasured]) == "machine: not measured in any run"


def test_the_summary_gives_the_share_the_vms_host_took_over_the_trials() -> None:
    assert steal_range([0.004, None, 0.121]) == ("steal over 2 trial(s): the VM's host took 0.4-12.1% of this "
                                                 "machine's CPU time while the ranks ran (/proc/stat)")
    assert steal_range([None]) == "steal: not counted in any trial"


def pytest_in(folder: Path, *args: str, **kwargs) -> subprocess.Popen:
    # the plugin comes with the installed harness (its pytest11 entry point): no conftest.py
    return subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(folder),
                             "-c", "/dev/null", str(folder), "--chaos-out", str(folder / "runs"), *args],
                            cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


def test_a_broken_file_is_a_collection_error_naming_file_line_and_field(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text(TINY.replace("{rank: 1}", "{rank: 9}"))
    out, _ = pytest_in(tmp_path, "--collect-only").communicate(timeout=120)
    assert "broken.yaml:4: faults.0.target.rank: rank 9 is outside the cluster" in out, out


@pytest.mark.requires_root
def test_a_broken_expectation_fails_with_measured_value_command_timeline_and_logs(tmp_path: Path) -> None:
    """Under pytest-xdist, as `./dev.sh test` runs it: the worker's runtime table reaches the
    controller's summary."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    out, _ = pytest_in(tmp_path, "-rA", "-n", "2").communicate(timeout=300)
    assert "tiny.yaml::timeout FAILED" in out or "FAILED tiny.yaml::timeout" in out, out
    assert "outcome: expected hung, measured absorbed" in out, out
    assert f"reproduce: chaos run {tmp_path / 'tiny.yaml'} --policy timeout --seed 0" in out, out
    assert "fault timeline (seconds after warm-up)" in out and "fault_applied" in out, out
    assert "rank logs (tails)" in out and "--- r000.log" in out, out
    assert "chaos scenarios: runtime per scenario and policy" in out, out
    assert re.search(r"^machine over 1 run\(s\): a Python loop step \d+ ns, a round trip between two "
                     r"processes on one CPU [\d.]+ us, a page's first touch [\d.]+ us, load average [\d.]+ ", out,
                     re.MULTILINE), out
    assert leftovers(tmp_path / "runs") == []


@pytest.mark.requires_root
def test_chaos_run_names_the_broken_expectation_and_the_command_with_the_options_it_ran_with(tmp_path: Path) -> None:
    (tmp_path / "tiny.yaml").write_text(TINY)
    done = chaos_cli("run", str(tmp_path / "tiny.yaml"), "--ranks", "4", "--out", str(tmp_path / "runs"),
                     "--quiet", timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "EXPECTATION FAILED: timeout: outcome: expected hung, measured absorbed" in done.stderr, done.stderr
    assert f"reproduce: chaos run {tmp_path / 'tiny.yaml'} --policy timeout --ranks 4 --seed 0" in done.stderr
    assert leftovers(tmp_path / "runs") == []


@pytest.mark.requires_root
def test_ctrl_c_during_a_scenario_test_leaves_nothing_behind(tmp_path: Path) -> None:
    (tmp_path / "long.yaml").write_text(TINY.replace("duration: 1s", "duration: 60s"))
    proc = pytest_in(tmp_path)
    deadline = time.monotonic() + 120
    while True:  # until the fault is on
        events = list((tmp_path / "runs").rglob("events.jsonl"))
        if events and "fault_applied" in events[0].read_text():
            break
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out  # pytest: interrupted
    assert leftovers(tmp_path / "runs") == []
