"""GPU memory given back, measured per process from outside the rank with NVML.

Two figures, each watched every poll from its own start:
- after a breaker opens (a rank's breaker_open event): until that rank's process holds at
  most the bar (or exited: then none), the gpu_memory_released event;
- after a kill (a kill fault on a rank on a GPU): until NVML no longer lists GPU memory
  for the killed pid (a process that died holding memory: the driver frees it as the
  process goes), the gpu_memory_freed event.
Where NVML cannot be asked (no GPU, no driver), or the ranks are not on a GPU (the harness
gives no NVML then), nothing is emitted and the reports say "not observed".
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
        self._killed: dict[int, tuple[int, float]] = {}  # rank -> (pid, kill t)
        self._blind = False  # NVML answered None once: nothing can be observed

    def _held(self) -> dict[int, int] | None:
        if self._blind:
            return None
        held = self._held_by_pid()
        self._blind = held is None
        return held

    def poll(self, breakers: dict[int, float], pid_of: Callable[[int], int | None]) -> list[tuple[int, float, int]]:
        """(rank, breaker t, bytes held) for every rank whose process now holds at most the bar."""
        for rank, t in breakers.items():
            if rank not in self._watching and rank not in self._done:
                self._watching[rank] = (pid_of(rank), t)
        if not self._watching or (held := self._held()) is None:
            return []
        released = []
        for rank, (pid, t) in list(self._watching.items()):
            now = 0 if pid is None else held.get(pid, 0)
            if now <= RELEASE_BAR_BYTES:
                released.append((rank, t, now))
                del self._watching[rank]
                self._done.add(rank)
        return released

    def killed(self, pids: dict[int, int | None], t: float) -> None:
        """Watch the processes of ranks killed at `t` (rank -> its pid just before the kill)."""
        self._killed.update({rank: (pid, t) for rank, pid in pids.items() if pid is not None})

    def freed(self) -> list[tuple[int, int, float]]:
        """(rank, pid, kill t) for every killed process NVML no longer lists."""
        if not self._killed or (held := self._held()) is None:
            return []
        gone = [(rank, pid, t) for rank, (pid, t) in self._killed.items() if pid not in held]
        for rank, _, _ in gone:
            del self._killed[rank]
        return gone
