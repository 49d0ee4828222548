"""The fault-tolerance frameworks in containers, end to end through `chaos run --backend
docker`: the shipped scenarios/frameworks_kill.yaml's torchft trial (a replica group per
container, the Lighthouse in a container of its own; the killed group is started again and
heals from a peer, which it reaches by its container's name) and its ft_launcher trial (an
agent per container, restarts from the job's checkpoint)."""
from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, chaos_cli, leftovers
from tests.docker.test_docker_backend import leftovers as containers_left

pytestmark = [pytest.mark.requires_docker, pytest.mark.requires_root]


def test_torchft_and_ft_launcher_recover_from_a_kill_in_containers(tmp_path):
    out = tmp_path / "out"
    done = chaos_cli("run", str(REPO / "scenarios" / "frameworks_kill.yaml"), "--backend", "docker",
                     "--policy", "torchft", "--policy", "ft_launcher", "--out", str(out), timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line for line in done.stdout.splitlines() if "| kill on r2 |" in line}
    assert set(rows) == {"torchft", "ft_launcher"}, done.stdout
    for row in rows.values():
        assert "| consistent |" in row and row.rstrip().endswith("| met |"), row
    assert "the coordinator detects" in rows["torchft"] and "all ranks step again" in rows["torchft"]
    events = [json.loads(line) for line in next(out.glob("*/trials/torchft/events.jsonl")).read_text().splitlines()]
    killed = next(e["t"] for e in events if e["kind"] == "fault_applied")
    # the relaunched group fetched its state from a live peer's container, by that container's name
    fetched = [e for e in events if e["kind"] == "heal_fetched" and e["t"] > killed]
    assert [e["rank"] for e in fetched] == [2] and "from http://r00" in fetched[0]["line"], fetched
    assert leftovers(out) == []
    assert [containers_left(json.loads(t.read_text())["run_id"]) for t in out.glob("*/trials/*/trial.json")] == [[], []]
