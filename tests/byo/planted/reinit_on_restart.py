"""A DDP script with a planted defect, for the state checker to catch (tests/byo/test_state_user_job.py).

Like examples/train_ddp.py: SGD with momentum, rank 0 saves model, optimizer and step
every --checkpoint-every steps, every rank loads it at start. Rank --fail-rank exits with
an error once, after step --fail-at (a marker file says it did), so torchrun restarts the
workers; on that restart rank --reinit-rank takes only the step from the checkpoint and
trains on from fresh weights of another seed and a fresh optimizer. DDP's constructor sends
rank 0's weights to every rank, which repairs the weights: not the momentum it lost.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=16)
parser.add_argument("--checkpoint", required=True)
parser.add_argument("--checkpoint-every", type=int, default=5)
parser.add_argument("--fail-at", type=int, default=12)
parser.add_argument("--fail-rank", type=int, default=1)
parser.add_argument("--reinit-rank", type=int, default=3)
parser.add_argument("--marker", required=True)
args = parser.parse_args()

restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
restarted = restart > 0
# Each attempt under its own prefix: with one agent, torch 2.13's restarted workers read
# the gloo addresses the failed attempt's workers left in the agent's store (connection refused).
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{restart}", store),
                        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
rank = dist.get_rank()
torch.manual_seed(rank + 100 if restarted and rank == args.reinit_rank else 0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
step = 0
if os.path.exists(args.checkpoint):
    state = torch.load(args.checkpoint)
    step = state["step"]
    if not (restarted and rank == args.reinit_rank):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
ddp = DistributedDataParallel(model)
data = torch.Generator().manual_seed(rank)
while step < args.steps:
    x = torch.randn(8, 16, generator=data)
    loss = nn.functional.cross_entropy(ddp(x), torch.randint(0, 4, (8,), generator=data))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
    if rank == 0 and step % args.checkpoint_every == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                   args.checkpoint + ".tmp")
        os.replace(args.checkpoint + ".tmp", args.checkpoint)
    dist.barrier()  # the checkpoint is on disk before any rank can fail past it
    if step == args.fail_at and rank == args.fail_rank and not os.path.exists(args.marker):
        open(args.marker, "w").close()
        sys.exit(1)
dist.barrier()
# DDP released before the group, as in sharded.py: holding it, a worker's exit aborted in gloo
# ("terminate called without an active exception") once in CI, and the restarted job failed
del ddp, optimizer, model
gc.collect()
dist.destroy_process_group()
