"""Device and collective choice (harness.job.device): the rule and each rank's environment on
CPU; the same workload on a GPU where there is one (requires_gpu)."""
from __future__ import annotations

import pytest
import torch

from harness.job.config import WorkloadSpec
from harness.job.device import NCCL_ERROR_HANDLING, PlacementError, choose, job_device_env, rank_env, visible_gpus
from harness.job.policies import POLICY_NAMES
from harness.job.workload import Workload


@pytest.mark.parametrize(("device", "comm", "ranks", "gpus", "chosen"), [
    ("auto", "auto", 16, 0, ("cpu", "gloo")),   # no GPU: the CPU
    ("cpu", "auto", 16, 8, ("cpu", "gloo")),    # asked for the CPU on a GPU host
    ("auto", "auto", 8, 8, ("cuda", "nccl")),   # a GPU per rank
    ("cuda", "nccl", 4, 8, ("cuda", "nccl")),
    ("auto", "auto", 16, 1, ("cuda", "gloo")),  # ranks share GPUs: NCCL would refuse
    ("cuda", "gloo", 8, 8, ("cuda", "gloo")),   # gloo asked for, with a GPU per rank
])
def test_the_choice_rule(device: str, comm: str, ranks: int, gpus: int, chosen: tuple[str, str]) -> None:
    placement = choose(device, comm, ranks, gpus)
    assert (placement.device, placement.comm) == chosen and placement.gpus == gpus
    assert placement.reason  # said in run.json and by chaos doctor


def test_the_reason_says_why() -> None:
    assert choose("auto", "auto", 16, 0).reason == "no GPU visible (NVML): gloo on the CPU"
    assert choose("auto", "auto", 16, 2).reason.startswith("16 ranks share 2 GPUs (NCCL refuses two ranks on one GPU)")
    assert choose("auto", "auto", 2, 2).reason == "a GPU per rank (2 GPUs, 2 ranks): NCCL"


@pytest.mark.parametrize(("device", "comm", "ranks", "gpus", "says"), [
    ("cuda", "auto", 4, 0, "cluster.device: cuda, but no GPU is visible"),
    ("cpu", "nccl", 4, 8, "cluster.comm: nccl needs CUDA devices"),
    ("auto", "nccl", 4, 0, "cluster.comm: nccl needs CUDA devices"),
    ("cuda", "nccl", 16, 8, "16 ranks share 8 GPUs and NCCL refuses two ranks on one GPU"),
])
def test_what_the_host_cannot_give_is_refused_with_the_field_and_the_fix(
        device: str, comm: str, ranks: int, gpus: int, says: str) -> None:
    with pytest.raises(PlacementError, match=says):
        choose(device, comm, ranks, gpus)


def test_ranks_share_gpus_round_robin_and_see_only_their_own() -> None:
    shared = choose("auto", "auto", 16, 3)
    assert [shared.gpu_of(r) for r in range(5)] == [0, 1, 2, 0, 1]
    assert rank_env(shared, 4, "retry", "eth0") == {"CUDA_VISIBLE_DEVICES": "1", "LOCAL_RANK": "4"}
    assert rank_env(choose("cpu", "auto", 16, 3), 4, "retry", "eth0") == {}


def test_nccl_is_forced_onto_the_rank_s_own_link_with_its_own_host_identity() -> None:
    placement = choose("auto", "auto", 4, 4)
    envs = [rank_env(placement, r, "isolation", "eth0") for r in range(4)]
    for r, env in enumerate(envs):
        assert env["CUDA_VISIBLE_DEVICES"] == str(r)
        assert {k: env[k] for k in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE")} == {
            "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1"}
        assert env["NCCL_SOCKET_IFNAME"] == "=eth0" and env["NCCL_NET"] == "Socket"
    assert len({env["NCCL_HOSTID"] for env in envs}) == 4  # one node per rank, as NCCL sees it


@pytest.mark.parametrize(("policy", "handling"), [
    ("baseline", "1"), ("timeout", "1"),                    # tear down: the process ends
    ("retry", "2"), ("isolation", "2"), ("elastic", "2"),   # abort the communicator, keep the process
])
def test_nccl_error_handling_follows_the_policy(policy: str, handling: str) -> None:
    env = rank_env(choose("auto", "auto", 2, 2), 0, policy, "eth0")
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == handling
    assert set(NCCL_ERROR_HANDLING) == set(POLICY_NAMES)


def test_the_gradient_size_the_harness_counts_with_is_what_a_step_all_reduces() -> None:
    spec = WorkloadSpec(features=16, hidden=32, classes=5)
    seen = []
    Workload(spec, seed=1, rank=0).train_step(lambda flat: seen.append(flat.numel() * flat.element_size()), 1)
    assert seen == [spec.gradient_bytes]


def test_no_gpu_here_means_none_visible_to_nvml_or_torch() -> None:
    assert (visible_gpus() == 0) == (not torch.cuda.is_available())


@pytest.mark.requires_gpu
def test_the_workload_steps_on_the_gpu_as_it_does_on_the_cpu() -> None:
    spec = WorkloadSpec(features=16, hidden=32, classes=5)
    on_cpu, on_gpu = Workload(spec, 3, 0), Workload(spec, 3, 0, torch.device("cuda"))
    losses = [(on_cpu.train_step(lambda t: None, 1), on_gpu.train_step(lambda t: None, 1)) for _ in range(3)]
    assert next(on_gpu.model.parameters()).is_cuda
    for cpu, gpu in losses:
        assert gpu == pytest.approx(cpu, rel=1e-4)


def test_run_json_records_the_choice_and_its_reason(tmp_path) -> None:
    from harness.scenario.scenario import load_scenario
    from harness.trial.scenario_run import start_run
    from runfolder.info import read_run_info
    path = tmp_path / "s.yaml"
    path.write_text("name: s\ncluster: {ranks: 4}\npolicies: {timeout: {}}\n")
    placement = choose("auto", "auto", 4, 0)
    run_dir = start_run(tmp_path, load_scenario(path), path, ["timeout"], "netns", "chaos run s.yaml", placement)
    assert read_run_info(run_dir).placement == {"device": "cpu", "comm": "gloo", "gpus": 0,
                                               "reason": "no GPU visible (NVML): gloo on the CPU"}


@pytest.mark.skipif(visible_gpus() > 0, reason="refused only where no GPU is visible")
def test_a_scenario_that_asks_for_cuda_without_a_gpu_is_refused_before_anything_is_built(tmp_path) -> None:
    from chaos.errors import UsageError
    from harness.cluster.fake import FakeBackend, FakeClock
    from harness.scenario.scenario import load_scenario
    from harness.trial.scenario_run import run_scenario
    from harness.trial.progress import Progress
    path = tmp_path / "s.yaml"
    path.write_text("name: s\ncluster: {ranks: 4, device: cuda}\npolicies: {timeout: {}}\n")
    backend = FakeBackend(FakeClock())
    with pytest.raises(UsageError, match=f"{path}: cluster.device: cuda, but no GPU is visible"):
        run_scenario(load_scenario(path), path, ["timeout"], tmp_path / "runs", backend, Progress(quiet=True))
    assert backend.journal == [] and not (tmp_path / "runs").exists()


def test_a_user_s_job_gets_its_host_s_gpu_and_nccl_on_its_link_but_keeps_its_own_error_handling(tmp_path) -> None:
    from harness.cluster.userjob import JobSpec, rank_environment
    placement = choose("auto", "auto", 4, 4)
    envs = [rank_environment(JobSpec(command=("python", "train.py"), env={"NCCL_DEBUG": "WARN"}), host, 4, "id",
                             "default", str(tmp_path / "events.jsonl"), "eth0", base={},
                             device=job_device_env(placement, host, "eth0")) for host in range(4)]
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs] == ["0", "1", "2", "3"]
    assert all(env["LOCAL_RANK"] == "0" for env in envs)  # the torchrun contract: its one GPU is device 0
    assert all(env["NCCL_SOCKET_IFNAME"] == "=eth0" and env["NCCL_P2P_DISABLE"] == "1" for env in envs)
    assert len({env["NCCL_HOSTID"] for env in envs}) == 4
    assert all("TORCH_NCCL_ASYNC_ERROR_HANDLING" not in env and env["NCCL_DEBUG"] == "WARN" for env in envs)
    assert job_device_env(choose("auto", "auto", 4, 0), 1, "eth0") == {}  # no GPU: nothing to place


def test_a_job_with_several_processes_per_host_is_refused_on_gpus(tmp_path) -> None:
    from harness.scenario.scenario import load_scenario
    from harness.trial.plan import placement_problem
    path = tmp_path / "job.yaml"
    path.write_text("cluster: {ranks: 2}\njob:\n  command: [python, train.py]\n  launcher: torchrun\n"
                    "  nproc_per_host: 2\n")
    cuda = choose("auto", "auto", 2, 2)
    problem = placement_problem(load_scenario(path), path, cuda.device, cuda.reason)
    assert problem.startswith(f"{path}:5: job.nproc_per_host: 2 on GPUs") and "set nproc_per_host: 1" in problem
    cpu = choose("auto", "auto", 2, 0)
    assert placement_problem(load_scenario(path), path, cpu.device, cpu.reason) is None
