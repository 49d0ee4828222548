"""A heal on a Slurm node of what the run's agent there left: its ledger `<run id>.<node>`,
made in the node's own network namespace and so taken back only there (chaos.heal: a
ledger's place). The login node's heal of a run's `slurm_nodes` entry starts it through
srun, one task per node, once the run's job is cancelled; a user can run it on a node by
hand. Prints one JSON line per node: what was undone, what could not be; exits 1 if any."""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys

from chaos.heal import heal
from harness.cluster.slurm.undo import NODE_UNDOS, node_run_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.cluster.slurm.nodeheal", description=__doc__)
    parser.add_argument("--run-id", required=True, help="the run whose agent ran here")
    args = parser.parse_args(argv)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    report = heal(NODE_UNDOS, node_run_id(args.run_id, node), place=node)
    print(json.dumps({"node": node, "undone": report.undone, "failed": report.failed}))
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
