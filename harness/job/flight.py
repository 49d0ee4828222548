"""The rank's flight recorder, dumped when the harness asks: which collectives it entered.

torch records every collective a process group issues (its flight recorder: group, sequence
number, op, sizes), for gloo too (measured with torch 2.13: the harness's own
ProcessGroupGloo objects included). For gloo an entry's state stays "scheduled" and the
group's "last completed" counts an op that never completed, so only what a rank *entered*
is read from it. A rank whose recorder is there installs a SIGUSR2 handler and says so in
its rank_start (`flight: true`); the harness sends SIGUSR2 only to such ranks (at the hang
cap, after stacks: harness.trial.orchestrator), and the handler writes the entries to
``flight/rNNN.json`` in the trial (atomically). Python runs the handler in the main thread
between bytecodes: a rank waiting in the harness's collective wait (slices of sleep)
answers within milliseconds; one blocked inside a C++ call answers when it returns, or
not before the harness stops waiting. A user's job (the startup hook) is asked the same
way once it says `flight_ready`, and answers from a thread of its own (`serve`), also while
its main thread waits inside DDP's collective. reports.stuck reads the files.
"""
from __future__ import annotations

import json
import os
import pickle
import signal
import threading
from pathlib import Path
from typing import Any, Callable

import torch

from harness.signals import DUMP_FLIGHT_RECORDER
from runfolder.layout import flight_file

FIELDS = ("pg_id", "collective_seq_id", "profiling_name", "input_sizes", "time_created_ns")


def _dump_traces() -> list[Callable[..., bytes]]:
    """The dumps of this process's recorders: the CPU one (gloo) and, in a CUDA build,
    NCCL's, which is a recorder of its own: on the first GPU run (torch 2.11.0+cu130) a
    NCCL group's collectives were in NCCL's alone and the CPU one had none of them."""
    c10d = torch._C._distributed_c10d
    return [dump for dump in (getattr(c10d, name, None) for name in ("_dump_fr_trace", "_dump_nccl_trace"))
            if dump is not None]


def available() -> bool:
    return bool(_dump_traces())


def entries() -> dict[str, Any]:
    """This process's flight recorders: their entries (the fields above) and each group's
    status (group ids are the process's own, whichever recorder holds the group)."""
    found: list[dict[str, Any]] = []
    status: dict[str, Any] = {}
    for dump_trace in _dump_traces():
        # without stack traces: symbolising them took ~1 s a dump (20 entries, torch 2.13)
        trace = pickle.loads(dump_trace(includeCollectives=True, includeStackTraces=False))
        found += [{k: e.get(k) for k in FIELDS} for e in trace.get("entries", [])]
        status.update(trace.get("pg_status", {}))
    return {"entries": found, "pg_status": status}


def dump(trial_dir: Path, rank: int) -> None:
    """Write the recorder to the trial's flight/rNNN.json (atomically: a reader sees all or nothing)."""
    path = flight_file(trial_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(entries()))
    os.replace(partial, path)


def install(trial_dir: Path, rank: int) -> bool:
    """Dump the recorder into the trial on SIGUSR2, in the main thread (the harness's own
    rank waits in Python); False (nothing installed) without one."""
    if not available():
        return False
    signal.signal(DUMP_FLIGHT_RECORDER, lambda signum, frame: dump(trial_dir, rank))
    return True


def serve(trial_dir: Path, rank: int) -> bool:
    """Dump the recorder on SIGUSR2 from a thread of its own, for a user's job whose main
    thread waits inside a C++ collective (DDP's backward) and would run a Python handler
    only once it returns: the signal's C handler writes its number to a wakeup pipe that
    the thread reads. Call it from the main thread. False without a recorder, or where the
    job already has a wakeup fd of its own (an asyncio loop): nothing is taken from it."""
    if not available():
        return False
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    theirs = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    if theirs != -1:
        signal.set_wakeup_fd(theirs)  # put back
        os.close(read_end)
        os.close(write_end)
        return False
    signal.signal(DUMP_FLIGHT_RECORDER, lambda signum, frame: None)  # the thread dumps

    def answer() -> None:
        while chunk := os.read(read_end, 64):
            if DUMP_FLIGHT_RECORDER in chunk:
                dump(trial_dir, rank)

    threading.Thread(target=answer, name="chaos-flight-recorder", daemon=True).start()
    return True
