"""Which hosts of a trial train: all, except a framework's coordinator.

A framework with a coordinator of its own (harness.cluster.frameworks: torchft's Lighthouse)
runs it on the cluster's last host, which makes no training step: the harness waits for the
warm-up and the settle steps of the others, and the reports judge the others as the ranks
(the coordinator's host is still a fault target, and its exit an event). Read from a trial's
plan (its `job`), so a stored run folder says it without the harness.
"""
from __future__ import annotations

from typing import Any, Mapping

# job.launcher values whose last host is the coordinator (the frameworks' registry agrees:
# tests/harness/test_frameworks.py)
COORDINATED: tuple[str, ...] = ("torchft",)


def coordinator_host(ranks: int, job: Mapping[str, Any] | None) -> int | None:
    """The host that runs the job's coordinator, or None."""
    return ranks - 1 if job is not None and job.get("launcher") in COORDINATED else None


def training_hosts(ranks: int, job: Mapping[str, Any] | None) -> tuple[int, ...]:
    """The hosts that train (every one but the coordinator's)."""
    return tuple(r for r in range(ranks) if r != coordinator_host(ranks, job))
