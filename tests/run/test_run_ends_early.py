"""`chaos run` ended early in trial 2 of 3 (an error, SIGINT, SIGTERM: a CI job's or a
scheduler's deadline): trial 1 keeps its report and the table prints, trial 2 marked as not
finished with what stopped it, trial 3 as never begun; the exit is still the one for what
ended the run. The `chaos` command line in this process, its trials on the fake cluster
(harness.cluster.fake) on a fake clock: no root, no processes, under a second a trial."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pandas as pd
import pytest

from chaos.errors import HarnessError
from harness import cli, signals
from harness.cluster import backends
from harness.cluster.fake import FakeBackend, FakeClock
from harness.cluster.launcher import LauncherPool
from harness.trial import orchestrator, scenario_run
from runfolder.layout import METRICS_FILE, REPORT_MARKDOWN

SCENARIO = """\
cluster: {ranks: 2}
workload: {step_period: 250ms}
warmup_steps: 2
settle_steps: 2
hang_cap: 5s
faults:
  - {kind: pause, target: {rank: 1}, start: 500ms, duration: 1s}
policies:
  first: {base: timeout, timeout: 5s}
  second: {base: timeout, timeout: 5s}
  third: {base: timeout, timeout: 5s}
"""


@pytest.fixture(autouse=True)
def signals_as_they_were(monkeypatch):
    """`chaos` installs its handlers and keeps the stop it was asked for: the next test
    gets pytest's handlers and no pending stop back."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    monkeypatch.setattr(signals, "_requested", None)
    monkeypatch.setattr(signals, "_installed_by", None)
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def stop_second(how: str):
    """A fake backend whose second bring-up ends the run `how`."""
    class Stopping(FakeBackend):
        def up(self, spec, ledger, launchers):
            if len(self.clusters) == 1:
                if how == "error":
                    raise HarnessError("bring-up failed: no space left on device (planted)")
                os.kill(os.getpid(), signal.SIGINT if how == "sigint" else signal.SIGTERM)
            return super().up(spec, ledger, launchers)
    return Stopping


def run_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> tuple[int, Path]:
    clock = FakeClock()
    return run_on(tmp_path, monkeypatch, clock, stop_second(how)(clock))


def run_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: FakeClock, backend: FakeBackend) -> tuple[int, Path]:

    class FakeTrial(orchestrator.Trial):  # every trial on the fake cluster's clock and injector
        def __init__(self, plan, trial_dir, backend_, progress, **kwargs):
            super().__init__(plan, trial_dir, backend_, progress, make_injector=backend_.injector,
                             clock=clock, sleep=clock.sleep, state_dir=tmp_path / "state", **kwargs)
    monkeypatch.setattr(scenario_run, "Trial", FakeTrial)  # the trials a scenario's run makes
    monkeypatch.setattr(backends, "backend_named", lambda name: backend)
    monkeypatch.setattr(LauncherPool, "start_ahead", lambda self: None)  # no launcher: no process to start
    path = tmp_path / "scenario.yaml"
    path.write_text(SCENARIO)
    code = cli.main(["run", str(path), "--backend", "local", "--out", str(tmp_path / "runs"), "--quiet"])
    [run_dir] = (tmp_path / "runs").iterdir()
    return code, run_dir


@pytest.mark.parametrize("how, code, said, stopped_by", [
    ("error", 1, "chaos: failed: bring-up failed", "bring-up failed: no space left on device (planted)"),
    ("sigint", 130, "chaos: interrupted", "interrupted (SIGINT)"),
    ("sigterm", 130, "chaos: interrupted", "received SIGTERM"),
])
def test_a_run_ended_in_trial_2_of_3_reports_trial_1_and_marks_the_others(tmp_path, monkeypatch, capsys, how, code,
                                                                          said, stopped_by) -> None:
    exit_code, run_dir = run_stopped(tmp_path, monkeypatch, how)
    out, err = capsys.readouterr()
    assert exit_code == code and said in err
    assert "| first | pause on r1 for 1.0 s | r1 pause" in out  # the table printed
    assert f"INCOMPLETE: trial second: the harness stopped the trial: {stopped_by} (" in out
    assert "INCOMPLETE: never began: third" in out
    report = (run_dir / REPORT_MARKDOWN).read_text()
    assert f"INCOMPLETE: trial second: the harness stopped the trial: {stopped_by}" in report
    metrics = pd.read_csv(run_dir / METRICS_FILE)
    assert list(metrics["trial"]) == ["first", "second"]
    assert list(metrics["outcome"]) == ["absorbed", "incomplete"]


def test_a_run_whose_first_trial_is_refused_prints_the_refusal_not_a_table(tmp_path, monkeypatch, capsys) -> None:
    # a fault a host does not allow (a Slurm node's agent without CAP_NET_ADMIN), learnt at bring-up
    clock = FakeClock()
    backend = FakeBackend(clock, refused={("pause", 1): "node n1 does not allow it: planted"})
    exit_code, run_dir = run_on(tmp_path, monkeypatch, clock, backend)
    out, err = capsys.readouterr()
    assert exit_code == 2 and "chaos: error: faults[0] (pause" in err and "node n1 does not allow it" in err
    assert "| first |" not in out and "INCOMPLETE" not in out and f"run folder: {run_dir} (no trial finished)" in err
    assert list(pd.read_csv(run_dir / METRICS_FILE)["outcome"]) == ["incomplete"]
