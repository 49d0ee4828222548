"""Does reading every rank's stacks at a fault's first detection move the times measured
after it? The same scenario and policy with `stacks_at_detect` off and on, alternating
(the order flips every round, so the machine's speed moves both alike), side by side.

    sudo .venv/bin/python bench/stacks_at_detect.py [--scenario scenarios/elastic_kill.yaml]
        [--policy elastic] [--repeat 3] [--out FILE.json]

The default is the fastest recovery the shipped scenarios measure (a kill under the elastic
policy: the failure detector suspects within a digest, the survivors form a new group about
a second later), so the capture (py-spy `--nonblocking` of all 16 processes) runs while the
recovery being timed is under way. Prints per setting the median (min-max) of the time to
detect, to recover (or to release, for a policy that ends the job) and of the capture, the
ratios on / off, and writes them as JSON with the machine line and the command (--out).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parent.parent
FIGURES = ("ttd_s", "ttr_s", "released_s")


def one_trial(scenario: dict, policy: str, on: bool, folder: Path) -> dict[str, float]:
    """One run of `policy` with the capture on or off: its figures and the capture's seconds."""
    path = folder / f"{scenario['name']}-{'on' if on else 'off'}.yaml"
    path.write_text(yaml.safe_dump({**scenario, "stacks_at_detect": on}, sort_keys=False))
    out = folder / "runs"
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(path), "--policy", policy,
                           "--out", str(out), "--quiet"], cwd=REPO, capture_output=True, text=True, timeout=900)
    run = max(out.glob(f"{scenario['name']}-*"), key=lambda p: p.stat().st_mtime)
    row = pd.read_csv(run / "metrics.csv").iloc[0]
    events = [json.loads(line) for line in (run / "trials" / policy / "events.jsonl").read_text().splitlines()]
    captures = [e["secs"] for e in events if e.get("kind") == "stacks_captured" and e.get("reason") == "detect"]
    got = {name: float(row[name]) for name in FIGURES if name in row}
    got["capture_s"] = captures[0] if captures else math.nan
    got["outcome"] = str(row["outcome"])
    got["exit"] = done.returncode
    return got


def summary(values: list[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "n/a"
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def median(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", type=Path, default=REPO / "scenarios" / "elastic_kill.yaml")
    parser.add_argument("--policy", default="elastic")
    parser.add_argument("--repeat", type=int, default=3, help="trials per setting (default 3)")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    scenario = yaml.safe_load(args.scenario.read_text())
    scenario.pop("expect", None)  # a measurement, not a check
    trials: dict[bool, list[dict]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="chaos-bench-stacks-") as tmp:
        for round_ in range(args.repeat):
            for on in ((False, True) if round_ % 2 == 0 else (True, False)):
                got = one_trial(scenario, args.policy, on, Path(tmp))
                trials[on].append(got)
                print(f"round {round_ + 1}/{args.repeat} capture {'on ' if on else 'off'}: "
                      + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in got.items()),
                      flush=True)
    print(f"\n{args.scenario.name} --policy {args.policy}, {args.repeat} trials per setting, alternating")
    print(f"{'figure':<12} {'capture off':>22} {'capture on':>22} {'on / off':>9}")
    figures = {}
    for name in (*FIGURES, "capture_s"):
        off = [t.get(name, math.nan) for t in trials[False]]
        on = [t.get(name, math.nan) for t in trials[True]]
        ratio = median(on) / median(off) if median(off) else math.nan
        figures[name] = {"off": off, "on": on, "ratio": ratio}
        print(f"{name:<12} {summary(off):>22} {summary(on):>22} {ratio:>9.2f}")
    machine = f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs"
    print(f"machine: {machine}; outcomes off {[t['outcome'] for t in trials[False]]}, "
          f"on {[t['outcome'] for t in trials[True]]}")
    if args.out:
        command = " ".join(["bench/stacks_at_detect.py", *(sys.argv[1:] if argv is None else argv)])
        args.out.write_text(json.dumps({"command": command, "machine": machine, "date": time.strftime("%Y-%m-%d"),
                                        "scenario": str(args.scenario), "policy": args.policy,
                                        "trials": {("on" if k else "off"): v for k, v in trials.items()},
                                        "figures": figures}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
