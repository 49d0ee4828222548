"""The dead-man switch: reverts a disruptive fault even when the harness is dead.

`NetlinkInjector.apply(fault, hosts, revert_after=S)` starts, for a link down, blackhole
or partition, this process in its own session:

    python -m chaos.deadman --run-id R --state-dir D --at T --entries 3,4,5

It sleeps until T on the machine's monotonic clock (S seconds after the apply), then
undoes those ledger entries that are still outstanding, last first, through the same undo
table a revert or a heal runs: the fault library's own (`chaos.undo.UNDOS`; the injector
arms it only for entries of that table). A normal revert kills it first (its own ledger
entry is the fault's last), so it only acts when nobody else did.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from chaos.ledger import Ledger
from chaos.undo import UNDOS

DEAD_MAN_READY = "dead-man switch armed"  # printed once armed; the injector waits for it


def fire(ledger: Ledger, entry_ids: set[int]) -> int:
    """Undo the outstanding entries among `entry_ids`, last first; returns how many."""
    undone = 0
    for entry in ledger.outstanding():
        if entry.id in entry_ids:
            UNDOS.revert(entry, ledger)
            undone += 1
    return undone


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.deadman", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--at", required=True, type=float, help="time.monotonic() of the revert")
    parser.add_argument("--entries", required=True, help="ledger entry ids, comma-separated")
    args = parser.parse_args(argv)
    entry_ids = {int(i) for i in args.entries.split(",") if i}
    print(f"{DEAD_MAN_READY} pid={os.getpid()}", flush=True)
    sys.stdout = open(os.devnull, "w")  # the harness stops reading; it may be dead
    time.sleep(max(0.0, args.at - time.monotonic()))
    fire(Ledger(args.run_id, args.state_dir), entry_ids)
    return 0


if __name__ == "__main__":
    sys.exit(main())
