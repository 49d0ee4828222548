"""The state checker on a real user job under real torchrun: 4 DDP workers on loopback
with the harness's environment (the step hook records their fingerprints), one worker
failing once so that torchrun restarts them all from the checkpoint."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from chaos import proc
from harness.cluster.userjob import JobSpec, rank_environment
from reports.state import CONSISTENT, DIVERGED, REPLICAS_AGREE, RESTORE_IS_REAL, check_state
from runfolder.events import read_events

pytestmark = pytest.mark.system  # real DDP ranks on loopback: not in ./dev.sh check

SCRIPT = Path(__file__).resolve().parent / "planted" / "reinit_on_restart.py"
DEADLINE_S = 240


def restarted_job(tmp_path: Path, reinit_rank: int) -> list[dict]:
    """Run the planted script under torchrun (a failure after step 12, checkpoints every
    5 steps, one restart); returns the events its hook wrote."""
    events = tmp_path / "events.jsonl"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
            "--max-restarts", "1", "--monitor-interval", "0.1",
            "--log-dir", str(tmp_path / "torchrun"),  # torchrun's default: a /tmp/torchelastic_* never removed
            str(SCRIPT), "--checkpoint",
            str(tmp_path / "ckpt.pt"), "--marker", str(tmp_path / "failed-once"), "--reinit-rank", str(reinit_rank)]
    env = rank_environment(JobSpec(command=tuple(argv), launcher="torchrun", nproc_per_host=4), 0, 1,
                           "statetest", "default", str(events), "lo")
    agent = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    try:
        output, _ = agent.communicate(timeout=DEADLINE_S)
    finally:  # the agent and its workers (each in a session of its own), whatever happened
        proc.signal_tree(agent.pid, signal.SIGKILL, None, gone_ok=True)
        agent.wait()
    assert agent.returncode == 0, output[-3000:]
    assert (tmp_path / "failed-once").exists()
    return read_events(events)[0]


def test_a_restart_that_resumed_from_the_checkpoint_is_consistent(tmp_path):
    verdict = check_state(restarted_job(tmp_path, reinit_rank=-1))
    assert verdict.verdict == CONSISTENT, verdict.summary()
    assert verdict.restores_checked == 4            # every worker of the restart started from step 10's state
    assert set(verdict.rolled_back.values()) == {2}  # 12 -> 10


def test_a_worker_that_reinitialises_on_restart_is_named_with_its_generation(tmp_path):
    verdict = check_state(restarted_job(tmp_path, reinit_rank=3))
    assert verdict.verdict == DIVERGED
    first = verdict.first  # host 0's local rank 3 (torchrun's RANK 3 on this one host)
    assert first.ranks == ("0.3",) and first.gen == 1 and "start of generation 1" in first.detail, verdict.summary()
    # DDP's constructor sent rank 0's weights to every rank: the momentum it lost is what differs
    assert first.invariant == RESTORE_IS_REAL and "optimizer's state was not restored" in first.detail
    assert any(v.invariant == REPLICAS_AGREE and v.ranks == ("0.3",) for v in verdict.violations)
