"""One rank of a real 4-rank job with a planted defect, for the state checker to catch
(tests/harness/test_state_job.py): the harness's runner, workload, checkpoints and restore
over a real gloo group on loopback, writing real events.

    python tests/harness/planted/state_rank.py RANK WORLD PORT DIR DEFECT

Rank 1 fails once, after step 12 (it leaves its group before the step's all-reduce; the
others time out), so every rank retries and the next generation restores the newest
checkpoint (step 10, checkpoints every 5 steps). DEFECT, on rank 2 unless said:

    none      nothing planted
    older     rank 2 loads the checkpoint before the agreed one (step 5)
    skip      rank 2 runs the restore's collectives but keeps the state it had (step 12)
    torn      rank 0 rewrites the agreed checkpoint in place before the restore, its first
              layer from step 10 and the rest from step 5, as a writer that died half-way:
              every rank loads that one file
"""
from __future__ import annotations

import copy
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from harness.job.checkpoint import Checkpointer  # noqa: E402
from harness.job.config import WorkloadSpec  # noqa: E402
from harness.job.group import CollectiveError, GlooGroup, gloo_environment  # noqa: E402
from harness.job.policies import policy_spec  # noqa: E402
from harness.job.restore import restore_strategy  # noqa: E402
from harness.job.runner import FaultTolerantRunner  # noqa: E402
from harness.job.workload import Workload  # noqa: E402
from runfolder import events as kinds  # noqa: E402
from runfolder.events import EventRecorder  # noqa: E402

FAIL_AFTER, MAX_STEPS, DEFECTIVE = 12, 16, 2


class FailsOnce:
    """The group, but rank 1's all-reduce of step FAIL_AFTER + 1 fails before it is issued."""

    def __init__(self, group: GlooGroup, workload: Workload) -> None:
        self._group, self._workload, self._failed = group, workload, False

    def __getattr__(self, name: str):
        return getattr(self._group, name)

    def all_reduce(self, tensor, op="sum", watch=None):
        if (op == "sum" and not self._failed and self._group.member == 1
                and self._workload.step == FAIL_AFTER):
            self._failed = True
            raise CollectiveError("planted failure", "other", "step")
        return self._group.all_reduce(tensor, op, watch)


class Planted:
    """The real restore, then the defect."""

    def __init__(self, inner, defect: str, rank: int, checkpoints: Checkpointer) -> None:
        self.inner, self.defect, self.rank, self.checkpoints = inner, defect, rank, checkpoints

    def restore(self, group, workload, watch):
        first = group.generation == 0
        if not first and self.defect == "torn" and self.rank == 0:
            newest, older = self.checkpoints.steps()[-1], self.checkpoints.steps()[-2]
            torn = self.checkpoints.load(newest)
            stale = self.checkpoints.load(older)["model"]
            torn["model"] = {k: v if k.startswith("0.") else stale[k] for k, v in torn["model"].items()}
            torch.save(torn, self.checkpoints.path(newest))  # in place, not atomically
        kept = copy.deepcopy(workload.state())
        restored = self.inner.restore(group, workload, watch)
        if not first and self.rank == DEFECTIVE:
            if self.defect == "older":
                workload.load_state(self.checkpoints.load(self.checkpoints.steps()[-2]))
            elif self.defect == "skip":
                workload.load_state(kept)
        return restored


def main(rank: int, world: int, port: int, folder: Path, defect: str) -> int:
    import os
    os.environ.update(gloo_environment("lo", False))
    torch.set_num_threads(1)
    recorder = EventRecorder(folder / "events.jsonl", "rank", rank)
    recorder.emit(kinds.RANK_START, policy="retry", world=world)
    policy = policy_spec("retry", {"timeout": "2s", "rendezvous_timeout": "6s", "max_retries": 1,
                                   "backoff_base": "100ms", "backoff_cap": "200ms", "jitter": ["0s", "50ms"]})
    workload = Workload(WorkloadSpec(step_period=0, checkpoint_every=5, hidden=32, features=16), seed=7, rank=rank)
    checkpoints = Checkpointer(folder / "ckpt")
    group = FailsOnce(GlooGroup(("127.0.0.1", port), rank, world, policy.timeout, policy.rendezvous_s,
                                store_timeout_s=30.0),
                      workload)
    runner = FaultTolerantRunner(policy, group, workload, checkpoints, recorder, random.Random(rank))
    runner.restore = Planted(restore_strategy(policy.restore, checkpoints), defect, rank, checkpoints)
    reason = runner.run(MAX_STEPS)
    recorder.emit(kinds.EXIT, reason=reason.value, code=0)
    return 0


if __name__ == "__main__":
    rank, world, port, folder, defect = sys.argv[1:]
    sys.exit(main(int(rank), int(world), int(port), Path(folder), defect))
