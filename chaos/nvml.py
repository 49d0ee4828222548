"""`slow` on a rank's GPU through NVML (nvidia-ml-py): its graphics clock locked at
`gpu_clock` MHz, or its power limit set to `power_limit` W, a node capped by heat or power.

Both are settings of the whole GPU, which NVML lets only root change. The ledger records
the undo before the setting is made: `reset_gpu_clocks` (the driver's own clock policy back)
and `restore_power_limit` (the limit the GPU had, in milliwatts), each naming the GPU by its
UUID, which a heal after a SIGKILL finds whatever the device order. A value outside what the
GPU takes is refused with its range, never clamped.

Written against NVML's documented calls; not yet run on a GPU (docs/storage-faults.md).
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator

from chaos.api import Host
from chaos.errors import InjectionError, UnsupportedFault
from chaos.faults import FaultBase, Slow
from chaos.ledger import Entry, Ledger
from chaos.mechanism import Mechanism
from chaos.undotable import UndoTable


@contextlib.contextmanager
def nvml() -> Iterator[Any]:
    """pynvml, initialised; None without a driver or without nvidia-ml-py. NVML never
    initialises CUDA (a process that forks ranks must not)."""
    try:
        import pynvml
    except ImportError:
        yield None
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        yield None
        return
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def why_no_gpu_settings() -> str | None:
    """Why this process cannot change a GPU's clocks or power limit, or None."""
    with nvml() as lib:
        if lib is None:
            return "NVML cannot be asked here (no NVIDIA driver, or nvidia-ml-py is not installed)"
        if lib.nvmlDeviceGetCount() == 0:
            return "NVML shows no GPU here"
    if os.geteuid() != 0:
        return "NVML lets only root change a GPU's clocks and power limit; run as root"
    return None


def _handle(lib: Any, uuid: str) -> Any:
    try:
        return lib.nvmlDeviceGetHandleByUUID(uuid)
    except lib.NVMLError_NotFound:
        return None


def _undo_reset_gpu_clocks(args: dict[str, Any]) -> None:
    with nvml() as lib:
        handle = None if lib is None else _handle(lib, args["uuid"])
        if handle is not None:  # a GPU gone (or no driver any more) holds no setting
            lib.nvmlDeviceResetGpuLockedClocks(handle)


def _undo_restore_power_limit(args: dict[str, Any]) -> None:
    with nvml() as lib:
        handle = None if lib is None else _handle(lib, args["uuid"])
        if handle is not None:
            lib.nvmlDeviceSetPowerManagementLimit(handle, args["milliwatts"])


def _made(entry: Entry, ledger: Ledger, make: Callable[[], None]) -> Entry:
    """The setting made, its entry done; one that failed is taken back (a reset of what
    may be half set) and its entry undone."""
    try:
        make()
    except BaseException:
        UNDOS.revert(entry, ledger)
        raise
    ledger.mark(entry, "done")
    return entry


UNDOS = UndoTable({"reset_gpu_clocks": _undo_reset_gpu_clocks, "restore_power_limit": _undo_restore_power_limit})


class NvmlSetting(Mechanism):
    """The target rank's GPU (`Host.gpu`) set through NVML, in the harness's process."""

    name = "NVML setting of the rank's GPU (root)"

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        assert isinstance(fault, Slow) and fault.gpu_setting is not None
        if host.gpu is None:
            raise UnsupportedFault(f"{fault.describe()} on {host.name}: the rank has no GPU "  # type: ignore[attr-defined]
                                   "(cluster.device: cuda gives each rank one)")
        with nvml() as lib:
            if lib is None:
                raise UnsupportedFault(f"{fault.describe()}: {why_no_gpu_settings()}")  # type: ignore[attr-defined]
            handle = lib.nvmlDeviceGetHandleByIndex(host.gpu)
            uuid = lib.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            try:
                if fault.gpu_clock is not None:
                    return [self._lock_clock(lib, handle, uuid, fault.gpu_clock, host, ledger)]
                assert fault.power_limit is not None
                return [self._limit_power(lib, handle, uuid, fault.power_limit, host, ledger)]
            except lib.NVMLError as exc:
                raise InjectionError(f"{fault.describe()} on {host.name} (GPU {host.gpu}): NVML: {exc}") from exc

    @staticmethod
    def _lock_clock(lib: Any, handle: Any, uuid: str, mhz: int, host: Host, ledger: Ledger) -> Entry:
        top = lib.nvmlDeviceGetMaxClockInfo(handle, lib.NVML_CLOCK_GRAPHICS)
        memory = lib.nvmlDeviceGetMaxClockInfo(handle, lib.NVML_CLOCK_MEM)
        lowest = min(lib.nvmlDeviceGetSupportedGraphicsClocks(handle, memory))
        if not lowest <= mhz <= top:
            raise UnsupportedFault(f"slow on {host.name}: gpu_clock {mhz} MHz is outside what GPU {host.gpu} "  # type: ignore[attr-defined]
                                   f"takes ({lowest}-{top} MHz); give a clock in that range")
        entry = ledger.record("reset_gpu_clocks", uuid=uuid, gpu=host.gpu)
        return _made(entry, ledger, lambda: lib.nvmlDeviceSetGpuLockedClocks(handle, mhz, mhz))

    @staticmethod
    def _limit_power(lib: Any, handle: Any, uuid: str, watts: int, host: Host, ledger: Ledger) -> Entry:
        low, high = lib.nvmlDeviceGetPowerManagementLimitConstraints(handle)
        if not low <= watts * 1000 <= high:
            raise UnsupportedFault(f"slow on {host.name}: power_limit {watts} W is outside what GPU {host.gpu} "  # type: ignore[attr-defined]
                                   f"takes ({low // 1000}-{high // 1000} W); give a limit in that range")
        entry = ledger.record("restore_power_limit", uuid=uuid, gpu=host.gpu,
                              milliwatts=lib.nvmlDeviceGetPowerManagementLimit(handle))
        return _made(entry, ledger, lambda: lib.nvmlDeviceSetPowerManagementLimit(handle, watts * 1000))
