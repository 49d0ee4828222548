"""Docker-backend tests: a real engine (started by .ci/docker-engine.sh), root, real containers.

Every test here is skipped, with the reason, when not root or when no engine answers."""
from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.ledger import Ledger
from harness.cluster.launcher import LauncherPool


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "docker backend tests need root (network namespaces, netlink, /proc/PID/ns/net)"
    try:
        import docker  # noqa: F401
    except ImportError:
        return "the Docker SDK for Python is not installed (pip install 'chaos-harness[docker]')"
    from harness.cluster.docker.engine import engine_unavailable_reason
    reason = engine_unavailable_reason()
    return f"{reason}" if reason else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    ours = [i for i in items if here in Path(str(i.fspath)).parents and i.get_closest_marker("requires_docker")]
    if not ours:
        return
    reason = _skip_reason()
    if reason:
        for item in ours:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def run_id() -> str:
    return "t" + uuid.uuid4().hex[:7]


@pytest.fixture
def ledger(run_id: str) -> Iterator[Ledger]:
    """The run's ledger in the default state directory, owned by this process: a heal run by
    anyone else meanwhile leaves the test's containers and namespace alone."""
    from chaos.undo import record_owner
    led = Ledger(run_id)
    record_owner(led)
    yield led
    led.close_if_clean()


@pytest.fixture
def launchers() -> Iterator[LauncherPool]:
    """The rank launchers of the test's clusters (the control plane's), closed after it."""
    with LauncherPool() as pool:
        yield pool
