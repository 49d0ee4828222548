"""One real trial (16 gloo ranks on network namespaces): every event its ranks and the
harness write follows the run-folder contract, and trial.json holds the plan it ran."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.cluster.backends import backend_named
from harness.scenario.scenario import load_scenario
from harness.trial.scenario_run import run_scenario
from harness.trial.plan import build_plan
from harness.trial.progress import Progress
from runfolder.events import EVENTS_FILE, read_events, schema_problems
from runfolder.info import read_run_info, read_trial_info
from runfolder.layout import trial_dir
from tests.conftest import REPO


@pytest.mark.requires_root
def test_a_real_trial_writes_the_contract(tmp_path: Path, leaves_nothing) -> None:
    path = REPO / "scenarios" / "kill_rank.yaml"
    scenario = load_scenario(path)
    run_dir, [result] = run_scenario(scenario, path, ["timeout"], tmp_path, backend_named("netns"),
                                     Progress(quiet=True))
    assert result.end == "all-exited"
    assert read_run_info(run_dir).policies == ("timeout",)
    assert read_trial_info(trial_dir(run_dir, "timeout")).plan == build_plan(scenario, "timeout").trial
    events, _ = read_events(result.trial_dir / EVENTS_FILE)
    kinds = {e["kind"] for e in events}
    assert {"rank_start", "group_ready", "step", "collective_error", "exit", "fault_applied", "trial_end"} <= kinds
    assert sorted({p for e in events for p in schema_problems(e)}) == []
    [stopping] = [e["t"] for e in events if e["kind"] == "stopping"]  # the teardown's first step
    assert all(e["t"] >= stopping for e in events if e.get("stopped") or e["kind"] == "trial_end")
    # the run's fault-free trajectory, computed after its trial, and the trial held against it
    import reports
    from reports.trajectory import MATCHES, read_reference
    reference = read_reference(run_dir)
    assert reference is not None and reference.world == 16
    steps = max(e["step"] for e in events if e["kind"] == "step")
    assert all(len(losses) == steps + 1 for losses in reference.losses)
    row = reports.analyze_run(run_dir).iloc[0]
    assert row["trajectory"] == MATCHES, row["trajectory_detail"]
