"""A user's own job on namespace hosts, end to end through `chaos run` (2 ranks): jobs that
fail in each way a user's can give a clear error or verdict and leave nothing behind; a
killed rank's peers report it through their output (job_output) and their exits."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import chaos_cli

pytestmark = pytest.mark.requires_root

LOCAL_TRAINING = """\
import time, torch
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
while True:
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    time.sleep(0.1)
"""


def scenario(tmp_path: Path, command: list[str], fault: str = "{kind: link_down, target: {rank: 1}, "
             "start: 1s, duration: 2s}") -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(f"cluster: {{ranks: 2}}\njob: {{command: {json.dumps(command)}, start_timeout: 120s}}\n"
                    f"warmup_steps: 3\nfaults:\n  - {fault}\nhang_cap: 15s\nsettle_steps: 3\n")
    return path


def events_of(out: Path) -> list[dict]:
    (trial,) = out.glob("*/trials/*/events.jsonl")
    return [json.loads(line) for line in trial.read_text().splitlines()]


def metrics_row(out: Path) -> pd.Series:
    (metrics,) = out.glob("*/metrics.csv")
    return pd.read_csv(metrics).iloc[0]


def no_process_left(events: list[dict]) -> None:
    # the ranks (rank_spawned) are checked by leaves_nothing; here the taps that wrote output
    taps = {e["pid"] for e in events if e["kind"] == "job_output"}
    assert [pid for pid in taps if Path(f"/proc/{pid}").exists()] == []


def test_a_command_that_does_not_exist_is_refused_before_anything_is_built(tmp_path, leaves_nothing):
    done = chaos_cli("run", str(scenario(tmp_path, ["no-such-program-for-chaos"])), "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert "job.command: 'no-such-program-for-chaos' is not a program found on PATH" in done.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("source, log_says", [
    ("import no_such_module_for_chaos\n", "ModuleNotFoundError: No module named 'no_such_module_for_chaos'"),
    ("", None),  # exits 0 at once
])
def test_a_job_that_ends_before_its_warm_up_is_an_error_naming_its_logs(tmp_path, leaves_nothing, source, log_says):
    (tmp_path / "job.py").write_text(source)
    out = tmp_path / "out"
    done = chaos_cli("run", str(scenario(tmp_path, [sys.executable, str(tmp_path / "job.py")])), "--out", str(out))
    assert done.returncode == 1, done.stderr
    assert "exited during warm-up; see" in done.stderr and "/logs" in done.stderr
    events = events_of(out)
    exits = [e for e in events if e["kind"] == "rank_exited" and not e.get("stopped")]
    assert exits and all(e["exitcode"] == (1 if log_says else 0) for e in exits)
    if log_says:
        logs = "".join(p.read_text() for p in out.glob("*/trials/*/logs/r00*.log"))
        assert log_says in logs
    no_process_left(events)


def test_a_job_that_never_joins_a_process_group_absorbs_a_link_fault(tmp_path, leaves_nothing):
    (tmp_path / "job.py").write_text(LOCAL_TRAINING)
    out = tmp_path / "out"
    done = chaos_cli("run", str(scenario(tmp_path, [sys.executable, str(tmp_path / "job.py")])), "--out", str(out))
    assert done.returncode == 0, done.stderr
    row = metrics_row(out)
    assert row["outcome"] == "absorbed" and row["detect_ranks"] == 0 and row["restarts"] == 0
    no_process_left(events_of(out))


def test_a_killed_ranks_peer_reports_it_and_exits(tmp_path, leaves_nothing):
    example = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"
    out = tmp_path / "out"
    command = [sys.executable, str(example), "--step-period", "0.2", "--checkpoint", "{trial_dir}/c.pt"]
    done = chaos_cli("run", str(scenario(tmp_path, command, "{kind: kill, target: {rank: 1}, start: 1s}")),
                     "--out", str(out))
    assert done.returncode == 0, done.stderr
    events = events_of(out)
    killed = next(e["t"] for e in events if e["kind"] == "fault_applied")
    said = [e for e in events if e["kind"] == "job_output" and e["rank"] == 0 and e["t"] >= killed]
    assert said, "rank 0 printed no classified error line after rank 1 was killed"
    row = metrics_row(out)
    assert row["outcome"] == "crashed" and row["detect_ranks"] == 1 and row["ttd_s"] >= 0
    no_process_left(events)


def test_torchrun_agents_restart_workers_that_time_out_and_they_resume(tmp_path, leaves_nothing):
    # --init-timeout too: a worker restarted while the link is down must give up in its
    # start-up, or it waits there PyTorch's 30 min and the trial is hung (seen once in CI).
    # Each round's workers on a store of their own: on the rendezvous's shared store a
    # restarted worker can read a stale round's address and the job crashes (docs/own-job.md)
    example = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"
    out = tmp_path / "out"
    path = tmp_path / "torchrun.yaml"
    path.write_text(f"""cluster: {{ranks: 2}}
job:
  command: [python, {example}, --step-period, "0.25", --timeout, "3", --init-timeout, "3",
            --checkpoint, "{{trial_dir}}/c.pt", --checkpoint-every, "5"]
  launcher: torchrun
  max_restarts: 2
  env: {{TORCH_DISABLE_SHARE_RDZV_TCP_STORE: "1"}}
warmup_steps: 8
faults:
  - {{kind: link_down, target: {{rank: 1}}, start: 1s, duration: 8s}}
hang_cap: 40s
settle_steps: 8
""")
    done = chaos_cli("run", str(path), "--out", str(out))
    assert done.returncode == 0, done.stderr
    row = metrics_row(out)
    assert row["detect_cause"] == "timeout"
    # one new worker per host per restart of the group. How many rounds depends on when the
    # restarted group times out again while the link is down; torchrun also restarts the group
    # without counting it against max_restarts when an agent rejoins (a membership change).
    assert row["restarts"] >= 2 and row["restarts"] % 2 == 0
    events = events_of(out)
    assert any(e["kind"] == "job_output" and e["cause"] == "agent" for e in events)
    logs = "".join(p.read_text() for p in out.glob("*/trials/*/logs/r00*.log"))
    assert row["outcome"] == "recovered" and "resumed from" in logs, logs[-2000:]
    no_process_left(events)
