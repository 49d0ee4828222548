"""`chaos nightly`: a plan of scenarios x policies x repeats run into one night folder, then
the night's history rows, files and gate (the analysis is reports.nightly's).

A plan file (YAML, validated once into frozen values; errors name file:line: field):

    seed: 1              # base seed: repeat r of a scenario runs with seed_for(seed, name, r)
    repeat: 3            # repeats of every entry (`--repeat` overrides)
    backend: netns       # netns | docker | local (`--backend` overrides)
    device: cpu          # what the ranks train on
    runs:
      - scenario: ../scenarios/loss_20pct.yaml   # a file or a glob, relative to the plan file
        policies: [baseline, timeout, retry]     # its policies (a user's job: its variants); default all
        ranks: 4                                 # optional: the scenario's cluster.ranks
        repeat: 5                                # optional: this entry's repeats

One cell is one plan entry x repeat: one run folder with a trial per policy (or variant of
a user's job), the way `chaos run` makes it (and its stored command reproduces it). The night folder, NIGHTS/<night>/:

    manifest.json   the plan's digest, the night's run metadata, each finished cell
                    (rewritten atomically after every cell); while it says unfinished, the
                    next invocation of the same plan resumes the night: it skips the finished
                    cells and removes the run folder an interruption left half made
    runs/           one run folder per finished cell
    junit.xml summary.md metrics.prom trends.html   reports.nightly.write_night_files
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import glob
import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from chaos.errors import UsageError
from harness.cluster.backends import BACKEND_NAMES, DEFAULT_BACKEND
from harness.run import machine
from harness.run.progress import Progress
from harness.signals import Terminated
from harness.run.scenario import Scenario, load_scenario, reproduce_command
from harness.run.yaml_errors import line_of, describe_errors
from harness.run.scaling import scaled_to_cores

if TYPE_CHECKING:
    from harness.cluster.launcher import LauncherPool

REPO = Path(__file__).resolve().parent.parent.parent
PLANS = REPO / "nightly"
DEFAULT_PLAN, QUICK_PLAN = PLANS / "default.yaml", PLANS / "quick.yaml"
MANIFEST = "manifest.json"
RUNS = "runs"
PROBE_TIMEOUT_S = 10.0  # for each metadata command (git, nvidia-smi)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PlanEntry(_Frozen):
    scenario: Annotated[str, Field(min_length=1, description="a scenario file or a glob, relative to the plan")]
    policies: tuple[str, ...] | None = Field(default=None, min_length=1,
                                              description="policies of the scenario to run; default all")
    ranks: Annotated[int, Field(ge=2, le=4096)] | None = None
    repeat: Annotated[int, Field(ge=1, le=1000)] | None = None


class NightPlan(_Frozen):
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = 1
    repeat: Annotated[int, Field(ge=1, le=1000)] = 3
    backend: Literal[BACKEND_NAMES] = DEFAULT_BACKEND  # type: ignore[valid-type]  (harness.cluster.backends)
    device: str = "cpu"
    runs: tuple[PlanEntry, ...]

    @field_validator("device")
    @classmethod
    def _cpu_only(cls, value: str) -> str:
        # the training workload (harness.job.workload) has no CUDA path yet (issue 12)
        if value != "cpu":
            raise ValueError(f"{value!r}: the ranks' workload trains on the CPU only today; use device: cpu")
        return value

    @field_validator("runs")
    @classmethod
    def _some(cls, value: tuple[PlanEntry, ...]) -> tuple[PlanEntry, ...]:
        if not value:
            raise ValueError("empty; list at least one entry such as - {scenario: ../scenarios/kill_rank.yaml}")
        return value


def load_night_plan(path: Path, repeat: int | None = None, backend: str | None = None) -> NightPlan:
    """Read and validate a plan file; `repeat` and `backend` (the command line's) override it.
    Raises UsageError with file:line: field: problem, one line per problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such plan file; pass a .yaml plan (see nightly/ for examples)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read the plan: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise UsageError(f"{path}{f':{mark.line + 1}' if mark else ''}: not valid YAML: "
                         f"{getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a plan is a mapping of fields (seed, repeat, backend, device, runs), "
                         f"not {type(data).__name__}")
    data.update({k: v for k, v in (("repeat", repeat), ("backend", backend)) if v is not None})
    try:
        return NightPlan.model_validate(data)
    except ValidationError as exc:
        raise UsageError("\n".join(f"{path}{f':{line}' if (line := line_of(root, loc)) else ''}: "
                                   f"{_plan_words(message)}"
                                   for loc, message in describe_errors(exc))) from None


def _plan_words(message: str) -> str:
    """yaml_errors.describe_errors' text, about a plan file."""
    if message.startswith("scenario: "):
        message = "plan: " + message.removeprefix("scenario: ")
    return message.replace("`chaos schema` lists the fields",
                                                               "docs/nightly.md lists the plan's fields")


@dataclass(frozen=True)
class Cell:
    """One plan entry x repeat of a night: a run folder with one trial per policy."""

    scenario: Scenario       # with the cell's seed, ranks and backend
    scenario_file: Path
    policies: tuple[str, ...]
    repeat: int
    command: str             # `chaos run ...` that runs the cell again

    @property
    def key(self) -> str:
        # the policies too: a plan may run a scenario's policies (or variants) in two entries
        return f"{self.scenario.name}/{self.repeat}/{'+'.join(self.policies)}"


def seed_for(base: int, scenario: str, repeat: int) -> int:
    """Repeat `repeat` of `scenario`'s seed: distinct per repeat, the same every night."""
    digest = hashlib.sha256(f"{base}/{scenario}/{repeat}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def _where(plan_file: Path, *loc: str | int) -> str:
    """file:line: field, for a problem found after the plan was validated."""
    line = line_of(yaml.compose(plan_file.read_text(encoding="utf-8"), Loader=yaml.SafeLoader), loc)
    return f"{plan_file}{f':{line}' if line else ''}: {'.'.join(map(str, loc))}"


def _files(pattern: str, plan_file: Path, where: str) -> list[Path]:
    full = os.path.normpath(pattern if Path(pattern).is_absolute() else plan_file.parent / pattern)
    found = sorted(Path(p) for p in glob.glob(full)) if glob.has_magic(pattern) else [Path(full)]
    if not found:
        raise UsageError(f"{where}: {pattern!r} matches no scenario file (relative to {plan_file.parent})")
    return found


def expand(plan: NightPlan, plan_file: Path) -> tuple[Cell, ...]:
    """Every cell of the plan, repeat by repeat (repeat 0 of every entry first, so that an
    interrupted night has every series at least once); each scenario loaded and checked."""
    entries: list[tuple[Path, str, tuple[str, ...], int, int | None]] = []
    owner: dict[tuple[str, str], str] = {}  # (scenario, policy) -> the plan entry that runs it
    for index, entry in enumerate(plan.runs):
        for path in _files(entry.scenario, plan_file, _where(plan_file, "runs", index, "scenario")):
            scenario = load_scenario(path)
            trials = scenario.trial_names()  # the policies, or a user's job's variants
            policies = entry.policies or tuple(trials)
            unknown = [p for p in policies if p not in trials]
            if unknown:
                kind = "a policy of" if scenario.job is None else "a variant of the job in"
                raise UsageError(f"{_where(plan_file, 'runs', index, 'policies')}: {unknown[0]!r} is not {kind} {path} "
                                 f"({', '.join(trials)}); name one of those")
            for policy in policies:
                if (scenario.name, policy) in owner:
                    raise UsageError(f"{_where(plan_file, 'runs', index)}: {scenario.name} / {policy} is already run by "
                                     f"{owner[scenario.name, policy]}; run each scenario x policy once a night")
                owner[scenario.name, policy] = f"runs.{index}"
            entries.append((path, scenario.name, policies, entry.repeat or plan.repeat, entry.ranks))
    cells = []
    for repeat in range(max(count for *_, count, _ in entries)):
        for path, name, policies, count, ranks in entries:
            if repeat < count:
                cells.append(_cell(plan, path, name, policies, repeat, ranks))
    return tuple(cells)


def _cell(plan: NightPlan, path: Path, name: str, policies: tuple[str, ...], repeat: int,
          ranks: int | None) -> Cell:
    seed = seed_for(plan.seed, name, repeat)
    overrides: dict[str, Any] = {"seed": seed, "cluster.backend": plan.backend, "cluster.ranks": ranks}
    scenario = load_scenario(path, {k: v for k, v in overrides.items() if v is not None})
    # like `chaos run --ranks`: the scenario's times follow the ranks per core (docs/scale.md)
    return Cell(scenario if ranks is None else scaled_to_cores(scenario), path, policies, repeat,
                reproduce_command(path, (), seed, overrides))


def plan_digest(plan: NightPlan, cells: tuple[Cell, ...]) -> str:
    """What a night runs: a night resumes only under the same digest."""
    digest = hashlib.sha256(plan.model_dump_json().encode())
    for cell in cells:
        digest.update(json.dumps([cell.key, cell.command, cell.policies,
                                  cell.scenario.model_dump(mode="json")], sort_keys=True).encode())
    return digest.hexdigest()


# -- the night folder ----------------------------------------------------------------------

@dataclass(frozen=True)
class Done:
    key: str
    repeat: int
    run: str          # the run folder, relative to the night folder
    trials: int
    seconds: float


@dataclass(frozen=True)
class Manifest:
    night: str
    digest: str
    plan_file: str
    info: dict[str, Any]          # reports.nightly.NightInfo's fields, gathered once
    done: tuple[Done, ...] = ()
    finished: bool = False

    def keys(self) -> set[str]:
        return {d.key for d in self.done}


def write_manifest(night_dir: Path, manifest: Manifest) -> None:
    """Atomically: a crash leaves the old manifest or the new one, never half of one."""
    path = night_dir / MANIFEST
    scratch = path.with_suffix(".tmp")
    with open(scratch, "w") as file:
        json.dump(dataclasses.asdict(manifest), file, indent=1)
        file.flush()
        os.fsync(file.fileno())
    os.replace(scratch, path)


def read_manifest(night_dir: Path) -> Manifest:
    path = night_dir / MANIFEST
    try:
        data = json.loads(path.read_text())
        return Manifest(**{**data, "done": tuple(Done(**d) for d in data["done"])})
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise UsageError(f"{path}: not a night manifest ({exc}); give --out another folder "
                         "or --night another id") from None


def open_night(out: Path, digest: str, plan_file: Path, night: str | None,
               gather: Callable[[str, str], dict[str, Any]], now: datetime.datetime) -> tuple[Path, Manifest]:
    """The night folder to run in: `night` if given (resumed when it exists), else the newest
    unfinished night of the same plan under `out`, else a new one named after `now`.
    `gather(night, started)` gives a new night's metadata."""
    if night is None:
        unfinished = [m for m in (read_manifest(p.parent) for p in sorted(out.glob(f"*/{MANIFEST}")))
                      if not m.finished and m.digest == digest]
        unfinished.sort(key=lambda m: m.info["started"])
        night = unfinished[-1].night if unfinished else now.strftime("%Y-%m-%dT%H%M%SZ")
    night_dir = out.resolve() / night  # absolute, as the run folders made in it are
    if (night_dir / MANIFEST).exists():
        manifest = read_manifest(night_dir)
        if manifest.digest != digest:
            raise UsageError(f"{night_dir}: night {night} ran another plan ({manifest.plan_file}); "
                             "give --night a new id to start a night of this plan")
        _remove_half_made(night_dir, manifest)
        return night_dir, manifest
    (night_dir / RUNS).mkdir(parents=True, exist_ok=True)
    manifest = Manifest(night=night, digest=digest, plan_file=str(plan_file),
                        info=gather(night, now.isoformat(timespec="seconds")))
    write_manifest(night_dir, manifest)
    return night_dir, manifest


def _remove_half_made(night_dir: Path, manifest: Manifest) -> None:
    """An interrupted cell's run folder: not in the manifest, so never analyzed; it goes."""
    kept = {night_dir / d.run for d in manifest.done}
    for run_dir in (night_dir / RUNS).iterdir():
        if run_dir not in kept:
            shutil.rmtree(run_dir)


# -- running the matrix --------------------------------------------------------------------

CellRunner = Callable[[Cell, Path], Path]  # (cell, runs folder) -> the run folder it made


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class NightProgress:
    """The night's one progress line: trials done of the total, elapsed and ETA. The ETA is
    this invocation's seconds per trial times the trials left (unknown before the first cell)."""

    def __init__(self, progress: Progress, total: int, done: int, clock: Callable[[], float],
                 label: str = "nightly") -> None:
        self.progress = progress
        self.label = label
        self.total = total
        self.done = done
        self.resumed = done
        self.clock = clock
        self.start = clock()

    def eta_s(self) -> float | None:
        ran = self.done - self.resumed
        if not ran:
            return None
        return (self.clock() - self.start) / ran * (self.total - self.done)

    def line(self, text: str) -> str:
        eta = self.eta_s()
        return (f"{self.done}/{self.total} trials  elapsed {_duration(self.clock() - self.start)}  "
                f"ETA {'?' if eta is None else _duration(eta)}  {text}")

    def show(self, text: str) -> None:
        self.progress.phase(self.label, self.line(text))


def run_cells(night_dir: Path, manifest: Manifest, cells: tuple[Cell, ...], run_cell: CellRunner,
              progress: NightProgress, clock: Callable[[], float], last: bool = True) -> Manifest:
    """Run every cell not done yet; the manifest is rewritten after each (`last`: these are
    the plan's last cells, and the progress line says the matrix is done)."""
    for cell in cells:
        if cell.key in manifest.keys():
            continue
        progress.show(f"running {cell.scenario.name} repeat {cell.repeat} ({', '.join(cell.policies)})")
        started = clock()
        run_dir = run_cell(cell, night_dir / RUNS)
        done = Done(cell.key, cell.repeat, str(run_dir.relative_to(night_dir)), len(cell.policies),
                    round(clock() - started, 3))
        manifest = dataclasses.replace(manifest, done=(*manifest.done, done))
        write_manifest(night_dir, manifest)
        progress.done += done.trials
    if last:
        progress.show("matrix done")
    return manifest


def finish_night(night_dir: Path, manifest: Manifest, history_db: Path, seed: int) -> Any:
    """Append the night to the history (one transaction), write its files, mark it finished;
    returns the reports.nightly.NightReport."""
    import numpy as np

    import reports
    from reports.nightly import (NightInfo, NightRun, append_night, night_history, night_report, read_history,
                                 write_night_files)
    from runfolder.info import read_run_info

    runs = [NightRun(d.repeat, read_run_info(night_dir / d.run).command, reports.analyze_run(night_dir / d.run))
            for d in manifest.done]
    append_night(history_db, night_history(NightInfo(**manifest.info), runs))
    history = read_history(history_db)
    report = night_report(history, manifest.night, np.random.default_rng(seed))
    write_night_files(night_dir, history, report)
    write_manifest(night_dir, dataclasses.replace(manifest, finished=True))
    return report


# -- run metadata --------------------------------------------------------------------------

def _output(command: list[str]) -> str:
    """The command's first line of output; "" where it is missing or fails."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, cwd=REPO)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else ""


def gather_metadata(backend: str) -> Callable[[str, str], dict[str, Any]]:
    """reports.nightly.NightInfo's fields for a night on this machine ("" where unknown),
    with its speed measured before the night's first trial (harness.run.machine)."""
    def gather(night: str, started: str) -> dict[str, Any]:
        import torch

        from reports.nightly.history import MACHINE_FIELDS

        commit = _output(["git", "rev-parse", "HEAD"])
        if commit and _output(["git", "status", "--porcelain", "--untracked-files=no"]):
            commit += "-dirty"
        gpu, _, driver = _output(["nvidia-smi", "--query-gpu=name,driver_version",
                                  "--format=csv,noheader"]).partition(", ")
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else ""
        speed = machine.measure_or_why()  # a night goes on without it
        return {"night": night, "started": started, "commit": commit, "host": socket.gethostname(),
                "kernel": platform.release(), "torch": torch.__version__, "cuda": torch.version.cuda or "",
                "gpu": gpu, "driver": driver, "nccl": nccl, "backend": backend,
                **({} if isinstance(speed, str) else {name: getattr(speed, name) for name in MACHINE_FIELDS})}
    return gather


# -- the command ---------------------------------------------------------------------------

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
    parser.add_argument("--quiet", action="store_true", help="no progress output")


def _real_cell_runner(backend_name: str, launchers: LauncherPool) -> CellRunner:
    """Runs a cell's run folder; every trial of the night forks from the rank launcher
    `launchers` lends."""
    from harness.cluster.backends import backend_named
    from harness.run.orchestrator import run_scenario

    backend = backend_named(backend_name)

    def run(cell: Cell, runs: Path) -> Path:
        run_dir, _ = run_scenario(cell.scenario, cell.scenario_file, list(cell.policies), runs, backend,
                                  Progress(quiet=True), command=cell.command, launchers=launchers)
        return run_dir
    return run


def nightly_command(args: argparse.Namespace, require_privileges: Callable[[str, str], None]) -> int:
    if args.quick and args.plan:
        raise UsageError("give a plan file or --quick, not both")
    if args.repeat is not None and args.repeat < 1:
        raise UsageError(f"--repeat {args.repeat}: give 1 or more")
    plan_file = Path(args.plan) if args.plan else QUICK_PLAN if args.quick else DEFAULT_PLAN
    plan = load_night_plan(plan_file, args.repeat, args.backend)
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
    total = sum(len(c.policies) for c in cells)
    done = sum(d.trials for d in manifest.done)
    progress = NightProgress(Progress(quiet=args.quiet), total, done, time.monotonic)
    if done:
        progress.show(f"resuming night {manifest.night}: {len(manifest.done)} of {len(cells)} run folders done")
    from harness.cluster.launcher import LauncherPool
    try:
        with LauncherPool() as launchers:
            manifest = run_cells(night_dir, manifest, cells, _real_cell_runner(plan.backend, launchers), progress,
                                 time.monotonic)
    except (KeyboardInterrupt, Terminated):
        progress.show(f"interrupted: the same command resumes night {manifest.night}")
        raise
    from reports.nightly import HistoryError
    try:
        report = finish_night(night_dir, manifest, history_db, plan.seed)
    except HistoryError as exc:
        raise UsageError(f"--history: {exc}") from None
    return print_night(report, night_dir, history_db, args.gate)


def print_night(report: Any, night_dir: Path, history_db: Path, gate: bool) -> int:
    """The document's table and the gate's verdict on stdout; with `gate`, each regression on
    stderr and exit status 1 when there is one."""
    from reports.nightly import document_table
    print(f"# Chaos nightly {report.info.night}: the source document's table, measured\n")
    print(document_table(report.claims))
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
