"""The slurm backend beside the namespace backend, in one run, through the installed `chaos`:
the same scenarios and policies on both, time to detect and to recover side by side, and
the slurm backend's bring-up by phase (allocation, node agents, control plane).

    sudo .venv/bin/python bench/slurm_backend.py [--nodes 16] [--out bench/results/slurm-DATE]
        [--case link_down:timeout --case kill_rank:timeout --case path/to/other.yaml:retry ...]

It starts a local Slurm cluster of `--nodes` nodes (`chaos slurm up`, one rank per node)
and takes it down at the end. The bar (issue 52): the slurm backend detects and recovers
within 10% or 0.3 s of the namespace backend, whichever is larger. Each case prints its
row as it finishes; a case that fails prints why.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHAOS = str(Path(sys.executable).parent / "chaos")
DEFAULT_CASES = ("link_down:timeout", "link_down:retry", "kill_rank:timeout")


def run_case(scenario: str, policy: str, backend: str, out: Path, env: dict[str, str]) -> dict:
    began = time.monotonic()
    path = Path(scenario) if scenario.endswith(".yaml") else REPO / "scenarios" / f"{scenario}.yaml"
    done = subprocess.run([CHAOS, "run", str(path), "--policy", policy,
                           "--backend", backend, "--out", str(out), "--quiet"],
                          capture_output=True, text=True, env=env, timeout=900)
    wall = time.monotonic() - began
    folder = next((line.split(":", 1)[1].strip() for line in done.stdout.splitlines()
                   if line.startswith("run folder:")), None)
    if folder is None:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1], "wall_s": wall}
    with open(Path(folder) / "metrics.csv") as f:
        row = next(csv.DictReader(f))
    events = [json.loads(line) for line in (Path(folder) / "trials" / policy / "events.jsonl").read_text().splitlines()]
    up = next(e for e in events if e["kind"] == "cluster_up")
    return {"ttd_s": float(row["ttd_s"]), "ttr_s": float(row["ttr_s"]), "outcome": row["outcome"],
            "expect_ok": row["expect_ok"], "bringup_s": up["secs"], "phases": up.get("phases", {}),
            "wall_s": wall, "folder": folder}


def within(slurm: float, netns: float) -> str:
    if slurm != slurm or netns != netns:  # NaN: not measured on one side
        return "-"
    bar = max(0.1 * netns, 0.3)
    return "yes" if abs(slurm - netns) <= bar else f"no (bar {bar:.2f} s)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--case", action="append", help="SCENARIO:POLICY (repeatable)")
    parser.add_argument("--out", type=Path,
                        default=REPO / "bench" / "results" / f"slurm-{datetime.date.today().isoformat()}")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    up = subprocess.run([CHAOS, "slurm", "up", "--nodes", str(args.nodes)], capture_output=True, text=True)
    if up.returncode != 0:
        print(f"chaos slurm up failed: {up.stderr.strip()}", file=sys.stderr)
        return 1
    env = {**os.environ, "SLURM_CONF": up.stdout.strip().removeprefix("export SLURM_CONF=")}
    results = []
    try:
        print(f"{'case':24} {'':6} {'detect (s)':>18} {'recover (s)':>18} {'bring-up (s)':>18}  slurm's bring-up")
        for case in args.case or DEFAULT_CASES:
            scenario, policy = case.split(":")
            netns = run_case(scenario, policy, "netns", args.out / "netns", env)
            slurm = run_case(scenario, policy, "slurm", args.out / "slurm", env)
            results.append({"case": case, "netns": netns, "slurm": slurm})
            if "error" in netns or "error" in slurm:
                print(f"{case:24} failed: netns {netns.get('error', 'ok')}; slurm {slurm.get('error', 'ok')}")
                continue
            phases = ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in slurm["phases"].items())
            print(f"{case:24} netns  {netns['ttd_s']:18.2f} {netns['ttr_s']:18.2f} {netns['bringup_s']:18.2f}")
            print(f"{'':24} slurm  {slurm['ttd_s']:18.2f} {slurm['ttr_s']:18.2f} {slurm['bringup_s']:18.2f}  {phases}")
            print(f"{'':24} within {within(slurm['ttd_s'], netns['ttd_s']):>18} "
                  f"{within(slurm['ttr_s'], netns['ttr_s']):>18} {slurm['bringup_s'] / netns['bringup_s']:17.1f}x"
                  f"  outcomes {netns['outcome']} / {slurm['outcome']}")
    finally:
        subprocess.run([CHAOS, "slurm", "down"], capture_output=True, text=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
