"""bench/steps.py: a step's length against its stretched period, per size."""
from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def steps_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / "steps.py"), *args], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.requires_root
def test_it_measures_each_size_and_policy_and_prints_the_same_table_again_from_the_folder(tmp_path, leaves_nothing):
    done = steps_bench("--ranks", "4", "--seconds", "2", "--policies", "timeout", "elastic",
                       "--out", str(tmp_path), "--quiet")
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 4 |")]
    # 4 ranks on any machine: k = 1, control.yaml's own 250 ms period; the first policy is 1x itself
    figures = r"\| \d+ \| 1 \| 0\.25 s \| \d\.\d{3} / \d\.\d{3} s \| \d+% \| (\d+\.\d\d)x \| \d+ \| ended: settled \|"
    timeout, elastic = (re.fullmatch(rf"\| 4 \| {policy} {figures}", row) for policy, row in
                        zip(("timeout", "elastic"), rows, strict=True))
    assert timeout and elastic, rows
    assert timeout[1] == "1.00" and float(elastic[1]) > 0
    assert re.search(r"^4 ranks: \d+ packets dropped by a full backlog in \d+\.\d s of trials \(the whole "
                     r"host's count\); the VM's host took \d+\.\d% of the CPU time$", done.stdout, re.M), done.stdout
    [run] = (tmp_path / "ranks-4").glob("control-*")
    detector = {p: json.loads((run / "trials" / p / "trial.json").read_text())["plan"]["policy_spec"]["detector"]
                for p in ("timeout", "elastic")}
    assert detector["timeout"] is None and detector["elastic"] is not None
    again = steps_bench("--ranks", "4", "--analyze", str(tmp_path))
    assert again.returncode == 0, again.stderr
    assert rows == [line for line in again.stdout.splitlines() if line.startswith("| 4 |")]
    [machine_line] = [line for line in done.stdout.splitlines() if line.startswith("machine: ")]
    assert re.match(r"machine: \d+ CPUs.*: a Python loop step \d+ ns, a round trip between two processes on one CPU [\d.]+ us.*load average",
                    machine_line)
    assert machine_line in again.stdout.splitlines()  # kept in the folder, not measured again


def test_a_size_that_failed_or_never_ran_says_so(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # the bench imports its neighbours by name
    steps = importlib.import_module("steps")
    failed = tmp_path / "ranks-256"
    failed.mkdir()
    (failed / steps.SIZE_FILE).write_text(json.dumps({"cores": 2, "k": 64, "step_period": 16.0}))
    (failed / steps.FAILED_FILE).write_text(json.dumps("HarnessError: ranks did not make 12 steps within 240 s"))
    assert steps.rows(256, failed) == ["| 256 | timeout | 2 | 64 | 16 s | - | - | - | - | "
                                       "HarnessError: ranks did not make 12 steps within 240 s |"]
    [never] = steps.rows(512, tmp_path / "ranks-512")
    assert "not measured" in never
    assert steps.host_line(256, failed) is None and steps.host_line(512, tmp_path / "ranks-512") is None


@pytest.mark.parametrize(("args", "says"), [
    (["--ranks", "1"], "--ranks 1: give 2 or more"),
    (["--seconds", "0"], "--seconds: give a positive number of seconds"),
    (["--analyze", "{tmp}/missing"], "--analyze {tmp}/missing: no such folder"),
])
def test_bad_arguments_say_what_to_give(args, says, tmp_path):
    says = says.format(tmp=tmp_path)
    done = steps_bench(*(a.format(tmp=tmp_path) for a in args))
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr
