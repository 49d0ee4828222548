"""The defects planted for `chaos explore` to find (harness.job.planted) are the bugs they
claim to be, beside the shipped runner and checkpoints that do not have them; `chaos
explore` finding them for real is tests/run/test_explore_planted.py's."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from harness.job.checkpoint import Checkpointer
from harness.job.outcome import ExitReason
from harness.job.planted import SAVE_S, RetriesNeverReset, SavesInPlace, planted
from harness.job.policies import policy_spec
from harness.job.runner import FaultTolerantRunner
from harness.job.workload import Workload, WorkloadSpec
from runfolder.events import EventRecorder
from tests.harness.test_runner import ScriptedGroup


class Killed(Exception):
    """The saver's process ending mid-write."""


def test_a_save_in_place_leaves_a_torn_newest_checkpoint_when_its_writer_dies(tmp_path: Path) -> None:
    state = {"weights": torch.arange(10_000, dtype=torch.float32)}
    waits: list[float] = []

    def killed_half_way(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 5:
            raise Killed()
    saver = SavesInPlace(tmp_path, sleep=lambda s: None)
    saver.save(4, state)
    with pytest.raises(Killed):
        SavesInPlace(tmp_path, sleep=killed_half_way).save(8, state)
    assert sum(waits) == pytest.approx(5 * SAVE_S / 12)
    assert saver.latest() == 8  # the restore takes the half-written file: it is the newest by name
    with pytest.raises((ValueError, RuntimeError)):  # torch: a seek before the start, or no central directory
        saver.load(8)
    assert torch.equal(saver.load(4)["weights"], state["weights"])


def _runner(tmp_path: Path, cls: type[FaultTolerantRunner], group: ScriptedGroup) -> FaultTolerantRunner:
    workload = Workload(WorkloadSpec(step_period=0, checkpoint_every=2, hidden=8, features=4), seed=3, rank=0)
    return cls(policy_spec("retry", {"timeout": "5s", "max_retries": 1}), group, workload,
               Checkpointer(tmp_path / "ckpt"), EventRecorder(tmp_path / "events.jsonl", "rank", 0),
               random.Random(7), sleep=lambda s: None)


@pytest.mark.parametrize("cls, ends", [(FaultTolerantRunner, ExitReason.STOPPED),
                                       (RetriesNeverReset, ExitReason.RETRIES_EXHAUSTED)])
def test_a_second_failure_long_after_the_first_exhausts_only_the_planted_retries(
        tmp_path: Path, cls: type[FaultTolerantRunner], ends: ExitReason) -> None:
    # one retry; the 3rd all-reduce fails, and the 12th, long after the recovery
    assert _runner(tmp_path, cls, ScriptedGroup(fail_steps={3, 12})).run(max_steps=14) is ends


def test_no_defect_is_the_shipped_runner_and_checkpoints() -> None:
    assert planted(None) == (FaultTolerantRunner, Checkpointer)
    assert planted("restore_while_saving") == (FaultTolerantRunner, SavesInPlace)
    assert planted("retries_never_reset") == (RetriesNeverReset, Checkpointer)
    assert policy_spec("elastic").planted_defect is None


def test_restore_while_saving_needs_the_checkpoint_restore() -> None:
    from chaos.errors import UsageError
    with pytest.raises(UsageError, match="restore_while_saving is in the checkpoint restore: give restore: checkpoint"):
        policy_spec("elastic", {"planted_defect": "restore_while_saving"})
    assert policy_spec("elastic", {"planted_defect": "restore_while_saving", "restore": "checkpoint"}).planted_defect


def test_a_planted_defect_is_named_in_the_plan() -> None:
    from harness.scenario.scenario import load_scenario
    from harness.trial.plan import plan_text
    path = Path(__file__).resolve().parents[1] / "run" / "planted" / "retries_never_reset.yaml"
    text = plan_text(load_scenario(path), path, ["retry_once"], lambda fault: "a signal")
    assert "retry_once timeout 2 s, 1 retries (backoff 0.5..1 s), breaker off, PLANTED DEFECT retries_never_reset" in text
