"""Starting a user's job in a process the rank launcher forked (harness.cluster.zygote, or
a job's container: harness.cluster.container): the one entry every backend calls, for the
job and for its output's tap (harness.cluster.userjob says what each one is).

    start_job   becomes the user's command: in this interpreter where the launch asks for a
                preloaded start and the command allows it (harness.cluster.preload; a
                torchrun agent first forks its worker server, harness.cluster.workers), else
                by execvpe
    run_tap     copies the job's output into the host's log; error lines and step lines
                become events

Imports go one way: this module uses preload and workers, and neither uses it.
"""
from __future__ import annotations

import ctypes
import os
import re
import signal
import socket
import sys
import time
from typing import Any

from harness.cluster import preload, workers
from runfolder.classify import classify_line, heal_fetch_of, heal_of
from harness.cluster.worker_stub import SERVER_ENV
from harness.job.hook.chaos_hook import EVENTS_ENV
from runfolder import events as kinds
from runfolder.events import CLOCK_OFFSET_ENV, EventRecorder

EXEC_FAILED = 127  # a shell's code for a command it cannot run
CLONE_NEWUTS = 0x04000000  # <sched.h>: a hostname of its own

def start_job(launch: dict[str, Any]) -> int:
    """Become the user's command: in this interpreter where the launch asks for a preloaded
    start and the command allows it (harness.cluster.preload), else by exec; returns the
    job's exit code (or exec's failure)."""
    if offset := os.environ.get(CLOCK_OFFSET_ENV):  # the node's clock offset, from its agent
        launch = {**launch, "env": {**launch["env"], CLOCK_OFFSET_ENV: offset}}
    if launch.get("hostname"):
        if problem := own_hostname(launch["hostname"]):
            print(f"chaos: cannot give this host its own hostname {launch['hostname']}: {problem}",
                  file=sys.stderr, flush=True)
            return EXEC_FAILED
    if launch["start"] == "preloaded":
        start = preload.how_to_start(launch)
        if isinstance(start, preload.Start):
            if launch.get("serve_workers"):  # a torchrun agent: its workers fork from a copy of this interpreter
                workers.start_server(launch["env"][SERVER_ENV])
            return preload.run(start, launch)
        print(f"chaos: job.start preloaded: exec instead, as {start}", file=sys.stderr, flush=True)
    return exec_job(launch)


def own_hostname(name: str) -> str | None:
    """This process (and all it starts) in a UTS namespace of its own, named `name`: every
    network namespace shares the machine's hostname, which resolves to loopback, and a
    framework that advertises its hostname to peers on other hosts needs one they can reach
    (harness.cluster.frameworks). None when done, else why not."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUTS) != 0:
        return os.strerror(ctypes.get_errno())
    try:
        socket.sethostname(name)
    except OSError as exc:
        return exc.strerror
    return None


def exec_job(launch: dict[str, Any]) -> int:
    """Become the user's command; returns only when exec failed (the code to exit with)."""
    try:
        for number in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these; a new program must not
            signal.signal(number, signal.SIG_DFL)
        os.chdir(launch["cwd"])
        os.execvpe(launch["argv"][0], launch["argv"], launch["env"])
    except OSError as exc:
        print(f"chaos: cannot run {launch['argv'][0]!r} in {launch['cwd']}: {exc.strerror}", file=sys.stderr)
    return EXEC_FAILED


def run_tap(fd: int, log_path: str, launch: dict[str, Any]) -> int:
    """Copy the job's output from `fd` into the log until every writer closed it; record
    classified error lines and pattern steps as events, each at the time its line arrived."""
    recorder = EventRecorder(launch["env"][EVENTS_ENV], kinds.RANK, rank=launch["rank"])
    pattern = re.compile(launch["step_pattern"]) if launch["step_pattern"] else None
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    steps, last_step, pending = 0, None, b""
    while chunk := os.read(fd, 65536):
        arrived = time.monotonic()
        os.write(log, chunk)
        *lines, pending = (pending + chunk).split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace").rstrip("\r")
            cause = classify_line(line)
            if cause is not None:
                recorder.emit(kinds.JOB_OUTPUT, t=arrived, cause=cause, line=line[:500])
            elif (heal := heal_of(line)) is not None:
                recorder.emit(kinds.HEAL, t=arrived, **heal, line=line[:500])
            elif (fetched := heal_fetch_of(line)) is not None:
                recorder.emit(kinds.HEAL_FETCHED, t=arrived, seconds=fetched, line=line[:500])
            if pattern is not None and pattern.search(line):
                steps += 1
                recorder.emit(kinds.STEP, t=arrived, step=steps, gen=0, loss=None,
                              dur=None if last_step is None else round(arrived - last_step, 6))
                last_step = arrived
    os.close(log)
    recorder.close()
    return 0
