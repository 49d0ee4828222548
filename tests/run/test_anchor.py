"""Faults anchored on events (harness.scenario.anchors, harness.trial.anchor_watch): the
scenario's `start: {on: EVENT, ...}`, refused where it cannot come, planned and shown by --dry-run, and applied by the
orchestrator when the event comes (fake clock) or recorded as not applied when it never
does; one real trial kills a rank when a checkpoint save begins."""
from __future__ import annotations

from pathlib import Path

import pytest

from chaos.errors import UsageError
from harness.cluster.backends import backend_named
from harness.scenario.anchors import ANCHOR_EVENTS
from harness.scenario.scaling import scaled_to_cores
from harness.scenario.scenario import load_scenario
from harness.trial.anchor_watch import AnchorWatch
from harness.trial.scenario_run import run_scenario
from harness.trial.plan import build_plan, plan_text
from harness.trial.progress import Progress
import reports
from runfolder.events import SCHEMA, read_events, schema_problems
from runfolder.plan import Anchor, PlannedFault
from tests.run.test_trial_fake import HEADER, offsets, run_trial

ANCHORED = HEADER + """\
hang_cap: 10s
faults:
  - {kind: pause, target: {rank: 1}, start: {on: step, nth: 3, delay: 500ms, rank: 2}, duration: 1s}
  - {kind: pause, target: {rank: 3}, start: 1s, duration: 1s}
"""
NEVER = HEADER + """\
hang_cap: 10s
faults:
  - {kind: kill, target: {rank: 1}, start: {on: breaker, within: 2s}}
"""
USER_JOB = """\
cluster: {ranks: 4}
job: {command: [python, train.py]}
faults:
  - {kind: kill, target: {rank: 1}, start: {on: %s}}
"""


def load(tmp_path: Path, text: str):
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    (tmp_path / "train.py").write_text("")
    return load_scenario(path)


def refusal(tmp_path: Path, text: str) -> str:
    with pytest.raises(UsageError) as refused:
        load(tmp_path, text)
    return str(refused.value)


def test_a_start_on_an_event_is_planned_after_that_event_and_the_seconds_form_stays(tmp_path: Path) -> None:
    plan = build_plan(load(tmp_path, ANCHORED), "timeout").trial
    assert plan.faults[0].anchor == Anchor(on="step", nth=3, delay=0.5, rank=2, until=2.0 + 10.0)
    assert plan.faults[1].anchor is None and plan.faults[1].start == 1.0
    assert [(a.at, a.verb, a.index) for a in plan.actions] == [(1.0, "apply", 1), (2.0, "revert", 1)]
    assert [(a.at, a.verb, a.index) for a in plan.anchored] == [(0.5, "apply", 0), (1.5, "revert", 0)]
    # the latest an action can come: the event at its last awaited moment, plus the fault's own offsets
    assert plan.last_action_s == 12.0 + 1.5


def test_yaml_s_boolean_on_key_is_the_anchor_s_event_and_within_stretches_with_the_scenario(tmp_path: Path) -> None:
    scenario = load(tmp_path, HEADER.replace("ranks: 4", "ranks: 64") + "faults:\n"
                    "  - kind: kill\n    target: {rank: 1}\n    start:\n      on: checkpoint_save\n"
                    "      delay: 1s\n      within: 20s\n")
    anchor = scenario.faults[0].anchor
    assert anchor is not None and (anchor.on, anchor.nth, anchor.delay) == ("checkpoint_save", 1, 1.0)
    stretched = scaled_to_cores(scenario, cores=1).faults[0].anchor
    assert stretched is not None and stretched.delay > 1.0 and stretched.within == pytest.approx(20.0 * stretched.delay)


@pytest.mark.parametrize("start, line, says", [
    ("{on: chekpoint_save}", 3, "faults.0.start.on: Input should be 'step'"),
    ("{on: step, nth: 0}", 3, "faults.0.start.nth: Input should be greater than or equal to 1 (got 0)"),
    ("{on: step, delay: -1s}", 3, "faults.0.start.delay: '-1s' is negative"),
    ("{on: step, rank: 4}", 3, "faults.0.start.rank: rank 4 is outside the cluster (ranks 0..3"),
    ("{on: step, within: 0s}", 3, "faults.0.start.within: must be above 0"),
    ("{on: rank_start}", 3, "faults.0.start.on: rank_start: the runner's ranks start once on the netns backend"),
    ("{nth: 2}", 3, "faults.0.start.on: missing"),
])
def test_a_bad_anchor_is_refused_naming_file_line_and_field(tmp_path: Path, start: str, line: int, says: str) -> None:
    message = refusal(tmp_path, f"cluster: {{ranks: 4}}\nfaults:\n  - {{kind: kill, target: {{rank: 1}}, start: {start}}}\n")
    assert message.startswith(f"{tmp_path / 'scenario.yaml'}:{line}: {says}"), message


@pytest.mark.parametrize("event, says", [
    ("checkpoint_save", "checkpoint_save waits for the job's checkpoint, and the job declares none"),
    ("restore", "restore waits for the job's checkpoint"),
    ("breaker", "a user's job has no circuit breaker"),
    ("retry", "a user's job records no retry"),
])
def test_an_anchor_on_an_event_a_user_s_job_cannot_record_is_refused(tmp_path: Path, event: str, says: str) -> None:
    assert says in refusal(tmp_path, USER_JOB % event)


def test_a_user_s_job_that_names_its_checkpoint_takes_checkpoint_anchors(tmp_path: Path) -> None:
    text = (USER_JOB % "checkpoint_save").replace("[python, train.py]",
                                                  '[python, train.py, --checkpoint, "{trial_dir}/c.pt"]')
    assert load(tmp_path, text).faults[0].anchor is not None


def test_faults_on_different_clocks_are_not_checked_for_order_but_on_one_clock_they_are(tmp_path: Path) -> None:
    kill_then = HEADER + "faults:\n  - {kind: kill, target: {rank: 1}, start: {on: step}}\n" \
                         "  - {kind: pause, target: {rank: 1}, start: %s, duration: 1s}\n"
    assert len(load(tmp_path, kill_then % "5s").faults) == 2  # not known which comes first
    assert "is killed by faults.0" in refusal(tmp_path, kill_then % "{on: step, delay: 1s}")


def test_dry_run_shows_an_anchored_fault_under_its_event(tmp_path: Path) -> None:
    text = plan_text(load(tmp_path, ANCHORED), tmp_path / "scenario.yaml", ["timeout"], lambda fault: "signal")
    assert "  +  1.000 s  apply   faults.1 pause on rank 1" not in text
    assert ("  on rank 2's step #3 after warm-up (waited for until +12 s, else not applied), after the event:\n"
            "    +  0.500 s  apply   faults.0 pause on rank 1 by signal\n"
            "    +  1.500 s  revert  faults.0 pause on rank 1") in text


def _fault(index: int, anchor: Anchor | None) -> PlannedFault:
    return PlannedFault(index=index, kind="kill", fault={}, description="kill", targets=(1,), start=0.0,
                        duration=None, anchor=anchor)


def _event(kind: str, t: float, rank: int, **fields) -> dict:
    return {"t": t, "src": "rank", "rank": rank, "pid": 1, "kind": kind, **fields}


def test_the_watch_counts_each_process_s_events_after_warm_up_and_fires_at_the_first_to_reach_nth() -> None:
    watch = AnchorWatch((_fault(0, Anchor("step", 2, 0.0, 10.0)), _fault(1, None),
                         _fault(2, Anchor("checkpoint_save", 1, 0.0, 10.0, rank=0))), job=False, t_warm=100.0)
    assert set(watch.waiting) == {0, 2}
    watch.see(_event("step", 99.0, 0))                    # before warm-up: not counted
    watch.see(_event("step", 100.1, 0))
    watch.see(_event("step", 100.2, 1))
    watch.see(_event("checkpoint_begin", 100.25, 1))      # not rank 0's
    assert watch.take() == []
    watch.see(_event("step", 100.3, 1))                   # rank 1's second step
    watch.see(_event("step", 100.35, 0))                  # rank 0's: the fault is no longer waiting
    [fired] = watch.take()
    assert (fired.index, fired.t, fired.rank) == (0, 100.3, 1)
    watch.see(_event("checkpoint_begin", 100.4, 0))
    assert [(f.index, f.rank) for f in watch.take()] == [(2, 0)] and watch.waiting == {}


def test_the_watch_reads_a_user_s_job_s_events_and_lets_go_of_what_never_came() -> None:
    watch = AnchorWatch((_fault(0, Anchor("checkpoint_saved", 1, 0.0, 5.0)), _fault(1, Anchor("restore", 1, 0.0, 50.0))),
                        job=True, t_warm=0.0)
    watch.see(_event("checkpoint", 1.0, 0))               # the runner's save: not a user's job's
    watch.see(_event("checkpoint_save", 1.5, 0))
    assert [f.index for f in watch.take()] == [0]
    assert watch.expired(49.0) == [] and watch.expired(50.0) == [1] and watch.waiting == {}


def test_every_anchor_means_events_of_the_run_folder_s_schema() -> None:
    for anchor in ANCHOR_EVENTS.values():
        assert set(anchor.runner) | set(anchor.job) <= set(SCHEMA), anchor.name
        assert anchor.job or anchor.missing, anchor.name


def test_the_trial_applies_an_anchored_fault_its_delay_after_the_event(tmp_path: Path) -> None:
    plan, result, events, _, _ = run_trial(tmp_path, ANCHORED)
    warm = next(e["t"] for e in events if e["kind"] == "warmup_done")
    third = [e["t"] for e in events if e["kind"] == "step" and e["rank"] == 2 and e["t"] >= warm][2]
    [applied] = [e for e in events if e["kind"] == "fault_applied" and e["index"] == 0]
    assert applied["anchor_t"] == third and applied["anchor_rank"] == 2
    # due at the event plus the delay; the fake clock's poll is the whole lag
    assert 0.5 <= applied["t"] - third <= 0.5 + 0.06
    done = [(verb, index) for verb, index, _ in offsets(events)]
    assert ("apply", 0) in done and ("revert", 0) in done and result.end == "settled"
    assert sorted({p for e in events for p in schema_problems(e)}) == []


def test_a_fault_whose_event_never_came_is_not_applied_and_the_report_says_so(tmp_path: Path) -> None:
    plan, result, events, _, run_dir = run_trial(tmp_path, NEVER)
    assert result.end == "settled" and not [e for e in events if e["kind"] == "fault_applied"]
    [missed] = [e for e in events if e["kind"] == "fault_not_applied"]
    warm = next(e["t"] for e in events if e["kind"] == "warmup_done")
    assert missed["waited_for"] == "breaker #1" and missed["t"] - warm == pytest.approx(2.0, abs=0.06)
    row = reports.analyze_run(run_dir).iloc[0]
    assert row["not_applied"] == "kill on r1: not applied, its event breaker #1 never came (waited to +2.0 s)"


@pytest.mark.requires_root  # the local backend's hosts: processes of this machine; root for its launcher's ledger
def test_a_real_kill_anchored_on_a_checkpoint_save_lands_after_the_save_began(tmp_path: Path, leaves_nothing) -> None:
    path = tmp_path / "kill_at_save.yaml"
    path.write_text("""\
cluster: {ranks: 4, backend: local}
workload: {step_period: 250ms, checkpoint_every: 4}
warmup_steps: 4
hang_cap: 20s
faults:
  - {kind: kill, target: {rank: 1}, start: {on: checkpoint_save, nth: 1}}
  - {kind: kill, target: {rank: 2}, start: {on: retry, within: 3s}}
policies: {timeout: {timeout: 3s}}
""")
    scenario = load_scenario(path)
    _, [result] = run_scenario(scenario, path, ["timeout"], tmp_path, backend_named("local"), Progress(quiet=True))
    events, _ = read_events(result.trial_dir / "events.jsonl")
    warm = next(e["t"] for e in events if e["kind"] == "warmup_done")
    began = [e["t"] for e in events if e["kind"] == "checkpoint_begin" and e["t"] >= warm]
    [applied] = [e for e in events if e["kind"] == "fault_applied"]
    assert applied["index"] == 0 and applied["anchor_t"] == began[0] and applied["t"] >= began[0]
    step_period = 0.25
    assert applied["t"] - applied["anchor_t"] < step_period  # the lag: under a step
    # the timeout policy never retries: the second fault waited for nothing, and says so
    [missed] = [e for e in events if e["kind"] == "fault_not_applied"]
    assert missed["index"] == 1 and missed["waited_for"] == "retry #1"
    assert sorted({p for e in events for p in schema_problems(e)}) == []

