"""NVIDIA's ft_launcher (nvidia-resiliency-ext) as a user's job (`job.launcher: ft_launcher`).

ft_launcher is torchrun with a rank monitor per worker: each host runs one agent, in a c10d
rendezvous on the harness's store as torchrun's agents are (harness.cluster.agent), with
torchrun's options and its own (`--ft-*`). Each worker sends heartbeats from the training
loop through `RankMonitorClient` (examples/train_ft_launcher.py); a worker whose heartbeat
is missing for `rank_heartbeat_timeout` (`initial_rank_heartbeat_timeout` before its first)
is terminated by its monitor, and the agent restarts the worker group (every agent's, by a
new rendezvous round) while it has restarts left (`job.max_restarts`). The workers resume
from the job's own checkpoint. ft_launcher has no coordinator of its own: every host trains,
and the rendezvous's store is the harness's.
"""
from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from chaos import proc
from chaos.faults import Seconds
from harness.cluster.agent import AgentHost, agent_command

INSTALL = ("pip install -e '.[frameworks]' in the harness's repository (nvidia-resiliency-ext==0.4.1), "
           "or run ./dev.sh")
BACKENDS = ("netns", "docker", "local", "slurm")  # every one: each has been run


class Settings(BaseModel):
    """ft_launcher's fault-tolerance options in a scenario (`job.ft_launcher:`), each its
    `--ft-<name>` flag; unset, ft_launcher's own default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    initial_rank_heartbeat_timeout: Seconds | None = Field(
        default=None, description="a worker with no first heartbeat this long after it started is terminated "
                                  "(ft_launcher's default: 1 h)")
    rank_heartbeat_timeout: Seconds | None = Field(
        default=None, description="a worker whose next heartbeat is this late is terminated (default: 45 min)")
    workload_check_interval: Seconds | None = Field(
        default=None, description="how often each rank monitor checks its worker's heartbeats (default: 5 s)")
    rank_section_timeouts: dict[str, Seconds] | None = Field(
        default=None, description="a worker whose named section (RankMonitorClient.start_section) is open this "
                                  "long is terminated, per section name, e.g. {step: 3s, checkpoint: 10s}")
    rank_out_of_section_timeout: Seconds | None = Field(
        default=None, description="a worker outside every section this long is terminated (its start included)")
    restart_policy: Literal["any-failed", "min-healthy"] | None = Field(
        default=None, description="any-failed: the worker groups restart when any fails (torchrun's); "
                                  "min-healthy: while at least min_hosts are healthy")
    relaunch: Seconds | None = Field(
        default=None, description="a host whose agent a kill fault ended is started again this long after, as "
                                  "the scheduler (Slurm, Kubernetes) starts a failed node's launcher again; the "
                                  "others restart their workers when it joins; default: never")


FLAGS = {"initial_rank_heartbeat_timeout": "--ft-initial-rank-heartbeat-timeout",
         "rank_heartbeat_timeout": "--ft-rank-heartbeat-timeout",
         "workload_check_interval": "--ft-workload-check-interval", "restart_policy": "--ft-restart-policy",
         "rank_section_timeouts": "--ft-rank-section-timeouts",
         "rank_out_of_section_timeout": "--ft-rank-out-of-section-timeout"}


def command(job: Any, host: AgentHost) -> list[str]:
    """One ft_launcher agent per host, torchrun's options and the scenario's `--ft-*`."""
    settings = job.ft_launcher or Settings()
    options = [f"{flag}={_flag_value(value)}" for name, flag in FLAGS.items()
               if (value := getattr(settings, name)) is not None]
    return agent_command("ft_launcher", job, host, len(host.addresses), *options)


def _flag_value(value: Any) -> str:
    """A setting as its flag takes it: seconds as a number, sections as name:seconds,..."""
    if isinstance(value, dict):
        return ",".join(f"{name}:{seconds:g}" for name, seconds in value.items())
    return f"{value:g}" if isinstance(value, float) else str(value)


def monitors(host_pid: int) -> list[tuple[int, int]]:
    """The rank monitors under a host's process, each with its start time: ft_launcher's
    agent forks one per worker (torch.multiprocessing's fork: the agent's command line), and
    each binds `_ft_launcher<its pid>_to_rmon.socket` in its temporary folder, where the
    agent talks to it: a descendant whose socket the host's network namespace lists is a
    monitor. Read from the namespace's socket table, not from a folder: the folder is the
    process's TMPDIR, which a preloaded start sets inside the process, where
    /proc/<pid>/environ does not show it."""
    bound = _bound_socket_names(host_pid)
    return [(pid, started) for pid, started in proc.descendants(host_pid)
            if f"_ft_launcher{pid}_to_rmon.socket" in bound]


def _bound_socket_names(pid: int) -> set[str]:
    """The file names of the Unix sockets bound in `pid`'s network namespace."""
    try:
        with open(f"/proc/{pid}/net/unix") as f:
            lines = f.read().splitlines()[1:]
    except OSError:  # gone
        return set()
    return {os.path.basename(fields[7]) for fields in map(str.split, lines) if len(fields) > 7}
