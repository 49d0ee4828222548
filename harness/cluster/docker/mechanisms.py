"""Process faults through the engine: `docker kill` and `docker pause` / `unpause`.

`DockerCluster.mechanisms()` returns them by fault kind, to merge over the fault library's
defaults; link faults need nothing of docker (they act on the switch port and on the
container's eth0 through its pinned namespace). A pause is written to the ledger before it
is made, as op ``docker_unpause`` (undone by `harness.cluster.docker.heal`).
"""
from __future__ import annotations

from typing import Any, Protocol

from chaos.api import Host
from chaos.faults import FaultBase, Kill
from chaos.ledger import Entry, Ledger
from chaos.mechanism import Mechanism
from chaos.topology import host_index
from harness.cluster.docker.engine import translated


class Containers(Protocol):
    """What these mechanisms need of the cluster (harness.cluster.docker.cluster.DockerCluster):
    its containers by rank, and the engine they run on."""

    engine_url: str
    client: Any  # the docker SDK's client

    def kill(self, rank: int, signum: int) -> None: ...
    def container_name(self, rank: int) -> str: ...


class EngineKill(Mechanism):
    name = "docker kill (signal through the engine)"

    def __init__(self, cluster: Containers) -> None:
        self.cluster = cluster

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        assert isinstance(fault, Kill)
        self.cluster.kill(host_index(host.name), fault.signal)
        return []


class EnginePause(Mechanism):
    name = "docker pause / unpause (cgroup freezer)"

    def __init__(self, cluster: Containers) -> None:
        self.cluster = cluster

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        name = self.cluster.container_name(host_index(host.name))
        entry = ledger.record("docker_unpause", name=name, engine=self.cluster.engine_url)
        with translated(f"pause {name}"):
            self.cluster.client.api.pause(name)
        ledger.mark(entry, "done")
        return [entry]
