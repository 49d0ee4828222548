"""`chaos tune` for real, through the installed `chaos` command, as CI's slice of it: 4
netns ranks, a short measurement and control, one round, no references, one short fault
for the per-fault stage; interrupted with Ctrl-C in its second stage, then resumed to the
end by the same command. The candidates
come from the measured steps, each is judged from its own trials, and the report says which
one to use and why. CI requires that it recommends one: a tune that never does is a failure."""
from __future__ import annotations

import json
import math
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from harness.studies.nightly import MANIFEST, RUNS
from runfolder.events import EVENTS_FILE, read_events
from tests.conftest import CHAOS, REPO

COMMAND = ["tune", str(REPO / "scenarios" / "kill_rank.yaml"), "--ranks", "4", "--measure", "6s", "--control", "4s",
           "--repeat", "1", "--no-references", "--faults", "pause:3s", "--budget", "8m"]
STAGE_DEADLINE_S = 90.0
TUNE_DEADLINE_S = 420.0


def second_stage_under_way(out: Path) -> bool:
    """The measurement is done and the control's first trial has stepped after warm-up (not
    earlier: a signal landing while the harness forks is lost in Python's at-fork callbacks)."""
    manifests = [json.loads(p.read_text()) for p in out.glob(f"*/{MANIFEST}")]
    if not manifests or not manifests[0]["done"]:
        return False
    done = {Path(d["run"]).name for d in manifests[0]["done"]}
    return any(e["kind"] == "warmup_done" for run_dir in out.glob(f"*/{RUNS}/*") if run_dir.name not in done
               for events in run_dir.glob(f"trials/*/{EVENTS_FILE}") for e in read_events(events)[0])


@pytest.mark.requires_root
def test_a_tune_interrupted_and_resumed_recommends_from_its_own_measurements(tmp_path: Path, leaves_nothing) -> None:
    out = tmp_path / "tunes"
    command = [CHAOS, *COMMAND, "--out", str(out)]
    first = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + STAGE_DEADLINE_S
    while not second_stage_under_way(out) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=60)
    assert second_stage_under_way(out), err
    assert first.returncode == 130 and "the same command resumes tune" in err, err
    [folder] = [p.parent for p in out.glob(f"*/{MANIFEST}")]
    stopped = json.loads((folder / MANIFEST).read_text())
    assert [d["key"] for d in stopped["done"]] == ["kill_rank-measure/0/fault_free"] and not stopped["finished"]

    resumed = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=TUNE_DEADLINE_S)
    # 1 is "no candidate passed" (its reasons in the report) and any error alike: CI requires a recommendation
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-4000:]
    assert f"resuming tune {folder.name}: 1 stages done" in resumed.stderr
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["finished"] and manifest["done"][0] == stopped["done"][0]  # measured once
    keys = [d["key"].split("/")[0] for d in manifest["done"]]
    # a chosen candidate's retry wave, with its jitter and the document's
    assert keys == ["kill_rank-measure", "kill_rank-control-0", "kill_rank-silent-0",
                    "kill_rank-wave", "kill_rank-fault-pause-3-s", "kill_rank-detector-0"]
    assert sorted(p.name for p in (folder / RUNS).iterdir()) == sorted(Path(d["run"]).name for d in manifest["done"])

    result = json.loads((folder / "tune.json").read_text())
    measured = result["fault_free"]
    assert measured["steps"] > 0 and 0 < measured["max_s"] and measured["step_period_s"] == 0.25
    timeouts = [c["timeout"] for c in result["candidates"]]
    wait = max(measured["max_s"], measured["step_period_s"])
    assert timeouts == sorted(timeouts) and all(t >= 3 * wait for t in timeouts)
    for name, evidence in result["evidence"].items():
        assert len(evidence["control_s"]) == 1 and len(evidence["silent_detected_s"]) == 1, name
        timeout = next(c["timeout"] for c in result["candidates"] if c["name"] == name)
        known = evidence["silent_detected_s"][0]
        # every other rank knew of the silent rank at its timeout, and not before it
        assert math.isnan(known) or timeout <= known + 0.3, (name, known)
    report = (folder / "tune.md").read_text()
    assert report in resumed.stdout and "## Recommended" in report
    chosen = result["chosen"]
    assert f"`{chosen}`: timeout" in report and "init_process_group(backend, timeout=timedelta(" in report
    assert result["evidence"][chosen]["false_trips"] == [0] and result["evidence"][chosen]["transient_detected"] == [0]
    waves = {w["name"]: w for w in result["waves"]}
    assert set(waves) == {chosen, f"{chosen}_document_jitter"} and "## A retry wave" in report
    for w in waves.values():  # the 3 ranks not frozen fail at once and re-join
        assert w["rejoins"] >= 3 and w["peak_per_s"] >= 10, w
    # a 3 s pause, the chosen settings without and with a breaker: each a measured row
    rows = {r["setting"]: r for r in result["per_fault"]}
    assert set(rows) == {chosen, f"{chosen}_breaker"} and "## What the settings do, per fault" in report
    timeout = next(c["timeout"] for c in result["candidates"] if c["name"] == chosen)
    for row in rows.values():
        assert row["fault"] == "pause 3 s" and row["outcome"] in ("recovered", "absorbed", "isolated"), row
        if timeout < 3:  # the pause outlasts the timeout: detected at it, not before
            assert row["detect_ranks"] >= 3 and timeout <= row["first_s"] + 0.3, row
    came_back = ("recovered", "absorbed")  # the breaker is kept only where it came back as the retries did
    assert result["breaker"]["recommended"] == (rows[f"{chosen}_breaker"]["outcome"] in came_back
                                                or rows[chosen]["outcome"] not in came_back)
    # the failure detector: thresholds over the heartbeat gaps recorded while measuring,
    # each an elastic policy whose every other rank knew of the silent rank after it
    gaps = result["heartbeat_gaps"]
    assert gaps["gaps"] > 0 and sorted(gaps["ranks"]) == ["0", "1", "2", "3"] and 0 < gaps["max_s"] < 5
    assert [d["suspect_after"] for d in result["detectors"]] == sorted({
        round(max(0.2, math.ceil(m * gaps["max_s"] / 0.05 - 1e-9) * 0.05), 6) for m in (2, 5)})
    assert set(result["detector_evidence"]) == {d["name"] for d in result["detectors"]}
    for name, e in result["detector_evidence"].items():
        assert len(e["control_s"]) == 1 and e["control_s"][0] > 0, name
        knew = e["every_s"][0]
        assert math.isnan(knew) or e["suspect_after"] - 0.1 <= knew < timeout, (name, e)
    if result["detector"] is not None:
        assert f'"suspect_after": {result["detector_evidence"][result["detector"]]["suspect_after"]:g}}}' in report
    assert (folder / "tradeoff.png").stat().st_size > 0


JOB_COMMAND = ["tune", str(REPO / "scenarios" / "byo_link_down.yaml"), "--ranks", "2", "--measure", "3s",
               "--control", "3s", "--repeat", "1", "--no-references", "--faults", "blackhole", "--budget", "7m"]


@pytest.mark.requires_root
def test_a_user_job_is_tuned_through_its_own_timeout_option(tmp_path: Path, leaves_nothing) -> None:
    """examples/train_ddp.py, its timeout set where job.tune says (--timeout {seconds}): its
    step interval probed, measured, and each candidate a variant of the job judged from its
    own trials."""
    out = tmp_path / "tunes"
    done = subprocess.run([CHAOS, *JOB_COMMAND, "--out", str(out)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=TUNE_DEADLINE_S)
    # 1 is "no candidate passed" (its reasons in the report) and any error alike: CI requires a recommendation
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    [folder] = [p.parent for p in out.glob(f"*/{MANIFEST}")]
    manifest = json.loads((folder / MANIFEST).read_text())
    result = json.loads((folder / "tune.json").read_text())
    # a host gone for good is tried where the torchrun side under the blackhole did not come back
    torchrun_back = [r["outcome"] in ("recovered", "absorbed", "continued") for r in result["per_fault"]
                     if r["setting"].endswith("_torchrun")]
    chosen_stages = ["byo_link_down-restarts", "byo_link_down-fault-blackhole-for-good"]
    chosen_stages += ["byo_link_down-hosts-blackhole-for-good"] if torchrun_back == [False] else []
    assert [d["key"].split("/")[0] for d in manifest["done"]] == \
        ["byo_link_down-probe", "byo_link_down-measure", "byo_link_down-control-0", "byo_link_down-silent-0",
         *chosen_stages]
    assert "the job's step interval: 0.2" in done.stderr or "the job's step interval: 0.3" in done.stderr
    measured = result["fault_free"]
    assert measured["step_period_s"] == 0 and measured["formation_s"] is None and measured["max_s"] >= 0.2
    variants = yaml.safe_load((folder / "scenarios" / "control-0.yaml").read_text())["variants"]
    for c in result["candidates"]:
        assert c["max_retries"] == 0 and variants[c["name"]] == {"args": ["--timeout", f"{c['timeout']:g}"]}
        known = result["evidence"][c["name"]]["silent_detected_s"][0]
        # the job's ranks raise at its timeout, not before it
        assert math.isnan(known) or c["timeout"] <= known + 0.3, (c, known)
    report = (folder / "tune.md").read_text()
    chosen = next(c for c in result["candidates"] if c["name"] == result["chosen"])
    assert f"For your job: --timeout {chosen['timeout']:g} on its command line (job.tune.timeout)" in report
    assert "policies:" not in report
    # the job under a blackhole for good: its own code, no breaker of ours; the ranks knew at
    # the timeout (no TCP signal comes through a blackhole), not before it
    rows = {r["setting"]: r for r in result["per_fault"]}
    row = rows[chosen["name"]]
    assert row["fault"] == "blackhole for good" and row["detect_ranks"] >= 1, row
    assert chosen["timeout"] <= row["first_s"] + 0.3, row
    assert math.isnan(row["breaker_s"]) and result["breaker"] is None
    # job.tune.max_restarts: torchrun: the chosen timeout under real torchrun agents, paused
    # past it: every worker's collective timed out and an agent restarted its workers
    restarts = {r["setting"]: r for r in result["restarts"]}
    assert list(restarts) == ["restarts_3", "restarts_3_own_store"], restarts
    assert all(r["used"] >= 1 for r in restarts.values()), restarts
    recommended = result["max_restarts"]
    if recommended is not None:
        assert f"torchrun --max-restarts {recommended['max_restarts']} ..." in report
        assert restarts[recommended["from"]]["outcome"] in ("recovered", "absorbed", "continued")
        # and what they do under the blackhole, beside the timeout alone
        under = yaml.safe_load((folder / "scenarios" / "fault-blackhole-for-good.yaml").read_text())["variants"]
        torchrun = under[chosen["name"] + "_torchrun"]
        assert (torchrun["launcher"], torchrun["max_restarts"]) == ("torchrun", recommended["max_restarts"])
        assert set(rows) == {chosen["name"], chosen["name"] + "_torchrun"}, rows
        if torchrun_back == [False]:  # its agent waited for the cut-off host: one host fewer, a faster rendezvous
            [hosts] = result["hosts"]
            varied = yaml.safe_load((folder / "scenarios" / "hosts-blackhole-for-good.yaml").read_text())["variants"]
            side = varied[chosen["name"] + "_min_hosts"]
            assert (side["min_hosts"], side["rdzv_conf"]) == (1, {"keep_alive_interval": 1,
                                                                  "last_call_timeout": 2}), side
            assert (hosts["setting"], hosts["outcome"], hosts["world"]) == \
                (chosen["name"] + "_min_hosts", "continued", 1), hosts
            assert result["min_hosts"]["min_hosts"] == 1
            assert "torchrun --nnodes 1:2 --max-restarts" in report
            assert "--rdzv-conf keep_alive_interval=1,last_call_timeout=2 ..." in report
    else:
        assert "no --max-restarts tried brought every rank back" in report
        assert set(rows) == {chosen["name"]}, rows
