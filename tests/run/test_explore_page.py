"""`chaos explore`'s progress line against its budget (harness.studies.explore.progress), and
the page of everything tried (reports.explore), built from an explore folder's files
(runfolder.explore) without running a trial."""
from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest

from chaos.errors import UsageError
from harness.cli import main
from harness.studies.explore.command import Judged, _budget_s, _resumed, _write_found
from harness.studies.explore.generator import Schedule
from harness.studies.explore.progress import ExploreProgress
from harness.scenario.scenario import load_scenario
from harness.studies.explore.shrink import Shrunk, shrink
from harness.trial.progress import Progress, duration_text
from reports.explore import page, shrink_steps
from reports.oracle import BROKEN, KEPT, TOLERANT_ENDS, Verdict
from runfolder.explore import RECORD_FORMAT, read_record, write_record
from runfolder.info import RunFolderError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_eta_is_the_runs_that_still_fit_in_the_budget_times_the_mean_run() -> None:
    clock, out = Clock(), io.StringIO()
    progress = ExploreProgress(Progress(stream=out), budget_s=100, clock=clock, first_run_s=10, schedules=4)
    assert progress.eta_s() is None and progress.fits()  # no run yet: the estimate decides, the ETA is unknown
    clock.now += 50
    progress.runs_s += [20, 30]
    mean = 25
    assert progress.eta_s() == (100 - 50) // mean * mean and progress.fits()
    progress.found = 1
    progress.show("drawing: schedule 005")
    assert out.getvalue() == (f"[explore] elapsed {duration_text(50)} of {duration_text(100)}  4 schedules  1 found  "
                              f"ETA {duration_text(50)}  drawing: schedule 005\n")
    clock.now += 30  # 20 s left: the next 25 s run would pass the budget
    assert progress.eta_s() == 0 and not progress.fits()
    quiet = io.StringIO()
    ExploreProgress(Progress(quiet=True, stream=quiet), 100, clock, 10).show("x")
    assert quiet.getvalue() == ""


DRAWN = ({"kind": "kill", "target": {"ranks": [1, 2]}, "start": "1.2s"},
         {"kind": "pause", "target": {"rank": 0}, "start": {"on": "detect", "nth": 2, "delay": "0.5s"},
          "duration": "4s"})


@pytest.mark.parametrize("repeats", [1, 3])
def test_the_page_replays_shrinking_as_shrink_walked_it(repeats: int) -> None:
    """Shrinking with a deterministic failure (a kill of rank 2 is what fails), its runs
    recorded as tried.jsonl records them: the replay finds the same candidates kept, dropped
    and skipped as shrink did."""
    runs = []

    def fails(faults: tuple) -> bool:
        failed = any(f["kind"] == "kill" and 2 in f["target"].get("ranks", [f["target"].get("rank")])
                     for f in faults)
        runs.append({"faults": json.loads(json.dumps(faults)), "signature": "outcome crashed" if failed else ""})
        return failed

    shrunk: Shrunk = shrink(DRAWN, (1, 1), fails, repeats, lambda: True)
    steps = shrink_steps(list(DRAWN), runs, "outcome crashed", repeats)
    assert [(s.faults, s.failed, s.runs) for s in steps if s.result in ("kept", "dropped")] == shrunk.tried
    assert [s.faults for s in steps if s.result == "kept"][-1] == shrunk.faults
    assert [(s.faults, s.why) for s in steps if s.result == "skipped"] == shrunk.skipped
    cut = runs[:-1]  # interrupted before the last run: the walk stops there, undecided or not run
    assert shrink_steps(list(DRAWN), cut, "outcome crashed", repeats)[-1].result in ("undecided", "not run")


def _explore_folder(tmp_path: Path, end: str | None) -> Path:
    """An explore folder as chaos explore writes one: explore.json, tried.jsonl (schedule 001
    kept, 002 broke and shrank by one candidate, found-01 rerun twice) and found-01.yaml."""
    (tmp_path / "s.yaml").write_text("cluster: {ranks: 4}\npolicies: {retry: {timeout: 2s, max_retries: 3}}\n")
    scenario = load_scenario(tmp_path / "s.yaml")
    folder = tmp_path / "explore-s"
    folder.mkdir()
    write_record(folder, {"format": RECORD_FORMAT, "command": "chaos explore s.yaml --budget 90s", "scenario": "s.yaml",
                          "name": "s", "seed": 1, "budget_s": 90.0, "max_faults": 2, "kinds": [],
                          "policies": ["retry"], "weights": None, "repeats": 1, "shrink": True, "backend": "local",
                          "sessions": [{"began": "t", "budget_s": 90.0, "elapsed_s": 61.0, "end": end}]})
    lines = [("001", [DRAWN[1]], "absorbed", KEPT, ""), ("002", list(DRAWN), "crashed", BROKEN, "outcome crashed"),
             ("002-s1", [DRAWN[0]], "crashed", BROKEN, "outcome crashed"),
             ("found-01", [DRAWN[0]], "crashed", BROKEN, "outcome: expected absorbed, measured crashed"),
             ("found-01", [DRAWN[0]], "absorbed", KEPT, "")]
    (folder / "tried.jsonl").write_text("".join(json.dumps(
        {"schedule": s, "faults": f, "policy": "retry", "outcome": o, "verdict": v, "signature": sig,
         "cause": "r1: OSError: boom" if o == "crashed" else "", "seconds": 12.5}) + "\n"
        for s, f, o, v, sig in lines))
    found = Judged("retry", "crashed", Verdict(BROKEN, ("outcome crashed",), "outcome crashed"), "r1: OSError: boom")
    shrunk = Shrunk((DRAWN[0],), (1, 1), tried=[((DRAWN[0],), 1, 1)])
    _write_found(folder, 1, scenario, Schedule(2, DRAWN), shrunk, found, TOLERANT_ENDS)
    return folder


def test_the_page_lists_every_schedule_and_each_finding_with_its_shrinking_and_reruns(tmp_path: Path) -> None:
    text = page(_explore_folder(tmp_path, end="budget"))
    assert "PARTIAL" not in text and "61 s used of 90 s budget" in text
    assert "| 001 | pause r0 on detect#2+0.5s for 4s | retry | absorbed | kept |  |" in text
    assert "| 002 | kill r1,r2 at 1.2s; pause r0 on detect#2+0.5s for 4s | retry | crashed | broken | S1 |" in text
    assert "- S1: outcome crashed -> found-01.yaml" in text
    assert "- why: r1: OSError: boom" in text
    assert "  - kept: kill r1,r2 at 1.2s (1 of 1 runs failed alike)" in text
    assert "- shrinking: 2 -> 1 fault(s); 1 kept, 0 dropped" in text
    assert "- reproduced: 1 of 2 runs of the file broke retry's expect: with outcome crashed" in text
    assert "- run it again: `chaos run " in text


def test_an_interrupted_explore_is_rebuilt_by_report_and_said_partial(tmp_path: Path, capsys) -> None:
    folder = _explore_folder(tmp_path, end=None)
    assert main(["explore", "--report", str(folder)]) == 0
    text = (folder / "explore.md").read_text()
    assert text.startswith("# chaos explore: s (PARTIAL)") and "no end recorded" in text
    record = read_record(folder)
    record["sessions"].append({**record["sessions"][0], "end": "budget"})  # a --resume that ran to its budget
    write_record(folder, record)
    text = page(folder)
    assert "PARTIAL" not in text and "no end recorded (killed, or still running): resumed by session 2" in text


def test_resume_and_report_refuse_what_they_cannot_take(tmp_path: Path, capsys) -> None:
    with pytest.raises(RunFolderError, match="no explore.json: not an explore folder"):
        read_record(tmp_path)
    for command in ("--resume", "--report"):  # the command says it as a usage error, in the same words
        assert main(["explore", command, str(tmp_path)]) == 2
        assert capsys.readouterr().err == (f"chaos: error: {tmp_path}: no explore.json: not an explore folder, or "
                                           f"one written before explore recorded its settings; give a folder that "
                                           f"`chaos explore` wrote (OUT/explore-<scenario>-<time>)\n")
    record = json.loads((_explore_folder(tmp_path, end="interrupted") / "explore.json").read_text())
    given = argparse.Namespace(scenario=None, resume="F", policy=None, kinds=None, max_faults=3, weights=None,
                               seed=7, backend=None, repeats=3, no_shrink=False, dry_run=False, expect=False)
    with pytest.raises(UsageError, match="--seed is the folder's own"):
        _resumed(given, record)
    resumed = _resumed(argparse.Namespace(**{**vars(given), "seed": 0}), record)
    assert (resumed.seed, resumed.max_faults, resumed.repeats, resumed.policy) == (1, 2, 1, ["retry"])
    used = record["sessions"][0]["elapsed_s"]
    assert _budget_s(argparse.Namespace(budget=None), record) == record["budget_s"] - used  # what the first left
    assert _budget_s(argparse.Namespace(budget="2m"), record) == 120
    assert main(["explore", "s.yaml", "--report", str(tmp_path)]) == 2
