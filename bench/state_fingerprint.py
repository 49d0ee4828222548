"""What a state fingerprint (harness.job.fingerprint) costs a training step, side by side.

    .venv/bin/python bench/state_fingerprint.py [--ranks 16] [--steps 100] [--device cuda] [--out FILE.json]

`--ranks` real ranks on loopback (default 16, as the harness's job), one gloo group, each
step a real all-reduce. Per workload, interleaved
in every rank (a step without, a step with, ...) so that the machine's speed moves both
alike: the median over ranks and steps of a training step alone (off), of the step and its
state event's fingerprints (on: parameters and optimizer state, as the runner and the step
hook record them), of the fingerprints alone, and that as a share of the step without
them. (The difference between on and off is within the noise of ranks sharing two cores.)
`--device cuda`: models, batches and the fingerprints on the GPU (rank r on GPU r % count;
gloo carries the CUDA tensors), each step synchronised before it is timed.

  builtin     harness.job.workload at its defaults (the MLP every scenario trains)
  train_ddp   examples/train_ddp.py's model under DistributedDataParallel with torch.optim.SGD
  large       a 4.2M-parameter MLP under DistributedDataParallel with Adam (a tenth of the steps)

Prints one table and writes the figures, the machine line and the command as JSON (--out).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.job.config import WorkloadSpec  # noqa: E402
from harness.job.fingerprint import fingerprints, optimizer_tensors, tensors_of  # noqa: E402
from harness.job.workload import Workload  # noqa: E402


Pair = tuple[Callable[[], None], Callable[[], None]]  # (one training step, its fingerprints)
DEVICE = torch.device("cpu")  # the rank's (rank_main)


def synchronize() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def builtin(rank: int, world: int) -> Pair:
    workload = Workload(WorkloadSpec(), seed=1, rank=rank, device=DEVICE)

    def reduce(flat: torch.Tensor) -> None:
        dist.all_reduce(flat)

    return (lambda: workload.train_step(reduce, world)), (lambda: workload.fingerprints())


def with_ddp(model: torch.nn.Module, optimizer: torch.optim.Optimizer, features: int, classes: int,
             batch: int, rank: int) -> Pair:
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    data = torch.Generator().manual_seed(rank)

    def step() -> None:
        x = torch.randn(batch, features, generator=data).to(DEVICE)
        labels = torch.randint(0, classes, (batch,), generator=data).to(DEVICE)
        loss = torch.nn.functional.cross_entropy(ddp(x), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        synchronize()

    return step, lambda: fingerprints(tensors_of(optimizer), optimizer_tensors(optimizer))


def train_ddp(rank: int, world: int) -> Pair:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(DEVICE)
    return with_ddp(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), 64, 10, 32, rank)


def large(rank: int, world: int) -> Pair:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 1024)).to(DEVICE)
    return with_ddp(model, torch.optim.Adam(model.parameters(), lr=1e-4), 1024, 1024, 32, rank)


WORKLOADS: dict[str, tuple[Callable[[int, int], Pair], int]] = {  # name -> (make, steps divisor)
    "builtin": (builtin, 1), "train_ddp": (train_ddp, 1), "large": (large, 10)}


def pairs(make: Callable[[int, int], Pair], rank: int, world: int, steps: int
          ) -> tuple[list[float], list[float], list[float]]:
    """Seconds of `steps` steps without and with the fingerprints, interleaved, and of the
    fingerprints alone (inside the steps with them)."""
    step, fingerprints = make(rank, world)
    for _ in range(3):  # warm: allocator, optimizer state, gloo's pairs
        step()
        fingerprints()
    plain, with_state, alone = [], [], []
    for _ in range(steps):
        started = time.perf_counter()
        step()
        plain.append(time.perf_counter() - started)
        started = time.perf_counter()
        step()
        stepped = time.perf_counter()
        fingerprints()
        ended = time.perf_counter()
        with_state.append(ended - started)
        alone.append(ended - stepped)
    return plain, with_state, alone


def rank_main(rank: int, world: int, port: int, steps: int, device: str) -> None:
    """One rank: every workload, one JSON line of its seconds on stdout."""
    global DEVICE
    if device == "cuda":
        DEVICE = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(DEVICE)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)  # as a rank runs
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    out = {name: pairs(make, rank, world, max(3, steps // divisor)) for name, (make, divisor) in WORKLOADS.items()}
    dist.barrier()
    print(json.dumps(out), flush=True)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=16, help="ranks on loopback (default 16)")
    parser.add_argument("--steps", type=int, default=100, help="step pairs per workload (default 100; large: a tenth)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where models, batches and fingerprints live (default cpu)")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank is not None:
        rank_main(args.rank, args.ranks, args.port, args.steps, args.device)
        return 0
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, args.ranks, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=120))
    ranks = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--ranks", str(args.ranks), "--port",
                               str(port), "--steps", str(args.steps), "--device", args.device], stdout=subprocess.PIPE, text=True)
             for r in range(args.ranks)]
    try:
        outputs = [json.loads(rank.communicate(timeout=1800)[0].strip().splitlines()[-1]) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()
    del store
    figures = {}
    print(f"{'workload':<10} {'step off':>10} {'step on':>10} {'state':>9} {'state/step':>10}  n")
    for name in WORKLOADS:
        off, on, alone = (statistics.median(t for out in outputs for t in out[name][i]) for i in range(3))
        n = sum(len(out[name][0]) for out in outputs)
        figures[name] = {"step_ms": off * 1e3, "step_with_state_ms": on * 1e3, "state_ms": alone * 1e3,
                         "share": alone / off, "n": n}
        f = figures[name]
        print(f"{name:<10} {f['step_ms']:>8.2f}ms {f['step_with_state_ms']:>8.2f}ms {f['state_ms']:>7.3f}ms "
              f"{100 * f['share']:>9.2f}%  {n}")
    machine = f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}"
    if args.device == "cuda":
        machine += f", {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    command = " ".join(["bench/state_fingerprint.py", *(sys.argv[1:] if argv is None else argv)])
    print(f"{args.ranks} ranks on loopback, one thread each, on the {args.device}; medians over ranks and interleaved step pairs; "
          f"machine: {machine}")
    if args.out:
        args.out.write_text(json.dumps({"command": command, "machine": machine, "ranks": args.ranks,
                                        "device": args.device,
                                        "date": time.strftime("%Y-%m-%d"), "figures": figures}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
