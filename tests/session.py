"""The session's host check: a test session (tests/ and scenarios/ alike) fails when it left
anything of a run on the host (namespaces, ledgers, containers, project processes, any
process the tests started that still lives, torchrun's own log folders in /tmp), and what
was left is removed. Things of runs whose live owner is not this session (CI beside us), or
whose owner is dead and whose run folder or ledger is not under this session's temp folder,
are not ours and are left alone (`harness.cluster.host`).

The fixture is registered by the repository's conftest.py, above tests/ and scenarios/, so
that it starts before the scenario plugin's session launcher in any order of paths and ends
after it (begun by the first item under tests/, it saw that launcher as a stray process)."""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest


def _descendants(me: int) -> list[str]:
    from chaos import proc
    from harness.cluster.host import descends_from
    return [f"process {pid} (started by the tests, state {proc.state(pid)}): {_command_line(pid)}"
            for pid in (int(e) for e in os.listdir("/proc") if e.isdigit())
            if pid != me and descends_from(pid, me)]


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return " ".join(a.decode(errors="replace") for a in f.read().split(b"\0") if a)[:300]
    except OSError:
        return "(gone)"


@pytest.fixture(scope="session", autouse=True)
def host_left_clean(tmp_path_factory: pytest.TempPathFactory):
    """Fail the session if it left anything of a run on the host; remove it either way."""
    from harness.cluster import host
    before = host.snapshot()
    torch_logs = set(_torchrun_log_dirs())
    yield
    me = os.getpid()
    strays = _descendants(me)
    for item in strays:
        proc_kill(int(item.split()[1]))
    runs = host.runs_under(tmp_path_factory.getbasetemp())  # the tests' run folders and ledgers
    left = host.left_since(before, me, runs)
    report = host.remove(left, runs)
    # torchrun run without --log-dir makes a folder of its own in /tmp and never removes it
    stray_logs = sorted(set(_torchrun_log_dirs()) - torch_logs)
    for folder in stray_logs:
        shutil.rmtree(folder, ignore_errors=True)
    problems = (strays + [str(i) for i in left] + [f"could not remove: {f}" for f in report.failed]
                + [f"torchrun's log folder {f} (give it --log-dir)" for f in stray_logs])
    if problems:
        pytest.fail("the test session left this behind (now removed):\n  " + "\n  ".join(problems))


def _torchrun_log_dirs() -> list[str]:
    return [str(p) for p in Path(tempfile.gettempdir()).glob("torchelastic_*")]


def proc_kill(pid: int) -> None:
    from chaos import proc
    proc.send_signal(pid, signal.SIGKILL, proc.start_time(pid), gone_ok=True)
    proc.reap(pid, proc.KILLED_WITHIN_S)
