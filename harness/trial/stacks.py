"""Where each rank was: every live process's Python stacks, read from outside with py-spy.

At a trial's hang cap (after `hang_detected` is written: no time the reports measure is
still to come) the harness dumps every process of every live rank host: the rank's own
process and all it started (a torchrun agent and its workers, each in a session of its
own). py-spy reads a process's memory through ptrace from outside its namespaces and
containers, pausing it for the read (a process that is stopped already, a pause fault's
target, cannot be paused again: it is read without, `--nonblocking`); each dump has its own
deadline, and all of them run side by side. What they wrote is the trial's ``stacks/`` (runfolder.layout): one JSON file
per process (py-spy's `dump --json`: threads, innermost frame first) and ``index.json``,
what was dumped and what could not be (the reason); reports.stuck reads them. Nothing is
left running: a dump past its deadline is killed.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from chaos import proc
from harness.cluster.workers import SERVER_TITLE
from harness.signals import DUMP_FLIGHT_RECORDER
from runfolder.layout import STACKS_INDEX, flight_file, stacks_dir

DUMP_DEADLINE_S = 10.0   # per process
PARALLEL = 4              # dumps at once: each pauses its process for the read
FLIGHT_DEADLINE_S = 2.0   # for every asked rank to write its flight recorder
GONE = "exited before it could be read"


@dataclass(frozen=True)
class LiveRanks:
    """The live ranks' processes: `here` (rank -> pid) this machine reads and signals;
    `elsewhere` (rank -> (pid there, why not)) on another machine."""

    here: dict[int, int]
    elsewhere: dict[int, tuple[int, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Dumped:
    """One process's entry in index.json."""

    rank: int
    pid: int
    parent: int | None        # the rank's own process has none
    command: str              # its command line, shortened
    file: str | None          # its py-spy JSON, relative to stacks/; None when not dumped
    error: str | None = None  # why not
    stopped: bool = False     # stopped (SIGSTOP) when it was read


def py_spy() -> str | None:
    """The py-spy beside this interpreter (installed with the package), or on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def _command(pid: int) -> str:
    return proc.command_line(pid)[:300]


def _dump(tool: str, pid: int, deadline_s: float, nonblocking: bool, yielding: bool = False
          ) -> tuple[list | None, str | None]:
    """py-spy's dump of `pid` (`nonblocking`: without pausing it; `yielding`: at the lowest
    CPU priority, so that ranks at work come first)."""
    nice = shutil.which("nice") if yielding else None
    argv = [*([nice, "-n", "19"] if nice else []), tool, "dump", "--pid", str(pid), "--json",
            *(["--nonblocking"] if nonblocking else [])]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=deadline_s)
    except subprocess.TimeoutExpired:
        return None, f"py-spy did not finish within {deadline_s:g} s"
    if done.returncode != 0:
        return None, (done.stderr.strip().splitlines() or [f"py-spy exit {done.returncode}"])[0][:300]
    try:
        return json.loads(done.stdout), None
    except json.JSONDecodeError as exc:
        return None, f"py-spy wrote no JSON: {exc}"


def processes(ranks: dict[int, int]) -> list[tuple[int, int, int | None]]:
    """(rank, pid, parent) of every process of the ranks' hosts: rank -> its own pid."""
    found = []
    for rank, pid in sorted(ranks.items()):
        found.append((rank, pid, None))
        found += [(rank, child, pid) for child, _ in proc.descendants(pid)
                  if not _command(child).startswith(SERVER_TITLE)]  # the harness's, not the job's
    return found


def recording_ranks(events: list[dict], ranks: dict[int, int]) -> dict[int, int]:
    """Of `ranks` (rank -> its live pid), the process of each that said it dumps its flight
    recorder on SIGUSR2 (rank_start flight: true, or a user job's flight_ready): the rank's
    own process, or one it started that still lives (a torchrun worker, a process a
    wrapper started); the newest to say so, since a restarted worker is a new process. No
    other process is sent it."""
    found: dict[int, int] = {}
    for e in events:
        if not ((e.get("kind") == "rank_start" and e.get("flight") is True) or e.get("kind") == "flight_ready"):
            continue
        rank, pid = e.get("rank"), e.get("pid")
        if rank in ranks and (pid == ranks[rank] or pid in {child for child, _ in proc.descendants(ranks[rank])}):
            found[rank] = pid
    return found


def ask_flight_recorders(ranks: dict[int, int], trial_dir: Path, deadline_s: float = FLIGHT_DEADLINE_S,
                         clock: Callable[[], float] = time.monotonic,
                         sleep: Callable[[float], None] = time.sleep) -> list[int]:
    """SIGUSR2 to each rank (rank -> pid) that records one; returns the ranks whose dump
    arrived by the deadline (a rank blocked in a C++ call answers only when it returns)."""
    for rank, pid in ranks.items():
        flight_file(trial_dir, rank).unlink(missing_ok=True)
        proc.send_signal(pid, DUMP_FLIGHT_RECORDER, None, gone_ok=True)
    deadline = clock() + deadline_s
    while True:
        arrived = [rank for rank in ranks if flight_file(trial_dir, rank).is_file()]
        if len(arrived) == len(ranks) or clock() >= deadline:
            return sorted(arrived)
        sleep(0.02)


def capture(ranks: dict[int, int], trial_dir: Path, deadline_s: float = DUMP_DEADLINE_S,
            clock: Callable[[], float] = time.monotonic, detect_of: int | None = None,
            elsewhere: Mapping[int, tuple[int, str]] | None = None) -> tuple[list[Dumped], float]:
    """Dump every process of `ranks` (rank -> its live pid) into the trial's stacks folder
    (runfolder.layout.stacks_dir: at the cap, or at fault `detect_of`'s first detection,
    where no process is paused); returns the index and the seconds it took. Without py-spy
    every entry says so. `elsewhere`: ranks on another machine (rank -> (pid there, why)),
    indexed as not read: a pid of another kernel names another process here."""
    folder = stacks_dir(trial_dir, detect_of)
    folder.mkdir(parents=True, exist_ok=True)
    started = clock()
    tool = py_spy()
    targets = processes(ranks)

    def one(target: tuple[int, int, int | None]) -> Dumped:
        rank, pid, parent = target
        command = _command(pid)
        if tool is None:
            return Dumped(rank, pid, parent, command, None, "py-spy is not installed (pip install py-spy)")
        stopped = proc.state(pid) == "T"
        # at a detection the ranks are recovering, and timed: neither pause them nor take their CPU
        threads, error = _dump(tool, pid, deadline_s, nonblocking=stopped or detect_of is not None,
                               yielding=detect_of is not None)
        if threads is None and proc.state(pid) in (None, "Z"):
            error = GONE  # it ended while being read (a policy's exit right after it detected)
        if threads is None:
            return Dumped(rank, pid, parent, command, None, error, stopped)
        name = f"r{rank:03d}-{pid}.json"
        (folder / name).write_text(json.dumps(threads))
        return Dumped(rank, pid, parent, command, name, None, stopped)

    with ThreadPoolExecutor(PARALLEL) as pool:
        index = list(pool.map(one, targets))
    index += [Dumped(rank, pid, None, "", None, why) for rank, (pid, why) in sorted((elsewhere or {}).items())]
    (folder / STACKS_INDEX).write_text(json.dumps([asdict(d) for d in index], indent=1))
    return index, clock() - started


class AtDetection:
    """Stacks at each fault's first detection, read in the background while the trial goes
    on: `armed(index, t)` when fault `index` is applied at t; `poll(detections, ranks)`
    with the detections' times seen so far starts, for each armed fault that one follows,
    a capture of the ranks (rank -> live pid) then (`--nonblocking`: no process is paused,
    so what the ranks do next, and the times measured from it, does not wait for the read;
    at the lowest CPU priority, so the ranks come first for the CPU);
    `captured(index, entries, secs)` is called from that thread. `join` waits for them all
    within a deadline (each dump has its own)."""

    def __init__(self, trial_dir: Path, captured: Callable[[int, list[Dumped], float], None]) -> None:
        self.trial_dir = trial_dir
        self.captured = captured
        self._armed: dict[int, float] = {}
        self._done: set[int] = set()  # once per fault, a pulsed one too
        self._threads: list[threading.Thread] = []

    def armed(self, index: int, t_applied: float) -> None:
        if index not in self._done:
            self._armed.setdefault(index, t_applied)

    def poll(self, detections: list[float], ranks: Callable[[], LiveRanks]) -> None:
        for index, t_applied in list(self._armed.items()):
            if any(t >= t_applied for t in detections):
                del self._armed[index]
                self._done.add(index)
                live = ranks()
                thread = threading.Thread(target=self._capture, args=(index, live), daemon=True,
                                          name=f"chaos-stacks-at-detect-{index}")
                thread.start()
                self._threads.append(thread)

    def _capture(self, index: int, live: LiveRanks) -> None:
        entries, secs = capture(live.here, self.trial_dir, detect_of=index, elsewhere=live.elsewhere)
        self.captured(index, entries, secs)

    def join(self, deadline_s: float) -> None:
        until = time.monotonic() + deadline_s
        for thread in self._threads:
            thread.join(max(0.0, until - time.monotonic()))
