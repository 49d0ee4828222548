"""GPU memory released after a breaker opens, measured per process from outside the rank.

When a rank's breaker opens (its breaker_open event), the harness asks NVML, every poll,
how much GPU memory that rank's process holds, until it holds at most the bar (or it
exited: then none); that moment is the gpu_memory_released event. Where NVML cannot be
asked (no GPU, no driver) nothing is emitted and the reports say "not observed".
"""
from __future__ import annotations

from typing import Callable

# NVIDIA resiliency-ext restarts a rank only once its GPU memory is below this
RELEASE_BAR_BYTES = 512 * 2**20


class GpuRelease:
    """`held_by_pid`: bytes of GPU memory per process now, or None where NVML is absent."""

    def __init__(self, held_by_pid: Callable[[], dict[int, int] | None]) -> None:
        self._held_by_pid = held_by_pid
        self._watching: dict[int, tuple[int | None, float]] = {}  # rank -> (pid, breaker t)
        self._done: set[int] = set()
        self._blind = False  # NVML answered None once: nothing can be observed

    def poll(self, breakers: dict[int, float], pid_of: Callable[[int], int | None]) -> list[tuple[int, float, int]]:
        """(rank, breaker t, bytes held) for every rank whose process now holds at most the bar."""
        for rank, t in breakers.items():
            if rank not in self._watching and rank not in self._done:
                self._watching[rank] = (pid_of(rank), t)
        if self._blind or not self._watching:
            return []
        held = self._held_by_pid()
        if held is None:
            self._blind = True
            return []
        released = []
        for rank, (pid, t) in list(self._watching.items()):
            now = 0 if pid is None else held.get(pid, 0)
            if now <= RELEASE_BAR_BYTES:
                released.append((rank, t, now))
                del self._watching[rank]
                self._done.add(rank)
        return released
