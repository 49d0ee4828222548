"""The `slow` fault's CPU share, asked against measured, in one run: a process that would
use a whole CPU, slowed by the duty cycle (chaos.inject.DutyCycle) to each share in turn,
its CPU time read from /proc beside the share it gets unslowed on this machine.

    .venv/bin/python bench/slow_share.py [--shares 10 25 50 75] [--period 0.1] [--seconds 3]
        [--out bench/results/slow_share-DATE.json]

No root needed. The measurement and the bar are `chaos calibrate --kind slow`'s
(chaos.calibrate_slow): the share of what the process gets unslowed within 5 points of the
one asked, judged where the machine leaves it at least 90% of a CPU unslowed.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path

from chaos.calibrate_slow import busy_process, measure_share
from chaos.faults import Slow
from chaos.ledger import Ledger


def measure(percent: int, period: float, seconds: float) -> dict:
    run_id = f"slowbench{os.getpid()}{percent}"
    with busy_process(run_id, Ledger(run_id)) as (injector, host):
        got = measure_share(injector, host, Slow(cpu_percent=f"{percent}%", period=period), seconds)
    return {"asked": got.asked, "measured": round(got.slowed, 4), "free": round(got.free, 4),
            "within": {True: "yes", False: "no", None: "not judged"}[got.ok]}


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
        print(f"{r['asked']:6.0%} {r['measured']:9.1%} {r['free']:6.1%} {r['within']:>16}")
    if args.out:
        args.out.write_text(json.dumps({"date": datetime.date.today().isoformat(), "period_s": args.period,
                                        "seconds": args.seconds, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
