"""A small DDP training script written the way NVIDIA's ft_launcher intends, for `chaos run`.

    ft_launcher --nproc-per-node 2 --max-restarts 3 --ft-initial-rank-heartbeat-timeout 60 \
        --ft-rank-heartbeat-timeout 5 examples/train_ft_launcher.py --checkpoint /tmp/ft.pt   # on its own
    chaos run scenarios/frameworks_kill.yaml --policy ft_launcher                          # under faults

ft_launcher is torchrun with a rank monitor beside each worker: the script connects to its
monitor (`RankMonitorClient.init_workload_monitoring`) and sends a heartbeat every step. A
worker whose heartbeat stops for `--ft-rank-heartbeat-timeout` (a hang, a stopped process)
is terminated by its monitor, and the launcher restarts the worker group, every host's, by a
new rendezvous round, as it does when a worker exits. With `--sections` the script times
sections instead (`start_section`/`end_section`): each step, its pause included, is the
section `step`, each save `checkpoint`, and a worker whose section stays open longer than
its `--ft-rank-section-timeouts` entry (or that is outside both longer than
`--ft-rank-out-of-section-timeout`) is terminated. A restarted worker resumes from the
last checkpoint: the model, the optimizer, the LR scheduler, the data position and the step,
saved every `--checkpoint-every` steps by rank 0 (a temporary file renamed into place), with
the monitor's state (the heartbeat intervals it measured). CPU and gloo unless there are
GPUs. The harness measures it from outside: it changes nothing here.
"""
from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from nvidia_resiliency_ext import fault_tolerance
from torch.nn.parallel import DistributedDataParallel


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000, help="stop after this many steps")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--step-period", type=float, default=0.25, help="seconds each step pauses after its update")
    parser.add_argument("--timeout", type=float, default=600.0, help="the process group's timeout in seconds")
    parser.add_argument("--checkpoint", default="checkpoint.pt", help="checkpoint file (shared by every rank)")
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--sections", action="store_true",
                        help="time the sections step and checkpoint instead of sending heartbeats")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ["LOCAL_RANK"])
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    monitor = fault_tolerance.RankMonitorClient()
    monitor.init_workload_monitoring()  # the monitor times the first heartbeat from here
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()

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
        monitor.load_state_dict(state["fault_tolerance"])
        step = state["step"]
        print(f"rank {rank}: resumed from {args.checkpoint} at step {step}", flush=True)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)

    while step < args.steps:
        if args.sections:
            monitor.start_section("step")
        # the data position is the step: batch `step` of a stream each rank draws from its
        # own seed, so a resumed rank takes up the batch after the checkpoint's
        generator = torch.Generator().manual_seed(step * world + rank)
        inputs = torch.randn(args.batch, 64, generator=generator).to(device)
        labels = torch.randint(0, 10, (args.batch,), generator=generator).to(device)
        loss = nn.functional.cross_entropy(ddp(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        step += 1
        if not args.sections:
            monitor.send_heartbeat()
        if rank == 0:
            print(f"step {step} lr {scheduler.get_last_lr()[0]:.5f} loss {loss.item():.4f}", flush=True)
            if step % args.checkpoint_every == 0:
                if args.sections:
                    monitor.start_section("checkpoint")
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                         "lr_scheduler": scheduler.state_dict(), "step": step,
                         "fault_tolerance": monitor.state_dict()}
                torch.save(state, args.checkpoint + ".tmp")
                os.replace(args.checkpoint + ".tmp", args.checkpoint)
                if args.sections:
                    monitor.end_section("checkpoint")
        time.sleep(args.step_period)
        if args.sections:
            monitor.end_section("step")
    dist.barrier()
    monitor.shutdown_workload_monitoring()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
