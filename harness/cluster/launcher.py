"""The harness's side of the rank launcher (`harness.cluster.zygote`): spawn, reap, stop, and
the pool that keeps one launcher warm between the trials of a run."""
from __future__ import annotations

import json
import os
import secrets
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from chaos import proc
from chaos.errors import DeadlineExceeded, HarnessError
from chaos.mechanism import record_process
from chaos.undo import UNDOS, record_owner, undo_outstanding
from chaos.ledger import Ledger
from harness.cluster.spec import RankExit

LAUNCHER_READY_TIMEOUT_S = 60.0
RELEASE_TIMEOUT_S = 5.0
# A preloaded job's command line is written over the launcher's own (harness.cluster.preload
# .set_title), as much of it as fits: blanks the launcher ignores leave the room.
TITLE_ROOM = " " * 1024
PRELOAD_TIMEOUT_S = 300.0  # torch's DDP and what a job's preload adds, on a busy host


class Launcher:
    """A running `harness.cluster.zygote` and the processes it forked, by name. The launcher
    process is recorded in `ledger` (its owner's); each fork in the ledger `spawn` is given
    (the trial's). `argv` starts it some other way: a Slurm node's agent, through srun,
    whose forks live on another machine (`remote`: their pids are the node's, recorded by
    the agent, not here)."""

    def __init__(self, ledger: Ledger, argv: list[str] | None = None, remote: bool = False,
                 log: Path | None = None) -> None:
        with open(log or os.devnull, "ab") as err:
            self._proc = subprocess.Popen(
                argv or proc.python_module("harness.cluster.zygote", TITLE_ROOM), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err if log else None, start_new_session=True, bufsize=0)
        self.remote = remote
        record_process(ledger, self._proc.pid)
        self._buf = b""
        self._exits: list[dict[str, Any]] = []
        self._answers: list[dict[str, Any]] = []  # read, not yet expected
        self.pids: dict[str, int] = {}
        self._ready = False
        self.hello: dict[str, Any] = {}  # the launcher's first answer (pid, clock, a node agent's own facts)
        self._requests = 0
        self._preloads: dict[frozenset[str], str | None] = {}  # asked for: None until answered, then its problem

    def wait_ready(self, timeout: float = LAUNCHER_READY_TIMEOUT_S) -> None:
        """Wait until the launcher has imported torch (about a second; overlap other work)."""
        if not self._ready:
            self.hello = self._expect("ready", None, timeout)
            self._ready = True

    def _read(self, timeout: float) -> list[dict[str, Any]]:
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return []
        chunk = os.read(fd, 65536)
        if not chunk:
            raise HarnessError(f"rank launcher exited (code {self._proc.poll()})")
        self._buf += chunk
        lines, _, self._buf = self._buf.rpartition(b"\n")
        return [json.loads(line) for line in lines.split(b"\n") if line]

    def _expect(self, ev: str, name: str | None, timeout: float) -> dict[str, Any]:
        """The launcher's answer `ev` (for `name`); what came with it in the same read is kept
        for the next caller (an answer to a command sent ahead, a child's exit)."""
        deadline = time.monotonic() + timeout
        while True:
            for i, msg in enumerate(self._answers):
                if msg["ev"] == ev and msg.get("name") == name:
                    return self._answers.pop(i)
            if (left := deadline - time.monotonic()) <= 0:
                break
            for msg in self._read(left):
                (self._exits if msg["ev"] == "exited" else self._answers).append(msg)
        raise DeadlineExceeded(f"rank launcher did not answer {ev} {name or ''} within {timeout:.0f}s")

    def _send(self, cmd: dict[str, Any]) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write((json.dumps(cmd) + "\n").encode())

    def spawn(self, ledger: Ledger, name: str, entry: str, ns_path: str | None, log: str,
              config: dict[str, Any]) -> int:
        """Fork `name` into the namespace at `ns_path` (None: the launcher's own); its pid is
        recorded in `ledger`."""
        self.wait_ready()
        self._send({"op": "spawn", "name": name, "entry": entry, "ns_path": ns_path, "log": log,
                    "config": config})
        pid = self._expect("spawned", name, 10.0)["pid"]
        if not self.remote:
            record_process(ledger, pid)
        self.pids[name] = pid
        return pid

    def request(self, cmd: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send `cmd` (a node agent's op: harness.cluster.zygote.NodeOps) and wait for its
        answer; a problem the agent met raises."""
        self.wait_ready()
        self._requests += 1
        name = f"q{self._requests}"
        self._send({**cmd, "name": name})
        answer = self._expect("answer", name, timeout)
        if answer.get("problem"):
            raise HarnessError(answer["problem"])
        return answer

    def request_preload(self, modules: list[str]) -> None:
        """Ask the launcher to import what user jobs import (harness.cluster.preload) and go
        on: it does so while the caller builds the hosts. Once per set of modules."""
        wanted = frozenset(modules)
        if wanted not in self._preloads:
            self._send({"op": "preload", "modules": sorted(wanted)})
            self._preloads[wanted] = None

    def preload(self, modules: list[str], timeout: float) -> None:
        """`request_preload`, and wait until the launcher has those modules."""
        self.wait_ready()
        self.request_preload(modules)
        wanted = frozenset(modules)
        if self._preloads[wanted] is None:
            answer = self._expect("preloaded", None, timeout)
            self._preloads[wanted] = answer["problem"] or ""
        if self._preloads[wanted]:
            raise HarnessError(self._preloads[wanted])

    def exits(self, timeout: float = 0.0) -> list[dict[str, Any]]:
        """Children that ended since the last call."""
        for msg in self._read(timeout):
            (self._exits if msg["ev"] == "exited" else self._answers).append(msg)
        done, self._exits = self._exits, []
        for msg in done:
            if self.pids.get(msg["name"]) == msg["pid"]:
                del self.pids[msg["name"]]
        return done

    def stop(self, names: list[str], deadline_s: float) -> list[dict[str, Any]]:
        """SIGTERM the named children, SIGKILL those left at one deadline; returns their exits."""
        targets = {n: self.pids[n] for n in names if n in self.pids}
        for pid in targets.values():
            proc.send_signal(pid, signal.SIGTERM, None, gone_ok=True)
        deadline = time.monotonic() + deadline_s
        exits: list[dict[str, Any]] = []
        killed = False
        while any(n in self.pids for n in targets):
            left = deadline - time.monotonic()
            if left <= 0 and not killed:
                for n, pid in targets.items():
                    if n in self.pids:
                        proc.send_signal(pid, signal.SIGCONT, None, gone_ok=True)
                        # and what it started: a torchrun agent's workers, in sessions of their own
                        proc.signal_tree(pid, signal.SIGKILL, None, gone_ok=True)
                killed = True
            exits += self.exits(max(0.0, min(0.05, left)) if left > 0 else 0.05)
        return exits

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """Its exit status once it ended (negative: the signal that ended it); None while it runs."""
        return self._proc.poll()

    def release(self) -> bool:
        """SIGKILL every process this launcher forked and forget them, so that the next trial
        can fork from it; False (the launcher is of no further use) when it was never ready,
        has exited, or did not answer within RELEASE_TIMEOUT_S."""
        if not self._ready or not self.running:
            return False
        try:
            self._send({"op": "release"})
            self._expect("released", None, RELEASE_TIMEOUT_S)
        except (HarnessError, OSError):
            return False
        self._exits.clear()  # of the trial that just ended
        self.pids.clear()
        return True

    def close_input(self) -> None:
        """Close the launcher's stdin: it SIGKILLs what is left and exits (not waited for)."""
        assert self._proc.stdin is not None
        if not self._proc.stdin.closed:
            try:
                self._proc.stdin.close()
            except BrokenPipeError:
                pass

    def close(self, timeout: float = 5.0) -> None:
        """Close the launcher's stdin: it SIGKILLs what is left and exits; SIGKILLed if it
        has not within `timeout`."""
        if self._proc.poll() is None:
            try:
                self.close_input()
                self._proc.wait(timeout=timeout)
            except (subprocess.TimeoutExpired, BrokenPipeError):
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


class LauncherPool:
    """One rank launcher kept between the trials of a run, so that only the first trial
    waits while it imports torch (1.1-1.3 s of a 16-rank bring-up's 1.5-1.9 s on 2 cores,
    bench/bringup.py).

    `take` gives the kept launcher, or starts one (recorded, with this process as owner, in
    the pool's own ledger under `state_dir`: a heal ends it after a SIGKILL); `give_back`
    keeps it when it released the trial's processes, and closes it otherwise. `start_ahead`
    starts the first one before it is needed, so that its import overlaps the caller's own
    work. `close` ends the kept one and removes the pool's ledger."""

    def __init__(self, state_dir: Path | None = None) -> None:
        self._state_dir = state_dir
        self._ledger: Ledger | None = None
        self._kept: Launcher | None = None
        self._ahead = False  # the kept launcher was started ahead and never used

    @property
    def next_launcher(self) -> str:
        """What `take` will give: `kept` (one an earlier trial gave back), `ahead` (started
        by start_ahead) or `new` (one it starts)."""
        if self._kept is None:
            return "new"
        return "ahead" if self._ahead else "kept"

    def start_ahead(self) -> None:
        """Start a launcher for the first `take` now: `chaos run` spends ~1.3 s on its own
        imports, the scenario and the run folder before its first bring-up, as long as the
        launcher's import of torch."""
        if self._kept is None:
            self._kept, self._ahead = self._start(), True

    def take(self) -> Launcher:
        if self._kept is not None:
            launcher, self._kept, self._ahead = self._kept, None, False
            if launcher.running:
                return launcher
            launcher.close()  # ended since (a heal with --all, an OOM kill): start another
        return self._start()

    def _start(self) -> Launcher:
        if self._ledger is None:
            self._ledger = Ledger(secrets.token_hex(3), self._state_dir)
            record_owner(self._ledger)
        return Launcher(self._ledger)

    def give_back(self, launcher: Launcher) -> None:
        if self._kept is None and launcher.release():
            self._kept = launcher
        else:
            launcher.close()

    def close(self) -> None:
        try:
            if self._kept is not None:
                self._kept.close()
                self._kept = None
        finally:
            if self._ledger is not None:
                undo_outstanding(self._ledger, UNDOS)
                self._ledger.close_if_clean()
                self._ledger = None

    def __enter__(self) -> LauncherPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_for_text(path: Path, text: str, timeout: float) -> None:
    """Wait until `text` appears in the file at `path` (a child's log announcing readiness)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if text in path.read_text(errors="replace"):
                return
        except FileNotFoundError:
            pass
        time.sleep(0.005)
    raise DeadlineExceeded(f"{path.name} did not report {text!r} within {timeout:.0f}s")


def exit_of(rank: int, msg: dict[str, Any]) -> RankExit:
    return RankExit(rank, msg["pid"], msg["exitcode"], msg["signal"], msg["t"])
