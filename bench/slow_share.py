"""The `slow` fault's CPU share, asked against measured, in one run: a process that would
use a whole CPU, slowed to each share in turn by each mechanism this user has side by side
(the duty cycle, chaos.inject.DutyCycle, anyone's; the cgroup CPU quota, chaos.cgroup,
root's), its CPU time read from /proc beside the share it gets unslowed on this machine.

    .venv/bin/python bench/slow_share.py [--shares 10 25 50 75] [--period 0.1] [--seconds 3]
        [--out bench/results/slow_share-DATE.json]

No root needed (then the duty cycle alone). The measurement and the bar are `chaos calibrate --kind slow`'s
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

from chaos import cgroup
from chaos.calibrate_slow import busy_process, measure_share
from chaos.faults import Slow
from chaos.inject import DutyCycle, NetlinkInjector
from chaos.ledger import Ledger
from chaos.mechanism import Mechanism


def mechanisms() -> dict[str, Mechanism]:
    """The duty cycle, and the cgroup quota where this user may write the cgroup files."""
    hierarchy = cgroup.cpu_hierarchy() if cgroup.why_no_cpu_cap() is None else None
    return {"duty cycle": DutyCycle(), **({"cgroup quota": cgroup.CfsQuota(hierarchy, DutyCycle())} if hierarchy else {})}


def measure(percent: int, period: float, seconds: float, label: str, mechanism: Mechanism) -> dict:
    run_id = f"slowbench{os.getpid()}{percent}{label[0]}"
    ledger = Ledger(run_id)
    with busy_process(run_id, ledger) as (_, host):
        got = measure_share(NetlinkInjector(ledger, {"slow": mechanism}), host,
                            Slow(cpu_percent=f"{percent}%", period=period), seconds)
    return {"mechanism": label, "asked": got.asked, "measured": round(got.slowed, 4), "free": round(got.free, 4),
            "within": {True: "yes", False: "no", None: "not judged"}[got.ok]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shares", type=int, nargs="+", default=[10, 25, 50, 75])
    parser.add_argument("--period", type=float, default=0.1)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    os.environ.setdefault("CHAOS_STATE_DIR", tempfile.mkdtemp(prefix="slowbench-"))
    # per share, each mechanism in turn: a busy moment of the machine falls on both
    rows = [measure(p, args.period, args.seconds, label, mechanism)
            for p in args.shares for label, mechanism in mechanisms().items()]
    print(f"{'mechanism':>13} {'asked':>6} {'measured':>9} {'free':>6} {'within 5 points':>16}")
    for r in rows:
        print(f"{r['mechanism']:>13} {r['asked']:6.0%} {r['measured']:9.1%} {r['free']:6.1%} {r['within']:>16}")
    if args.out:
        args.out.write_text(json.dumps({"date": datetime.date.today().isoformat(), "period_s": args.period,
                                        "seconds": args.seconds, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
