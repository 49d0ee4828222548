"""A user's job's start against the built-in workload's: from the cluster's bring-up to every
rank's warm-up, per launcher and start mode, and per fault-tolerance framework, side by side
in one run.

    sudo .venv/bin/python bench/byo_start.py [--ranks 8,16,64] [--repeat 1] [--kinds ...]

Each measurement is one `chaos run` (the installed entry point, a fresh command each time,
so every one pays its launcher's imports as a user's first trial does) of a scenario made
here without faults: the built-in workload (`builtin`), or examples/train_ddp.py (DDP,
torch.optim, a checkpoint resume) started by the `direct` launcher or by `torchrun`, with
`job.start: exec` or `preloaded`; or a framework's example (docs/frameworks.md), preloaded:
`torchft` (examples/train_torchft.py, one replica group per rank's host, and the Lighthouse
on a host of its own besides, so that as many ranks train), `ft_launcher`
(examples/train_ft_launcher.py, one agent per host) and `nvrx_inprocess`
(examples/train_inprocess.py in its Wrapper, one process per host). The kinds take turns within each round, so a slow hour of
the machine falls on all of them alike. Printed per rank count and kind (medians over the
rounds): bring-up (`cluster_up`), bring-up to warm-up (every rank made WARMUP_STEPS steps:
`warmup_done`), and from the trial's start (bring-up included: a preloaded job's launcher
imports DDP's modules while the hosts are built), each against the built-in workload's in
the same rounds (x), and each rank's
CPU seconds up to its first step (its process's own; for torchrun the worker's), median and
max over the ranks. A run that fails prints why and the command that reproduces it.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from runfolder.events import CLUSTER_UP, EVENTS_FILE, STEP, TRIAL_START, WARMUP_DONE, read_events
from runfolder.layout import trial_dirs

REPO = Path(__file__).resolve().parent.parent
WARMUP_STEPS = 5
KINDS = ("builtin", "direct-exec", "direct-preloaded", "torchrun-exec", "torchrun-preloaded", "torchft",
         "ft_launcher", "nvrx_inprocess")
# a framework's example and settings (scenarios/frameworks_kill.yaml's), and the hosts it
# takes besides its ranks (torchft's Lighthouse)
FRAMEWORK_JOBS = {
    "torchft": ({"command": ["python", "train_torchft.py", "--step-period", "0.25", "--timeout", "30"],
                 "torchft": {"min_replicas": 1, "quorum_tick_ms": 100, "join_timeout_ms": 10000,
                             "heartbeat_timeout_ms": 5000}}, 1),
    "ft_launcher": ({"command": ["python", "train_ft_launcher.py", "--step-period", "0.25", "--checkpoint",
                                 "{trial_dir}/checkpoint.pt"],
                     "ft_launcher": {"initial_rank_heartbeat_timeout": "600s", "rank_heartbeat_timeout": "60s"}}, 0),
    "nvrx_inprocess": ({"command": ["python", "train_inprocess.py", "--step-period", "0.25", "--timeout", "60",
                                    "--checkpoint", "{trial_dir}/checkpoint.pt"]}, 0),
}
RUN_TIMEOUT_S = 900


class RunFailed(Exception):
    """A run that gave no figures; the message says why."""


def scenario(kind: str, ranks: int) -> dict:
    """The scenario of one measurement: no fault, WARMUP_STEPS steps, a short watch after."""
    body: dict = {"name": f"start_{kind}_{ranks}".replace("-", "_"), "seed": 1, "cluster": {"ranks": ranks},
                  "warmup_steps": WARMUP_STEPS, "faults": [], "hang_cap": "5s", "settle_steps": 2}
    if kind == "builtin":
        return {**body, "workload": {"step_period": "250ms"}, "policies": {"timeout": {"timeout": "60s"}}}
    if kind in FRAMEWORK_JOBS:
        job, besides = FRAMEWORK_JOBS[kind]
        return {**body, "cluster": {"ranks": ranks + besides},
                "job": {**job, "workdir": str(REPO / "examples"), "launcher": kind, "start_timeout": "600s"}}
    launcher, start = kind.split("-")
    return {**body, "job": {
        "command": ["python", "train_ddp.py", "--step-period", "0.25", "--checkpoint", "{trial_dir}/checkpoint.pt"],
        "workdir": str(REPO / "examples"), "launcher": launcher, "start": start, "start_timeout": "600s"}}


def chaos_command() -> list[str]:
    installed = Path(sys.executable).parent / "chaos"
    return [str(installed)] if installed.exists() else [sys.executable, "-m", "harness.cli"]


def measure(kind: str, ranks: int, folder: Path) -> dict[str, float]:
    path = folder / f"{kind}-{ranks}.yaml"
    path.write_text(yaml.safe_dump(scenario(kind, ranks), sort_keys=False))
    out = folder / f"out-{kind}-{ranks}"
    argv = [*chaos_command(), "run", str(path), "--quiet", "--out", str(out)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RunFailed(f"did not end within {RUN_TIMEOUT_S} s: {' '.join(argv)}") from None
    runs = sorted(out.iterdir()) if out.is_dir() else []
    trials = trial_dirs(runs[-1]) if runs else []
    if not trials:
        raise RunFailed(f"exit {done.returncode}, no trial: {(done.stderr or done.stdout)[-400:]}\n  {' '.join(argv)}")
    events, _ = read_events(trials[0] / EVENTS_FILE)
    began = [e["t"] for e in events if e["kind"] == TRIAL_START]
    up = [e for e in events if e["kind"] == CLUSTER_UP]
    warm = [e for e in events if e["kind"] == WARMUP_DONE]
    if not up or not warm:
        log = sorted((trials[0] / "logs").glob("*.log"))
        tail = log[0].read_text(errors="replace")[-400:] if log else ""
        raise RunFailed(f"no warm-up (exit {done.returncode}); {log[0].name if log else 'no log'}: {tail}\n"
                        f"  {' '.join(argv)}")
    cpu = [e["cpu_s"] for e in events if e["kind"] == STEP and "cpu_s" in e]
    shutil.rmtree(out, ignore_errors=True)
    return {"up": up[0]["secs"], "warm": warm[0]["t"] - up[0]["t"], "total": warm[0]["t"] - began[0],
            "cpu_median": statistics.median(cpu) if cpu else float("nan"), "cpu_max": max(cpu, default=float("nan"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="8,16,64", help="rank counts, comma-separated (default 8,16,64)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds (default 1)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if unknown := [k for k in kinds if k not in KINDS]:
        parser.error(f"--kinds: {', '.join(unknown)} unknown; give some of {', '.join(KINDS)}")
    try:
        counts = [int(n) for n in args.ranks.split(",")]
    except ValueError:
        parser.error(f"--ranks: {args.ranks!r} is not comma-separated numbers; e.g. 8,16")
    if os.geteuid() != 0:
        print("bench/byo_start.py needs root (chaos run builds namespaces): run it with sudo")
        return 1
    figures: dict[tuple[int, str], list[dict[str, float]]] = {}
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-byo-start-") as tmp:
        for round_ in range(args.repeat):
            for ranks in counts:
                for kind in kinds:
                    try:
                        found = measure(kind, ranks, Path(tmp))
                    except RunFailed as exc:
                        failures.append(f"{ranks} ranks {kind}: {exc}")
                        print(f"round {round_ + 1} {ranks} ranks {kind}: failed: {exc}", file=sys.stderr, flush=True)
                        continue
                    figures.setdefault((ranks, kind), []).append(found)
                    print(f"round {round_ + 1} {ranks} ranks {kind}: up {found['up']:.2f} s, warm-up "
                          f"{found['warm']:.2f} s, cpu to first step {found['cpu_median']:.2f} s "
                          f"(max {found['cpu_max']:.2f})", file=sys.stderr, flush=True)
    print(f"| ranks | kind | runs | bring-up | bring-up to warm-up ({WARMUP_STEPS} steps) | x builtin "
          "| trial start to warm-up | x builtin | CPU s to first step, median | max |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for ranks in counts:
        base = figures.get((ranks, "builtin"))
        for kind in kinds:
            runs = figures.get((ranks, kind))
            if not runs:
                print(f"| {ranks} | {kind} | 0 |" + " - |" * 7)
                continue
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            ratio = {key: f"{med[key] / statistics.median(r[key] for r in base):.2f}" if base else "-"
                     for key in ("warm", "total")}
            print(f"| {ranks} | {kind} | {len(runs)} | {med['up']:.2f} s | {med['warm']:.2f} s | {ratio['warm']} "
                  f"| {med['total']:.2f} s | {ratio['total']} | {med['cpu_median']:.2f} | {med['cpu_max']:.2f} |")
    for failure in failures:
        print(f"failed: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
