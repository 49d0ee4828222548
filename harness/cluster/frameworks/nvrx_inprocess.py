"""NVIDIA's in-process restart (nvidia-resiliency-ext's `inprocess.Wrapper`) as a user's job
(`job.launcher: nvrx_inprocess`).

The Wrapper restarts the training function inside each process: no agent runs beside it
(a torchrun agent would end every local worker with a failed one), so each host runs the
job's command once, with the torchrun contract (RANK, WORLD_SIZE, MASTER_ADDR: rank 0's
host, MASTER_PORT) as the `direct` launcher gives it (examples/train_inprocess.py). The
Wrapper's own store is at MASTER_PORT + 1 on rank 0's host, the script's at MASTER_PORT + 2 +
its iteration; when a rank fails, the others abort their process group, take a new rank and
world size from the Wrapper (the ranks left, shifted down) and call the function again. Its
settings (timeouts, health checks, rank assignment) are the decorator's, in the script.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict

INSTALL = ("pip install -e '.[frameworks]' in the harness's repository (nvidia-resiliency-ext==0.4.1), "
           "or run ./dev.sh")
BACKENDS = ("netns", "docker", "local", "slurm")  # every one: each has been run


class Settings(BaseModel):
    """Nothing to set in a scenario: the Wrapper's options are its decorator's, in the script
    (a process it ended does not come back, so there is no relaunch)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
