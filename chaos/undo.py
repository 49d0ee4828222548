"""The fault library's undo table and the helpers every run's ledger goes through.

Every side effect is written to a ledger (chaos.ledger) before it is made; the entry's `op`
names an undo here, in `UNDOS` (see `chaos.undotable.UndoTable`), and its `args` carry all
that undo needs, so a revert from the live harness, the dead-man switch and a `chaos heal`
after a SIGKILL run the same code. Undos tolerate only "already gone". This module sits
below the injector (chaos.inject), heal, the probe and the dead-man switch, which all
import it; it imports none of them.
"""
from __future__ import annotations

import os
import shutil
import signal
from typing import Any

from chaos import cgroup, cmdfile, fusefs, netlink, nft, nvml, proc, storage, tc, userns
from chaos.ledger import Entry, Ledger
from chaos.undotable import UndoTable

STOP_GRACE_S = 2.0


def _undo_owner(args: dict[str, Any]) -> None:
    """The entry naming the process that owns a run; nothing to undo."""


def _undo_netns(args: dict[str, Any]) -> None:
    # by its pin ("path": a user namespace's run pins in the user's folder); older ledgers: the name
    netlink.remove_namespace(args.get("path", args["name"]))
    if "path" in args:
        userns.remove_pin_folder(args["path"])


def _undo_link_down(args: dict[str, Any]) -> None:
    netlink.set_link_state(args["ns"], args["ifname"], up=True, gone_ok=True)


def _undo_pause(args: dict[str, Any]) -> None:
    proc.send_signal(args["pid"], signal.SIGCONT, args["started"], gone_ok=True)


def _undo_process(args: dict[str, Any]) -> None:
    """A process the harness started (rank, launcher, control plane, dead-man switch)."""
    proc.send_signal(args["pid"], signal.SIGKILL, args["started"], gone_ok=True)
    proc.reap(args["pid"], proc.KILLED_WITHIN_S)


def _undo_folder(args: dict[str, Any]) -> None:
    """A folder the harness made for a run's processes (a host's temporary folder), with
    whatever they left in it (a killed process removes nothing of its own)."""
    try:
        shutil.rmtree(args["path"])
    except FileNotFoundError:
        pass


def _undo_stop_process(args: dict[str, Any]) -> None:
    """A helper that must finish its work on the way out (a delayer releases what it holds)."""
    proc.stop(args["pid"], args["started"], STOP_GRACE_S)


# The fault library's undo table: the ops of this module and of its mechanisms' modules.
UNDOS = UndoTable.combine({
    "chaos.undo": UndoTable({"owner": _undo_owner, "netns": _undo_netns, "link_up": _undo_link_down,
                               "sigcont": _undo_pause, "sigkill": _undo_process,
                               "stop_process": _undo_stop_process,
                               "remove_folder": _undo_folder}),
    "chaos.tc": tc.UNDOS,
    "chaos.nft": nft.UNDOS,
    "chaos.cmdfile": cmdfile.UNDOS,
    "chaos.storage": storage.UNDOS,
    "chaos.fusefs": fusefs.UNDOS,
    "chaos.cgroup": cgroup.UNDOS,
    "chaos.nvml": nvml.UNDOS,
})


def undo_outstanding(ledger: Ledger, undos: UndoTable) -> list[Entry]:
    """Undo every entry of `ledger` not yet undone, last in first out; returns them."""
    done = []
    for entry in ledger.outstanding():
        undos.revert(entry, ledger)
        done.append(entry)
    return done


def record_owner(ledger: Ledger, place: str | None = None) -> None:
    """Name the live process that owns the run: heal leaves a run alone while it lives.
    `place`: where alone its entries mean what they say (a Slurm node's agent names its own
    network namespace as "this process's"): only a heal that runs there takes them back."""
    pid = os.getpid()
    where = {"place": place} if place else {}
    ledger.mark(ledger.record("owner", pid=pid, started=proc.start_time(pid), **where), "done")
