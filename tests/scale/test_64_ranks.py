"""64 real gloo ranks on namespaces, scaled by `--ranks` (docs/scale.md): a fault-free job
and a kill under the elastic policy, each run with `chaos run` as a user would. Every
expectation of the scenario (its bounds stretched by the same rule) must be met: exit 0."""
from __future__ import annotations

import pytest

import reports
from tests.conftest import REPO, chaos_cli

pytestmark = [pytest.mark.requires_root, pytest.mark.slow]
SCENARIOS = REPO / "scenarios"
RANKS = 64


def run(tmp_path, scenario: str, policy: str):
    done = chaos_cli("run", str(SCENARIOS / scenario), "--policy", policy, "--ranks", str(RANKS),
                     "--out", str(tmp_path), "--quiet", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = tmp_path.iterdir()
    return reports.analyze_run(run_dir).set_index("policy").loc[policy]


def test_64_ranks_fault_free(tmp_path, leaves_nothing):
    row = run(tmp_path, "control.yaml", "timeout")
    assert row["outcome"] == "no-fault"
    assert row["departed"] == 0 and row["suspect_events"] == 0


def test_64_ranks_kill_under_elastic(tmp_path, leaves_nothing):
    row = run(tmp_path, "elastic_kill.yaml", "elastic")
    assert row["outcome"] == "continued"
    assert row["final_world"] == RANKS - 1
    assert row["detect_ranks"] == RANKS - 1  # every survivor learned of the kill
