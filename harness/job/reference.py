"""The fault-free trajectory of the built-in workload: every rank's loss at every step of
a run of the same workload, seed and world size without a fault.

The workload is deterministic in (seed, step, rank) (harness.job.workload), so one process
computes it: one replica of the weights (every rank holds the same), each step every
rank's gradients on its own batch, their mean, one update. It differs from a real run
only in the order the mean is summed (gloo's ring sums in another): a few units in a
float's last place, which training carries further step by step. So it is computed twice,
summed in rank order and the other way round, and their gap per step (`spread`) is how
far rounding alone moves the losses by then. reports.trajectory holds a trial's recorded
losses against it.

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


def fault_free_losses(spec: WorkloadSpec, seed: int, world: int, steps: int,
                      descending: bool = False) -> list[list[float]]:
    """losses[rank][step] for steps 0..steps-1, as a fault-free run records them, each
    step's gradients summed in rank order (`descending`: the other way round)."""
    workload = Workload(spec, seed=seed, rank=0)
    losses: list[list[float]] = [[0.0] * steps for _ in range(world)]
    order = range(world - 1, -1, -1) if descending else range(world)
    for step in range(steps):
        total = None
        for rank in order:
            workload.rank = rank  # the batch is the rank's; the weights are every rank's
            loss, flat = workload.local_gradients()
            losses[rank][step] = round(loss, LOSS_DECIMALS)
            total = flat.clone() if total is None else total.add_(flat)
        assert total is not None
        workload.apply(total / world)
    return losses


def order_spread(ascending: list[list[float]], descending: list[list[float]]) -> list[float]:
    """Per step, the largest gap between two fault-free runs that differ only in the order
    their gradients are summed: how far float rounding alone has carried the trajectory."""
    return [max(abs(a[step] - d[step]) for a, d in zip(ascending, descending, strict=True))
            for step in range(len(ascending[0]))]


def main(config: dict[str, Any]) -> int:
    torch.set_num_threads(1)
    spec = WorkloadSpec.model_validate(config["workload"])
    args = (spec, int(config["seed"]), int(config["world"]), int(config["steps"]))
    losses = fault_free_losses(*args)
    spread = order_spread(losses, fault_free_losses(*args, descending=True))
    out = Path(config["out"])
    partial = out.with_name(f".{out.name}.{os.getpid()}")
    partial.write_text(json.dumps({"seed": config["seed"], "world": config["world"], "workload": config["workload"],
                                   "losses": losses, "spread": spread}))
    os.replace(partial, out)
    return 0
