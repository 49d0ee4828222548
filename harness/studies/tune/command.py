"""`chaos tune SCENARIO.yaml`: the timeout and retries a job should use, measured on that job.

    chaos tune SCENARIO.yaml [--budget 30m] [--repeat 2] [--measure 60s] [--control 30s] [--hogs N]
                             [--faults link_down:10s,kill,...] [--ranks N] [--backend B] [--out DIR]
                             [--no-references] [--dry-run]

It takes the scenario's cluster, workload or job, and seed (its faults, policies and
variants are its own business) and runs its stages (harness.studies.tune.stages lists them),
each a run folder made the way `chaos run` makes one, through the tune's runner
(harness.studies.tune.runner); --dry-run prints the plan instead (harness.studies.tune.planned).
With --hogs N, N busy CPU processes run beside every stage (a busy node: the slow steps it
makes are measured, and the controls judge the candidates under the same load).
The built-in workload's candidates are policies (timeout, retries, backoff); a user's job's
are variants that set its timeout where `job.tune.timeout` says (an argument or an
environment variable): a job without it is refused with that fix.
A tune folder (OUT/<time>/) keeps a manifest like a night's (harness.studies.nightly): after
Ctrl-C, a crash or a budget that ended it, the same command (any --budget) resumes it. One progress line with the ETA;
before each stage it checks the budget, and when the next stage would pass it, it stops and
reports what the stages run so far show. tune.md, tune.json and tradeoff.png are the result.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import tempfile
import time
from pathlib import Path
from typing import Callable

from chaos.errors import UsageError
from chaos.faults import parse_fault
from chaos.units import parse_duration
from harness.cluster.backends import BACKEND_NAMES
from harness.scenario.scaling import usable_cores
from harness.signals import Terminated
from harness.studies.nightly import Cell, NightProgress, open_night
from harness.studies.tune.planned import dry_run_text, trial_count
from harness.studies.tune.runner import Tune
from harness.studies.tune.stages import FaultChoice, Options, Stages
from harness.trial.hogs import cpu_hogs
from harness.trial.progress import Progress

DEFAULT_SCENARIO = Path(__file__).resolve().parent.parent.parent / "scenarios" / "link_down.yaml"
TRIED_KINDS = ("link_down", "blackhole", "pause", "kill")  # --faults: those that need only a rank and a time


def parse_faults(text: str) -> tuple[FaultChoice, ...]:
    """--faults: KIND[:DURATION] separated by commas (none: no per-fault stage)."""
    if text.strip() == "none":
        return ()
    found = []
    for item in (part.strip() for part in text.split(",")):
        kind, _, duration = item.partition(":")
        if kind not in TRIED_KINDS:
            raise UsageError(f"--faults {text}: {kind!r} is not one of {', '.join(TRIED_KINDS)}; give e.g. "
                             "link_down:10s,kill (none: no per-fault stage)")
        if duration and not parse_fault({"kind": kind}).reversible:
            raise UsageError(f"--faults {text}: a {kind} does not heal; give {kind} without a duration")
        found.append(FaultChoice(kind, _seconds("--faults", duration) if duration else None))
    return tuple(found)


def add_tune_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", nargs="?", default=str(DEFAULT_SCENARIO),
                        help="a scenario: its cluster, workload or job (with job.tune), and seed are used "
                             "(default: the shipped link-down scenario)")
    parser.add_argument("--budget", default="30m", help="stop before a stage that would pass it (default 30m)")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of successive halving, each on a new seed "
                                                              "(default 2)")
    parser.add_argument("--measure", default="60s", help="fault-free time the job is measured for (default 60s)")
    parser.add_argument("--control", default="30s", help="fault-free time before each candidate's transients, "
                                                         "where a detection is a false trip (default 30s)")
    parser.add_argument("--hogs", type=int, default=0, help="busy CPU processes beside every stage: a busy node "
                                                            "(default 0)")
    parser.add_argument("--faults", help="what the chosen settings are tried under, beside the references: "
                                         "KIND[:DURATION],... of link_down, blackhole, pause (no duration: for "
                                         "good) and kill (default: link_down:10s,pause:2s,pause:10s,kill,blackhole; "
                                         "pause:2s,pause:10s,kill where the backend has no links; none: skip)")
    parser.add_argument("--ranks", type=int, help="number of ranks (overrides cluster.ranks)")
    parser.add_argument("--backend", choices=BACKEND_NAMES, help="host backend (default: the scenario's)")
    parser.add_argument("--out", default="tunes", help="folder of tune folders (default: ./tunes)")
    parser.add_argument("--no-references", action="store_true",
                        help="leave out the document's 30 s and PyTorch's default (a user's job: the job as "
                             "written) beside the candidates")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the estimate, run nothing")
    parser.add_argument("--quiet", action="store_true", help="no progress output")


def _seconds(flag: str, value: str) -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise UsageError(f"{flag} {value}: {exc}") from None
    if seconds <= 0:
        raise UsageError(f"{flag} {value}: give a time above zero, such as 15m")
    return seconds


def options_of(args: argparse.Namespace) -> Options:
    if args.repeat < 1:
        raise UsageError(f"--repeat {args.repeat}: give 1 or more rounds")
    if not 0 <= args.hogs <= 4 * usable_cores():
        raise UsageError(f"--hogs {args.hogs}: give 0 to {4 * usable_cores()} (4 per usable CPU) busy processes")
    return Options(scenario_file=Path(args.scenario), budget_s=_seconds("--budget", args.budget),
                   repeat=args.repeat, measure_s=_seconds("--measure", args.measure),
                   control_s=_seconds("--control", args.control), ranks=args.ranks, backend=args.backend,
                   references=not args.no_references, hogs=args.hogs,
                   faults=None if args.faults is None else parse_faults(args.faults))


def tune_command(args: argparse.Namespace, require_privileges: Callable[[str, str], None]) -> int:
    from harness.cluster.backends import backend_named
    from harness.cluster.launcher import LauncherPool
    from harness.trial.scenario_run import run_scenario

    options = options_of(args)
    out = Path(args.out)
    if args.dry_run:
        with tempfile.TemporaryDirectory(prefix="chaos-tune-plan-") as scratch:
            print(dry_run_text(Stages(options, Path(scratch))))
        return 0
    with tempfile.TemporaryDirectory(prefix="chaos-tune-check-") as scratch:
        checked = Stages(options, Path(scratch))  # before anything is made
        backend_name, total = checked.base.cluster.backend, trial_count(checked)
    require_privileges("chaos tune", backend_name)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot make the tune folder there ({exc}); pick a writable folder") from None
    info = {"scenario": str(options.scenario_file), "options": json.loads(json.dumps(dataclasses.asdict(options),
                                                                                     default=str))}
    folder, manifest = open_night(out, options.digest(), options.scenario_file, None,
                                  lambda night, started: {"started": started, **info},
                                  datetime.datetime.now(datetime.timezone.utc))
    progress = NightProgress(Progress(quiet=args.quiet), total, sum(d.trials for d in manifest.done), time.monotonic,
                             label="tune")
    if manifest.done:
        progress.show(f"resuming tune {manifest.night}: {len(manifest.done)} stages done")
    backend = backend_named(backend_name)
    try:
        with LauncherPool() as launchers:
            def run_cell(cell: Cell, runs: Path) -> Path:
                with cpu_hogs(options.hogs):
                    run_dir, _ = run_scenario(cell.scenario, cell.scenario_file, list(cell.policies), runs, backend,
                                              Progress(quiet=True), command=cell.command, launchers=launchers)
                return run_dir
            return Tune(Stages(options, folder), manifest, run_cell, progress).tune()
    except (KeyboardInterrupt, Terminated):
        progress.show(f"interrupted: the same command resumes tune {manifest.night} ({folder})")
        raise
