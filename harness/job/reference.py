"""The fault-free trajectory of the built-in workload: every rank's loss at every step of
a run of the same workload, seed and world size without a fault.

The workload is deterministic in (seed, step, rank) (harness.job.workload), so one process
computes it: one replica of the weights (every rank holds the same), each step every
rank's gradients on its own batch, their mean, one update. It differs from a real run
only in the order the mean is summed (gloo's ring sums in another), a few units in the
last place of a float. reports.trajectory holds a trial's recorded losses against it.

Run by the rank launcher after a run's trials (entry "reference"; config: workload, seed,
world, steps, out); it writes the run folder's reference.json atomically.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from harness.job.config import WorkloadSpec
from harness.job.workload import Workload

LOSS_DECIMALS = 5  # as the step events record it (harness.job.runner)


def fault_free_losses(spec: WorkloadSpec, seed: int, world: int, steps: int) -> list[list[float]]:
    """losses[rank][step] for steps 0..steps-1, as a fault-free run records them."""
    workload = Workload(spec, seed=seed, rank=0)
    losses: list[list[float]] = [[] for _ in range(world)]
    for _ in range(steps):
        total = None
        for rank in range(world):
            workload.rank = rank  # the batch is the rank's; the weights are every rank's
            loss, flat = workload.local_gradients()
            losses[rank].append(round(loss, LOSS_DECIMALS))
            total = flat.clone() if total is None else total.add_(flat)
        assert total is not None
        workload.apply(total / world)
    return losses


def main(config: dict[str, Any]) -> int:
    torch.set_num_threads(1)
    spec = WorkloadSpec.model_validate(config["workload"])
    losses = fault_free_losses(spec, int(config["seed"]), int(config["world"]), int(config["steps"]))
    out = Path(config["out"])
    partial = out.with_name(f".{out.name}.{os.getpid()}")
    partial.write_text(json.dumps({"seed": config["seed"], "world": config["world"], "workload": config["workload"],
                                   "losses": losses}))
    os.replace(partial, out)
    return 0
