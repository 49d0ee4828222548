"""A small DDP training script under NVIDIA's in-process restart, for `chaos run`.

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python examples/train_inprocess.py &
    RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python examples/train_inprocess.py
    chaos run scenarios/frameworks_kill.yaml --policy nvrx_inprocess                 # under faults

Written the way nvidia-resiliency-ext's basic example writes it: the whole training function
is wrapped in `inprocess.Wrapper`, one process per rank (no torchrun: the Wrapper restarts
inside the process, and a launcher would end every local worker with the failed one). When
any rank fails (an exception, a rank that stops answering its heartbeats or dies), every
surviving process aborts its process group and calls the function again: the Wrapper gives
it a new rank and world size (the ranks left, shifted down) in RANK and WORLD_SIZE, and the
function makes a new process group on a store of its own for that iteration
(MASTER_PORT + 2 + iteration; the Wrapper's own store is MASTER_PORT + 1) and resumes from
the last checkpoint: the model, the optimizer, the LR scheduler and the step, saved every
`--checkpoint-every` steps by rank 0 (a temporary file renamed into place, inside the
Wrapper's `atomic()` so that a restart never lands in the middle of it). CPU and gloo unless
there are GPUs. The harness measures it from outside: it changes nothing here.
"""
# no `from __future__ import annotations`: the Wrapper finds its CallWrapper parameter by the
# annotation's type

import argparse
import datetime
import logging
import os
import time
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from nvidia_resiliency_ext import inprocess


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000, help="stop after this many steps")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--step-period", type=float, default=0.25, help="seconds each step pauses after its update")
    parser.add_argument("--timeout", type=float, default=10.0, help="the process group's timeout in seconds")
    parser.add_argument("--checkpoint", default="checkpoint.pt", help="checkpoint file (shared by every rank)")
    parser.add_argument("--checkpoint-every", type=int, default=5)
    return parser.parse_args()


@inprocess.Wrapper(
    store_kwargs={"port": int(os.environ.get("MASTER_PORT", "29500")) + 1},
    health_check=inprocess.health_check.CudaHealthCheck() if torch.cuda.is_available() else None,
)
def train(args: argparse.Namespace, call_wrapper: Optional[inprocess.CallWrapper] = None) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])  # this iteration's
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    store = dist.TCPStore(host_name=os.environ["MASTER_ADDR"],
                          port=int(os.environ["MASTER_PORT"]) + 2 + call_wrapper.iteration,
                          world_size=world, is_master=rank == 0, multi_tenant=True, wait_for_workers=True,
                          use_libuv=True)
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.9)
    step = 0
    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["lr_scheduler"])
        step = state["step"]
        print(f"rank {rank}: iteration {call_wrapper.iteration} resumed from {args.checkpoint} at step {step} "
              f"in a world of {world}", flush=True)
    ddp = nn.parallel.DistributedDataParallel(model)

    while step < args.steps:
        # the data position is the step: batch `step` of a stream each rank draws from its seed
        generator = torch.Generator().manual_seed(step * 1000 + rank)
        inputs = torch.randn(args.batch, 64, generator=generator).to(device)
        labels = torch.randint(0, 10, (args.batch,), generator=generator).to(device)
        loss = nn.functional.cross_entropy(ddp(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        step += 1
        if rank == 0:
            print(f"step {step} world {world} loss {loss.item():.4f}", flush=True)
            if step % args.checkpoint_every == 0:
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                         "lr_scheduler": scheduler.state_dict(), "step": step}
                with call_wrapper.atomic():
                    torch.save(state, args.checkpoint + ".tmp")
                    os.replace(args.checkpoint + ".tmp", args.checkpoint)
        time.sleep(args.step_period)


if __name__ == "__main__":
    # the Wrapper says what it does through logging: configured before it runs
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    train(parse_args())
