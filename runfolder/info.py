"""run.json and trial.json: typed, versioned, one definition for the writers and the readers.

Both files carry `format_version`. A reader takes every version from 1 to FORMAT_VERSION and
refuses anything else with one line that names the file, what is wrong and the fix:

  no format_version   written before run folders were versioned (chaos-harness up to commit
                      b3f0031): its trial.json lacks the plan (warm-up steps, actions,
                      workload) that the reports now judge from, so it is not guessed at;
                      run the scenario again with the command its run.json records.
  a newer version     written by a newer chaos-harness: upgrade this one.

Any change to these files, to the plan (runfolder.plan) or to the events' fields
(runfolder.events) is a new FORMAT_VERSION, and a reader of the old one beside it:

  1   the first versioned format
  2   run.json gains `machine`: the machine's speed as the run began (a version 1 file reads
      with machine None, as one whose speed could not be measured)
  3   a trial's events gain `machine_steal`: CPU time the virtual machine's host took while
      the ranks ran (a version 1-2 trial reads as one where it was not counted)
  4   run.json's `machine` gains `fault_us`, a page's first touch (a version 2-3 machine reads
      with it None, not measured)
  5   a trial's events gain `state`: fingerprints of every rank's training state (a version
      1-4 trial reads as one whose state was not observed), and `stacks_captured` with the
      trial's stacks/ folder: where every live process was at the hang cap (none before)
  6   a user's job's events gain `flight_ready`: its process dumps its flight recorder when
      asked (a version 1-5 user job's trial reads as one that did not)
  7   a run of the built-in workload gains reference.json, its fault-free trajectory (a
      version 1-6 run reads as one whose trajectory was not observed)
  8   a user's job in the plan gains `start` and `preload` (harness.cluster.preload; a version
      1-7 job was exec'd), and a process's first `step` gains `cpu_s`, the CPU seconds it used
      to get there (a version 1-7 step reads as one where they were not counted)
  9   a trial's plan gains `stacks_at_detect`, and its stacks/detect-<i>/ where every live
      process was at fault i's first detection (`stacks_captured` reason detect, with its
      fault); a version 1-8 trial reads as one where none were taken
  10  `trial_end` gains reason `held`: every rank still alive was frozen by a fault that never
      heals, so the trial ended then, not at the hang cap (a version 1-9 trial waited for the
      cap and ended `hung`)
  11  a trial whose policy has a failure detector gains heartbeat_gaps.json (runfolder.heartbeats:
      the gaps between every rank's heartbeats at the control plane); `trial_end` reason
      `settled` counts no rank frozen by a fault that never heals (a version 1-10 trial
      waited for it to the deadline); a teardown's `fault_reverted` is timed when the revert
      began (before, when the kernel acknowledged it: a thawed rank's events could come first)
  12  a user's job in the plan gains `rdzv_conf` (torchrun's --rdzv-conf; a version 1-11 job ran
      torch's defaults), and its `rank_start` gains `restart`, torchrun's restart count of the
      process's worker group (a version 1-11 trial reads as one where it was not recorded: an
      agent's restarts are counted as the processes it began)
  13  a trial's events gain `stopping`: when the harness began to stop the ranks, which ends
      what is judged (a version 1-12 trial's observation ends at the first rank it stopped,
      so a worker's error printed as its peers were stopped counted as the trial's)
  14  a trial's events gain `fault_not_applied` (a process fault due on a rank whose process
      had exited: not applied, the trial goes on; a version 1-13 trial stopped on an error),
      `checkpoint_save` / `checkpoint_load` (a user's job's checkpoint files, from the hook;
      a version 1-13 trial reads as one whose checkpoints were not observed), and
      `trial_end` an `error` (what stopped a trial that ended on one); a user's job in the
      plan gains `shared_checkpoint` (a version 1-13 job reads as false)
  15  a trial's events gain `checkpoint_failed` (the built-in runner's save refused by its
      disk: a storage fault, disk_full or read_only; a version 1-14 trial had none), and a
      `fault_applied` of a storage fault names the rank's checkpoint directory (`storage`)
  16  a fault in the plan gains `anchor` (it starts on an event, harness.scenario.anchors) and the
      plan `anchored` (those faults' actions, after their event); `fault_applied` gains
      `anchor_t` and `anchor_rank` (the event it started on), `fault_not_applied`
      `waited_for` (an anchored fault whose event never came); a trial's events gain
      `checkpoint_begin` (a save began: the runner's, or a user's job's torch.save / dcp
      save, from the hook) and `group_init` (a user's job's process formed its process
      group). A version 1-15 trial reads as one with no anchored fault and none of these
  17  a plan's faults gain the FUSE storage kinds `io_error`, `io_delay`, `io_stall` and `lose_unsynced`
      (chaos.fusefs; a version 1-16 plan had none), and a `checkpoint_failed` can name EIO
      or another errno an io_error gives
  18  a plan's `preempt` gains `grace` (SIGKILL that long after SIGTERM); a trial's events gain
      `restore_failed` (no checkpoint could be read: every rank fails) and `restored` gains
      `unreadable` and `torn` (the newer checkpoints a restore skipped, and why). A version
      1-17 trial reads as one with none of these
  19  the built-in runner's `step` gains `compute`, the seconds of its local part before the
      all-reduce (reports.straggler scores ranks by it); a plan's faults gain `step_delay`,
      and a `slow` its `stops` (false: as root a cgroup CPU quota). A version 1-18 step reads
      as one whose compute time was not recorded; its plan's slow reads with stops false,
      though it ran as the duty cycle (then every user's; its `fault_applied` names it)
  20  a user's job's `step` gains `compute` too: the step less its wait from its last
      gradient to its optimizer step (the hook times its parameters' gradients), and its
      events `group_destroyed` (destroy_process_group() returned: a crash after it is in
      teardown). A version 1-19 user's job's step reads as one whose compute time was not
      recorded, and a crash of its process as one in training
  21  a plan's `expect` gains `ranks_lost_at_most` and `undetected_at_most` (counts of ranks
      missing from the final world and of ranks that never detected the fault); a version
      1-20 plan reads with neither expected
  22  a plan's job may run under a fault-tolerance framework (`launcher: torchft`, its
      settings under `torchft`; the last host its coordinator: runfolder.frameworks); a
      user's job's `step` and `state` gain `step_source` (the framework's step) with
      `participants` and `parts` (a fingerprint per part of the state), `job_output` the
      cause `quorum`, and the events `heal` (a replica group healed from a peer). A version
      1-21 trial reads as one with no framework and none of these
  23  run.json gains `harness_commit`, the chaos-harness commit that ran it (None: a version
      1-22 run, or one run outside a git checkout); a plan's job may run under ft_launcher or
      nvrx_inprocess (their settings under their names), `job_output` gains the cause
      `heartbeat`, a `group_init` of a process that made its group before starts a
      generation of its own (an in-process restart), and the event `heal_fetched` (how long
      a heal's fetch of its peer's state took). A version 1-22 trial reads as one with none
      of these
  24  a plan gains `store_host`: the runner's control plane ran on the last host, a fault
      target and no rank (runfolder.frameworks); a version 1-23 plan reads with it false
"""
from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar, Union

from runfolder.layout import RUN_FILE, TRIAL_FILE
from runfolder.plan import TrialPlan

FORMAT_VERSION = 24
LAST_UNVERSIONED_COMMIT = "b3f0031"  # the last chaos-harness that wrote run folders without a version


class RunFolderError(ValueError):
    """A folder that is not a readable run folder; the message is one line for the user."""


@dataclasses.dataclass(frozen=True)
class MachineSpeed:
    """How fast the machine was (harness/trial/machine.py measures it and says how), so that a
    slower machine, or a slower hour of one shared machine, is not taken for slower code."""

    cpus: int         # usable by the measuring process
    model: str        # the CPU's model name ("" where /proc/cpuinfo does not say)
    loop_ns: float    # one step of a pure-Python loop, the best of several runs
    wake_us: float    # a round trip between two processes on one CPU over pipes, the median
    load_1m: float    # the 1-minute load average as it was measured
    fault_us: float | None = None  # a page's first touch (a minor fault); None before format 4

    def describe(self) -> str:
        model = f" ({self.model})" if self.model else ""
        fault = "" if self.fault_us is None else f", a page's first touch {self.fault_us:.1f} us"
        return (f"{self.cpus} CPUs{model}: a Python loop step {self.loop_ns:.0f} ns, a round trip "
                f"between two processes on one CPU {self.wake_us:.1f} us{fault}, load average "
                f"{self.load_1m:.2f} (harness/trial/machine.py)")


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """run.json: the run as a whole."""

    scenario: str
    scenario_file: str
    seed: int
    backend: str
    policies: tuple[str, ...]        # the trials, in the order they ran
    started_wall: str                # ISO 8601, local time with its offset
    command: str                     # how to run it again
    clock: str                       # the clock of every event's t
    # Where the ranks computed and how they talked (harness.job.device.Placement as JSON:
    # device, comm, gpus, reason); absent from run.json written before it: None.
    placement: dict[str, Any] | None = None
    # How fast the machine was as the run began; None where it could not be measured (the
    # run's progress said why) and in version 1 files.
    machine: MachineSpeed | None = None
    # The chaos-harness commit that ran it, "+changes" after it where the checkout's tracked
    # files differed from that commit; None before format 23 and outside a git checkout.
    harness_commit: str | None = None
    format_version: int = FORMAT_VERSION


@dataclasses.dataclass(frozen=True)
class TrialInfo:
    """trial.json: one trial, written before its cluster is built."""

    plan: TrialPlan
    run_id: str                      # names the trial's hosts and its ledger
    backend: str
    mono_anchor: float               # time.monotonic() and time.time() at one moment: maps
    wall_anchor: float               # the events' t to wall-clock time
    format_version: int = FORMAT_VERSION

    @property
    def policy(self) -> str:
        return self.plan.policy


def write_run_info(run_dir: Path, info: RunInfo) -> None:
    _write(Path(run_dir) / RUN_FILE, info)


def write_trial_info(trial_dir: Path, info: TrialInfo) -> None:
    _write(Path(trial_dir) / TRIAL_FILE, info)


def read_run_info(run_dir: Path) -> RunInfo:
    return _read(Path(run_dir) / RUN_FILE, RunInfo)


def read_trial_info(trial_dir: Path) -> TrialInfo:
    return _read(Path(trial_dir) / TRIAL_FILE, TrialInfo)


def _write(path: Path, info: RunInfo | TrialInfo) -> None:
    path.write_text(json.dumps(dataclasses.asdict(info), indent=2) + "\n")


Info = TypeVar("Info", RunInfo, TrialInfo)


def _read(path: Path, cls: type[Info]) -> Info:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunFolderError(f"{path}: missing; not a run folder written by `chaos run`") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunFolderError(f"{path}: unreadable ({exc})") from None
    if not isinstance(data, dict):
        raise RunFolderError(f"{path}: expected a JSON object, got {type(data).__name__}")
    _check_version(path, data)
    try:
        return _decode(cls, data, ())
    except _Invalid as exc:
        raise RunFolderError(f"{path}: {exc}; this is not what format {data['format_version']} writes "
                             "(edited by hand?): run the trial again") from None


def _check_version(path: Path, data: dict[str, Any]) -> None:
    if "format_version" not in data:
        again = f" (`{data['command']}`)" if isinstance(data.get("command"), str) else ""
        raise RunFolderError(
            f"{path}: no format_version: written before run folders were versioned (chaos-harness "
            f"up to {LAST_UNVERSIONED_COMMIT}), and this one reads formats 1 to {FORMAT_VERSION} only; "
            f"run the scenario again{again} or analyze it with the chaos-harness that wrote it")
    version = data["format_version"]
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise RunFolderError(f"{path}: format_version: {version!r} is not a format version "
                             f"(a whole number from 1; this chaos-harness writes {FORMAT_VERSION})")
    if version > FORMAT_VERSION:
        raise RunFolderError(f"{path}: format_version {version} is newer than this chaos-harness "
                             f"reads ({FORMAT_VERSION}); upgrade chaos-harness to analyze it")


# -- decoding: JSON -> the dataclasses above, every field's type checked -----------------

class _Invalid(Exception):
    def __init__(self, where: tuple[Any, ...], problem: str) -> None:
        super().__init__(f"{'.'.join(map(str, where)) or 'the file'}: {problem}")


_FORMS = {int: "a whole number", float: "a number", str: "a string", bool: "true or false"}


def _decode(cls: type, data: Any, where: tuple[Any, ...]) -> Any:
    if not isinstance(data, dict):
        raise _Invalid(where, f"expected an object, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise _Invalid((*where, unknown[0]), "unknown field")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, field in fields.items():
        if name in data:
            values[name] = _value(hints[name], data[name], (*where, name))
        elif field.default is dataclasses.MISSING:
            raise _Invalid((*where, name), "missing")
    try:
        return cls(**values)
    except ValueError as exc:  # a value type's own check (an unknown outcome name)
        raise _Invalid(where, str(exc)) from None


def _value(kind: Any, value: Any, where: tuple[Any, ...]) -> Any:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (Union, types.UnionType):  # X | None
        if value is None:
            return None
        (kind,) = [a for a in args if a is not type(None)]
        return _value(kind, value, where)
    if origin is tuple:  # tuple[X, ...]
        if not isinstance(value, list):
            raise _Invalid(where, f"expected a list, got {value!r}")
        return tuple(_value(args[0], item, (*where, i)) for i, item in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise _Invalid(where, f"expected an object, got {value!r}")
        return value
    if dataclasses.is_dataclass(kind):
        return _decode(kind, value, where)
    number = kind in (int, float) and isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and (kind is float or isinstance(value, int)):
        return kind(value)
    if kind in (str, bool) and isinstance(value, kind):
        return value
    raise _Invalid(where, f"expected {_FORMS[kind]}, got {value!r}")
