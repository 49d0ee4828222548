"""The fault-tolerance frameworks on a Slurm allocation, end to end through `chaos run
--backend slurm` on the local cluster: NVIDIA's ft_launcher as its documentation runs it
under Slurm (one agent per node), a node's agent killed and started again. Each node's
agent gives the job a temporary folder of its own and removes it: the killed ft_launcher's
IPC sockets do not stay in the node's /tmp. The shipped comparison's trials on Slurm are
the slurm night's (nightly/slurm.yaml)."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from tests.conftest import chaos_cli, leftovers
from tests.run.test_local_backend import FT_LAUNCHER_KILL  # the same trial, on the local backend there
from tests.slurm.test_slurm_backend import _nothing_left

pytestmark = pytest.mark.system  # a Slurm cluster: its daemons: not in ./dev.sh check


def test_ft_launcher_recovers_from_a_nodes_kill_and_leaves_no_socket(slurm_env, tmp_path):
    scenario = tmp_path / "ft_launcher.yaml"
    scenario.write_text(FT_LAUNCHER_KILL)
    out = tmp_path / "runs"
    sockets = set(Path(tempfile.gettempdir()).glob("_ft_launcher*"))  # another run's, if any
    done = chaos_cli("run", str(scenario), "--backend", "slurm", "--out", str(out), env=slurm_env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "| job | kill on r2 |" in done.stdout and "all ranks step again" in done.stdout, done.stdout
    assert "| consistent |" in done.stdout and "| met |" in done.stdout, done.stdout
    (trial,) = out.glob("*/trials/job/trial.json")
    assert "node03" in next(json.loads(line)["mechanism"] for line in (trial.parent / "events.jsonl").open()
                            if '"fault_applied"' in line)
    assert set(Path(tempfile.gettempdir()).glob("_ft_launcher*")) <= sockets
    assert leftovers(out) == []
    _nothing_left(slurm_env, out)

