"""Signals to processes named by (pid, start time), so a reused pid is never hit."""
from __future__ import annotations

import os

from chaos.errors import ALREADY_GONE, InjectionError


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def send_signal(pid: int, signum: int, started: int | None, gone_ok: bool = False) -> bool:
    """Signal `pid` if it is still the process that started at `started`; returns whether sent."""
    if started is not None and start_time(pid) != started:
        if gone_ok:
            return False
        raise InjectionError(f"process {pid} is gone (or its pid was reused)")
    try:
        os.kill(pid, signum)
    except OSError as exc:
        if gone_ok and exc.errno in ALREADY_GONE:
            return False
        raise InjectionError(f"signal {signum} to {pid}: {exc}") from exc
    return True
