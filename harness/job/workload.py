"""The training workload: a small real MLP trained with gradient all-reduce.

Data is synthetic and deterministic in (seed, step, rank), so a restore from a checkpoint
replays exactly the same batches: drawn on the CPU, then moved to the rank's device, where
the model, its gradients and the all-reduce live (harness.job.device). The update is SGD with momentum written out (three tensor
ops per parameter): torch.optim's first use imports torch._dynamo, ~0.8 s of a launch. Every rank starts from the same weights (seeded). The
step is paced to `step_period` so that 16 ranks share two cores without starving. Its
parameters, `WorkloadSpec`, are in harness.job.config (no torch there).
"""
from __future__ import annotations

import copy
import time
from typing import Any, Callable

import torch

from harness.job.config import WorkloadSpec
from harness.job.fingerprint import fingerprints, tensors_of

AllReduce = Callable[[torch.Tensor], None]
CPU = torch.device("cpu")


class Workload:
    def __init__(self, spec: WorkloadSpec, seed: int, rank: int, device: torch.device = CPU) -> None:
        self.spec = spec
        self.seed = seed
        self.rank = rank
        self.device = device
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(spec.features, spec.hidden), torch.nn.ReLU(),
            torch.nn.Linear(spec.hidden, spec.hidden), torch.nn.ReLU(),
            torch.nn.Linear(spec.hidden, spec.classes)).to(device)
        self.velocity = [torch.zeros_like(p) for p in self.model.parameters()]
        self.step = 0  # the next step to run
        self.compute_s = 0.0  # the last step's local part (train_step)
        self._initial = copy.deepcopy(self.state())
        self._teacher = torch.Generator().manual_seed(seed ^ 0x5EED)
        self._target = torch.randn(spec.features, spec.classes, generator=self._teacher).to(device)

    def _batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(hash((self.seed, self.step, self.rank)) & 0x7FFFFFFF)
        x = torch.randn(self.spec.batch, self.spec.features, generator=gen).to(self.device)
        return x, (x @ self._target).argmax(dim=1)

    def train_step(self, all_reduce: AllReduce, world_size: int) -> float:
        """One data-parallel step: local gradients, one all-reduce of all of them, update.
        `compute_s`: the wall seconds of the local part (what a straggler score compares:
        the all-reduce's wait equalises every rank's step)."""
        began = time.perf_counter()
        loss, flat = self.local_gradients()
        self.compute_s = time.perf_counter() - began
        all_reduce(flat)
        flat /= world_size
        self.apply(flat)
        return loss

    def local_gradients(self) -> tuple[float, torch.Tensor]:
        """This rank's loss on its batch of the current step, and its gradients, flat."""
        x, y = self._batch()
        self.model.zero_grad(set_to_none=False)
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        return float(loss.detach()), torch.cat([p.grad.reshape(-1) for p in self.model.parameters()])

    def apply(self, flat: torch.Tensor) -> None:
        """The update with the averaged gradients `flat`; the step is done."""
        offset = 0
        with torch.no_grad():
            for p, v in zip(self.model.parameters(), self.velocity, strict=True):
                g = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
                v.mul_(self.spec.momentum).add_(g)
                p.sub_(v, alpha=self.spec.lr)
        self.step += 1

    def state(self) -> dict[str, Any]:
        return {"step": self.step, "model": self.model.state_dict(),
                "velocity": [v.clone() for v in self.velocity]}

    def fingerprints(self) -> tuple[str | None, str | None]:
        """(parameters, optimizer state): harness.job.fingerprint of each, where they live."""
        params, velocity = fingerprints(tensors_of(self.model), self.velocity)
        return params, velocity

    def reset(self) -> None:
        """Back to the seeded initial weights (a restore before the first checkpoint)."""
        self.load_state(copy.deepcopy(self._initial))

    def load_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        for v, saved in zip(self.velocity, state["velocity"], strict=True):
            v.copy_(saved)
        self.step = int(state["step"])
