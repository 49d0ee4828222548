"""The pytest plugin through its `pytest11` entry point, as a user outside this repository
runs it: `pytest path/to/their/scenarios/` collects one test per scenario and policy, and
leaves YAML files that are not scenarios alone."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_plugin_collects_scenarios_outside_the_repository(tmp_path):
    folder = tmp_path / "their-scenarios"
    folder.mkdir()
    (folder / "kill.yaml").write_text((REPO / "scenarios" / "kill_rank.yaml").read_text())
    (folder / "ci.yml").write_text("jobs:\n  test:\n    runs-on: ubuntu-latest\n")
    (folder / "compose.yaml").write_text("services:\n  rank:\n    image: x\n")
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                str(folder)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    tests = sorted(line for line in collected.stdout.splitlines() if "::" in line)
    assert tests == [f"their-scenarios/kill.yaml::{p}" for p in ("baseline", "isolation", "timeout")]


def test_a_broken_scenario_is_one_collection_error_naming_file_and_line(tmp_path):
    (tmp_path / "bad.yaml").write_text("faults:\n  - {kind: link_down, target: {rank: 5}, start: 2 parsecs}\n"
                                       "policies: {timeout: {}}\n")
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert collected.returncode != 0
    assert "bad.yaml:2: faults.0.start: '2 parsecs': unknown unit" in collected.stdout, collected.stdout


def test_a_trial_the_scenario_leaves_to_the_nights_is_marked_nightly_and_ci_deselects_it(tmp_path):
    text = (REPO / "scenarios" / "kill_rank.yaml").read_text()
    (tmp_path / "kill.yaml").write_text(text + "tier: {timeout: nightly}\n")

    def pytest(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def collect(*args: str) -> list[str]:
        return sorted(line for line in pytest("--collect-only", *args, str(tmp_path)).splitlines() if "::" in line)

    assert collect("-m", "nightly") == ["kill.yaml::timeout"]
    assert collect("-m", "not nightly") == ["kill.yaml::baseline", "kill.yaml::isolation"]
    assert len(collect()) == 3  # without -m, every tier (./dev.sh test -m "")
    assert "@pytest.mark.nightly: run only by the nights" in pytest("--markers")  # Python tests take it too
