"""Backends by name (the scenario's `cluster.backend`, or `--backend`), and the undo table
that takes back what any of them made."""
from __future__ import annotations

from chaos.errors import UsageError
from chaos.inject import UNDOS
from chaos.mechanism import UndoTable
from harness.cluster.api import Backend


def _backend_undos() -> dict[str, UndoTable]:
    """The undo tables of the backends this install can run, by backend name."""
    try:
        import docker  # noqa: F401  (the SDK: without it no docker run can have made anything)
    except ImportError:
        return {}
    from harness.cluster.docker.heal import UNDOS as DOCKER_UNDOS
    return {"docker": DOCKER_UNDOS}


def undo_table() -> UndoTable:
    """The fault library's undos and sweeps with every available backend's, for a heal, a
    revert and a teardown that must take back whatever a run made; an op or sweep defined
    twice is refused."""
    return UndoTable.combine({"chaos": UNDOS, **_backend_undos()})


def backend_named(name: str) -> Backend:
    if name == "netns":
        from harness.cluster.netns import NetnsBackend
        return NetnsBackend()
    if name == "docker":
        from harness.cluster.docker.cluster import DockerBackend
        return DockerBackend()
    raise UsageError(f"unknown backend {name!r}; expected netns or docker")
