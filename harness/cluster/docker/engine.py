"""The Docker engine edge: a client that answers, its errors translated once, and the labels
the harness puts on what it makes there.

The docker SDK is imported lazily, inside the functions that need it: the package imports
without it, and `engine()` says how to install it.
"""
from __future__ import annotations

import os
from typing import Any

from chaos.errors import ChaosError, HarnessError

LABEL_RUN = "io.chaos-harness.run"
LABEL_RANK = "io.chaos-harness.rank"
LABEL_ROLE = "io.chaos-harness.role"
LABEL_IMAGE = "io.chaos-harness.image"
LABEL_OWNER = "io.chaos-harness.owner"  # "<pid>:<start time>" of the harness that made it
# the folder of the run's ledger: a heal of another folder leaves a dead run's containers to
# the heal of that one while the ledger is there (chaos.heal: "beside runs that keep their
# ledgers elsewhere")
LABEL_LEDGER = "io.chaos-harness.ledger"
DOCKER_HOST_ENV = "DOCKER_HOST"
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
API_TIMEOUT_S = 60
PING_TIMEOUT_S = 5  # an engine that does not answer a ping in 5 s is down (a heal goes on without it)


def engine_url() -> str:
    return os.environ.get(DOCKER_HOST_ENV, DEFAULT_DOCKER_HOST)


def engine(base_url: str | None = None) -> Any:
    """A docker SDK client that answers, or HarnessError saying why not."""
    try:
        import docker
    except ImportError as exc:
        raise HarnessError("the docker backend needs the Docker SDK for Python: "
                           "pip install 'chaos-harness[docker]'") from exc
    url = base_url or engine_url()
    try:
        client = docker.DockerClient(base_url=url, version="auto", timeout=PING_TIMEOUT_S)
        client.ping()
        client.api.timeout = API_TIMEOUT_S  # an engine that answers gets the long timeout
    except Exception as exc:  # docker.errors.DockerException, requests' ConnectionError
        raise HarnessError(f"no Docker engine answers at {url}: {exc} "
                           "(start one with .ci/docker-engine.sh)") from exc
    return client


def engine_unavailable_reason() -> str | None:
    """None when an engine answers; otherwise the reason (for pytest skips)."""
    try:
        engine().close()
    except HarnessError as exc:
        return str(exc)
    return None


def not_found(exc: BaseException) -> bool:
    import docker.errors
    return isinstance(exc, docker.errors.NotFound)


def conflict(exc: BaseException) -> bool:
    """409: the container is not running / not paused / already paused."""
    import docker.errors
    return isinstance(exc, docker.errors.APIError) and exc.status_code == 409


class translated:
    """Turn docker SDK errors into HarnessError once, at this edge."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: object, exc: BaseException | None, tb: object) -> bool:
        if exc is None or isinstance(exc, (ChaosError, KeyboardInterrupt, SystemExit)):
            return False
        import docker.errors
        import requests
        if isinstance(exc, (docker.errors.DockerException, requests.RequestException)):
            raise HarnessError(f"{self.what}: {exc}") from exc
        return False
