"""Docker-backend tests: a real engine (started by .ci/docker-engine.sh), root, real containers.

Every test here is marked requires_docker: tests/conftest.py skips it, with the reason, when
no engine answers (or fails the session where CHAOS_REQUIRE names docker)."""
from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from chaos.ledger import Ledger
from harness.cluster.launcher import LauncherPool


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
