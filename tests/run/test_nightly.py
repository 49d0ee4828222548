"""`chaos nightly`'s runner (harness.studies.nightly) against the fake cluster, on a fake clock: no
root, no namespaces. The plan expands into cells with distinct seeds per repeat; a night
interrupted mid-cell resumes where it stopped; the progress line counts trials and gives an
ETA; the finished night's history rows and files match the run folders it made."""
from __future__ import annotations

import datetime
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from chaos.errors import UsageError
from harness.cluster.fake import FakeBackend, FakeClock
import reports
from harness.studies.nightly import (MANIFEST, RUNS, Cell, NightProgress, expand, finish_night, load_night_plan,
                                 open_night, read_manifest, run_cells, seed_for)
from harness.studies.nightly.command import print_night
from harness.studies.nightly.plan import plan_digest
from harness.trial.orchestrator import Trial
from harness.trial.scenario_run import start_run
from harness.trial.plan import build_plan
from harness.trial.progress import Progress
from reports.nightly import append_night, night_report, read_history
from runfolder.info import read_run_info
from runfolder.layout import trial_dir
from tests.conftest import chaos_cli
from tests.reports.nightly.nightly_fakes import info, night, seed_history, usual_repeats

SCENARIO = """\
cluster: {{ranks: 4}}
workload: {{step_period: 250ms}}
warmup_steps: 4
settle_steps: 4
hang_cap: 10s
faults:
  - {{kind: {kind}, target: {{rank: 1}}, start: 1s, duration: 2s}}
policies: {{timeout: {{timeout: 5s}}, retry: {{timeout: 5s, max_retries: 2}}}}
expect: {{timeout: {{outcome: absorbed}}}}
"""
PLAN = """\
seed: 7
repeat: 3
runs:
  - scenario: scenarios/s_*.yaml        # s_flap and s_pause, every policy
  - scenario: other/long.yaml
    policies: [retry]
    repeat: 1
    ranks: 3
"""
NOW = datetime.datetime(2026, 11, 30, 2, 0, tzinfo=datetime.timezone.utc)


def night_plan(tmp_path: Path) -> Path:
    for folder, name, kind in (("scenarios", "s_flap", "link_down"), ("scenarios", "s_pause", "pause"),
                               ("other", "long", "link_down")):
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / f"{name}.yaml").write_text(SCENARIO.format(kind=kind))
    (tmp_path / "plan.yaml").write_text(PLAN)
    return tmp_path / "plan.yaml"


def metadata(night: str, started: str) -> dict[str, str]:
    return {"night": night, "started": started, "commit": "abc", "host": "fake", "kernel": "k", "torch": "t",
            "cuda": "", "gpu": "", "driver": "", "nccl": "", "backend": "fake"}


class FakeRunner:
    """Runs a cell's trials on the fake cluster, the way run_scenario does; `stop_at` raises
    KeyboardInterrupt in the middle of that cell (its run folder half made), as Ctrl-C would."""

    def __init__(self, tmp_path: Path, clock: FakeClock, stop_at: str | None = None) -> None:
        self.state = tmp_path / "state"
        self.clock = clock
        self.stop_at = stop_at
        self.ran: list[str] = []

    def __call__(self, cell: Cell, runs: Path) -> Path:
        backend = FakeBackend(self.clock)
        run_dir = start_run(runs, cell.scenario, cell.scenario_file, list(cell.policies), backend.name, cell.command)
        for policy in cell.policies:
            if cell.key == self.stop_at:
                raise KeyboardInterrupt
            Trial(build_plan(cell.scenario, policy), trial_dir(run_dir, policy), backend, Progress(quiet=True),
                  make_injector=backend.injector, clock=self.clock, sleep=self.clock.sleep,
                  state_dir=self.state).run()
        self.ran.append(cell.key)
        return run_dir


def test_the_plan_expands_repeat_by_repeat_with_a_distinct_seed_per_repeat(tmp_path: Path) -> None:
    path = night_plan(tmp_path)
    cells = expand(load_night_plan(path), path)
    assert [(c.key, c.policies) for c in cells] == [
        ("s_flap/0/timeout+retry", ("timeout", "retry")), ("s_pause/0/timeout+retry", ("timeout", "retry")),
        ("long/0/retry", ("retry",)),
        ("s_flap/1/timeout+retry", ("timeout", "retry")), ("s_pause/1/timeout+retry", ("timeout", "retry")),
        ("s_flap/2/timeout+retry", ("timeout", "retry")), ("s_pause/2/timeout+retry", ("timeout", "retry"))]
    flap_seeds = [c.scenario.seed for c in cells if c.scenario.name == "s_flap"]
    assert len(set(flap_seeds)) == 3
    assert flap_seeds == [seed_for(7, "s_flap", r) for r in range(3)]
    assert flap_seeds != [seed_for(8, "s_flap", r) for r in range(3)]  # the base seed moves them all
    long = next(c for c in cells if c.scenario.name == "long")
    assert long.scenario.cluster.ranks == 3
    assert long.command == (f"chaos run {tmp_path / 'other' / 'long.yaml'} --ranks 3 --backend netns "
                            f"--seed {long.scenario.seed}")
    # --repeat overrides the plan's, not an entry's own
    assert len(expand(load_night_plan(path, repeat=1), path)) == 3


def test_a_plan_with_a_problem_names_the_file_line_and_field(tmp_path: Path) -> None:
    path = night_plan(tmp_path)
    path.write_text(PLAN.replace("repeat: 1", "repeat: 0").replace("ranks: 3", "rank: 3"))
    with pytest.raises(UsageError) as error:
        load_night_plan(path)
    assert str(error.value).splitlines() == [
        f"{path}:7: runs.1.repeat: Input should be greater than or equal to 1 (got 0)",
        f"{path}:8: runs.1.rank: unknown field; remove it or check its spelling "
        "(docs/nightly.md lists the plan's fields)"]
    path.write_text(PLAN.replace("[retry]", "[retry, elastic]"))
    with pytest.raises(UsageError, match=rf"{path}:6: runs.1.policies: 'elastic' is not a policy of"):
        expand(load_night_plan(path), path)


def test_a_users_job_runs_by_its_variants(tmp_path: Path) -> None:
    byo = Path(__file__).resolve().parents[2] / "scenarios" / "byo_pause.yaml"
    path = tmp_path / "plan.yaml"
    path.write_text(f"seed: 1\nrepeat: 1\nruns:\n  - scenario: {byo}\n    policies: [timeout_5s]\n"
                    f"  - scenario: {byo}\n    policies: [default]\n    repeat: 2\n")
    cells = expand(load_night_plan(path), path)
    assert [(c.key, c.policies) for c in cells] == [
        ("byo_pause/0/timeout_5s", ("timeout_5s",)), ("byo_pause/0/default", ("default",)),
        ("byo_pause/1/default", ("default",))]
    path.write_text(f"seed: 1\nrepeat: 1\nruns:\n  - scenario: {byo}\n")  # every variant, no policy
    assert [c.policies for c in expand(load_night_plan(path), path)] == [("default", "timeout_5s")]
    path.write_text(f"seed: 1\nruns:\n  - scenario: {byo}\n    policies: [timeout]\n")
    with pytest.raises(UsageError, match=rf"{path}:4: runs.0.policies: 'timeout' is not a variant of the job in "
                                         rf"{byo} \(default, timeout_5s\); name one of those"):
        expand(load_night_plan(path), path)


def test_an_interrupted_night_resumes_where_it_stopped_and_ends_in_history_and_files(tmp_path: Path) -> None:
    path = night_plan(tmp_path)
    plan = load_night_plan(path, repeat=2)
    cells = expand(plan, path)
    digest = plan_digest(plan, cells)
    out, db, clock = tmp_path / "nights", tmp_path / "history.sqlite", FakeClock()
    night_dir, manifest = open_night(out, digest, path, None, metadata, NOW)
    first = FakeRunner(tmp_path, clock, stop_at="s_flap/1/timeout+retry")
    with pytest.raises(KeyboardInterrupt):
        run_cells(night_dir, manifest, cells, first, NightProgress(Progress(quiet=True), 9, 0, clock), clock)
    assert first.ran == ["s_flap/0/timeout+retry", "s_pause/0/timeout+retry", "long/0/retry"]
    stopped = read_manifest(night_dir)
    assert [d.key for d in stopped.done] == first.ran and not stopped.finished
    assert len(list((night_dir / RUNS).iterdir())) == 4  # three done and the half-made one

    later = NOW + datetime.timedelta(hours=1)  # the same plan again: the same night, resumed
    again_dir, resumed = open_night(out, digest, path, None, metadata, later)
    assert again_dir == night_dir and resumed == stopped
    assert sorted(p.name for p in (night_dir / RUNS).iterdir()) == sorted(Path(d.run).name for d in stopped.done)
    second = FakeRunner(tmp_path, clock)
    done = run_cells(night_dir, resumed, cells, second, NightProgress(Progress(quiet=True), 9, 5, clock), clock)
    assert second.ran == ["s_flap/1/timeout+retry", "s_pause/1/timeout+retry"]
    assert [d.key for d in done.done] == [c.key for c in cells]

    report = finish_night(night_dir, done, db, plan.seed)
    assert read_manifest(night_dir).finished
    with sqlite3.connect(db) as con:
        stored = sorted(con.execute("SELECT scenario, policy, repeat, seed, command FROM trials"))
        [night_row] = con.execute('SELECT night, started, "commit" FROM nights').fetchall()
    expected = sorted((c.scenario.name, p, c.repeat, c.scenario.seed, c.command) for c in cells for p in c.policies)
    assert stored == expected
    assert night_row == (done.night, NOW.isoformat(timespec="seconds"), "abc")
    assert {p.name for p in night_dir.iterdir()} >= {"junit.xml", "summary.md", "metrics.prom", "trends.html"}
    # the figures come from the stored events: the history's stall of each trial is analyze_run's
    for d in done.done:
        for _, row in reports.analyze_run(night_dir / d.run).iterrows():
            with sqlite3.connect(db) as con:
                [(value,)] = con.execute("SELECT value FROM metrics WHERE scenario=? AND policy=? AND repeat=? "
                                         "AND metric='max_stall_s'", (row["scenario"], row["policy"], d.repeat))
            assert value == pytest.approx(row["max_stall_s"])
            assert read_run_info(night_dir / d.run).seed == seed_for(plan.seed, row["scenario"], d.repeat)
    assert {(p.scenario, p.policy) for p in report.policies} == {(c.scenario.name, p) for c in cells
                                                                for p in c.policies}

    # a finished night is never resumed: the next invocation starts a new one
    new_dir, new = open_night(out, digest, path, None, metadata, later)
    assert new_dir != night_dir and new.done == ()
    assert json.loads((new_dir / MANIFEST).read_text())["info"]["started"] == later.isoformat(timespec="seconds")


def test_another_plan_does_not_resume_a_night_and_cannot_reuse_its_id(tmp_path: Path) -> None:
    path = night_plan(tmp_path)
    plan = load_night_plan(path)
    out = tmp_path / "nights"
    night_dir, _ = open_night(out, plan_digest(plan, expand(plan, path)), path, None, metadata, NOW)
    other = load_night_plan(path, repeat=1)
    other_digest = plan_digest(other, expand(other, path))
    later = NOW + datetime.timedelta(minutes=5)
    assert open_night(out, other_digest, path, None, metadata, later)[0] != night_dir
    with pytest.raises(UsageError, match="ran another plan"):
        open_night(out, other_digest, path, night_dir.name, metadata, later)


def test_the_progress_line_counts_trials_and_its_eta_comes_from_this_invocation_s_pace() -> None:
    clock = FakeClock(0.0)
    progress = NightProgress(Progress(quiet=True), total=12, done=4, clock=clock)  # 4 done before a resume
    assert progress.eta_s() is None
    assert progress.line("x") == "4/12 trials  elapsed 0s  ETA ?  x"
    clock.sleep(50.0)
    progress.done += 2
    assert progress.eta_s() == pytest.approx(25.0 * 6)
    assert progress.line("x") == "6/12 trials  elapsed 50s  ETA 2m30s  x"


def test_the_command_refuses_a_bad_plan_before_running_anything(tmp_path: Path) -> None:
    path = night_plan(tmp_path)
    path.write_text(PLAN.replace("seed: 7", "seed: seven"))
    done = chaos_cli("nightly", str(path), "--out", str(tmp_path / "nights"))
    assert done.returncode == 2
    assert done.stderr.startswith(f"chaos: error: {path}:1: seed: Input should be a valid integer")
    assert chaos_cli("nightly", "--quick", str(path)).stderr == "chaos: error: give a plan file or --quick, not both\n"
    assert not (tmp_path / "nights").exists()


@pytest.mark.parametrize("ttr, gate, status", [(16.0, True, 1), (16.0, False, 0), (12.0, True, 0)])
def test_the_gate_fails_the_command_only_when_asked_and_names_each_regression(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], ttr: float, gate: bool, status: int) -> None:
    db, rng = tmp_path / "history.sqlite", np.random.default_rng(5)
    seed_history(db, rng, nights=10)
    append_night(db, night(10, usual_repeats(rng, ttr=ttr)))
    report = night_report(read_history(db), info(10).night, rng)
    assert print_night(report, tmp_path, db, gate) == status
    out, err = capsys.readouterr()
    assert ("gate: FAILED" in out) == (ttr == 16.0)
    assert "| retry | packet loss -> backoff retry" in out  # the document's table
    regressions = [line for line in err.splitlines() if line.startswith("REGRESSION: ")]
    if status:
        [line] = regressions
        assert "loss_20pct / retry: time to recover from fault start got worse" in line
        assert "Reproduce: chaos run scenarios/loss_20pct.yaml --backend netns --policy retry --seed" in line
    else:
        assert regressions == []


def test_parallel_cells_run_at_once_and_each_is_recorded_when_it_ends(tmp_path: Path) -> None:
    """--parallel 2: two cells in flight together (a barrier only two at once pass), each
    written to the manifest as it ends; a stop in one cell reaches the command."""
    import threading
    path = night_plan(tmp_path)
    plan = load_night_plan(path)
    cells = expand(plan, path)[:4]
    out = tmp_path / "nights"
    out.mkdir()
    night_dir, manifest = open_night(out, plan_digest(plan, cells), path, None, metadata, NOW)
    together = threading.Barrier(2, timeout=10)
    ended: list[str] = []

    def run_cell(cell: Cell, runs: Path) -> Path:
        together.wait()  # breaks (BrokenBarrierError) unless a second cell runs meanwhile
        run_dir = runs / cell.key.replace("/", "-")
        run_dir.mkdir(parents=True)
        ended.append(cell.key)
        return run_dir
    clock = FakeClock(0.0)
    done = run_cells(night_dir, manifest, cells, run_cell, NightProgress(Progress(quiet=True), 8, 0, clock), clock,
                     parallel=2)
    assert sorted(d.key for d in done.done) == sorted(c.key for c in cells)
    assert [d.key for d in read_manifest(night_dir).done] == [d.key for d in done.done]

    def stopped(cell: Cell, runs: Path) -> Path:
        raise KeyboardInterrupt
    (tmp_path / "again").mkdir()
    fresh, manifest = open_night(tmp_path / "again", plan_digest(plan, cells), path, None, metadata, NOW)
    with pytest.raises(KeyboardInterrupt):
        run_cells(fresh, manifest, cells, stopped, NightProgress(Progress(quiet=True), 8, 0, clock), clock, parallel=2)
    assert read_manifest(fresh).done == ()


def test_parallel_needs_a_backend_that_gives_each_cell_its_own_hosts(tmp_path: Path) -> None:
    done = chaos_cli("nightly", "--quick", "--parallel", "2", "--out", str(tmp_path / "nights"))
    assert done.returncode == 2 and "--backend slurm" in done.stderr and "skew" in done.stderr, done.stderr
    assert not (tmp_path / "nights").exists()
