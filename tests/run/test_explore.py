"""`chaos explore`'s pieces that run no trial: the seeded schedule generator
(harness.studies.explore.generator) and the per-trial oracle with its failure signature (reports.oracle)."""
from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import pytest

from chaos import units
from chaos.errors import UsageError
from harness.scenario.scenario import Scenario, load_scenario
from harness.studies.explore.generator import ExploreOptions, Weights, explorable_events, explorable_kinds, schedules
from harness.trial.plan import build_plan
from reports.oracle import BROKEN, KEPT, NOT_JUDGED, judge, signature
from tests.conftest import REPO

RUNNER = """\
cluster: {ranks: 8%s}
policies: {baseline: {}, timeout: {timeout: 5s}, retry: {timeout: 4s, max_retries: 3}}
"""
JOB = """\
cluster: {ranks: 4}
job: {command: [python, train.py%s]}
"""


def load(tmp_path: Path, text: str) -> Scenario:
    (tmp_path / "s.yaml").write_text(text)
    (tmp_path / "train.py").write_text("")
    return load_scenario(tmp_path / "s.yaml")


def drawn(scenario: Scenario, count: int = 200, **options):
    return list(itertools.islice(schedules(scenario, ExploreOptions(**options)), count))


def test_the_same_seed_draws_the_same_schedules_and_each_one_loads(tmp_path: Path) -> None:
    scenario = load(tmp_path, RUNNER % "")
    first, again, other = drawn(scenario, seed=3), drawn(scenario, seed=3), drawn(scenario, seed=4)
    assert first == again and first != other
    assert [s.number for s in first] == list(range(1, 201))
    for schedule in first[:40]:
        assert 1 <= len(schedule.faults) <= 3
        Scenario.model_validate({**scenario.model_dump(mode="json", exclude={"faults"}), "faults": schedule.faults})


def test_the_baseline_s_hours_long_timeout_draws_times_around_the_hang_cap(tmp_path: Path) -> None:
    """A timeout longer than the hang cap is none to a trial: drawn around 6 h, one schedule
    of the baseline put a disk_full at 9406 s for 9 h."""
    scenario = load(tmp_path, RUNNER % "" + "hang_cap: 20s\n")
    seconds = [units.parse_duration(f[field]) for schedule in drawn(scenario, policies=("baseline",))
               for f in schedule.faults for field in ("start", "duration") if isinstance(f.get(field), str)]
    assert seconds and max(seconds) <= 3 * 20


def test_the_default_distribution_leans_on_events_and_draws_every_count_up_to_max_faults(tmp_path: Path) -> None:
    faults = [f for s in drawn(load(tmp_path, RUNNER % ""), seed=1) for f in s.faults]
    on_event = sum(isinstance(f["start"], dict) for f in faults) / len(faults)
    assert 0.5 <= on_event <= 0.7  # Weights.on_event 0.6
    kinds = Counter(f["kind"] for f in faults)
    assert kinds["kill"] > kinds["loss"] and kinds["link_down"] > kinds["blackhole"]  # weights 3 against 1
    assert {len(s.faults) for s in drawn(load(tmp_path, RUNNER % ""), seed=1, max_faults=2)} == {1, 2}
    # durations from below the shortest timeout (4 s) to permanent
    spans = {f.get("duration") for f in faults if f["kind"] != "kill"}
    assert {"2s", "6s", "12s", None} <= spans


def test_only_kinds_the_backend_takes_and_the_ones_asked_are_drawn(tmp_path: Path) -> None:
    local = load(tmp_path, RUNNER % ", backend: local")
    assert "link_down" not in explorable_kinds(local, ExploreOptions())
    assert {f["kind"] for s in drawn(local, 50) for f in s.faults} <= {"kill", "pause", "disk_full", "read_only"}
    assert {f["kind"] for s in drawn(local, 50, kinds=("pause",)) for f in s.faults} == {"pause"}
    with pytest.raises(ValueError, match="no fault kind to explore: of link_down, the local backend"):
        next(schedules(local, ExploreOptions(kinds=("link_down",))))
    never_kill = Weights(kinds={"kill": 0, "pause": 1})
    assert {f["kind"] for s in drawn(load(tmp_path, RUNNER % ""), 50, weights=never_kill) for f in s.faults} == {"pause"}


def test_a_user_s_job_is_anchored_only_on_events_it_records(tmp_path: Path) -> None:
    bare = load(tmp_path, JOB % "")
    assert set(explorable_events(bare, ExploreOptions())) == {"step", "detect", "new_generation", "rank_start"}
    saving = load(tmp_path, JOB % ', --checkpoint, "{trial_dir}/ckpt/c.pt"')
    events = {f["start"]["on"] for s in drawn(saving) for f in s.faults if isinstance(f["start"], dict)}
    assert {"checkpoint_save", "restore"} <= events and not events & {"retry", "breaker"}


def test_the_runner_is_anchored_only_on_events_a_policy_explored_can_record(tmp_path: Path) -> None:
    # RUNNER's policies have no breaker: baseline and timeout no retries either
    scenario = load(tmp_path, RUNNER.replace("}}", "}, isolating: {base: isolation, timeout: 4s}}") % "")
    def anchors(*policies: str) -> set[str]:
        return {f["start"]["on"] for s in drawn(scenario, policies=policies) for f in s.faults
                if isinstance(f["start"], dict)}
    assert {"step", "checkpoint_save", "detect"} <= anchors("baseline", "timeout")
    assert not anchors("baseline", "timeout") & {"breaker", "retry", "new_generation", "restore"}
    assert {"retry", "new_generation", "restore"} <= anchors("retry") and "breaker" not in anchors("retry")
    assert "breaker" in anchors("isolating") and "breaker" in anchors("retry", "isolating")


def _plan(tmp_path: Path, policy: str, faults: str = "{kind: kill, target: {rank: 1}, start: 1s}", expect: str = ""):
    return build_plan(load(tmp_path, RUNNER % "" + f"faults: [{faults}]\n" + expect), policy).trial


def test_a_fault_tolerant_policy_must_recover_or_fail_fast_and_never_diverge(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "retry")
    assert judge({"outcome": "recovered", "state": "consistent", "trajectory": "matches"}, plan).verdict == KEPT
    crashed = judge({"outcome": "crashed", "outcome_reason": "r0-r3 crashed (first r2, exit code 1)"}, plan)
    assert crashed.verdict == BROKEN and crashed.violations == ("outcome crashed: r0-r3 crashed (first r2, exit code 1)",)
    assert crashed.signature == "outcome crashed: rN-rN crashed (first rN, exit code 1)"
    # one torn checkpoint, read in three runs: the error's words differ, or were not caught
    for reason in ("r1-r3 crashed (first r3, crashed: negative seek value -307)",
                   "r0-r3 crashed (first r1, crashed: EOFError: Ran out of input (at byte 12))",
                   "r1-r2 crashed (first r2, crashed)"):
        assert judge({"outcome": "crashed", "outcome_reason": reason}, plan).signature == \
            "outcome crashed: rN-rN crashed (first rN, crashed)", reason
    diverged = judge({"outcome": "recovered", "state": "diverged", "state_detail": "step 12: r1 differs"}, plan)
    assert diverged.violations == ("state diverged: step 12: r1 differs",)
    assert judge({"outcome": "hung"}, plan).verdict == BROKEN
    # a kill never heals: the rank is gone for good, and retries without it may run out
    assert judge({"outcome": "retries-exhausted"}, plan).verdict == KEPT
    healing = _plan(tmp_path, "retry", "{kind: link_down, target: {rank: 1}, start: 1s, duration: 2s}")
    assert judge({"outcome": "retries-exhausted"}, healing).verdict == BROKEN
    assert judge({"outcome": "incomplete"}, plan).verdict == NOT_JUDGED
    assert judge({"outcome": "no-fault"}, plan).verdict == NOT_JUDGED  # its events never came


def test_a_fault_that_never_heals_excuses_exhausted_retries_and_baseline_may_hang(tmp_path: Path) -> None:
    forever = "{kind: link_down, target: {rank: 1}, start: 1s}"
    assert judge({"outcome": "retries-exhausted"}, _plan(tmp_path, "retry", forever)).verdict == KEPT
    assert judge({"outcome": "hung"}, _plan(tmp_path, "retry", forever)).verdict == BROKEN
    assert judge({"outcome": "hung", "state": "consistent"}, _plan(tmp_path, "baseline", forever)).verdict == KEPT


def test_a_scenario_s_expectation_is_the_oracle_where_it_sets_one(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "timeout", expect="expect: {timeout: {outcome: crashed}}\n")
    assert judge({"outcome": "crashed", "expect_ok": True}, plan).verdict == KEPT
    assert judge({"outcome": "no-fault", "expect_ok": False}, plan).verdict == NOT_JUDGED
    missed = judge({"outcome": "failed-fast", "expect_ok": False, "expect_failures": "outcome failed-fast, not crashed"},
                   plan)
    assert missed.violations == ("outcome failed-fast, not crashed",)


def test_drawn_schedules_are_judged_by_the_contract_not_the_scenario_s_own_expect_unless_asked(
        tmp_path: Path, capsys) -> None:
    """A shipped scenario's expect: (link_down.yaml: retry recovers within 40 s of its link
    down) is for its own faults: explore leaves it out, and says so, unless --expect."""
    from harness.studies.explore.command import judged_by, schedule_scenario
    scenario = load_scenario(REPO / "scenarios" / "link_down.yaml")
    [schedule] = itertools.islice(schedules(scenario, ExploreOptions(policies=("retry",))), 1)
    judged = judged_by(scenario, "link_down.yaml", own_expect=False)
    assert "expect" not in schedule_scenario(judged, schedule) and judged.policy("retry") == scenario.policy("retry")
    assert "link_down.yaml's expect: block is for its own faults" in capsys.readouterr().err
    assert schedule_scenario(judged_by(scenario, "link_down.yaml", own_expect=True), schedule)["expect"]["retry"]


def test_a_signature_stays_when_ranks_and_times_move() -> None:
    assert signature(("outcome crashed: r5 crashed at 3.2 s",)) == signature(("outcome crashed: r12 crashed at 0.4 s",))
    assert signature(("outcome retries-exhausted: 3 of 4 ranks exited",)) == "outcome retries-exhausted: N of N ranks exited"


def test_a_schedule_holds_one_storage_fault_at_most_and_the_loader_refuses_two_at_once(tmp_path: Path) -> None:
    for schedule in drawn(load(tmp_path, RUNNER % ""), kinds=("disk_full", "read_only", "kill")):
        assert sum(f["kind"] in ("disk_full", "read_only") for f in schedule.faults) <= 1
    two = RUNNER % "" + ("faults:\n  - {kind: disk_full, target: {rank: 2}, start: 1s, duration: 6s}\n"
                         "  - {kind: read_only, target: {rank: 0}, start: 3s, duration: 6s}\n")
    with pytest.raises(UsageError, match=r"s\.yaml:5: faults\.1: a read_only while faults\.0 \(disk_full\) still "
                                         "holds the checkpoint folder, which every rank shares"):
        load(tmp_path, two)


def test_no_schedule_waits_only_for_events_that_a_failure_brings(tmp_path: Path) -> None:
    """A lone fault on `detect` (or `retry`, `restore`, ...) would never be applied: an
    unplanted hour ran 7 such schedules for nothing (docs/explore.md)."""
    from harness.scenario.anchors import ANCHOR_EVENTS
    for schedule in drawn(load(tmp_path, RUNNER % ""), seed=1):
        assert any(not isinstance(f["start"], dict) or not ANCHOR_EVENTS[f["start"]["on"]].after_failure
                   for f in schedule.faults), schedule


def test_the_anchors_only_a_failure_brings_are_anchor_names() -> None:
    """The set is runfolder's (shrinking reads it without the harness): a name that is no
    anchor, misspelt or renamed, would let a candidate wait for an event nothing causes."""
    from harness.scenario.anchors import ANCHOR_EVENTS, ANCHOR_NAMES
    from runfolder.events import AFTER_FAILURE_ANCHORS
    assert AFTER_FAILURE_ANCHORS <= set(ANCHOR_NAMES)
    assert not ANCHOR_EVENTS["step"].after_failure and ANCHOR_EVENTS["detect"].after_failure


def test_shrinking_reads_every_time_explore_writes_as_the_scenario_loader_does(tmp_path: Path) -> None:
    """runfolder.shrinking.seconds against chaos.units.parse_duration: every start, delay and
    duration the generator draws and every candidate of those schedules writes; a time in
    another unit is refused, not misread."""
    from runfolder.shrinking import candidates, seconds
    times: list = [0, 2.5, "0s", "1e+06s"]
    for scenario in (load(tmp_path, RUNNER % "" + "hang_cap: 600s\n"), load(tmp_path, JOB % "")):
        for schedule in drawn(scenario, count=60, seed=5):
            for faults in (schedule.faults, *candidates(schedule.faults)):
                for f in faults:
                    start = f["start"]
                    times += [start["delay"]] if isinstance(start, dict) else [start]
                    times += [f["duration"]] if "duration" in f else []
    assert len(set(map(str, times))) > 20
    assert [seconds(t) for t in times] == [units.parse_duration(t) for t in times]
    for other in ("250ms", "2m", "1h", "-1s", "s", True):
        with pytest.raises(ValueError, match="not a time as explore writes one"):
            seconds(other)


def test_chaos_explore_dry_run_prints_the_first_schedules_and_the_least_time_per_trial(tmp_path: Path, capsys) -> None:
    from harness.cli import main
    (tmp_path / "s.yaml").write_text(RUNNER % ", backend: local")
    assert main(["explore", str(tmp_path / "s.yaml"), "--policy", "retry", "--seed", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "under retry, seed 2, kinds kill, pause, disk_full, read_only" in out and "at least 4 s" in out
    assert [line.split(":")[0].strip() for line in out.splitlines()[1:]] == ["1", "2", "3", "4", "5"]


@pytest.mark.parametrize("words, says", [
    (["--max-faults", "0"], "--max-faults 0: a schedule needs at least one fault; give 1 or more"),
    (["--budget", "5s"], "--budget 5s: shorter than one schedule's trials (3 x at least 4 s"),
    (["--kinds", "link_down"], "--kinds link_down: the local backend cannot inject it"),
    (["--kinds", "lnk"], "--kinds lnk: not a fault kind"),
    (["--policy", "elastic"], "--policy elastic: not in"),
    (["--repeats", "0"], "--repeats 0: each shrinking candidate runs at least once"),
])
def test_chaos_explore_refuses_bad_input_before_anything_runs(tmp_path: Path, capsys, words, says) -> None:
    from harness.cli import main
    (tmp_path / "s.yaml").write_text(RUNNER % ", backend: local")
    assert main(["explore", str(tmp_path / "s.yaml"), *words, "--out", str(tmp_path / "out")]) == 2
    assert says in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_shrinking_candidates_are_one_step_smaller_simplest_first() -> None:
    from runfolder.shrinking import candidates
    kill = {"kind": "kill", "target": {"ranks": [1, 3]}, "start": "2s"}
    pause = {"kind": "pause", "target": {"rank": 2}, "start": {"on": "retry", "nth": 2, "delay": "1s"},
             "duration": "3s"}
    assert list(candidates((kill, pause))) == [
        (pause,), (kill,),                                                       # a fault left out
        ({**kill, "target": {"rank": 1}}, pause), ({**kill, "target": {"rank": 3}}, pause),  # one rank
        (kill, {**pause, "duration": "1.5s"}),                                   # a shorter duration
        ({**kill, "start": "1s"}, pause),                                        # earlier in seconds
        (kill, {**pause, "start": {"on": "retry", "nth": 1, "delay": "0s"}}),   # the anchor's first event
    ]
    smallest = {"kind": "kill", "target": {"rank": 1}, "start": "0s"}
    assert list(candidates((smallest,))) == []


def test_shrinking_keeps_what_fails_in_more_than_half_its_runs_and_stops_when_time_is_up() -> None:
    from harness.studies.explore.shrink import shrink
    kill = {"kind": "kill", "target": {"ranks": [1, 3]}, "start": "2s"}
    pause = {"kind": "pause", "target": {"rank": 2}, "start": "1s", "duration": "4s"}
    runs: list[tuple] = []

    def fails(faults) -> bool:  # the failure needs the kill of rank 3; the pause is noise
        runs.append(faults)
        return any(f["kind"] == "kill" and 3 in f["target"].get("ranks", [f["target"].get("rank")]) for f in faults)
    shrunk = shrink((kill, pause), (1, 1), fails, repeats=3, time_left=lambda: True)
    assert shrunk.faults == ({"kind": "kill", "target": {"rank": 3}, "start": "0s"},)
    assert shrunk.reproduced == (2, 2) and not shrunk.out_of_time  # decided after 2 of 3 runs
    assert all(runs_of in (1, 2) for _, _, runs_of in shrunk.tried)  # a lost majority stops early too
    ticks = iter([True] * 4 + [False])  # 2 runs leave the pause out of it, 2 keep the kill alone
    cut = shrink((kill, pause), (1, 1), fails, repeats=3, time_left=lambda: next(ticks))
    assert cut.out_of_time and cut.faults == (kill,) and len(cut.tried) == 2


def test_shrinking_skips_unrun_a_candidate_whose_faults_wait_for_a_failure_none_is_left_to_cause() -> None:
    from harness.studies.explore.shrink import shrink
    pause = {"kind": "pause", "target": {"rank": 1}, "start": "3s", "duration": "3s"}
    on_restore = {"kind": "pause", "target": {"rank": 0}, "start": {"on": "restore", "nth": 1, "delay": "0s"},
                  "duration": "3s"}
    on_detect = {"kind": "kill", "target": {"rank": 2}, "start": {"on": "detect", "nth": 1, "delay": "0s"}}
    runs: list[tuple] = []

    def fails(faults) -> bool:  # only both pauses together fail (a retry count never reset)
        runs.append(faults)
        return [f["kind"] for f in faults] == ["pause", "pause"]
    shrunk = shrink((pause, on_restore, on_detect), (1, 1), fails, repeats=1, time_left=lambda: True)
    assert [f["start"] for f in shrunk.faults] == ["0s", {"on": "restore", "nth": 1, "delay": "0s"}]
    # without the pause at 3 s nothing fails first: no restore, no detection; never run
    assert (on_restore, on_detect) not in runs and (on_restore,) not in runs
    assert [faults for faults, _ in shrunk.skipped][:2] == [(on_restore, on_detect), (on_restore,)]
    assert all(len(faults) == 1 or faults[1] is on_detect for faults, _ in shrunk.skipped)  # the pause left out
    assert "wait for restore, detect, which only a failure brings" in shrunk.skipped[0][1]
    assert len(runs) == len(shrunk.tried)


def test_a_weights_file_steers_the_draw_and_a_bad_one_is_refused_naming_its_line(tmp_path: Path, capsys) -> None:
    from harness.cli import main
    (tmp_path / "s.yaml").write_text(RUNNER % ", backend: local")
    (tmp_path / "w.yaml").write_text("kinds: {pause: 1}\non_event: 0\n")
    assert main(["explore", str(tmp_path / "s.yaml"), "--weights", str(tmp_path / "w.yaml"), "--dry-run"]) == 0
    shown = capsys.readouterr().out.splitlines()[1:]
    assert shown and all('"kind": "pause"' in line and '"on"' not in line for line in shown)
    (tmp_path / "w.yaml").write_text("kinds: {pause: 1}\non_event: 2\n")
    assert main(["explore", str(tmp_path / "s.yaml"), "--weights", str(tmp_path / "w.yaml"), "--dry-run"]) == 2
    assert f"{tmp_path / 'w.yaml'}:2: on_event: Input should be less than or equal to 1" in capsys.readouterr().err
    (tmp_path / "w.yaml").write_text("kinds: {kil: 1}\n")
    assert main(["explore", str(tmp_path / "s.yaml"), "--weights", str(tmp_path / "w.yaml"), "--dry-run"]) == 2
    assert "kil: neither a fault kind nor an event" in capsys.readouterr().err


def test_a_found_file_counts_its_reruns_by_outcome_not_by_the_signature_its_expect_block_changes(
        tmp_path: Path) -> None:
    from harness.studies.explore.command import Judged, _reproduce, _write_found, reproduces
    from harness.studies.explore.generator import Schedule
    from reports.expect import check_expectations
    from reports.oracle import TOLERANT_ENDS
    scenario = load(tmp_path, RUNNER % "")
    row = {"outcome": "crashed", "outcome_reason": "r1-r3 crashed (first r2, exit code 1)", "state": "consistent"}
    drawn = Judged("retry", "crashed", judge(row, _plan(tmp_path, "retry")), "r2: OSError: [Errno 22] Invalid argument")
    schedule = Schedule(1, ({"kind": "kill", "target": {"rank": 1}, "start": "1s"},))
    written = _write_found(tmp_path, 1, scenario, schedule, None, drawn, TOLERANT_ENDS)
    assert "# reproduced: not yet rerun" in written.read_text()
    found_plan = build_plan(load_scenario(written), "retry").trial  # judged by the expect: block written in it
    outcomes = iter(["crashed", "hung", "crashed", "crashed"])

    def run(path: Path, policies: list[str]) -> list[Judged]:  # a `chaos run` of the found file
        assert path == written and policies == ["retry"]
        again = {**row, "outcome": next(outcomes)}
        failures = check_expectations(again, found_plan.expect)
        again.update(expect_ok=not failures, expect_failures="; ".join(failures))
        return [Judged("retry", again["outcome"], judge(again, found_plan), "")]
    reruns = _reproduce(run, written, "retry", 3, lambda: True)
    assert [(j.outcome, j.verdict.verdict) for j in reruns] == [("crashed", BROKEN), ("hung", BROKEN),
                                                                ("crashed", BROKEN)]
    assert reruns[0].verdict.signature != drawn.verdict.signature  # the same failure, in the expect: block's words
    assert [reproduces([j], drawn) for j in reruns] == [True, False, True]
    _write_found(tmp_path, 1, scenario, schedule, None, drawn, TOLERANT_ENDS, reruns)
    header = written.read_text()
    assert ("# reproduced: this file broke retry's expect: with outcome crashed in 2 of 3 runs of it "
            "(outcomes crashed, hung, crashed)") in header
    assert "# why (schedule 001 as drawn; the last error lines of the rank that died first): r2: OSError" in header
    assert _reproduce(run, written, "retry", 3, lambda: False) == []  # the budget ended: not rerun, and it says so


TORCHRUN_LOG = """\
[rank3]: RuntimeError: [/__w/pytorch/third_party/gloo/transport/tcp/pair.cc:553] Connection closed by peer \
[127.0.0.1]:16308. This is typically caused by a remote worker crashing.
Traceback (most recent call last):
  File "/x/save_in_place.py", line 40, in <module>
    state = torch.load(path)
[rank2]: RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory. This is \
an internal miniz error.
W1206 06:35:58.1 torch/distributed/elastic/agent/server/api.py:719] [default] Worker group failed
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
Root Cause (first observed failure):
  exitcode  : 1 (pid: 1749)
"""


def test_a_crash_s_cause_is_the_last_error_lines_of_the_log_of_the_rank_that_died_first(tmp_path: Path) -> None:
    from reports.last_error import crash_cause, last_errors
    assert last_errors(TORCHRUN_LOG.splitlines()) == [
        "[rank2] RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory",
        "ChildFailedError"]
    runner = ["Traceback (most recent call last):", '  File "torch/serialization.py", line 807, in __init__',
              "OSError: [Errno 22] Invalid argument"]
    assert last_errors(runner) == ["OSError: [Errno 22] Invalid argument"]
    assert last_errors(["step 3 loss 0.5", "Root Cause (first observed failure):"]) == []
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "r001.log").write_text("\n".join(runner))
    (tmp_path / "logs" / "r003.log").write_text(TORCHRUN_LOG)
    (tmp_path / "logs" / "r000.log").write_text("step 1\n")
    assert crash_cause(tmp_path, [3, 1]) == ("r3: [rank2] RuntimeError: PytorchStreamReader failed reading zip "
                                             "archive: failed finding central directory; then ChildFailedError")
    assert crash_cause(tmp_path, [0, 2, 1]).startswith("r1: OSError")  # r0's log has no error line, r2 none
    assert crash_cause(tmp_path, [0]) == ""


def test_a_resumed_folder_shrinks_first_what_its_last_session_found_and_did_not_finish() -> None:
    """tried.jsonl after a session stopped mid-shrink: drawn 004 broke (two trials of one
    signature), candidates 004-s1.. ran, no found file; 006 broke with a signature already
    found. Only 004's first trial is taken up again."""
    from runfolder.explore import unfinished
    row = {"faults": [], "outcome": "hung", "violations": ["outcome hung"], "cause": ""}
    tried = [{**row, "schedule": "003", "policy": "timeout", "verdict": "kept", "signature": ""},
             {**row, "schedule": "004", "policy": "timeout", "verdict": "broken", "signature": "A"},
             {**row, "schedule": "004", "policy": "retry", "verdict": "broken", "signature": "A"},
             {**row, "schedule": "004-s1", "policy": "timeout", "verdict": "broken", "signature": "A"},
             {**row, "schedule": "found-01", "policy": "timeout", "verdict": "broken", "signature": "B"},
             {**row, "schedule": "006", "policy": "timeout", "verdict": "broken", "signature": "B"}]
    assert [(r["schedule"], r["policy"]) for r in unfinished(tried, {"B"})] == [("004", "timeout")]
    assert unfinished(tried, {"A", "B"}) == []
