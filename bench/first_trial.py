"""From `chaos run` to the first trial's cluster and steps: what a user waits for at the start.

    sudo .venv/bin/python bench/first_trial.py [--runs 3] [--tree DIR]...

Runs `chaos run scenarios/control.yaml --policy timeout --quiet` (as `python -m harness.cli`,
a fresh interpreter each run, the netns backend) `--runs` times per tree, the trees taking
turns, and prints per tree the medians of: the command's start to the trial's start (its
own imports, the scenario, the run folder), the cluster's bring-up (`cluster_up`: hosts,
control plane, the rank launcher ready) with the launcher it got, the command's start to the
cluster up, and to the last rank's first step. `--tree DIR` (repeatable) measures another
checkout too, e.g. the tree before a change (`git worktree add /tmp/before HEAD~1`): its
packages are imported instead of this one's, with this interpreter. A run that fails
prints why.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runfolder.events import CLUSTER_UP, EVENTS_FILE, STEP, read_events
from runfolder.info import read_trial_info
from runfolder.layout import trial_dirs

REPO = Path(__file__).resolve().parent.parent
SCENARIO = REPO / "scenarios" / "control.yaml"
POLICY = "timeout"
RUN_TIMEOUT_S = 300
FIGURES = ("to trial start", "cluster up", "to cluster up", "to every rank's first step")


class RunFailed(Exception):
    """A run that gave no figures; the message says why."""


def measure(tree: Path, out: Path) -> tuple[dict[str, float], str]:
    """The figures of one run of `tree` (seconds from the command's start), and its launcher."""
    env = {**os.environ, "PYTHONPATH": str(tree)}  # the tree's packages before the installed ones
    started = time.time()
    try:
        done = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(SCENARIO), "--policy", POLICY,
                               "--quiet", "--out", str(out)], cwd=tree, env=env, capture_output=True,
                              text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RunFailed(f"chaos run did not end within {RUN_TIMEOUT_S} s") from None
    if done.returncode != 0:
        raise RunFailed(f"chaos run exited {done.returncode}: {(done.stderr or done.stdout)[-500:]}")
    [run_dir] = out.iterdir()
    [trial] = trial_dirs(run_dir)
    info = read_trial_info(trial)
    events, _ = read_events(trial / EVENTS_FILE)
    to_wall = info.wall_anchor - info.mono_anchor - started  # event time -> seconds after the start
    [up] = [e for e in events if e["kind"] == CLUSTER_UP]
    firsts: dict[int, float] = {}
    for e in events:
        if e["kind"] == STEP:
            firsts.setdefault(e["rank"], e["t"])
    if not firsts:
        raise RunFailed("no rank stepped")
    return {"to trial start": info.wall_anchor - started, "cluster up": up["secs"],
            "to cluster up": up["t"] + to_wall,
            "to every rank's first step": max(firsts.values()) + to_wall}, up.get("launcher", "?")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per tree (default 3)")
    parser.add_argument("--tree", type=Path, action="append", default=[],
                        help="another checkout to measure as well, taking turns (repeatable)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs: give 1 or more")
    if os.geteuid() != 0:
        print("bench/first_trial.py needs root (chaos run builds namespaces): run it with sudo")
        return 1
    trees = [REPO, *(t.resolve() for t in args.tree)]
    figures: dict[Path, list[dict[str, float]]] = {t: [] for t in trees}
    launchers: dict[Path, set[str]] = {t: set() for t in trees}
    failures: dict[Path, list[str]] = {t: [] for t in trees}
    for run in range(args.runs):
        for tree in trees:
            with tempfile.TemporaryDirectory(prefix="bench-first-trial-") as out:
                try:
                    found, launcher = measure(tree, Path(out))
                except RunFailed as exc:
                    failures[tree].append(str(exc))
                    continue
            figures[tree].append(found)
            launchers[tree].add(launcher)
            print(f"run {run + 1}/{args.runs} {tree}: "
                  + ", ".join(f"{k} {v:.2f} s" for k, v in found.items()), file=sys.stderr, flush=True)
    print(f"| tree | runs | launcher | {' | '.join(FIGURES)} (medians) |")
    print("|---|---|---|" + "---|" * len(FIGURES))
    for tree in trees:
        if not figures[tree]:
            print(f"| {tree} | 0 | - |" + " - |" * (len(FIGURES) - 1) + f" failed: {failures[tree][0]} |")
            continue
        medians = [statistics.median(f[k] for f in figures[tree]) for k in FIGURES]
        print(f"| {tree} | {len(figures[tree])} | {', '.join(sorted(launchers[tree]))} | "
              + " | ".join(f"{m:.2f} s" for m in medians) + " |")
    print("\nseconds from the command's start, except cluster up (the trial's cluster_up secs); "
          "launcher: new (started by the trial), ahead (started when the command began)")
    return 1 if any(failures.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
