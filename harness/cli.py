"""The `chaos` command line.

    chaos run SCENARIO.yaml [--policy NAME]... [--ranks N] [--seed N] [--out DIR]
                            [--backend netns|docker] [--quiet]
    chaos report RUN_DIR... [--out DIR]      re-analyze stored runs, no re-run
    chaos run SCENARIO.yaml --dry-run        the resolved plan, nothing touched
    chaos schema                             JSON Schema of scenario files, for editors
    chaos heal [--run-id ID | --all]         remove what crashed runs left behind
    chaos doctor                             what this machine can inject, and how
    chaos calibrate                          configured vs measured, per fault mechanism

Exit codes: 0 success, 1 a run finished but an expectation failed (or the run could not
complete), 2 bad input (the message names the problem and the fix), 130 interrupted.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

from chaos.errors import ChaosError, UsageError
from harness import signals
from harness.signals import Terminated

DEFAULT_SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "link_down.yaml"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own usage errors: one line, exit 2
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise UsageError(f"{what} needs root (network namespaces, netlink, signals): "
                         f"run it as root, e.g. `sudo $(which chaos) {what.split()[-1]} ...`")


def cmd_run(args: argparse.Namespace) -> int:
    from harness.cluster.backends import backend_named
    from harness.run.orchestrator import plan_text, run_scenario
    from harness.run.progress import Progress
    from harness.run.scenario import load_scenario
    import reports

    overrides = {}
    if args.ranks is not None:
        overrides["cluster.ranks"] = args.ranks
    if args.seed is not None:
        overrides["seed"] = args.seed
    if args.backend is not None:
        overrides["cluster.backend"] = args.backend
    scenario = load_scenario(args.scenario, overrides)
    policies = args.policy or list(scenario.policies)
    unknown = [p for p in policies if p not in scenario.policies]
    if unknown:
        raise UsageError(f"--policy {unknown[0]}: not in {args.scenario}'s policies "
                         f"({', '.join(scenario.policies)}); add it under 'policies:' or pick one of those")
    if args.dry_run:
        print(plan_text(scenario, Path(args.scenario), policies, _mechanism_names()))
        return 0
    require_root("chaos run")
    backend = backend_named(scenario.cluster.backend)
    progress = Progress(quiet=args.quiet, scope=scenario.name)
    run_dir, _ = run_scenario(scenario, Path(args.scenario), policies, Path(args.out), backend, progress)
    written = reports.write_reports(run_dir)
    table = reports.analyze_run(run_dir)
    print(reports.format_table(table))
    print(f"\nrun folder: {run_dir}\nreport:     {written['report.md']}")
    failures = reports.expectation_failures(table)
    for line in failures:
        print(f"EXPECTATION FAILED: {line}", file=sys.stderr)
    if failures:
        print(f"reproduce: chaos run {args.scenario} --policy <policy> --seed {scenario.seed}",
              file=sys.stderr)
    return 1 if failures else 0


def _mechanism_names() -> Callable[[object], str]:
    """Which mechanism each fault kind gets here, as `chaos doctor` probes it (root only)."""
    if os.geteuid() != 0:
        return lambda fault: "the mechanism the probe picks at run time (`chaos doctor` as root shows it)"
    from chaos.inject import default_mechanisms
    mechanisms = default_mechanisms()
    return lambda fault: mechanisms[fault.kind].name  # type: ignore[attr-defined]


def cmd_schema(args: argparse.Namespace) -> int:
    import json
    from harness.run.scenario import json_schema
    print(json.dumps(json_schema(), indent=2))
    return 0


def cmd_heal(args: argparse.Namespace) -> int:
    require_root("chaos heal")
    from chaos.heal import heal_main
    from harness.cluster.backends import load_undo_plugins
    load_undo_plugins()  # undos that backends (docker) register
    return heal_main(args.rest)


def _delegate(module: str, function: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        import importlib
        return getattr(importlib.import_module(module), function)(args.rest)
    return run


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="chaos", description="Chaos tests for torch.distributed training jobs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="run a scenario under its policies and report")
    run.add_argument("scenario", nargs="?", default=str(DEFAULT_SCENARIO),
                     help="scenario YAML file (default: the shipped link-down scenario)")
    run.add_argument("--policy", action="append", help="policy to run (repeatable; default: all in the file)")
    run.add_argument("--ranks", type=int, help="number of ranks (overrides cluster.ranks)")
    run.add_argument("--seed", type=int, help="seed (overrides the scenario's)")
    run.add_argument("--backend", choices=["netns", "docker"], help="host backend (default: the scenario's, netns)")
    run.add_argument("--out", default="runs", help="folder for run folders (default: ./runs)")
    run.add_argument("--quiet", action="store_true", help="no progress output")
    run.add_argument("--dry-run", action="store_true",
                     help="print the resolved plan (which ranks, which mechanism, when) and exit")
    run.set_defaults(func=cmd_run)

    schema = sub.add_parser("schema", help="print the JSON Schema of scenario files (for editors)")
    schema.set_defaults(func=cmd_schema)

    heal = sub.add_parser("heal", help="remove what crashed runs left on this host", add_help=False)
    heal.add_argument("rest", nargs=argparse.REMAINDER)
    heal.set_defaults(func=cmd_heal)

    for name, module, function, text in [
        ("report", "reports", "report_main", "re-analyze stored run folders"),
        ("doctor", "chaos.probe", "doctor_main", "what this machine can inject, and how"),
        ("calibrate", "chaos.calibrate", "calibrate_main", "measure each fault mechanism"),
    ]:
        p = sub.add_parser(name, help=text, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=_delegate(module, function))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    signals.install()
    try:
        args = build_parser().parse_args(argv)
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
