"""What a rank is told to do, as values: the training workload and the whole rank config.

Pydantic only (no torch): the harness builds these in its own process (the scenario loader,
the orchestrator, `chaos run --dry-run`), and a rank reads its RankConfig back from JSON.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from chaos.faults import Seconds
from harness.job.policies import PolicySpec


class WorkloadSpec(BaseModel):
    """The training job (harness.job.workload): a small MLP paced to `step_period`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step_period: Seconds = 0.25
    batch: Annotated[int, Field(ge=1)] = 32
    features: Annotated[int, Field(ge=1)] = 64
    hidden: Annotated[int, Field(ge=1)] = 256
    classes: Annotated[int, Field(ge=2)] = 10
    checkpoint_every: Annotated[int, Field(ge=1)] = 10
    lr: Annotated[float, Field(gt=0)] = 0.05
    momentum: Annotated[float, Field(ge=0, lt=1)] = 0.9
    state_every: Annotated[int, Field(ge=1)] = Field(
        default=1, description="record a fingerprint of every rank's state (a `state` event) every "
                               "this many steps, and at every restore (reports.state checks them)")
    gloo_lazy_init: bool = Field(
        default=False, description="gloo connects a pair of ranks when a collective first needs "
                                   "it, not every pair while a group forms (TORCH_GLOO_LAZY_INIT=1)")

    @property
    def gradient_bytes(self) -> int:
        """What one step all-reduces: every parameter of the MLP (three linear layers with
        biases), float32."""
        f, h, c = self.features, self.hidden, self.classes
        return 4 * ((f + 1) * h + (h + 1) * h + (h + 1) * c)


class RankConfig(BaseModel):
    """Everything a rank needs, passed as JSON from the harness (any backend)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int
    world_size: int
    seed: int
    store_address: str
    store_port: int
    events_path: str
    checkpoint_dir: str
    policy: PolicySpec
    workload: WorkloadSpec
    max_steps: int | None = None
    store_timeout_s: float = 60.0
    ifname: str = "eth0"  # the host's link: gloo binds here, not to whatever the hostname resolves to
    device: Literal["cpu", "cuda"] = "cpu"  # harness.job.device: model, batches and all-reduce live here
    comm: Literal["gloo", "nccl"] = "gloo"
    env: dict[str, str] = {}  # set in the rank's process before CUDA initialises (harness.job.device.rank_env)
