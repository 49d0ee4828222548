"""The `slow` fault's CPU share, asked against measured, in one run: a process that would
use a whole CPU, slowed by the duty cycle (chaos.inject.DutyCycle) to each share in turn,
its CPU time read from /proc beside the share it gets unslowed on this machine.

    .venv/bin/python bench/slow_share.py [--shares 10 25 50 75] [--period 0.1] [--seconds 3]
        [--out bench/results/slow_share-DATE.json]

No root needed. The bar (issue 54): the measured share within 5 points of the one asked,
where the machine leaves the process a whole CPU unslowed.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from chaos.api import Host
from chaos.faults import Slow
from chaos.heal import HealReport, heal_run
from chaos.inject import DutyCycle, NetlinkInjector
from chaos.ledger import Ledger
from chaos.undo import UNDOS

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def share_over(pid: int, seconds: float) -> float:
    used, began = cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_s(pid) - used) / (time.monotonic() - began)


def measure(percent: int, period: float, seconds: float) -> dict:
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    run_id = f"slowbench{os.getpid()}{percent}"
    ledger = Ledger(run_id)
    try:
        free = share_over(child.pid, 1.0)
        injection = NetlinkInjector(ledger, {"slow": DutyCycle()}).apply(
            Slow(cpu_percent=f"{percent}%", period=period), [Host("r000", "10.0.0.1", None, None, None, pid=child.pid)])
        slowed = share_over(child.pid, seconds)
        injection.revert()
        return {"asked": percent / 100, "measured": round(slowed, 4), "free": round(free, 4)}
    finally:
        heal_run(run_id, HealReport(), UNDOS)
        child.kill()
        child.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shares", type=int, nargs="+", default=[10, 25, 50, 75])
    parser.add_argument("--period", type=float, default=0.1)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    os.environ.setdefault("CHAOS_STATE_DIR", tempfile.mkdtemp(prefix="slowbench-"))
    rows = [measure(p, args.period, args.seconds) for p in args.shares]
    print(f"{'asked':>6} {'measured':>9} {'free':>6} {'within 5 points':>16}")
    for r in rows:
        print(f"{r['asked']:6.0%} {r['measured']:9.1%} {r['free']:6.1%} {'yes' if abs(r['measured'] - r['asked']) <= 0.05 else 'no':>16}")
    if args.out:
        args.out.write_text(json.dumps({"date": datetime.date.today().isoformat(), "period_s": args.period,
                                        "seconds": args.seconds, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
