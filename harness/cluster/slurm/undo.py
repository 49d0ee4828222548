"""What takes back the slurm backend's side effects: the run's allocation, cancelled by its
name (`chaos-<run id>`, recorded before it was submitted, so a harness killed before it read
the job's id still leaves a job a heal finds; one whose sbatch was cut off is waited for
a moment, since it may register after a first look found none), what an agent killed
before it took its faults back left on its node (a heal there, through srun), a node a fault
set down or drained, resumed, and a node's daemon a fault killed, started again (by the
node's agent, or a heal there). Kept light: every heal imports it."""
from __future__ import annotations

import os
import time
from typing import Any

from chaos.ledger import Ledger
from chaos.undotable import UndoTable
from chaos.undo import UNDOS as CHAOS_UNDOS
from harness.cluster.slurm import commands


def _gone(args: dict[str, Any]) -> bool:
    """The run's cluster is gone with its configuration (a local cluster taken down): so are
    its jobs and its nodes' states."""
    return bool(args.get("conf")) and not os.path.exists(args["conf"])


def _cancel_job(args: dict[str, Any]) -> None:
    if not _gone(args):
        commands.cancel_named(args["name"], args.get("conf"))


SUBMISSION_SETTLE_S = 3.0  # how long a cut-off submission's job may take to show in squeue


def _cancel_submission(args: dict[str, Any]) -> None:
    """sbatch was cut off: its job shows within a moment, or was never submitted."""
    deadline = time.monotonic() + SUBMISSION_SETTLE_S
    while not _gone(args) and not commands.cancel_named(args["name"], args.get("conf")):
        if time.monotonic() > deadline:
            return
        time.sleep(0.2)


def node_run_id(run_id: str, node: str) -> str:
    """The run id of the ledger a run's agent keeps on `node` (its place: the node)."""
    return f"{run_id}.{node}"


NODE_HEAL_IMMEDIATE_S = 30  # srun gives up when the nodes are not free by then (another job holds them)
NODE_HEAL_TIMEOUT_S = 120.0


def _heal_nodes(args: dict[str, Any]) -> None:
    """What a node's agent left (it was killed before it took its faults back; its ledger is
    on the node): the run's job is cancelled first, its agents end with it, then a heal on
    each node, one srun task per node."""
    nodes = args["nodes"]
    if _gone(args):  # a local cluster taken down: its nodes' namespaces went, and what the ledgers name
        for node in nodes:
            Ledger(node_run_id(args["run_id"], node)).path.unlink(missing_ok=True)
        return
    commands.cancel_named(args["name"], args.get("conf"))
    argv = ["srun", "--job-name", args["name"], "--nodelist", ",".join(nodes), "--nodes", str(len(nodes)),
            "--ntasks-per-node", "1", f"--immediate={NODE_HEAL_IMMEDIATE_S}", *args.get("placement", ()),
            args["python"], "-m", "harness.cluster.slurm.nodeheal", "--run-id", args["run_id"]]
    try:
        commands.run(argv, timeout_s=NODE_HEAL_TIMEOUT_S, conf=args.get("conf"))
    except commands.SlurmError as exc:
        raise commands.SlurmError(f"the heal on nodes {','.join(nodes)} did not complete ({exc}); on each node "
                                  f"run `{args['python']} -m harness.cluster.slurm.nodeheal --run-id "
                                  f"{args['run_id']}`") from None


def _resume_node(args: dict[str, Any]) -> None:
    """A node a fault set DOWN or DRAIN, back in service (one already resumed stays so)."""
    if _gone(args):
        return
    state = commands.node_info(args["node"], args.get("conf")).get("State", "")
    if "DOWN" in state or "DRAIN" in state:
        commands.set_node_state(args["node"], "RESUME", conf=args.get("conf"))


def _start_slurmd(args: dict[str, Any]) -> None:
    from harness.cluster.slurm import slurmd
    slurmd.start_again(args)


UNDOS = UndoTable({"slurm_job": _cancel_job, "slurm_submission": _cancel_submission,
                   "slurm_nodes": _heal_nodes, "slurm_node_state": _resume_node, "slurmd_killed": _start_slurmd})
# What a node's agent records, taken back by the agent or by a heal on the node (harness.cluster.slurm.nodeheal)
NODE_UNDOS = UndoTable.combine({"chaos": CHAOS_UNDOS, "slurm": UNDOS})
