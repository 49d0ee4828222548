"""`chaos campaign SCENARIO.yaml [--mix llama3|FILE] [--mtbf 60s] [--duration 20m] [--policy P]...
[--repeat N] [--seed N] [--nodes N --node-mtbf 1000h] [--out DIR] [--dry-run]`: each policy's effective training time under a fault mix
(docs/campaign.md). Every value is checked before anything runs (UsageError: exit 2)."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from chaos import units
from chaos.errors import UsageError
from harness.run.campaign.mix import DEFAULT_MIX, Mapped, Mix, load_mix
from harness.run.campaign.schedule import ScheduledFault, draw_schedule, expected_faults

DEFAULT_SCENARIO = Path(__file__).resolve().parents[3] / "scenarios" / "link_down.yaml"


def add_campaign_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", nargs="?", default=str(DEFAULT_SCENARIO),
                        help="scenario YAML file: its cluster, workload, warm-up, hang cap and policies "
                             "(its own faults are replaced by the mix's; default: scenarios/link_down.yaml)")
    parser.add_argument("--mix", default=DEFAULT_MIX, help=f"a shipped mix ({DEFAULT_MIX}) or a mix file")
    parser.add_argument("--mtbf", default="60s", help="mean time between faults in the whole job (default 60s)")
    parser.add_argument("--duration", default="20m", help="the window each policy trains in (default 20m)")
    parser.add_argument("--policy", action="append",
                        help="policy to run (repeatable; default: the scenario's); any of the harness's "
                             "policies may be named (elastic)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="windows per policy, each with its own schedule (seeds N, N+1, ...); the report "
                             "gives each figure's median and spread over them (default 1)")
    parser.add_argument("--seed", type=int, help="seed of the schedule (default: the scenario's)")
    parser.add_argument("--out", default="runs", help="folder for the campaign folder (default: ./runs)")
    parser.add_argument("--nodes", type=int, help="with --node-mtbf: project ETTR to a cluster of this many nodes "
                                                  "(a model from the measured costs, labelled so)")
    parser.add_argument("--node-mtbf", help="each node's mean time between failures, e.g. 1000h")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    parser.add_argument("--dry-run", action="store_true", help="print the mapping and the schedule, run nothing")


def _seconds(option: str, value: str) -> float:
    try:
        seconds = units.parse_duration(value)
    except ValueError as exc:
        raise UsageError(f"{option} {value}: {exc}") from None
    if not 0 < seconds < float("inf"):
        raise UsageError(f"{option} {value}: must be above 0; give {units.DURATION_FORM}")
    return seconds


def campaign_command(args: argparse.Namespace, require_privileges) -> int:  # type: ignore[no-untyped-def]
    from harness.job.policies import POLICY_NAMES
    from harness.run.scenario import SEED_MAX, load_scenario

    mtbf, duration = _seconds("--mtbf", args.mtbf), _seconds("--duration", args.duration)
    if args.repeat < 1:
        raise UsageError(f"--repeat {args.repeat}: must be at least 1 (windows per policy)")
    if (args.nodes is None) != (args.node_mtbf is None):
        raise UsageError("--nodes and --node-mtbf go together (the projection needs both); give both or neither")
    if args.nodes is not None and args.nodes < 1:
        raise UsageError(f"--nodes {args.nodes}: must be at least 1")
    node_mtbf = None if args.node_mtbf is None else _seconds("--node-mtbf", args.node_mtbf)
    if args.seed is not None and not 0 <= args.seed <= SEED_MAX:
        raise UsageError(f"--seed {args.seed}: must be 0..{SEED_MAX}")
    scenario = load_scenario(args.scenario, {"seed": args.seed} if args.seed is not None else None)
    if scenario.job is not None:
        raise UsageError(f"{args.scenario}: job: a campaign runs the harness's own runner; a user's job is not "
                         "built yet (its checkpoint resume differs); use a scenario with policies:")
    policies = args.policy or list(scenario.policies)
    for policy in policies:
        if policy not in scenario.policies and policy not in POLICY_NAMES:
            raise UsageError(f"--policy {policy}: not in {args.scenario}'s policies nor a harness policy "
                             f"({', '.join(dict.fromkeys([*scenario.policies, *POLICY_NAMES]))})")
    if len(set(policies)) != len(policies):
        raise UsageError(f"--policy {next(p for p in policies if policies.count(p) > 1)} given twice; give it once")
    mix = load_mix(args.mix)
    mapping = mix.mapping(scenario.cluster.backend, scenario.cluster.ranks)
    # the first fault comes once the job has trained as long as its warm-up did
    lead_in = scenario.warmup_steps * scenario.workload.step_period
    if expected_faults(mtbf, duration, lead_in) < 1:
        raise UsageError(f"--mtbf {args.mtbf} over --duration {args.duration}: less than one fault is expected "
                         f"after the {lead_in:g} s lead-in (the scenario's warm-up); make --duration at least "
                         f"{units.format_duration(mtbf + lead_in)} or --mtbf shorter")
    seeds = [scenario.seed + r for r in range(args.repeat)]
    schedules = [draw_schedule(mapping, mtbf, duration, lead_in, scenario.cluster.ranks, seed) for seed in seeds]
    for seed, schedule in zip(seeds, schedules, strict=True):
        if not any(f.fault for f in schedule):
            raise UsageError(f"--seed {seed}: the schedule holds no fault the {scenario.cluster.backend} backend "
                             f"can inject ({len(schedule)} drawn); give another --seed or a longer --duration")
    print(plan_text(mix, mapping, schedules, policies, seeds, mtbf, duration, lead_in, args.scenario,
                    scenario.cluster.backend, bool(scenario.faults)))
    if args.dry_run:
        return 0
    require_privileges("chaos campaign", scenario.cluster.backend)
    projection = None if node_mtbf is None else {"nodes": args.nodes, "node_mtbf_s": node_mtbf}
    return _run(args, scenario, policies, mix, mapping, schedules, mtbf, duration, lead_in, projection)


def plan_text(mix: Mix, mapping: tuple[Mapped, ...], schedules: list[tuple[ScheduledFault, ...]], policies: list[str],
              seeds: list[int], mtbf: float, duration: float, lead_in: float, scenario_file: str, backend: str,
              own_faults: bool) -> str:
    lines = [f"mix {mix.name} ({mix.path}): {mix.source}", f"mapping on the {backend} backend:"]
    lines += [f"  {m.category.name:24} {m.category.share:6.1%}  {m.text()}" for m in mapping]
    for r, (seed, schedule) in enumerate(zip(seeds, schedules, strict=True)):
        injected = [f for f in schedule if f.fault]
        lines.append((f"window {r}: " if len(seeds) > 1 else "")
                     + f"schedule (seed {seed}): Poisson, mean {units.format_duration(mtbf)} between faults, "
                     f"from +{lead_in:g} s to +{units.format_duration(duration)}: {len(schedule)} faults, "
                     f"{len(injected)} injected, the same for every policy")
        lines += [f"  {i:3}  {f.text()}" for i, f in enumerate(schedule)]
    lines.append(f"policies: {', '.join(policies)}; and a fault-free reference of the same window")
    if own_faults:
        lines.append(f"note: {scenario_file}'s own faults are not used; the mix's are")
    return "\n".join(lines)


def _run(args: argparse.Namespace, scenario, policies, mix, mapping, schedules, mtbf, duration,  # type: ignore[no-untyped-def]
         lead_in, projection) -> int:
    from harness.cluster.launcher import LauncherPool
    from harness.job.device import PlacementError, choose, visible_gpus
    from harness.run.campaign.run import campaign_folder
    from harness.run.plan import placement_problem
    from harness.run.progress import Progress
    from reports.campaign import spread_text

    try:
        placement = choose(scenario.cluster.device, scenario.cluster.comm, scenario.cluster.ranks, visible_gpus())
    except PlacementError as exc:
        raise UsageError(f"{args.scenario}: {exc}") from None
    problem = placement_problem(scenario, Path(args.scenario), placement.device, placement.reason)
    if problem:
        raise UsageError(problem)
    parent = campaign_folder(Path(args.out), scenario.name)
    progress = Progress(quiet=args.quiet, scope=f"{scenario.name} campaign")
    windows = []
    with LauncherPool() as launchers:  # one for every window: the ranks' torch is imported once
        launchers.start_ahead()
        for r, schedule in enumerate(schedules):
            windows.append(_window(args, scenario, policies, mix, mapping, schedule, r, len(schedules) > 1, mtbf,
                                   duration, lead_in, projection, parent, placement, progress, launchers))
    if len(windows) > 1:
        print("\n" + spread_text(windows, parent))
    return 0


def _window(args: argparse.Namespace, scenario, policies, mix, mapping, schedule, r: int, repeated: bool,  # type: ignore[no-untyped-def]
            mtbf, duration, lead_in, projection, parent: Path, placement, progress, launchers) -> Path:
    """Run one window of the campaign and print its report; returns its folder."""
    from harness.cluster.backends import backend_named
    from harness.run.campaign.run import run_campaign
    from reports.campaign import write_campaign_report
    from runfolder.layout import CAMPAIGN_FORMAT

    folder = parent / f"window-{r}" if repeated else parent
    folder.mkdir(exist_ok=True)
    record = {"format": CAMPAIGN_FORMAT, "command": shlex.join(["chaos", *sys.argv[1:]]),
              "scenario": str(args.scenario), "window": r,
              "mix": {"name": mix.name, "source": mix.source, "file": str(mix.path)},
              "mapping": [{"category": m.category.name, "share": m.category.share, "injects": m.text(),
                           "left_out": m.left_out} for m in mapping],
              "seed": scenario.seed + r, "mtbf_s": mtbf, "duration_s": duration, "lead_in_s": lead_in,
              "backend": scenario.cluster.backend, "ranks": scenario.cluster.ranks, "schedule": list(schedule),
              "projection": projection, "partial": True}
    interrupted = None
    try:
        run_campaign(scenario, policies, mix, mapping, schedule, duration, folder,
                     backend_named(scenario.cluster.backend), placement, progress, launchers, record)
    except BaseException as exc:  # Ctrl-C or an error: what was measured is reported, marked partial
        interrupted = exc
    try:
        print(("" if not repeated else f"\nwindow {r} (seed {scenario.seed + r}):\n")
              + write_campaign_report(folder))
    except Exception as exc:
        if interrupted is None:
            raise
        print(f"chaos: the campaign's report could not be written ({exc})", file=sys.stderr)
    if interrupted is not None:
        print(f"campaign stopped early: the figures above are partial ({folder})", file=sys.stderr)
        raise interrupted
    return folder
