"""The undo table the harness heals, reverts and tears down with: the fault library's and the
docker backend's, assembled explicitly (no engine needed, only the SDK)."""
from __future__ import annotations

from pathlib import Path

import pytest

from chaos.undo import UNDOS
from harness.cluster.undos import undo_table
from tests.chaos.test_undos import recorded_ops

pytest.importorskip("docker", reason="the Docker SDK for Python is not installed: no docker undos")

CLUSTER = Path(__file__).resolve().parents[2] / "harness" / "cluster"


def test_every_op_a_backend_records_has_its_undo() -> None:
    table = undo_table()
    assert recorded_ops(CLUSTER) <= set(table.ops)
    assert {"docker_container", "docker_unpause"} <= recorded_ops(CLUSTER)
    assert set(UNDOS.ops) < set(table.ops)
    assert list(table.sweeps) == ["docker containers"]


def test_the_docker_table_is_built_without_touching_the_fault_librarys() -> None:
    undo_table()
    assert not {"docker_container", "docker_unpause"} & set(UNDOS.ops)
    assert not UNDOS.sweeps
