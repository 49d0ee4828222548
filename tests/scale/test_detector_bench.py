"""bench/detector.py --ranks: the tuned scenarios it writes, and how it splits a recovery
into phases (root-free)."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from harness.run.scenario import load_scenario

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def detector(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # the bench imports its neighbours by name
    return importlib.import_module("detector")


def test_a_tuning_reaches_the_detector_policies_only(detector, tmp_path):
    path = tmp_path / "bench_blackhole.yaml"
    path.write_text(detector.scenario_text("blackhole", ["elastic", "timeout"], detector.Tuning(0.4, 0.3)))
    tuned = load_scenario(path)
    elastic = tuned.policy("elastic")
    assert elastic.detector.suspect_after == 0.4 and elastic.exclude_after == 0.3
    assert tuned.policy("timeout").detector is None
    default = tmp_path / "default.yaml"
    default.write_text(detector.scenario_text("blackhole", ["elastic"]))
    elastic = load_scenario(default).policy("elastic")
    assert elastic.exclude_after == 1.0 and elastic.detector.suspect_after == 0.8
    assert detector.Tuning().folder(16) == "ranks-16"
    assert detector.Tuning(0.4, None).folder(16) == "ranks-16-suspect-0.4s"
    assert detector.Tuning(None, 0.3).folder(64) == "ranks-64-exclude-0.3s"
    assert load_scenario(default).cluster.sysctls == {}


def test_an_arp_retransmission_time_reaches_every_host(detector, tmp_path):
    path = tmp_path / "bench_link_down.yaml"
    path.write_text(detector.scenario_text("link_down", ["elastic_rejoin"], detector.Tuning(arp_retrans=0.1)))
    assert load_scenario(path).cluster.sysctls == {"net.ipv4.neigh.eth0.retrans_time_ms": "100"}
    assert detector.Tuning(0.4, None, 0.1).folder(16) == "ranks-16-suspect-0.4s-arp-0.1s"


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
