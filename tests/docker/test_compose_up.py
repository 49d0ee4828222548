"""docker-compose.yml run for real, through the Compose a user runs (`docker-compose` 1.29 in
CI, or the `docker compose` plugin): 16 ranks and `control` up on the local test image
(`python -m harness.cluster.docker compose-override`, as docs/docker.md tells a host
without a registry), every rank steps to CHAOS_MAX_STEPS and exits 0, and `down` leaves
no container, network or volume of the project. `up` runs in the foreground, as a user
runs it: it must return by itself once the job has ended.

The fixture downs the project and removes its run folder whatever happens, so a failing
test leaves nothing either. The project has a name of its own: other jobs on this engine
are never touched."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO, compose_command

pytestmark = [pytest.mark.requires_compose, pytest.mark.requires_root]

RANKS = 16
MAX_STEPS = 4
# 16 interpreters importing torch in their containers dominate; ~20 s on the 2-core CI VM
JOB_DEADLINE_S = 240


@dataclass(frozen=True)
class Project:
    compose: list[str]  # the compose command with the project's name and files
    name: str
    run_dir: Path

    def __call__(self, *args: str, timeout: float = 120, env: dict[str, str] | None = None) -> str:
        done = subprocess.run([*self.compose, *args], cwd=REPO, capture_output=True, text=True,
                              timeout=timeout, env=env)
        assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}"
        return done.stdout

    def left(self) -> dict[str, list[str]]:
        """The project's containers, networks and volumes still in the engine."""
        label = f"label=com.docker.compose.project={self.name}"
        return {kind: _docker(*command, "--filter", label, "--quiet").split()
                for kind, command in (("containers", ("ps", "--all")), ("networks", ("network", "ls")),
                                      ("volumes", ("volume", "ls")))}


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True, timeout=60).stdout


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    name = f"chaos-compose-test-{uuid.uuid4().hex[:8]}"
    override = tmp_path / "docker-compose.local.yml"
    made = subprocess.run([sys.executable, "-m", "harness.cluster.docker",
                           "compose-override", str(override)], cwd=REPO, capture_output=True, text=True)
    runs = REPO / "runs"
    had_runs = runs.exists()
    compose = compose_command()
    assert compose is not None  # the capability check skipped or failed the test otherwise
    p = Project([*compose, "-p", name, "-f", "docker-compose.yml", "-f", str(override)], name,
                runs / name)
    try:
        assert made.returncode == 0, made.stderr
        yield p
    finally:
        subprocess.run([*p.compose, "down", "--volumes", "--remove-orphans", "--timeout", "5"],
                       cwd=REPO, capture_output=True, timeout=120)
        shutil.rmtree(p.run_dir, ignore_errors=True)
        if not had_runs and runs.exists() and not any(runs.iterdir()):
            runs.rmdir()


def test_compose_up_runs_sixteen_ranks_to_max_steps_and_down_leaves_nothing(project: Project) -> None:
    env = {**os.environ, "CHAOS_RUN_ID": project.name, "CHAOS_MAX_STEPS": str(MAX_STEPS),
           "CHAOS_STEP_PERIOD": "50ms", "CHAOS_POLICY_TIMEOUT": "60s"}
    # as a user runs it, in the foreground: it returns once every container has ended (the
    # ranks at CHAOS_MAX_STEPS, then `control`, which counts them)
    up = subprocess.run([*project.compose, "up", "--no-color"], cwd=REPO, capture_output=True, text=True,
                        timeout=JOB_DEADLINE_S, env=env)
    assert up.returncode == 0, f"up exited {up.returncode}:\n{up.stdout[-3000:]}\n{up.stderr[-2000:]}"
    containers = project.left()["containers"]
    ended = Counter(tuple(line.split()) for line in _docker(
        "inspect", "--format", '{{index .Config.Labels "io.chaos-harness.role"}} {{.State.Status}} '
        "{{.State.ExitCode}}", *containers).splitlines())
    assert ended == {("rank", "exited", "0"): RANKS, ("control", "exited", "0"): 1}, \
        f"{ended}; the containers' last lines:\n{up.stdout[-4000:]}"

    events = [json.loads(line) for line in (project.run_dir / "events.jsonl").read_text().splitlines()]
    steps = {rank: sorted(e["step"] for e in events if e["kind"] == "step" and e["rank"] == rank)
             for rank in range(RANKS)}
    assert steps == {rank: list(range(MAX_STEPS)) for rank in range(RANKS)}, steps
    exits = {e["rank"]: (e["reason"], e["code"]) for e in events if e["kind"] == "exit"}
    assert exits == {rank: ("stopped", 0) for rank in range(RANKS)}, exits

    project("down", "--volumes", "--remove-orphans", "--timeout", "5")
    assert project.left() == {"containers": [], "networks": [], "volumes": []}
