"""`chaos init`: a commented first scenario, for the built-in workload or the user's own job.

    chaos init [--job "python train.py --lr 0.1"] [--out FILE] [--ranks N] [--force]

Writes a scenario whose every field says what it does: a pause, a link down and a kill on
one rank, one after the other; for the built-in workload the document's four policies, for
a job its variants: as written; with a shorter timeout where the script has a `--timeout`
option (where the command gives it a value, that value moves into the variants, against a
short one, so that no variant gives it twice); under torchrun with restarts, on a
rendezvous store per round (torch's shared one fails restarted workers, pytorch#135712).
Every checkpoint option of the command (`--ckpt`, `--checkpoint`, `--save-dir`, `--resume`,
... with `=` or a space: CHECKPOINT_OPTIONS) gets a path in each trial's folder, and a
script that spells one the command lacks is given it, so that no trial resumes from
another's and nothing is written to the job's folder; what was done is said, and where
nothing was found the scenario's comment says how. The file is loaded and planned as
`chaos run --dry-run` does before it is kept, so a scenario it writes always loads; an
existing file is refused unless --force. Prints the plan's summary and the next command.
"""
from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

from chaos.errors import UsageError

DEFAULT_OUT = "scenario.yaml"
VICTIM = 5  # the rank the faults hit (the last one for fewer than 6 ranks)

BUILTIN = """\
# A first chaos scenario for the harness's own training job (chaos init). Every field is
# explained in harness/scenario/scenario.py's docstring; `chaos schema` prints the format.
name: {name}
description: >
  A 16-rank data-parallel job (a small MLP, gradient all-reduce over gloo, atomic
  checkpoints) meets three faults on rank {victim}, one after the other: a pause of the
  whole process (SIGSTOP), a link down, and a kill (SIGKILL). Each policy runs the same
  job once.
seed: 1
cluster: {{ranks: {ranks}}}          # each rank on its own network host (a namespace)
warmup_steps: 8                   # every rank makes these steps before the first fault
faults:                           # offsets count from the end of the warm-up
  - {{kind: pause, target: {{rank: {victim}}}, start: 2s, duration: 3s}}
  - {{kind: link_down, target: {{rank: {victim}}}, start: 20s, duration: 10s}}
  - {{kind: kill, target: {{rank: {victim}}}, start: 45s}}
hang_cap: 30s                     # no step and no policy action this long: hung >= 30 s
policies:                         # the source document's four, measured side by side
  baseline: {{}}                    # a 6 h timeout, no retry: hangs
  timeout: {{timeout: 5s}}          # gives up after 5 s
  retry: {{timeout: 5s}}            # backoff, health check, a new group, the checkpoint
  isolation: {{timeout: 5s}}        # retry + the circuit breaker
expect:                           # what each policy must do; `chaos run` fails otherwise
  baseline: {{outcome: hung, state: consistent}}
  timeout: {{outcome: failed-fast, detect_within: 7s, state: consistent}}
  # retry: {{outcome: recovered, recover_within: 15s, state: consistent}}
  # isolation: {{outcome: isolated, breaker_within: 30s}}
"""

JOB = """\
# A first chaos scenario for your own training job (chaos init). docs/own-job.md explains
# every field; `chaos schema` prints the format.
name: {name}
description: >
  `{command_text}` on {ranks} hosts, one process each, started with torchrun's
  environment (RANK, WORLD_SIZE, MASTER_ADDR, ...). Three faults on rank {victim}, one after
  the other: a pause of its process (SIGSTOP), a link down, and a kill (SIGKILL).
seed: 1
cluster: {{ranks: {ranks}}}          # each rank on its own network host (a namespace)
job:
{checkpoint_note}  command: {command}
  workdir: {workdir}                  # relative to this file
  # launcher: torchrun            # one torchrun agent per host instead (see the variant)
  start_timeout: 300s             # from bring-up until every rank made the warm-up steps
{tune_line}warmup_steps: 5                   # optimizer steps every rank makes before the first fault
faults:                           # offsets count from the end of the warm-up
  - {{kind: pause, target: {{rank: {victim}}}, start: 2s, duration: 3s}}
  - {{kind: link_down, target: {{rank: {victim}}}, start: 20s, duration: 10s}}
  - {{kind: kill, target: {{rank: {victim}}}, start: 45s}}
hang_cap: 30s                     # no step and no exit this long: hung >= 30 s
variants:                         # the sides to compare, one trial each
{variants}expect:                           # what each variant must do; `chaos run` fails otherwise
  default: {{state: consistent}}    # whatever happens, no rank's state forks
  # default: {{outcome: hung}}      # outcomes: absorbed, recovered, crashed, hung, ...
"""

TIMEOUT_VARIANT = "  timeout_5s: {args: [--timeout, \"5\"]}  # your script's own --timeout option\n"
TUNE_LINE = ('  tune: {timeout: "--timeout {seconds}"}  # where `chaos tune` sets its timeout; under torchrun\n'
             "  #   add max_restarts: torchrun, and it tries torchrun's --max-restarts too\n")
NO_TUNE = ('  # tune: {timeout: "--timeout {seconds}"}  # where `chaos tune` sets its timeout: the option or\n'
           "  #   {env: NAME} your script reads it from\n")
NO_TIMEOUT = ("  # timeout_5s: {args: [--timeout, \"5\"]}  # your script has no --timeout option: "
              "give the one that sets\n  #   init_process_group(timeout=...)\n")
# torch's shared rendezvous store refuses restarted workers (they read a peer's address from
# another round): the side that works, so that a first run does not measure that bug
TORCHRUN_VARIANT = (
    "  # each round's workers on a store of their own: on torch's shared rendezvous store a restarted\n"
    "  # worker reads a peer's address from an earlier round and fails (torch 2.11-2.13,\n"
    "  # pytorch/pytorch#135712; scenarios/byo_link_down.yaml measures both)\n"
    "  torchrun_restarts: {{launcher: torchrun, max_restarts: 2, {args}"
    "env: {{TORCH_DISABLE_SHARE_RDZV_TCP_STORE: \"1\"}}}}\n")
# A checkpoint option's usual spellings: the command's value goes into the trial's folder.
# Those that only name what to resume from are never added where the command lacks them
# (a script may require the file to exist).
SAVE_OPTIONS = ("--ckpt", "--checkpoint", "--ckpt-path", "--checkpoint-path", "--ckpt-dir", "--checkpoint-dir",
                "--save-dir", "--save-path", "--output-dir", "--out-dir")
CHECKPOINT_OPTIONS = (*SAVE_OPTIONS, "--resume", "--resume-from", "--load", "--load-path")
TRIAL_DIR = "{trial_dir}"
TIMEOUT_OPTION = "--timeout"
SHORT_TIMEOUT_S = 5.0
NO_CHECKPOINT = (f"  # no checkpoint option found ({', '.join(CHECKPOINT_OPTIONS[:4])}, ...): if your script saves\n"
                 "  # or resumes one, give its path under {trial_dir} (e.g. --ckpt {trial_dir}/ck.pt), so that\n"
                 "  # every trial starts from its own state and nothing is written to your folder\n")


def add_init_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job", help='your training command, e.g. "python train.py --lr 0.1" (default: the '
                                      "harness's own workload)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"the scenario file to write (default: ./{DEFAULT_OUT})")
    parser.add_argument("--ranks", type=int, default=16, help="hosts in the job (default 16)")
    parser.add_argument("--force", action="store_true", help="overwrite --out if it exists")


def _spells(option: str, command: list[str], cwd: Path) -> bool:
    """Whether the script the command runs spells `option` as a string (its source read, not run)."""
    script = next((Path(word) for word in command if word.endswith(".py")), None)
    if script is None:
        return False
    path = script if script.is_absolute() else cwd / script
    try:
        source = path.read_text(errors="replace")
    except OSError:
        return False
    return f'"{option}"' in source or f"'{option}'" in source


def _option(command: list[str], option: str) -> tuple[int, int, str] | None:
    """Where the command gives `option` a value: (first word, words it takes, value), for
    `--opt value` and `--opt=value`; None where it does not."""
    for i, word in enumerate(command):
        if word == option and i + 1 < len(command):
            return i, 2, command[i + 1]
        if word.startswith(option + "="):
            return i, 1, word[len(option) + 1:]
    return None


def _in_trial_dir(value: str) -> str:
    """A checkpoint path moved into the trial's folder, by its last name."""
    name = os.path.basename(os.path.normpath(value))
    return TRIAL_DIR if name in ("", ".", "..") else f"{TRIAL_DIR}/{name}"


def _checkpoints_to_trial_dir(command: list[str], cwd: Path) -> list[str]:
    """Every checkpoint option of the command given a path in the trial's folder, or one
    added that its script spells; returns what was done, one line each (none: nothing found)."""
    done = []
    for option in CHECKPOINT_OPTIONS:
        found = _option(command, option)
        if found is None or TRIAL_DIR in found[2]:
            continue
        i, words, value = found
        moved = _in_trial_dir(value)
        command[i:i + words] = [option, moved] if words == 2 else [f"{option}={moved}"]
        done.append(f"{option} {value} -> {moved}")
    if done or any(_option(command, option) for option in CHECKPOINT_OPTIONS):
        return done
    option = next((o for o in SAVE_OPTIONS if _spells(o, command, cwd)), None)
    if option is None:
        return []
    added = TRIAL_DIR if option.endswith("-dir") else f"{TRIAL_DIR}/checkpoint.pt"
    command += [option, added]
    return [f"{option} {added} added, as your script has the option"]


def _timeout(command: list[str]) -> str | None:
    """The command's own --timeout value, taken out of it (each variant gives its own);
    None where it has none, or one that is not a number of seconds (left as written)."""
    found = _option(command, TIMEOUT_OPTION)
    if found is None:
        return None
    i, words, value = found
    try:
        seconds = float(value)
    except ValueError:
        return None
    if not seconds > 0:
        return None
    del command[i:i + words]
    return value


def _variants(written: str | None, spelled: bool) -> str:
    """The `variants:` lines: the job as written, a shorter timeout where it has one (the
    command's value against a short one, never the same option twice), under torchrun."""
    if written is None:
        timeout_variant, args = (TIMEOUT_VARIANT if spelled else NO_TIMEOUT), ""
        default = "  default: {}                     # your job as it is\n"
    else:
        seconds = float(written)
        short = SHORT_TIMEOUT_S if seconds > SHORT_TIMEOUT_S else seconds / 2
        text = f"{short:g}"
        args = f"args: [{TIMEOUT_OPTION}, {_yaml_word(written, quote=True)}], "
        default = f"  default: {{{args[:-2]}}}  # your job as it is: its own {TIMEOUT_OPTION} {written}\n"
        timeout_variant = (f"  timeout_{text.replace('.', '_')}s: {{args: [{TIMEOUT_OPTION}, \"{text}\"]}}"
                           f"  # the same with a shorter {TIMEOUT_OPTION}\n")
    return default + timeout_variant + TORCHRUN_VARIANT.format(args=args)


def scenario_text(job: str | None, out: Path, ranks: int, cwd: Path) -> tuple[str, list[str]]:
    """The scenario, and what was done to the command (one line each), to be said."""
    victim = min(VICTIM, ranks - 1)
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in out.stem) or "scenario"
    if job is None:
        return BUILTIN.format(name=name, ranks=ranks, victim=victim), []
    command = shlex.split(job)
    if not command:
        raise UsageError('--job: empty; give your training command, e.g. --job "python train.py"')
    # each trial its own checkpoint: none resumes from another's, none is left in workdir
    moved = _checkpoints_to_trial_dir(command, cwd)
    written = _timeout(command)
    workdir = os.path.relpath(cwd, out.resolve().parent)
    if workdir.startswith(".."):  # the file lives outside the job's folder: name the folder
        workdir = str(cwd)
    spelled = _spells(TIMEOUT_OPTION, command, cwd)
    note = ("".join(f"  # {line}: each trial its own checkpoint\n" for line in moved) if moved
            else NO_CHECKPOINT)
    text = JOB.format(name=name, ranks=ranks, victim=victim, command_text=job.replace("`", "'"),
                      command="[" + ", ".join(_yaml_word(w) for w in command) + "]", workdir=_yaml_word(workdir),
                      checkpoint_note=note, variants=_variants(written, spelled),
                      tune_line=TUNE_LINE if written is not None or spelled else NO_TUNE)
    said = [f"checkpoint: {line}: each trial its own, nothing written to {cwd}" for line in moved]
    if not moved:
        said.append("checkpoint: no checkpoint option found in the command or the script; the scenario's "
                    "comment says how to give one")
    if written is not None:
        said.append(f"timeout: your {TIMEOUT_OPTION} {written} moved into the variants, against a shorter one")
    return text, said


def _yaml_word(word: str, quote: bool = False) -> str:
    """A YAML flow scalar for `word`: quoted unless it is plainly safe (or `quote`)."""
    if not quote and word and all(c.isalnum() or c in "._-/" for c in word) and not word[0].isdigit():
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def init_command(args: argparse.Namespace) -> int:
    from harness.scenario.scenario import load_scenario
    from harness.trial.plan import plan_text

    out = Path(args.out)
    if args.ranks < 2:
        raise UsageError(f"--ranks {args.ranks}: a distributed job needs at least 2 ranks")
    if out.exists() and not args.force:
        raise UsageError(f"--out {out}: exists; pick another file or pass --force to overwrite it")
    text, said = scenario_text(args.job, out, args.ranks, Path.cwd())
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(f".{out.name}.tmp")
        partial.write_text(text)
        try:
            scenario = load_scenario(partial)  # as `chaos run --dry-run` does, before it is kept
            plan = plan_text(scenario, out, scenario.trial_names(),
                             lambda fault: "the mechanism the probe picks at run time")
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        os.replace(partial, out)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write it ({exc}); pick a writable path") from None
    print(plan)
    for line in said:
        print(line)
    print(f"\nwrote {out}: {len(scenario.trial_names())} trials ({', '.join(scenario.trial_names())})")
    print(f"next: chaos run {shlex.quote(str(out))}")
    return 0
