"""bench/detector.py --ranks: the tuned scenarios it writes, and how it splits a recovery
into phases (root-free)."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from harness.job.policies import DetectorSpec, PolicySpec
from harness.scenario.scenario import load_scenario

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def detector(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # the bench imports its neighbours by name
    return importlib.import_module("detector")


def test_a_tuning_reaches_the_detector_policies_only(detector, tmp_path):
    path = tmp_path / "bench_blackhole.yaml"
    path.write_text(detector.scenario_text("blackhole", ["elastic", "timeout"], detector.Tuning(0.6, 0.5, interval=0.2)))
    tuned = load_scenario(path)
    elastic = tuned.policy("elastic")
    assert (elastic.detector.suspect_after, elastic.detector.interval, elastic.exclude_after) == (0.6, 0.2, 0.5)
    assert tuned.policy("timeout").detector is None
    default = tmp_path / "default.yaml"
    default.write_text(detector.scenario_text("blackhole", ["elastic"]))
    elastic = load_scenario(default).policy("elastic")
    assert (elastic.detector, elastic.exclude_after) == (DetectorSpec(), PolicySpec.model_fields["exclude_after"].default)
    assert detector.Tuning().folder(16) == "ranks-16"
    assert detector.Tuning(0.4, None).folder(16) == "ranks-16-suspect-0.4s"
    assert detector.Tuning(None, 0.3).folder(64) == "ranks-64-exclude-0.3s"
    assert load_scenario(default).cluster.sysctls == {}


def test_the_previous_defaults_are_a_row_of_their_own(detector, tmp_path):
    path = tmp_path / "bench_control.yaml"
    path.write_text(detector.scenario_text("control", ["elastic"], detector.PREVIOUS_DEFAULTS))
    elastic = load_scenario(path).policy("elastic")
    assert (elastic.detector.interval, elastic.detector.suspect_after, elastic.exclude_after) == (0.1, 0.8, 1.0)
    assert detector.PREVIOUS_DEFAULTS.folder(16) == "ranks-16-suspect-0.8s-exclude-1s-beat-0.1s"


def test_an_arp_retransmission_time_reaches_every_host(detector, tmp_path):
    path = tmp_path / "bench_link_down.yaml"
    path.write_text(detector.scenario_text("link_down", ["elastic_rejoin"], detector.Tuning(arp_retrans=0.1)))
    assert load_scenario(path).cluster.sysctls == {"net.ipv4.neigh.eth0.retrans_time_ms": "100"}
    assert detector.Tuning(0.4, None, 0.1).folder(16) == "ranks-16-suspect-0.4s-arp-0.1s"


def test_gloo_connecting_on_first_use_reaches_the_workload(detector, tmp_path):
    path = tmp_path / "bench_blackhole.yaml"
    path.write_text(detector.scenario_text("blackhole", ["elastic"], detector.Tuning(gloo_lazy_init=True)))
    assert load_scenario(path).workload.gloo_lazy_init is True
    path.write_text(detector.scenario_text("blackhole", ["elastic"], detector.Tuning(gloo_lazy_init=False)))
    assert load_scenario(path).workload.gloo_lazy_init is False
    assert [detector.Tuning(gloo_lazy_init=lazy).folder(64) for lazy in (None, False, True)] == [
        "ranks-64", "ranks-64-gloo-mesh", "ranks-64-gloo-lazy"]


def event(t, kind, rank, **fields):
    return {"t": t, "kind": kind, "src": "rank", "rank": rank, **fields}


def test_each_phase_is_the_last_ranks_first_event_after_the_mark(detector):
    events = [
        event(9.0, "step", 0), event(9.5, "suspect", 0),           # before the fault: not counted
        event(10.3, "suspect", 0), event(10.4, "suspect", 1), event(10.9, "suspect", 0),
        event(11.3, "exclude", 0), event(11.35, "exclude", 1),
        event(11.36, "step", 1),                                   # a step before its new group: not counted
        event(11.4, "group_ready", 0), event(11.45, "group_ready", 1),
        event(11.5, "step", 0), event(11.55, "step", 1), event(11.8, "step", 1),
    ]
    phases = (("suspect", "suspect"), ("exclude", "left out"), ("group_ready", "group"),
              ("restored", "restored"), ("step", "stepping"))
    assert detector.phase_times(events, 10.0, phases) == [
        "suspect 0.40", "left out 1.35", "group 1.45", "restored not observed", "stepping 1.55"]


def test_released_after_a_heal_counts_the_members_not_the_rank_let_back_in(detector):
    """The rank let back in released its group when its breaker opened; its next release is
    when the trial ends, which is no phase of the heal."""
    events = [
        event(10.2, "rejoin_request", 2), event(10.3, "admit", 0, peers=[2], gen=2),
        event(10.6, "group_released", 0), event(10.7, "group_released", 1),
        event(10.9, "group_ready", 0), event(10.9, "group_ready", 1), event(10.95, "group_ready", 2),
        event(20.0, "group_released", 2), event(20.0, "group_released", 0),  # the trial's end
    ]
    phases = (("rejoin_request", "asks back"), ("admit", "admitted"), ("group_released", "released"),
              ("group_ready", "group"))
    assert detector.phase_times(events, 10.0, phases) == [
        "asks back 0.20", "admitted 0.30", "released 0.70", "group 0.95"]


def test_analyze_says_how_many_hogs_the_measuring_run_had(detector, tmp_path, capsys):
    assert detector.main(["--ranks", "16", "--analyze", str(tmp_path)]) == 0
    assert "an unrecorded number of CPU hog(s)" in capsys.readouterr().out  # a folder from before HOGS_FILE
    (tmp_path / detector.HOGS_FILE).write_text("2")
    assert detector.main(["--ranks", "16", "--analyze", str(tmp_path)]) == 0
    assert "2 CPU hog(s) beside the job" in capsys.readouterr().out
