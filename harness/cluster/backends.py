"""Backends by name (the scenario's `cluster.backend`, or `--backend`)."""
from __future__ import annotations

from chaos.errors import UsageError
from harness.cluster.api import Backend


def load_undo_plugins() -> None:
    """Register every backend's undos and sweeps, so a heal can revert what any of them made."""
    try:
        import harness.cluster.docker_backend  # noqa: F401  (registers docker undos in chaos.inject.UNDO)
    except ImportError:
        pass  # the docker SDK is not installed: no docker run can have left anything


def backend_named(name: str) -> Backend:
    if name == "netns":
        from harness.cluster.netns import NetnsBackend
        return NetnsBackend()
    if name == "docker":
        from harness.cluster.docker_backend import DockerBackend
        return DockerBackend()
    raise UsageError(f"unknown backend {name!r}; expected netns or docker")
