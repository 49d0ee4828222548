"""A user's job that never steps (no torch.optim, no opt-in, no step_pattern) on 2 namespace
hosts through `chaos run`: warm-up ends at its start_timeout with every rank alive, the
faults run on time alone, and the verdict comes from exits alone."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from tests.byo.test_user_job_netns import events_of, metrics_row, no_process_left
from tests.conftest import chaos_cli

pytestmark = pytest.mark.requires_root

# all-reduces forever through gloo and never calls an optimizer: a dead peer is an exception
ALL_REDUCE_FOREVER = """\
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
tensor = torch.ones(4)
while True:
    dist.all_reduce(tensor)
    time.sleep(0.1)
"""
SLEEP_FOREVER = "import time\nwhile True:\n    time.sleep(0.2)\n"
SLEEP_THEN_EXIT_0 = "import time\ntime.sleep(12)\n"
LINK_DOWN = "{kind: link_down, target: {rank: 1}, start: 1s, duration: 2s}"


def run_job(tmp_path: Path, source: str, fault: str, hang_cap: str = "5s") -> Path:
    (tmp_path / "job.py").write_text(source)
    path = tmp_path / "job.yaml"
    path.write_text(f"cluster: {{ranks: 2}}\n"
                    f"job: {{command: {json.dumps([sys.executable, str(tmp_path / 'job.py')])}, start_timeout: 5s}}\n"
                    f"warmup_steps: 3\nfaults:\n  - {fault}\nhang_cap: {hang_cap}\nsettle_steps: 3\n")
    out = tmp_path / "out"
    done = chaos_cli("run", str(path), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "steps not observed" in done.stdout + done.stderr
    events = events_of(out)
    assert [e["kind"] for e in events].count("steps_not_observed") == 1
    assert not any(e["kind"] in ("step", "warmup_done", "hang_detected") for e in events)
    no_process_left(events)
    return out


def test_a_peer_that_exits_non_zero_after_a_kill_is_a_crash(tmp_path, leaves_nothing):
    # the kill comes well after both ranks joined the group (importing torch takes seconds)
    out = run_job(tmp_path, ALL_REDUCE_FOREVER, "{kind: kill, target: {rank: 1}, start: 20s}", hang_cap="30s")
    events = events_of(out)
    killed = next(e["t"] for e in events if e["kind"] == "fault_applied")
    peer = [e for e in events if e["kind"] == "rank_exited" and e["rank"] == 0]
    assert peer and peer[0]["t"] > killed and (peer[0]["exitcode"] or peer[0]["signal"])
    row = metrics_row(out)
    assert row["outcome"] == "crashed", row["outcome_reason"]
    assert row["detect_ranks"] == 1 and 0 <= row["ttd_s"] < 30
    assert row["restarts"] == 0  # the hook saw each process start, and none start again
    for name in ("ttr_s", "max_stall_s", "wasted_rank_s", "steps_per_s_during"):
        assert math.isnan(row[name]), name


@pytest.mark.parametrize("source, outcome, end", [
    (SLEEP_FOREVER, "running-at-cap", "cap"),
    (SLEEP_THEN_EXIT_0, "exited-clean", "all-exited"),
])
def test_a_job_that_runs_through_a_link_fault_gets_a_verdict_without_steps(tmp_path, leaves_nothing,
                                                                            source, outcome, end):
    out = run_job(tmp_path, source, LINK_DOWN, hang_cap="15s" if end == "all-exited" else "5s")
    events = events_of(out)
    assert [e["reason"] for e in events if e["kind"] == "trial_end"] == [end]
    row = metrics_row(out)
    assert row["outcome"] == outcome, row["outcome_reason"]
    assert row["detect_ranks"] == 0 and math.isnan(row["ttr_s"]) and math.isnan(row["max_stall_s"])
