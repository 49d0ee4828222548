"""`chaos nightly --quick` for real, through the installed `chaos` command: interrupted with
Ctrl-C after its first run folder, then resumed to the end; the night folder, the history
rows, the trend page, JUnit, the summary and the Prometheus file agree with the stored
events."""
from __future__ import annotations

import json
import signal
import sqlite3
import statistics
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.studies.nightly import MANIFEST, QUICK_PLAN, RUNS, expand, load_night_plan
import reports
from runfolder.events import EVENTS_FILE, read_events
from runfolder.layout import trial_dir
from tests.conftest import CHAOS

FIRST_CELL_DEADLINE_S = 120.0
NIGHT_DEADLINE_S = 300.0


def first_detection_s(events: list[dict]) -> float:
    """Time to detect from the raw events: the first collective error or suspicion on any rank
    from the moment the fault was asked for, minus when it was applied (reports.metrics' ttd_s)."""
    fault = next(e for e in events if e["kind"] == "fault_applied")
    first = min(e["t"] for e in events if e["kind"] in ("collective_error", "suspect") and e["rank"] is not None
                and e["t"] >= min(fault["t"], fault["t_requested"]))
    return max(first, fault["t"]) - fault["t"]


def second_cell_past_its_fault(out: Path) -> bool:
    """The first cell is done and the second's trial has applied its fault. (Not earlier: a
    signal that lands while the harness forks is lost in Python's at-fork callbacks.)"""
    manifests = [json.loads(p.read_text()) for p in out.glob(f"*/{MANIFEST}")]
    if not manifests or not manifests[0]["done"]:
        return False
    done = {Path(d["run"]).name for d in manifests[0]["done"]}
    return any(e["kind"] == "fault_applied" for run_dir in (out.glob(f"*/{RUNS}/*")) if run_dir.name not in done
               for events in run_dir.glob(f"trials/*/{EVENTS_FILE}") for e in read_events(events)[0])


@pytest.mark.requires_root
def test_a_quick_night_interrupted_and_resumed_writes_history_and_files_that_match_its_events(
        tmp_path: Path, leaves_nothing) -> None:
    # README.md's line as written (tests/test_readme_commands.py leaves it to this test), in a
    # folder of its own: the night lands in ./nights, its history in ./nights/history.sqlite
    out, db = tmp_path / "nights", tmp_path / "nights" / "history.sqlite"
    command = [str(CHAOS), "nightly", "--quick"]
    first = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + FIRST_CELL_DEADLINE_S
    while not second_cell_past_its_fault(out) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    first.send_signal(signal.SIGINT)  # in the middle of the second cell's trial
    _, err = first.communicate(timeout=60)
    assert second_cell_past_its_fault(out), err
    assert first.returncode == 130, err
    [night_dir] = [p.parent for p in out.glob(f"*/{MANIFEST}")]
    stopped = json.loads((night_dir / MANIFEST).read_text())
    assert not stopped["finished"] and not db.exists()

    resumed = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=NIGHT_DEADLINE_S)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming night {night_dir.name}: {len(stopped['done'])} of" in resumed.stderr
    assert "6/6 trials" in resumed.stderr
    manifest = json.loads((night_dir / MANIFEST).read_text())
    assert manifest["finished"] and manifest["done"][:len(stopped["done"])] == stopped["done"]
    cells = expand(load_night_plan(QUICK_PLAN), QUICK_PLAN)
    assert [d["key"] for d in manifest["done"]] == [c.key for c in cells]
    assert sorted(p.name for p in (night_dir / RUNS).iterdir()) == sorted(Path(d["run"]).name
                                                                          for d in manifest["done"])
    info = manifest["info"]
    assert info["commit"] and info["kernel"] and info["torch"] and info["backend"] == "netns"
    assert info["loop_ns"] > 0 and info["wake_us"] > 0 and info["fault_us"] > 0  # measured once, as it began

    # history: one trial row per cell x policy, its figures analyze_run's of the stored run folder
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT night, loop_ns, wake_us, fault_us FROM nights").fetchall() == [
            (night_dir.name, info["loop_ns"], info["wake_us"], info["fault_us"])]
        trials = {(s, p, r): (seed, outcome) for s, p, r, seed, outcome in
                  con.execute("SELECT scenario, policy, repeat, seed, outcome FROM trials")}
        metrics = {(s, p, r, m): v for s, p, r, m, v in
                   con.execute("SELECT scenario, policy, repeat, metric, value FROM metrics")}
    assert set(trials) == {(c.scenario.name, p, c.repeat) for c in cells for p in c.policies}
    ttd: dict[tuple[str, str], list[float]] = {}
    for done in manifest["done"]:
        run_dir = night_dir / done["run"]
        for _, row in reports.analyze_run(run_dir).iterrows():
            key = (row["scenario"], row["policy"], done["repeat"])
            assert trials[key] == (row["seed"], row["outcome"])
            events, _ = read_events(trial_dir(run_dir, row["policy"]) / EVENTS_FILE)
            assert metrics[(*key, "ttd_s")] == pytest.approx(first_detection_s(events), abs=1e-3)
            ttd.setdefault(key[:2], []).append(metrics[(*key, "ttd_s")])

    # JUnit: one case per scenario x policy, the median of its repeats as a property
    cases = ET.parse(night_dir / "junit.xml").getroot().iter("testcase")
    medians = {(c.get("classname"), c.get("name")): float(c.find("properties/property[@name='ttd_s.median']")
                                                          .get("value")) for c in cases}
    assert medians == pytest.approx({key: statistics.median(values) for key, values in ttd.items()}, rel=1e-4)
    # Prometheus: the same medians, and the trials counted by outcome
    families = {f.name: f for f in text_string_to_metric_families((night_dir / "metrics.prom").read_text())}
    prom = {(s.labels["scenario"], s.labels["policy"]): s.value for s in families["chaos_nightly_ttd_seconds"].samples
            if s.labels["quantile"] == "0.5"}
    assert prom == pytest.approx(medians, rel=1e-4)
    counted = sum(s.value for s in families["chaos_nightly_trials"].samples)
    assert counted == len(trials)
    assert families["chaos_nightly_machine_loop_ns"].samples[0].value == info["loop_ns"]
    assert families["chaos_nightly_machine_fault_us"].samples[0].value == info["fault_us"]
    # summary and trend page name every series; the summary's table is the document's
    summary = (night_dir / "summary.md").read_text()
    trends = (night_dir / "trends.html").read_text()
    for scenario, policy in ttd:
        assert f"| {scenario} | {policy} |" in summary
        assert f"<h2>{scenario}</h2>" in trends and f"<td>{policy}</td>" in trends
        assert f"alt='{scenario}: time to detect, first rank'" in trends
    assert "## The source document's table, measured" in summary and "n=2" in summary
    assert f"machine: a Python loop step {info['loop_ns']:.3g} ns" in summary
    assert "the source document's table, measured" in resumed.stdout
