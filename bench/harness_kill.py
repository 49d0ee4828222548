"""Random-phase SIGKILL campaign: kill `chaos run` at a random moment, heal, count leftovers.

    sudo .venv/bin/python bench/harness_kill.py [--netns 20] [--docker 10] [--slurm 10]
        [--ranks 8] [--max-delay 25] [--seed 1] [--scenarios link_down kill_rank ...]

Per backend, N times: start `chaos run SCENARIO --ranks R --backend B` (scenarios in turn),
SIGKILL it after a delay drawn uniformly from [0, --max-delay] s with the seed, and note
the phase the kill hit (the last event of its trial, or "start-up" before the first: the
start-up heal, the run folder, bring-up). Then, alternately:

    chaos heal      the command a user runs after a crash (timed)
    start-up heal   a fresh `chaos run` of the same scenario, whose start-up heal must take
                    the remains away; timed from its start to its run folder (the start-up
                    heal comes just before the folder), then stopped with SIGTERM

and lists what is left of either run on the host (`harness.cluster.host`: namespaces,
ledgers, containers, processes; on the slurm backend also the run's jobs in `squeue`), then
removes it so the next kill starts clean. A backend that cannot run here (no Docker engine,
no Slurm cluster: `sudo chaos slurm up --nodes 4` and its SLURM_CONF) prints why and is
skipped. The slurm backend runs the scenarios its node agents inject (SLURM_SCENARIOS) on
min(--ranks, the cluster's nodes) ranks. Needs root.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from chaos.probe import capabilities
from harness.cluster import host

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = ("link_down", "kill_rank", "pause_rank", "link_flap", "loss_20pct", "unplugged")
SLURM_SCENARIOS = ("link_down", "kill_rank", "pause_rank", "loss_20pct")
HEAL_MODES = ("chaos heal", "start-up heal")
FOLDER_WAIT_S = 120.0
STOP_WAIT_S = 60.0


@dataclass(frozen=True)
class Kill:
    backend: str
    scenario: str
    delay_s: float
    phase: str
    heal_mode: str
    heal_s: float | None
    left: tuple[str, ...]
    heal_failed: tuple[str, ...]


def _chaos_run(scenario: str, ranks: int, backend: str, out: Path) -> subprocess.Popen[bytes]:
    """`chaos run`, its error output kept beside `out` (what a run that failed said)."""
    with open(f"{out}.stderr", "wb") as stderr:
        return subprocess.Popen([sys.executable, "-m", "harness.cli", "run",
                                 str(REPO / "scenarios" / f"{scenario}.yaml"), "--ranks", str(ranks),
                                 "--backend", backend, "--out", str(out), "--quiet"],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr)


def _phase(out: Path, child: subprocess.Popen[bytes]) -> str:
    if child.poll() is not None:
        return f"finished before the kill (exit {child.returncode})"
    events = sorted(out.rglob("events.jsonl"))
    lines = events[-1].read_text().splitlines() if events else []
    for line in reversed(lines):
        try:
            return json.loads(line)["kind"]
        except (json.JSONDecodeError, KeyError):
            continue  # a torn last line
    return "start-up" if not list(out.iterdir()) else "run folder, before the first event"


def _wait_folder(out: Path, child: subprocess.Popen[bytes]) -> float | None:
    """Seconds until the fresh run's folder appears (its start-up heal is done), or None."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < FOLDER_WAIT_S and child.poll() is None:
        if any(out.iterdir()):
            return time.monotonic() - t0
        time.sleep(0.02)
    return None


def one_kill(backend: str, scenario: str, ranks: int, delay_s: float, heal_mode: str, work: Path) -> Kill:
    before = host.snapshot()
    out = Path(tempfile.mkdtemp(dir=work))
    child = _chaos_run(scenario, ranks, backend, out)
    time.sleep(delay_s)
    phase = _phase(out, child)
    child.kill()
    child.wait()
    failed: tuple[str, ...] = ()
    if heal_mode == "chaos heal":
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "harness.cli", "heal"], cwd=REPO, capture_output=True, text=True)
        heal_s: float | None = time.monotonic() - t0
        failed = tuple(line for line in done.stderr.splitlines() if line.strip())
    else:
        fresh_out = Path(tempfile.mkdtemp(dir=work))
        fresh = _chaos_run(scenario, ranks, backend, fresh_out)
        try:
            heal_s = _wait_folder(fresh_out, fresh)
        finally:
            host.end_process(fresh, signal.SIGTERM, STOP_WAIT_S)
        if heal_s is None:
            said = Path(f"{fresh_out}.stderr").read_text(errors="replace").strip().splitlines()
            failed = tuple(said[-3:])
    # ours: the two runs' ids (from their folders) and the killed harness's probe namespace
    runs = {**host.runs_under(work), f"probe{child.pid}": None}
    left = host.left_since(before, runs=runs)
    if left:
        host.remove(left, runs)  # the next kill starts clean
    jobs = _slurm_jobs(runs) if backend == "slurm" else []
    if jobs:
        subprocess.run(["scancel", *(j.split()[2] for j in jobs)], check=False)  # by id: --name takes one name
    return Kill(backend, scenario, delay_s, phase, heal_mode, heal_s, (*map(str, left), *jobs), failed)


def _slurm_jobs(runs: dict[str, Path | None]) -> list[str]:
    """The runs' jobs Slurm still lists (named chaos-<run id>), as "slurm job ID NAME STATE"."""
    from harness.cluster.slurm.cluster import job_name
    names = {job_name(run_id) for run_id in runs}
    out = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True, check=False).stdout
    return [f"slurm job {line}" for line in out.splitlines() if len(line.split()) == 3 and line.split()[1] in names]


def cannot_run(backend: str) -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, netlink)"
    if backend == "docker" and not capabilities().docker:
        return capabilities().why_not("docker")
    if backend == "slurm":
        from harness.cluster.slurm.cluster import SlurmBackend
        return SlurmBackend.why_not_here()
    return None


def _slurm_nodes() -> int:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, check=False).stdout
    return len(set(out.split()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--netns", type=int, default=20, help="kills on the namespace backend (default 20)")
    parser.add_argument("--docker", type=int, default=10, help="kills on the docker backend (default 10)")
    parser.add_argument("--slurm", type=int, default=10, help="kills on the slurm backend (default 10)")
    parser.add_argument("--ranks", type=int, default=8, help="ranks per run (default 8)")
    parser.add_argument("--max-delay", type=float, default=25.0, help="latest kill, seconds after start (default 25)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), help="shipped scenarios, taken in turn")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    total_left = 0
    with tempfile.TemporaryDirectory(prefix="harness-kill-") as tmp:
        for backend, n in (("netns", args.netns), ("docker", args.docker), ("slurm", args.slurm)):
            if n <= 0:
                continue
            why = cannot_run(backend)
            if why:
                print(f"{backend}: {n} kills not run: {why}")
                continue
            scenarios, ranks = args.scenarios, args.ranks
            if backend == "slurm":
                scenarios = [s for s in args.scenarios if s in SLURM_SCENARIOS] or list(SLURM_SCENARIOS)
                ranks = min(ranks, _slurm_nodes())
            print(f"{backend}: {n} kills, {ranks} ranks, delays uniform in [0, {args.max_delay:g}] s")
            kills = []
            for i in range(n):
                kill = one_kill(backend, scenarios[i % len(scenarios)], ranks,
                                rng.uniform(0.0, args.max_delay), HEAL_MODES[i % 2], Path(tmp))
                kills.append(kill)
                heal_text = "no run folder (it failed first)" if kill.heal_s is None else f"{kill.heal_s:.2f} s"
                print(f"  kill {i + 1:2d}  {kill.scenario:11} at {kill.delay_s:5.1f} s  phase {kill.phase:28} "
                      f"{kill.heal_mode:13} {heal_text:>8}  leftovers {len(kill.left)}"
                      + "".join(f"\n      left: {item}" for item in kill.left)
                      + "".join(f"\n      heal: {line}" for line in kill.heal_failed))
            total_left += sum(len(k.left) for k in kills)
            for mode in HEAL_MODES:
                times = [k.heal_s for k in kills if k.heal_mode == mode and k.heal_s is not None]
                if times:
                    print(f"  {mode}: median {statistics.median(times):.2f} s, max {max(times):.2f} s over {len(times)}")
            print(f"  leftovers after heal: {sum(len(k.left) for k in kills)} in {n} kills")
    return 1 if total_left else 0


if __name__ == "__main__":
    sys.exit(main())
