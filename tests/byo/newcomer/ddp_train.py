"""A plain DDP training script as a newcomer writes it (tests/byo/test_newcomer_walk.py runs
`chaos init` and `chaos run` on it as the README says): its flags are its own (`--ckpt`,
not `--checkpoint`), rank 0 saves the checkpoint to a temporary file and renames it into
place, every rank resumes from it at start, and it ends the way torch's gloo needs (below)."""
import argparse
import datetime
import gc
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--ckpt", default="ck.pt")
    parser.add_argument("--sleep", type=float, default=0.1)
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    if os.path.exists(args.ckpt):
        state = torch.load(args.ckpt)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        print(f"rank {rank}: resumed at step {step}", flush=True)
    while step < args.steps:
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if rank == 0 and step % 10 == 0:
            partial = args.ckpt + ".tmp"
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                       partial)
            os.replace(partial, args.ckpt)
        time.sleep(args.sleep)
    dist.barrier()
    # DDP released before its group, as the examples do: destroyed at exit after the group,
    # a rank aborted in gloo ("terminate called without an active exception", SIGABRT) once
    # in about 150 runs on a loaded machine, and once in CI
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
