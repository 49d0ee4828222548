"""How fast the commands that only read a scenario answer: wall time and peak RSS.

    .venv/bin/python bench/cli_startup.py [--runs 5] [--tree DIR]...

Times `chaos schema` and `chaos run scenarios/link_down.yaml --dry-run` (as
`python -m harness.cli ...`, each run a fresh interpreter) and prints, per command, the
median wall time against the 0.5 s target, the median CPU time (user + system: what the
wall time is on an idle machine; a busy one stretches the wall time only) and the largest
peak RSS over the runs. With
`--tree DIR` (repeatable) it times the same commands from another checkout too, e.g. the
tree before a change (`git worktree add /tmp/before HEAD~1`): that tree's packages are
imported instead of this one's, with this interpreter. As root, the dry run also probes the
kernel for each fault's mechanism (what `chaos doctor` shows), which a user's run does not
skip.
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

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 0.5
COMMANDS = {
    "chaos schema": ["schema"],
    "chaos run scenarios/link_down.yaml --dry-run": ["run", "scenarios/link_down.yaml", "--dry-run"],
}


def measure(tree: Path, args: list[str]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, peak RSS in KiB) of one `python -m harness.cli ARGS` run in `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}  # the tree's packages before the installed ones
    with tempfile.TemporaryFile() as err:
        started = time.monotonic()
        child = subprocess.Popen([sys.executable, "-m", "harness.cli", *args], cwd=tree, env=env,
                                 stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.monotonic() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{tree}: chaos {' '.join(args)} exited {child.returncode}:\n"
                             f"{err.read().decode(errors='replace')[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per command (default 5)")
    parser.add_argument("--tree", type=Path, action="append", default=[],
                        help="another checkout to time as well (repeatable)")
    args = parser.parse_args(argv)
    print(f"| tree | command | wall (median of {args.runs}) | CPU (median) | peak RSS | under {TARGET_S} s? |")
    print("|---|---|---|---|---|---|")
    slow = False
    for tree in [REPO, *args.tree]:
        for name, command in COMMANDS.items():
            runs = [measure(tree.resolve(), command) for _ in range(args.runs)]
            wall = statistics.median(w for w, _, _ in runs)
            cpu = statistics.median(c for _, c, _ in runs)
            rss = max(r for _, _, r in runs)
            slow |= tree == REPO and wall >= TARGET_S
            print(f"| {tree} | {name} | {wall:.2f} s | {cpu:.2f} s | {rss / 1024:.0f} MiB | "
                  f"{'yes' if wall < TARGET_S else 'no'} |")
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
