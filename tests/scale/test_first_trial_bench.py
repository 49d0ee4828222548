"""bench/first_trial.py: from `chaos run` to the first trial's cluster and steps."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def first_trial_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / "first_trial.py"), *args], capture_output=True,
                          text=True, timeout=400)


@pytest.mark.requires_root
def test_it_times_a_run_whose_launcher_was_started_as_the_command_began(leaves_nothing):
    done = first_trial_bench("--runs", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    [row] = [line for line in done.stdout.splitlines() if line.startswith(f"| {BENCH.parent} |")]
    cells = re.fullmatch(r"\| .+ \| 1 \| ahead \| (\d+\.\d\d) s \| (\d+\.\d\d) s \| (\d+\.\d\d) s \| (\d+\.\d\d) s \|", row)
    assert cells, row
    to_start, up, to_up, to_step = map(float, cells.groups())
    assert 0 < to_start < to_up < to_step and 0 < up <= to_up


def test_bad_arguments_say_what_to_give():
    done = first_trial_bench("--runs", "0")
    assert done.returncode == 2 and "--runs: give 1 or more" in done.stderr and "Traceback" not in done.stderr
