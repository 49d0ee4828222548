"""A rank made slow: a SIGSTOP/SIGCONT duty cycle of its process tree (the `slow` fault,
chaos.inject.DutyCycle), as cpulimit does, from a helper process of its own.

    python -m chaos.dutycycle --pid P --started T --share 0.25 --period 0.1 --run-id R

Each period the tree runs for `share` of it and is stopped for the rest; the tree is read
again every period (a child born meanwhile is slowed too). On SIGTERM (the fault's revert,
a heal) the helper continues the whole tree before it exits, so a rank is never left
stopped by it; should the helper itself be SIGKILLed, the ledger's `sigcont` entries the
mechanism recorded before it started continue the rank. Kept light: no torch, no harness.
"""
from __future__ import annotations

import argparse
import signal
import sys
import time

from chaos import proc

READY = "dutycycle ready"


def tree(pid: int, started: int | None) -> list[tuple[int, int | None]]:
    """The rank's process and its descendants, each with its start time (pid reuse)."""
    return [(pid, started), *proc.descendants(pid)]


def signal_all(members: list[tuple[int, int | None]], signum: int) -> None:
    for pid, started in members:
        proc.send_signal(pid, signum, started, gone_ok=True)


def run(pid: int, started: int | None, share: float, period: float) -> None:
    """Until SIGTERM or the rank is gone; returns with the tree continued."""
    stopping = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    members = tree(pid, started)
    try:
        while not stopping and proc.start_time(pid) == started:
            signal_all(members, signal.SIGCONT)
            time.sleep(share * period)
            if stopping:
                break
            members = tree(pid, started)
            signal_all(members, signal.SIGSTOP)
            time.sleep((1.0 - share) * period)
    finally:
        signal_all(tree(pid, started) if proc.start_time(pid) == started else members, signal.SIGCONT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.dutycycle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--started", type=int, required=True, help="the rank's start time (/proc/PID/stat)")
    parser.add_argument("--share", type=float, required=True, help="the CPU share left to the rank, 0..1")
    parser.add_argument("--period", type=float, default=0.1, help="seconds")
    parser.add_argument("--run-id", required=True, help="the run this helper belongs to (for heal)")
    args = parser.parse_args(argv)
    print(f"{READY} pid={args.pid}", flush=True)
    sys.stdout = open("/dev/null", "w")  # the harness stops reading; it may be dead
    run(args.pid, args.started, args.share, args.period)
    return 0


if __name__ == "__main__":
    sys.exit(main())
