"""Faults the target's own process plays, delivered as a command file (gpu_hang).

Only the rank itself can queue a kernel on its GPU, so the mechanism writes a command file
into a folder the rank watches (the trial's run folder, bind-mounted in containers at the
same path: harness.job.gpufault), and the rank plays each command once. The file's path is
recorded in the ledger before it is written; the undo removes it, so a revert, the dead-man
switch and `chaos heal` after a SIGKILL all leave no command behind. A command says when
the fault ends on the monotonic clock (one clock for every process of a kernel, containers
included), so a rank that reads it late spins only for what is left.

    {"id": "<run id>.<ledger entry id>", "until": <monotonic seconds>}
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from chaos.api import Host
from chaos.errors import UnsupportedFault
from chaos.faults import FaultBase, GpuHang
from chaos.ledger import Entry, Ledger
from chaos.mechanism import Mechanism, UndoTable

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

    def apply(self, fault: FaultBase, host: Host, ledger: Ledger) -> list[Entry]:
        assert isinstance(fault, GpuHang)
        if self.directory is None:
            raise UnsupportedFault(f"{fault.kind} on {host.name}: delivered through a trial's run folder, "
                                   "and none was given (only a trial of `chaos run` plays it)")
        path = command_path(self.directory, host.name, fault.kind)
        entry = ledger.record("remove_file", path=str(path))
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = Path(str(path) + TMP_SUFFIX)
        tmp.write_text(json.dumps({"id": f"{ledger.run_id}.{entry.id}", "until": self.clock() + fault.duration}))
        os.replace(tmp, path)  # the rank never reads half a command
        ledger.mark(entry, "done")
        return [entry]
