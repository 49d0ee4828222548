"""What the FUSE passthrough costs when no fault is active (chaos.fusefs): the built-in
runner's checkpoint save (temp file, fsync, rename, fsync of the directory) and load, in a
folder under the mount against a folder beside it, side by side in one run, rounds
interleaved so that a busy moment of the machine hits both.

    .venv/bin/python bench/fuse_passthrough.py [--rounds 7] [--out bench/results/fuse_passthrough-DATE.json]

Two payloads: the built-in workload's state at its defaults, and a 100 MB state dict (one
float32 tensor of 25M elements). The mount is the harness's own (an io_error applied
through the injector and its ledger, turned off over the control socket): what a trial's
ranks write through between its faults' windows. Needs root (or a user namespace's root) and
FUSE (chaos.fusefs.why_no_fuse).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from chaos.api import Host  # noqa: E402
from chaos.faults import IoError  # noqa: E402
from chaos.fusefs import FusePassthrough, control, control_name, why_no_fuse  # noqa: E402
from chaos.heal import HealReport, heal_run  # noqa: E402
from chaos.inject import NetlinkInjector  # noqa: E402
from chaos.ledger import Ledger  # noqa: E402
from chaos.undo import UNDOS  # noqa: E402
from harness.job.checkpoint import Checkpointer  # noqa: E402
from harness.job.config import WorkloadSpec  # noqa: E402
from harness.job.workload import Workload  # noqa: E402


def payloads() -> dict[str, dict]:
    return {"built-in workload state": Workload(WorkloadSpec(), seed=1, rank=0).state(),
            "100 MB state dict": {"weight": torch.randn(25_000_000)}}


def save_and_load(checkpoints: Checkpointer, step: int, state: dict) -> tuple[float, float]:
    """Seconds of one save and of the load of what it saved."""
    start = time.perf_counter()
    checkpoints.save(step, state)
    saved = time.perf_counter()
    checkpoints.load(step)
    return saved - start, time.perf_counter() - saved


def measure(folders: dict[str, Path], rounds: int) -> dict[str, dict[str, dict[str, list[float]]]]:
    """Per payload, per folder, per operation: the seconds of each round."""
    found: dict[str, dict[str, dict[str, list[float]]]] = {}
    for name, state in payloads().items():
        per = found.setdefault(name, {})
        for step in range(1, rounds + 1):
            for where, folder in folders.items():  # interleaved: a busy moment hits both
                checkpoints = Checkpointer(folder / name.replace(" ", "-"), keep=2)
                times = per.setdefault(where, {"save": [], "load": []})
                save_s, load_s = save_and_load(checkpoints, step, state)
                times["save"].append(save_s)
                times["load"].append(load_s)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path,
                        default=REPO / "bench" / "results" / f"fuse_passthrough-{datetime.date.today()}.json")
    args = parser.parse_args()
    reason = why_no_fuse()
    if reason or os.geteuid() != 0:
        sys.exit(f"fuse_passthrough: {reason or 'needs root'}")
    with tempfile.TemporaryDirectory(prefix="chaos-bench-fuse-") as scratch:
        os.environ.setdefault("CHAOS_STATE_DIR", str(Path(scratch) / "state"))
        direct, mounted = Path(scratch, "direct"), Path(scratch, "through-fuse")
        direct.mkdir()
        mounted.mkdir()
        ledger = Ledger(f"bench-fuse-{os.getpid()}")
        host = Host("r000", "10.0.0.1", None, None, None, storage=str(mounted))
        injection = NetlinkInjector(ledger, {"io_error": FusePassthrough()}).apply(IoError(), [host])
        try:
            control(control_name(ledger.run_id, os.path.realpath(mounted)), "off")
            found = measure({"direct": direct, "through the FUSE passthrough": mounted}, args.rounds)
        finally:
            injection.revert()
            heal_run(ledger.run_id, HealReport(), UNDOS)
    result = {"date": str(datetime.date.today()), "rounds": args.rounds, "cpus": os.cpu_count(),
              "command": f"bench/fuse_passthrough.py --rounds {args.rounds}", "seconds": found}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for name, per in found.items():
        for op in ("save", "load"):
            direct_s = statistics.median(per["direct"][op])
            fuse_s = statistics.median(per["through the FUSE passthrough"][op])
            print(f"{name}: {op}: direct {direct_s * 1000:.1f} ms, through FUSE {fuse_s * 1000:.1f} ms "
                  f"({fuse_s / direct_s:.2f}x), medians of {args.rounds}")
    print(f"fuse_passthrough: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
