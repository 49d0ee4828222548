"""`chaos collect k8s`: a trial read from a cluster's pods, logs and chaos records becomes a
run folder whose report is the one a local run of the same events gives."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd
import pytest

import reports
from chaos.errors import DeadlineExceeded, HarnessError, UsageError
from harness.k8s import cli
from harness.k8s.collect import clock_note, collect
from runfolder import events as kinds
from runfolder.events import EVENTS_FILE, schema_problems
from runfolder.info import read_run_info, read_trial_info
from runfolder.layout import trial_dirs
from tests.k8s.admission import schema_problems as crd_problems
from tests.k8s.cluster_fakes import WALL_AT_ZERO, LocalTrial

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "scenarios"


def kill_rank_timeout() -> LocalTrial:
    """SIGKILL on rank 5 at 105 s: its neighbours see the closed socket at once, the others time
    out 5 s later; every survivor exits failed-fast."""
    trial = LocalTrial(SCENARIOS / "kill_rank.yaml", "timeout")
    trial.start(100.0)
    trial.steps(101.0, 105.0)
    trial.harness(103.8, kinds.WARMUP_DONE, step=11)
    trial.fault(0, applied=105.0)
    trial.harness(106.0, kinds.RANK_EXITED, rank=5, pid=205, exitcode=None, signal=9)
    trial.leave([4, 6], 105.05, "closed", reaped=106.0)
    trial.leave([r for r in range(16) if r not in (4, 5, 6)], 110.1, "timeout", reaped=111.0)
    trial.harness(111.0, kinds.TRIAL_END, reason="all-exited")
    return trial


def link_down_baseline() -> LocalTrial:
    """Rank 5's link down at 105 s under a 6 h timeout: no rank moves again; hung at the 20 s cap.
    The harness then tears down (the revert and the ranks' exits come after the end)."""
    trial = LocalTrial(SCENARIOS / "link_down.yaml", "baseline", api="pytorchjob")
    trial.start(100.0)
    trial.steps(101.0, 105.0)
    trial.harness(103.8, kinds.WARMUP_DONE, step=11)
    trial.fault(0, applied=105.0)
    trial.harness(124.765, kinds.HANG_DETECTED, cap=20.0, idle_since=104.765)
    trial.harness(124.765, kinds.TRIAL_END, reason="hung")
    trial.harness(124.9, kinds.FAULT_REVERTED, index=0, fault_kind="link_down", targets=[5], teardown=True)
    for r in range(16):
        trial.rank(r, 125.0, kinds.EXIT, reason="terminated", code=0)
    return trial


def link_flap_timeout() -> LocalTrial:
    """Three 2 s outages of rank 5's link; the ring stalls through each and goes on: absorbed.
    It settles 8 steps after the last heal."""
    trial = LocalTrial(SCENARIOS / "link_flap.yaml", "timeout")
    trial.start(100.0)
    trial.steps(101.0, 105.0)
    trial.harness(103.8, kinds.WARMUP_DONE, step=11)
    for on in (105.0, 111.0, 117.0):
        trial.fault(0, applied=on, reverted=on + 2.0)
        trial.steps(on + 2.5, on + 6.0 if on < 117.0 else 121.5)
    trial.harness(121.265, kinds.TRIAL_END, reason="settled")
    return trial


TRIALS = {"kill_rank": (kill_rank_timeout, "failed-fast"), "link_down": (link_down_baseline, "hung"),
          "link_flap": (link_flap_timeout, "absorbed")}
LATE = 300.0  # local seconds: the collector reads the cluster well after the trial ended


def _collect(trial: LocalTrial, run_dir: Path, now: float = LATE, timeout_s: float = 60.0) -> list[str]:
    said: list[str] = []
    collect(trial.cluster(now), trial.export.job, "default", run_dir, timeout_s, said.append, "chaos collect k8s",
            clock=lambda: WALL_AT_ZERO + now, sleep=lambda s: None)
    return said


def _wall_anchor(run_dir: Path) -> float:
    info = read_trial_info(trial_dirs(run_dir)[0])
    return info.wall_anchor - info.mono_anchor


@pytest.mark.parametrize("name", TRIALS)
def test_the_collected_run_reports_as_the_local_run_of_the_same_events(name, tmp_path):
    build, outcome = TRIALS[name]
    trial = build()
    local = reports.analyze_run(trial.write_local(tmp_path / "local"))
    _collect(trial, tmp_path / "k8s")
    collected = reports.analyze_run(tmp_path / "k8s")
    assert list(collected.columns) == list(local.columns)
    assert collected.loc[0, "outcome"] == local.loc[0, "outcome"] == outcome
    # where and as what it ran differ; the fault's start is the same wall-clock moment
    local.loc[0, "fault_start_t"] += _wall_anchor(tmp_path / "local")
    collected.loc[0, "fault_start_t"] += _wall_anchor(tmp_path / "k8s")
    for column in local.columns.drop(["run", "backend", "run_id"]):
        a, b = local.loc[0, column], collected.loc[0, column]
        if isinstance(a, float) and isinstance(b, float):
            assert (math.isnan(a) and math.isnan(b)) or abs(a - b) < 1e-3, (column, a, b)
        else:
            assert (pd.isna(a) and pd.isna(b)) or a == b, (column, a, b)
    assert reports.format_table(collected) == reports.format_table(local)


def test_the_run_folder_says_which_figures_cross_clock_domains(tmp_path):
    _collect(kill_rank_timeout(), tmp_path / "run")
    info = read_run_info(tmp_path / "run")
    assert info.backend == "kubernetes (trainjob)" and info.policies == ("timeout",)
    assert "node-a: ranks 0-7; node-b: ranks 8-15" in info.clock
    assert "spread of detection over ranks (first, median, last)" in info.clock
    assert "crosses node clocks" in info.clock
    assert "Chaos Mesh controller's clock in whole seconds" in info.clock
    report = reports.write_reports(tmp_path / "run")
    assert info.clock in report["report.md"].read_text()


def test_collected_events_follow_the_event_schema_and_drop_what_came_after_the_end(tmp_path):
    _collect(link_down_baseline(), tmp_path / "run")
    lines = (tmp_path / "run" / "trials" / "baseline" / EVENTS_FILE).read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert [p for e in events for p in schema_problems(e)] == []
    end = next(e for e in events if e["kind"] == kinds.TRIAL_END)
    assert end["reason"] == "hung" and max(e["t"] for e in events) == end["t"]
    hang = next(e for e in events if e["kind"] == kinds.HANG_DETECTED)
    assert (hang["cap"], round(hang["t"] - hang["idle_since"], 6)) == (20.0, 20.0)
    assert not [e for e in events if e["kind"] == kinds.FAULT_REVERTED]  # Chaos Mesh healed it after the end


def test_a_killed_rank_is_reaped_by_its_signal_and_fault_times_carry_the_objects(tmp_path):
    _collect(kill_rank_timeout(), tmp_path / "run")
    events = [json.loads(line) for line in (tmp_path / "run" / "trials" / "timeout" / EVENTS_FILE).open()]
    (killed,) = [e for e in events if e["kind"] == kinds.RANK_EXITED and e["rank"] == 5]
    assert (killed["signal"], killed["exitcode"]) == (9, None)
    (applied,) = [e for e in events if e["kind"] == kinds.FAULT_APPLIED]
    assert applied["mechanism"].startswith("Chaos Mesh: f0-on1-p0-") and applied["targets"] == [5]


def test_the_fixture_chaos_objects_are_what_the_crd_allows():
    for change in kill_rank_timeout().cluster(LATE).chaos_changes("kill-rank-timeout-faults"):
        assert crd_problems(change["object"]) == []


def test_it_follows_the_trial_and_says_when_to_apply_the_faults(tmp_path):
    trial = link_flap_timeout()
    view = trial.cluster(102.0)
    later = iter([104.5, 110.0, 119.5, LATE])  # the trial's clock at each next look at the cluster

    def sleep(seconds: float) -> None:
        view.now = next(later)

    said: list[str] = []
    collect(view, trial.export.job, "default", tmp_path / "run", 3600.0, said.append, "chaos collect k8s",
            clock=lambda: WALL_AT_ZERO + view.now, sleep=sleep)
    assert said[:4] == ["warm-up: 0 of 16 ranks made 12 steps",
                        "warm (12 steps on every rank): apply faults.yaml now",
                        "faults: 2 of 6 actions done",
                        "settling: waiting for 8 steps on every live rank after the last action"]
    assert said[4].startswith("over: settled; wrote ")
    assert reports.analyze_run(tmp_path / "run").loc[0, "outcome"] == "absorbed"


def test_it_gives_up_at_its_deadline_saying_where_the_trial_was(tmp_path):
    trial = link_flap_timeout()
    times = iter([0.0, 10.0, 20.0])
    slept: list[float] = []
    with pytest.raises(DeadlineExceeded, match=r"not over after 15 s \(warm-up: 0 of 16 ranks made 12 steps\)"):
        collect(trial.cluster(102.0), trial.export.job, "default", tmp_path / "run", 15.0, lambda s: None, "c",
                clock=lambda: next(times), sleep=slept.append)
    assert slept == [2.0]
    assert not (tmp_path / "run").exists()


def test_a_rank_that_exits_during_warm_up_ends_the_collection(tmp_path):
    trial = LocalTrial(SCENARIOS / "kill_rank.yaml", "timeout")
    trial.start(100.0)
    trial.steps(101.0, 102.0)
    trial.harness(103.0, kinds.RANK_EXITED, rank=3, pid=203, exitcode=70, signal=None)
    with pytest.raises(HarnessError, match=r"rank\(s\) \[3\] exited during warm-up"):
        _collect(trial, tmp_path / "run", now=104.0)


def test_a_job_that_was_never_exported_is_a_usage_error(tmp_path):
    trial = kill_rank_timeout()
    with pytest.raises(UsageError, match="--job other: no ConfigMap other-chaos-plan in namespace default"):
        collect(trial.cluster(LATE), "other", "default", tmp_path / "run", 1.0, print, "c")


def test_the_run_folder_must_be_new(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "something").write_text("")
    with pytest.raises(UsageError, match="--out .*exists and is not an empty folder"):
        _collect(kill_rank_timeout(), tmp_path / "run")


def test_collect_arguments(tmp_path):
    parser = argparse.ArgumentParser()
    cli.add_collect_arguments(parser)
    args = parser.parse_args(["--namespace", "ml", "--job", "kill-rank-timeout", "--out", str(tmp_path / "r"),
                              "--timeout", "10m"])
    assert (args.namespace, args.job, args.out, args.timeout) == ("ml", "kill-rank-timeout", tmp_path / "r", 600.0)


def test_without_the_kubernetes_client_collect_says_how_to_install_it(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_kubernetes(name, *args, **kwargs):
        if name == "kubernetes" or name.startswith("kubernetes."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_kubernetes)
    from harness.k8s.kube import Kubernetes
    with pytest.raises(UsageError, match="pip install kubernetes"):
        Kubernetes("default")


def test_ranks_on_one_node_compare_within_one_clock():
    note = clock_note({0: "gpu-1", 1: "gpu-1", 2: "gpu-1"})
    assert "(gpu-1: ranks 0-2)" in note and "crosses node clocks" not in note
    assert "gpu-1: ranks 0,2; gpu-2: ranks 1" in clock_note({0: "gpu-1", 1: "gpu-2", 2: "gpu-1"})
