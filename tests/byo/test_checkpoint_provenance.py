"""Two trials of a user's job that share one checkpoint path: the hook records what each
saved and loaded, and the report says where each load came from (reports.checkpoints).

The job is tests/byo/newcomer/ddp_train.py, 2 ranks on loopback with the environment the
harness gives a rank (tests/byo/test_hook.py's `run_ranks`), each run recorded into a trial
of one run folder, as `chaos run` would have: an earlier run leaves ck.pt behind, trial
`first` resumes from it, trial `second` from what `first` wrote."""
from __future__ import annotations

import dataclasses
import secrets
import sys
import time
from pathlib import Path

import pytest

from harness.scenario.scenario import load_scenario
from harness.trial.scenario_run import start_run
from harness.trial.plan import build_plan
import reports
from runfolder import events as kinds
from runfolder.events import EVENTS_FILE, EventRecorder, read_events, schema_problems
from runfolder.info import TrialInfo, read_trial_info, write_trial_info
from runfolder.layout import trial_dir
from tests.byo.test_hook import run_ranks

pytestmark = pytest.mark.system  # real DDP ranks on loopback: not in ./dev.sh check


SCRIPT = Path(__file__).resolve().parent / "newcomer" / "ddp_train.py"
SCENARIO = """\
cluster: {{ranks: 2}}
job: {{command: [python, {script}, --ckpt, {ckpt}, --sleep, "0"]}}
warmup_steps: 2
faults:
  - {{kind: pause, target: {{rank: 1}}, start: 1s, duration: 1s}}
variants:
  first: {{args: [--steps, "20"]}}
  second: {{args: [--steps, "30"]}}
"""


def record_trial(run_dir: Path, scenario, name: str, steps: int, folder: Path) -> Path:
    """Run the job as trial `name` of `run_dir`: its trial.json, its ranks' events, its end."""
    where = trial_dir(run_dir, name)
    where.mkdir(parents=True)
    write_trial_info(where, TrialInfo(plan=build_plan(scenario, name).trial, run_id=secrets.token_hex(3),
                                      backend="local", mono_anchor=time.monotonic(), wall_anchor=time.time()))
    harness = EventRecorder(where / EVENTS_FILE, kinds.HARNESS)
    harness.emit(kinds.TRIAL_START, policy=name, ranks=2, run_id="x", backend="local", hang_cap=30.0)
    done = run_ranks([sys.executable, str(SCRIPT), "--ckpt", str(folder / "ck.pt"), "--sleep", "0",
                      "--steps", str(steps)], where / EVENTS_FILE, 2, folder)
    assert [d.returncode for d in done] == [0, 0], [d.stdout[-2000:] for d in done]
    harness.emit(kinds.TRIAL_END, reason="all-exited")
    harness.close()
    return where


def test_a_trial_that_loads_an_earlier_run_s_or_another_trial_s_checkpoint_is_reported_and_fails(tmp_path):
    shared = tmp_path / "job"
    shared.mkdir()
    path = tmp_path / "shared.yaml"
    path.write_text(SCENARIO.format(script=SCRIPT, ckpt=shared / "ck.pt"))
    scenario = load_scenario(path)
    earlier = run_ranks([sys.executable, str(SCRIPT), "--ckpt", str(shared / "ck.pt"), "--sleep", "0", "--steps", "10"],
                        tmp_path / "earlier.jsonl", 2, shared)  # a run before this one left ck.pt behind
    assert [d.returncode for d in earlier] == [0, 0], [d.stdout[-2000:] for d in earlier]
    time.sleep(1.1)  # its file a whole second older than the first trial
    run_dir = start_run(tmp_path / "runs", scenario, path, ["first", "second"], "local", "chaos run shared.yaml")
    first = record_trial(run_dir, scenario, "first", 20, shared)
    record_trial(run_dir, scenario, "second", 30, shared)
    saves = [e for e in read_events(first / EVENTS_FILE)[0] if e["kind"] == "checkpoint_save"]
    assert [(e["rank"], e["path"], e["step"]) for e in saves] == [(0, str(shared / "ck.pt.tmp"), 10)]
    assert all(not schema_problems(e) for d in ("first", "second")
               for e in read_events(trial_dir(run_dir, d) / EVENTS_FILE)[0])

    rows = {row["trial"]: row for row in reports.analyze_run(run_dir).to_dict("records")}
    ck = shared / "ck.pt"
    assert rows["first"]["checkpoints"].startswith(f"r0, r1 loaded {ck}, from before the trial (last written ")
    assert rows["second"]["checkpoints"] == f"r0, r1 loaded {ck}, written by trial first"
    for name in ("first", "second"):
        assert rows[name]["expect_ok"] is False  # no expect block, and still a failure
        [failure] = reports.trial_failures(rows[name])
        assert failure.startswith(f"checkpoint: r0, r1 loaded {ck}, ") and "job.shared_checkpoint: true" in failure
    table = reports.format_table(reports.analyze_run(run_dir))
    assert f"checkpoint: r0, r1 loaded {ck}, written by trial first" in table

    # on purpose: still said, no longer a failure
    for name in ("first", "second"):
        info = read_trial_info(trial_dir(run_dir, name))
        job = {**info.plan.job, "shared_checkpoint": True}
        write_trial_info(trial_dir(run_dir, name), dataclasses.replace(info, plan=dataclasses.replace(info.plan, job=job)))
    rows = {row["trial"]: row for row in reports.analyze_run(run_dir).to_dict("records")}
    assert rows["second"]["checkpoints"] == f"r0, r1 loaded {ck}, written by trial first"
    assert [reports.trial_failures(rows[n]) for n in ("first", "second")] == [[], []]
