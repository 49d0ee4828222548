"""The run-folder contract as the reports read it: versions, typed info, event kinds."""
from __future__ import annotations

import dataclasses
import json

import pytest

import report_fakes as fakes
from reports import RunFolderError, analyze_run, compare_runs, report_main
from runfolder.events import SCHEMA, schema_problems
from runfolder.info import FORMAT_VERSION, MachineSpeed, read_run_info, read_trial_info
from runfolder.layout import RUN_FILE, TRIAL_FILE, trial_dir, trial_dirs

HISTORIES = (fakes.absorbed, fakes.failed_fast, fakes.recovered, fakes.isolated, fakes.hung, fakes.crashed,
             fakes.killed_then_failed_fast, fakes.continued, fakes.rejoined, fakes.retries_exhausted,
             fakes.stalled_without_verdict, fakes.no_fault, fakes.restarted)

# run.json and trial.json as the orchestrator wrote them before run folders were versioned
# (commit b3f0031: harness/trial/orchestrator.py, run_scenario and Trial._write_metadata)
UNVERSIONED_RUN = {
    "scenario": "kill_rank", "scenario_file": "scenarios/kill_rank.yaml", "seed": 1, "backend": "netns",
    "policies": ["timeout"], "started_wall": "2026-11-30T19:00:00+00:00",
    "command": "chaos run scenarios/kill_rank.yaml --policy timeout", "clock": "monotonic, one kernel shared by every rank"}
UNVERSIONED_TRIAL = {
    "policy": "timeout", "policy_spec": {"name": "timeout", "base": "timeout", "timeout": 5.0}, "run_id": "a1b2c3",
    "backend": "netns", "ranks": 4, "hang_cap": 30.0, "settle_steps": 8, "seed": 1, "mono_anchor": 1.0,
    "wall_anchor": 2.0, "faults": [{"index": 0, "kind": "kill", "fault": {"kind": "kill", "signal": 9},
                                    "targets": [1], "start": 2.0, "duration": None, "windows": [[2.0, None]]}],
    "expect": {"outcome": ["failed-fast"], "detect_within": 7.0}}


def make_run(tmp_path):
    return fakes.write_run(tmp_path / "run", {"timeout": fakes.failed_fast(), "retry": fakes.recovered()})


def test_run_and_trial_info_round_trip_through_their_files(tmp_path):
    run_dir = make_run(tmp_path)
    events, trial = fakes.expecting(fakes.failed_fast(), outcome=("failed-fast", "isolated"), detect_within=7.5)
    fakes.write_trial(run_dir, "isolation", events, trial)
    assert read_trial_info(trial_dir(run_dir, "isolation")) == trial
    info = read_run_info(run_dir)
    assert info.policies == ("timeout", "retry") and info.format_version == FORMAT_VERSION
    assert json.loads((run_dir / RUN_FILE).read_text())["format_version"] == FORMAT_VERSION


SPEED = MachineSpeed(cpus=2, model="Intel(R) Xeon(R) Processor", loop_ns=52.4, wake_us=9.51, load_1m=1.8,
                     fault_us=3.07)


def test_the_machines_speed_is_kept_with_the_run_and_reported_beside_its_figures(tmp_path):
    runs = [fakes.write_run(tmp_path / "fast", {"timeout": fakes.failed_fast()}, machine=SPEED),
            fakes.write_run(tmp_path / "unmeasured", {"timeout": fakes.failed_fast()})]
    assert read_run_info(runs[0]).machine == SPEED
    line = ("machine: 2 CPUs (Intel(R) Xeon(R) Processor): a Python loop step 52 ns, a round trip between "
            "two processes on one CPU 9.5 us, a page's first touch 3.1 us, load average 1.80 (harness/trial/machine.py)")
    assert report_main([str(runs[0])]) == 0
    assert f"- {line}" in (runs[0] / "report.md").read_text()
    assert report_main([str(runs[1])]) == 0
    assert "- machine: not measured (" in (runs[1] / "report.md").read_text()
    compared = compare_runs(runs)
    assert f"fast (seed 7): {runs[0]}; {line}" in compared
    assert f"unmeasured (seed 7): {runs[1]}; machine: not measured (" in compared


def test_a_format_1_folder_still_reads_and_says_its_machine_was_not_recorded(tmp_path):
    run_dir = make_run(tmp_path)
    for path in (run_dir / RUN_FILE, *(d / TRIAL_FILE for d in trial_dirs(run_dir))):
        data = json.loads(path.read_text())
        data.pop("machine", None)  # what format 1 wrote: run.json without it
        path.write_text(json.dumps({**data, "format_version": 1}))
    assert read_run_info(run_dir).machine is None and len(analyze_run(run_dir)) == 2
    assert report_main([str(run_dir)]) == 0
    assert "- machine: not recorded (run folder format 1, from before it was)" in (run_dir / "report.md").read_text()


def test_a_format_3_machine_reads_without_a_pages_first_touch(tmp_path):
    run_dir = fakes.write_run(tmp_path / "run", {"timeout": fakes.failed_fast()}, machine=SPEED)
    data = json.loads((run_dir / RUN_FILE).read_text())
    del data["machine"]["fault_us"]  # what format 3 wrote
    (run_dir / RUN_FILE).write_text(json.dumps({**data, "format_version": 3}))
    machine = read_run_info(run_dir).machine
    assert machine is not None and machine.fault_us is None and machine.loop_ns == SPEED.loop_ns
    assert report_main([str(run_dir)]) == 0
    assert ("one CPU 9.5 us, load average 1.80 (harness/trial/machine.py)"
            in (run_dir / "report.md").read_text())


def test_a_format_4_trial_without_fingerprints_reads_as_state_not_observed(tmp_path):
    run_dir = fakes.write_run(tmp_path / "run", {"timeout": fakes.failed_fast()})
    for path in (run_dir / RUN_FILE, trial_dir(run_dir, "timeout") / TRIAL_FILE):
        path.write_text(json.dumps({**json.loads(path.read_text()), "format_version": 4}))
    [row] = analyze_run(run_dir).to_dict("records")
    assert row["state"] == "not observed" and row["expect_failures"] == ""
    assert report_main([str(run_dir)]) == 0
    assert "| not observed |" in (run_dir / "report.md").read_text()


def unversioned_run(tmp_path):
    run_dir = tmp_path / "old-run"
    trial = trial_dir(run_dir, "timeout")
    trial.mkdir(parents=True)
    (run_dir / RUN_FILE).write_text(json.dumps(UNVERSIONED_RUN))
    (trial / TRIAL_FILE).write_text(json.dumps(UNVERSIONED_TRIAL))
    (trial / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in fakes.killed_then_failed_fast()[0]))
    return run_dir


def test_a_folder_written_before_format_versions_is_refused_naming_file_problem_and_fix(tmp_path, capsys):
    run_dir = unversioned_run(tmp_path)
    with pytest.raises(RunFolderError) as refused:
        analyze_run(run_dir)
    message = str(refused.value)
    assert message.startswith(f"{run_dir / RUN_FILE}: no format_version: written before run folders were versioned")
    assert f"reads formats 1 to {FORMAT_VERSION} only" in message
    assert "run the scenario again (`chaos run scenarios/kill_rank.yaml --policy timeout`)" in message
    assert report_main([str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no format_version" in err


def test_an_unversioned_trial_in_a_versioned_run_is_refused_too(tmp_path):
    run_dir = make_run(tmp_path)
    (trial_dir(run_dir, "timeout") / TRIAL_FILE).write_text(json.dumps(UNVERSIONED_TRIAL))
    with pytest.raises(RunFolderError, match=r"timeout/trial.json: no format_version"):
        analyze_run(run_dir)


def test_a_folder_of_a_newer_format_is_refused_with_the_fix(tmp_path):
    run_dir = make_run(tmp_path)
    data = json.loads((run_dir / RUN_FILE).read_text())
    (run_dir / RUN_FILE).write_text(json.dumps({**data, "format_version": FORMAT_VERSION + 1}))
    with pytest.raises(RunFolderError) as refused:
        analyze_run(run_dir)
    assert str(refused.value) == (f"{run_dir / RUN_FILE}: format_version {FORMAT_VERSION + 1} is newer than this "
                                  f"chaos-harness reads ({FORMAT_VERSION}); upgrade chaos-harness to analyze it")


@pytest.mark.parametrize("change, problem", [
    (lambda t: {**t, "format_version": "1"}, "format_version: '1' is not a format version"),
    (lambda t: {**t, "plan": {**t["plan"], "hang_cap": "30s"}}, "plan.hang_cap: expected a number, got '30s'"),
    (lambda t: {**t, "plan": {**t["plan"], "faults": [{**t["plan"]["faults"][0], "targets": ["r1"]}]}},
     "plan.faults.0.targets.0: expected a whole number, got 'r1'"),
    (lambda t: {**t, "plan": {**t["plan"], "expect": {"outcome": ["fast"]}}},
     "plan.expect: outcome 'fast' is not one of incomplete"),
    (lambda t: {k: v for k, v in t.items() if k != "run_id"}, "run_id: missing"),
    (lambda t: {**t, "color": "red"}, "color: unknown field"),
])
def test_a_trial_info_that_is_not_the_format_names_file_and_field(tmp_path, change, problem):
    run_dir = make_run(tmp_path)
    path = trial_dir(run_dir, "retry") / TRIAL_FILE
    path.write_text(json.dumps(change(json.loads(path.read_text()))))
    with pytest.raises(RunFolderError) as refused:
        analyze_run(run_dir)
    assert str(refused.value).startswith(f"{path}: {problem}")


@pytest.mark.parametrize("history", HISTORIES, ids=lambda h: h.__name__)
def test_the_fake_histories_follow_the_event_schema(history):
    events, _ = history()
    assert [p for e in events for p in schema_problems(e)] == []


def test_the_schema_check_names_what_differs():
    step = {"t": 1.0, "src": "rank", "rank": 0, "pid": 9, "kind": "step", "step": 3, "gen": 0, "loss": 1.0}
    assert schema_problems({**step, "dur": 0.1}) == []
    assert schema_problems({**step, "src": "harness", "color": 1}) == [
        "step: missing dur", "step: src 'harness', expected 'rank'", "step: unknown field color"]
    assert schema_problems({**step, "kind": "stepped"}) == ["unknown kind 'stepped'"]


def test_every_kind_is_defined_once_with_its_source():
    assert all(kind.src in ("rank", "harness") and kind.meaning for kind in SCHEMA.values())
    assert {"step", "fault_applied", "hang_detected", "exit"} <= set(SCHEMA)


def test_info_values_are_frozen():
    _, trial = fakes.failed_fast()
    with pytest.raises(dataclasses.FrozenInstanceError):
        trial.plan.hang_cap = 1.0  # type: ignore[misc]


def test_a_process_on_another_machine_writes_its_events_on_the_harness_clock(tmp_path, monkeypatch):
    """CHAOS_CLOCK_OFFSET (node clock - harness clock, set by a Slurm node's agent): every
    event line is on the harness's clock, explicit times too; the caller keeps its own."""
    from runfolder.events import CLOCK_OFFSET_ENV, EventRecorder, read_events
    monkeypatch.setenv(CLOCK_OFFSET_ENV, "1000.5")
    recorder = EventRecorder(tmp_path / "events.jsonl", "rank", rank=3, clock=lambda: 1010.0)
    assert recorder.emit("step", step=1) == 1010.0
    recorder.emit("step", t=1012.25, step=2)
    recorder.close()
    assert [e["t"] for e in read_events(tmp_path / "events.jsonl")[0]] == [9.5, 11.75]
