"""harness.trial.hogs: real busy processes while the block runs, none after it."""
from __future__ import annotations

import os
import time
from pathlib import Path

from harness.trial.hogs import cpu_hogs


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def test_hogs_burn_cpu_while_the_block_runs_and_are_gone_after():
    with cpu_hogs(2) as hogs:
        pids = [h.pid for h in hogs]
        time.sleep(0.5)
        assert all(cpu_ticks(pid) > 0 for pid in pids)
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), pid
