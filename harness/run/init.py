"""`chaos init`: a commented first scenario, for the built-in workload or the user's own job.

    chaos init [--job "python train.py --lr 0.1"] [--out FILE] [--ranks N] [--force]

Writes a scenario whose every field says what it does: a pause, a link down and a kill on
one rank, one after the other; for the built-in workload the document's four policies, for
a job its variants (as written; with its own timeout where the script has a `--timeout`
option; under torchrun with restarts). A script with a `--checkpoint` option is given one in
each trial's folder, so that no trial resumes from another's and nothing is left in its
folder. The file is loaded and planned as `chaos run
--dry-run` does before it is kept, so a scenario it writes always loads; an existing file
is refused unless --force. Prints the plan's summary and the next command.
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
# explained in harness/run/scenario.py's docstring; `chaos schema` prints the format.
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
  command: {command}
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
  default: {{}}                     # your job as it is
{timeout_variant}  torchrun_restarts: {{launcher: torchrun, max_restarts: 2}}  # torchrun restarts the workers
expect:                           # what each variant must do; `chaos run` fails otherwise
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


def add_init_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job", help='your training command, e.g. "python train.py --lr 0.1" (default: the '
                                      "harness's own workload)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"the scenario file to write (default: ./{DEFAULT_OUT})")
    parser.add_argument("--ranks", type=int, default=16, help="hosts in the job (default 16)")
    parser.add_argument("--force", action="store_true", help="overwrite --out if it exists")


def _spells(option: str, command: list[str], cwd: Path) -> bool:
    """Whether the script the command runs spells `option` (its source read, not run)."""
    script = next((Path(word) for word in command if word.endswith(".py")), None)
    if script is None:
        return False
    path = script if script.is_absolute() else cwd / script
    try:
        return option in path.read_text(errors="replace")
    except OSError:
        return False


def scenario_text(job: str | None, out: Path, ranks: int, cwd: Path) -> str:
    victim = min(VICTIM, ranks - 1)
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in out.stem) or "scenario"
    if job is None:
        return BUILTIN.format(name=name, ranks=ranks, victim=victim)
    command = shlex.split(job)
    if not command:
        raise UsageError('--job: empty; give your training command, e.g. --job "python train.py"')
    if _spells("--checkpoint", command, cwd) and "--checkpoint" not in command:
        # each trial its own checkpoint: none resumes from the last trial's, none is left in workdir
        command += ["--checkpoint", "{trial_dir}/checkpoint.pt"]
    workdir = os.path.relpath(cwd, out.resolve().parent)
    if workdir.startswith(".."):  # the file lives outside the job's folder: name the folder
        workdir = str(cwd)
    has_timeout = _spells("--timeout", command, cwd)
    return JOB.format(name=name, ranks=ranks, victim=victim, command_text=job.replace("`", "'"),
                      command="[" + ", ".join(_yaml_word(w) for w in command) + "]", workdir=_yaml_word(workdir),
                      timeout_variant=TIMEOUT_VARIANT if has_timeout else NO_TIMEOUT,
                      tune_line=TUNE_LINE if has_timeout else NO_TUNE)


def _yaml_word(word: str) -> str:
    """A YAML flow scalar for `word`: quoted unless it is plainly safe."""
    if word and all(c.isalnum() or c in "._-/" for c in word) and not word[0].isdigit():
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def init_command(args: argparse.Namespace) -> int:
    from harness.run.plan import plan_text
    from harness.run.scenario import load_scenario

    out = Path(args.out)
    if args.ranks < 2:
        raise UsageError(f"--ranks {args.ranks}: a distributed job needs at least 2 ranks")
    if out.exists() and not args.force:
        raise UsageError(f"--out {out}: exists; pick another file or pass --force to overwrite it")
    text = scenario_text(args.job, out, args.ranks, Path.cwd())
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
    print(f"\nwrote {out}: {len(scenario.trial_names())} trials ({', '.join(scenario.trial_names())})")
    print(f"next: chaos run {shlex.quote(str(out))}")
    return 0
