"""Fidelity of `slow` (as root the cgroup CPU quota, chaos.cgroup; otherwise the duty
cycle, chaos.inject.DutyCycle): a process that would use a whole CPU, its share of a CPU
read from /proc over 1 s unslowed, then over 3 s slowed (applied through the injector and
its ledger, as a trial's). The verdict holds the slowed share against the unslowed one:
within 5 points of the share asked (the quota's share is of one CPU, the
duty cycle's of the CPU time the rank would have: the two agree where the process had a
whole CPU), judged only where the machine left the process at least 90% of a CPU unslowed
(a process that competes for its CPU gets back less than the time it was stopped: the share
is then the machine's, not the mechanism's). bench/slow_share.py measures more shares, both
mechanisms side by side. As an ordinary user: the duty cycle, which only signals its own
process.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from chaos.api import Host
from chaos.cgroup import CfsQuota
from chaos.faults import Slow, parse_fault
from chaos.fidelity import Family, Figure, not_measured, owned
from chaos.inject import NetlinkInjector, process_mechanisms
from chaos.ledger import Ledger

TICKS = os.sysconf("SC_CLK_TCK")
FREE_S, SLOWED_S, WITHIN, FREE_ENOUGH = 1.0, 3.0, 0.05, 0.9


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def share_over(pid: int, seconds: float) -> float:
    """The share of one CPU the process used over the next `seconds`."""
    used, began = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - used) / (time.monotonic() - began)


@dataclass(frozen=True)
class Share:
    asked: float
    free: float    # of a CPU, unslowed
    slowed: float  # of a CPU, under the fault

    @property
    def of_free(self) -> float:
        return self.slowed / self.free if self.free else 0.0

    @property
    def ok(self) -> bool | None:
        """Within the bar; None: not judged, the machine left the process too little CPU."""
        if self.free < FREE_ENOUGH:
            return None
        return abs(self.of_free - self.asked) <= WITHIN


def measure_share(injector: NetlinkInjector, host: Host, fault: Slow, seconds: float = SLOWED_S) -> Share:
    """`host.pid` (a busy process) unslowed, then under `fault` for `seconds`."""
    assert host.pid is not None
    free = share_over(host.pid, FREE_S)
    injection = injector.apply(fault, [host])
    try:
        slowed = share_over(host.pid, seconds)
    finally:
        injection.revert()
    return Share(fault.cpu_percent, free, slowed)


@contextlib.contextmanager
def busy_process(run_id: str, ledger: Ledger) -> Iterator[tuple[NetlinkInjector, Host]]:
    """A process that would use a whole CPU, as a rank; ended after."""
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with owned(ledger):
            yield NetlinkInjector(ledger, process_mechanisms()), Host("r000", "10.0.0.1", None, None, None,
                                                                      pid=child.pid)
    finally:
        child.kill()
        child.wait()


def measure(setting: tuple[NetlinkInjector, Host], spec: dict[str, Any]) -> Figure:
    injector, host = setting
    fault = parse_fault(spec)
    assert isinstance(fault, Slow)
    refused = not_measured(injector, fault, host)
    if refused:
        return refused
    got = measure_share(injector, host, fault)
    busy = "" if got.ok is not None else (f"; not judged: unslowed it got {got.free:.0%} of a CPU, the bar "
                                         f"needs {FREE_ENOUGH:.0%} (a busy machine)")
    whose = "one CPU" if isinstance(injector.mechanisms["slow"].for_fault(fault), CfsQuota) else "the CPU it would have"
    return Figure(fault.describe(), injector.mechanism(fault), f"{fault.cpu_percent:.0%} of {whose}",
                  f"{got.of_free:.1%} ({got.slowed:.1%} of a CPU over {SLOWED_S:.0f} s, {got.free:.1%} "
                  f"unslowed){busy}", got.ok)


SLOW = Family(specs=({"kind": "slow", "cpu_percent": "20%"}, {"kind": "slow", "cpu_percent": "50%"}),
              scratch=busy_process, measure=measure)
