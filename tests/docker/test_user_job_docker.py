"""A user's own job in containers, end to end through `chaos run --backend docker` (3 ranks):
the job runs from its own workdir (bind-mounted), the step hook and the tap record its
steps and error lines, a killed rank's exit comes back as SIGKILL, and nothing is left."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import chaos_cli, leftovers
from tests.docker.test_docker_backend import leftovers as containers_left

pytestmark = [pytest.mark.requires_docker, pytest.mark.requires_root]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"


def test_a_killed_ranks_peers_report_it_through_their_output_and_exits(tmp_path):
    workdir = tmp_path / "job"  # outside the project: visible in the containers only by its mount
    workdir.mkdir()
    shutil.copy(EXAMPLE, workdir / "train.py")
    scenario = tmp_path / "job.yaml"
    scenario.write_text(f"""cluster: {{ranks: 3, backend: docker}}
job:
  command: [{sys.executable}, train.py, --step-period, "0.2", --checkpoint, "{{trial_dir}}/c.pt"]
  workdir: job
  start_timeout: 120s
warmup_steps: 3
faults:
  - {{kind: kill, target: {{rank: 1}}, start: 1s}}
hang_cap: 15s
settle_steps: 3
""")
    out = tmp_path / "out"
    done = chaos_cli("run", str(scenario), "--out", str(out), timeout=120)
    assert done.returncode == 0, done.stderr
    (trial,) = out.glob("*/trials/*/events.jsonl")
    events = [json.loads(line) for line in trial.read_text().splitlines()]
    run_id = json.loads((trial.parent / "trial.json").read_text())["run_id"]

    stepped = {e["rank"] for e in events if e["kind"] == "step"}
    assert stepped == {0, 1, 2}, "the step hook did not report steps from every container"
    killed = next(e for e in events if e["kind"] == "fault_applied")  # acknowledged after the engine's reply
    exits = {e["rank"]: e for e in events if e["kind"] == "rank_exited" and not e.get("stopped")}
    assert exits[1]["signal"] == 9 and exits[1]["exitcode"] is None
    said = [e for e in events if e["kind"] == "job_output" and e["rank"] != 1 and e["t"] >= killed["t_requested"]]
    assert said, "no surviving rank printed a classified error line after rank 1 was killed"
    assert "step 1 loss" in (trial.parent / "logs" / "r000.log").read_text()
    assert leftovers(out) == [] and containers_left(run_id) == []


def test_a_preloaded_job_in_a_container_sees_what_an_execd_one_sees(tmp_path):
    # the container's PID 1 preloads torch and forks the job (harness.cluster.container):
    # the probe of tests/byo/test_preloaded_start.py, both ways, through `chaos run`
    probe = Path(__file__).resolve().parents[1] / "byo" / "probe"
    scenario = tmp_path / "probe.yaml"
    scenario.write_text(f"""cluster: {{ranks: 2, backend: docker}}
job:
  command: [python, start_probe.py, "{{trial_dir}}/facts.json", steps]
  workdir: {probe}
  env: {{PROBE: x, TORCH_LOGS: "-dynamo"}}
  start_timeout: 120s
warmup_steps: 2
faults: []
hang_cap: 10s
settle_steps: 1
variants:
  preloaded: {{}}
  exec: {{start: exec}}
""")
    out = tmp_path / "out"
    done = chaos_cli("run", str(scenario), "--out", str(out), timeout=300)
    facts = {}
    for start in ("preloaded", "exec"):
        trials = list(out.glob(f"*/trials/{start}"))
        assert trials, f"no {start} trial: {done.stdout[-800:]}\n{done.stderr[-800:]}"
        trial = trials[0]
        log = (trial / "logs" / "r000.log").read_text()
        assert (trial / "facts.json").exists(), f"{start}: {done.stderr[-500:]}\n{log[-1500:]}"
        assert "exec instead" not in log
        facts[start] = json.loads((trial / "facts.json").read_text())
    assert facts["preloaded"]["warm"] and not facts["exec"]["warm"]  # PID 1 preloaded torch for it
    changing = {"argv", "random", "torch_random", "warm"}  # the trial's folder, the seeds
    assert {k: v for k, v in facts["preloaded"].items() if k not in changing} == \
           {k: v for k, v in facts["exec"].items() if k not in changing}
    assert facts["preloaded"]["reports"] == "the job's own reports module" and facts["preloaded"]["hook"]
    assert leftovers(out) == []
