"""A DDP script with a planted defect, for `chaos explore` to find (docs/explore.md,
"Planted defects"; tests/run/planted/save_in_place.yaml): examples/train_ddp.py as a user
writes it first, saving with `torch.save` straight to the final path and resuming from
whatever is there. A kill of the saving host during a save leaves a half-written file; the
workers torchrun restarts fail to load it (or, where the torn file still loads, resume from
a state that was never whole).

Rank 0 saves model, optimizer and step every --checkpoint-every steps, with --pad-mb of
other state (a larger model's: the data loader's, an EMA copy) so that a save lasts long
enough for a kill to land inside it. Everything comes from torchrun's environment.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1_000_000)
parser.add_argument("--step-period", type=float, default=0.25)
parser.add_argument("--timeout", type=float, default=None, help="training collectives' timeout in seconds")
parser.add_argument("--checkpoint", required=True)
parser.add_argument("--checkpoint-every", type=int, default=4)
parser.add_argument("--pad-mb", type=int, default=128, help="other state saved beside the model, in MiB")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
pad = torch.zeros(args.pad_mb * 2**18) if rank == 0 else None  # float32: 4 bytes each
step = 0
if os.path.exists(args.checkpoint):  # the defect's other half: whatever the file holds
    state = torch.load(args.checkpoint)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    step = state["step"]
    print(f"rank {rank}: resumed from {args.checkpoint} at step {step}", flush=True)
group = None
if args.timeout is not None:  # as train_ddp.py: made with every rank present, so it bounds training only
    dist.barrier()
    group = dist.new_group(timeout=datetime.timedelta(seconds=args.timeout))
    dist.barrier()
ddp = DistributedDataParallel(model, process_group=group)
generator = torch.Generator().manual_seed(rank)
while step < args.steps:
    started = time.monotonic()
    inputs = torch.randn(32, 64, generator=generator)
    labels = torch.randint(0, 10, (32,), generator=generator)
    loss = nn.functional.cross_entropy(ddp(inputs), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
    if rank == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
        if step % args.checkpoint_every == 0:
            # the defect: straight to the final path (train_ddp.py writes a temp file and renames it)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                        "pad": pad}, args.checkpoint)
    time.sleep(max(0.0, args.step_period - (time.monotonic() - started)))
dist.barrier()
del ddp
gc.collect()
dist.destroy_process_group()
