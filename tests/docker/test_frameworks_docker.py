"""The fault-tolerance frameworks in containers, end to end through `chaos run --backend
docker`: the shipped scenarios/frameworks_kill.yaml's torchft trial (a replica group per
container, the Lighthouse in a container of its own; the killed group is started again and
heals from a peer, which it reaches by its container's name: what only containers need).
The other frameworks' agents start in containers as torchrun's do; their runs there are
measured in docs/frameworks.md, not repeated in CI (45 s each under its load)."""
from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, chaos_cli, leftovers
from tests.docker.test_docker_backend import leftovers as containers_left

pytestmark = [pytest.mark.requires_docker, pytest.mark.requires_root]


def test_torchft_recovers_from_a_kill_in_containers_healing_from_a_peer_by_name(tmp_path):
    out = tmp_path / "out"
    done = chaos_cli("run", str(REPO / "scenarios" / "frameworks_kill.yaml"), "--backend", "docker",
                     "--policy", "torchft", "--out", str(out), timeout=400)
    # 1: an expectation failed; which one may, below
    assert done.returncode in (0, 1) and "chaos: failed" not in done.stderr, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line for line in done.stdout.splitlines() if "| kill on r2 |" in line}
    assert set(rows) == {"torchft"}, done.stdout
    row = rows["torchft"]
    assert "the coordinator detects" in row and "all ranks step again" in row and "| consistent |" in row, row
    # the times expected are the shipped scenario's, measured on netns on an idle machine;
    # under CI's load a container's restart takes longer (13.3 s once, 5.0 s idle): a time
    # may miss them, the outcome and the state may not
    verdict = row.rstrip().rsplit("|", 2)[-2].strip()
    missed = verdict.removeprefix("FAILED:").split(";") if verdict != "met" else []
    assert all(m.strip().startswith(("recover_within", "detect_within")) for m in missed), row
    events = [json.loads(line) for line in next(out.glob("*/trials/torchft/events.jsonl")).read_text().splitlines()]
    killed = next(e["t"] for e in events if e["kind"] == "fault_applied")
    # the relaunched group fetched its state from a live peer's container, by that container's name
    fetched = [e for e in events if e["kind"] == "heal_fetched" and e["t"] > killed]
    assert [e["rank"] for e in fetched] == [2] and "from http://r00" in fetched[0]["line"], fetched
    assert leftovers(out) == []
    assert [containers_left(json.loads(t.read_text())["run_id"]) for t in out.glob("*/trials/*/trial.json")] == [[]]
