"""A small torchft training script written the way torchft's documentation intends, for `chaos run`.

    torchft_lighthouse --min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000 --bind '[::]:29510' &
    REPLICA_GROUP_ID=0 NUM_REPLICA_GROUPS=2 TORCHFT_LIGHTHOUSE=http://localhost:29510 \
        torchrun --nnodes 1 --nproc-per-node 1 --master-port 29600 examples/train_torchft.py   # and group 1
    chaos run scenarios/frameworks_kill.yaml                                                 # under faults

Each replica group is one torchrun (its agent hosts the group's TCP store at MASTER_PORT);
the groups find each other through the Lighthouse (TORCHFT_LIGHTHOUSE), which forms a
quorum every step. torchft's Manager runs the quorum, its DistributedDataParallel averages
the gradients across the groups of the quorum, and its Optimizer steps only when the
Manager says the step may commit. A group that joins late, or comes back, is healed live
from a peer: the Manager asks the peer for `state_dict()` over its checkpoint transport
(HTTP here) and calls `load_state_dict()`. That state carries everything a resume needs:
the model, the optimizer, the LR scheduler's step and the data loader's position (epoch
and batches consumed in it). CPU and gloo unless there are GPUs. The harness measures it
from outside (its hook reads torchft's Manager for the step and the participants).
"""
from __future__ import annotations

import argparse
import logging
import os
import time
from datetime import timedelta

import torch
import torch.nn as nn
from torch.utils.data import TensorDataset
from torchft import DistributedDataParallel, DistributedSampler, Manager, Optimizer, ProcessGroupGloo
from torchft.checkpointing.http_transport import HTTPTransport


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000, help="stop after this many committed steps")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--step-period", type=float, default=0.25, help="seconds each step pauses after its update")
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="the process group's and the Manager's timeout in seconds (collectives, commit, heal)")
    parser.add_argument("--quorum-timeout", type=float, default=60.0, help="seconds to wait for a quorum")
    parser.add_argument("--min-replicas", type=int, default=1, help="fewest replica groups a step commits with")
    parser.add_argument("--plant", choices=PLANTED, help="a planted defect, for the harness's state verdict to "
                        "name: " + "; ".join(f"{k}: {v}" for k, v in PLANTED.items()))
    return parser.parse_args()


PLANTED = {"stale_lr_scheduler": "a group that heals from a peer keeps its own LR scheduler (its learning rate "
                                 "schedule restarts)",
           "data_ahead": "the state a peer sends holds its data position one batch ahead of its model"}


class Position:
    """Where the data loader is: its epoch (the sampler's shuffle) and the batches consumed in it."""

    def __init__(self) -> None:
        self.epoch, self.offset = 0, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.offset = state["epoch"], state["offset"]


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO)  # torchft says what its quorums and heals do at INFO
    replica_group = int(os.environ.get("REPLICA_GROUP_ID", "0"))
    replica_groups = int(os.environ.get("NUM_REPLICA_GROUPS", "2"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")

    generator = torch.Generator().manual_seed(0)  # every group sees the same data set
    dataset = TensorDataset(torch.randn(4096, 64, generator=generator), torch.randint(0, 10, (4096,), generator=generator))
    sampler = DistributedSampler(dataset, replica_rank=replica_group, num_replica_groups=replica_groups,
                                 group_rank=int(os.environ.get("RANK", "0")),
                                 num_replicas=int(os.environ.get("WORLD_SIZE", "1")), shuffle=True, seed=0)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    inner = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(inner, step_size=50, gamma=0.9)
    position = Position()

    def state_dict() -> dict[str, object]:
        data = position.state_dict()
        if args.plant == "data_ahead":
            data = {**data, "offset": data["offset"] + 1}
        return {"model": model.state_dict(), "optim": inner.state_dict(),
                "lr_scheduler": scheduler.state_dict(), "data": data}

    def load_state_dict(state: dict[str, object]) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])
        if args.plant != "stale_lr_scheduler":
            scheduler.load_state_dict(state["lr_scheduler"])
        position.load_state_dict(state["data"])

    timeout = timedelta(seconds=args.timeout)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        min_replica_size=args.min_replicas,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"train_torchft_{replica_group}",
        timeout=timeout,
        quorum_timeout=timedelta(seconds=args.quorum_timeout),
        checkpoint_transport=HTTPTransport(timeout=timeout, num_chunks=0),
    )
    ddp = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, inner)
    criterion = nn.CrossEntropyLoss()

    committed: list[bool] = []

    def on_commit(*_: object) -> None:
        """torchft's Optimizer steps the inner one only on a committed step: the schedule and the
        data position (into the next epoch at the end of one) advance with it, so that the state
        is whole at the step's end, when a peer may read it to heal from."""
        committed.append(True)
        scheduler.step()
        position.offset += 1
        if position.offset * args.batch >= len(sampler):
            position.epoch, position.offset = position.epoch + 1, 0
    inner.register_step_post_hook(on_commit)
    while manager.current_step() < args.steps:
        sampler.set_epoch(position.epoch)
        batch = list(sampler)[position.offset * args.batch:(position.offset + 1) * args.batch]
        inputs, labels = dataset[batch]
        committed.clear()
        optimizer.zero_grad()  # starts the step's quorum (a group that must heal loads a peer's state)
        loss = criterion(ddp(inputs.to(device)), labels.to(device))
        loss.backward()
        optimizer.step()  # commits only if every member of the quorum finished the step
        if committed:
            print(f"step {manager.current_step()} participants {manager.num_participants()} "
                  f"lr {scheduler.get_last_lr()[0]:.5f} loss {loss.item():.4f}", flush=True)
        time.sleep(args.step_period)
    manager.shutdown()


if __name__ == "__main__":
    main()
