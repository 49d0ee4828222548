"""`chaos slurm up --nodes N [--cpus-per-node C] [--slurmd-timeout S]`, `chaos slurm status`, `chaos slurm down`:
the local cluster of harness.cluster.slurm.local."""
from __future__ import annotations

import argparse
import os
import sys

from chaos.errors import UsageError


def add_slurm_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, parser_class=type(parser))
    up = actions.add_parser("up", help="start a local cluster: munge, slurmctld, N slurmd, each node a "
                                       "network host of its own", description="start a local Slurm cluster")
    up.add_argument("--nodes", type=int, default=4, help="nodes (default 4)")
    up.add_argument("--cpus-per-node", type=int, help="CPUs each node reports (default: this machine's)")
    up.add_argument("--slurmd-timeout", type=int, default=300, metavar="S",
                    help="seconds the controller waits for a silent node's daemon before it sets the node "
                         "DOWN (Slurm's SlurmdTimeout; default 300, Slurm's own)")
    actions.add_parser("status", help="the local cluster and its nodes", description="the local cluster")
    down = actions.add_parser("down", help="stop the local cluster and remove everything it made",
                              description="stop the local cluster")
    down.add_argument("--id", help="one cluster by its id (default: every local one)")


def slurm_command(args: argparse.Namespace) -> int:
    from harness.cluster.slurm import commands, local
    if args.action == "up":
        if args.cpus_per_node is not None and args.cpus_per_node < 1:
            raise UsageError(f"--cpus-per-node {args.cpus_per_node}: expected 1 or more")
        cluster = local.up(args.nodes, args.cpus_per_node, say=lambda text: print(text, file=sys.stderr),
                           slurmd_timeout=args.slurmd_timeout)
        print(f"export SLURM_CONF={cluster.conf}")
        return 0
    if args.action == "down":
        gone = local.down(args.id)
        print(f"chaos slurm: {'removed ' + ', '.join(gone) if gone else 'no local cluster'}")
        return 0
    clusters = local.running()
    if not clusters:
        print("chaos slurm: no local cluster runs (`chaos slurm up --nodes 4` starts one)")
        return 0
    for cluster in clusters:
        print(f"{cluster.id}: {len(cluster.nodes)} nodes, {cluster.cpus_per_node} CPUs each; "
              f"export SLURM_CONF={cluster.conf}")
        os.environ["SLURM_CONF"] = cluster.conf
        print(commands.run(["sinfo", "-N", "-o", "%N %T %E"]).rstrip())
        jobs = commands.run(["squeue", "-h", "-o", "%i %j %T %N"]).rstrip()
        print(jobs or "no jobs")
    return 0
