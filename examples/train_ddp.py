"""A small DDP training script written the way users write them, for `chaos run` to test.

    torchrun --nproc-per-node 2 examples/train_ddp.py --steps 200     # on its own
    chaos run scenarios/byo_link_down.yaml                            # under faults

Everything comes from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT). CUDA and NCCL when there are GPUs, CPU and gloo otherwise. The model, its
optimizer and the step are saved every `--checkpoint-every` steps (rank 0) and loaded at
start, so a restarted job resumes. `--save` says how, from the way most scripts do it to
the way that survives a crash of the node's storage (scenarios/lose_unsynced.yaml):
`direct` (torch.save straight to the final path: a kill mid-save tears it), `rename` (the
default, "atomic" as Lightning's: a temporary file renamed into place, nothing fsynced, so
a crash that loses unsynced writes leaves the renamed file empty) and `durable` (the
temporary file fsynced, renamed, and the folder fsynced: the rename and its data survive
the crash). With `--save-on-sigterm` a SIGTERM (a Slurm preemption, a time limit,
scancel) also saves at the end of the step every rank is in, then exits 0, so the requeued
job loses no step. `--timeout` bounds the training collectives
and `--init-timeout` the start-up, each PyTorch's default (30 min for gloo) unless given:
interpreters importing torch on a busy host reach `init_process_group` tens of seconds
apart, so a timeout fit for training would end a slow start. The harness measures it from
outside: it changes nothing here.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000, help="stop after this many steps")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--step-period", type=float, default=0.25, help="seconds each step pauses after its update (pacing)")
    parser.add_argument("--timeout", type=float, default=None, help="training collectives' timeout in seconds")
    parser.add_argument("--init-timeout", type=float, default=None,
                        help="seconds for every rank to reach init_process_group")
    parser.add_argument("--checkpoint", default="checkpoint.pt", help="checkpoint file (shared by every rank)")
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--save", choices=SAVES, default="rename",
                        help="how a checkpoint is written: " + "; ".join(f"{k}: {v}" for k, v in SAVES.items()))
    parser.add_argument("--save-on-sigterm", action="store_true",
                        help="on SIGTERM, save a checkpoint at the end of the current step and exit 0")
    return parser.parse_args()


def seconds(value: float | None) -> datetime.timedelta | None:
    return None if value is None else datetime.timedelta(seconds=value)


SAVES = {"direct": "torch.save to the final path",
         "rename": "to a temporary file, then renamed into place (no fsync)",
         "durable": "to a temporary file, fsynced, renamed, the folder fsynced"}


def save(how: str, path: str, model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
    if how == "direct":
        torch.save(state, path)
        return
    partial = path + ".tmp"
    torch.save(state, partial)
    if how == "durable":
        fsync(partial)
    os.replace(partial, path)
    if how == "durable":  # the rename itself is durable only once the folder is
        fsync(os.path.dirname(os.path.abspath(path)))


def fsync(path: str) -> None:
    """Make what was written to a file (or a folder's entries) durable: Linux flushes the
    file's data on an fsync through any descriptor of it."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def main() -> None:
    args = parse_args()
    terminated = torch.zeros(1)
    if args.save_on_sigterm:
        # Only a flag here: the step in flight finishes, then every rank agrees (below) on
        # the step to stop at, since Slurm's SIGTERM reaches the ranks at slightly different times
        signal.signal(signal.SIGTERM, lambda signum, frame: terminated.fill_(1))
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ["LOCAL_RANK"])
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", timeout=seconds(args.init_timeout))
    rank = dist.get_rank()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = 0
    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        print(f"rank {rank}: resumed from {args.checkpoint} at step {step}", flush=True)
    training_group = None
    if args.timeout is not None:
        # Made, and first used by DDP, with every rank present: the short timeout bounds
        # training, never a rank that is still starting.
        dist.barrier()
        training_group = dist.new_group(timeout=seconds(args.timeout))
        dist.barrier()
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None, process_group=training_group)
    generator = torch.Generator().manual_seed(rank)

    while step < args.steps:
        inputs = torch.randn(args.batch, 64, generator=generator).to(device)
        labels = torch.randint(0, 10, (args.batch,), generator=generator).to(device)
        loss = nn.functional.cross_entropy(ddp(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        stop = False
        if args.save_on_sigterm:
            told = terminated.clone().to(device)
            dist.all_reduce(told, op=dist.ReduceOp.MAX, group=training_group)
            stop = bool(told.item())
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
            if step % args.checkpoint_every == 0 or stop:
                save(args.save, args.checkpoint, model, optimizer, step)
        if stop:
            print(f"rank {rank}: SIGTERM at step {step}: saved, exiting", flush=True)
            break
        # every rank pauses alike once the all-reduce has released them all: pacing to a
        # period from its own start would keep a rank that started late late for good,
        # and its peers waiting for it in every step (a straggler no fault made)
        time.sleep(args.step_period)
    # Every rank finishes its last collective before any tears down: a rank whose peer
    # closed the connection mid-teardown can abort in gloo's destructor.
    dist.barrier()
    # DDP holds the training group: released before the groups go, or its destructor runs
    # against a destroyed group at exit and can abort in gloo
    del ddp
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
