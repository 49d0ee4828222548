"""`chaos doctor --backend slurm`: what the node agent may inject on each node of the
cluster SLURM_CONF names, asked of the nodes themselves: one srun task per idle node runs
harness.cluster.slurm.nodecheck as the agent would run there (same user, same Python), in
a job named after a run id and recorded before it is submitted, like a trial's."""
from __future__ import annotations

import json
import secrets
import sys

from chaos.errors import HarnessError
from chaos.ledger import Ledger
from chaos.undo import record_owner
from harness.cluster.slurm import commands
from harness.cluster.slurm.cluster import job_name

CHECK_TIMEOUT_S = 120.0
SCHEDULABLE = ("idle", "mixed")


def schedulable_nodes() -> list[str]:
    out = commands.run(["sinfo", "-h", "-N", "-o", "%N %T"])
    return sorted({line.split()[0] for line in out.splitlines()
                   if len(line.split()) == 2 and line.split()[1].rstrip("*~#") in SCHEDULABLE})


def check_nodes(nodes: list[str]) -> list[dict]:
    """One answer per node, from the node (srun, one task each), recorded and taken back."""
    run_id = f"doctor{secrets.token_hex(3)}"
    ledger = Ledger(run_id)
    record_owner(ledger)
    entry = ledger.record("slurm_job", name=job_name(run_id), conf=commands.conf_path())
    ledger.mark(entry, "done")
    try:
        out = commands.run(["srun", "--job-name", job_name(run_id), "--nodelist", ",".join(nodes),
                            "--nodes", str(len(nodes)), "--ntasks-per-node", "1", "--immediate=30",
                            sys.executable, "-P", "-m", "harness.cluster.slurm.nodecheck"], timeout_s=CHECK_TIMEOUT_S)
    finally:
        commands.cancel_named(job_name(run_id))
        ledger.mark(entry, "undone")
        ledger.close_if_clean()
    answers = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if len(answers) != len(nodes):
        raise HarnessError(f"{len(answers)} of {len(nodes)} nodes answered the check; see `srun` above")
    return sorted(answers, key=lambda a: a["node"])


def doctor_slurm() -> int:
    """Print, per node, the fault kinds the agent may inject there and why not the others."""
    commands.ping()
    nodes = schedulable_nodes()
    if not nodes:
        print(f"slurm ({commands.conf_note()}): no idle node to check (`sinfo -N`)")
        return 1
    print(f"slurm nodes ({commands.conf_note()}), checked by one srun task each, as the node agent runs:")
    for answer in check_nodes(nodes):
        kinds = answer["kinds"]
        yes = [k for k, v in kinds.items() if v == "yes"]
        print(f"  {answer['node']:10} uid {answer['uid']}: {', '.join(yes)}")
        for reason in sorted({v for v in kinds.values() if v != "yes"}):
            print(f"  {'':10}   not {', '.join(k for k, v in kinds.items() if v == reason)}: {reason}")
    print("  every node: preempt, requeue (the job's owner); node_down, drain (an operator: root or SlurmUser)")
    return 0
