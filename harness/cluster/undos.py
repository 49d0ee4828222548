"""The undo table that takes back what any run made: the fault library's undos and sweeps
with those of every backend this install can run. A backend with undos of its own adds
one line here."""
from __future__ import annotations

from chaos.undotable import UndoTable


def _backend_undos() -> dict[str, UndoTable]:
    """The undo tables of the backends this install can run, by backend name."""
    from harness.cluster.slurm.undo import UNDOS as SLURM_UNDOS
    try:
        import docker  # noqa: F401  (the SDK: without it no docker run can have made anything)
    except ImportError:
        return {"slurm": SLURM_UNDOS}
    from harness.cluster.docker.heal import UNDOS as DOCKER_UNDOS
    return {"docker": DOCKER_UNDOS, "slurm": SLURM_UNDOS}


def undo_table() -> UndoTable:
    """The fault library's undos and sweeps with every available backend's, for a heal, a
    revert and a teardown that must take back whatever a run made; an op or sweep defined
    twice is refused."""
    from chaos.undo import UNDOS
    return UndoTable.combine({"chaos": UNDOS, **_backend_undos()})
