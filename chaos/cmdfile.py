"""Faults the target's own process plays, delivered as a command file (gpu_hang, step_delay).

Only the rank itself can queue a kernel on its GPU or wait before its own step, so the
mechanism writes a command file into a folder the rank watches (the trial's run folder,
bind-mounted in containers at the same path: harness.job.gpufault, harness.job.stepdelay),
and the rank plays it. The file's path is recorded in the ledger before it is written; the
undo removes it, so a revert, the dead-man switch and `chaos heal` after a SIGKILL all leave
no command behind. A gpu_hang's command says when the fault ends on the monotonic clock (one
clock for every process of a kernel, containers included), so a rank that reads it late
spins only for what is left; a step_delay's holds while its file exists.

    gpu_hang     {"id": "<run id>.<ledger entry id>", "until": <monotonic seconds>}
    step_delay   {"id": "<run id>.<ledger entry id>", "delay_s": <seconds before each step>}
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from chaos.api import Host
from chaos.errors import UnsupportedFault
from chaos.faults import FaultBase, GpuHang, StepDelay
from chaos.ledger import Entry, Ledger
from chaos.mechanism import Mechanism
from chaos.undotable import UndoTable

TMP_SUFFIX = ".tmp"


def command_path(directory: Path, host: str, kind: str) -> Path:
    """Where the command of fault `kind` for host `host` ("r005") is written."""
    return directory / f"{host}.{kind}"


def _undo_remove_file(args: dict[str, Any]) -> None:
    for path in (Path(args["path"]), Path(args["path"] + TMP_SUFFIX)):
        path.unlink(missing_ok=True)  # already gone: a revert before, or never renamed


UNDOS = UndoTable({"remove_file": _undo_remove_file})


class CommandFile(Mechanism):
    """Writes a gpu_hang's command for each target host into `directory` (None: no trial
    folder to write to, as for a plan's description; apply refuses)."""

    name = "command file in the trial's run folder, played by the rank on its GPU"

    def __init__(self, directory: Path | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = directory
        self.clock = clock

    def command(self, fault: FaultBase) -> dict[str, Any]:
        """What the rank is to play, besides the command's id."""
        assert isinstance(fault, GpuHang)
        return {"until": self.clock() + fault.duration}

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        if self.directory is None:
            raise UnsupportedFault(f"{fault.kind} on {host.name}: delivered through a trial's run folder, "
                                   "and none was given (only a trial of `chaos run` plays it)")
        path = command_path(self.directory, host.name, fault.kind)
        entry = ledger.record("remove_file", path=str(path))
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = Path(str(path) + TMP_SUFFIX)
        tmp.write_text(json.dumps({"id": f"{ledger.run_id}.{entry.id}", **self.command(fault)}))
        os.replace(tmp, path)  # the rank never reads half a command
        ledger.mark(entry, "done")
        return [entry]


class StepDelayFile(CommandFile):
    """Writes a step_delay's command: the rank waits `delay` before each step while it exists."""

    name = "command file in the trial's run folder, waited out by the rank before each step"

    def command(self, fault: FaultBase) -> dict[str, Any]:
        assert isinstance(fault, StepDelay)
        return {"delay_s": fault.delay}


def command_mechanisms(directory: Path | None) -> dict[str, Mechanism]:
    """The kinds a rank plays from a command file, each with its mechanism writing into
    `directory` (a trial's commands folder; None: none yet, as for a plan's description)."""
    return {"gpu_hang": CommandFile(directory), "step_delay": StepDelayFile(directory)}


COMMAND_KINDS = tuple(command_mechanisms(None))
