"""A scenario's `job:` and `variants:` -> the trial plans (one per variant) and --dry-run."""
from __future__ import annotations

from pathlib import Path

import pytest

from chaos.errors import UsageError
from harness.scenario.scenario import load_scenario
from harness.trial.plan import build_plan
from tests.conftest import chaos_cli

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((REPO / "scenarios").glob("byo_*.yaml"))


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(body)
    return path


def test_variants_become_trials_with_their_overrides(tmp_path):
    (tmp_path / "job").mkdir()
    scenario = load_scenario(write(tmp_path, """
cluster: {ranks: 2}
job: {command: [python, t.py], workdir: job, env: {A: 1}, step_pattern: 'step \\d+'}
variants:
  plain: {}
  short: {args: [--timeout, "5"], env: {B: x}, launcher: torchrun, max_restarts: 2}
expect: {short: {outcome: crashed}}
"""))
    assert scenario.trial_names() == ["plain", "short"]
    plain, short = build_plan(scenario, "plain").trial, build_plan(scenario, "short").trial
    assert plain.job["workdir"] == str(tmp_path / "job")  # relative to the scenario file
    assert plain.job["command"] == ["python", "t.py"] and plain.job["env"] == {"A": "1"}
    assert short.job["command"] == ["python", "t.py", "--timeout", "5"]
    assert short.job["env"] == {"A": "1", "B": "x"} and short.job["max_restarts"] == 2
    assert plain.policy_spec == {} and short.expect.outcome == ("crashed",)


def test_a_job_without_variants_is_one_trial(tmp_path):
    scenario = load_scenario(write(tmp_path, "cluster: {ranks: 2}\njob: {command: [python]}\n"))
    assert scenario.trial_names() == ["job"]
    assert build_plan(scenario, "job").trial.job["launcher"] == "direct"


@pytest.mark.parametrize("body, message", [
    ("variants: {a: {}}\n", "variants: they vary a user's job"),
    ("job: {command: []}\n", "job.command"),
    ("job: {command: [python], step_pattern: 'step ('}\n", "job.step_pattern: not a regular expression"),
    ("job: {command: [python]}\nvariants: {a: {}}\nexpect: {b: {outcome: hung}}\n", "expect.b: no such variant"),
    ("job: {command: [python], launcher: mpirun}\n", "job.launcher"),
    ("job: {command: [python], max_restarts: 2}\n", "job.max_restarts: the direct launcher starts each rank once"),
    ("job: {command: [python]}\nvariants: {a: {max_restarts: 2}}\n",
     "variants.a: max_restarts: the direct launcher starts each rank once"),
    ("job: {command: [python]}\nvariants: {a: {argz: [x]}}\n", "variants.a.argz: unknown field"),
    ("job: {command: [python], launcher: torchrun, min_hosts: 3}\n",
     "job.min_hosts: 3 is more than the cluster's 2 hosts .torchrun's --nnodes 3:2.; give at most 2, e.g. 1"),
    ("job: {command: [python], launcher: torchrun}\nvariants: {a: {min_hosts: 4}}\n",
     "variants.a.min_hosts: 4 is more than the cluster's 2 hosts"),
    ("job: {command: [python], launcher: torchrun, rdzv_conf: {last_call: 2}}\n", "job.rdzv_conf.last_call"),
    ("job: {command: [python], launcher: torchrun, rdzv_conf: {last_call_timeout: 0}}\n",
     "job.rdzv_conf.last_call_timeout"),
    ("job: {command: [python]}\nvariants: {a: {rdzv_conf: {keep_alive_interval: 1}}}\n",
     "variants.a: rdzv_conf: it is torchrun's --rdzv-conf; the direct launcher has no rendezvous"),
])
def test_job_errors_name_the_field(tmp_path, body, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")) as err:
        load_scenario(write(tmp_path, "cluster: {ranks: 2}\n" + body))
    assert str(err.value).startswith(str(tmp_path / "s.yaml") + ":")


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_shipped_byo_scenarios_plan(path):
    assert path.exists()
    done = chaos_cli("run", str(path), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "variants of your job, in this order:" in done.stdout
    assert "train_ddp.py" in done.stdout
    if path.name == "byo_torchrun_elastic.yaml":  # the elastic torchrun it runs, in the plan
        assert done.stdout.count("min_hosts 7 (--nnodes 7:8)") == 3, done.stdout
        assert done.stdout.count("--rdzv-conf keep_alive_interval=1,last_call_timeout=2") == 1, done.stdout


def test_a_workdir_that_does_not_exist_is_refused_at_load_with_the_path_and_the_fix(tmp_path):
    path = write(tmp_path, "cluster: {ranks: 2}\njob: {command: [python, t.py], workdir: ../nowhere}\n")
    done = chaos_cli("run", str(path), "--dry-run")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (f"chaos: error: {path}:2: job.workdir: '../nowhere' "
                                   f"({tmp_path}/../nowhere): no such folder; give the folder your command runs in, relative to "
                                   f"{tmp_path}")
