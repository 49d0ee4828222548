"""Where each rank was stuck: a trial's stacks/ (harness.trial.stacks) summarised.

Every dumped process is described by its main thread's innermost frames (py-spy lists
them innermost first) and its role (a torchrun agent, a worker it started, a rank); the
processes are grouped by role and where they wait (the collective, and the innermost frame
of the job's own code: not the standard library, not an installed package, so that ranks
caught at different lines of one wait are one group), and each group says its ranks and
which of them py-spy caught elsewhere inside that wait:

    15 ranks in _wait (group.py:262) <- all_reduce (group.py:236); own code: train_step (workload.py:57)
    7 torchrun agents in rendezvous for 8 nodes (--nnodes): _delay (utils.py:181) <- ... (ranks 0-5,7); rank 6 gone: SIGKILL (the kill fault at +0.0 s)

Ranks not there are named with what took them (their exit: the fault's signal, a policy's
exit); a process stopped when it was read (a pause fault) says so. A process that could not
be dumped is listed with the reason.
"""
from __future__ import annotations

import json
import math
import signal as signals
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from runfolder.events import AT_CAP
from runfolder.layout import FLIGHT_DIR, STACKS_INDEX, stacks_dir

INNERMOST = 2            # frames that say where a process waits
# not the job's own code: the standard library, installed packages, and the harness's edge to
# torch.distributed (its collectives' waits), so that the built-in workload's own frame is its step
LIBRARY_MARKS = ("site-packages", "dist-packages", "/lib/python3", "<frozen", "harness/job/group.py")
WAITS = (("rendezvous", "rendezvous"), ("all_reduce", "all_reduce"), ("allreduce", "all_reduce"),
         ("barrier", "barrier"), ("init_process_group", "init_process_group"), ("broadcast", "broadcast"))


@dataclass(frozen=True)
class Process:
    rank: int
    pid: int
    role: str                           # rank | torchrun agent | worker | process
    frames: tuple[dict[str, Any], ...]  # the main thread's, innermost first
    error: str | None = None
    stopped: bool = False               # stopped (SIGSTOP) when it was read


def _frame(frame: Mapping[str, Any]) -> str:
    return f"{frame.get('name')} ({frame.get('short_filename') or frame.get('filename')}:{frame.get('line')})"


def _own(frames: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The innermost frame of the job's own code: not the standard library, not a package."""
    for frame in frames:
        filename = str(frame.get("filename") or "")
        if filename and not any(mark in filename for mark in LIBRARY_MARKS) and "chaos_hook" not in filename:
            return frame
    return None


def _role(entry: Mapping[str, Any]) -> str:
    command = str(entry.get("command") or "")
    args = command.split()
    if any(a.endswith("torchrun") for a in args[:2]) or "torch.distributed.run" in args[:3]:
        return "torchrun agent"
    if entry.get("parent") is not None:
        return "worker" if any(k in command for k in ("python", ".py")) else "process"
    return "rank"


def _main_thread(threads: list[Mapping[str, Any]], pid: int) -> tuple[dict[str, Any], ...]:
    for thread in threads:
        if thread.get("thread_name") == "MainThread" or thread.get("os_thread_id") == pid:
            return tuple(thread.get("frames") or ())
    return tuple(threads[0].get("frames") or ()) if threads else ()


def read_stacks(trial_dir: Path, detect_of: int | None = None) -> list[Process] | None:
    """The trial's dumped processes at the hang cap, or at fault `detect_of`'s first
    detection; None when that capture was not taken."""
    index_file = stacks_dir(trial_dir, detect_of) / STACKS_INDEX
    if not index_file.is_file():
        return None
    found = []
    for entry in json.loads(index_file.read_text()):
        frames: tuple[dict[str, Any], ...] = ()
        if entry.get("file"):
            threads = json.loads((index_file.parent / entry["file"]).read_text())
            frames = _main_thread(threads, int(entry["pid"]))
        found.append(Process(int(entry["rank"]), int(entry["pid"]), _role(entry), frames, entry.get("error"),
                             bool(entry.get("stopped"))))
    return found


def where(process: Process, ranks: int) -> str:
    """Where one process waits, in words (a torchrun agent's rendezvous: for how many nodes)."""
    if process.stopped:
        return "stopped (SIGSTOP) " + _place(process, ranks)
    return _place(process, ranks)


def _wait_of(process: Process) -> str | None:
    """The collective (or rendezvous) any of the process's frames is in, by name; None: none known."""
    names = " ".join(str(f.get("name")) for f in process.frames).lower()
    return next((label for mark, label in WAITS if mark in names), None)


def _place(process: Process, ranks: int) -> str:
    if process.error:
        return f"not dumped: {process.error}"
    if not process.frames:
        return "no Python frames"
    inner = " <- ".join(_frame(f) for f in process.frames[:INNERMOST])
    wait = _wait_of(process)
    if process.role == "torchrun agent":  # its own code is torchrun's
        nodes = f" for {ranks} nodes (--nnodes)" if wait == "rendezvous" else ""
        return f"in {wait}{nodes}: {inner}" if wait else f"in {inner}"
    own = _own(process.frames)
    own_text = f"; own code: {_frame(own)}" if own is not None and own not in process.frames[:INNERMOST] else ""
    return (f"in {wait}: " if wait else "in ") + inner + own_text


def _ranks_text(ranks: list[int]) -> str:
    """'0-4,6,9-15'."""
    spans: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ",".join(str(a) if a == b else f"{a},{b}" if b == a + 1 else f"{a}-{b}" for a, b in spans)


def gone_text(events: Iterable[Mapping[str, Any]], t0: float) -> list[str]:
    """Ranks whose process ended before the capture, with what ended it (the newest fault on
    the rank before it ended, at its time after t0: the first fault's start), those ended
    alike in one clause."""
    events = list(events)
    captured = [float(e["t"]) for e in events if e.get("kind") == "stacks_captured" and e.get("reason") in AT_CAP]
    until = captured[0] if captured else math.inf
    faults = sorted((e for e in events if e.get("kind") == "fault_applied"), key=lambda e: float(e["t"]))
    alike: dict[str, list[int]] = {}
    for e in events:
        if e.get("kind") != "rank_exited" or float(e["t"]) > until or e.get("stopped") is True:
            continue
        rank, number, code = int(e["rank"]), e.get("signal"), e.get("exitcode")
        # the newest fault on the rank before its exit: an earlier one (a pause it survived)
        # did not end it
        fault = next((f for f in reversed(faults)
                      if rank in (f.get("targets") or []) and float(f["t"]) <= float(e["t"])), None)
        how = (signals.Signals(int(number)).name if number not in (None, "") and not _nan(number)
               else f"exit {int(code) if isinstance(code, (int, float)) and not _nan(code) else code}")
        cause = f" (the {fault['fault_kind']} fault at {float(fault['t']) - t0:+.1f} s)" if fault else ""
        alike.setdefault(how + cause, []).append(rank)
    return [f"rank{'s' if len(members) > 1 else ''} {_ranks_text(members)} gone: {how}"
            for how, members in alike.items()]


def read_flight(trial_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """Each rank's flight recorder entries (harness.job.flight), by rank; {} when none."""
    folder = Path(trial_dir) / FLIGHT_DIR
    found = {}
    for path in sorted(folder.glob("r*.json")) if folder.is_dir() else []:
        found[int(path.stem[1:])] = json.loads(path.read_text()).get("entries", [])
    return found


def flight_text(flight: Mapping[int, list[Mapping[str, Any]]], asked: Iterable[int] = ()) -> str:
    """Which rank did not enter the newest collective, from the ranks' flight recorders:
    per rank its newest group and the last collective it entered there; the ranks of the
    most common newest group compared. "" when no rank dumped one."""
    last: dict[int, tuple[int, int, str]] = {}  # rank -> (group, sequence, op)
    for rank, entries in flight.items():
        if entries:
            newest = max(int(e["pg_id"]) for e in entries)
            entry = max((e for e in entries if int(e["pg_id"]) == newest), key=lambda e: int(e["collective_seq_id"]))
            last[rank] = (newest, int(entry["collective_seq_id"]), str(entry.get("profiling_name")))
    silent = sorted(set(asked) - set(flight))
    tail = f"; rank{'s' if len(silent) > 1 else ''} {_ranks_text(silent)} did not answer" if silent else ""
    if not last:
        return f"flight recorder: no entries{tail}" if silent else ""
    groups: dict[int, list[int]] = {}
    for rank, (group, _, _) in last.items():
        groups.setdefault(group, []).append(rank)
    group, members = max(groups.items(), key=lambda kv: len(kv[1]))
    top = max(last[r][1] for r in members)
    op = next(last[r][2] for r in members if last[r][1] == top)
    entered = [r for r in members if last[r][1] == top]
    behind = sorted((r for r in members if last[r][1] < top), key=lambda r: last[r][1])
    text = f"flight recorder: collective {top} ({op}) of group {group} entered by ranks {_ranks_text(entered)}"
    for rank in behind:
        text += f"; rank {rank} did not enter it (its last: {last[rank][1]})"
    others = sorted(r for g, rs in groups.items() if g != group for r in rs)
    if others:
        text += f"; ranks {_ranks_text(others)} in another group"
    return text + tail


def _nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def stuck_summary(processes: list[Process] | None, events: Iterable[Mapping[str, Any]], ranks: int,
                  t0: float = 0.0, flight: Mapping[int, list[Mapping[str, Any]]] | None = None) -> str:
    """One line: processes grouped by role and where they wait, largest group first, the
    ranks that were gone, and what the flight recorders say. "" when nothing was captured."""
    if processes is None:
        return ""
    events = list(events)
    captured = next((e for e in events if e.get("kind") == "stacks_captured" and e.get("reason") in AT_CAP), {})
    asked = [int(r) for r in captured.get("flight") or ()] if isinstance(captured.get("flight"), list) else []
    flight = dict(flight or {})
    if isinstance(captured.get("flight_answered"), list):  # a dump that came after the deadline is not the cap's
        flight = {rank: entries for rank, entries in flight.items() if rank in captured["flight_answered"]}
    recorded = flight_text(flight, asked)
    return "; ".join(_groups_text(processes, ranks) + gone_text(events, t0) + ([recorded] if recorded else []))


def detect_summary(trial_dir: Path, events: Iterable[Mapping[str, Any]], ranks: int, t0: float = 0.0) -> str:
    """Where the processes were at each fault's first detection (stacks/detect-<i>/), one
    clause per fault: "at fault 0's first detection (+5.2 s): 15 ranks in ...". "" when
    none was taken."""
    parts = []
    for e in sorted((e for e in events if e.get("kind") == "stacks_captured" and e.get("reason") == "detect"
                     and e.get("fault") is not None and not _nan(e.get("fault"))), key=lambda e: int(e["fault"])):
        processes = read_stacks(trial_dir, int(e["fault"]))
        if processes:
            read_at = float(e["t"]) - float(e.get("secs") or 0.0) - t0
            parts.append(f"at fault {int(e['fault'])}'s first detection ({read_at:+.1f} s): "
                         + "; ".join(_groups_text(processes, ranks)))
    return " | ".join(parts)


def _group_key(process: Process, ranks: int) -> tuple[Any, ...]:
    """Processes that wait in the same collective from the same frame of their own code are
    one group, wherever inside the library py-spy caught each (the wait's loop or its callee:
    one wait); a process in no known wait is grouped by its innermost frames."""
    wait = _wait_of(process)
    if process.error or not process.frames or wait is None:
        return (process.role, where(process, ranks))
    own = _own(process.frames) if process.role != "torchrun agent" else None
    return (process.role, process.stopped, wait, _frame(own) if own is not None else None)


def _groups_text(processes: list[Process], ranks: int) -> list[str]:
    groups: dict[tuple[Any, ...], list[Process]] = {}
    for process in processes:
        groups.setdefault(_group_key(process, ranks), []).append(process)
    parts = []
    for members in sorted(groups.values(), key=lambda ps: (-len(ps), ps[0].role, where(ps[0], ranks))):
        places: dict[str, list[Process]] = {}
        for process in members:
            places.setdefault(where(process, ranks), []).append(process)
        ordered = sorted(places.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        role, count = members[0].role, len(members)
        noun = {"rank": "rank", "torchrun agent": "torchrun agent", "worker": "worker",
                "process": "process"}[role] + ("" if count == 1 else ("es" if role == "process" else "s"))
        caught = "".join(f"; {_ranks_text([p.rank for p in ps])} caught at "
                         + " <- ".join(_frame(f) for f in ps[0].frames[:INNERMOST]) for _, ps in ordered[1:])
        parts.append(f"{count} {noun} {ordered[0][0]} (ranks {_ranks_text([p.rank for p in members])}{caught})")
    return parts
