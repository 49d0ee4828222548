"""The rank launcher process: imports torch once, then forks one child per rank.

Started by a cluster backend as ``python -m harness.cluster.zygote`` in a session of its own (so
a Ctrl-C at the terminal reaches only the harness). It reads commands as JSON lines on
stdin and answers on stdout:

    {"op": "spawn", "name": "r005", "entry": "rank"|"control"|"exec"|"reference", "ns_path": ..., "log": ...,
     "config": {...}}            -> {"ev": "spawned", "name", "pid", "t"}
    (a child ends)               -> {"ev": "exited", "name", "pid", "exitcode", "signal", "t"}
    {"op": "release"}            -> {"ev": "released", "t"}: every child SIGKILLed and reaped
    {"op": "preload", "modules"} -> {"ev": "preloaded", "problem", "secs"}: imported here for the
                                    user jobs it will fork (harness.cluster.preload)

A released launcher forks the next trial's ranks from the same warm interpreter
(`harness.cluster.launcher.LauncherPool`); its own state never changes between trials, so
every trial's children start alike.

"reference" computes a run's fault-free trajectory (harness.job.reference) after its trials.
"exec" runs a user's job (harness.cluster.jobstart; config: its launch, with "rank"): the
child becomes the command (preloaded or exec'd), its output goes through a pipe to a second child, the tap
("tap-r005"), which writes the log and the job's output events.

A child joins its network namespace with setns(2) before any socket exists (where it has
one: `ns_path` null keeps the launcher's), then runs the entry. The launcher and its children die with their parent (PR_SET_PDEATHSIG), and when
stdin closes the launcher kills its children and exits: nothing outlives the harness.
Forking from this one-threaded process costs ~0.3 s and ~19 MB PSS per rank, against
~13 s and ~150 MB for one interpreter per rank.
"""
from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from typing import Any

from chaos import proc
from chaos.proc import die_with_parent


def _run_child(cmd: dict[str, Any], launcher_pid: int) -> None:
    """In the forked child: never returns."""
    code = 70
    try:
        die_with_parent()
        if os.getppid() != launcher_pid:
            os._exit(1)
        # a user's job writes into its tap's pipe, everything else into its log
        log = cmd["out_fd"] if "out_fd" in cmd else os.open(cmd["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a node agent's handler is the agent's alone
        if cmd["ns_path"] is not None:  # None: the launcher's own (the local backend)
            proc.enter_netns(cmd["ns_path"])
        if cmd["entry"] == "exec":
            from harness.cluster.jobstart import start_job
            code = start_job(cmd["config"])
            return
        from harness import signals
        signals.install()
        if cmd["entry"] == "rank":
            from harness.job.rank import main as entry
        elif cmd["entry"] == "reference":
            from harness.job.reference import main as entry
        else:
            from harness.job.control import main as entry
        code = entry(cmd["config"])
    except BaseException:  # the child must never fall back into the launcher's loop
        import traceback
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _run_tap(cmd: dict[str, Any], fd: int, launcher_pid: int) -> None:
    """In the forked tap of a user's job (harness.cluster.jobstart.run_tap): never returns."""
    code = 70
    try:
        die_with_parent()
        os.close(cmd["out_fd"])  # only the job writes: the pipe ends when the job's processes do
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)  # the launcher's command and answer pipes are not the tap's
        os.dup2(devnull, 1)
        os.close(devnull)
        if os.getppid() == launcher_pid:
            from harness.cluster.jobstart import run_tap
            code = run_tap(fd, cmd["log"], cmd["config"])
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        os._exit(code)


TAP_DRAIN_S = 2.0  # a tap still writing what its job printed (it imports the classifier first)


def _kill_all(names: dict[int, str]) -> None:
    """SIGKILL every child and reap it; their exits are not reported (the trial is over).
    A user job's tap goes last: it ends by itself once its job's output is in the log (a
    job that failed at once may have printed before the tap began reading), or is killed
    at TAP_DRAIN_S."""
    taps = [pid for pid, name in names.items() if name.startswith("tap-")]
    for pid in names:
        if pid not in taps:
            os.kill(pid, signal.SIGKILL)  # a child is only reaped here, so its pid is still ours
    for pid in [pid for pid in names if pid not in taps]:
        os.waitpid(pid, 0)  # SIGKILL ends even a stopped process at once
        del names[pid]
    deadline = time.monotonic() + TAP_DRAIN_S
    while taps and time.monotonic() < deadline:
        taps = [pid for pid in taps if os.waitpid(pid, os.WNOHANG)[0] == 0]
        time.sleep(0.01)
    for pid in taps:
        os.kill(pid, signal.SIGKILL)  # a job's descendant still holds the pipe: the log has what came
        os.waitpid(pid, 0)
    for pid in [pid for pid in names if names[pid].startswith("tap-")]:
        del names[pid]


def _reply(out: Any, **msg: Any) -> None:
    out.write(json.dumps(msg) + "\n")
    out.flush()


class NodeOps:
    """Ops a launcher answers beyond its own: a Slurm node's agent (harness.cluster.slurm.agent)
    signals and faults its children. `answer` returns the fields of one command's answer
    (sent as {"ev": "answer", "name": the command's, ...}, with "problem" where it raised);
    `close` takes back what they did, when the harness is gone."""

    def answer(self, cmd: dict[str, Any], names: dict[int, str]) -> dict[str, Any]:
        raise ValueError(f"unknown op {cmd['op']!r}")

    def spawning(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """A spawn command as the launcher is to run it (the node's own additions)."""
        return cmd

    def tick(self) -> None:
        """Called every turn of the loop (at least every 20 ms): what is due now."""

    def close(self) -> None:
        """Nothing to take back."""


def main(node: NodeOps | None = None, ready: dict[str, Any] | None = None) -> None:
    """The launcher's loop; `node`'s ops answered beside its own, `ready`'s fields added to
    its first answer."""
    node = node or NodeOps()
    die_with_parent()
    from harness.cluster import preload
    preload.remember_launcher()
    # Import once here so that every fork shares the pages; nothing may start a thread.
    import torch
    import torch.distributed  # noqa: F401
    import harness.job.rank  # noqa: F401
    import harness.job.control  # noqa: F401
    import harness.job.reference  # noqa: F401
    import harness.cluster.jobstart  # noqa: F401 - a user job's child and tap: ~0.1 s each otherwise
    from harness.job.workload import Workload, WorkloadSpec
    preload.remember_default_threads(torch.get_num_threads())
    torch.set_num_threads(1)
    Workload(WorkloadSpec(), seed=0, rank=0)  # first use of nn and autograd, once for all forks
    import threading
    if threading.active_count() != 1:
        raise RuntimeError("the rank launcher must fork from one Python thread")

    out = sys.stdout
    names: dict[int, str] = {}
    me = os.getpid()
    buf = b""
    stdin_fd = sys.stdin.fileno()
    _reply(out, ev="ready", pid=me, t=time.monotonic(), **(ready or {}))
    open_input = True
    while open_input or names:
        ready, _, _ = select.select([stdin_fd] if open_input else [], [], [], 0.02)
        node.tick()
        if ready:
            chunk = os.read(stdin_fd, 65536)
            if not chunk:
                open_input = False
                for pid in names:
                    os.kill(pid, signal.SIGKILL)
                node.close()
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                cmd = json.loads(line)
                if cmd["op"] == "release":
                    _kill_all(names)
                    _reply(out, ev="released", t=time.monotonic())
                    continue
                if cmd["op"] not in ("spawn", "preload"):
                    try:
                        _reply(out, ev="answer", name=cmd["name"], **node.answer(cmd, names))
                    except Exception as exc:  # the harness hears of it; the launcher goes on
                        _reply(out, ev="answer", name=cmd["name"], problem=f"{type(exc).__name__}: {exc}")
                    continue
                if cmd["op"] == "preload":
                    began = time.monotonic()
                    problem = preload.import_all(cmd["modules"])
                    _reply(out, ev="preloaded", problem=problem, secs=round(time.monotonic() - began, 3))
                    continue
                cmd = node.spawning(cmd)
                if cmd["entry"] == "exec":  # a user's job: its output goes through a tap
                    tap_fd, cmd["out_fd"] = os.pipe()
                    tap = os.fork()
                    if tap == 0:
                        _run_tap(cmd, tap_fd, me)
                    names[tap] = f"tap-{cmd['name']}"
                pid = os.fork()
                if pid == 0:
                    _run_child(cmd, me)
                if cmd["entry"] == "exec":
                    os.close(tap_fd)
                    os.close(cmd["out_fd"])
                names[pid] = cmd["name"]
                _reply(out, ev="spawned", name=cmd["name"], pid=pid, t=time.monotonic())
        elif not open_input:
            time.sleep(0.02)
        while names:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            name = names.pop(pid, None)
            if name is None or not open_input:
                continue
            _reply(out, ev="exited", name=name, pid=pid, t=time.monotonic(),
                   exitcode=os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None,
                   signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skip the interpreter's teardown of torch (about a second)
