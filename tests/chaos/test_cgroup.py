"""`slow` by the kernel's CPU quota (chaos.cgroup), root's mechanism: a real process and its
child in a cgroup of the run's own, capped at the share asked; the revert and a heal after
the harness died both move them back and remove the cgroup. The duty cycle, every user's
fallback, is tests/chaos/test_dutycycle.py."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaos import cgroup
from chaos.api import Host
from chaos.calibrate_slow import share_over
from chaos.faults import Slow
from chaos.heal import heal_run
from chaos.undotable import HealReport
from chaos.inject import DutyCycle, NetlinkInjector, slow_mechanism
from chaos.ledger import Ledger
from chaos.undo import UNDOS
from tests.chaos.conftest import new_run_id

pytestmark = [pytest.mark.requires_root, pytest.mark.requires_cgroup_cpu]

SPIN = "while True: pass"


@pytest.fixture
def spinner(state_dir):
    """A process that would use a whole CPU with a child that would too, its host, and a
    ledger healed afterwards."""
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys\nsubprocess.Popen([sys.executable, "
                               f"'-c', {SPIN!r}])\n{SPIN}"])
    run_id = new_run_id("q")
    try:
        yield parent, Host("r000", "10.0.0.1", None, None, None, pid=parent.pid), Ledger(run_id)
    finally:
        heal_run(run_id, HealReport(), UNDOS)
        subprocess.run(["pkill", "-KILL", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait()


def child_of(pid: int) -> int:
    deadline = time.monotonic() + 5.0
    while True:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children:
            return int(children[0])
        assert time.monotonic() < deadline, "the spinner started no child"
        time.sleep(0.02)


def test_root_gets_the_quota_and_an_ordinary_user_the_duty_cycle(monkeypatch):
    share = Slow(cpu_percent="20%")
    assert isinstance(slow_mechanism().for_fault(share), cgroup.CfsQuota)
    # `stops` asks for the duty cycle whoever runs it
    assert isinstance(slow_mechanism().for_fault(Slow(cpu_percent="20%", stops=True)), DutyCycle)
    monkeypatch.setattr(cgroup.os, "geteuid", lambda: 65534)
    assert isinstance(slow_mechanism().for_fault(share), DutyCycle)
    assert slow_mechanism().name.endswith("no CPU quota here: the cgroup files are the machine's root's "
                                          "(an ordinary user, or a user namespace)")


def test_the_rank_and_its_child_share_the_cap_and_go_back_after(spinner):
    parent, host, ledger = spinner
    child = child_of(parent.pid)
    hierarchy = cgroup.cpu_hierarchy()
    assert hierarchy is not None
    home = hierarchy.cgroup_of(parent.pid)
    injection = NetlinkInjector(ledger, {"slow": cgroup.CfsQuota(hierarchy, DutyCycle())}).apply(Slow(cpu_percent="20%"), [host])
    folder = Path(hierarchy.mount, f"chaos-{ledger.run_id}-r000")
    assert {hierarchy.cgroup_of(parent.pid), hierarchy.cgroup_of(child)} == {str(folder)}
    both = share_over(parent.pid, 2.0) + share_over(child, 2.0)
    injection.revert()
    assert not folder.exists()
    assert hierarchy.cgroup_of(parent.pid) == hierarchy.cgroup_of(child) == home
    # one cap for the two: 20% of one CPU between them (less on a busy machine, never more)
    assert both <= 0.25, both
    assert share_over(parent.pid, 1.0) + share_over(child, 1.0) > 1.5 * both, "still capped after the revert"


def test_a_heal_after_the_harness_died_moves_the_rank_back_and_removes_the_cgroup(spinner):
    parent, host, ledger = spinner
    hierarchy = cgroup.cpu_hierarchy()
    assert hierarchy is not None
    home = hierarchy.cgroup_of(parent.pid)
    NetlinkInjector(ledger, {"slow": cgroup.CfsQuota(hierarchy, DutyCycle())}).apply(Slow(cpu_percent="10%"), [host])
    folder = Path(hierarchy.mount, f"chaos-{ledger.run_id}-r000")
    assert folder.is_dir()  # no revert: as a SIGKILLed harness leaves it
    report = HealReport()
    heal_run(ledger.run_id, report, UNDOS)
    assert not report.failed
    assert not folder.exists() and hierarchy.cgroup_of(parent.pid) == home
