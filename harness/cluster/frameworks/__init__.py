"""Fault-tolerance frameworks run as a user's job (`job.launcher: <name>`): one module each.

A framework is what a team deploys to survive faults (torchft, NVIDIA's ft_launcher, ...):
its own processes on each host, perhaps a coordinator of its own, its own settings. Each
module says, as a `Framework`:

    package      the Python module its processes import; without it the scenario is
                 refused at load, saying how to install it (`install`)
    settings     the model of its options, given under `job.<name>:` in a scenario
    backends     where it can run; elsewhere the scenario is refused at load, with why
    coordinator  its coordinator's process (None: it has none), started on a host of its
                 own, the cluster's last, so that faults can target it as any host
                 (runfolder.frameworks says which hosts train)
    command      what runs on a host (harness.cluster.agent.AgentHost): a training host's
                 agent (a torchrun, or the framework's launcher), or the coordinator; None:
                 no agent, the job's command runs once per host with the torchrun contract,
                 as the `direct` launcher runs it
    environment  what a training host's processes get besides the torchrun contract (None:
                 nothing)
    own_hostname each host's processes see a hostname of their own (the host's address),
                 where the framework advertises `socket.gethostname()` to its peers
    elastic      its hosts form one torchrun rendezvous, which takes torchrun's elastic
                 options (`min_hosts`, `rdzv_conf`)
    monitors     the processes its agent watches its workers with, under a host's process
                 (None: it has none): what a fault with `processes: monitors` acts on

A host a kill fault ended is started again after its settings' `relaunch` (where they have
one), as the framework's scheduler would start it again.

The harness's side stays the same for every framework: the hosts, the hook inside each rank
(harness.job.hook: steps, state fingerprints), the output tap (runfolder.classify: its log
lines), the faults, the reports. A new framework is one module here and one line in
FRAMEWORKS (and in runfolder.frameworks.COORDINATED where it has a coordinator).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from pydantic import BaseModel

from harness.cluster.agent import AgentHost
from harness.cluster.frameworks import ft_launcher, nvrx_inprocess, torchft


@dataclass(frozen=True)
class Framework:
    name: str
    package: str
    install: str
    settings: type[BaseModel]
    backends: tuple[str, ...]
    why_backend: str = ""  # why it runs on `backends` only, where that is not every backend
    coordinator: str | None = None
    command: Callable[[Any, AgentHost], list[str]] | None = None  # (job, host) -> argv
    # (job, host, addresses) -> the training host's environment besides the harness's
    environment: Callable[[Any, int, Sequence[str]], dict[str, str]] | None = None
    own_hostname: bool = False
    elastic: bool = False
    # (a host's process) -> its agent's monitors of its workers, each (pid, start time)
    monitors: Callable[[int], list[tuple[int, int]]] | None = None

    @property
    def agent(self) -> bool:
        """Each host runs an agent that starts the workers."""
        return self.command is not None

    def installed(self) -> bool:
        return importlib.util.find_spec(self.package) is not None

    def relaunch(self, job: Any) -> float | None:
        """Seconds after a kill fault ended a host's processes that they start again: the
        job's settings' `relaunch` (None: never, as for settings without one)."""
        return getattr(getattr(job, self.name) or self.settings(), "relaunch", None)

    def host_environment(self, job: Any, host: int, addresses: Sequence[str]) -> dict[str, str]:
        return {} if self.environment is None else self.environment(job, host, addresses)


FRAMEWORKS: dict[str, Framework] = {
    "torchft": Framework(
        name="torchft", package="torchft", install=torchft.INSTALL, settings=torchft.Settings,
        backends=torchft.BACKENDS, why_backend=torchft.WHY_BACKENDS, coordinator=torchft.LIGHTHOUSE,
        command=torchft.command, environment=torchft.environment, own_hostname=True),
    "ft_launcher": Framework(
        name="ft_launcher", package="nvidia_resiliency_ext", install=ft_launcher.INSTALL,
        settings=ft_launcher.Settings, backends=ft_launcher.BACKENDS,
        command=ft_launcher.command, elastic=True, monitors=ft_launcher.monitors),
    "nvrx_inprocess": Framework(
        name="nvrx_inprocess", package="nvidia_resiliency_ext", install=nvrx_inprocess.INSTALL,
        settings=nvrx_inprocess.Settings, backends=nvrx_inprocess.BACKENDS),
}
