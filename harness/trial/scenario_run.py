"""A scenario's run: one run folder (runfolder: run.json, the scenario's copy, trials/), its
trials in turn, each by the orchestrator (harness.trial.orchestrator) on a fresh cluster, and
the run's fault-free trajectory (harness.job.reference) computed after them."""
from __future__ import annotations

import contextlib
import datetime
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from chaos.errors import UsageError
from chaos.heal import heal
from chaos.ledger import Ledger
from chaos.undo import record_owner, undo_outstanding
from harness.cluster.api import Backend
from harness.cluster.launcher import LauncherPool
from harness.cluster.undos import undo_table
from harness.cluster.userjob import command_problem
from harness.job.device import Placement, PlacementError, choose, visible_gpus
from harness.scenario.scenario import Scenario
from harness.trial import machine as machine_speed
from harness.trial.orchestrator import Trial, TrialResult
from harness.trial.plan import build_plan, placement_problem
from harness.trial.progress import Progress
from runfolder import events as kinds
from runfolder.events import EVENTS_FILE, read_events
from runfolder.frameworks import training_hosts
from runfolder.info import MachineSpeed, RunInfo, read_trial_info, write_run_info
from runfolder.layout import REFERENCE_FILE, REFERENCE_LOG, SCENARIO_FILE, TRIALS_DIR, trial_dir


def start_run(out: Path, scenario: Scenario, scenario_file: Path, policies: list[str], backend: str,
              command: str, placement: Placement | None = None, machine: MachineSpeed | None = None) -> Path:
    """A new run folder under `out` (<scenario>-<time>-<id>) with its run.json and the
    scenario's copy; no trial yet."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    # absolute: ranks and a user's job run in other working directories and get these paths
    run_dir = out.resolve() / f"{scenario.name}-{stamp}-{secrets.token_hex(2)}"
    (run_dir / TRIALS_DIR).mkdir(parents=True)
    shutil.copyfile(scenario_file, run_dir / SCENARIO_FILE)
    write_run_info(run_dir, RunInfo(
        scenario=scenario.name, scenario_file=str(scenario_file), seed=scenario.seed, backend=backend,
        policies=tuple(policies), command=command,
        started_wall=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        clock="monotonic, one kernel shared by every rank",
        placement=None if placement is None else asdict(placement), machine=machine,
        harness_commit=harness_commit()))
    return run_dir


GIT_DEADLINE_S = 10.0
REPO_ROOT = Path(__file__).resolve().parents[2]


def harness_commit() -> str | None:
    """The commit of the chaos-harness checkout that runs (a result names the code that made
    it), "+changes" after it where tracked files differ from it; None outside a git checkout
    or where git does not answer within its deadline."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True,
                                  timeout=GIT_DEADLINE_S)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None
    commit = git("rev-parse", "--short=12", "HEAD")
    if commit is None:
        return None
    changed = git("status", "--porcelain", "--untracked-files=no")
    return commit + ("+changes" if changed else "")


def run_scenario(scenario: Scenario, scenario_file: Path, policies: list[str], out: Path,
                 backend: Backend, progress: Progress, command: str | None = None,
                 launchers: LauncherPool | None = None, machine: MachineSpeed | str | None = None,
                 started: Callable[[Path], None] | None = None) -> tuple[Path, list[TrialResult]]:
    """Run every policy of `scenario` in turn; returns the run folder and the trial results.
    `command` is how to run it again (default: this process's `chaos` command line);
    `launchers` lends the rank launcher to every trial (default: a pool for this run alone),
    so that only the first trial waits for its import of torch; `machine` is the machine's
    speed (or why it is not known) measured before a launcher started, which would slow it
    (default: measured now); `started` is told the run folder as soon as it exists, so that a
    caller can report the trials that finished when a later one ends the run (an error, a
    signal)."""
    # Leftovers of crashed runs (their owner is dead); live runs are left alone. What cannot
    # be undone (another backend's engine is down) is said, and this run goes on.
    problem = scenario.job and command_problem(scenario.job)
    if problem:
        raise UsageError(f"{scenario_file}: {problem}")
    try:
        placement = choose(scenario.cluster.device, scenario.cluster.comm, scenario.cluster.ranks, visible_gpus())
    except PlacementError as exc:
        raise UsageError(f"{scenario_file}: {exc}") from None
    problem = placement_problem(scenario, scenario_file, placement.device, placement.reason)
    if problem:
        raise UsageError(problem)
    healed = heal(undo_table())
    if healed.undone or healed.failed:
        progress.phase("heal", "; ".join([healed.summary(), *healed.failed]))
    machine = machine_speed.measure_or_why() if machine is None else machine
    if isinstance(machine, str):
        progress.phase("machine", machine)
    run_dir = start_run(out, scenario, scenario_file, policies, backend.name,
                        command or shlex.join(["chaos", *sys.argv[1:]]), placement,
                        None if isinstance(machine, str) else machine)
    if started is not None:
        started(run_dir)
    results = []
    with contextlib.ExitStack() as stack:
        pool = launchers or stack.enter_context(LauncherPool())
        for policy in policies:
            trial = Trial(build_plan(scenario, policy), trial_dir(run_dir, policy), backend, progress,
                          placement=placement, launchers=pool)
            results.append(trial.run())
        if scenario.job is None and placement.device == "cpu":
            write_reference(run_dir, [r.trial_dir for r in results], pool, progress)
    return run_dir, results


# A rank-step of the reference is one small forward and backward on one core: a few ms
REFERENCE_BASE_S, REFERENCE_PER_RANK_STEP_S = 30.0, 0.01


def write_reference(run_dir: Path, trial_dirs: list[Path], launchers: LauncherPool, progress: Progress) -> None:
    """The run's fault-free trajectory (harness.job.reference), as far as its trials
    stepped, computed by a fork of the rank launcher (torch is loaded there) after every
    trial, so that it takes no CPU from a trial; a failure is said and the run goes on
    (the trajectory then reads as not observed)."""
    steps = 1 + max((e["step"] for d in trial_dirs if (d / EVENTS_FILE).exists()
                     for e in read_events(d / EVENTS_FILE)[0] if e.get("kind") == kinds.STEP), default=-1)
    if steps <= 0:
        return
    plan = read_trial_info(trial_dirs[0]).plan  # every trial of a run has the same workload, seed and world
    world = len(training_hosts(plan.ranks, plan.job, plan.store_host))
    config = {"workload": plan.workload, "seed": plan.seed, "world": world, "steps": steps,
              "out": str(run_dir / REFERENCE_FILE)}
    ledger = Ledger(secrets.token_hex(3))
    record_owner(ledger)
    launcher = launchers.take()
    try:
        launcher.spawn(ledger, "reference", "reference", None, str(run_dir / REFERENCE_LOG), config)
        allowed = REFERENCE_BASE_S + REFERENCE_PER_RANK_STEP_S * world * steps
        deadline = time.monotonic() + allowed
        while not any(m["name"] == "reference" for m in launcher.exits(0.05)):
            if time.monotonic() > deadline:
                progress.phase("reference", f"the fault-free trajectory took over {allowed:.0f} s; "
                                            "trajectories not observed")
                break
    finally:
        launchers.give_back(launcher)  # SIGKILLs what is left of it
        undo_outstanding(ledger, undo_table())
        ledger.close_if_clean()
    if not (run_dir / REFERENCE_FILE).exists():
        progress.phase("reference", f"no fault-free trajectory ({run_dir / REFERENCE_LOG})")

