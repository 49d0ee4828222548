"""Which hosts of a trial train: all, except a coordinator's.

A framework with a coordinator of its own (harness.cluster.frameworks: torchft's Lighthouse)
runs it on the cluster's last host, and so does the harness's runner with its control plane
on a host of its own (its rendezvous store and failure detector: scenario cluster.store:
host). That host makes no training step: the harness waits for the warm-up and the settle
steps of the others, and the reports judge the others as the ranks (the coordinator's host
is still a fault target, and its exit an event). Read from a trial's plan (its `job`, its
`store_host`), so a stored run folder says it without the harness.
"""
from __future__ import annotations

from typing import Any, Mapping

# job.launcher values whose last host is the coordinator (the frameworks' registry agrees:
# tests/harness/test_frameworks.py)
COORDINATED: tuple[str, ...] = ("torchft",)


STORE = "the rendezvous store and failure detector"  # the runner's coordinator, in a report's words


def coordinator_host(ranks: int, job: Mapping[str, Any] | None, store_host: bool = False) -> int | None:
    """The host that runs the job's coordinator, or the runner's store, or None."""
    return ranks - 1 if store_host or (job is not None and job.get("launcher") in COORDINATED) else None


def training_hosts(ranks: int, job: Mapping[str, Any] | None, store_host: bool = False) -> tuple[int, ...]:
    """The hosts that train (every one but the coordinator's)."""
    return tuple(r for r in range(ranks) if r != coordinator_host(ranks, job, store_host))
