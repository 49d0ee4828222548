"""torchft as a user's job (`job.launcher: torchft`): replica groups healed live from a peer.

The cluster's last host runs the Lighthouse (`torchft_lighthouse`, a Rust server behind a
Python entry point), which forms a quorum from the Managers' heartbeats every step: it is
torchft's coordinator, on a host of its own so that a fault can target it. Every other host
is one replica group: a torchrun agent (static rendezvous, one node) that hosts the group's
TCP store at the host's address, MASTER_PORT, and starts `nproc_per_host` workers. Each
worker's Manager finds the Lighthouse through TORCHFT_LIGHTHOUSE; the group's number and the
number of groups come as REPLICA_GROUP_ID and NUM_REPLICA_GROUPS (the names torchft's own
examples read). A Manager advertises `socket.gethostname()` to its peers (its server and
the HTTP checkpoint transport a healing peer reads from), so each host's processes get a
hostname of their own: the host's address (every network namespace shares the machine's
name, which resolves to loopback).
"""
from __future__ import annotations

from typing import Any, Sequence

from pydantic import BaseModel, ConfigDict, Field

from chaos.faults import Seconds
from harness.cluster.agent import AgentHost
from harness.cluster.spec import JOB_MASTER_PORT

LIGHTHOUSE = "torchft_lighthouse"
LIGHTHOUSE_PORT = 29510  # torchft's default --bind port
INSTALL = "pip install -e '.[frameworks]' in the harness's repository (torchft==0.2.0), or run ./dev.sh"
# a Manager advertises its hostname, which its peers must resolve to its host: the netns
# backend gives each host's processes a UTS namespace named after its address (root on the
# machine's kernel, as the netns backend has), and so does a node of the local Slurm cluster
# (the agent is root where root runs the trial); a docker container, and a node of a real
# Slurm cluster, has a name of its own that the others resolve.
BACKENDS = ("netns", "docker", "slurm")
WHY_BACKENDS = ("the local backend's hosts share loopback, where every replica group's store would take the same "
                "port")


class Settings(BaseModel):
    """torchft's options in a scenario (`job.torchft:`): the Lighthouse's flags and the
    Managers' timeouts (torchft's TORCHFT_*_SEC variables, which win over the script's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_replicas: int = Field(default=1, ge=1, description="the Lighthouse's --min_replicas: the fewest replica "
                                                           "groups a quorum forms with")
    quorum_tick_ms: int = Field(default=100, ge=1, description="the Lighthouse's --quorum_tick_ms: how often it "
                                                               "checks for a quorum while it waits for stragglers")
    join_timeout_ms: int = Field(default=10000, ge=0, description="the Lighthouse's --join_timeout_ms: how long it "
                                                                  "waits for heartbeating stragglers to join")
    heartbeat_timeout_ms: int = Field(default=5000, ge=1, description="the Lighthouse's --heartbeat_timeout_ms: a "
                                                                      "replica group silent this long is dead")
    timeout: float | None = Field(default=None, gt=0, description="seconds: the Managers' timeout "
                                                                  "(TORCHFT_TIMEOUT_SEC; default: the script's)")
    quorum_timeout: float | None = Field(default=None, gt=0, description="seconds: the Managers' quorum timeout "
                                                                         "(TORCHFT_QUORUM_TIMEOUT_SEC)")
    relaunch: Seconds | None = Field(
        default=None, description="a host a kill fault ended (a replica group's, or the Lighthouse's) is started "
                                  "again this long after, as the scheduler torchft runs under (torchx, "
                                  "Kubernetes) starts a failed replica group or the Lighthouse again; one that "
                                  "crashed by itself is not (its crash is the trial's outcome); default: never")


def lighthouse_command(settings: Settings) -> list[str]:
    return [LIGHTHOUSE, "--min_replicas", str(settings.min_replicas), "--quorum_tick_ms", str(settings.quorum_tick_ms),
            "--join_timeout_ms", str(settings.join_timeout_ms), "--heartbeat_timeout_ms",
            str(settings.heartbeat_timeout_ms), "--bind", f"[::]:{LIGHTHOUSE_PORT}"]


def command(job: Any, host: AgentHost) -> list[str]:
    """The Lighthouse on the last host; on every other, the replica group's torchrun agent,
    which hosts the group's store at the host's address and runs the job's command."""
    if host.number == len(host.addresses) - 1:
        return lighthouse_command(job.torchft or Settings())
    return ["torchrun", "--nnodes=1", f"--nproc-per-node={job.nproc_per_host}", f"--master-addr={host.address}",
            f"--master-port={JOB_MASTER_PORT}", f"--rdzv-id={host.run_id}-g{host.number}",
            f"--max-restarts={job.max_restarts}", f"--log-dir={host.log_dir}", "--no-python", *host.workers]


def environment(job: Any, host: int, addresses: Sequence[str]) -> dict[str, str]:
    """What a replica group's processes get: the Lighthouse's address, the group's number
    and the number of groups, and the Managers' timeouts the scenario sets."""
    settings = job.torchft or Settings()
    env = {"TORCHFT_LIGHTHOUSE": f"http://{addresses[-1]}:{LIGHTHOUSE_PORT}", "REPLICA_GROUP_ID": str(host),
           "NUM_REPLICA_GROUPS": str(len(addresses) - 1)}
    if settings.timeout is not None:
        env["TORCHFT_TIMEOUT_SEC"] = f"{settings.timeout:g}"
    if settings.quorum_timeout is not None:
        env["TORCHFT_QUORUM_TIMEOUT_SEC"] = f"{settings.quorum_timeout:g}"
    return env
