"""The command line of a torchrun-compatible elastic agent on one host: torchrun itself, or
a launcher built on torch.distributed.elastic that takes torchrun's options (NVIDIA's
ft_launcher, harness.cluster.frameworks.ft_launcher).

The agent joins a c10d rendezvous on the harness's store (`rendezvous`, host:port on the
switch), advertises the host's own address (every network namespace shares the machine's
hostname), runs the job's command as its `nproc_per_host` workers as written
(`--no-python`), and keeps their error files in the trial's logs (by default torchrun makes
a folder under /tmp per agent and never removes it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class AgentHost:
    """What one host's launcher command is made from."""

    number: int                # the host's rank in the cluster
    addresses: Sequence[str]   # every host's address (a framework's coordinator's is the last)
    run_id: str
    workers: list[str]         # the job's command as the agent runs it (through the preloaded stub)
    log_dir: str               # the agent's log folder, in the trial's logs
    rendezvous: str            # host:port of the c10d rendezvous's store

    @property
    def address(self) -> str:
        return self.addresses[self.number]


def agent_command(program: str, job: Any, host: AgentHost, hosts: int, *options: str) -> list[str]:
    """`program` (torchrun's options) on `host`, one of `hosts` agents in the rendezvous
    (`job.min_hosts` of them at least, where the job is elastic), `options` before the
    workers' command."""
    nnodes = f"{job.min_hosts}:{hosts}" if job.min_hosts is not None else f"{hosts}"
    return [program, f"--nnodes={nnodes}", f"--nproc-per-node={job.nproc_per_host}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={host.rendezvous}", f"--rdzv-id={host.run_id}", f"--max-restarts={job.max_restarts}",
            *([f"--rdzv-conf={rdzv_conf_text(job.rdzv_conf)}"] if job.rdzv_conf else []),
            f"--local-addr={host.address}", f"--log-dir={host.log_dir}", *options, "--no-python", *host.workers]


def rdzv_conf_text(conf: dict[str, int]) -> str:
    """torchrun's --rdzv-conf value: key=value pairs, comma-separated."""
    return ",".join(f"{key}={value}" for key, value in conf.items())
