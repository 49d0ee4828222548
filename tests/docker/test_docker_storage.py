"""Storage faults in containers, through `chaos run --backend docker`: a container's mount
namespace exists before the fault's mount, which reaches it only through the shared trial
folder (chaos.storage.share_below). The kernel's kind (read_only) and the FUSE kind that needs
the fsyncs a rank made (lose_unsynced) are judged as on the netns backend, and no mount, no
container is left."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.conftest import chaos_cli, leftovers
from tests.docker.test_docker_backend import leftovers as containers_left

pytestmark = [pytest.mark.requires_docker, pytest.mark.requires_root]

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def run(tmp_path: Path, scenario: str, *policies: str) -> dict[str, dict[str, str]]:
    out = tmp_path / "out"
    done = chaos_cli("run", str(SCENARIOS / scenario), "--backend", "docker", "--out", str(out),
                     *(arg for p in policies for arg in ("--policy", p)), timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (metrics,) = out.glob("*/metrics.csv")
    rows = {row["policy"]: row for row in csv.DictReader(metrics.open())}
    for trial in out.glob("*/trials/*/trial.json"):
        assert containers_left(json.loads(trial.read_text())["run_id"]) == []
    assert leftovers(out) == []  # mounts under it included
    return rows


def test_a_read_only_checkpoint_folder_refuses_the_containers_save(tmp_path):
    rows = run(tmp_path, "read_only.yaml", "retry")
    assert rows["retry"]["expect_ok"] == "True", rows["retry"]["expect_failures"]
    assert "EROFS on r0's save" in rows["retry"]["storage"]


@pytest.mark.requires_fuse
def test_lost_unsynced_writes_break_a_save_straight_to_its_final_path_in_a_container(tmp_path):
    # the durable save's fsyncs reaching the filesystem are the netns backend's test
    # (scenarios/lose_unsynced.yaml): the same FUSE daemon serves both
    rows = run(tmp_path, "lose_unsynced.yaml", "direct")
    assert rows["direct"]["state"] == "diverged" and "that save was lost" in rows["direct"]["state_detail"]
    assert rows["direct"]["expect_ok"] == "True", rows["direct"]["expect_failures"]
