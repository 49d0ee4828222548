"""Where a rank computes and how it talks: device and collective backend, as values.

The run-wide choice (`choose`), from the scenario's `cluster: {device, comm}` and the GPUs
the host shows (`visible_gpus`, NVML: no CUDA initialised in the harness or the rank
launcher, which forks):

    device cpu, or auto without a GPU      -> gloo on the CPU
    a GPU per rank (gpus >= ranks)         -> NCCL, rank r on GPU r   (comm auto or nccl)
    fewer GPUs than ranks                  -> gloo with CUDA tensors, rank r on GPU r % gpus
                                              (NCCL refuses two ranks on one GPU)

Each rank's environment (`rank_env`), set in the forked child before CUDA initialises: its
one GPU as CUDA_VISIBLE_DEVICES (so it is cuda:0 inside) and LOCAL_RANK; for NCCL, the
rank's own link and nothing else (sockets only: no P2P, no shared memory, no InfiniBand;
bound to the host's interface; a host identity per rank, since ranks in namespaces of one
machine share its hostname and boot id and NCCL would treat them as one node and go
around the link), and the error handling the policy needs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from chaos.nvml import nvml

Device = Literal["cpu", "cuda"]
Comm = Literal["gloo", "nccl"]

# TORCH_NCCL_ASYNC_ERROR_HANDLING: 1 tears the process down on a collective error; 2 aborts
# the communicator and keeps the process, which can then retry, isolate itself or go on in
# a smaller world. Policies that act after an error need 2; the others end at once.
NCCL_ERROR_HANDLING = {"baseline": "1", "timeout": "1", "retry": "2", "isolation": "2", "elastic": "2"}


class PlacementError(ValueError):
    """The scenario asks for a device or backend this host cannot give."""


@dataclass(frozen=True)
class Placement:
    device: Device
    comm: Comm
    gpus: int          # GPUs visible on the host when the choice was made
    reason: str

    def gpu_of(self, rank: int) -> int | None:
        """The host GPU rank `rank` uses (None on the CPU)."""
        return rank % self.gpus if self.device == "cuda" else None


def choose(device: str, comm: str, ranks: int, gpus: int) -> Placement:
    """The placement for `ranks` ranks on a host with `gpus` GPUs; `device` cpu | cuda |
    auto, `comm` gloo | nccl | auto."""
    if device == "cpu" or (device == "auto" and gpus == 0):
        if comm == "nccl":
            raise PlacementError("cluster.comm: nccl needs CUDA devices; with device: cpu use gloo (or auto)")
        why = "device: cpu" if device == "cpu" else "no GPU visible (NVML)"
        return Placement("cpu", "gloo", gpus, f"{why}: gloo on the CPU")
    if gpus == 0:
        raise PlacementError("cluster.device: cuda, but no GPU is visible (NVML); use device: auto or cpu")
    if gpus >= ranks and comm in ("nccl", "auto"):
        return Placement("cuda", "nccl", gpus, f"a GPU per rank ({gpus} GPUs, {ranks} ranks): NCCL")
    if comm == "nccl":
        raise PlacementError(f"cluster.comm: nccl, but {ranks} ranks share {gpus} GPUs and NCCL refuses two "
                             "ranks on one GPU; use comm: gloo (or auto), or at most one rank per GPU")
    why = "comm: gloo" if comm == "gloo" else f"{ranks} ranks share {gpus} GPUs (NCCL refuses two ranks on one GPU)"
    return Placement("cuda", "gloo", gpus, f"{why}: gloo with CUDA tensors, rank r on GPU r % {gpus}")


def rank_env(placement: Placement, rank: int, policy_base: str, ifname: str) -> dict[str, str]:
    """The environment rank `rank`'s process needs before CUDA initialises."""
    gpu = placement.gpu_of(rank)
    if gpu is None:
        return {}
    env = {"CUDA_VISIBLE_DEVICES": str(gpu), "LOCAL_RANK": str(rank)}
    if placement.comm == "nccl":
        env.update(nccl_on_the_link(rank, ifname), TORCH_NCCL_ASYNC_ERROR_HANDLING=NCCL_ERROR_HANDLING[policy_base])
    return env


def nccl_on_the_link(host: int, ifname: str) -> dict[str, str]:
    """NCCL forced onto the host's own link, so that a fault on it bites: sockets only (no
    NVLink/P2P, no shared memory, no InfiniBand) and one host identity per host (ranks in
    namespaces of one machine would otherwise be taken for one node)."""
    return {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1", "NCCL_NET": "Socket",
            "NCCL_SOCKET_IFNAME": f"={ifname}", "NCCL_HOSTID": f"chaos-rank-{host}"}


def job_device_env(placement: Placement, host: int, ifname: str) -> dict[str, str]:
    """A user's job on a GPU host: the host's GPU, and NCCL on its link should the job use
    it; the job picks its own backend and NCCL error handling (what is under test)."""
    gpu = placement.gpu_of(host)
    return {} if gpu is None else {"CUDA_VISIBLE_DEVICES": str(gpu), **nccl_on_the_link(host, ifname)}


def visible_gpus() -> int:
    """GPUs NVML shows on this host (0 where it cannot be asked)."""
    with nvml() as lib:
        return 0 if lib is None else int(lib.nvmlDeviceGetCount())


def describe_host(ranks: int) -> str:
    """`chaos doctor`'s line: what `cluster: {device: auto, comm: auto}` picks here."""
    placement = choose("auto", "auto", ranks, visible_gpus())
    return f"devices ({ranks} ranks, device: auto, comm: auto): {placement.device}, {placement.comm}: {placement.reason}"


def gpu_memory_by_pid() -> dict[int, int] | None:
    """Bytes of GPU memory each process holds, over every GPU; None where NVML cannot be
    asked: nothing can be observed."""
    with nvml() as lib:
        if lib is None:
            return None
        held: dict[int, int] = {}
        for i in range(lib.nvmlDeviceGetCount()):
            for p in lib.nvmlDeviceGetComputeRunningProcesses(lib.nvmlDeviceGetHandleByIndex(i)):
                held[p.pid] = held.get(p.pid, 0) + (p.usedGpuMemory or 0)
        return held
