"""torchrun's workers started preloaded too, without patching torchrun.

A preloaded torchrun agent (harness.cluster.jobstart.start_job) first forks its host's worker
server: a copy of the rank launcher's warm interpreter that is the agent's child, so it is
in the host's namespace and process tree and ends with the agent (PR_SET_PDEATHSIG).
torchrun runs each worker as `python -I -S worker_stub.py COMMAND...` (`stub_command`);
the stub connects to the server's socket (an abstract unix name, `server_name`), hands over
its argv, working directory, environment and stdin/stdout/stderr, and the server forks the
worker, which becomes COMMAND as a preloaded rank does, in a session of its own as
torchrun starts its workers. The stub is what torchrun watches and signals: it forwards
the signals to the worker and exits as the worker did. When the stub's connection closes
first (torchrun SIGKILLed it), the server SIGKILLs the worker's session. A command that
cannot be preloaded is answered `exec`, and the stub execs it itself.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from chaos import proc
from chaos.proc import die_with_parent
from harness.cluster import preload
from harness.cluster.worker_stub import SERVER_ENV

STUB = str(Path(__file__).with_name("worker_stub.py"))
SERVER_TITLE = "chaos-worker-server"  # its command line (ps, and the stacks it is left out of)
POLL_S = 0.05


def worker_processes(host_pid: int) -> list[tuple[int, int]]:
    """The workers an agent at or under `host_pid` runs now, each with its start time: those
    chaos.proc.workers finds, where the one it finds is a preloaded worker's stub (what
    torchrun started and watches) the worker its host's worker server forked instead."""
    marked = proc.workers(host_pid)
    stubs = {pid for pid, _ in marked if STUB in proc.command_line(pid)}
    if not stubs:
        return marked
    servers = {pid for pid, _ in proc.descendants(host_pid) if proc.command_line(pid).startswith(SERVER_TITLE)}
    return [m for m in marked if m[0] not in stubs] + proc.children_of(servers)


def server_name(run_id: str, rank: int) -> str:
    """The worker server's abstract socket name for `rank`'s host (names are per network
    namespace; the rank keeps hosts that share one, the local backend's, apart)."""
    return f"chaos-workers-{run_id}-r{rank:03d}"


def stub_command(command: tuple[str, ...] | list[str]) -> list[str]:
    """What torchrun runs (`--no-python`) for each worker of a preloaded job."""
    return [sys.executable, "-I", "-S", STUB, *command]


def start_server(name: str) -> None:
    """In the agent's process, before torchrun runs: fork the worker server; returns in the
    agent at once."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind("\0" + name)
    listener.listen(64)
    if os.fork() != 0:
        listener.close()
        return
    code = 70
    try:
        die_with_parent()
        preload.set_title((SERVER_TITLE, name))
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # the agent's output is not the server's
            os.dup2(devnull, fd)
        os.close(devnull)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        code = _serve(listener)
    finally:
        os._exit(code)


def _serve(listener: socket.socket) -> int:
    workers: dict[int, socket.socket] = {}  # pid -> its stub's connection
    while True:
        conns = {c.fileno(): (pid, c) for pid, c in workers.items()}
        ready, _, _ = select.select([listener, *(c for _, c in conns.values())], [], [], POLL_S)
        for item in ready:
            if item is listener:
                conn, _ = listener.accept()
                pid = _start(listener, conn, workers)
                if pid is not None:
                    workers[pid] = conn
            elif not item.recv(1):  # the stub is gone: so is its worker, as torchrun meant
                pid = next(p for p, c in workers.items() if c is item)
                _kill_session(pid)
        while workers:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = workers.pop(pid, None)
            if conn is not None:
                ended = ({"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status)
                         else {"exit": os.waitstatus_to_exitcode(status)})
                try:
                    conn.send(json.dumps(ended).encode())
                except OSError:
                    pass
                conn.close()


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _start(listener: socket.socket, conn: socket.socket, workers: dict[int, socket.socket]) -> int | None:
    """Fork the worker a stub asks for; its pid, or None when the stub was told to exec."""
    try:
        raw, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        request: dict[str, Any] = json.loads(raw)
    except (OSError, ValueError):
        conn.close()
        return None
    launch = {"argv": request["argv"], "cwd": request["cwd"], "env": request["env"]}
    start = preload.how_to_start(launch)
    if isinstance(start, str) or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        conn.send(json.dumps({"exec": start if isinstance(start, str) else "its streams did not come"}).encode())
        conn.close()
        return None
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            die_with_parent()
            listener.close()
            for other in workers.values():
                other.close()
            conn.close()
            os.setsid()  # as torchrun starts its workers: its killpg reaches the worker's own
            for target, fd in zip((0, 1, 2), fds, strict=True):
                os.dup2(fd, target)
            for fd in fds:
                if fd > 2:
                    os.close(fd)
            code = preload.run(start, launch)
        except BaseException:  # noqa: BLE001 - never back into the server's loop
            import traceback
            traceback.print_exc()
        finally:
            os._exit(code)
    for fd in fds:
        os.close(fd)
    conn.send(json.dumps({"pid": pid}).encode())
    return pid


__all__ = ["SERVER_ENV", "SERVER_TITLE", "server_name", "start_server", "stub_command", "worker_processes"]
