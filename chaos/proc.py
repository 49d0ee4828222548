"""Signals to processes named by (pid, start time), so a reused pid is never hit."""
from __future__ import annotations

import ctypes
import errno
import os
import select
import signal
import subprocess
import sys
import time

from chaos import userns
from chaos.errors import ALREADY_GONE, InjectionError, TargetGone

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent() -> None:
    """SIGKILL this process when its parent ends (PR_SET_PDEATHSIG): a helper never outlives
    what started it."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def leave_netns() -> None:
    """Move the calling thread into a new, empty network namespace of its own (unshare(2))."""
    if _libc.unshare(CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"unshare a network namespace: {os.strerror(code)}")


def enter_netns(path: str) -> None:
    """Move the calling thread into the network namespace at `path` (setns(2))."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            if code == errno.EINVAL and not userns.is_pinned(path):
                # the pin file of a namespace that ended with its user namespace's run
                raise OSError(errno.ENOENT, f"setns {path}: the namespace is gone (an empty pin)")
            raise OSError(code, f"setns {path}: {os.strerror(code)}")
    finally:
        os.close(fd)


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (field 3 on), or None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def parent(pid: int) -> int | None:
    """The process's parent pid, or None when it is gone."""
    fields = _stat(pid)
    return None if fields is None else int(fields[1])


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    fields = _stat(pid)
    return None if fields is None else int(fields[19])


def state(pid: int) -> str | None:
    """The process's state letter (R, S, T, Z, ...), or None when it is gone."""
    fields = _stat(pid)
    return None if fields is None else fields[0]


def signal_tree(pid: int, signum: int, started: int | None, gone_ok: bool = False) -> set[int]:
    """Signal `pid` (as send_signal) and then every process descended from it, listed before
    the signal: a dead parent's children move away. Returns the pids it signalled."""
    below = descendants(pid)
    send_signal(pid, signum, started, gone_ok)
    for child, child_started in below:
        send_signal(child, signum, child_started, gone_ok=True)
    return {pid, *(child for child, _ in below)}


# torch.distributed.elastic's agent (torchrun, torchft's replica groups, ft_launcher) puts
# this in each worker's environment, and in no process of its own (its rank monitors,
# its rendezvous); a worker's own children (data loaders) inherit it
WORKER_MARK = b"TORCHELASTIC_RESTART_COUNT="


def _environ_has(pid: int, mark: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return any(entry.startswith(mark) for entry in f.read().split(b"\0"))
    except OSError:  # gone, or not ours to read
        return False


def workers(pid: int) -> list[tuple[int, int]]:
    """The workers an elastic agent at or under `pid` started, each with its start time:
    the topmost processes below `pid` whose environment carries the agent's mark (their own
    children are theirs)."""
    found: list[tuple[int, int]] = []
    marked: set[int] = set()
    for child, started in descendants(pid):
        if _environ_has(child, WORKER_MARK):
            fields = _stat(child)
            if fields is not None and int(fields[1]) not in marked:
                found.append((child, started))
            marked.add(child)
    return found


def _children() -> dict[int, list[tuple[int, int]]]:
    """Every process's children, each with its start time, as /proc lists them now."""
    children: dict[int, list[tuple[int, int]]] = {}
    for name in os.listdir("/proc"):
        fields = _stat(int(name)) if name.isdigit() else None
        if fields is not None:
            children.setdefault(int(fields[1]), []).append((int(name), int(fields[19])))
    return children


def descendants(pid: int) -> list[tuple[int, int]]:
    """Every process descended from `pid`, parents before children, each with its start
    time: what a host runs under its one process (torchrun's workers live in sessions of
    their own, so neither a process group nor a session names them all)."""
    children = _children()
    found, parents = [], [pid]
    while parents:
        level = [child for parent in parents for child in children.get(parent, [])]
        found += level
        parents = [child for child, _ in level]
    return found


def children_of(pids: set[int]) -> list[tuple[int, int]]:
    """The children of the processes `pids`, each with its start time."""
    children = _children()
    return [child for pid in sorted(pids) for child in children.get(pid, [])]


def command_line(pid: int) -> str:
    """The process's command line, its words joined by spaces ("" when gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return ""
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)


def send_signal(pid: int, signum: int, started: int | None, gone_ok: bool = False) -> bool:
    """Signal `pid` if it is still the process that started at `started`; returns whether sent."""
    if started is not None and start_time(pid) != started:
        if gone_ok:
            return False
        raise TargetGone(f"process {pid} is gone (or its pid was reused)")
    try:
        os.kill(pid, signum)
    except OSError as exc:
        if exc.errno in ALREADY_GONE:
            if gone_ok:
                return False
            raise TargetGone(f"signal {signum} to {pid}: {exc}", exc.errno) from exc
        raise InjectionError(f"signal {signum} to {pid}: {exc}") from exc
    return True


KILLED_WITHIN_S = 1.0  # a SIGKILLed process ends in milliseconds; this bounds the wait for it


def reap(pid: int, wait_s: float = 0.0) -> None:
    """Collect `pid`'s exit status if it is our child, waiting up to `wait_s` for it to end
    (a process just SIGKILLed is not a zombie yet: without the wait it would stay one until
    something else reaps it); not our child: nothing."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done or time.monotonic() >= deadline:
            return
        time.sleep(0.002)


def stop(pid: int, started: int | None, grace_s: float) -> None:
    """SIGTERM, up to `grace_s` to finish, then SIGKILL; a process already gone is fine."""
    if not send_signal(pid, signal.SIGTERM, started, gone_ok=True):
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        reap(pid)
        if start_time(pid) != started:
            return
        time.sleep(0.01)
    send_signal(pid, signal.SIGKILL, started, gone_ok=True)
    reap(pid, KILLED_WITHIN_S)


HELPER_MODULES = ("chaos.nfq", "chaos.deadman", "chaos.fusefs", "chaos.dutycycle")


def python_module(module: str, *args: str) -> list[str]:
    """The command that runs `module` of this installation in a new interpreter. `-P`: not
    from the working directory, whose own `harness` or `chaos` folder (a user's project, a
    worktree under test) would otherwise come first on `sys.path`; the packages come from
    where this process's came from (`PYTHONPATH`, then the installed ones)."""
    return [sys.executable, "-P", "-m", module, *args]


def spawn_helper(module: str, *args: str) -> subprocess.Popen[bytes]:
    """Start one of this package's helper processes (`python_module`) in its own session,
    so that it outlives a SIGKILL of the harness; its stdout is a pipe."""
    command = python_module(module, *args)
    try:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        raise InjectionError(f"cannot start {module}: {exc}", exc.errno) from exc


def wait_ready(helper: subprocess.Popen[bytes], text: str, timeout_s: float) -> None:
    """Wait until the helper prints a line starting with `text`; kill it if it does not."""
    assert helper.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([helper.stdout], [], [], deadline - time.monotonic())
        line = helper.stdout.readline() if ready else b""
        if line.decode(errors="replace").startswith(text):
            helper.stdout.close()
            return
        if ready and not line:  # EOF: it died
            break
    helper.kill()
    helper.wait()
    raise InjectionError(f"{helper.args[helper.args.index('-m') + 1]} did not get ready within {timeout_s}s "
                         f"(exit status {helper.poll()})")


def helpers_of_run(run_id: str) -> list[int]:
    """Pids of helper processes of `run_id` still alive, found in /proc (a heal's second
    source beside the ledger: a helper can start before its ledger entry is written)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if ("-m" in words[:-1] and words[words.index("-m") + 1] in HELPER_MODULES
                and "--run-id" in words and words[words.index("--run-id") + 1:][:1] == [run_id]):
            found.append(int(entry))
    return found


def in_namespaces(inodes: set[int]) -> list[tuple[int, int]]:
    """(pid, start time) of every process whose network namespace is one of `inodes`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            inode = os.stat(f"/proc/{entry}/ns/net").st_ino
        except OSError:
            continue
        started = start_time(int(entry))
        if inode in inodes and started is not None:
            found.append((int(entry), started))
    return found
