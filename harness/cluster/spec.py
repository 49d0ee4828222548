"""The cluster's value types: what to build (`ClusterSpec`), what a backend can do (`Traits`),
how a rank ended (`RankExit`), and the ports every backend uses. Plain values, importing
nothing of the harness: the interfaces (harness.cluster.api), the registry
(harness.cluster.backends) and the rank launcher all take them from here."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

STORE_PORT = 29400
JOB_MASTER_PORT = 29500  # a user job's rank 0 (MASTER_PORT; torchrun's default)


@dataclass(frozen=True)
class Traits:
    """What a backend can do, declared by the backend itself: the scenario loader refuses
    what it cannot (with the backend that can), `chaos doctor` lists them."""

    summary: str              # where a rank runs, in a few words
    needs_root: bool          # it makes namespaces, links or containers
    user_namespace: bool      # an ordinary user runs it as root of a user namespace of its own (chaos.userns)
    network_faults: bool      # every host has a link of its own that link faults can act on
    link_counters: bool       # per-rank link byte counts (the traffic proof, harness.trial.traffic)
    host_sysctls: bool        # each host's own net.* settings (cluster.sysctls)
    # the link fault kinds its hosts take where it has links (None: every kind the machine
    # can inject); the others are refused at load with the reason
    link_kinds: tuple[str, ...] | None = None
    ranks_per_host: bool = False  # several ranks may share one host (cluster.ranks_per_node)
    scheduler_kinds: tuple[str, ...] = ()  # the scheduler's own fault kinds it makes (preempt, ...)
    # storage faults mount over the ranks' checkpoint folder in the harness's mount namespace:
    # where the ranks share it, or where their own mount namespaces receive its mounts
    # (chaos.storage.share_below)
    storage_faults: bool = False
    # trials may run at once without sharing a machine: each gets hosts of its own from a
    # scheduler (`chaos nightly --parallel N`); on one machine they would skew each other's times
    parallel_trials: bool = False
    # a process fault may act on only the workers of a host's agent (`processes: workers`):
    # the harness signals them by pid, found under the host's process (chaos.proc.workers)
    worker_faults: bool = False
    # the runner's control plane (rendezvous store, failure detector) may run on a host of its
    # own, the last, a fault target like any (scenario cluster.store: host)
    store_host: bool = False


@dataclass(frozen=True)
class ClusterSpec:
    """What to build: `ranks` hosts on one switch, named after `run_id`."""

    run_id: str
    ranks: int
    run_dir: Path            # where ranks write events, logs and checkpoints
    job_dir: Path | None = None  # a user's job's workdir, which every host must see at its path
    gpus: tuple[int | None, ...] = ()  # each rank's host GPU (harness.job.device.Placement.gpu_of); () none
    sysctls: tuple[tuple[str, str], ...] = ()  # every host's own net.* settings (chaos.sysctl)
    # a user's job started preloaded: what its rank launcher imports for it while the hosts
    # are built (harness.cluster.preload); None: no preloaded job
    preload: tuple[str, ...] | None = None
    ranks_per_host: int = 1  # ranks on each host (a scheduler's node), consecutive ranks together
    scheduler_args: tuple[str, ...] = ()  # for the allocation (sbatch): partition, account, time, more
    say: Callable[[str], None] | None = None  # where a slow bring-up says what it waits for
    store_host: bool = False  # the control plane on the last host (Traits.store_host), not on the switch


@dataclass(frozen=True)
class RankExit:
    """How a rank process ended: exit code, or the signal that killed it."""

    rank: int
    pid: int
    exitcode: int | None
    signal: int | None
    t: float                 # monotonic time the harness reaped it
