"""What a bounded store call costs against torch's own, side by side in one run.

    .venv/bin/python bench/store_calls.py [--calls 2000] [--out FILE]

A TCPStore server in this process on loopback; one client of torch's own and one
`harness.job.store.DeadlineStore` (each call on a thread of its own, waited for in slices)
make the same calls in turn: `add(key, 0)` (what group rank 0 makes each step to read the
rejoin requests), `get`, `set`, and a `compare_set`. Prints per call kind the median and
95th percentile of each, and the bounded one's median over torch's: the price of a call
that can never block past its deadline. Against a training step of ~250 ms it is what one
call a step adds.
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

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness.job.store import DeadlineStore  # noqa: E402

CALLS = {"add": lambda s: s.add("n", 0), "get": lambda s: s.get("k"), "set": lambda s: s.set("k", "v"),
         "compare_set": lambda s: s.compare_set("c", "x", "y")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(fn, store, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(store)
        out.append((time.perf_counter() - start) * 1e6)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--out", type=Path, help="also write the figures here, as JSON")
    args = parser.parse_args()
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    server.set("k", "v")
    plain = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    bounded = DeadlineStore(("127.0.0.1", port), 10.0, 5.0)
    bounded.get("k")  # its connection, opened before the timing
    rows = []
    print(f"{args.calls} calls each, loopback; microseconds")
    print(f"{'call':<12} {'torch median':>12} {'p95':>8} {'bounded median':>15} {'p95':>8} {'ratio':>6}")
    for name, fn in CALLS.items():
        a, b = [], []
        for _ in range(4):  # interleaved, so that a slow moment of the machine falls on both
            a += timed(fn, plain, args.calls // 4)
            b += timed(fn, bounded, args.calls // 4)
        row = {"call": name, "torch_median_us": statistics.median(a),
               "torch_p95_us": statistics.quantiles(a, n=20)[-1],
               "bounded_median_us": statistics.median(b), "bounded_p95_us": statistics.quantiles(b, n=20)[-1]}
        row["ratio"] = row["bounded_median_us"] / row["torch_median_us"]
        rows.append(row)
        print(f"{name:<12} {row['torch_median_us']:>12.0f} {row['torch_p95_us']:>8.0f} "
              f"{row['bounded_median_us']:>15.0f} {row['bounded_p95_us']:>8.0f} {row['ratio']:>5.1f}x")
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent).stdout.strip()
        args.out.write_text(json.dumps({
            "command": " ".join(["bench/store_calls.py", *sys.argv[1:]]), "date": time.strftime("%Y-%m-%d"),
            "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
            "torch": torch.__version__, "commit": commit, "calls": args.calls, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
