"""`chaos campaign SCENARIO.yaml [--mix llama3|FILE] [--mtbf 60s] [--duration 20m] [--policy P]...
[--repeat N] [--seed N] [--ranks N] [--backend B] [--nodes N --node-mtbf 1000h] [--out DIR] [--dry-run]`: each policy's effective training time under a fault mix
(docs/campaign.md). Every value is checked before anything runs (UsageError: exit 2)."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from chaos import units
from chaos.errors import UsageError
from harness.cluster.backends import BACKEND_NAMES
from harness.studies.campaign.mix import DEFAULT_MIX, Mapped, Mix
from harness.studies.campaign.prepare import load_campaign_scenario, plan_campaign, seconds_of
from harness.studies.campaign.schedule import ScheduledFault

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
                             "policies may be named (elastic); a user's job (job:): its variants")
    parser.add_argument("--repeat", type=int, default=1,
                        help="windows per policy, each with its own schedule (seeds N, N+1, ...); the report "
                             "gives each figure's median and spread over them (default 1)")
    parser.add_argument("--seed", type=int, help="seed of the schedule (default: the scenario's)")
    parser.add_argument("--ranks", type=int, help="number of ranks (overrides cluster.ranks; the scenario's times "
                                                   "follow the ranks per core as with `chaos run --ranks`)")
    parser.add_argument("--backend", choices=BACKEND_NAMES, help="host backend (overrides cluster.backend)")
    parser.add_argument("--out", default="runs", help="folder for the campaign folder (default: ./runs)")
    parser.add_argument("--nodes", type=int, help="with --node-mtbf: project ETTR to a cluster of this many nodes "
                                                  "(a model from the measured costs, labelled so)")
    parser.add_argument("--node-mtbf", help="each node's mean time between failures, e.g. 1000h")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    parser.add_argument("--dry-run", action="store_true", help="print the mapping and the schedule, run nothing")


def campaign_command(args: argparse.Namespace, require_privileges) -> int:  # type: ignore[no-untyped-def]
    from harness.scenario.scenario import SEED_MAX

    if (args.nodes is None) != (args.node_mtbf is None):
        raise UsageError("--nodes and --node-mtbf go together (the projection needs both); give both or neither")
    if args.nodes is not None and args.nodes < 1:
        raise UsageError(f"--nodes {args.nodes}: must be at least 1")
    node_mtbf = None if args.node_mtbf is None else seconds_of("node_mtbf", args.node_mtbf,
                                                               {"node_mtbf": "--node-mtbf"})
    if args.seed is not None and not 0 <= args.seed <= SEED_MAX:
        raise UsageError(f"--seed {args.seed}: must be 0..{SEED_MAX}")
    overrides = {k: v for k, v in (("seed", args.seed), ("cluster.ranks", args.ranks),
                                   ("cluster.backend", args.backend)) if v is not None}
    scenario, own_faults = load_campaign_scenario(Path(args.scenario), overrides)
    projection = None if node_mtbf is None else {"nodes": args.nodes, "node_mtbf_s": node_mtbf}
    plan = plan_campaign(scenario, Path(args.scenario), args.policy, args.mix, args.mtbf, args.duration,
                         args.repeat, projection, shlex.join(["chaos", *sys.argv[1:]]))
    print(plan_text(plan.mix, plan.mapping, list(plan.schedules), list(plan.policies), list(plan.seeds), plan.mtbf_s,
                    plan.duration_s, plan.lead_in_s, args.scenario, scenario.cluster.backend, own_faults))
    if args.dry_run:
        return 0
    require_privileges("chaos campaign", scenario.cluster.backend)
    from harness.cluster.launcher import LauncherPool
    from harness.studies.campaign.run import campaign_folder, run_windows
    from harness.trial.progress import Progress
    from reports.campaign import spread_text

    parent = campaign_folder(Path(args.out), scenario.name)
    with LauncherPool() as launchers:  # one for every window: the ranks' torch is imported once
        windows = run_windows(plan, parent, Progress(quiet=args.quiet, scope=f"{scenario.name} campaign"), launchers,
                              say=print)
    if len(windows) > 1:
        print("\n" + spread_text(windows, parent))
    return 0


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
