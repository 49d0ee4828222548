"""`slow`'s GPU settings (chaos.nvml) against a fake NVML: the logic only (what is recorded
before a setting, what a revert and a heal from the ledger alone put back, the ranges
refused). This machine has no GPU: that NVML really slows a GPU is for a GPU node (docs/gpu.md)."""
from __future__ import annotations

import re
import sys
import types

import pytest

from chaos import nvml
from chaos.api import Host
from chaos.errors import InjectionError, UnsupportedFault
from chaos.faults import Slow
from chaos.heal import heal_run
from chaos.undotable import HealReport
from chaos.inject import NetlinkInjector, slow_mechanism
from chaos.ledger import Ledger
from chaos.undo import UNDOS
from tests.chaos.conftest import new_run_id


class NVMLError(Exception):
    pass


class NotFound(NVMLError):
    pass


def fake_pynvml(fail_set: bool = False) -> types.SimpleNamespace:
    """One GPU (UUID GPU-0): graphics clocks 210-1980 MHz, power limit 100-400 W, now 350 W."""
    gpu = {"locked": None, "limit_mw": 350_000}

    def handle_by_uuid(uuid: str) -> dict:
        if uuid != "GPU-0":
            raise NotFound(uuid)
        return gpu

    def lock(handle: dict, low: int, high: int) -> None:
        if fail_set:
            raise NVMLError("Insufficient Permissions")
        handle["locked"] = (low, high)

    lib = types.SimpleNamespace(
        NVMLError=NVMLError, NVMLError_NotFound=NotFound, NVML_CLOCK_GRAPHICS=0, NVML_CLOCK_MEM=2,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: gpu, nvmlDeviceGetHandleByUUID=handle_by_uuid,
        nvmlDeviceGetUUID=lambda h: b"GPU-0",
        nvmlDeviceGetMaxClockInfo=lambda h, kind: 1980 if kind == 0 else 2619,
        nvmlDeviceGetSupportedGraphicsClocks=lambda h, mem: [1980, 1500, 900, 210],
        nvmlDeviceSetGpuLockedClocks=lock,
        nvmlDeviceResetGpuLockedClocks=lambda h: h.update(locked=None),
        nvmlDeviceGetPowerManagementLimitConstraints=lambda h: (100_000, 400_000),
        nvmlDeviceGetPowerManagementLimit=lambda h: h["limit_mw"],
        nvmlDeviceSetPowerManagementLimit=lambda h, mw: h.update(limit_mw=mw))
    lib.gpu = gpu
    return lib


@pytest.fixture
def gpu(monkeypatch, state_dir):
    lib = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", lib)
    yield lib, Ledger(new_run_id("g")), Host("r001", "10.0.0.2", None, None, None, pid=1, gpu=0)


def test_a_clock_is_locked_and_its_revert_gives_the_driver_its_policy_back(gpu):
    lib, ledger, host = gpu
    injection = NetlinkInjector(ledger, {"slow": nvml.NvmlSetting()}).apply(Slow(gpu_clock=900), [host])
    assert lib.gpu["locked"] == (900, 900)
    assert [(e.op, e.args["uuid"]) for e in ledger.outstanding()] == [("reset_gpu_clocks", "GPU-0")]
    injection.revert()
    assert lib.gpu["locked"] is None and ledger.outstanding() == []


def test_a_power_limit_is_put_back_by_a_heal_from_the_ledger_alone(gpu):
    lib, ledger, host = gpu
    NetlinkInjector(ledger, {"slow": nvml.NvmlSetting()}).apply(Slow(power_limit=150), [host])
    assert lib.gpu["limit_mw"] == 150_000  # the harness "died" here
    heal_run(ledger.run_id, HealReport(), UNDOS)
    assert lib.gpu["limit_mw"] == 350_000


@pytest.mark.parametrize(("fault", "words"), [
    (Slow(gpu_clock=5000), "gpu_clock 5000 MHz is outside what GPU 0 takes (210-1980 MHz)"),
    (Slow(power_limit=50), "power_limit 50 W is outside what GPU 0 takes (100-400 W)"),
])
def test_a_setting_the_gpu_does_not_take_is_refused_with_its_range_and_nothing_recorded(gpu, fault, words):
    lib, ledger, host = gpu
    with pytest.raises(UnsupportedFault, match=re.escape(words)):
        NetlinkInjector(ledger, {"slow": nvml.NvmlSetting()}).apply(fault, [host])
    assert ledger.outstanding() == [] and lib.gpu == {"locked": None, "limit_mw": 350_000}


def test_a_setting_nvml_refuses_is_taken_back(monkeypatch, state_dir):
    lib = fake_pynvml(fail_set=True)
    monkeypatch.setitem(sys.modules, "pynvml", lib)
    ledger = Ledger(new_run_id("g"))
    with pytest.raises(InjectionError, match="NVML: Insufficient Permissions"):
        NetlinkInjector(ledger, {"slow": nvml.NvmlSetting()}).apply(
            Slow(gpu_clock=900), [Host("r001", "10.0.0.2", None, None, None, pid=1, gpu=0)])
    assert ledger.outstanding() == []


def test_a_rank_without_a_gpu_and_a_machine_without_nvml_are_refused_with_the_reason(gpu, monkeypatch):
    lib, ledger, host = gpu
    with pytest.raises(UnsupportedFault, match="the rank has no GPU"):
        NetlinkInjector(ledger, {"slow": nvml.NvmlSetting()}).apply(Slow(gpu_clock=900), [host.__class__(
            "r001", "10.0.0.2", None, None, None, pid=1)])
    monkeypatch.setattr(nvml.os, "geteuid", lambda: 65534)
    assert "only root" in nvml.why_no_gpu_settings()
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    assert nvml.why_no_gpu_settings().startswith("NVML cannot be asked here")
    # the CPU share keeps its own way; the GPU setting gets the refusal
    mechanism = slow_mechanism()
    assert "NVML cannot be asked" in mechanism.for_fault(Slow(gpu_clock=900)).name
    assert mechanism.for_fault(Slow(cpu_percent="20%")).name == mechanism.name


@pytest.mark.requires_root
def test_doctor_says_what_slow_s_gpu_settings_get_here():
    from tests.conftest import chaos_cli
    done = chaos_cli("doctor", timeout=120)
    assert done.returncode == 0, done.stderr
    why = nvml.why_no_gpu_settings()
    expected = nvml.NvmlSetting.name if why is None else f"unavailable: {why}"
    assert f"gpu_clock, power_limit: {expected}" in done.stdout, done.stdout
