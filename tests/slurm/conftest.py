"""Slurm-backend tests: a real local cluster (Debian's slurm-wlm and munge, installed by
.ci/slurm.sh; `chaos slurm up` starts munged, slurmctld and a slurmd per node, each node a
network namespace), root. Where Slurm is missing they skip with the reason, except where
CHAOS_REQUIRE_SLURM is set (CI), where they fail naming it."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.ledger import STATE_DIR_ENV
from tests.conftest import chaos_cli

NODES = 4


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "a local Slurm cluster needs root (slurmd starts tasks as the job's user)"
    missing = [c for c in ("slurmctld", "slurmd", "munged", "srun", "sbatch")
               if shutil.which(c) is None and not os.path.exists(f"/usr/sbin/{c}")]
    return f"Slurm is not installed ({', '.join(missing)} missing: .ci/slurm.sh installs it)" if missing else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    ours = [i for i in items if str(i.fspath).startswith(here)]
    why = _why_not() if ours else None
    if why is None:
        return
    if os.environ.get("CHAOS_REQUIRE_SLURM"):
        raise pytest.UsageError(f"CHAOS_REQUIRE_SLURM is set and {why}")
    for item in ours:
        item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="package")
def slurm_cluster() -> Iterator[dict[str, str]]:
    """A local 4-node cluster for the package's tests; the environment that names it.

    Its state folder is the package's own (what ran before on this machine does not
    matter), and made the hard way for the cluster's users: it exists first, closed to
    others (0700, as a run's folder of ledgers may be), and the cluster is brought up under
    umask 077. What an ordinary user needs is reachable only where `chaos slurm up` sets it so."""
    public = Path(tempfile.mkdtemp(prefix="chaos-slurm-test-"))
    public.chmod(0o755)  # as /run is
    state = public / "state"
    state.mkdir(mode=0o700)
    env = {**os.environ, STATE_DIR_ENV: str(state)}
    mask = os.umask(0o077)
    try:
        up = chaos_cli("slurm", "up", "--nodes", str(NODES), env=env, timeout=120)
    finally:
        os.umask(mask)
    if up.returncode != 0:
        shutil.rmtree(public)  # what `chaos slurm up` made it took back
    assert up.returncode == 0, up.stderr
    conf = up.stdout.strip().removeprefix("export SLURM_CONF=")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(STATE_DIR_ENV, str(state))  # the tests' own look at ledgers and the cluster
        try:
            yield {**env, "SLURM_CONF": conf}
        finally:
            down = chaos_cli("slurm", "down", env=env, timeout=120)
            assert down.returncode == 0, down.stderr
            shutil.rmtree(public)


@pytest.fixture
def slurm_env(slurm_cluster: dict[str, str]) -> Iterator[dict[str, str]]:
    """The cluster, as a test finds it: with no job. What a failed test left is cancelled
    after it, so that the next test's own leftovers are its own."""
    yield slurm_cluster
    squeue = ["squeue", "-h", "-o", "%i"]
    if subprocess.run(squeue, env=slurm_cluster, capture_output=True, text=True).stdout.split():
        subprocess.run(["scancel", "--user", "root"], env=slurm_cluster, capture_output=True)
        chaos_cli("heal", env=slurm_cluster, timeout=240)
