"""`chaos nightly`: its options, and the command that plans, runs, records and gates a night."""
from __future__ import annotations

import argparse
import sys
import datetime
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from chaos.errors import UsageError
from harness.cluster.backends import BACKEND_NAMES, backends_with, traits_of
from harness.studies.nightly.folder import open_night
from harness.studies.nightly.matrix import CellRunner, NightProgress, campaign_bars, finish_night, run_cells
from harness.studies.nightly.metadata import gather_metadata
from harness.studies.nightly.plan import (DEFAULT_PLAN, QUICK_PLAN, REPO, CampaignCell, Cell, expand, load_night_plan,
                                      plan_digest)
from harness.signals import Terminated
from harness.trial.progress import Progress

if TYPE_CHECKING:
    from harness.cluster.launcher import LauncherPool


def add_nightly_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", nargs="?", help=f"plan file (default: {DEFAULT_PLAN.relative_to(REPO)}, "
                                               "the source document's table row by row)")
    parser.add_argument("--quick", action="store_true",
                        help=f"the small plan for CI ({QUICK_PLAN.relative_to(REPO)}): a few minutes on CPU")
    parser.add_argument("--backend", choices=BACKEND_NAMES, help="host backend (overrides the plan's)")
    parser.add_argument("--repeat", type=int, help="repeats of every scenario (overrides the plan's)")
    parser.add_argument("--out", default="nights", help="folder of night folders (default: ./nights)")
    parser.add_argument("--history", help="history database (default: OUT/history.sqlite)")
    parser.add_argument("--night", help="the night's id (default: resume the newest unfinished night of "
                                        "this plan, else a new one named after the time)")
    parser.add_argument("--gate", action="store_true",
                        help="exit 1 naming each regression against the earlier nights")
    parser.add_argument("--parallel", type=int, default=1, metavar="N",
                        help="run N cells at once, each on hosts of its own (a backend with a scheduler: "
                             "--backend slurm gives each its own nodes); default 1")
    parser.add_argument("--quiet", action="store_true", help="no progress output")


def _real_cell_runner(backend_name: str, launchers: LauncherPool) -> CellRunner:
    """Runs a cell's run folder; every trial of the night forks from the rank launcher
    `launchers` lends."""
    from harness.cluster.backends import backend_named
    from harness.trial.scenario_run import run_scenario

    backend = backend_named(backend_name)

    def run(cell: Cell | CampaignCell, runs: Path) -> Path:
        if isinstance(cell, CampaignCell):
            return _run_campaign(cell, runs, launchers)
        run_dir, _ = run_scenario(cell.scenario, cell.scenario_file, list(cell.policies), runs, backend,
                                  Progress(quiet=True), command=cell.command, launchers=launchers)
        return run_dir
    return run


def _run_campaign(cell: CampaignCell, runs: Path, launchers: LauncherPool) -> Path:
    """The cell's campaign folder under `runs` (its report and picture in it, as
    `chaos campaign` writes them)."""
    from harness.studies.campaign.run import campaign_folder, run_windows

    folder = campaign_folder(runs, cell.scenario.name)
    run_windows(cell.campaign, folder, Progress(quiet=True), launchers, say=lambda _summary: None)
    return folder


def nightly_command(args: argparse.Namespace, require_privileges: Callable[[str, str], None]) -> int:
    if args.quick and args.plan:
        raise UsageError("give a plan file or --quick, not both")
    if args.repeat is not None and args.repeat < 1:
        raise UsageError(f"--repeat {args.repeat}: give 1 or more")
    if args.parallel < 1:
        raise UsageError(f"--parallel {args.parallel}: give 1 or more")
    plan_file = Path(args.plan) if args.plan else QUICK_PLAN if args.quick else DEFAULT_PLAN
    plan = load_night_plan(plan_file, args.repeat, args.backend)
    if args.parallel > 1 and not traits_of(plan.backend).parallel_trials:
        raise UsageError(f"--parallel {args.parallel}: the {plan.backend} backend runs every trial on this machine, "
                         "where cells at once would skew each other's times; use --backend "
                         f"{' or '.join(backends_with('parallel_trials', True))} (a cluster's own nodes per cell), "
                         "or leave --parallel out")
    cells = expand(plan, plan_file)
    require_privileges("chaos nightly", plan.backend)
    out = Path(args.out)
    history_db = Path(args.history) if args.history else out / "history.sqlite"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot make the night folder there ({exc}); pick a writable folder") from None
    night_dir, manifest = open_night(out, plan_digest(plan, cells), plan_file, args.night,
                                     gather_metadata(plan.backend), datetime.datetime.now(datetime.timezone.utc))
    total = sum(c.trials for c in cells)
    done = sum(d.trials for d in manifest.done)
    progress = NightProgress(Progress(quiet=args.quiet), total, done, time.monotonic,
                             label="nightly" if args.parallel == 1 else f"nightly x{args.parallel}")
    if done:
        progress.show(f"resuming night {manifest.night}: {len(manifest.done)} of {len(cells)} run folders done")
    from harness.cluster.launcher import LauncherPool
    try:
        with LauncherPool() as launchers:
            manifest = run_cells(night_dir, manifest, cells, _real_cell_runner(plan.backend, launchers), progress,
                                 time.monotonic, parallel=args.parallel)
    except (KeyboardInterrupt, Terminated):
        progress.show(f"interrupted: the same command resumes night {manifest.night}")
        raise
    from reports.nightly import HistoryError
    try:
        report = finish_night(night_dir, manifest, history_db, plan.seed, campaign_bars(cells))
    except HistoryError as exc:
        raise UsageError(f"--history: {exc}") from None
    return print_night(report, night_dir, history_db, args.gate)


def print_night(report: Any, night_dir: Path, history_db: Path, gate: bool) -> int:
    """The document's table and the gate's verdict on stdout; with `gate`, each regression on
    stderr and exit status 1 when there is one."""
    from reports.nightly import document_table
    print(f"# Chaos nightly {report.info.night}: the source document's table, measured\n")
    print(document_table(report.claims))
    campaigns = [p for p in report.policies if p.figure("ettr_pct") is not None]
    if campaigns:
        print("\ncampaigns (ETTR under a fault mix; the bar is the plan's):")
    for policy in campaigns:
        print(f"  {policy.scenario} / {policy.policy}: ETTR {policy.figure('ettr_pct').text()}, "
              f"{policy.outcome_text()}; bar: {policy.expectation_text()}")
    verdict = report.gate
    print(f"\ngate: {'passed' if verdict.passed else 'FAILED'} ({verdict.judged} comparisons, "
          f"{len(verdict.unjudged)} series with too little history)")
    if verdict.machine:
        print(f"note: {verdict.machine}")
    print(f"night folder: {night_dir}\nhistory:      {history_db}\nsummary:      {night_dir / 'summary.md'}")
    if gate and not verdict.passed:
        for regression in verdict.regressions:
            print(f"REGRESSION: {regression.text()}", file=sys.stderr)
        return 1
    return 0
