"""The torchrun environment contract of a user's job (harness.cluster.userjob), per launcher."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from chaos import topology
from harness.cluster.userjob import (HOOK_DIR, JOB_MASTER_PORT, REPO_ROOT, JobSpec, JobVariant, launch_command,
                                     rank_command, rank_environment)
from harness.cluster.workers import SERVER_ENV, STUB
from harness.job.hook.chaos_hook import EVENTS_ENV, HOST_RANK_ENV, REPO_ENV, TRIAL_ENV

JOB = JobSpec(command=("python", "train.py"))


def env_of(rank: int, job: JobSpec = JOB, base: dict[str, str] | None = None) -> dict[str, str]:
    return rank_environment(job, rank, 16, "run42", "default", "/runs/x/events.jsonl", "eth0",
                            base={"PATH": "/usr/bin"} if base is None else base)


@pytest.mark.parametrize("name, rank, expected", [
    ("RANK", 5, "5"), ("LOCAL_RANK", 5, "0"), ("WORLD_SIZE", 5, "16"), ("LOCAL_WORLD_SIZE", 5, "1"),
    ("GROUP_RANK", 5, "5"), ("GROUP_WORLD_SIZE", 5, "16"), ("ROLE_RANK", 5, "5"), ("ROLE_WORLD_SIZE", 5, "16"),
    ("MASTER_ADDR", 5, topology.host_address(0)), ("MASTER_PORT", 5, str(JOB_MASTER_PORT)),
    ("TORCHELASTIC_RUN_ID", 5, "run42"), ("TORCHELASTIC_RESTART_COUNT", 5, "0"),
    ("TORCHELASTIC_MAX_RESTARTS", 5, "0"), ("OMP_NUM_THREADS", 5, "1"),
    ("GLOO_SOCKET_IFNAME", 5, "eth0"), ("NCCL_SOCKET_IFNAME", 5, "eth0"),
    ("RANK", 0, "0"), ("GROUP_RANK", 15, "15"),
])
def test_direct_launcher_sets_each_torchrun_variable(name, rank, expected):
    assert env_of(rank)[name] == expected
    assert env_of(rank)[HOST_RANK_ENV] == str(rank)


def test_master_is_rank_0s_host_on_the_cluster_network_not_the_switch():
    # rank 0 holds the TCPStore (env://); the switch's address is the harness's control plane
    assert env_of(3)["MASTER_ADDR"] == topology.host_address(0) != topology.SWITCH_ADDRESS


def test_hook_goes_first_on_pythonpath_and_the_events_file_is_named():
    env = env_of(1, base={"PYTHONPATH": "/user/lib"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(HOOK_DIR), "/user/lib"]
    assert (HOOK_DIR / "sitecustomize.py").is_file()
    assert env[EVENTS_ENV] == "/runs/x/events.jsonl"
    assert env[REPO_ENV] == str(REPO_ROOT) and (REPO_ROOT / "runfolder" / "events.py").is_file()
    assert env[TRIAL_ENV] == "default"


def test_pythons_first_on_path_is_the_harness_interpreter():
    assert env_of(0)["PATH"].split(os.pathsep) == [str(Path(sys.executable).parent), "/usr/bin"]


def test_the_jobs_own_env_wins_over_the_contract_and_the_harness_env():
    job = JobSpec(command=("python",), env={"OMP_NUM_THREADS": 4, "PATH": "/opt/bin"})
    env = env_of(0, job, base={"PATH": "/usr/bin", "HOME": "/root"})
    assert env["OMP_NUM_THREADS"] == "4" and env["PATH"] == "/opt/bin" and env["HOME"] == "/root"


def test_a_variant_adds_env_and_args_and_sets_the_launcher_and_max_restarts():
    job = JobSpec(command=("python", "train.py"), env={"A": "1"})
    varied = JobVariant(env={"B": "2"}, args=("--timeout", "60"), launcher="torchrun",
                        max_restarts=3).applied_to(job)
    assert varied.command == ("python", "train.py", "--timeout", "60")
    assert varied.env == {"A": "1", "B": "2"} and varied.max_restarts == 3 and varied.launcher == "torchrun"
    assert "--max-restarts=3" in rank_command(varied, 0, 2, "r", "10.77.0.1:29400")
    assert varied.start == "preloaded" and JobVariant(start="exec").applied_to(job).start == "exec"


def test_trial_dir_placeholder_is_expanded_in_args_and_env(tmp_path):
    job = JobSpec(command=("python", "t.py", "--ckpt", "{trial_dir}/c.pt"), env={"CKPT": "{trial_dir}"})
    launch = launch_command(job, list(job.command), env_of(0, job), tmp_path)
    assert launch["argv"] == ["python", "t.py", "--ckpt", f"{tmp_path}/c.pt"]
    assert launch["env"]["CKPT"] == str(tmp_path)


def test_torchrun_launcher_leaves_the_worker_contract_to_the_agent():
    job = JobSpec(command=("python", "train.py"), launcher="torchrun", max_restarts=3)
    env = env_of(5, job)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        assert name not in env, name
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["OMP_NUM_THREADS"] == "1" and env[HOST_RANK_ENV] == "5"


@pytest.mark.parametrize("start, workers", [
    ("exec", ["python", "train.py", "--steps", "9"]),
    ("preloaded", [sys.executable, "-I", "-S", STUB, "python", "train.py", "--steps", "9"]),
])
def test_torchrun_launcher_runs_one_agent_per_host_in_a_c10d_rendezvous_on_the_switch(start, workers):
    job = JobSpec(command=("python", "train.py", "--steps", "9"), launcher="torchrun", max_restarts=3, start=start)
    argv = rank_command(job, 5, 16, "run42", f"{topology.SWITCH_ADDRESS}:29400")
    assert argv == ["torchrun", "--nnodes=16", "--nproc-per-node=1", "--rdzv-backend=c10d",
                    f"--rdzv-endpoint={topology.SWITCH_ADDRESS}:29400", "--rdzv-id=run42", "--max-restarts=3",
                    f"--local-addr={topology.host_address(5)}", "--log-dir={trial_dir}/logs/torchrun/r005",
                    "--no-python", *workers]
    # the agent's workers find their host's worker server (harness.cluster.workers) by name
    assert (SERVER_ENV in env_of(5, job)) == (start == "preloaded")


def test_min_hosts_makes_torchrun_s_nnodes_a_range_and_needs_torchrun():
    job = JobSpec(command=("python", "train.py"), launcher="torchrun")
    assert "--nnodes=7:8" in rank_command(JobVariant(min_hosts=7).applied_to(job), 5, 8, "r", "10.77.0.1:29400")
    assert "--nnodes=8" in rank_command(job, 5, 8, "r", "10.77.0.1:29400")
    with pytest.raises(ValidationError, match="min_hosts: 7 is torchrun's --nnodes MIN:MAX.*set launcher: torchrun"):
        JobSpec(command=("python", "train.py"), min_hosts=7)


def test_rdzv_conf_is_torchrun_s_and_a_variant_s_merges_over_the_job_s():
    job = JobSpec(command=("python", "train.py"), launcher="torchrun", rdzv_conf={"last_call_timeout": 5})
    varied = JobVariant(rdzv_conf={"keep_alive_interval": 1, "last_call_timeout": 2}).applied_to(job)
    argv = rank_command(varied, 5, 8, "r", "10.77.0.1:29400")
    assert "--rdzv-conf=last_call_timeout=2,keep_alive_interval=1" in argv
    assert argv.index("--rdzv-conf=last_call_timeout=2,keep_alive_interval=1") < argv.index("--no-python")
    assert not any(a.startswith("--rdzv-conf") for a in rank_command(JobVariant().applied_to(
        JobSpec(command=("python",), launcher="torchrun")), 5, 8, "r", "10.77.0.1:29400"))
    with pytest.raises(ValidationError, match="rdzv_conf: it is torchrun's --rdzv-conf.*set launcher: torchrun"):
        JobSpec(command=("python", "train.py"), rdzv_conf={"last_call_timeout": 2})


def test_direct_launcher_runs_the_command_itself():
    assert rank_command(JOB, 5, 16, "run42", "10.77.0.1:29400") == ["python", "train.py"]


def test_torchrun_launcher_starts_nproc_per_host_workers_per_agent():
    job = JobSpec(command=("python", "train.py"), launcher="torchrun", nproc_per_host=4)
    argv = rank_command(job, 1, 2, "run42", f"{topology.SWITCH_ADDRESS}:29400")
    assert argv[:3] == ["torchrun", "--nnodes=2", "--nproc-per-node=4"]
    # the agent gives each worker its RANK = node rank x 4 + LOCAL_RANK, WORLD_SIZE 8, ...
    env = env_of(1, job)
    assert "LOCAL_RANK" not in env and "LOCAL_WORLD_SIZE" not in env and env[HOST_RANK_ENV] == "1"


@pytest.mark.parametrize("fields, says", [
    ({"nproc_per_host": 2}, "nproc_per_host: 2 needs launcher: torchrun"),
    ({"nproc_per_host": 2, "launcher": "torchrun", "step_pattern": "step"}, "step_pattern: the output lines"),
    ({"nproc_per_host": 0, "launcher": "torchrun"}, "greater than or equal to 1"),
])
def test_more_than_one_process_per_host_is_refused_where_it_cannot_be_run_or_measured(fields, says):
    with pytest.raises(ValueError, match=says):
        JobSpec(command=("python", "train.py"), **fields)


def test_a_variant_that_switches_to_direct_keeps_nproc_per_host_and_is_refused():
    job = JobSpec(command=("python", "train.py"), launcher="torchrun", nproc_per_host=2)
    with pytest.raises(ValueError, match="needs launcher: torchrun"):
        JobVariant(launcher="direct").applied_to(job)
