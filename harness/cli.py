"""The `chaos` command line.

    chaos run SCENARIO.yaml [--policy NAME]... [--ranks N] [--seed N] [--out DIR]
                            [--backend netns|docker|local|slurm] [--quiet]
    chaos report RUN_DIR... [--out DIR]      re-analyze stored runs, no re-run
    chaos run SCENARIO.yaml --dry-run        the resolved plan, nothing touched
    chaos init [--job "python train.py"] [--out FILE] [--ranks N] [--force]
                                             a commented first scenario, checked
    chaos schema                             JSON Schema of scenario files, for editors
    chaos heal [--run-id ID | --all]         remove what crashed runs left behind
    chaos doctor                             what this machine can inject, and how; its speed
    chaos calibrate [--kind KIND]...         configured vs measured, per fault mechanism
    chaos export k8s SCENARIO.yaml --policy NAME ...   manifests for Kubernetes (docs/kubernetes.md)
    chaos collect k8s --namespace NS --job NAME --out RUN_DIR   its results as a run folder
    chaos nightly [PLAN.yaml] [--quick] [--repeat N] [--history DB] [--gate] [--out DIR]
                                             a night of repeated trials (docs/nightly.md)
    chaos slurm up --nodes N | status | down   a local Slurm cluster (docs/slurm.md)
    chaos tune [SCENARIO.yaml] [--budget 15m] [--repeat N] [--dry-run]
                                             the timeout and retries to use, measured (docs/tune.md)
    chaos explore SCENARIO.yaml [--policy P]... [--budget 10m] [--kinds K,...] [--max-faults 3]
                                             drawn fault schedules against the policies' contract
    chaos explore --resume FOLDER | --report FOLDER   go on with one; rebuild its explore.md
    chaos campaign [SCENARIO.yaml] [--mix llama3|FILE] [--mtbf 60s] [--duration 20m] [--policy P]...
                                             ETTR and goodput under a fault mix (docs/campaign.md)

Exit codes: 0 success, 1 a run finished but an expectation failed (or the run could not
complete), 2 bad input (the message names the problem and the fix), 130 interrupted.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from chaos.errors import ChaosError, UsageError
from harness import signals
from harness.cluster.backends import BACKEND_NAMES, require_privileges
from harness.signals import Terminated

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "link_down.yaml"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own usage errors: one line, exit 2
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def cmd_run(args: argparse.Namespace) -> int:
    from harness.scenario.scaling import scaled_to_cores, scaling_note
    from harness.scenario.scenario import load_scenario, refuse_what_this_machine_cannot_set, reproduce_command
    from harness.trial.plan import plan_text

    overrides = {}
    if args.ranks is not None:
        overrides["cluster.ranks"] = args.ranks
    if args.seed is not None:
        overrides["seed"] = args.seed
    if args.backend is not None:
        overrides["cluster.backend"] = args.backend
    if args.ranks_per_node is not None:
        overrides["cluster.ranks_per_node"] = args.ranks_per_node
    for key in ("partition", "account", "time"):
        if getattr(args, key) is not None:
            overrides[f"cluster.slurm.{key}"] = getattr(args, key)
    if args.slurm_arg:
        overrides["cluster.slurm.args"] = args.slurm_arg
    scenario = load_scenario(args.scenario, overrides)
    if args.ranks is not None:  # the scenario's times follow the ranks per core (docs/scale.md)
        scenario = scaled_to_cores(scenario)
        note = scaling_note(args.ranks, job=scenario.job is not None)
        if note:
            print(note)
    policies = args.policy or scenario.trial_names()
    unknown = [p for p in policies if p not in scenario.trial_names()]
    if unknown:
        raise UsageError(f"--policy {unknown[0]}: not in {args.scenario}'s policies (or a job's variants: "
                         f"{', '.join(scenario.trial_names())}); add it there or pick one of those")
    repeated = sorted({p for p in policies if policies.count(p) > 1})
    if repeated:
        raise UsageError(f"--policy {repeated[0]} given more than once: each policy runs once per "
                         f"run (its trial folder and checkpoints are named after it); give it once")
    if args.dry_run:
        print(plan_text(scenario, Path(args.scenario), policies, _mechanism_names(scenario.cluster.backend)))
        return 0
    refuse_what_this_machine_cannot_set(args.scenario, scenario)
    require_privileges("chaos run", scenario.cluster.backend)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK | os.X_OK):
            raise PermissionError(f"no write permission on {out}")
    except OSError as exc:
        raise UsageError(f"--out {args.out}: cannot write run folders there ({exc}); "
                         f"pick a writable folder") from None
    from harness.cluster.launcher import LauncherPool
    from harness.trial import machine
    speed = machine.measure_or_why()  # before the launcher's import of torch takes a CPU
    run_dirs: list[Path] = []
    try:
        with LauncherPool() as launchers:
            launchers.start_ahead()  # its import of torch overlaps the imports and work below
            from harness.cluster.backends import backend_named
            from harness.trial.scenario_run import run_scenario
            from harness.trial.progress import Progress
            backend = backend_named(scenario.cluster.backend)
            progress = Progress(quiet=args.quiet, scope=scenario.name)
            run_scenario(scenario, Path(args.scenario), policies, out, backend, progress,
                         launchers=launchers, machine=speed, started=run_dirs.append)
    except BaseException:
        # whatever ended the run early (an error, a signal), the trials that finished keep
        # their reports; what ended it is still what `main` says and exits with
        if run_dirs:
            try:
                _report(run_dirs[0], partial=True)
            except Exception as exc:  # the run's own error matters more than the report's
                print(f"chaos: the finished trials' reports could not be written ({exc}); "
                      f"`chaos report {run_dirs[0]}` tries again", file=sys.stderr)
        raise
    import reports
    table = _report(run_dirs[0], partial=False)
    assert table is not None  # a whole run has every trial
    failures = reports.expectation_failures(table)
    for line in failures:
        print(f"EXPECTATION FAILED: {line}", file=sys.stderr)
    if failures:
        failed = [row["trial"] for _, row in table.iterrows() if reports.trial_failures(row)]
        print(f"reproduce: {reproduce_command(Path(args.scenario), failed, scenario.seed, overrides)}",
              file=sys.stderr)
    return 1 if failures else 0


def _report(run_dir: Path, partial: bool) -> pd.DataFrame | None:
    """Write the run's reports and print its table (the trials that did not finish marked
    so); returns the table. A run ended early (`partial`) may have no trial begun: said,
    and None; where none finished, the table is written, not printed: what ended the run
    (a controller that does not answer, a fault a host refused) is the whole story."""
    from reports.analysis import incomplete_text, run_frame
    from reports.history import load_run
    from reports.tables import format_table
    from reports.writer import write_run_reports
    from runfolder.info import RunFolderError
    try:
        run = load_run(run_dir)
    except RunFolderError:
        if not partial:
            raise
        print(f"\nrun folder: {run_dir} (no trial began: nothing to report)", file=sys.stderr)
        return None
    table = run_frame(run)
    written = write_run_reports(run, table, run.path)
    if partial and (table["outcome"] == "incomplete").all():
        print(f"\nrun folder: {run_dir} (no trial finished)", file=sys.stderr)
        return table
    print(incomplete_text(run, table) + format_table(table))
    print(f"\nrun folder: {run_dir}\nreport:     {written['report.md']}")
    return table


def _mechanism_names(backend: str) -> Callable[[object], str]:
    """Which mechanism each fault kind gets here: the backend's own way where it has one
    (a Slurm node's agent, its scheduler); on a backend without links the process kinds'
    own; else from the last probe on this boot if there was one (so a dry run answers at
    once), else from a probe now (root only)."""
    from chaos.inject import choose_mechanisms, process_mechanisms
    from harness.cluster.backends import backend_class, traits_of
    own = backend_class(backend).planned_mechanism
    if not traits_of(backend).network_faults:
        mechanisms = process_mechanisms()
    elif os.geteuid() != 0:
        return lambda fault: own(fault) or "the mechanism the probe picks at run time (`chaos doctor` as root shows it)"
    else:
        from chaos.probe import capabilities, last_probe
        mechanisms = choose_mechanisms(last_probe() or capabilities())
    return lambda fault: own(fault) or mechanisms[fault.kind].for_fault(fault).name  # type: ignore[attr-defined]


def cmd_init(args: argparse.Namespace) -> int:
    from harness.studies.init.command import init_command
    return init_command(args)


def cmd_schema(args: argparse.Namespace) -> int:
    import json
    from harness.scenario.schema import json_schema
    print(json.dumps(json_schema(), indent=2))
    return 0


def cmd_heal(args: argparse.Namespace) -> int:
    # no root needed: a user's heal takes back that user's runs (their ledgers are in the
    # user's state folder, chaos.ledger.state_dir)
    from chaos.heal import heal_command
    from harness.cluster.undos import undo_table
    return heal_command(args, undo_table())  # every backend's undos and sweeps


def cmd_doctor(args: argparse.Namespace) -> int:
    """What this machine and user can run: the probe's capabilities and fault mechanisms
    (root: it builds a scratch namespace), the backends, the devices."""
    from chaos import userns
    from chaos.doctor import doctor_command
    from chaos.inject import process_mechanisms
    from chaos.mechanism import Unavailable
    from harness.cluster.backends import BACKEND_NAMES, backend_class
    from harness.job.device import describe_host
    from harness.scenario.scenario import ClusterConfig
    from harness.trial import machine
    if args.backend == "slurm":  # the cluster's nodes, not this machine
        from harness.cluster.slurm.doctor import doctor_slurm
        return doctor_slurm()
    code = 0
    with contextlib.suppress(UsageError):  # an ordinary user: as root of a user namespace, where allowed
        require_privileges("chaos doctor")
    if os.geteuid() == 0:
        code = doctor_command(args)
    else:
        print(f"capabilities: not probed (the probe builds a scratch namespace as root; you are uid {os.geteuid()})")
        print("fault kinds on hosts without links of their own (--backend local):")
        mechanisms = process_mechanisms()
        for kind, mechanism in mechanisms.items():
            if not isinstance(mechanism, Unavailable):
                print(f"  {kind:10} {mechanism.name}")
        print(f"  {'the others':10} ({', '.join(k for k, m in mechanisms.items() if isinstance(m, Unavailable))}) "
              "act on a rank's link: they need a backend with links, as root")
    print(f"backends (as {userns.who()}):")
    for name in BACKEND_NAMES:
        backend = backend_class(name)
        why = backend.why_not_here()
        traits = backend.traits
        if not traits.network_faults:
            faults = "kill, pause, slow, step_delay, gpu_hang; no link faults"
        elif traits.link_kinds is None:
            faults = "every fault kind but a scheduler's"
        else:
            faults = (f"kill, pause, slow, step_delay, gpu_hang, {', '.join(traits.link_kinds)} on a node's own link, "
                      f"{', '.join(traits.scheduler_kinds)}")
        print(f"  {name:7} {'no   (' + why + ')' if why else 'yes'}: {backend.traits.summary}; {faults}")
    print(describe_host(ClusterConfig().ranks))
    # beside docs/performance.md's figures, how this machine compares
    print(machine.line_now())
    return code


def cmd_calibrate(args: argparse.Namespace) -> int:
    require_privileges("chaos calibrate")
    from chaos.calibrate import calibrate_command
    return calibrate_command(args)


def cmd_report(args: argparse.Namespace) -> int:
    from reports.cli import report_command
    return report_command(args)


def cmd_export(args: argparse.Namespace) -> int:
    from harness.k8s.cli import export_main
    return export_main(args)


def cmd_collect(args: argparse.Namespace) -> int:
    from harness.k8s.cli import collect_main
    return collect_main(args)


def cmd_nightly(args: argparse.Namespace) -> int:
    from harness.studies.nightly import nightly_command
    return nightly_command(args, require_privileges)


def cmd_slurm(args: argparse.Namespace) -> int:
    from harness.cluster.slurm.cli import slurm_command
    return slurm_command(args)


def cmd_tune(args: argparse.Namespace) -> int:
    from harness.studies.tune.command import tune_command
    return tune_command(args, require_privileges)


def cmd_explore(args: argparse.Namespace) -> int:
    from harness.studies.explore.command import explore_command
    return explore_command(args)


def cmd_campaign(args: argparse.Namespace) -> int:
    from harness.studies.campaign.command import campaign_command
    return campaign_command(args, require_privileges)


def _k8s_arguments(function: str) -> Callable[[argparse.ArgumentParser], None]:
    """`chaos export k8s ...`: the target platform is a sub-subcommand (Kubernetes only, today)."""
    def add(parser: argparse.ArgumentParser) -> None:
        targets = parser.add_subparsers(dest="target", required=True, parser_class=_Parser)
        k8s = targets.add_parser("k8s", help="Kubernetes: Kubeflow Trainer (or PyTorchJob) and Chaos Mesh",
                                 description="Kubernetes: Kubeflow Trainer (or PyTorchJob) and Chaos Mesh")
        _arguments_of("harness.k8s.cli", function)(k8s)
    return add


def _run_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("scenario", nargs="?", default=str(DEFAULT_SCENARIO),
                     help="scenario YAML file (default: the shipped link-down scenario)")
    run.add_argument("--policy", action="append", help="policy to run (repeatable; default: all in the file)")
    run.add_argument("--ranks", type=int, help="number of ranks (overrides cluster.ranks; past 8 per core the "
                     "step period, timeouts, hang cap and expected bounds stretch with it: docs/scale.md)")
    run.add_argument("--seed", type=int, help="seed (overrides the scenario's)")
    run.add_argument("--backend", choices=BACKEND_NAMES, help="host backend (default: the scenario's, netns)")
    run.add_argument("--out", default="runs", help="folder for run folders (default: ./runs)")
    slurm = run.add_argument_group("slurm backend", "the allocation each trial asks for (cluster.slurm)")
    slurm.add_argument("--ranks-per-node", type=int, help="ranks that share a node (overrides "
                       "cluster.ranks_per_node; default 1)")
    slurm.add_argument("--partition", help="sbatch --partition")
    slurm.add_argument("--account", help="sbatch --account")
    slurm.add_argument("--time", help="sbatch --time, a limit per trial (e.g. 10:00)")
    slurm.add_argument("--slurm-arg", action="append", help="one more sbatch argument, as it is (repeatable)")
    run.add_argument("--quiet", action="store_true", help="no progress output")
    run.add_argument("--dry-run", action="store_true",
                     help="print the resolved plan (which ranks, which mechanism, when) and exit")


def _doctor_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=("slurm",),
                        help="slurm: what the node agent may inject on each idle node of the cluster "
                             "SLURM_CONF names (one srun task per node)")


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def _arguments_of(module: str, function: str) -> Callable[[argparse.ArgumentParser], None]:
    def add(parser: argparse.ArgumentParser) -> None:
        import importlib
        getattr(importlib.import_module(module), function)(parser)
    return add


# name -> (help, how to declare its arguments, what runs it). Arguments are declared only for
# the command being run, so `chaos schema` never imports what `chaos report` needs (pandas).
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "run": ("run a scenario under its policies and report", _run_arguments, cmd_run),
    "init": ("write a commented first scenario: the built-in workload, or --job your own script",
             _arguments_of("harness.studies.init.command", "add_init_arguments"), cmd_init),
    "schema": ("print the JSON Schema of scenario files (for editors)", _no_arguments, cmd_schema),
    "report": ("re-analyze stored run folders", _arguments_of("reports.cli", "add_report_arguments"),
               cmd_report),
    "heal": ("remove what crashed runs left on this host",
             _arguments_of("chaos.heal", "add_heal_arguments"), cmd_heal),
    "doctor": ("what this machine can inject, and how; its speed (--backend slurm: each node of the cluster)",
               _doctor_arguments, cmd_doctor),
    "calibrate": ("measure each fault mechanism: configured vs measured",
                  _arguments_of("chaos.calibrate", "add_calibrate_arguments"), cmd_calibrate),
    "export": ("write one trial of a scenario as manifests for a cluster (export k8s ...)",
               _k8s_arguments("add_export_arguments"), cmd_export),
    "collect": ("read a trial run on a cluster back into a run folder (collect k8s ...)",
                _k8s_arguments("add_collect_arguments"), cmd_collect),
    "nightly": ("run a plan of scenarios x policies x repeats as one night: history, trends, gate",
                _arguments_of("harness.studies.nightly", "add_nightly_arguments"), cmd_nightly),
    "slurm": ("a local Slurm cluster to run --backend slurm on: up --nodes N, status, down",
              _arguments_of("harness.cluster.slurm.cli", "add_slurm_arguments"), cmd_slurm),
    "tune": ("measure the job without faults, derive timeouts and retries, try them under faults, recommend",
             _arguments_of("harness.studies.tune.command", "add_tune_arguments"), cmd_tune),
    "explore": ("draw fault schedules, run them, judge each trial against its policy's contract (docs/explore.md)",
                _arguments_of("harness.studies.explore.command", "add_explore_arguments"), cmd_explore),
    "campaign": ("each policy's effective training time (ETTR) under a realistic fault mix",
                 _arguments_of("harness.studies.campaign.command", "add_campaign_arguments"), cmd_campaign),
}


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The `chaos` parser; only the subcommand named in `argv` gets its arguments declared."""
    parser = _Parser(prog="chaos", description="Chaos tests for torch.distributed training jobs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (text, add_arguments, func) in COMMANDS.items():
        command = sub.add_parser(name, help=text, description=text)
        if name == chosen:
            add_arguments(command)
        command.set_defaults(func=func)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    signals.install()
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        args = build_parser(argv).parse_args(argv)
        return args.func(args)
    except UsageError as exc:
        print(f"chaos: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `chaos schema | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (KeyboardInterrupt, Terminated):
        print("chaos: interrupted; everything the run made was removed", file=sys.stderr)
        return 130
    except ChaosError as exc:
        print(f"chaos: failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
